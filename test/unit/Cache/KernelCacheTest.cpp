#include "TestUtil.h"

#include "dflex/Cache/CacheKey.h"
#include "dflex/Cache/KernelCache.h"
#include "dflex/Support/File.h"
#include "dflex/Support/Hex.h"
#include "dflex/Support/Sha256.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>

using namespace dflex;
using namespace dflex::cache;
using dflex::test::runInChild;
using dflex::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string testKey(std::string_view name) {
  return KeyBuilder("kernel-cache-test").add("name", name).key();
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> filesUnder(const fs::path &dir) {
  std::vector<std::string> files;
  std::error_code error;
  for (auto it = fs::recursive_directory_iterator(dir, error);
       it != fs::recursive_directory_iterator(); it.increment(error))
    if (!it->is_directory())
      files.push_back(fs::relative(it->path(), dir).string());
  std::sort(files.begin(), files.end());
  return files;
}

class KernelCacheTest : public ::testing::Test {
protected:
  KernelCache makeCache() { return KernelCache(CacheConfig{root_.str(), {}}); }
  fs::path entryFile(const std::string &key) const {
    return root_.path() / "v1" / "entries" / (key + ".entry");
  }
  fs::path quarantineDir() const { return root_.path() / "v1" / "quarantine"; }

  // A builder that counts its calls.
  KernelCache::Builder counting(std::string payload) {
    return [this, payload]() -> Result<std::string> {
      ++builds_;
      return payload;
    };
  }

  TempDir root_;
  int builds_ = 0;
};

TEST_F(KernelCacheTest, MissThenHit) {
  KernelCache cache = makeCache();
  ASSERT_TRUE(cache.enabled());
  std::string key = testKey("a");
  EXPECT_EQ(cache.lookup(key), std::nullopt);

  Result<CachedPayload> first = cache.getOrBuild(key, counting("cubin bytes"));
  ASSERT_TRUE(first.ok()) << first.error();
  EXPECT_FALSE(first.value().hit);
  EXPECT_EQ(first.value().payload, "cubin bytes");

  Result<CachedPayload> second = cache.getOrBuild(key, counting("other"));
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second.value().hit);
  EXPECT_EQ(second.value().payload, "cubin bytes");
  EXPECT_EQ(builds_, 1);

  // A fresh instance (another process) sees the entry too.
  EXPECT_EQ(makeCache().lookup(key), std::optional<std::string>("cubin bytes"));
  EXPECT_TRUE(cache.warnings().empty());
  // Nothing but the entry: no lock files, no temporary files.
  EXPECT_EQ(filesUnder(root_.path()),
            std::vector<std::string>{"v1/entries/" + key + ".entry"});
}

TEST_F(KernelCacheTest, EntryFormat) {
  KernelCache cache = makeCache();
  std::string key = testKey("format");
  std::string payload("payload\0bytes", 13);
  ASSERT_TRUE(cache.store(key, payload).ok());
  std::string bytes = readFile(entryFile(key).string()).value();
  ASSERT_EQ(bytes.size(), kEntryHeaderBytes + payload.size());
  EXPECT_EQ(bytes.substr(0, 8), "DFLXCACH");
  EXPECT_EQ(bytes.substr(8, 4), std::string("\x01\0\0\0", 4));
  EXPECT_EQ(toHex(bytes.substr(12, 32)), key);
  EXPECT_EQ(bytes.substr(44, 8), std::string("\x0d\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(toHex(bytes.substr(52, 32)), Sha256::hexDigest(payload));
  EXPECT_EQ(bytes.substr(84), payload);
  EXPECT_EQ(cache.lookup(key), std::optional<std::string>(payload));
}

TEST_F(KernelCacheTest, EmptyPayloadIsAValidEntry) {
  KernelCache cache = makeCache();
  std::string key = testKey("empty payload");
  ASSERT_TRUE(cache.getOrBuild(key, counting("")).ok());
  Result<CachedPayload> again = cache.getOrBuild(key, counting("x"));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again.value().hit);
  EXPECT_EQ(again.value().payload, "");
}

TEST_F(KernelCacheTest, BuilderFailureStoresNothing) {
  KernelCache cache = makeCache();
  std::string key = testKey("fails");
  Result<CachedPayload> failed = cache.getOrBuild(
      key, [] { return Result<std::string>::failure("nvrtc said no"); });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error(), "nvrtc said no");
  EXPECT_TRUE(filesUnder(root_.path()).empty());
  // The lock was released: the next call builds.
  ASSERT_TRUE(cache.getOrBuild(key, counting("ok")).ok());
  EXPECT_EQ(builds_, 1);
}

