//===- dflex-compile.cpp - ahead-of-time kernel compiler ------------------===//
//
// dflex-compile FILE.mlir --arch sm_90a --arch sm_120 -o BUNDLE_DIR
//
// Parses and verifies FILE, generates the kernels of every dflex.attention
// spec, compiles them with NVRTC for each arch through the kernel cache, and
// writes a bundle (manifest.json, generated source, PTX and cubin per arch).
//
//===----------------------------------------------------------------------===//

#include "DFlex/IR/DFlexDialect.h"
#include "DFlex/IR/DFlexOps.h"
#include "dflex/Bundle/BundleWriter.h"
#include "dflex/Bundle/CompileRequest.h"
#include "dflex/Bundle/Specs.h"
#include "dflex/Cache/KernelCache.h"
#include "dflex/Codegen/AttentionModule.h"
#include "dflex/Codegen/Derivative.h"
#include "dflex/Codegen/GatedDeltaModule.h"
#include "dflex/Compile/CachedCompile.h"
#include "dflex/Compile/GpuArch.h"
#include "dflex/Conversion/DFlexToProgram/DFlexToProgram.h"
#include "dflex/Expr/ProgramJson.h"
#include "dflex/Support/InputLimits.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ThreadPool.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>

using namespace mlir;
using namespace mlir::dflex;
namespace bundle = ::dflex::bundle;
namespace codegen = ::dflex::codegen;
namespace compile = ::dflex::compile;
namespace cache = ::dflex::cache;
namespace expr = ::dflex::expr;

