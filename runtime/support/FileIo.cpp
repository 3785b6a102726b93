#include "dflex/runtime/support/FileIo.h"

#include "dflex/Support/File.h"
#include "dflex/Support/Error.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dflex::runtime {

namespace {

[[noreturn]] void fail(const std::string &action, const std::string &path,
                       int error) {
  throw IoError("cannot " + action + " '" + path +
                "': " + std::strerror(error));
}

} // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    fail("open", path, errno);
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    fail("stat", path, error);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw IoError("cannot map '" + path + "': not a regular file");
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = size_t(info.st_size);
  if (file->size_ > 0) {
    void *data = ::mmap(nullptr, file->size_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      fail("map", path, error);
    }
    file->data_ = static_cast<uint8_t *>(data);
  }
  ::close(fd); // the mapping keeps the file open
  return file;
}

MappedFile::~MappedFile() {
  if (data_)
    ::munmap(data_, size_);
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  std::filesystem::path target(path_);
  std::string directory = target.parent_path().string();
  if (directory.empty())
    directory = ".";
  tempPath_ = directory + "/" + atomicTempPrefix(target.filename().string()) +
              "XXXXXX";
  fd_ = ::mkostemp(tempPath_.data(), O_CLOEXEC);
  if (fd_ < 0)
    fail("create a temporary file in", directory, errno);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tempPath_.c_str());
  }
}

void AtomicFileWriter::write(const void *data, size_t size) {
  const char *bytes = static_cast<const char *>(data);
  while (size > 0) {
    ssize_t written = ::write(fd_, bytes, size);
    if (written < 0) {
      if (errno == EINTR)
        continue;
      fail("write", tempPath_, errno);
    }
    bytes += written;
    size -= size_t(written);
    written_ += uint64_t(written);
  }
}

void AtomicFileWriter::commit() {
  if (::fchmod(fd_, 0644) != 0)
    fail("chmod", tempPath_, errno);
  if (::fsync(fd_) != 0)
    fail("fsync", tempPath_, errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    int error = errno;
    ::unlink(tempPath_.c_str());
    fail("close", tempPath_, error);
  }
  if (::rename(tempPath_.c_str(), path_.c_str()) != 0) {
    int error = errno;
    ::unlink(tempPath_.c_str());
    fail("rename '" + tempPath_ + "' to", path_, error);
  }
  // The rename is durable only once the directory is synced.
  std::string directory = std::filesystem::path(path_).parent_path().string();
  if (Status status = syncDirectory(directory.empty() ? "." : directory); !status.ok())
    throw IoError(status.message());
}

} // namespace dflex::runtime
