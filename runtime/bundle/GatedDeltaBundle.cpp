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

/// The kernels a spec's options need, in launch order (docs/gated-delta.md;
/// lib/Codegen/GatedDelta.cpp emits exactly these roles).
std::vector<std::string> requiredRoles(const codegen::GatedDeltaSpec &spec) {
  std::vector<std::string> roles;
  if (spec.varlen)
    roles.push_back("gated_delta_chunk_table");
  for (const char *role : {"forward_prepare", "forward_state", "forward_output", "backward_prepare",
                           "backward_state", "backward_chunk"})
    roles.push_back(std::string("gated_delta_") + role);
  if (spec.numValueHeads > spec.numKeyHeads)
    roles.push_back("gated_delta_backward_finalize");
  if (spec.inKernelGate)
    roles.push_back("gated_delta_backward_gate_params");
  return roles;
}

void parseAttributes(const JsonObject &attributes, GatedDeltaKernelSpec &spec) {
  spec.numKeyHeads = attributes.integer("num_key_heads");
  spec.numValueHeads = attributes.integer("num_value_heads");
  spec.keyDim = attributes.integer("key_dim");
  spec.valueDim = attributes.integer("value_dim");
  spec.gate = attributes.string("gate");
  spec.elementType = attributes.string("element_type");
  const double scale = attributes.number("scale");
  spec.scale = static_cast<float>(scale);
  auto flag = [&](const char *key) {
    if (!attributes.hasValue(key))
      attributes.fail(key, "missing");
    return attributes.boolean(key, false);
  };
  spec.deltaRule = flag("delta_rule");
  spec.qkL2Norm = flag("qk_l2norm");
  spec.initialState = flag("initial_state");
  spec.finalState = flag("final_state");
  spec.varlen = flag("varlen");
  spec.inKernelGate = flag("in_kernel_gate");
  if (spec.numKeyHeads <= 0 || spec.numValueHeads <= 0 ||
      spec.numValueHeads % spec.numKeyHeads != 0)
    attributes.fail("num_value_heads", "must be a positive multiple of num_key_heads");
  for (const char *key : {"key_dim", "value_dim"})
    if (const int64_t dim = attributes.integer(key); dim != 64 && dim != 128)
      attributes.fail(key, "the kernels take 64 or 128, got " + std::to_string(dim));
  if (spec.gate != "none" && spec.gate != "scalar_log")
    attributes.fail("gate", "the kernels implement none and scalar_log, got '" + spec.gate + "'");
  if (spec.inKernelGate && spec.gate != "scalar_log")
    attributes.fail("in_kernel_gate", "requires gate scalar_log");
  if (spec.elementType != "bf16")
    attributes.fail("element_type", "the kernels take bf16, got '" + spec.elementType + "'");
  if (!(scale > 0) || !std::isfinite(scale))
    attributes.fail("scale", "must be positive and finite");
}

GatedDeltaLaunch parseLaunch(const JsonObject &constants, const GatedDeltaKernelSpec &spec) {
  auto constant = [&](const std::string &key) {
    const int64_t value = constants.integer(key);
    if (value <= 0 || value > (int64_t(1) << 24))
      constants.fail(key, "must be a positive launch constant, got " + std::to_string(value));
    return value;
  };
  GatedDeltaLaunch launch;
  launch.threads = constant("threads");
  launch.chunkBackwardThreads = constant("chunk_backward_threads");
  launch.stateThreads = constant("state_threads");
  launch.chunkTableThreads = constant("chunk_table_threads");
  launch.finalizeThreads = constant("finalize_threads");
  launch.chunk = constant("chunk");
  if (!constants.has("value_block"))
    constants.fail("value_block", "missing (a bundle from an older dflex-compile: rebuild it)");
  launch.valueBlock = constant("value_block");
  if (spec.valueDim % launch.valueBlock != 0)
    constants.fail("value_block", "does not divide value_dim " + std::to_string(spec.valueDim));
  for (const char *kernel : {"forward_prepare", "forward_state", "forward_output", "backward_prepare",
                             "backward_state", "backward_chunk"})
    launch.sharedBytes[std::string("gated_delta_") + kernel] =
        constant(std::string(kernel) + "_shared_bytes");
  return launch;
}

GatedDeltaKernelSpec parseModule(const JsonObject &module) {
  GatedDeltaKernelSpec spec;
  spec.name = module.string("name");
  parseAttributes(module.object("spec"), spec);

  const JsonValue::Array &kernels = arrayMember(module, "kernels");
  for (size_t i = 0; i < kernels.size(); ++i) {
    JsonObject entry(kernels[i], module.where() + ": kernels[" + std::to_string(i) + "]");
    BundleKernel kernel;
    kernel.role = entry.string("role");
    kernel.nameExpression = entry.string("name_expression");
    JsonObject archs = entry.object("archs");
    for (const auto &[arch, value] : archs.members())
      kernel.loweredNames[arch] =
          JsonObject(value, archs.where() + ": " + arch).string("lowered_name");
    spec.kernels.push_back(std::move(kernel));
  }
  for (const std::string &role : requiredRoles(spec)) {
    bool found = false;
    for (const BundleKernel &kernel : spec.kernels)
      found = found || kernel.role == role;
    if (!found)
      module.fail("kernels", "no kernel with role '" + role + "'");
  }

  spec.binaries = detail::parseBundleBinaries(module, spec.kernels);
  // Each binary's launch constants, read from its own PTX.
  JsonObject binaries = module.object("binaries");
  for (const auto &[arch, binary] : spec.binaries)
    spec.launches[arch] = parseLaunch(
        binaries.object(arch).object("launch").object("dflex_gated_delta_launch"), spec);
  spec.sourceFile = module.string("source_file");
  spec.sourceSha256 = module.string("source_sha256");
  return spec;
}

} // namespace

const BundleKernel &GatedDeltaKernelSpec::kernel(const std::string &role) const {
  for (const BundleKernel &kernel : kernels)
    if (kernel.role == role)
      return kernel;
  throw FormatError("gated-delta spec '" + name + "' has no kernel with role '" + role + "'");
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
    for (const auto &[arch, binary] : spec.binaries) {
      files->readVerified(binary.ptxFile, binary.ptxSha256);
      if (!binary.cubinFile.empty())
        files->readVerified(binary.cubinFile, binary.cubinSha256);
    }
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
    if (found == spec.binaries.end() || found->second.cubinFile.empty())
      continue;
    KernelImage image;
    image.image = files_->readVerified(found->second.cubinFile, found->second.cubinSha256);
    image.arch = candidate;
    image.label = files_->path(found->second.cubinFile);
    for (const BundleKernel &kernel : spec.kernels)
      image.loweredNames[kernel.role] = kernel.loweredNames.at(candidate);
    return image;
  }
  std::string archs;
  for (const auto &[name, binary] : spec.binaries)
    if (!binary.cubinFile.empty())
      archs += (archs.empty() ? "" : ", ") + name;
  throw FormatError("kernel bundle " + directory() + ": gated-delta spec '" + spec.name +
                    "' has no cubin for " + arch + " (it has: " + (archs.empty() ? "none" : archs) +
                    "); compile it with dflex-compile --arch " + arch);
}

} // namespace dflex::runtime
