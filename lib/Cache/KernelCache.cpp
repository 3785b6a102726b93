//===- KernelCache.cpp - Content-addressed on-disk cache --------------------===//
#include "dflex/Cache/KernelCache.h"

#include "dflex/Cache/CacheKey.h"
#include "dflex/Support/ByteIO.h"
#include "dflex/Support/File.h"
#include "dflex/Support/Hex.h"
#include "dflex/Support/Sha256.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dflex::cache {

namespace {

constexpr std::string_view kEntrySuffix = ".entry";
constexpr std::string_view kLockSuffix = ".lock";
// Temporary files older than this belong to a writer that died.
constexpr int64_t kStaleTempSeconds = 3600;

std::string errnoText(int error) { return std::strerror(error); }

/// Names in `directory` other than "." and "..", sorted; empty if it cannot
/// be read.
std::vector<std::string> directoryNames(const std::string &directory) {
  std::vector<std::string> names;
  DIR *dir = ::opendir(directory.c_str());
  if (!dir)
    return names;
  while (const dirent *entry = ::readdir(dir)) {
    std::string_view name = entry->d_name;
    if (name != "." && name != "..")
      names.emplace_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

bool endsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.substr(text.size() - suffix.size()) == suffix;
}

/// The key of an entry file name "<key>.entry", or empty.
std::string_view keyOfEntryName(std::string_view name) {
  if (!endsWith(name, kEntrySuffix))
    return {};
  std::string_view key = name.substr(0, name.size() - kEntrySuffix.size());
  return isValidKey(key) ? key : std::string_view();
}

bool isTempName(std::string_view name) {
  return !name.empty() && name[0] == '.' &&
         name.find(".tmp.") != std::string_view::npos;
}

int64_t lastUsedSeconds(const struct stat &info) {
  return std::max<int64_t>(info.st_atim.tv_sec, info.st_mtim.tv_sec);
}

int64_t nowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string encodeEntry(std::string_view key, std::string_view payload) {
  ByteWriter writer;
  writer.raw(kEntryMagic);
  writer.u32(kEntryFormatVersion);
  writer.raw(fromHex(key).value());
  writer.u64(payload.size());
  Sha256::Digest digest = Sha256::digest(payload);
  writer.raw(std::string_view(reinterpret_cast<const char *>(digest.data()),
                              digest.size()));
  writer.raw(payload);
  return writer.take();
}

/// Checks a whole entry file; returns the problem, or empty if it is valid.
std::string checkEntry(std::string_view bytes, std::string_view key) {
  if (bytes.empty())
    return "empty file";
  if (bytes.size() < kEntryHeaderBytes)
    return "truncated header (" + std::to_string(bytes.size()) + " of " +
           std::to_string(kEntryHeaderBytes) + " bytes)";
  ByteReader reader(bytes);
  std::string_view magic, storedKey, storedDigest;
  uint32_t version = 0;
  uint64_t payloadBytes = 0;
  reader.raw(kEntryMagic.size(), magic, "magic");
  reader.u32(version, "format version");
  reader.raw(32, storedKey, "key");
  reader.u64(payloadBytes, "payload length");
  reader.raw(32, storedDigest, "payload sha256");
  if (magic != kEntryMagic)
    return "bad magic";
  if (version != kEntryFormatVersion)
    return "unsupported format version " + std::to_string(version);
  if (toHex(storedKey) != key)
    return "header holds key " + toHex(storedKey);
  if (payloadBytes != reader.remaining())
    return "header announces " + std::to_string(payloadBytes) +
           " payload bytes but the file holds " +
           std::to_string(reader.remaining());
  Sha256::Digest digest = Sha256::digest(bytes.substr(kEntryHeaderBytes));
  if (storedDigest != std::string_view(reinterpret_cast<const char *>(
                                           digest.data()),
                                       digest.size()))
    return "payload sha256 mismatch";
  return {};
}

} // namespace

//===----------------------------------------------------------------------===//
// Per-key lock
//===----------------------------------------------------------------------===//

/// An exclusive flock on "<locks>/<key>.lock". The holder removes the lock
/// file when it releases it, so none remain at rest; a waiter that then wakes
/// up holding the removed file notices (its inode no longer matches the path)
/// and locks the path again.
class KernelCache::KeyLock {
public:
  static Result<KeyLock> acquire(const std::string &path, bool wait) {
    while (true) {
      int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0)
        return Result<KeyLock>::failure("cannot create lock file '" + path +
                                        "': " + errnoText(errno));
      int result;
      do
        result = ::flock(fd, wait ? LOCK_EX : LOCK_EX | LOCK_NB);
      while (result != 0 && errno == EINTR);
      if (result != 0) {
        int error = errno;
        ::close(fd);
        return Result<KeyLock>::failure("cannot lock '" + path +
                                        "': " + errnoText(error));
      }
      struct stat held, current;
      if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &current) == 0 &&
          held.st_ino == current.st_ino && held.st_dev == current.st_dev)
        return KeyLock(fd, path);
      ::close(fd);
    }
  }

  KeyLock(KeyLock &&other) noexcept
      : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}
  KeyLock &operator=(KeyLock &&) = delete;
  KeyLock(const KeyLock &) = delete;
  ~KeyLock() {
    if (fd_ < 0)
      return;
    ::unlink(path_.c_str());
    ::close(fd_);
  }