TEST_F(KernelCacheTest, MalformedKeyIsAnError) {
  KernelCache cache = makeCache();
  Result<CachedPayload> result = cache.getOrBuild("../../etc", counting("x"));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error(), "malformed cache key '../../etc': expected 64 "
                            "lowercase hex digits");
  EXPECT_EQ(builds_, 0);
  EXPECT_FALSE(cache.store("ABC", "x").ok());
}

// Each way of damaging an entry: the reader must quarantine it, warn, and
// rebuild, leaving a valid entry and no temporary files.
struct Damage {
  const char *name;
  std::function<void(std::string &bytes, const std::string &otherEntry)> apply;
  const char *problem;
};

void PrintTo(const Damage &damage, std::ostream *out) { *out << damage.name; }

class CorruptEntry : public KernelCacheTest,
                     public ::testing::WithParamInterface<Damage> {};

TEST_P(CorruptEntry, IsQuarantinedAndRebuilt) {
  std::string key = testKey("victim");
  std::string otherKey = testKey("other");
  {
    KernelCache writer = makeCache();
    ASSERT_TRUE(writer.store(key, "original payload").ok());
    ASSERT_TRUE(writer.store(otherKey, "other payload").ok());
  }
  std::string bytes = readFile(entryFile(key).string()).value();
  std::string other = readFile(entryFile(otherKey).string()).value();
  GetParam().apply(bytes, other);
  ASSERT_TRUE(writeFileAtomic(entryFile(key).string(), bytes).ok());

  KernelCache cache = makeCache();
  Result<CachedPayload> result = cache.getOrBuild(key, counting("rebuilt"));
  ASSERT_TRUE(result.ok()) << result.error();
  EXPECT_FALSE(result.value().hit);
  EXPECT_EQ(result.value().payload, "rebuilt");
  EXPECT_EQ(builds_, 1);

  std::vector<std::string> warnings = cache.warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(contains(warnings[0], "cache entry '" +
                                        entryFile(key).string() +
                                        "' is corrupt (" + GetParam().problem))
      << warnings[0];
  EXPECT_TRUE(contains(warnings[0], "); moved to '" + quarantineDir().string()))
      << warnings[0];
  EXPECT_TRUE(contains(warnings[0], "rebuilding")) << warnings[0];

  // The damaged bytes are kept for inspection; the entry is good again.
  std::vector<std::string> quarantined = filesUnder(quarantineDir());
  ASSERT_EQ(quarantined.size(), 1u);
  EXPECT_EQ(readFile((quarantineDir() / quarantined[0]).string()).value(),
            bytes);
  EXPECT_EQ(makeCache().lookup(key), std::optional<std::string>("rebuilt"));
  EXPECT_EQ(filesUnder(root_.path() / "v1" / "entries").size(), 2u);
  EXPECT_TRUE(filesUnder(root_.path() / "v1" / "locks").empty());
}

INSTANTIATE_TEST_SUITE_P(
    Faults, CorruptEntry,
    ::testing::Values(
        Damage{"EmptyFile", [](std::string &b, auto &) { b.clear(); },
               "empty file"},
        Damage{"TruncatedHeader",
               [](std::string &b, auto &) { b.resize(40); },
               "truncated header (40 of 84 bytes)"},
        Damage{"TruncatedPayload",
               [](std::string &b, auto &) { b.resize(b.size() - 5); },
               "header announces 16 payload bytes but the file holds 11"},
        Damage{"TrailingBytes", [](std::string &b, auto &) { b += "junk"; },
               "header announces 16 payload bytes but the file holds 20"},
        Damage{"FlippedPayloadByte",
               [](std::string &b, auto &) { b[90] ^= 0x01; },
               "payload sha256 mismatch"},
        Damage{"FlippedDigestByte",
               [](std::string &b, auto &) { b[60] ^= 0x80; },
               "payload sha256 mismatch"},
        Damage{"BadMagic", [](std::string &b, auto &) { b[0] = 'X'; },
               "bad magic"},
        Damage{"OtherVersion", [](std::string &b, auto &) { b[8] = 2; },
               "unsupported format version 2"},
        Damage{"WrongKey",
               [](std::string &b, const std::string &other) { b = other; },
               "header holds key "}),
    [](const auto &testInfo) { return std::string(testInfo.param.name); });

