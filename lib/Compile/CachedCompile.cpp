//===- CachedCompile.cpp -------------------------------------------------------===//
#include "dflex/Compile/CachedCompile.h"

#include "dflex/Cache/CacheKey.h"
#include "dflex/Support/File.h"
#include "dflex/Support/Sha256.h"

#include <algorithm>
#include <mutex>

namespace dflex::compile {

namespace {

// Bump when the meaning of a cached ArchBinary changes without any hashed
// input changing.
constexpr std::string_view kKeyPurpose = "nvrtc-arch-binary/1";

/// Digest of the CUDA headers generated kernels include, so that pointing
/// DFLEX_CUDA_INCLUDE at another toolkit's headers changes the key. Read once
/// per directory.
std::string cudaHeaderDigest(const std::string &includeDir) {
  static std::mutex mutex;
  static std::map<std::string, std::string> digests;
  std::lock_guard<std::mutex> guard(mutex);
  auto [it, inserted] = digests.try_emplace(includeDir);
  if (!inserted)
    return it->second;
  Sha256 hasher;
  for (const char *header :
       {"cuda_bf16.h", "cuda_bf16.hpp", "cuda_fp16.h", "cuda_fp16.hpp"}) {
    Result<std::string> contents = readFile(includeDir + "/" + header);
    // A missing header hashes as absent, which also changes the key.
    hasher.update(header);
    hasher.update(contents.ok() ? "present" : "absent");
    if (contents.ok())
      hasher.update(Sha256::hexDigest(contents.value()));
  }
  it->second = toHex(hasher.finish());
  return it->second;
}

} // namespace

Result<std::string> archCacheKey(const CompileRequest &request,
                                 std::string_view arch,
                                 std::string_view templateVersion) {
  Result<std::string> version = nvrtcVersion();
  if (!version.ok())
    return version.status();
  Result<std::string> includeDir = cudaIncludeDirectory();
  if (!includeDir.ok())
    return includeDir.status();

  cache::KeyBuilder key(kKeyPurpose);
  key.add("template-version", templateVersion)
      .add("nvrtc-version", version.value())
      .add("cuda-include-dir", includeDir.value())
      .add("cuda-headers", cudaHeaderDigest(includeDir.value()))
      .add("arch", arch)
      .add("program-name", request.programName)
      .add("source", request.source);
  std::vector<const HeaderFile *> headers;
  for (const HeaderFile &header : request.headers)
    headers.push_back(&header);
  std::sort(headers.begin(), headers.end(),
            [](const HeaderFile *a, const HeaderFile *b) {
              return a->name < b->name;
            });
  key.add("header-count", int64_t(headers.size()));
  for (const HeaderFile *header : headers)
    key.add("header-name", header->name).add("header", header->contents);
  key.add("option-count", int64_t(request.options.size()));
  for (const std::string &option : request.options)
    key.add("option", option);
  key.add("name-expression-count", int64_t(request.nameExpressions.size()));
  for (const std::string &expression : request.nameExpressions)
    key.add("name-expression", expression);
  return key.key();
}

Result<std::vector<ArchBinary>> compileCached(const CompileRequest &request,
                                              cache::KernelCache &cache,
                                              std::string_view templateVersion) {
  if (request.archs.empty())
    return Result<std::vector<ArchBinary>>::failure(
        "no architecture requested");
  std::vector<ArchBinary> binaries;
  for (const std::string &arch : request.archs) {
    Result<std::string> key = archCacheKey(request, arch, templateVersion);
    if (!key.ok())
      return key.status();
    Result<cache::CachedPayload> payload =
        cache.getOrBuild(key.value(), [&]() -> Result<std::string> {
          Result<ArchBinary> binary = compileForArch(request, arch);
          if (!binary.ok())
            return binary.status();
          return serializeArchBinary(binary.value());
        });
    if (!payload.ok())
      return payload.status();
    Result<ArchBinary> binary = deserializeArchBinary(payload.value().payload);
    if (!binary.ok())
      return Result<std::vector<ArchBinary>>::failure(
          "cache entry " + key.value() + " for " + arch + ": " +
          binary.error());
    binary.value().fromCache = payload.value().hit;
    if (Status status = checkSharedMemory(request, binary.value());
        !status.ok())
      return status;
    binaries.push_back(std::move(binary.value()));
  }
  return binaries;
}

} // namespace dflex::compile
