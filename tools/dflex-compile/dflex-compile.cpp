//===- dflex-compile.cpp - ahead-of-time kernel compiler ------------------===//
//
// dflex-compile FILE.mlir --arch sm_90a --arch sm_120 -o BUNDLE_DIR
//
// Parses and verifies FILE, generates the kernels of every dflex.attention
// spec, compiles them with NVRTC for each arch through the kernel cache, and
// writes a bundle (manifest.json, generated source, PTX and cubin per arch).
//
//===----------------------------------------------------------------------===//

#include "Bundle.h"

#include "DFlex/IR/DFlexDialect.h"
#include "DFlex/IR/DFlexOps.h"
#include "dflex/Cache/KernelCache.h"
#include "dflex/Codegen/Attention.h"
#include "dflex/Codegen/Derivative.h"
#include "dflex/Codegen/GatedDelta.h"
#include "dflex/Codegen/KernelSources.h"
#include "dflex/Compile/CachedCompile.h"
#include "dflex/Compile/GpuArch.h"
#include "dflex/Compile/PtxConstants.h"
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
#include "llvm/Support/raw_ostream.h"

#include <chrono>

using namespace mlir;
using namespace mlir::dflex;
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

FailureOr<::dflex::tools::CompiledModule> generate(AttentionOp op,
                                                   StringRef sourceName) {
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
  codegen::AttentionSpec spec;
  spec.name = op.getSymName().str();
  spec.numQHeads = op.getNumQHeads();
  spec.numKvHeads = op.getNumKvHeads();
  spec.qkHeadDim = op.getQkHeadDim();
  spec.vHeadDim = op.getVHeadDim();
  spec.elementType = elementTypeName(op.getElementType());
  spec.scale = op.getSoftmaxScale();
  auto generated = codegen::generateAttention(spec, *mask, scoreMod ? &*scoreMod : nullptr,
                                              sourceName.str());
  if (!generated.ok()) {
    op.emitError(generated.error());
    return failure();
  }
  ::dflex::tools::CompiledModule module;
  module.generated = generated.value();
  module.spec = ::dflex::JsonValue::object();
  module.spec["mask"] = op.getMask().str();
  if (scoreMod)
    module.spec["score_mod"] = op.getScoreModAttr().getValue().str();
  module.spec["num_q_heads"] = spec.numQHeads;
  module.spec["num_kv_heads"] = spec.numKvHeads;
  module.spec["qk_head_dim"] = spec.qkHeadDim;
  module.spec["v_head_dim"] = spec.vHeadDim;
  module.spec["element_type"] = spec.elementType;
  module.spec["scale"] = static_cast<double>(spec.scale);
  module.programs.push_back(expr::toJson(*mask));
  if (scoreMod)
    module.programs.push_back(expr::toJson(*scoreMod));
  return module;
}

FailureOr<::dflex::tools::CompiledModule> generate(GatedDeltaOp op,
                                                   StringRef sourceName) {
  codegen::GatedDeltaSpec spec;
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
  ::dflex::tools::CompiledModule module;
  module.generated = generated.value();
  module.spec = ::dflex::JsonValue::object();
  module.spec["num_key_heads"] = spec.numKeyHeads;
  module.spec["num_value_heads"] = spec.numValueHeads;
  module.spec["key_dim"] = spec.keyDim;
  module.spec["value_dim"] = spec.valueDim;
  module.spec["gate"] = spec.gate;
  module.spec["delta_rule"] = spec.deltaRule;
  module.spec["qk_l2norm"] = spec.qkL2Norm;
  module.spec["initial_state"] = spec.initialState;
  module.spec["final_state"] = spec.finalState;
  module.spec["varlen"] = spec.varlen;
  module.spec["in_kernel_gate"] = spec.inKernelGate;
  module.spec["element_type"] = spec.elementType;
  module.spec["scale"] = static_cast<double>(spec.scale);
  return module;
}

/// The launch constant holding the dynamic shared memory of a kernel role.
std::optional<std::pair<std::string, std::string>> sharedBytesConstant(StringRef role) {
  if (role == "attention_forward")
    return std::make_pair("dflex_forward_launch", "shared_bytes");
  if (role == "attention_backward")
    return std::make_pair("dflex_backward_launch", "shared_bytes");
  if (role == "attention_forward_sm90")
    return std::make_pair("dflex_forward_sm90_launch", "shared_bytes");
  if (role == "attention_backward_sm90")
    return std::make_pair("dflex_backward_sm90_launch", "shared_bytes");
  if (role.consume_front("gated_delta_") &&
      llvm::is_contained({"forward_prepare", "forward_state", "forward_output",
                          "backward_prepare", "backward_state", "backward_chunk"},
                         role))
    return std::make_pair("dflex_gated_delta_launch", role.str() + "_shared_bytes");
  return std::nullopt;
}