private:
  KeyLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_;
  std::string path_;
};

//===----------------------------------------------------------------------===//
// KernelCache
//===----------------------------------------------------------------------===//

WarningSink stderrWarningSink() {
  return [](const std::string &message) {
    std::fprintf(stderr, "warning: %s\n", message.c_str());
  };
}

Result<uint64_t> parseByteSize(std::string_view text) {
  auto invalid = [&](const std::string &why) {
    return Result<uint64_t>::failure("invalid size '" + std::string(text) +
                                     "': " + why);
  };
  size_t digits = 0;
  uint64_t value = 0;
  for (; digits < text.size() && text[digits] >= '0' && text[digits] <= '9';
       ++digits) {
    uint64_t digit = uint64_t(text[digits] - '0');
    if (value > (UINT64_MAX - digit) / 10)
      return invalid("too large");
    value = value * 10 + digit;
  }
  if (digits == 0)
    return invalid("expected a number such as 500M or 2G");
  std::string unit;
  for (char c : text.substr(digits))
    unit.push_back(char(std::tolower(static_cast<unsigned char>(c))));
  if (unit.size() > 1 && (unit.substr(1) == "b" || unit.substr(1) == "ib"))
    unit.resize(1);
  int shift;
  if (unit.empty() || unit == "b")
    shift = 0;
  else if (unit == "k")
    shift = 10;
  else if (unit == "m")
    shift = 20;
  else if (unit == "g")
    shift = 30;
  else if (unit == "t")
    shift = 40;
  else
    return invalid("unknown unit '" + std::string(text.substr(digits)) +
                   "' (use K, M, G or T)");
  if (shift > 0 && value > (UINT64_MAX >> shift))
    return invalid("too large");
  return value << shift;
}

std::string defaultCacheDirectory() {
  auto variable = [](const char *name) -> std::string {
    const char *value = std::getenv(name);
    return value ? value : "";
  };
  if (std::string dir = variable("DFLEX_CACHE_DIR"); !dir.empty())
    return dir;
  // The XDG base directory specification ignores relative paths.
  if (std::string xdg = variable("XDG_CACHE_HOME"); !xdg.empty() &&
                                                    xdg[0] == '/')
    return xdg + "/dflex";
  if (std::string home = variable("HOME"); !home.empty())
    return home + "/.cache/dflex";
  return "";
}

KernelCache::KernelCache(CacheConfig config)
    : root_(config.directory.empty() ? defaultCacheDirectory()
                                     : std::move(config.directory)),
      sink_(std::move(config.warningSink)) {
  if (root_.empty()) {
    warn("kernel cache disabled: no directory (set DFLEX_CACHE_DIR or HOME); "
         "working uncached");
    return;
  }
  // The format version is part of the path so that different versions of
  // dflex can share one cache root without quarantining each other's entries.
  std::string versioned = root_ + "/v" + std::to_string(kEntryFormatVersion);
  entriesDir_ = versioned + "/entries";
  locksDir_ = versioned + "/locks";
  quarantineDir_ = versioned + "/quarantine";
  for (const std::string &dir : {entriesDir_, locksDir_, quarantineDir_}) {
    Status status = createDirectories(dir);
    if (!status.ok()) {
      warn("kernel cache disabled: " + status.message() + "; working uncached");
      return;
    }
  }
  enabled_ = true;
}

void KernelCache::warn(std::string message) {
  std::lock_guard<std::mutex> guard(warningsMutex_);
  if (sink_)
    sink_(message);
  warnings_.push_back(std::move(message));
}

std::vector<std::string> KernelCache::warnings() const {
  std::lock_guard<std::mutex> guard(warningsMutex_);
  return warnings_;
}

std::string KernelCache::entryPath(std::string_view key) const {
  return entriesDir_ + "/" + std::string(key) + std::string(kEntrySuffix);
}

std::string KernelCache::lockPath(std::string_view key) const {
  return locksDir_ + "/" + std::string(key) + std::string(kLockSuffix);
}

