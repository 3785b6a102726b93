#include "dflex/runtime/bundle/KernelBundle.h"

#include "BundleManifest.h"

#include "dflex/Analysis/IntervalEvaluator.h"
#include "dflex/Cache/KernelCache.h"
#include "dflex/Bundle/CompileRequest.h"
#include "dflex/Compile/CachedCompile.h"
#include "dflex/Expr/ProgramJson.h"
#include "dflex/Support/File.h"
#include "dflex/Support/Sha256.h"
#include "dflex/Support/Error.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <mutex>

namespace dflex::runtime {

namespace {

using bundle::KernelRole;
using bundle::LaunchArray;
namespace launch = bundle::launch;

const JsonValue::Array &arrayMember(const JsonObject &object, const char *key) {
  const JsonValue *member = nullptr;
  auto found = object.members().find(key);
  if (found != object.members().end())
    member = &found->second;
  if (!member || !member->isArray())
    object.fail(key, member ? "expected an array" : "missing");
  return member->asArray();
}

AttentionLaunch parseLaunch(const JsonObject &launch, LaunchArray array, bool backward) {
  JsonObject entry = launch.object(bundle::launchArray(array).symbol);
  AttentionLaunch result;
  result.threads = entry.integer(launch::kThreads);
  result.sharedBytes = entry.integer(launch::kSharedBytes);
  result.blockM = entry.integer(launch::kBlockM);
  result.blockN = entry.integer(launch::kBlockN);
  if (backward) {
    result.rowKernelThreads = entry.integer(launch::kRowKernelThreads);
    result.rowKernelRows = entry.integer(launch::kRowKernelRows);
  }
  auto positive = [&](const char *key, int64_t value) {
    if (value <= 0 || value > (int64_t(1) << 24))
      entry.fail(key, "must be a positive launch constant, got " + std::to_string(value));
  };
  positive(launch::kThreads, result.threads);
  positive(launch::kBlockM, result.blockM);
  positive(launch::kBlockN, result.blockN);
  if (result.sharedBytes < 0 || result.sharedBytes > (int64_t(1) << 24))
    entry.fail(launch::kSharedBytes, "out of range: " + std::to_string(result.sharedBytes));
  if (backward) {
    positive(launch::kRowKernelThreads, result.rowKernelThreads);
    positive(launch::kRowKernelRows, result.rowKernelRows);
  }
  return result;
}

/// The launch constants of one arch's binary of `spec` (`launch`: symbol ->
/// name -> value): the portable kernels', and the Hopper kernels' exactly
/// where that arch's binary has them.
AttentionLaunches parseLaunches(const JsonObject &launch, const AttentionKernelSpec &spec,
                                const std::string &arch) {
  AttentionLaunches result;
  result.forward = parseLaunch(launch, LaunchArray::Forward, false);
  result.backward = parseLaunch(launch, LaunchArray::Backward, true);
  auto hopper = [&](KernelRole role, bool backward) -> std::optional<AttentionLaunch> {
    const LaunchArray array = bundle::kernelRole(role).launch;
    if (spec.hasKernel(role, arch))
      return parseLaunch(launch, array, backward);
    if (const char *symbol = bundle::launchArray(array).symbol; launch.has(symbol))
      launch.fail(symbol, "the " + arch + " binary has no kernel '" + bundle::roleName(role) +
                              "', yet has its launch constants");
    return std::nullopt;
  };
  result.forwardSm90 = hopper(KernelRole::AttentionForwardSm90, false);
  result.backwardSm90 = hopper(KernelRole::AttentionBackwardSm90, true);
  return result;
}

/// The module's kernels as the compile request names them.
std::vector<bundle::ModuleKernel> moduleKernels(const std::vector<BundleKernel> &kernels) {
  std::vector<bundle::ModuleKernel> result;
  for (const BundleKernel &kernel : kernels)
    result.push_back({kernel.role, kernel.nameExpression});
  return result;
}

expr::Program parseProgram(const JsonObject &module, const std::string &name, const char *kind) {
  for (const JsonValue &json : arrayMember(module, "programs")) {
    const JsonValue *programName = json.find("name");
    const JsonValue *programKind = json.find("kind");
    if (!programName || !programName->isString() || programName->asString() != name ||
        !programKind || !programKind->isString() || programKind->asString() != kind)
      continue;
    Result<expr::Program> program = expr::programFromJson(json);
    if (!program.ok())
      module.fail("programs", std::string(kind) + " '" + name + "': " + program.error());
    return std::move(program).value();
  }
  module.fail("programs", std::string("no ") + kind + " named '" + name + "'");
}

/// The variant layout follows from the programs; the manifest's copy must
/// agree, or the kernels were built from other bodies than those it carries.
codegen::VariantLayout checkedLayout(const JsonObject &module, const AttentionKernelSpec &spec) {
  Result<codegen::VariantLayout> layout =
      codegen::layoutVariant(spec.mask, spec.scoreMod ? &*spec.scoreMod : nullptr);
  if (!layout.ok())
    module.fail("programs", layout.error());
  JsonObject variant = module.object("variant");
  const codegen::VariantLayout &expected = layout.value();
  const JsonValue::Array &captures = arrayMember(variant, "captures");
  if (variant.integer("size_bytes") != expected.sizeBytes ||
      captures.size() != expected.captures.size())
    variant.fail("captures", "do not match the layout of the programs' captures");
  for (size_t i = 0; i < captures.size(); ++i) {
    JsonObject capture(captures[i], variant.where() + ": captures[" + std::to_string(i) + "]");
    const codegen::CaptureSlot &slot = expected.captures[i];
    if (capture.string("name") != slot.name || capture.integer("offset_bytes") != slot.offsetBytes ||
        capture.integer("size_bytes") != slot.sizeBytes || capture.integer("rank") != slot.rank ||
        capture.boolean("tensor", false) != slot.isTensor ||
        capture.string("type") != expr::toString(slot.elementType))
      capture.fail("name", "capture '" + slot.name + "' does not match the programs' layout");
  }
  return expected;
}

/// A manifest's spec, or its error as a FormatError.
template <typename Spec> Spec specOrThrow(Result<Spec> spec) {
  if (!spec.ok())
    throw FormatError(spec.error());
  return std::move(spec).value();
}

AttentionKernelSpec parseAttention(const JsonObject &module) {
  AttentionKernelSpec spec;
  static_cast<bundle::AttentionSpec &>(spec) = detail::specOrThrow(bundle::attentionSpecFromJson(
      module.string("name"), detail::member(module, "spec"), module.where() + ": spec"));
  spec.mask = parseProgram(module, spec.maskName, "mask");
  if (!spec.scoreModName.empty()) {
    spec.scoreMod = parseProgram(module, spec.scoreModName, "score_mod");
    if (spec.scoreMod->scoreDerivative < 0)
      module.fail("programs", "score_mod '" + spec.scoreModName + "' carries no derivative");
  }
  spec.layout = checkedLayout(module, spec);

  spec.kernels = detail::parseBundleKernels(module);
  auto requireRoles = [&](std::initializer_list<KernelRole> roles) {
    for (KernelRole role : roles)
      if (!spec.hasRole(role))
        module.fail("kernels",
                    std::string("no kernel with role '") + bundle::roleName(role) + "'");
  };
  requireRoles({KernelRole::AttentionForward, KernelRole::AttentionBackwardPreprocess,
                KernelRole::AttentionBackward, KernelRole::AttentionBackwardGradQ});
  // The Hopper backward's kernels come as a set, with the Hopper forward.
  const std::initializer_list<KernelRole> hopperBackward = {
      KernelRole::AttentionBackwardPreprocessSm90, KernelRole::AttentionBackwardSm90,
      KernelRole::AttentionBackwardGradQSm90};
  for (KernelRole role : hopperBackward)
    if (spec.hasRole(role))
      requireRoles({KernelRole::AttentionForwardSm90, KernelRole::AttentionBackwardPreprocessSm90,
                    KernelRole::AttentionBackwardSm90, KernelRole::AttentionBackwardGradQSm90});

  spec.binaries = detail::parseBundleBinaries(module, spec.kernels);
  // Each binary's launch constants, read from its own PTX.
  JsonObject binaries = module.object("binaries");
  for (const auto &[arch, binary] : spec.binaries)
    spec.launches[arch] = parseLaunches(binaries.object(arch).object("launch"), spec, arch);
  spec.sourceFile = module.string("source_file");
  spec.sourceSha256 = module.string("source_sha256");
  return spec;
}

/// A file name inside the bundle: no directories, so a manifest cannot point
/// elsewhere.
void checkFileName(const std::string &manifestPath, const std::string &file) {
  if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos)
    throw FormatError(manifestPath + ": '" + file + "' is not a file name inside the bundle");
}

} // namespace