/// The NVRTC request for one arch: the kernels that arch builds (the
/// runtime's run-time compile makes the same request, so both share cache
/// entries).
compile::CompileRequest archRequest(const codegen::GeneratedModule &generated,
                                    const std::string &arch) {
  compile::CompileRequest request;
  request.source = generated.source;
  request.programName = generated.name + ".cu";
  request.archs = {arch};
  request.options = {"-std=c++17"};
  for (const codegen::EmbeddedHeader &header : codegen::kernelHeaders())
    request.headers.push_back({header.name, header.contents});
  for (const codegen::KernelEntry &kernel : generated.kernels)
    if (codegen::buildsFor(kernel.requiredTarget, arch))
      request.nameExpressions.push_back(kernel.nameExpression);
  return request;
}

/// Compiles a module for every arch through the cache; reads each binary's
/// launch constants back from its PTX and checks its shared memory against
/// its arch's limit.
/// Kernels and launch constants that no target builds (the Hopper kernels
/// without sm_90a) leave the module.
::dflex::Status compileModule(::dflex::tools::CompiledModule &module,
                              const std::vector<std::string> &targets,
                              cache::KernelCache &kernelCache, int &hits) {
  auto builtByAny = [&](const std::string &requiredTarget) {
    return llvm::any_of(targets, [&](const std::string &arch) {
      return codegen::buildsFor(requiredTarget, arch);
    });
  };
  codegen::GeneratedModule &generated = module.generated;
  llvm::erase_if(generated.kernels, [&](const codegen::KernelEntry &kernel) {
    return !builtByAny(kernel.requiredTarget);
  });
  llvm::erase_if(generated.launchConstants, [&](const codegen::LaunchConstants &constants) {
    return !builtByAny(constants.requiredTarget);
  });

  for (const std::string &arch : targets) {
    compile::CompileRequest request = archRequest(generated, arch);
    auto binaries = compile::compileCached(request, kernelCache, codegen::kTemplateVersion);
    if (!binaries.ok())
      return binaries.status();
    compile::ArchBinary &binary = binaries.value().front();
    hits += binary.fromCache;
    auto key = compile::archCacheKey(request, arch, codegen::kTemplateVersion);
    module.cacheKeys.push_back(key.ok() ? key.value() : "");
    module.binaries.push_back(std::move(binary));
  }

  // Launch constants follow the configs each arch is compiled with: each
  // binary's are read from its own PTX, and its shared memory is checked
  // with them.
  for (compile::ArchBinary &binary : module.binaries) {
    ::dflex::tools::CompiledModule::LaunchValues &launch = module.launch.emplace_back();
    for (const codegen::LaunchConstants &constants : generated.launchConstants) {
      if (!codegen::buildsFor(constants.requiredTarget, binary.arch))
        continue;
      auto values =
          compile::readPtxIntArray(binary.ptx, constants.symbol, constants.names.size());
      if (!values.ok())
        return ::dflex::Status::failure("@" + generated.name + " (" + binary.arch +
                                        "): " + values.error());
      for (size_t i = 0; i < constants.names.size(); ++i)
        launch[constants.symbol][constants.names[i]] = values.value()[i];
    }
    compile::CompileRequest request = archRequest(generated, binary.arch);
    for (const codegen::KernelEntry &kernel : generated.kernels)
      if (codegen::buildsFor(kernel.requiredTarget, binary.arch))
        if (auto constant = sharedBytesConstant(kernel.role))
          request.dynamicSharedBytes[kernel.nameExpression] =
              launch[constant->first][constant->second];
    if (::dflex::Status status = compile::checkSharedMemory(request, binary); !status.ok())
      return ::dflex::Status::failure("@" + generated.name + ": " + status.message());
  }
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

  std::vector<::dflex::tools::CompiledModule> modules;
  for (Operation &op : module->getBody()->getOperations()) {
    FailureOr<::dflex::tools::CompiledModule> generated = failure();
    if (auto attention = dyn_cast<AttentionOp>(op))
      generated = generate(attention, inputFilename);
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
      llvm::outs() << compiled.generated.source << "\n";
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
  int hits = 0, binaries = 0, kernels = 0;
  for (auto &compiled : modules) {
    if (::dflex::Status status = compileModule(compiled, targets, kernelCache, hits);
        !status.ok())
      return fail(status.message());
    binaries += compiled.binaries.size();
    kernels += compiled.generated.kernels.size();
  }
  if (::dflex::Status status =
          ::dflex::tools::writeBundle(outputDir, inputFilename, sourceText, targets, modules);
      !status.ok())
    return fail(status.message());

  if (!quiet) {
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                         .count();
    llvm::outs() << "dflex-compile: " << inputFilename << ": " << modules.size()
                 << " modules, " << kernels << " kernels, archs";
    for (const std::string &arch : targets)
      llvm::outs() << " " << arch;
    llvm::outs() << "; cache " << hits << "/" << binaries << " hits; "
                 << llvm::format("%.3f", seconds) << " s -> " << outputDir << "\n";
  }
  return 0;
}
