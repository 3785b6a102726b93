#include "dflex/Support/File.h"

#include <gtest/gtest.h>

#include <filesystem>

#include <sys/stat.h>

using namespace dflex;
namespace fs = std::filesystem;

namespace {

class FileTest : public ::testing::Test {
protected:
  void SetUp() override {
    std::string pattern =
        (fs::temp_directory_path() / "dflex-file-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  size_t fileCount() const {
    return size_t(std::distance(fs::directory_iterator(dir_),
                                fs::directory_iterator()));
  }

  fs::path dir_;
};

TEST_F(FileTest, WriteThenReadBack) {
  std::string path = (dir_ / "data.bin").string();
  std::string contents("binary\0data\xff", 12);
  ASSERT_TRUE(writeFileAtomic(path, contents).ok());
  Result<std::string> read = readFile(path);
  ASSERT_TRUE(read.ok()) << read.error();
  EXPECT_EQ(read.value(), contents);
  struct stat info;
  ASSERT_EQ(::stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644u);
  // Only the target exists: the temporary file was renamed away.
  EXPECT_EQ(fileCount(), 1u);
}

TEST_F(FileTest, ReplacesExistingFile) {
  std::string path = (dir_ / "data.txt").string();
  ASSERT_TRUE(writeFileAtomic(path, "old contents that are longer").ok());
  ASSERT_TRUE(writeFileAtomic(path, "new").ok());
  EXPECT_EQ(readFile(path).value(), "new");
  EXPECT_EQ(fileCount(), 1u);
}

TEST_F(FileTest, ReadErrorsNameThePath) {
  std::string path = (dir_ / "missing").string();
  Result<std::string> read = readFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.error(),
            "cannot open '" + path + "': No such file or directory");
  Result<std::string> directory = readFile(dir_.string());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.error().find("Is a directory"), std::string::npos);
}

TEST_F(FileTest, FailedWriteLeavesNothingBehind) {
  // Renaming a file over a non-empty directory fails after the temporary
  // file was written: it must be removed again.
  fs::create_directories(dir_ / "occupied" / "child");
  Status status = writeFileAtomic((dir_ / "occupied").string(), "data");
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("cannot rename"), std::string::npos)
      << status.message();
  EXPECT_EQ(fileCount(), 1u);

  Status noDirectory =
      writeFileAtomic((dir_ / "absent" / "file").string(), "data");
  ASSERT_FALSE(noDirectory.ok());
  EXPECT_NE(noDirectory.message().find("cannot create a temporary file in"),
            std::string::npos);
}

TEST_F(FileTest, CreateDirectories) {
  std::string nested = (dir_ / "a" / "b" / "c").string();
  ASSERT_TRUE(createDirectories(nested).ok());
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_TRUE(createDirectories(nested).ok());

  std::string file = (dir_ / "file").string();
  ASSERT_TRUE(writeFileAtomic(file, "x").ok());
  Status underFile = createDirectories(file + "/sub");
  ASSERT_FALSE(underFile.ok());
  EXPECT_NE(underFile.message().find("cannot create directory"),
            std::string::npos);
  Status isFile = createDirectories(file);
  ASSERT_FALSE(isFile.ok());
  EXPECT_EQ(isFile.message(),
            "cannot create directory '" + file + "': Not a directory");
}

} // namespace