MaskEvaluatorPool::MaskEvaluatorPool() = default;
MaskEvaluatorPool::~MaskEvaluatorPool() = default;

std::unique_ptr<analysis::IntervalEvaluator> MaskEvaluatorPool::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (kept_.empty())
    return nullptr;
  std::unique_ptr<analysis::IntervalEvaluator> evaluator = std::move(kept_.back());
  kept_.pop_back();
  return evaluator;
}

void MaskEvaluatorPool::give(std::unique_ptr<analysis::IntervalEvaluator> evaluator) {
  constexpr size_t kKept = 4; // concurrent calls of one spec worth keeping for
  std::lock_guard<std::mutex> lock(mutex_);
  if (kept_.size() < kKept)
    kept_.push_back(std::move(evaluator));
}

size_t KernelImage::partOf(KernelRole role) const {
  for (size_t i = 0; i < parts.size(); ++i)
    if (std::find(parts[i].roles.begin(), parts[i].roles.end(), role) != parts[i].roles.end())
      return i;
  throw FormatError(label + ": no part holds kernel '" + bundle::roleName(role) + "'");
}

const BundleKernel &AttentionKernelSpec::kernel(KernelRole role) const {
  for (const BundleKernel &kernel : kernels)
    if (kernel.role == role)
      return kernel;
  throw FormatError("attention spec '" + name + "' has no kernel with role '" +
                    bundle::roleName(role) + "'");
}