namespace {

// The tool's own options: --help lists these, not the LLVM back ends' that
// linking LLVM registers.
llvm::cl::OptionCategory compileOptions("dflex-compile options");

llvm::cl::opt<std::string> inputFilename(llvm::cl::Positional, llvm::cl::Required,
                                         llvm::cl::desc("<input .mlir>"),
                                         llvm::cl::cat(compileOptions));
llvm::cl::list<std::string> archs(
    "arch", llvm::cl::desc("target architecture, repeatable (sm_90a, sm_120, sm_90, "
                           "compute_90, ...); default: sm_90a and sm_120"),
    llvm::cl::cat(compileOptions));
llvm::cl::opt<std::string> outputDir("o", llvm::cl::desc("bundle directory to write"),
                                     llvm::cl::value_desc("dir"),
                                     llvm::cl::cat(compileOptions));
llvm::cl::opt<bool> emitCuda("emit-cuda",
                             llvm::cl::desc("print the generated CUDA source and stop"),
                             llvm::cl::cat(compileOptions));
llvm::cl::opt<std::string> cacheDir(
    "cache-dir", llvm::cl::desc("kernel cache directory (default: $DFLEX_CACHE_DIR, "
                                "else ~/.cache/dflex)"),
    llvm::cl::cat(compileOptions));
llvm::cl::opt<bool> quiet("quiet", llvm::cl::desc("no summary line"),
                          llvm::cl::cat(compileOptions));
llvm::cl::opt<std::string> portableConfigsOf(
    "portable-configs-of",
    llvm::cl::desc("give every binary's portable attention kernels the tile configs of this "
                   "arch, launched with as many blocks per multiprocessor as it holds (e.g. "
                   "sm_120 in an sm_90a bundle, to measure sm_120's kernels on an sm_90 GPU); "
                   "default: each binary its own arch's"),
    llvm::cl::value_desc("arch"), llvm::cl::cat(compileOptions));
llvm::cl::opt<std::string> portableForwardConfig(
    "portable-forward-config",
    llvm::cl::desc("give every binary's portable attention forward this config instead of the "
                   "defaults' (query rows, key rows, warps, pipeline: shared_query, early_key or "
                   "register_query), to measure a candidate through the bundles and the op"),
    llvm::cl::value_desc("M,N,WARPS[,PIPELINE]"), llvm::cl::cat(compileOptions));
llvm::cl::opt<std::string> portableBackwardConfig(
    "portable-backward-config",
    llvm::cl::desc("the same for the portable attention backward (query rows, key rows, warps, "
                   "dQ chunk)"),
    llvm::cl::value_desc("M,N,WARPS,DQ_CHUNK"), llvm::cl::cat(compileOptions));

int fail(const llvm::Twine &message) {
  llvm::errs() << "dflex-compile: error: " << message << "\n";
  return 1;
}

const char *elementTypeName(Type type) { return type.isF16() ? "f16" : "bf16"; }

/// Lowers `symbol` (a mask or score_mod) to a program, with its derivative
/// for a score_mod. Diagnostics go through the context's handler.
FailureOr<expr::Program> lowerBody(Operation *spec, FlatSymbolRefAttr symbol) {
  auto body = SymbolTable::lookupNearestSymbolFrom<BodyOpInterface>(spec, symbol);
  FailureOr<expr::Program> program = lowerToProgram(body);
  if (failed(program) || !program->isScoreMod)
    return program;
  ::dflex::Status derivative = codegen::appendScoreDerivative(*program);
  if (!derivative.ok()) {
    llvm::errs() << derivative.message() << "\n";
    return failure();
  }
  return program;
}

/// A generated module, ready to compile: its bundle entry without binaries.
bundle::CompiledModule moduleOf(codegen::GeneratedModule generated, ::dflex::JsonValue spec) {
  bundle::CompiledModule module;
  module.name = generated.name;
  module.kind = generated.kind;
  module.fileStem = codegen::sanitizeIdentifier(generated.name);
  module.source = std::move(generated.source);
  module.spec = std::move(spec);
  module.variant = codegen::toJson(generated.layout);
  module.kernels = std::move(generated.kernels);
  return module;
}

FailureOr<bundle::CompiledModule> generate(AttentionOp op, StringRef sourceName,
                                           const codegen::PortableConfigs &portable) {
  FailureOr<expr::Program> mask = lowerBody(op, op.getMaskAttr());
  if (failed(mask))
    return failure();
  std::optional<expr::Program> scoreMod;
  if (op.getScoreModAttr()) {
    FailureOr<expr::Program> lowered = lowerBody(op, op.getScoreModAttr());
    if (failed(lowered))
      return failure();
    scoreMod = std::move(*lowered);
  }
  bundle::AttentionSpec spec;
  spec.name = op.getSymName().str();
  spec.maskName = op.getMask().str();
  if (scoreMod)
    spec.scoreModName = op.getScoreModAttr().getValue().str();
  spec.numQHeads = op.getNumQHeads();
  spec.numKvHeads = op.getNumKvHeads();
  spec.qkHeadDim = op.getQkHeadDim();
  spec.vHeadDim = op.getVHeadDim();
  spec.elementType = elementTypeName(op.getElementType());
  spec.scale = op.getSoftmaxScale();
  auto generated = codegen::generateAttention(spec, *mask, scoreMod ? &*scoreMod : nullptr,
                                              sourceName.str(), portable);
  if (!generated.ok()) {
    op.emitError(generated.error());
    return failure();
  }
  bundle::CompiledModule module = moduleOf(std::move(generated).value(), bundle::toJson(spec));
  module.programs.push_back(expr::toJson(*mask));
  if (scoreMod)
    module.programs.push_back(expr::toJson(*scoreMod));
  return module;
}

FailureOr<bundle::CompiledModule> generate(GatedDeltaOp op, StringRef sourceName) {
  bundle::GatedDeltaSpec spec;
  spec.name = op.getSymName().str();
  spec.numKeyHeads = op.getNumKeyHeads();
  spec.numValueHeads = op.getNumValueHeads();
  spec.keyDim = op.getKeyDim();
  spec.valueDim = op.getValueDim();
  spec.gate = stringifyGateKind(op.getGate()).str();
  spec.deltaRule = op.getDeltaRule();
  spec.qkL2Norm = op.getQkL2norm();
  spec.initialState = op.getInitialState();
  spec.finalState = op.getFinalState();
  spec.varlen = op.getVarlen();
  spec.inKernelGate = op.getInKernelGate();
  spec.elementType = elementTypeName(op.getElementType());
  spec.scale = op.getOutputScale();
  auto generated = codegen::generateGatedDelta(spec, sourceName.str());
  if (!generated.ok()) {
    op.emitError(generated.error());
    return failure();
  }
  return moduleOf(std::move(generated).value(), bundle::toJson(spec));
}

/// Drops the kernels that no target builds (the Hopper kernels without
/// sm_90a) from a module.
void keepBuiltKernels(bundle::CompiledModule &module, const std::vector<std::string> &targets) {
  llvm::erase_if(module.kernels, [&](const bundle::ModuleKernel &kernel) {
    return !llvm::any_of(targets, [&](const std::string &arch) {
      return bundle::buildsFor(kernel.role, arch);
    });
  });
}

/// One part of a module's binary for one arch.
struct CompileJob {
  bundle::CompiledModule *module;
  std::string arch, part;
  compile::CompileRequest request;
  ::dflex::Result<std::vector<compile::ArchBinary>> binaries =
      ::dflex::Status::failure("not compiled");
};

/// Adds a compiled part to its module's binary for its arch: reads the
/// launch constants of its kernels back from its PTX (they follow the
/// configs each arch is compiled with) and checks its shared memory with
/// them against its arch's limit.
::dflex::Status addPart(CompileJob &job, int &hits) {
  if (!job.binaries.ok())
    return job.binaries.status();
  bundle::CompiledModule &module = *job.module;
  const std::string where = "@" + module.name + " (" + job.arch + ", " + job.part + ")";
  compile::ArchBinary &binary = job.binaries.value().front();
  hits += binary.fromCache;
  const std::vector<bundle::ModuleKernel> kernels =
      bundle::partKernels(module.kernels, job.arch, job.part);
  auto launch = bundle::readLaunchValues(binary, kernels);
  if (!launch.ok())
    return ::dflex::Status::failure(where + ": " + launch.error());
  if (::dflex::Status status =
          bundle::checkSharedMemory(job.request, kernels, launch.value(), binary);
      !status.ok())
    return ::dflex::Status::failure("@" + module.name + ": " + status.message());
  if (module.binaries.empty() || module.binaries.back().arch != job.arch)
    module.binaries.push_back({job.arch, {}, {}});
  bundle::ModuleBinary &archBinary = module.binaries.back();
  if (::dflex::Status status = bundle::mergeLaunchValues(archBinary.launch, launch.value());
      !status.ok())
    return ::dflex::Status::failure(where + ": " + status.message());
  auto key = compile::archCacheKey(job.request, job.arch, bundle::kTemplateVersion);
  archBinary.parts.push_back({job.part, std::move(binary), key.ok() ? key.value() : ""});
  return ::dflex::Status::success();
}

/// Compiles every part of every module's binary for every arch through the
/// cache. The NVRTC programs are independent, so they run side by side; the
/// parts are then added in module, arch and part order, and the first
/// failure in that order is the one reported.
::dflex::Status compileModules(std::vector<bundle::CompiledModule> &modules,
                               const std::vector<std::string> &targets,
                               cache::KernelCache &kernelCache, int &hits) {
  std::vector<CompileJob> jobs;
  for (bundle::CompiledModule &module : modules) {
    keepBuiltKernels(module, targets);
    for (const std::string &arch : targets)
      for (const std::string &part : bundle::partsOf(module.kernels, arch))
        jobs.push_back({&module, arch, part,
                        bundle::compileRequest(module.name, module.source, module.kernels, arch,
                                               part)});
  }
  {
    llvm::DefaultThreadPool pool(llvm::hardware_concurrency());
    for (CompileJob &job : jobs)
      pool.async([&job, &kernelCache] {
        job.binaries = compile::compileCached(job.request, kernelCache, bundle::kTemplateVersion);
      });
    pool.wait();
  }
  for (CompileJob &job : jobs)
    if (::dflex::Status status = addPart(job, hits); !status.ok())
      return status;
  return ::dflex::Status::success();
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  llvm::cl::HideUnrelatedOptions(compileOptions);
  llvm::cl::ParseCommandLineOptions(argc, argv, "dflex ahead-of-time kernel compiler\n");
  auto start = std::chrono::steady_clock::now();

  auto file = llvm::MemoryBuffer::getFileOrSTDIN(inputFilename);
  if (!file)
    return fail("cannot read '" + inputFilename + "': " + file.getError().message());
  std::string sourceText = (*file)->getBuffer().str();
  if (auto problem = ::dflex::checkInputLimits(sourceText)) {
    llvm::errs() << inputFilename << ":" << problem->line << ":" << problem->column
                 << ": error: " << problem->message << "\n";
    return 1;
  }

  DialectRegistry registry;
  registry.insert<DFlexDialect, arith::ArithDialect, math::MathDialect>();
  MLIRContext context(registry);
  context.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(*file), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);
  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module)
    return 1;

  codegen::PortableConfigs portable;
  if (!portableConfigsOf.empty()) {
    auto arch = compile::parseGpuArch(portableConfigsOf);
    if (!arch.ok() || !codegen::hasOwnPortableConfigs(arch.value().computeCapability))
      return fail("--portable-configs-of '" + portableConfigsOf +
                  "': expected an arch with its own portable configs (sm_90 or sm_120)");
    portable.of = arch.value().computeCapability;
  }
  if (!portableForwardConfig.empty()) {
    auto forward = codegen::parsePortableForwardConfig(portableForwardConfig);
    if (!forward.ok())
      return fail("--portable-forward-config " + forward.error());
    portable.forward = forward.value();
  }
  if (!portableBackwardConfig.empty()) {
    auto backward = codegen::parsePortableBackwardConfig(portableBackwardConfig);
    if (!backward.ok())
      return fail("--portable-backward-config " + backward.error());
    portable.backward = backward.value();
  }
  std::vector<bundle::CompiledModule> modules;
  for (Operation &op : module->getBody()->getOperations()) {
    FailureOr<bundle::CompiledModule> generated = failure();
    if (auto attention = dyn_cast<AttentionOp>(op))
      generated = generate(attention, inputFilename, portable);
    else if (auto gatedDelta = dyn_cast<GatedDeltaOp>(op))
      generated = generate(gatedDelta, inputFilename);
    else
      continue;
    if (failed(generated))
      return 1;
    modules.push_back(std::move(*generated));
  }
  if (modules.empty()) {
    emitError(FileLineColLoc::get(&context, inputFilename, 1, 1))
        << "no dflex.attention or dflex.gated_delta spec to compile";
    return 1;
  }

  if (emitCuda) {
    for (const auto &compiled : modules)
      llvm::outs() << compiled.source << "\n";
    return 0;
  }
  if (outputDir.empty())
    return fail("no bundle directory: give -o DIR (or --emit-cuda)");

  std::vector<std::string> targets(archs.begin(), archs.end());
  // sm_90a: H100/H200 (the portable kernels and, where they exist, the
  // wgmma ones); sm_120: RTX PRO 6000 / RTX 5090. docs/bundle.md.
  if (targets.empty())
    targets = {"sm_90a", "sm_120"};
  for (const std::string &arch : targets)
    if (!compile::parseGpuArch(arch).ok())
      return fail("unknown --arch '" + arch + "' (use e.g. sm_90, sm_120, sm_90a, compute_90)");

  cache::CacheConfig config;
  config.directory = cacheDir;
  config.warningSink = [](const std::string &warning) {
    llvm::errs() << "dflex-compile: warning: " << warning << "\n";
  };
  cache::KernelCache kernelCache(config);
  int hits = 0, programs = 0, kernels = 0;
  if (::dflex::Status status = compileModules(modules, targets, kernelCache, hits); !status.ok())
    return fail(status.message());
  for (const auto &compiled : modules) {
    for (const bundle::ModuleBinary &binary : compiled.binaries)
      programs += binary.parts.size();
    kernels += compiled.kernels.size();
  }
  if (::dflex::Status status =
          bundle::writeBundle(outputDir, inputFilename, sourceText, targets, modules);
      !status.ok())
    return fail(status.message());

  if (!quiet) {
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                         .count();
    llvm::outs() << "dflex-compile: " << inputFilename << ": " << modules.size()
                 << " modules, " << kernels << " kernels, archs";
    for (const std::string &arch : targets)
      llvm::outs() << " " << arch;
    llvm::outs() << "; cache " << hits << "/" << programs << " hits; "
                 << llvm::format("%.3f", seconds) << " s -> " << outputDir << "\n";
  }
  return 0;
}
