// Runs the dflex-cache binary the way a user would.
#include "TestUtil.h"

#include "dflex/Cache/CacheKey.h"
#include "dflex/Cache/KernelCache.h"
#include "dflex/Support/File.h"

#include <gtest/gtest.h>

#include <cstdio>

using namespace dflex;
using namespace dflex::cache;
using dflex::test::TempDir;

namespace {

struct ToolRun {
  int status = -1;
  std::string output; // stdout and stderr together
};

ToolRun runTool(const std::string &arguments, const std::string &env = "") {
  ToolRun run;
  std::string command =
      env + " " + std::string(DFLEX_CACHE_TOOL) + " " + arguments + " 2>&1";
  FILE *pipe = ::popen(command.c_str(), "r");
  if (!pipe)
    return run;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    run.output.append(buffer, got);
  int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

class CacheToolTest : public ::testing::Test {
protected:
  std::string key(int i) {
    return KeyBuilder("tool-test").add("i", int64_t(i)).key();
  }
  std::string dirOption() const { return "--dir " + root_.str(); }
  std::string entryPath(const std::string &key) const {
    return root_.str() + "/v1/entries/" + key + ".entry";
  }

  TempDir root_;
};

TEST_F(CacheToolTest, ListShowsEntries) {
  KernelCache cache(CacheConfig{root_.str(), {}});
  ASSERT_TRUE(cache.store(key(1), std::string(2000, 'a')).ok());
  ASSERT_TRUE(cache.store(key(2), "b").ok());
  ToolRun run = runTool("ls " + dirOption());
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(contains(run.output, key(1) + "      2.0K  ")) << run.output;
  EXPECT_TRUE(contains(run.output, key(2) + "       85B  ")) << run.output;
  EXPECT_TRUE(contains(run.output, "2 entries, 2.1K in " + root_.str()))
      << run.output;
}

TEST_F(CacheToolTest, VerifyReportsAndQuarantines) {
  KernelCache cache(CacheConfig{root_.str(), {}});
  ASSERT_TRUE(cache.store(key(1), "good").ok());
  ASSERT_TRUE(cache.store(key(2), "bad").ok());
  ASSERT_TRUE(writeFileAtomic(entryPath(key(2)), "").ok());

  ToolRun run = runTool("verify " + dirOption());
  EXPECT_EQ(run.status, 3) << run.output;
  EXPECT_TRUE(contains(run.output, "bad: cache entry '" + entryPath(key(2)) +
                                       "' is corrupt (empty file); moved to"))
      << run.output;
  EXPECT_TRUE(contains(run.output, "2 entries checked, 1 valid, 1 bad"))
      << run.output;

  ToolRun again = runTool("verify " + dirOption());
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_TRUE(contains(again.output, "1 entries checked, 1 valid, 0 bad"));
}

TEST_F(CacheToolTest, GcAndClear) {
  KernelCache cache(CacheConfig{root_.str(), {}});
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(cache.store(key(i), std::string(1024, 'x')).ok());
  ToolRun gc = runTool("gc --max-size 2K " + dirOption());
  EXPECT_EQ(gc.status, 0) << gc.output;
  EXPECT_TRUE(contains(gc.output, "evicted 2 entries")) << gc.output;
  EXPECT_EQ(cache.list().size(), 1u);

  ToolRun clear = runTool(dirOption() + " clear");
  EXPECT_EQ(clear.status, 0) << clear.output;
  EXPECT_TRUE(contains(clear.output, "removed 1 entries")) << clear.output;
  EXPECT_TRUE(cache.list().empty());
}

TEST_F(CacheToolTest, EnvironmentSelectsDirectory) {
  KernelCache cache(CacheConfig{root_.str(), {}});
  ASSERT_TRUE(cache.store(key(7), "x").ok());
  ToolRun run = runTool("ls", "DFLEX_CACHE_DIR=" + root_.str());
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(contains(run.output, key(7))) << run.output;
}

struct BadUsage {
  const char *arguments;
  const char *message;
};

void PrintTo(const BadUsage &usage, std::ostream *out) {
  *out << usage.arguments;
}

class CacheToolUsage : public ::testing::TestWithParam<BadUsage> {};

TEST_P(CacheToolUsage, ExitsOneWithMessage) {
  ToolRun run = runTool(GetParam().arguments);
  EXPECT_EQ(run.status, 1) << run.output;
  EXPECT_TRUE(contains(run.output,
                       std::string("dflex-cache: ") + GetParam().message))
      << run.output;
  EXPECT_TRUE(contains(run.output, "usage: dflex-cache")) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Errors, CacheToolUsage,
    ::testing::Values(
        BadUsage{"", "missing command"},
        BadUsage{"frobnicate", "unknown command 'frobnicate'"},
        BadUsage{"ls extra", "unexpected argument 'extra'"},
        BadUsage{"ls --verbose", "unknown option '--verbose'"},
        BadUsage{"gc", "gc needs --max-size SIZE"},
        BadUsage{"gc --max-size", "invalid size '': expected a number"},
        BadUsage{"gc --max-size 3X", "invalid size '3X': unknown unit 'X'"},
        BadUsage{"ls --max-size 1G", "--max-size only applies to gc"},
        BadUsage{"ls --dir", "--dir needs a directory"}));

TEST(CacheTool, UnusableDirectoryFails) {
  TempDir root;
  std::string file = root.str() + "/file";
  ASSERT_TRUE(writeFileAtomic(file, "x").ok());
  ToolRun run = runTool("ls --dir " + file + "/cache");
  EXPECT_EQ(run.status, 2) << run.output;
  EXPECT_TRUE(contains(run.output, "warning: kernel cache disabled"))
      << run.output;
  EXPECT_TRUE(contains(run.output, "dflex-cache: no usable cache directory"))
      << run.output;
}

} // namespace