TEST_F(KernelCacheTest, LookupQuarantinesCorruptEntry) {
  std::string key = testKey("lookup");
  KernelCache cache = makeCache();
  ASSERT_TRUE(cache.store(key, "payload").ok());
  std::string bytes = readFile(entryFile(key).string()).value();
  bytes.back() ^= 0x20;
  ASSERT_TRUE(writeFileAtomic(entryFile(key).string(), bytes).ok());
  EXPECT_EQ(cache.lookup(key), std::nullopt);
  ASSERT_EQ(cache.warnings().size(), 1u);
  EXPECT_TRUE(contains(cache.warnings()[0], "treating it as a miss"));
  EXPECT_FALSE(fs::exists(entryFile(key)));
  EXPECT_EQ(filesUnder(quarantineDir()).size(), 1u);
}

TEST_F(KernelCacheTest, WarningSinkSeesWarnings) {
  std::vector<std::string> seen;
  std::string key = testKey("sink");
  fs::create_directories(root_.path() / "v1" / "entries");
  ASSERT_TRUE(writeFileAtomic(entryFile(key).string(), "").ok());
  KernelCache cache(CacheConfig{
      root_.str(), [&](const std::string &message) { seen.push_back(message); }});
  EXPECT_EQ(cache.lookup(key), std::nullopt);
  EXPECT_EQ(seen, cache.warnings());
  EXPECT_EQ(seen.size(), 1u);
}

TEST_F(KernelCacheTest, UncreatableDirectoryWorksUncached) {
  std::string file = (root_.path() / "a-file").string();
  ASSERT_TRUE(writeFileAtomic(file, "not a directory").ok());
  KernelCache cache(CacheConfig{file + "/cache", {}});
  EXPECT_FALSE(cache.enabled());
  ASSERT_EQ(cache.warnings().size(), 1u);
  EXPECT_TRUE(contains(cache.warnings()[0], "kernel cache disabled: cannot "
                                            "create directory '" +
                                                file + "/cache/v1/entries'"))
      << cache.warnings()[0];
  EXPECT_TRUE(contains(cache.warnings()[0], "working uncached"));
  std::string key = testKey("uncached");
  for (int i = 0; i < 2; ++i) {
    Result<CachedPayload> result = cache.getOrBuild(key, counting("payload"));
    ASSERT_TRUE(result.ok());
    EXPECT_FALSE(result.value().hit);
    EXPECT_EQ(result.value().payload, "payload");
  }
  EXPECT_EQ(builds_, 2);
  EXPECT_EQ(cache.lookup(key), std::nullopt);
  EXPECT_EQ(filesUnder(root_.path()), std::vector<std::string>{"a-file"});
}

// A read-only cache (e.g. a shared one): existing entries still hit, new ones
// are built and returned with warnings, and no stray files appear.
TEST_F(KernelCacheTest, ReadOnlyDirectoryStillServesAndBuilds) {
  std::string presentKey = testKey("present"), newKey = testKey("new");
  ASSERT_TRUE(makeCache().store(presentKey, "stored").ok());
  for (const char *sub : {"", "/v1", "/v1/entries", "/v1/locks",
                          "/v1/quarantine"})
    ASSERT_EQ(::chmod((root_.str() + sub).c_str(), 0555), 0);
  std::string report = runInChild(
      [&]() -> std::string {
        KernelCache cache = makeCache();
        if (!cache.enabled())
          return "cache disabled";
        Result<CachedPayload> present =
            cache.getOrBuild(presentKey, counting("unused"));
        if (!present.ok() || !present.value().hit ||
            present.value().payload != "stored")
          return "existing entry not served";
        Result<CachedPayload> built = cache.getOrBuild(newKey, counting("new"));
        if (!built.ok() || built.value().hit || built.value().payload != "new")
          return "new entry not built";
        std::vector<std::string> warnings = cache.warnings();
        if (warnings.size() != 2 ||
            !contains(warnings[0], "cannot create lock file") ||
            !contains(warnings[1], "cannot store cache entry") ||
            !contains(warnings[1], "continuing uncached"))
          return "unexpected warnings: " + ::testing::PrintToString(warnings);
        return "";
      },
      /*unprivileged=*/true);
  EXPECT_EQ(report, "");
  for (const char *sub : {"", "/v1", "/v1/entries", "/v1/locks",
                          "/v1/quarantine"})
    ::chmod((root_.str() + sub).c_str(), 0755);
  EXPECT_EQ(filesUnder(root_.path()),
            std::vector<std::string>{"v1/entries/" + presentKey + ".entry"});
}