bool AttentionLaunch::operator==(const AttentionLaunch &other) const {
  return threads == other.threads && sharedBytes == other.sharedBytes &&
         blockM == other.blockM && blockN == other.blockN &&
         rowKernelThreads == other.rowKernelThreads && rowKernelRows == other.rowKernelRows;
}

bool AttentionLaunches::operator==(const AttentionLaunches &other) const {
  return forward == other.forward && backward == other.backward &&
         forwardSm90 == other.forwardSm90 && backwardSm90 == other.backwardSm90;
}

bool AttentionKernelSpec::hasRole(KernelRole role) const {
  for (const BundleKernel &kernel : kernels)
    if (kernel.role == role)
      return true;
  return false;
}

bool AttentionKernelSpec::hasKernel(KernelRole role, const std::string &arch) const {
  return hasRole(role) && bundle::buildsFor(role, arch);
}

std::vector<std::string> AttentionKernelSpec::captureNames() const {
  std::vector<std::string> names;
  for (const codegen::CaptureSlot &slot : layout.captures)
    names.push_back(slot.name);
  return names;
}

std::string KernelBundle::path(const std::string &file) const {
  return (std::filesystem::path(directory_) / file).string();
}

std::string KernelBundle::readVerified(const std::string &file,
                                       const std::string &sha256) const {
  checkFileName(path("manifest.json"), file);
  const std::string filePath = path(file);
  Result<std::string> contents = readFile(filePath);
  if (!contents.ok())
    throw IoError("kernel bundle: " + contents.error());
  const std::string actual = Sha256::hexDigest(contents.value());
  if (actual != sha256)
    throw FormatError("kernel bundle: " + filePath + ": sha256 " + actual +
                      " does not match the manifest's " + sha256 +
                      " (the file was changed or the bundle is incomplete)");
  return std::move(contents).value();
}

std::shared_ptr<const KernelBundle> KernelBundle::open(const std::string &directory) {
  auto bundle = std::shared_ptr<KernelBundle>(new KernelBundle());
  bundle->directory_ = directory;
  const std::string manifestPath = bundle->path("manifest.json");
  if (!std::filesystem::is_directory(directory))
    throw IoError("kernel bundle: " + directory + " is not a directory");
  JsonValue manifest = readJsonFile(manifestPath);
  JsonObject root(manifest, manifestPath);

  const int64_t format = root.integer("format_version");
  if (format != bundle::kBundleFormatVersion)
    root.fail("format_version", "this runtime reads version " +
                                    std::to_string(bundle::kBundleFormatVersion) + ", got " +
                                    std::to_string(format) +
                                    "; rebuild the bundle with this version's dflex-compile");
  // The runtime passes kernel parameters as the structs of its own copy of
  // the kernel templates: both sides must be the same templates.
  const std::string &templates = root.string("template_version");
  if (templates != bundle::kTemplateVersion)
    root.fail("template_version", "the bundle was built with kernel templates '" + templates +
                                      "', this runtime has '" + bundle::kTemplateVersion +
                                      "'; rebuild it with this version's dflex-compile");

  const JsonValue::Array &modules = arrayMember(root, "modules");
  for (size_t i = 0; i < modules.size(); ++i) {
    JsonObject module(modules[i], manifestPath + ": modules[" + std::to_string(i) + "]");
    if (module.string("kind") != "attention")
      continue;
    JsonObject named(modules[i], manifestPath + ": module '" + module.string("name") + "'");
    bundle->attention_.push_back(parseAttention(named));
  }

  // Every listed file must be there and intact.
  for (const AttentionKernelSpec &spec : bundle->attention_) {
    bundle->readVerified(spec.sourceFile, spec.sourceSha256);
    for (const auto &[arch, binary] : spec.binaries)
      bundle->verifyBinary(binary);
  }
  return bundle;
}

