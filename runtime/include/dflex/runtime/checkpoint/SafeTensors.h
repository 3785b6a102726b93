// safetensors checkpoints: single files and sharded directories
// (model.safetensors.index.json), read through memory maps and written
// atomically.
//
// File layout (the safetensors format): u64 little-endian header length N,
// N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {string: string}}, then the data section; offsets are
// relative to the data section, and the tensors must tile it exactly.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dflex::runtime {

class MappedFile;

/// Where one tensor's bytes are, as declared by a file header.
struct SafeTensorInfo {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t dataBegin = 0; ///< relative to the data section
  uint64_t dataEnd = 0;
};

/// The safetensors dtype name ("BF16", "F32", ...) of a scalar type; throws
/// FormatError for types safetensors cannot store.
std::string safeTensorsDtypeName(torch::ScalarType dtype);

/// One mapped .safetensors file, validated when opened.
class SafeTensorsFile {
public:
  /// Throws IoError (unreadable) or FormatError (malformed: the message names
  /// the file and, where one is at fault, the tensor).
  static SafeTensorsFile open(const std::string &path);

  const std::string &path() const;
  /// Sorted by name.
  const std::vector<SafeTensorInfo> &tensors() const { return tensors_; }
  const SafeTensorInfo *find(std::string_view name) const;
  const std::map<std::string, std::string> &metadata() const {
    return metadata_;
  }

  /// A CPU tensor on the mapped bytes; it keeps the mapping alive. Writes to it
  /// are private to this process (copy-on-write) and never reach the file.
  /// Tensors whose bytes are not aligned to their element size are copied.
  /// Throws FormatError if the file has no such tensor.
  torch::Tensor tensor(std::string_view name) const;

private:
  std::shared_ptr<const MappedFile> file_;
  uint64_t dataStart_ = 0;
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A checkpoint: one .safetensors file, or shards listed by an index.
class SafeTensorsCheckpoint {
public:
  /// `path` is a .safetensors file, a *.safetensors.index.json, or a
  /// directory holding model.safetensors or model.safetensors.index.json
  /// (both at once is an error: which one is current is unclear). Every shard
  /// is opened and checked against the index: a missing shard, a tensor the
  /// index names but its shard lacks, a shard tensor the index does not list
  /// or lists under another shard are FormatErrors.
  static SafeTensorsCheckpoint open(const std::string &path);

  /// The index or file the checkpoint was opened from.
  const std::string &source() const { return source_; }
  std::vector<std::string> names() const;
  bool contains(std::string_view name) const;
  const SafeTensorInfo &info(std::string_view name) const;
  /// See SafeTensorsFile::tensor. Throws FormatError naming the checkpoint if
  /// there is no such tensor.
  torch::Tensor tensor(std::string_view name) const;
  /// The file holding `name`.
  const SafeTensorsFile &fileOf(std::string_view name) const;
  /// Index "metadata" (values kept as JSON text), or the single file's
  /// __metadata__.
  const std::map<std::string, std::string> &metadata() const {
    return metadata_;
  }

private:
  std::string source_;
  std::vector<SafeTensorsFile> files_;
  std::map<std::string, size_t, std::less<>> fileOfTensor_;
  std::map<std::string, std::string> metadata_;
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// Writes one .safetensors file atomically. Tensors may live on any device
/// and need not be contiguous; names must be unique and non-empty.
void saveSafeTensors(const std::string &path, const NamedTensors &tensors,
                     const std::map<std::string, std::string> &metadata = {});

/// Writes a checkpoint into `directory` (created if missing), splitting it
/// into shards of at most `maxShardBytes` of tensor data (a larger tensor gets
/// a shard of its own): one shard is written as model.safetensors, several as
/// model-0000i-of-0000n.safetensors plus model.safetensors.index.json, which
/// is written last. Every file is written atomically; a stale model.safetensors
/// or index from an earlier save of the other kind is removed afterwards, so
/// the directory never holds both. Returns the files written, index last.
std::vector<std::string>
saveSafeTensorsCheckpoint(const std::string &directory,
                          const NamedTensors &tensors, uint64_t maxShardBytes,
                          const std::map<std::string, std::string> &metadata = {});

} // namespace dflex::runtime