// An entry the process may not read is rebuilt and replaced (the directories
// are writable, so the rename over it succeeds).
TEST_F(KernelCacheTest, UnreadableEntryIsRebuilt) {
  std::string key = testKey("unreadable");
  ASSERT_TRUE(makeCache().store(key, "stored").ok());
  for (const char *sub : {"", "/v1", "/v1/entries", "/v1/locks",
                          "/v1/quarantine"})
    ASSERT_EQ(::chmod((root_.str() + sub).c_str(), 0777), 0);
  ASSERT_EQ(::chmod(entryFile(key).c_str(), 0000), 0);
  std::string report = runInChild(
      [&]() -> std::string {
        KernelCache cache = makeCache();
        Result<CachedPayload> result = cache.getOrBuild(key, counting("new"));
        if (!result.ok() || result.value().hit ||
            result.value().payload != "new")
          return "not rebuilt";
        std::vector<std::string> warnings = cache.warnings();
        if (warnings.size() != 1 ||
            !contains(warnings[0], "cannot read cache entry: cannot open '" +
                                       entryFile(key).string() +
                                       "': Permission denied; rebuilding it"))
          return "unexpected warnings: " + ::testing::PrintToString(warnings);
        if (cache.lookup(key) != std::optional<std::string>("new"))
          return "rebuilt entry not stored";
        return "";
      },
      /*unprivileged=*/true);
  EXPECT_EQ(report, "");
  EXPECT_EQ(filesUnder(root_.path()),
            std::vector<std::string>{"v1/entries/" + key + ".entry"});
}

TEST_F(KernelCacheTest, UnreadableDirectoryWorksUncached) {
  ASSERT_TRUE(makeCache().enabled());
  ASSERT_EQ(::chmod(root_.str().c_str(), 0000), 0);
  std::string report = runInChild(
      [&]() -> std::string {
        KernelCache cache = makeCache();
        if (cache.enabled())
          return "cache enabled in an unreadable directory";
        Result<CachedPayload> result =
            cache.getOrBuild(testKey("k"), counting("p"));
        if (!result.ok() || result.value().payload != "p")
          return "not built";
        if (cache.warnings().size() != 1 ||
            !contains(cache.warnings()[0], "Permission denied"))
          return "unexpected warnings: " +
                 ::testing::PrintToString(cache.warnings());
        return "";
      },
      /*unprivileged=*/true);
  ::chmod(root_.str().c_str(), 0755);
  EXPECT_EQ(report, "");
}

TEST_F(KernelCacheTest, VerifyQuarantinesBadEntries) {
  KernelCache cache = makeCache();
  std::string good = testKey("good"), bad = testKey("bad");
  ASSERT_TRUE(cache.store(good, "fine").ok());
  ASSERT_TRUE(cache.store(bad, "soon broken").ok());
  ASSERT_TRUE(writeFileAtomic(entryFile(bad).string(), "short").ok());
  // Files that are not entries are ignored.
  ASSERT_TRUE(
      writeFileAtomic((root_.path() / "v1" / "entries" / "README").string(), "")
          .ok());
  VerifyReport report = cache.verify();
  EXPECT_EQ(report.checked, 2u);
  EXPECT_EQ(report.valid, 1u);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_TRUE(contains(report.problems[0], bad + ".entry' is corrupt "
                                                 "(truncated header (5 of 84 "
                                                 "bytes))"))
      << report.problems[0];
  EXPECT_FALSE(fs::exists(entryFile(bad)));
  EXPECT_TRUE(fs::exists(entryFile(good)));
  EXPECT_EQ(cache.verify().problems.size(), 0u);
}

