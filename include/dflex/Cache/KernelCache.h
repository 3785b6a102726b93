//===- KernelCache.h - Content-addressed on-disk cache ---------------------===//
//
// One file per entry, named by its key, with a header that lets readers check
// it completely (see docs/cache.md). A bad entry is never trusted and never
// fatal: it is moved to a quarantine folder, reported through the warning
// sink, and treated as a miss, so it gets rebuilt. A cache directory that
// cannot be created makes the cache work uncached, with a warning.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_CACHE_KERNELCACHE_H
#define DFLEX_CACHE_KERNELCACHE_H

#include "dflex/Support/Status.h"

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dflex::cache {

/// Entry header layout (all integers little-endian):
///   magic "DFLXCACH" (8) | format version u32 | key (32 raw bytes) |
///   payload length u64 | payload SHA-256 (32) | payload
constexpr std::string_view kEntryMagic = "DFLXCACH";
constexpr uint32_t kEntryFormatVersion = 1;
constexpr size_t kEntryHeaderBytes = 8 + 4 + 32 + 8 + 32;

using WarningSink = std::function<void(const std::string &message)>;

/// A sink that prints "warning: <message>" to stderr.
WarningSink stderrWarningSink();

/// Parses a size such as "500M", "2G", "64k", "1024", "10GiB": a decimal
/// integer with an optional K, M, G or T suffix (powers of 1024, any case,
/// optionally followed by "B" or "iB").
Result<uint64_t> parseByteSize(std::string_view text);

/// The directory used when none is given: $DFLEX_CACHE_DIR, else
/// $XDG_CACHE_HOME/dflex (if absolute), else $HOME/.cache/dflex; empty if
/// none of these is set.
std::string defaultCacheDirectory();

struct CacheConfig {
  /// Cache root; empty means defaultCacheDirectory().
  std::string directory;
  /// Called for every warning, in addition to collecting it; may be empty.
  WarningSink warningSink;
};

struct CachedPayload {
  std::string payload;
  /// True if the payload came from the cache (also when another process
  /// built it while this one waited for the key's lock).
  bool hit = false;
};

struct EntryInfo {
  std::string key;
  std::string path;
  uint64_t fileBytes = 0;
  /// Seconds since the epoch of the last write or cache hit.
  int64_t lastUsed = 0;
};

struct VerifyReport {
  size_t checked = 0;
  size_t valid = 0;
  /// One message per entry that was not valid (and was quarantined, if it
  /// was corrupt).
  std::vector<std::string> problems;
};

struct GcReport {
  size_t evictedEntries = 0;
  uint64_t evictedBytes = 0;
  size_t keptEntries = 0;
  uint64_t keptBytes = 0;
  /// Quarantined entries and temporary files of crashed writers removed.
  size_t removedLeftovers = 0;
};

class KernelCache {
public:
  using Builder = std::function<Result<std::string>()>;

  explicit KernelCache(CacheConfig config = {});

  /// False when the directory could not be set up; every call then works
  /// uncached (getOrBuild always builds, lookup always misses).
  bool enabled() const { return enabled_; }
  /// The cache root (may be empty when disabled).
  const std::string &directory() const { return root_; }

  /// The payload stored under `key`, or nullopt on a miss. A corrupt entry
  /// is quarantined and reported, and counts as a miss.
  std::optional<std::string> lookup(std::string_view key);

  /// Stores `payload` under `key` atomically, holding the key's lock.
  Status store(std::string_view key, std::string_view payload);

  /// The payload under `key`, building and storing it on a miss. Concurrent
  /// callers (threads or processes) on one key build once: the others wait
  /// for the key's lock and then read the stored entry. Fails only if `key`
  /// is malformed or `build` fails; problems with the cache itself become
  /// warnings. Exceptions thrown by `build` propagate (the lock is released).
  Result<CachedPayload> getOrBuild(std::string_view key, const Builder &build);

  /// Entries currently stored, sorted by key.
  std::vector<EntryInfo> list() const;
  /// Reads every entry completely; corrupt ones are quarantined.
  VerifyReport verify();
  /// Evicts least-recently-used entries until entries take at most
  /// `maxBytes`, and removes quarantined entries and stale temporary files.
  GcReport gc(uint64_t maxBytes);
  /// Removes all entries, quarantined entries and temporary files.
  Status clear();

  /// Every warning reported so far, oldest first.
  std::vector<std::string> warnings() const;

private:
  enum class EntryState { Valid, Missing, Corrupt, Unreadable };
  struct EntryRead {
    EntryState state = EntryState::Missing;
    std::string payload;
    std::string problem;
  };
  class KeyLock;

  std::string entryPath(std::string_view key) const;
  std::string lockPath(std::string_view key) const;
  EntryRead readEntry(std::string_view key) const;
  Status writeEntry(std::string_view key, std::string_view payload) const;
  /// Moves a corrupt entry away; returns what was done, for the report.
  std::string quarantine(std::string_view key, const std::string &problem);
  /// Reads an entry; a corrupt one is read again under the key's lock and,
  /// if still corrupt, quarantined (quarantineMessage says so).
  EntryRead readOrQuarantine(std::string_view key,
                             std::string &quarantineMessage);
  void markUsed(std::string_view key) const;
  void warn(std::string message);

  std::string root_;
  std::string entriesDir_;
  std::string locksDir_;
  std::string quarantineDir_;
  bool enabled_ = false;
  WarningSink sink_;
  mutable std::mutex warningsMutex_;
  std::vector<std::string> warnings_;
};

} // namespace dflex::cache

#endif // DFLEX_CACHE_KERNELCACHE_H
