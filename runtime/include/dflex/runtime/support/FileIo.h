// Read-only memory maps and atomically replaced output files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace dflex::runtime {

/// A whole file mapped copy-on-write: readers may modify the bytes they see
/// (e.g. through a tensor view) without ever changing the file. Shared so that
/// views (tensors, samples) can keep the mapping alive.
class MappedFile {
public:
  /// Throws IoError naming the path.
  static std::shared_ptr<const MappedFile> open(const std::string &path);
  ~MappedFile();
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;

  const std::string &path() const { return path_; }
  const uint8_t *data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view bytes(size_t offset, size_t length) const {
    return {reinterpret_cast<const char *>(data_) + offset, length};
  }

private:
  MappedFile() = default;
  std::string path_;
  uint8_t *data_ = nullptr;
  size_t size_ = 0;
};

/// Writes a file that appears under its final name only when complete: the
/// bytes go to a temporary file in the same directory, which commit() fsyncs
/// and renames over the target (then fsyncs the directory). Destroying the
/// writer without commit() removes the temporary file and leaves the target
/// untouched. Errors throw IoError naming the path.
class AtomicFileWriter {
public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter &) = delete;
  AtomicFileWriter &operator=(const AtomicFileWriter &) = delete;

  void write(const void *data, size_t size);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  uint64_t bytesWritten() const { return written_; }
  void commit();

private:
  std::string path_;
  std::string tempPath_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

} // namespace dflex::runtime