void setLastUse(const fs::path &path, int64_t seconds) {
  struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

TEST_F(KernelCacheTest, GcEvictsLeastRecentlyUsed) {
  KernelCache cache = makeCache();
  std::string payload(1000, 'p');
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) {
    keys.push_back(testKey("gc" + std::to_string(i)));
    ASSERT_TRUE(cache.store(keys.back(), payload).ok());
    setLastUse(entryFile(keys.back()), 1000000 + i * 100);
  }
  // A hit makes the oldest entry the most recently used.
  ASSERT_TRUE(cache.lookup(keys[0]).has_value());

  fs::path entries = root_.path() / "v1" / "entries";
  ASSERT_TRUE(
      writeFileAtomic((entries / ".x.entry.tmp.stale1").string(), "x").ok());
  setLastUse(entries / ".x.entry.tmp.stale1", 1000);
  ASSERT_TRUE(
      writeFileAtomic((entries / ".y.entry.tmp.fresh1").string(), "y").ok());
  ASSERT_TRUE(
      writeFileAtomic((quarantineDir() / "old.entry").string(), "bad").ok());

  uint64_t entryBytes = kEntryHeaderBytes + payload.size();
  GcReport report = cache.gc(2 * entryBytes + 10);
  EXPECT_EQ(report.evictedEntries, 2u);
  EXPECT_EQ(report.evictedBytes, 2 * entryBytes);
  EXPECT_EQ(report.keptEntries, 2u);
  EXPECT_EQ(report.keptBytes, 2 * entryBytes);
  EXPECT_EQ(report.removedLeftovers, 2u);
  // keys[1] and keys[2] were the least recently used.
  EXPECT_TRUE(fs::exists(entryFile(keys[0])));
  EXPECT_FALSE(fs::exists(entryFile(keys[1])));
  EXPECT_FALSE(fs::exists(entryFile(keys[2])));
  EXPECT_TRUE(fs::exists(entryFile(keys[3])));
  // A temporary file of a writer that may still be running is kept.
  EXPECT_TRUE(fs::exists(entries / ".y.entry.tmp.fresh1"));
  EXPECT_FALSE(fs::exists(entries / ".x.entry.tmp.stale1"));
  EXPECT_TRUE(filesUnder(quarantineDir()).empty());

  EXPECT_EQ(cache.gc(0).keptEntries, 0u);
  EXPECT_TRUE(cache.list().empty());
}

TEST_F(KernelCacheTest, ClearRemovesEverything) {
  KernelCache cache = makeCache();
  ASSERT_TRUE(cache.store(testKey("1"), "a").ok());
  ASSERT_TRUE(cache.store(testKey("2"), "b").ok());
  ASSERT_TRUE(
      writeFileAtomic((quarantineDir() / "old.entry").string(), "bad").ok());
  ASSERT_EQ(cache.list().size(), 2u);
  ASSERT_TRUE(cache.clear().ok());
  EXPECT_TRUE(cache.list().empty());
  EXPECT_TRUE(filesUnder(root_.path()).empty());
}

TEST_F(KernelCacheTest, ListReportsSizesAndKeys) {
  KernelCache cache = makeCache();
  std::string a = testKey("list-a"), b = testKey("list-b");
  ASSERT_TRUE(cache.store(a, "12345").ok());
  ASSERT_TRUE(cache.store(b, "").ok());
  std::vector<EntryInfo> entries = cache.list();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_LT(entries[0].key, entries[1].key);
  for (const EntryInfo &entry : entries) {
    EXPECT_EQ(entry.fileBytes, kEntryHeaderBytes + (entry.key == a ? 5 : 0));
    EXPECT_EQ(entry.path, entryFile(entry.key).string());
    EXPECT_GT(entry.lastUsed, 0);
  }
}

