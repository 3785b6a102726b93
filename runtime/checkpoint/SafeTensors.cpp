#include "dflex/runtime/checkpoint/SafeTensors.h"

#include "dflex/Support/JsonObject.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/support/FileIo.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>

namespace dflex::runtime {

namespace fs = std::filesystem;


namespace {

// Larger headers are refused before parsing (the reference implementation
// uses the same bound); real checkpoints need a few hundred KiB.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr const char *kSingleFileName = "model.safetensors";
constexpr const char *kIndexFileName = "model.safetensors.index.json";

struct DtypeName {
  const char *name;
  torch::ScalarType dtype;
};

constexpr DtypeName kDtypes[] = {
    {"BOOL", torch::kBool},     {"U8", torch::kByte},
    {"I8", torch::kChar},       {"I16", torch::kShort},
    {"I32", torch::kInt},       {"I64", torch::kLong},
    {"F16", torch::kHalf},      {"BF16", torch::kBFloat16},
    {"F32", torch::kFloat},     {"F64", torch::kDouble},
    {"F8_E4M3", torch::kFloat8_e4m3fn},
    {"F8_E5M2", torch::kFloat8_e5m2},
};

std::string quote(std::string_view text) { return "'" + std::string(text) + "'"; }

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

uint64_t readLittleEndian64(const uint8_t *bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i)
    value = (value << 8) | bytes[i];
  return value;
}

SafeTensorInfo parseTensorEntry(const std::string &name, const JsonValue &entry,
                                const std::string &path,
                                uint64_t dataBytes) {
  JsonObject fields(entry, path + ": tensor " + quote(name));
  SafeTensorInfo info;
  info.name = name;
  const std::string &dtypeName = fields.string("dtype");
  auto dtype = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                            [&](const DtypeName &d) { return dtypeName == d.name; });
  if (dtype == std::end(kDtypes))
    fields.fail("dtype", "unsupported dtype " + quote(dtypeName));
  info.dtype = dtype->dtype;

  // Byte size computed with overflow checks: a hostile shape must not wrap.
  uint64_t bytes = torch::elementSize(info.dtype);
  for (int64_t extent : fields.integers("shape")) {
    if (extent < 0)
      fields.fail("shape", "negative extent " + std::to_string(extent));
    if (extent != 0 &&
        bytes > std::numeric_limits<uint64_t>::max() / uint64_t(extent))
      fields.fail("shape", "byte size overflows");
    bytes *= uint64_t(extent);
    info.shape.push_back(extent);
  }
  std::vector<int64_t> offsets = fields.integers("data_offsets");
  if (offsets.size() != 2)
    fields.fail("data_offsets", "expected [begin, end]");
  if (offsets[0] < 0 || offsets[1] < offsets[0])
    fields.fail("data_offsets", "invalid range [" + std::to_string(offsets[0]) +
                                    ", " + std::to_string(offsets[1]) + "]");
  info.dataBegin = uint64_t(offsets[0]);
  info.dataEnd = uint64_t(offsets[1]);
  if (info.dataEnd > dataBytes)
    throw FormatError(path + ": tensor " + quote(name) + ": data_offsets [" +
                      std::to_string(info.dataBegin) + ", " +
                      std::to_string(info.dataEnd) +
                      "] run past the end of the data section (" +
                      std::to_string(dataBytes) +
                      " bytes): the file is truncated or the header is wrong");
  if (info.dataEnd - info.dataBegin != bytes)
    throw FormatError(path + ": tensor " + quote(name) + ": dtype " +
                      dtypeName + " and shape " + shapeText(info.shape) +
                      " need " + std::to_string(bytes) +
                      " bytes but data_offsets [" +
                      std::to_string(info.dataBegin) + ", " +
                      std::to_string(info.dataEnd) + "] hold " +
                      std::to_string(info.dataEnd - info.dataBegin));
  return info;
}

} // namespace

std::string safeTensorsDtypeName(torch::ScalarType dtype) {
  for (const DtypeName &d : kDtypes)
    if (d.dtype == dtype)
      return d.name;
  throw FormatError(std::string("safetensors cannot store dtype ") +
                    c10::toString(dtype));
}

//===----------------------------------------------------------------------===//
// SafeTensorsFile
//===----------------------------------------------------------------------===//

