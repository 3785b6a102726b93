#include "dflex/runtime/bundle/GatedDeltaBundle.h"

#include "BundleManifest.h"

#include "dflex/Support/Error.h"

#include <cmath>
#include <mutex>

namespace dflex::runtime {

namespace {



const JsonValue::Array &arrayMember(const JsonObject &object, const char *key) {
  auto found = object.members().find(key);
  if (found == object.members().end() || !found->second.isArray())
    object.fail(key, found == object.members().end() ? "missing" : "expected an array");
  return found->second.asArray();
}

using bundle::KernelRole;
namespace launch = bundle::launch;

/// The kernels a spec's options need, in launch order (docs/gated-delta.md;
/// lib/Codegen/GatedDeltaModule.cpp emits exactly these).
std::vector<KernelRole> requiredRoles(const bundle::GatedDeltaSpec &spec) {
  std::vector<KernelRole> roles;
  if (spec.varlen)
    roles.push_back(KernelRole::GatedDeltaChunkTable);
  for (KernelRole role :
       {KernelRole::GatedDeltaForwardPrepare, KernelRole::GatedDeltaForwardState,
        KernelRole::GatedDeltaForwardOutput, KernelRole::GatedDeltaBackwardPrepare,
        KernelRole::GatedDeltaBackwardState, KernelRole::GatedDeltaBackwardChunk})
    roles.push_back(role);
  if (spec.numValueHeads > spec.numKeyHeads)
    roles.push_back(KernelRole::GatedDeltaBackwardFinalize);
  if (spec.inKernelGate)
    roles.push_back(KernelRole::GatedDeltaBackwardGateParams);
  return roles;
}

GatedDeltaLaunch parseLaunch(const JsonObject &constants, const GatedDeltaKernelSpec &spec) {
  auto constant = [&](const std::string &key) {
    const int64_t value = constants.integer(key);
    if (value <= 0 || value > (int64_t(1) << 24))
      constants.fail(key, "must be a positive launch constant, got " + std::to_string(value));
    return value;
  };
  GatedDeltaLaunch launch;
  launch.threads = constant(launch::kThreads);
  launch.chunkBackwardThreads = constant(launch::kChunkBackwardThreads);
  launch.stateThreads = constant(launch::kStateThreads);
  launch.chunkTableThreads = constant(launch::kChunkTableThreads);
  launch.finalizeThreads = constant(launch::kFinalizeThreads);
  launch.chunk = constant(launch::kChunk);
  if (!constants.has(launch::kValueBlock))
    constants.fail(launch::kValueBlock, "missing (a bundle from an older dflex-compile: rebuild it)");
  launch.valueBlock = constant(launch::kValueBlock);
  if (spec.valueDim % launch.valueBlock != 0)
    constants.fail(launch::kValueBlock, "does not divide value_dim " + std::to_string(spec.valueDim));
  for (const BundleKernel &kernel : spec.kernels)
    if (const char *sharedBytes = bundle::kernelRole(kernel.role).sharedBytes)
      launch.sharedBytes[kernel.role] = constant(sharedBytes);
  return launch;
}

GatedDeltaKernelSpec parseModule(const JsonObject &module) {
  GatedDeltaKernelSpec spec;
  static_cast<bundle::GatedDeltaSpec &>(spec) = detail::specOrThrow(bundle::gatedDeltaSpecFromJson(
      module.string("name"), detail::member(module, "spec"), module.where() + ": spec"));
  spec.kernels = detail::parseBundleKernels(module);
  for (KernelRole role : requiredRoles(spec)) {
    bool found = false;
    for (const BundleKernel &kernel : spec.kernels)
      found = found || kernel.role == role;
    if (!found)
      module.fail("kernels", std::string("no kernel with role '") + bundle::roleName(role) + "'");
  }

  spec.binaries = detail::parseBundleBinaries(module, spec.kernels);
  // Each binary's launch constants, read from its own PTX.
  JsonObject binaries = module.object("binaries");
  for (const auto &[arch, binary] : spec.binaries)
    spec.launches[arch] = parseLaunch(
        binaries.object(arch).object("launch").object(
            bundle::launchArray(bundle::LaunchArray::GatedDelta).symbol),
        spec);
  spec.sourceFile = module.string("source_file");
  spec.sourceSha256 = module.string("source_sha256");
  return spec;
}

} // namespace

const BundleKernel &GatedDeltaKernelSpec::kernel(KernelRole role) const {
  for (const BundleKernel &kernel : kernels)
    if (kernel.role == role)
      return kernel;
  throw FormatError("gated-delta spec '" + name + "' has no kernel with role '" +
                    bundle::roleName(role) + "'");
}

std::shared_ptr<const GatedDeltaBundle> GatedDeltaBundle::openCached(const std::string &directory) {
  std::shared_ptr<const KernelBundle> files = KernelBundle::openCached(directory);
  static std::mutex mutex;
  static auto *cache = new std::map<std::string, std::shared_ptr<const GatedDeltaBundle>>();
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<const GatedDeltaBundle> &entry = (*cache)[files->directory()];
  // The entry holds its KernelBundle, so the same address means the same
  // (unchanged) manifest.
  if (entry && entry->files_ == files)
    return entry;

  auto bundle = std::shared_ptr<GatedDeltaBundle>(new GatedDeltaBundle());
  bundle->files_ = files;
  const std::string manifestPath = files->path("manifest.json");
  JsonValue manifest = readJsonFile(manifestPath);
  JsonObject root(manifest, manifestPath);
  const JsonValue::Array &modules = arrayMember(root, "modules");
  for (size_t i = 0; i < modules.size(); ++i) {
    JsonObject module(modules[i], manifestPath + ": modules[" + std::to_string(i) + "]");
    if (module.string("kind") != "gated_delta")
      continue;
    bundle->specs_.push_back(
        parseModule(JsonObject(modules[i], manifestPath + ": module '" + module.string("name") + "'")));
  }
  for (const GatedDeltaKernelSpec &spec : bundle->specs_) {
    files->readVerified(spec.sourceFile, spec.sourceSha256);
    for (const auto &[arch, binary] : spec.binaries)
      files->verifyBinary(binary);
  }
  entry = bundle;
  return entry;
}

const GatedDeltaKernelSpec &GatedDeltaBundle::spec(const std::string &name) const {
  std::string known;
  for (const GatedDeltaKernelSpec &spec : specs_) {
    if (spec.name == name)
      return spec;
    known += (known.empty() ? "" : ", ") + spec.name;
  }
  throw FormatError("kernel bundle " + directory() + " has no gated-delta spec '" + name +
                    "' (it has: " + (known.empty() ? "none" : known) + ")");
}

KernelImage GatedDeltaBundle::kernelImage(const GatedDeltaKernelSpec &spec,
                                          const std::string &arch) const {
  for (const std::string &candidate : {arch, arch + "a"}) {
    auto found = spec.binaries.find(candidate);
    if (found != spec.binaries.end() && found->second.hasCubins())
      return files_->binaryImage(found->second, spec.kernels);
  }
  std::string archs;
  for (const auto &[name, binary] : spec.binaries)
    if (binary.hasCubins())
      archs += (archs.empty() ? "" : ", ") + name;
  throw FormatError("kernel bundle " + directory() + ": gated-delta spec '" + spec.name +
                    "' has no cubin for " + arch + " (it has: " + (archs.empty() ? "none" : archs) +
                    "); compile it with dflex-compile --arch " + arch);
}

} // namespace dflex::runtime