// Several processes on one empty cache: exactly one builds, all read the same
// payload, and no lock or temporary file remains.
TEST_F(KernelCacheTest, ConcurrentProcessesBuildOnce) {
  constexpr int kProcesses = 8;
  std::string key = testKey("contended");
  std::string buildLog = (root_.path() / "builds.log").string();
  int startPipe[2];
  ASSERT_EQ(::pipe(startPipe), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(startPipe[1]);
      char byte;
      // Blocks until the parent closes its end: all start together.
      while (::read(startPipe[0], &byte, 1) > 0) {
      }
      KernelCache cache(CacheConfig{(root_.path() / "cache").string(), {}});
      Result<CachedPayload> result = cache.getOrBuild(key, [&] {
        int fd = ::open(buildLog.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
        std::string line = std::to_string(::getpid()) + "\n";
        ssize_t ignored = ::write(fd, line.data(), line.size());
        (void)ignored;
        ::close(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return Result<std::string>("built by " + std::to_string(::getpid()) +
                                   std::string(100000, 'x'));
      });
      std::string out = (root_.path() / ("result" + std::to_string(i))).string();
      bool written =
          result.ok() &&
          writeFileAtomic(out, std::string(result.value().hit ? "hit " : "miss ") +
                                   Sha256::hexDigest(result.value().payload))
              .ok();
      ::_exit(written && cache.warnings().empty() ? 0 : 1);
    }
    children.push_back(pid);
  }
  ::close(startPipe[0]);
  ::close(startPipe[1]);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }

  std::string builds = readFile(buildLog).value();
  EXPECT_EQ(std::count(builds.begin(), builds.end(), '\n'), 1) << builds;
  std::string expectedDigest = Sha256::hexDigest(
      "built by " + builds.substr(0, builds.size() - 1) +
      std::string(100000, 'x'));
  int misses = 0;
  for (int i = 0; i < kProcesses; ++i) {
    std::string result =
        readFile((root_.path() / ("result" + std::to_string(i))).string())
            .value();
    misses += result.rfind("miss ", 0) == 0;
    EXPECT_EQ(result.substr(result.find(' ') + 1), expectedDigest);
  }
  EXPECT_EQ(misses, 1);
  EXPECT_TRUE(filesUnder(root_.path() / "cache" / "v1" / "locks").empty());
  EXPECT_EQ(filesUnder(root_.path() / "cache" / "v1" / "entries").size(), 1u);
}

// The per-key lock also orders threads of one process sharing one cache.
TEST_F(KernelCacheTest, ConcurrentThreadsBuildOnce) {
  KernelCache cache = makeCache();
  std::string key = testKey("threads");
  std::atomic<int> builds{0}, hits{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&] {
      Result<CachedPayload> result = cache.getOrBuild(key, [&] {
        ++builds;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        return Result<std::string>("shared");
      });
      if (result.ok() && result.value().payload == "shared" &&
          result.value().hit)
        ++hits;
    });
  for (std::thread &thread : threads)
    thread.join();
  EXPECT_EQ(builds.load(), 1);
  EXPECT_EQ(hits.load(), 5);
}

class ScopedEnv {
public:
  ScopedEnv(const char *name, const char *value) : name_(name) {
    if (const char *old = std::getenv(name))
      old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

private:
  const char *name_;
  std::optional<std::string> old_;
};

TEST(DefaultCacheDirectory, FollowsEnvironment) {
  ScopedEnv home("HOME", "/home/someone");
  {
    ScopedEnv dflex("DFLEX_CACHE_DIR", "/scratch/kernels");
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(defaultCacheDirectory(), "/scratch/kernels");
  }
  ScopedEnv dflex("DFLEX_CACHE_DIR", nullptr);
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(defaultCacheDirectory(), "/xdg/dflex");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "relative/path");
    EXPECT_EQ(defaultCacheDirectory(), "/home/someone/.cache/dflex");
  }
  ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
  EXPECT_EQ(defaultCacheDirectory(), "/home/someone/.cache/dflex");
  ScopedEnv noHome("HOME", nullptr);
  EXPECT_EQ(defaultCacheDirectory(), "");
  KernelCache cache;
  EXPECT_FALSE(cache.enabled());
  ASSERT_EQ(cache.warnings().size(), 1u);
  EXPECT_TRUE(contains(cache.warnings()[0], "no directory"));
}

TEST(ParseByteSize, AcceptsUnits) {
  EXPECT_EQ(parseByteSize("1024").value(), 1024u);
  EXPECT_EQ(parseByteSize("500M").value(), 500ull << 20);
  EXPECT_EQ(parseByteSize("2G").value(), 2ull << 30);
  EXPECT_EQ(parseByteSize("2g").value(), 2ull << 30);
  EXPECT_EQ(parseByteSize("64KiB").value(), 64ull << 10);
  EXPECT_EQ(parseByteSize("1TB").value(), 1ull << 40);
  EXPECT_EQ(parseByteSize("0").value(), 0u);
  EXPECT_EQ(parseByteSize("").error(),
            "invalid size '': expected a number such as 500M or 2G");
  EXPECT_EQ(parseByteSize("1.5G").error(),
            "invalid size '1.5G': unknown unit '.5G' (use K, M, G or T)");
  EXPECT_EQ(parseByteSize("-1").error(),
            "invalid size '-1': expected a number such as 500M or 2G");
  EXPECT_EQ(parseByteSize("99999999999T").error(),
            "invalid size '99999999999T': too large");
  EXPECT_EQ(parseByteSize("99999999999999999999").error(),
            "invalid size '99999999999999999999': too large");
}

} // namespace