SafeTensorsFile SafeTensorsFile::open(const std::string &path) {
  SafeTensorsFile result;
  result.file_ = MappedFile::open(path);
  const MappedFile &file = *result.file_;
  if (file.size() < 8)
    throw FormatError(path + ": " + std::to_string(file.size()) +
                      " bytes is too short for a safetensors header length");
  uint64_t headerBytes = readLittleEndian64(file.data());
  if (headerBytes > kMaxHeaderBytes)
    throw FormatError(path + ": header length " + std::to_string(headerBytes) +
                      " exceeds the " + std::to_string(kMaxHeaderBytes) +
                      "-byte limit (not a safetensors file?)");
  if (headerBytes > file.size() - 8)
    throw FormatError(path + ": header length " + std::to_string(headerBytes) +
                      " runs past the end of the file (" +
                      std::to_string(file.size()) + " bytes): truncated");
  result.dataStart_ = 8 + headerBytes;
  uint64_t dataBytes = file.size() - result.dataStart_;

  JsonValue header =
      parseJsonText(file.bytes(8, headerBytes), path + " (header)");
  JsonObject entries(header, path + " (header)");
  for (const auto &[name, entry] : entries.members()) {
    if (name == "__metadata__") {
      JsonObject metadata(entry, path + ": __metadata__");
      for (const auto &[key, value] : metadata.members())
        result.metadata_[key] = metadata.string(key);
      continue;
    }
    result.tensors_.push_back(parseTensorEntry(name, entry, path, dataBytes));
  }

  // The tensors must tile the data section: no overlap, no gap, nothing after.
  std::vector<const SafeTensorInfo *> byOffset;
  for (const SafeTensorInfo &info : result.tensors_)
    byOffset.push_back(&info);
  std::sort(byOffset.begin(), byOffset.end(),
            [](const SafeTensorInfo *a, const SafeTensorInfo *b) {
              return std::tie(a->dataBegin, a->dataEnd) <
                     std::tie(b->dataBegin, b->dataEnd);
            });
  uint64_t covered = 0;
  const SafeTensorInfo *previous = nullptr;
  for (const SafeTensorInfo *info : byOffset) {
    if (info->dataBegin < covered)
      throw FormatError(path + ": tensor " + quote(info->name) +
                        " overlaps tensor " + quote(previous->name) +
                        " (data_offsets start at " +
                        std::to_string(info->dataBegin) + ", before " +
                        std::to_string(covered) + ")");
    if (info->dataBegin > covered)
      throw FormatError(path + ": " +
                        std::to_string(info->dataBegin - covered) +
                        " bytes before tensor " + quote(info->name) +
                        " belong to no tensor (data_offsets leave a gap at " +
                        std::to_string(covered) + ")");
    covered = info->dataEnd;
    previous = info;
  }
  if (covered != dataBytes)
    throw FormatError(path + ": " + std::to_string(dataBytes - covered) +
                      " bytes after the last tensor belong to no tensor "
                      "(data section is " +
                      std::to_string(dataBytes) + " bytes, tensors end at " +
                      std::to_string(covered) + ")");
  return result;
}

const std::string &SafeTensorsFile::path() const { return file_->path(); }

