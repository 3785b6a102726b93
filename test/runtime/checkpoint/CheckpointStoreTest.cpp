// The run's checkpoint directories: atomic writes, `latest`, keep-last-N,
// failed and killed writers.
#include "TestSupport.h"

#include "dflex/Support/Error.h"
#include "dflex/Support/File.h"
#include "dflex/runtime/checkpoint/CheckpointStore.h"
#include "dflex/runtime/support/FileIo.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using dflex::runtime::test::expectError;
using dflex::runtime::test::TempDir;
namespace fs = std::filesystem;

namespace {

/// A checkpoint's one file, written as the trainer writes its files.
void writeState(const std::string &directory, const std::string &text) {
  AtomicFileWriter writer(directory + "/state.txt");
  writer.write(text);
  writer.commit();
}

std::string readState(const std::string &directory) {
  return dflex::readFile(directory + "/state.txt").value();
}

std::vector<std::string> names(const std::vector<std::string> &paths) {
  std::vector<std::string> result;
  for (const std::string &path : paths)
    result.push_back(fs::path(path).filename().string());
  return result;
}

TEST(CheckpointStore, KeepsTheNewestAndPointsLatestAtIt) {
  TempDir dir;
  CheckpointStore store(dir.file("run"), 2);
  EXPECT_FALSE(store.latest().has_value());
  for (int64_t step : {100, 200, 300, 400, 500})
    store.save(step, [&](const std::string &d) { writeState(d, "step " + std::to_string(step)); });
  EXPECT_EQ(names(store.list()), (std::vector<std::string>{"step-00000400", "step-00000500"}));
  ASSERT_TRUE(store.latest().has_value());
  EXPECT_EQ(readState(*store.latest()), "step 500");
  EXPECT_EQ(store.resolve("latest"), *store.latest());
}

TEST(CheckpointStore, AFailedWriteChangesNothing) {
  TempDir dir;
  CheckpointStore store(dir.file("run"), 3);
  store.save(1, [&](const std::string &d) { writeState(d, "one"); });
  EXPECT_THROW(store.save(2, [&](const std::string &d) {
    writeState(d, "two");
    throw IoError("disk full");
  }),
               IoError);
  EXPECT_EQ(readState(*store.latest()), "one");
  EXPECT_EQ(names(store.list()), (std::vector<std::string>{"step-00000001"}));
  for (const fs::directory_entry &entry : fs::directory_iterator(dir.file("run")))
    EXPECT_EQ(entry.path().filename().string().find(".partial-"), std::string::npos)
        << entry.path();
}

TEST(CheckpointStore, AWriterKilledMidWriteLeavesThePreviousCheckpoint) {
  TempDir dir;
  const std::string root = dir.file("run"), marker = dir.file("writing");
  {
    CheckpointStore store(root, 1);
    store.save(1, [&](const std::string &d) { writeState(d, "one"); });
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A real writer, killed while its checkpoint is half written.
    CheckpointStore store(root, 1);
    store.save(2, [&](const std::string &d) {
      writeState(d, "two, half");
      test::writeBytes(marker, "");
      for (;;)
        ::pause();
    });
    ::_exit(0);
  }
  for (int i = 0; i < 2000 && !fs::exists(marker); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(fs::exists(marker));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  CheckpointStore store(root, 1);
  ASSERT_TRUE(store.latest().has_value());
  EXPECT_EQ(readState(*store.latest()), "one");
  EXPECT_EQ(names(store.list()), (std::vector<std::string>{"step-00000001"}));
  std::vector<std::string> entries;
  for (const fs::directory_entry &entry : fs::directory_iterator(root))
    entries.push_back(entry.path().filename().string());
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"latest", "step-00000001"}));
  // And the run goes on.
  store.save(2, [&](const std::string &d) { writeState(d, "two"); });
  EXPECT_EQ(readState(store.resolve("latest")), "two");
}

TEST(CheckpointStore, ResolveNamesWhatIsMissing) {
  TempDir dir;
  CheckpointStore store(dir.file("run"), 1);
  expectError<FormatError>([&] { store.resolve("latest"); }, {"no checkpoint to resume from"});
  expectError<FormatError>([&] { store.resolve(dir.file("nope")); }, {"nope", "no such checkpoint"});
  // A `latest` naming a directory that is gone names nothing.
  test::writeBytes(dir.file("run/latest"), "step-00000009\n");
  EXPECT_FALSE(store.latest().has_value());
}

} // namespace