KernelCache::EntryRead KernelCache::readEntry(std::string_view key) const {
  EntryRead read;
  std::string path = entryPath(key);
  Result<std::string> bytes = readFile(path);
  if (!bytes.ok()) {
    struct stat info;
    bool missing = ::stat(path.c_str(), &info) != 0 && errno == ENOENT;
    read.state = missing ? EntryState::Missing : EntryState::Unreadable;
    read.problem = bytes.error();
    return read;
  }
  read.problem = checkEntry(bytes.value(), key);
  if (!read.problem.empty()) {
    read.state = EntryState::Corrupt;
    return read;
  }
  read.state = EntryState::Valid;
  read.payload = std::move(bytes.value()).substr(kEntryHeaderBytes);
  return read;
}

Status KernelCache::writeEntry(std::string_view key,
                               std::string_view payload) const {
  return writeFileAtomic(entryPath(key), encodeEntry(key, payload));
}

void KernelCache::markUsed(std::string_view key) const {
  // The access time orders entries for gc; failing to set it is harmless.
  struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
  ::utimensat(AT_FDCWD, entryPath(key).c_str(), times, 0);
}

std::string KernelCache::quarantine(std::string_view key,
                                    const std::string &problem) {
  static std::atomic<unsigned> counter{0};
  std::string path = entryPath(key);
  std::string target = quarantineDir_ + "/" + std::string(key) + "." +
                       std::to_string(nowSeconds()) + "-" +
                       std::to_string(::getpid()) + "-" +
                       std::to_string(counter++) + std::string(kEntrySuffix);
  std::string message = "cache entry '" + path + "' is corrupt (" + problem +
                        "); ";
  if (::rename(path.c_str(), target.c_str()) == 0)
    return message + "moved to '" + target + "'";
  message += "cannot move it to the quarantine folder (" + errnoText(errno) +
             ")";
  if (::unlink(path.c_str()) == 0)
    message += ", removed it";
  return message;
}

KernelCache::EntryRead
KernelCache::readOrQuarantine(std::string_view key,
                              std::string &quarantineMessage) {
  EntryRead read = readEntry(key);
  if (read.state != EntryState::Corrupt)
    return read;
  // Only quarantine under the lock: a writer may have just replaced the
  // corrupt file with a good one.
  Result<KeyLock> lock = KeyLock::acquire(lockPath(key), /*wait=*/true);
  read = readEntry(key);
  if (read.state == EntryState::Corrupt)
    quarantineMessage = quarantine(key, read.problem);
  return read;
}

std::optional<std::string> KernelCache::lookup(std::string_view key) {
  if (!enabled_)
    return std::nullopt;
  if (!isValidKey(key)) {
    warn("malformed cache key '" + std::string(key) + "'");
    return std::nullopt;
  }
  std::string quarantined;
  EntryRead read = readOrQuarantine(key, quarantined);
  if (!quarantined.empty())
    warn(quarantined + "; treating it as a miss");
  if (read.state == EntryState::Unreadable)
    warn("cannot read cache entry: " + read.problem + "; treating as a miss");
  if (read.state != EntryState::Valid)
    return std::nullopt;
  markUsed(key);
  return std::move(read.payload);
}

Status KernelCache::store(std::string_view key, std::string_view payload) {
  if (!enabled_)
    return Status::failure("kernel cache is disabled");
  if (!isValidKey(key))
    return Status::failure("malformed cache key '" + std::string(key) + "'");
  Result<KeyLock> lock = KeyLock::acquire(lockPath(key), /*wait=*/true);
  if (!lock.ok())
    return lock.status();
  return writeEntry(key, payload);
}

Result<CachedPayload> KernelCache::getOrBuild(std::string_view key,
                                              const Builder &build) {
  if (!isValidKey(key))
    return Result<CachedPayload>::failure(
        "malformed cache key '" + std::string(key) +
        "': expected 64 lowercase hex digits");
  auto buildUncached = [&]() -> Result<CachedPayload> {
    Result<std::string> built = build();
    if (!built.ok())
      return built.status();
    return CachedPayload{std::move(built.value()), false};
  };
  if (!enabled_)
    return buildUncached();

  // Fast path without the lock: entries are only ever replaced by rename.
  EntryRead read = readEntry(key);
  if (read.state == EntryState::Valid) {
    markUsed(key);
    return CachedPayload{std::move(read.payload), true};
  }

  Result<KeyLock> lock = KeyLock::acquire(lockPath(key), /*wait=*/true);
  if (!lock.ok())
    warn(lock.error() + "; building without the lock");
  read = readEntry(key);
  switch (read.state) {
  case EntryState::Valid:
    markUsed(key);
    return CachedPayload{std::move(read.payload), true};
  case EntryState::Corrupt:
    warn(quarantine(key, read.problem) + "; rebuilding it");
    break;
  case EntryState::Unreadable:
    warn("cannot read cache entry: " + read.problem + "; rebuilding it");
    break;
  case EntryState::Missing:
    break;
  }

  Result<CachedPayload> built = buildUncached();
  if (!built.ok())
    return built;
  Status stored = writeEntry(key, built.value().payload);
  if (!stored.ok())
    warn("cannot store cache entry: " + stored.message() +
         "; continuing uncached");
  return built;
}

