//===- BundleWriter.cpp - Writing kernel bundles --------------------------===//

#include "dflex/Bundle/BundleWriter.h"

#include "dflex/Bundle/Specs.h"
#include "dflex/Support/File.h"
#include "dflex/Support/Sha256.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dflex::bundle {

namespace {

JsonValue resourcesJson(const compile::KernelResources &resources) {
  JsonValue json = JsonValue::object();
  json["registers"] = static_cast<int64_t>(resources.registers);
  json["static_shared_bytes"] = static_cast<int64_t>(resources.staticSharedBytes);
  json["stack_frame_bytes"] = static_cast<int64_t>(resources.stackFrameBytes);
  json["spill_store_bytes"] = static_cast<int64_t>(resources.spillStoreBytes);
  json["spill_load_bytes"] = static_cast<int64_t>(resources.spillLoadBytes);
  return json;
}

Status write(const fs::path &path, std::string_view contents) {
  return writeFileAtomic(path.string(), contents);
}

/// Moves `staging` to `directory`, replacing what is there.
Status replaceDirectory(const fs::path &staging, const fs::path &directory) {
  std::error_code error;
  for (int attempt = 0; attempt < 16; ++attempt) {
    if (::rename(staging.c_str(), directory.c_str()) == 0)
      return Status::success();
    if (errno != ENOTEMPTY && errno != EEXIST)
      return Status::failure("cannot move the bundle into " + directory.string() + ": " +
                             std::strerror(errno));
    // Another bundle is there: move it aside, then remove it.
    fs::path old = directory.string() + ".old-" + std::to_string(::getpid()) + "-" +
                   std::to_string(attempt);
    if (::rename(directory.c_str(), old.c_str()) == 0)
      fs::remove_all(old, error);
  }
  return Status::failure("cannot replace " + directory.string() + ": it keeps reappearing");
}

} // namespace

const BinaryPart *ModuleBinary::partOf(const std::string &expression) const {
  for (const BinaryPart &part : parts)
    if (!part.binary.loweredName(expression).empty())
      return &part;
  return nullptr;
}

Status writeBundle(const std::string &directory, const std::string &sourcePath,
                   const std::string &sourceText, const std::vector<std::string> &archs,
                   const std::vector<CompiledModule> &modules) {
  fs::path target(directory);
  fs::path staging = target.string() + ".partial-" + std::to_string(::getpid());
  std::error_code error;
  fs::remove_all(staging, error);
  if (Status status = createDirectories(staging.string()); !status.ok())
    return status;

  JsonValue manifest = JsonValue::object();
  manifest["format_version"] = kBundleFormatVersion;
  manifest["template_version"] = kTemplateVersion;
  manifest["source"] = fs::path(sourcePath).filename().string();
  manifest["source_sha256"] = Sha256::hexDigest(sourceText);
  Result<std::string> nvrtc = compile::nvrtcVersion();
  manifest["nvrtc_version"] = nvrtc.ok() ? nvrtc.value() : "unknown";
  JsonValue archList = JsonValue::array();
  for (const std::string &arch : archs)
    archList.push(arch);
  manifest["archs"] = std::move(archList);

  Status status = Status::success();
  JsonValue moduleList = JsonValue::array();
  for (const CompiledModule &module : modules) {
    const std::string &base = module.fileStem;
    JsonValue m = JsonValue::object();
    m["name"] = module.name;
    m["kind"] = module.kind;
    m["spec"] = module.spec;
    m["source_file"] = base + ".cu";
    m["source_sha256"] = Sha256::hexDigest(module.source);
    m["variant"] = module.variant;
    JsonValue programs = JsonValue::array();
    for (const JsonValue &program : module.programs)
      programs.push(program);
    m["programs"] = std::move(programs);
    status = write(staging / (base + ".cu"), module.source);
    if (!status.ok())
      break;

    JsonValue kernels = JsonValue::array();
    for (const ModuleKernel &kernel : module.kernels) {
      const KernelRoleInfo &role = kernelRole(kernel.role);
      JsonValue k = JsonValue::object();
      k["role"] = role.name;
      k["name_expression"] = kernel.nameExpression;
      if (*role.requiredTarget)
        k["required_target"] = role.requiredTarget;
      // The archs whose binaries have the kernel.
      JsonValue perArch = JsonValue::object();
      for (const ModuleBinary &binary : module.binaries) {
        const BinaryPart *part = binary.partOf(kernel.nameExpression);
        if (!part)
          continue;
        JsonValue a = JsonValue::object();
        std::string lowered = part->binary.loweredName(kernel.nameExpression);
        a["lowered_name"] = lowered;
        if (const compile::KernelResources *resources = part->binary.findKernel(lowered))
          a["resources"] = resourcesJson(*resources);
        perArch[binary.arch] = std::move(a);
      }
      k["archs"] = std::move(perArch);
      kernels.push(std::move(k));
    }
    m["kernels"] = std::move(kernels);

    JsonValue binaries = JsonValue::object();
    for (const ModuleBinary &binary : module.binaries) {
      JsonValue parts = JsonValue::object();
      for (const BinaryPart &part : binary.parts) {
        JsonValue p = JsonValue::object();
        const std::string stem = base + "." + binary.arch + "." + part.name;
        status = write(staging / (stem + ".ptx"), part.binary.ptx);
        p["ptx"] = stem + ".ptx";
        p["ptx_sha256"] = Sha256::hexDigest(part.binary.ptx);
        if (status.ok() && !part.binary.cubin.empty()) {
          status = write(staging / (stem + ".cubin"), part.binary.cubin);
          p["cubin"] = stem + ".cubin";
          p["cubin_sha256"] = Sha256::hexDigest(part.binary.cubin);
        }
        p["cache_key"] = part.cacheKey;
        parts[part.name] = std::move(p);
        if (!status.ok())
          break;
      }
      JsonValue b = JsonValue::object();
      b["parts"] = std::move(parts);
      JsonValue launch = JsonValue::object();
      for (const auto &[symbol, values] : binary.launch) {
        JsonValue entry = JsonValue::object();
        for (const auto &[name, value] : values)
          entry[name] = value;
        launch[symbol] = std::move(entry);
      }
      b["launch"] = std::move(launch);
      binaries[binary.arch] = std::move(b);
      if (!status.ok())
        break;
    }
    m["binaries"] = std::move(binaries);
    moduleList.push(std::move(m));
    if (!status.ok())
      break;
  }
  manifest["modules"] = std::move(moduleList);
  if (status.ok())
    status = write(staging / "manifest.json", writeJson(manifest) + "\n");
  if (status.ok())
    status = replaceDirectory(staging, target);
  if (!status.ok())
    fs::remove_all(staging, error);
  return status;
}

} // namespace dflex::bundle