std::shared_ptr<const KernelBundle> KernelBundle::openCached(const std::string &directory) {
  // The manifest's identity: inode, size and modification time.
  struct Identity {
    int64_t inode = -1, size = -1, modifiedNs = -1;
    bool operator==(const Identity &other) const {
      return inode == other.inode && size == other.size && modifiedNs == other.modifiedNs;
    }
  };
  struct Entry {
    Identity identity;
    std::shared_ptr<const KernelBundle> bundle;
  };
  static std::mutex mutex;
  // By the directory as the caller spells it (every op call: one stat), and
  // by its canonical path (on a miss), so that spellings of one directory
  // share a bundle and its loaded modules.
  static std::map<std::string, Entry> *bySpelling = new std::map<std::string, Entry>();
  static std::map<std::string, Entry> *byPath = new std::map<std::string, Entry>();

  struct stat info {};
  const std::string manifestPath = (std::filesystem::path(directory) / "manifest.json").string();
  if (::stat(manifestPath.c_str(), &info) != 0)
    return open(directory); // reports the missing manifest
  const Identity identity{static_cast<int64_t>(info.st_ino), static_cast<int64_t>(info.st_size),
                          int64_t(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec};

  std::lock_guard<std::mutex> lock(mutex);
  Entry &spelled = (*bySpelling)[directory];
  if (spelled.bundle && spelled.identity == identity)
    return spelled.bundle;
  std::error_code error;
  std::string path = std::filesystem::weakly_canonical(directory, error).string();
  if (error)
    path = directory;
  Entry &canonical = (*byPath)[path];
  if (!canonical.bundle || !(canonical.identity == identity)) {
    canonical.bundle = open(path);
    canonical.identity = identity;
  }
  spelled = canonical;
  return spelled.bundle;
}

bool BundleBinary::hasCubins() const {
  for (const auto &[name, part] : parts)
    if (part.cubinFile.empty())
      return false;
  return !parts.empty();
}

void KernelBundle::verifyBinary(const BundleBinary &binary) const {
  for (const auto &[name, part] : binary.parts) {
    readVerified(part.ptxFile, part.ptxSha256);
    if (!part.cubinFile.empty())
      readVerified(part.cubinFile, part.cubinSha256);
  }
}

KernelImage KernelBundle::binaryImage(const BundleBinary &binary,
                                      const std::vector<BundleKernel> &kernels) const {
  KernelImage image;
  image.arch = binary.arch;
  for (const auto &[name, files] : binary.parts) {
    KernelImage::Part part;
    part.image = readVerified(files.cubinFile, files.cubinSha256);
    part.label = path(files.cubinFile);
    image.label += (image.label.empty() ? "" : ", ") + part.label;
    for (const BundleKernel &kernel : kernels)
      if (bundle::kernelRole(kernel.role).part == name && kernel.loweredNames.count(binary.arch)) {
        part.roles.push_back(kernel.role);
        image.loweredNames[kernel.role] = kernel.loweredNames.at(binary.arch);
      }
    image.parts.push_back(std::move(part));
  }
  return image;
}

KernelImage KernelBundle::kernelImage(const AttentionKernelSpec &spec,
                                      const std::string &arch) const {
  if (auto found = spec.binaries.find(arch);
      found != spec.binaries.end() && found->second.hasCubins())
    return binaryImage(found->second, spec.kernels);
  const CompiledAttention &compiled = compiledAttention(spec, arch);
  // The kernels are launched with the manifest's constants for `arch` where
  // it has them: they must be the compiled ones.
  if (auto listed = spec.launches.find(arch);
      listed != spec.launches.end() && listed->second != compiled.launches)
    throw FormatError(compiled.image.label + ": its launch constants differ from those of " +
                      path("manifest.json") + " for " + arch + " (module '" + spec.name +
                      "': binaries: " + arch + ": launch); rebuild the bundle");
  return compiled.image;
}

AttentionLaunches KernelBundle::attentionLaunches(const AttentionKernelSpec &spec,
                                                  const std::string &arch) const {
  if (auto listed = spec.launches.find(arch); listed != spec.launches.end())
    return listed->second;
  return compiledAttention(spec, arch).launches;
}

const KernelBundle::CompiledAttention &
KernelBundle::compiledAttention(const AttentionKernelSpec &spec, const std::string &arch) const {
  // The request dflex-compile makes for the arch, so that both share cache
  // entries.
  const std::vector<bundle::ModuleKernel> kernels = moduleKernels(spec.kernels);
  std::string key = spec.sourceSha256 + "\n" + arch;
  for (const bundle::ModuleKernel &kernel : kernels)
    if (bundle::buildsFor(kernel.role, arch))
      key += "\n" + kernel.nameExpression;
  std::lock_guard<std::mutex> lock(compileMutex_);
  std::unique_ptr<const CompiledAttention> &slot = compiled_[key];
  if (slot)
    return *slot;

  const std::string source = readVerified(spec.sourceFile, spec.sourceSha256);
  cache::CacheConfig config;
  config.warningSink = cache::stderrWarningSink();
  cache::KernelCache kernelCache(config);
  // The parts compile side by side, as in dflex-compile.
  const std::vector<std::string> parts = bundle::partsOf(kernels, arch);
  std::vector<compile::CompileRequest> requests;
  std::vector<std::future<Result<std::vector<compile::ArchBinary>>>> compiles;
  for (const std::string &part : parts)
    requests.push_back(bundle::compileRequest(spec.name, source, kernels, arch, part));
  for (const compile::CompileRequest &request : requests)
    compiles.push_back(std::async(std::launch::async, [&request, &kernelCache] {
      return compile::compileCached(request, kernelCache, bundle::kTemplateVersion);
    }));

  auto compiled = std::make_unique<CompiledAttention>();
  KernelImage &image = compiled->image;
  image.arch = arch;
  image.label = path(spec.sourceFile) + " (compiled for " + arch + ")";
  image.compiled = true;
  bundle::LaunchValues launch;
  std::string failure;
  for (size_t i = 0; i < parts.size(); ++i) {
    Result<std::vector<compile::ArchBinary>> binaries = compiles[i].get();
    if (!failure.empty())
      continue; // the remaining compiles are still waited for
    if (!binaries.ok()) {
      failure = "kernel bundle " + directory_ + ": spec '" + spec.name + "' has no binary for " +
                arch + " and compiling its source " + spec.sourceFile + " failed: " +
                binaries.error();
      continue;
    }
    compile::ArchBinary &binary = binaries.value().front();
    const std::string label = image.label + " (" + parts[i] + ")";
    if (binary.cubin.empty()) {
      failure = label + ": NVRTC gave no cubin for " + arch;
      continue;
    }
    KernelImage::Part part{std::move(binary.cubin), label, {}};
    const std::vector<bundle::ModuleKernel> partKernels = bundle::partKernels(kernels, arch, parts[i]);
    for (const bundle::ModuleKernel &kernel : partKernels) {
      std::string lowered = binary.loweredName(kernel.nameExpression);
      if (lowered.empty())
        failure = label + ": NVRTC gave no lowered name for " + kernel.nameExpression;
      image.loweredNames[kernel.role] = lowered;
      part.roles.push_back(kernel.role);
    }
    // The launch constants of the compile, checked as the manifest's are,
    // and what dflex-compile checks for its binaries: static plus dynamic
    // shared memory within the arch's limit.
    Result<bundle::LaunchValues> values = bundle::readLaunchValues(binary, partKernels);
    Status status = values.ok() ? bundle::mergeLaunchValues(launch, values.value()) : values.status();
    if (status.ok())
      status = bundle::checkSharedMemory(requests[i], partKernels, values.value(), binary);
    if (!status.ok())
      failure = label + ": " + status.message();
    image.parts.push_back(std::move(part));
  }
  if (!failure.empty())
    throw FormatError(failure);
  JsonValue launchJson = JsonValue::object();
  for (const auto &[symbol, values] : launch)
    for (const auto &[name, value] : values)
      launchJson[symbol][name] = value;
  compiled->launches =
      parseLaunches(JsonObject(launchJson, image.label + ": launch constants"), spec, arch);
  slot = std::move(compiled);
  return *slot;
}

const AttentionKernelSpec &KernelBundle::attention(const std::string &name) const {
  std::string known;
  for (const AttentionKernelSpec &spec : attention_) {
    if (spec.name == name)
      return spec;
    known += (known.empty() ? "" : ", ") + spec.name;
  }
  throw FormatError("kernel bundle " + directory_ + " has no attention spec '" + name +
                    "' (it has: " + (known.empty() ? "none" : known) + ")");
}

std::map<std::string, BundleBinary>
detail::parseBundleBinaries(const JsonObject &module, const std::vector<BundleKernel> &kernels) {
  std::map<std::string, BundleBinary> result;
  JsonObject binaries = module.object("binaries");
  for (const auto &[arch, value] : binaries.members()) {
    JsonObject entry(value, binaries.where() + ": " + arch);
    BundleBinary binary;
    binary.arch = arch;
    JsonObject parts = entry.object("parts");
    for (const auto &[name, partValue] : parts.members()) {
      JsonObject partEntry(partValue, parts.where() + ": " + name);
      BundleBinaryPart part;
      part.ptxFile = partEntry.string("ptx");
      part.ptxSha256 = partEntry.string("ptx_sha256");
      if (partEntry.hasValue("cubin")) {
        part.cubinFile = partEntry.string("cubin");
        part.cubinSha256 = partEntry.string("cubin_sha256");
      }
      binary.parts[name] = std::move(part);
    }
    // A binary has exactly the kernels its arch builds, each in its part,
    // and no part without a kernel.
    std::map<std::string, bool> holdsKernel;
    for (const auto &[name, part] : binary.parts)
      holdsKernel[name] = false;
    for (const BundleKernel &kernel : kernels) {
      const bundle::KernelRoleInfo &role = bundle::kernelRole(kernel.role);
      const bool built = bundle::buildsFor(kernel.role, arch);
      if (built && !kernel.loweredNames.count(arch))
        entry.fail("parts", std::string("kernel '") + role.name + "' has no lowered name for " + arch);
      if (!built && kernel.loweredNames.count(arch))
        entry.fail("parts", std::string("kernel '") + role.name + "' needs " + role.requiredTarget +
                                " but has a lowered name for " + arch);
      if (!built)
        continue;
      auto part = holdsKernel.find(role.part);
      if (part == holdsKernel.end())
        parts.fail(role.part, std::string("missing: it holds kernel '") + role.name + "'");
      part->second = true;
    }
    for (const auto &[name, holds] : holdsKernel)
      if (!holds)
        parts.fail(name, "holds no kernel of this module");
    result[arch] = std::move(binary);
  }
  return result;
}

const JsonValue &detail::member(const JsonObject &object, const char *key) {
  object.object(key); // present, and an object
  return object.members().at(key);
}

std::vector<BundleKernel> detail::parseBundleKernels(const JsonObject &module) {
  std::vector<BundleKernel> result;
  const JsonValue::Array &kernels = arrayMember(module, "kernels");
  for (size_t i = 0; i < kernels.size(); ++i) {
    JsonObject entry(kernels[i], module.where() + ": kernels[" + std::to_string(i) + "]");
    const std::string &name = entry.string("role");
    std::optional<KernelRole> role = bundle::kernelRoleNamed(name);
    if (!role)
      entry.fail("role", "'" + name + "' is no kernel role of this runtime");
    // The launch code runs a kernel only from binaries of its role's target.
    const std::string target = bundle::kernelRole(*role).requiredTarget;
    const std::string listed = entry.optionalString("required_target").value_or("");
    if (listed != target)
      entry.fail("required_target",
                 "kernel '" + name + "' must " +
                     (target.empty() ? std::string("be built for every arch")
                                     : "require " + target) +
                     ", got '" + listed + "'");
    BundleKernel kernel{*role, entry.string("name_expression"), {}};
    JsonObject archs = entry.object("archs");
    for (const auto &[arch, value] : archs.members())
      kernel.loweredNames[arch] =
          JsonObject(value, archs.where() + ": " + arch).string("lowered_name");
    result.push_back(std::move(kernel));
  }
  return result;
}

} // namespace dflex::runtime