std::vector<EntryInfo> KernelCache::list() const {
  std::vector<EntryInfo> entries;
  if (!enabled_)
    return entries;
  for (const std::string &name : directoryNames(entriesDir_)) {
    std::string_view key = keyOfEntryName(name);
    if (key.empty())
      continue;
    EntryInfo info;
    info.key = std::string(key);
    info.path = entriesDir_ + "/" + name;
    struct stat status;
    if (::stat(info.path.c_str(), &status) != 0)
      continue; // removed meanwhile
    info.fileBytes = uint64_t(status.st_size);
    info.lastUsed = lastUsedSeconds(status);
    entries.push_back(std::move(info));
  }
  return entries;
}

VerifyReport KernelCache::verify() {
  VerifyReport report;
  for (const EntryInfo &entry : list()) {
    ++report.checked;
    std::string quarantined;
    EntryRead read = readOrQuarantine(entry.key, quarantined);
    if (!quarantined.empty())
      report.problems.push_back(quarantined);
    if (read.state == EntryState::Valid)
      ++report.valid;
    else if (read.state == EntryState::Unreadable)
      report.problems.push_back("cannot read cache entry: " + read.problem);
    // Missing: removed since list(); nothing to report.
  }
  return report;
}

GcReport KernelCache::gc(uint64_t maxBytes) {
  GcReport report;
  if (!enabled_)
    return report;
  auto remove = [&](const std::string &path) {
    if (::unlink(path.c_str()) == 0 || errno == ENOENT)
      return true;
    warn("cannot remove '" + path + "': " + errnoText(errno));
    return false;
  };
  for (const std::string &name : directoryNames(quarantineDir_))
    report.removedLeftovers += remove(quarantineDir_ + "/" + name);
  int64_t staleBefore = nowSeconds() - kStaleTempSeconds;
  for (const std::string &name : directoryNames(entriesDir_)) {
    std::string path = entriesDir_ + "/" + name;
    struct stat info;
    if (isTempName(name) && ::stat(path.c_str(), &info) == 0 &&
        info.st_mtim.tv_sec < staleBefore)
      report.removedLeftovers += remove(path);
  }

  std::vector<EntryInfo> entries = list();
  // Most recently used first; evict from the back.
  std::sort(entries.begin(), entries.end(),
            [](const EntryInfo &a, const EntryInfo &b) {
              return a.lastUsed != b.lastUsed ? a.lastUsed > b.lastUsed
                                              : a.key < b.key;
            });
  uint64_t total = 0;
  for (const EntryInfo &entry : entries)
    total += entry.fileBytes;
  while (!entries.empty() && total > maxBytes) {
    const EntryInfo &victim = entries.back();
    if (remove(victim.path)) {
      ++report.evictedEntries;
      report.evictedBytes += victim.fileBytes;
    }
    total -= victim.fileBytes;
    entries.pop_back();
  }
  report.keptEntries = entries.size();
  for (const EntryInfo &entry : entries)
    report.keptBytes += entry.fileBytes;
  return report;
}

Status KernelCache::clear() {
  if (!enabled_)
    return Status::failure("kernel cache is disabled");
  size_t failures = 0;
  std::string firstError;
  auto remove = [&](const std::string &path) {
    if (::unlink(path.c_str()) == 0 || errno == ENOENT)
      return;
    if (failures++ == 0)
      firstError = "cannot remove '" + path + "': " + errnoText(errno);
  };
  for (const std::string &name : directoryNames(entriesDir_))
    remove(entriesDir_ + "/" + name);
  for (const std::string &name : directoryNames(quarantineDir_))
    remove(quarantineDir_ + "/" + name);
  // A lock file in use belongs to a running build; taking the lock without
  // waiting and releasing it removes only idle ones.
  for (const std::string &name : directoryNames(locksDir_))
    KeyLock::acquire(locksDir_ + "/" + name, /*wait=*/false);
  if (failures == 0)
    return Status::success();
  return Status::failure(firstError +
                         (failures > 1 ? " (and " +
                                             std::to_string(failures - 1) +
                                             " more)"
                                       : ""));
}

} // namespace dflex::cache
