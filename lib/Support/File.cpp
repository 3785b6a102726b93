//===- File.cpp --------------------------------------------------------------===//
#include "dflex/Support/File.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dflex {

namespace {

std::string systemError(const std::string &action, const std::string &path,
                        int error) {
  return "cannot " + action + " '" + path + "': " + std::strerror(error);
}

// Closes a descriptor on scope exit unless released.
class FileDescriptor {
public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  FileDescriptor(const FileDescriptor &) = delete;
  FileDescriptor &operator=(const FileDescriptor &) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  /// Closes now and reports close()'s error (which can be a delayed write
  /// error on some file systems).
  int close() {
    int result = ::close(fd_);
    fd_ = -1;
    return result;
  }

private:
  int fd_;
};

Status writeAll(int fd, std::string_view contents, const std::string &path) {
  const char *data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    ssize_t written = ::write(fd, data, left);
    if (written < 0) {
      if (errno == EINTR)
        continue;
      return Status::failure(systemError("write", path, errno));
    }
    data += written;
    left -= size_t(written);
  }
  return Status::success();
}

} // namespace

Result<std::string> readFile(const std::string &path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid())
    return Result<std::string>::failure(systemError("open", path, errno));
  struct stat info;
  if (::fstat(fd.get(), &info) != 0)
    return Result<std::string>::failure(systemError("stat", path, errno));
  if (S_ISDIR(info.st_mode))
    return Result<std::string>::failure(systemError("read", path, EISDIR));
  std::string contents;
  if (S_ISREG(info.st_mode))
    contents.reserve(size_t(info.st_size));
  char buffer[1 << 16];
  while (true) {
    ssize_t got = ::read(fd.get(), buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR)
        continue;
      return Result<std::string>::failure(systemError("read", path, errno));
    }
    if (got == 0)
      break;
    contents.append(buffer, size_t(got));
  }
  return contents;
}

std::string atomicTempPrefix(std::string_view fileName) {
  return "." + std::string(fileName) + ".tmp.";
}

Status writeFileAtomic(const std::string &path, std::string_view contents) {
  std::filesystem::path target(path);
  std::string directory = target.parent_path().string();
  if (directory.empty())
    directory = ".";
  std::string tempPath = directory + "/" +
                         atomicTempPrefix(target.filename().string()) +
                         "XXXXXX";

  FileDescriptor fd(::mkostemp(tempPath.data(), O_CLOEXEC));
  if (!fd.valid())
    return Status::failure(
        systemError("create a temporary file in", directory, errno));

  auto fail = [&](Status status) {
    if (fd.valid())
      fd.close();
    ::unlink(tempPath.c_str());
    return status;
  };

  if (Status status = writeAll(fd.get(), contents, tempPath); !status.ok())
    return fail(status);
  if (::fchmod(fd.get(), 0644) != 0)
    return fail(Status::failure(systemError("chmod", tempPath, errno)));
  if (::fsync(fd.get()) != 0)
    return fail(Status::failure(systemError("fsync", tempPath, errno)));
  if (fd.close() != 0)
    return fail(Status::failure(systemError("close", tempPath, errno)));
  if (::rename(tempPath.c_str(), path.c_str()) != 0)
    return fail(Status::failure(
        systemError("rename '" + tempPath + "' to", path, errno)));

  // The rename is durable only once the directory itself is synced.
  return syncDirectory(directory);
}

Status syncDirectory(const std::string &directory) {
  FileDescriptor dir(
      ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid())
    return Status::failure(systemError("open directory", directory, errno));
  if (::fsync(dir.get()) != 0)
    return Status::failure(systemError("fsync directory", directory, errno));
  return Status::success();
}

Status createDirectories(const std::string &path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error)
    return Status::failure("cannot create directory '" + path +
                           "': " + error.message());
  return Status::success();
}

} // namespace dflex