const SafeTensorInfo *SafeTensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const SafeTensorInfo &info, std::string_view key) { return info.name < key; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

torch::Tensor SafeTensorsFile::tensor(std::string_view name) const {
  const SafeTensorInfo *info = find(name);
  if (!info)
    throw FormatError(path() + ": no tensor " + quote(name));
  auto options = torch::TensorOptions().dtype(info->dtype).device(torch::kCPU);
  uint8_t *data =
      const_cast<uint8_t *>(file_->data()) + dataStart_ + info->dataBegin;
  std::shared_ptr<const MappedFile> keepAlive = file_;
  torch::Tensor view = torch::from_blob(
      data, info->shape, [keepAlive](void *) {}, options);
  if (reinterpret_cast<uintptr_t>(data) % torch::elementSize(info->dtype) != 0)
    return view.clone();
  return view;
}

//===----------------------------------------------------------------------===//
// SafeTensorsCheckpoint
//===----------------------------------------------------------------------===//

SafeTensorsCheckpoint SafeTensorsCheckpoint::open(const std::string &path) {
  SafeTensorsCheckpoint checkpoint;
  std::string indexPath;
  if (fs::is_directory(path)) {
    fs::path single = fs::path(path) / kSingleFileName;
    fs::path index = fs::path(path) / kIndexFileName;
    bool hasSingle = fs::exists(single), hasIndex = fs::exists(index);
    if (hasSingle && hasIndex)
      throw FormatError(path + ": holds both " + kSingleFileName + " and " +
                        kIndexFileName + "; remove the stale one");
    if (!hasSingle && !hasIndex)
      throw FormatError(path + ": holds neither " +
                        std::string(kSingleFileName) + " nor " +
                        kIndexFileName);
    if (hasSingle)
      checkpoint.source_ = single.string();
    else
      indexPath = index.string();
  } else if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    indexPath = path;
  } else {
    checkpoint.source_ = path;
  }

  if (indexPath.empty()) {
    checkpoint.files_.push_back(SafeTensorsFile::open(checkpoint.source_));
    checkpoint.metadata_ = checkpoint.files_.front().metadata();
    for (const SafeTensorInfo &info : checkpoint.files_.front().tensors())
      checkpoint.fileOfTensor_.emplace(info.name, 0);
    return checkpoint;
  }

  checkpoint.source_ = indexPath;
  JsonValue indexJson = readJsonFile(indexPath);
  JsonObject index(indexJson, indexPath);
  if (std::optional<JsonObject> metadata = index.optionalObject("metadata"))
    for (const auto &[key, value] : metadata->members())
      checkpoint.metadata_[key] =
          value.isString() ? value.asString() : writeJson(value, 0);
  JsonObject weightMap = index.object("weight_map");
  fs::path directory = fs::path(indexPath).parent_path();

  std::map<std::string, size_t> shardNumber;
  for (const auto &[tensorName, shardValue] : weightMap.members()) {
    const std::string &shard = weightMap.string(tensorName);
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." ||
        shard == "..")
      weightMap.fail(tensorName, "shard " + quote(shard) +
                                     " is not a file name in the index's directory");
    auto [it, inserted] = shardNumber.emplace(shard, checkpoint.files_.size());
    if (inserted) {
      fs::path shardPath = directory / shard;
      if (!fs::exists(shardPath))
        throw FormatError(indexPath + ": tensor " + quote(tensorName) +
                          " is in shard " + quote(shard) +
                          ", which does not exist (" + shardPath.string() + ")");
      checkpoint.files_.push_back(SafeTensorsFile::open(shardPath.string()));
    }
    const SafeTensorsFile &file = checkpoint.files_[it->second];
    if (!file.find(tensorName))
      throw FormatError(indexPath + ": tensor " + quote(tensorName) +
                        " is listed in shard " + quote(shard) +
                        " but that file has no such tensor");
    checkpoint.fileOfTensor_.emplace(tensorName, it->second);
  }
  for (const SafeTensorsFile &file : checkpoint.files_)
    for (const SafeTensorInfo &info : file.tensors()) {
      auto it = checkpoint.fileOfTensor_.find(info.name);
      if (it == checkpoint.fileOfTensor_.end())
        throw FormatError(indexPath + ": shard " + quote(file.path()) +
                          " holds tensor " + quote(info.name) +
                          ", which the index does not list");
      if (&checkpoint.files_[it->second] != &file)
        throw FormatError(indexPath + ": tensor " + quote(info.name) +
                          " is in both " + quote(file.path()) + " and " +
                          quote(checkpoint.files_[it->second].path()));
    }
  return checkpoint;
}

std::vector<std::string> SafeTensorsCheckpoint::names() const {
  std::vector<std::string> names;
  for (const auto &[name, file] : fileOfTensor_)
    names.push_back(name);
  return names;
}

bool SafeTensorsCheckpoint::contains(std::string_view name) const {
  return fileOfTensor_.find(name) != fileOfTensor_.end();
}

const SafeTensorsFile &SafeTensorsCheckpoint::fileOf(std::string_view name) const {
  auto it = fileOfTensor_.find(name);
  if (it == fileOfTensor_.end())
    throw FormatError(source_ + ": no tensor " + quote(name));
  return files_[it->second];
}

const SafeTensorInfo &SafeTensorsCheckpoint::info(std::string_view name) const {
  return *fileOf(name).find(name);
}

