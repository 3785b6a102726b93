//===- CachedCompile.h - NVRTC compilation through the kernel cache --------===//
#ifndef DFLEX_COMPILE_CACHEDCOMPILE_H
#define DFLEX_COMPILE_CACHEDCOMPILE_H

#include "dflex/Cache/KernelCache.h"
#include "dflex/Compile/Nvrtc.h"

namespace dflex::compile {

/// The cache key of `request` compiled for `arch`: a hash of the source,
/// program name, in-memory headers (sorted by name), options in order, name
/// expressions, arch, NVRTC version, the CUDA include directory and the
/// contents of the CUDA fp16/bf16 headers, and `templateVersion` (the
/// version of the kernel templates and code generator that produced the
/// source). The dynamic shared memory sizes are not part of it: they change
/// no bits of the binary and are checked on every call.
Result<std::string> archCacheKey(const CompileRequest &request,
                                 std::string_view arch,
                                 std::string_view templateVersion);

/// compileAllArchs() through the cache, one entry per arch: an arch already in the
/// cache is loaded (ArchBinary::fromCache is set), others are compiled and
/// stored. The shared-memory check runs on cached binaries too. Cache
/// problems become warnings of `cache`, never failures.
Result<std::vector<ArchBinary>> compileCached(const CompileRequest &request,
                                              cache::KernelCache &cache,
                                              std::string_view templateVersion);

} // namespace dflex::compile

#endif // DFLEX_COMPILE_CACHEDCOMPILE_H