torch::Tensor SafeTensorsCheckpoint::tensor(std::string_view name) const {
  return fileOf(name).tensor(name);
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

namespace {

struct PreparedTensor {
  std::string name;
  torch::Tensor data; // CPU, contiguous
  uint64_t bytes = 0;
};

std::vector<PreparedTensor> prepare(const NamedTensors &tensors) {
  std::set<std::string> seen;
  std::vector<PreparedTensor> prepared;
  for (const auto &[name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw FormatError("cannot save a tensor named " + quote(name));
    if (!seen.insert(name).second)
      throw FormatError("cannot save two tensors named " + quote(name));
    if (!tensor.defined())
      throw FormatError("cannot save tensor " + quote(name) + ": undefined");
    safeTensorsDtypeName(tensor.scalar_type()); // throws if unsupported
    PreparedTensor entry;
    entry.name = name;
    entry.bytes = uint64_t(tensor.numel()) * tensor.element_size();
    entry.data = tensor; // materialised on CPU only when written
    prepared.push_back(std::move(entry));
  }
  return prepared;
}

// Larger elements first keeps every offset aligned to its element size.
void sortForAlignment(std::vector<PreparedTensor> &tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const PreparedTensor &a, const PreparedTensor &b) {
              size_t ea = a.data.element_size(), eb = b.data.element_size();
              return ea != eb ? ea > eb : a.name < b.name;
            });
}

// Writes `tensors` in the given order (see sortForAlignment).
void writeFile(const std::string &path, const std::vector<PreparedTensor> &tensors,
               const std::map<std::string, std::string> &metadata) {
  JsonValue header = JsonValue::object();
  if (!metadata.empty()) {
    JsonValue &meta = header["__metadata__"];
    meta = JsonValue::object();
    for (const auto &[key, value] : metadata)
      meta[key] = value;
  }
  uint64_t offset = 0;
  for (const PreparedTensor &tensor : tensors) {
    JsonValue entry = JsonValue::object();
    entry["dtype"] = safeTensorsDtypeName(tensor.data.scalar_type());
    JsonValue shape = JsonValue::array();
    for (int64_t extent : tensor.data.sizes())
      shape.push(extent);
    entry["shape"] = std::move(shape);
    JsonValue offsets = JsonValue::array();
    offsets.push(offset);
    offsets.push(offset + tensor.bytes);
    entry["data_offsets"] = std::move(offsets);
    header[tensor.name] = std::move(entry);
    offset += tensor.bytes;
  }
  std::string headerText = writeJson(header, 0);
  // Spaces pad the header so that the data section starts 8-byte aligned.
  headerText.append((8 - headerText.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = uint8_t(uint64_t(headerText.size()) >> (8 * i));

  AtomicFileWriter out(path);
  out.write(length, sizeof(length));
  out.write(headerText);
  for (const PreparedTensor &tensor : tensors) {
    torch::Tensor cpu = tensor.data.detach().to(torch::kCPU).contiguous();
    out.write(cpu.data_ptr(), tensor.bytes);
  }
  out.commit();
}

void removeIfExists(const fs::path &path) {
  std::error_code error;
  fs::remove(path, error);
  if (error)
    throw IoError("cannot remove stale '" + path.string() +
                  "': " + error.message());
}

} // namespace

void saveSafeTensors(const std::string &path, const NamedTensors &tensors,
                     const std::map<std::string, std::string> &metadata) {
  std::vector<PreparedTensor> prepared = prepare(tensors);
  sortForAlignment(prepared);
  writeFile(path, prepared, metadata);
}

std::vector<std::string>
saveSafeTensorsCheckpoint(const std::string &directory,
                          const NamedTensors &tensors, uint64_t maxShardBytes,
                          const std::map<std::string, std::string> &metadata) {
  if (maxShardBytes == 0)
    throw FormatError("saveSafeTensorsCheckpoint: maxShardBytes must be > 0");
  std::error_code error;
  fs::create_directories(directory, error);
  if (error)
    throw IoError("cannot create directory '" + directory +
                  "': " + error.message());

  // Shards follow the caller's order, so related tensors stay together.
  std::vector<std::vector<PreparedTensor>> shards(1);
  uint64_t shardBytes = 0;
  for (PreparedTensor &tensor : prepare(tensors)) {
    if (!shards.back().empty() && shardBytes + tensor.bytes > maxShardBytes) {
      shards.emplace_back();
      shardBytes = 0;
    }
    shardBytes += tensor.bytes;
    shards.back().push_back(std::move(tensor));
  }
  fs::path dir(directory);
  std::vector<std::string> written;
  if (shards.size() == 1) {
    sortForAlignment(shards.front());
    written.push_back((dir / kSingleFileName).string());
    writeFile(written.back(), shards.front(), metadata);
    removeIfExists(dir / kIndexFileName);
    return written;
  }

  JsonValue index = JsonValue::object();
  JsonValue &weightMap = index["weight_map"];
  weightMap = JsonValue::object();
  uint64_t totalBytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1,
                  shards.size());
    sortForAlignment(shards[i]);
    for (const PreparedTensor &tensor : shards[i]) {
      weightMap[tensor.name] = std::string(name);
      totalBytes += tensor.bytes;
    }
    written.push_back((dir / name).string());
    writeFile(written.back(), shards[i], metadata);
  }
  index["metadata"]["total_size"] = totalBytes;
  AtomicFileWriter indexFile((dir / kIndexFileName).string());
  indexFile.write(writeJson(index, 2));
  indexFile.commit();
  written.push_back((dir / kIndexFileName).string());
  removeIfExists(dir / kSingleFileName);
  return written;
}

} // namespace dflex::runtime
