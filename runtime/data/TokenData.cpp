#include "dflex/runtime/data/TokenData.h"

#include "dflex/Support/JsonObject.h"
#include "dflex/Support/Crc32c.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/support/FileIo.h"
#include "dflex/runtime/support/Random.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

namespace dflex::runtime {

namespace fs = std::filesystem;


namespace {

constexpr char kShardMagic[8] = {'D', 'F', 'L', 'X', 'T', 'O', 'K', '1'};
constexpr uint32_t kShardVersion = 1;
constexpr uint64_t kShardHeaderBytes = 64;
constexpr uint64_t kTableEntryBytes = 16;
constexpr const char *kIndexName = "dataset.json";
constexpr const char *kFormatName = "dflex-tokens";

void putU32(uint8_t *out, uint32_t value) {
  for (int i = 0; i < 4; ++i)
    out[i] = uint8_t(value >> (8 * i));
}
void putU64(uint8_t *out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out[i] = uint8_t(value >> (8 * i));
}
uint32_t getU32(const uint8_t *in) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i)
    value = (value << 8) | in[i];
  return value;
}
uint64_t getU64(const uint8_t *in) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i)
    value = (value << 8) | in[i];
  return value;
}

uint32_t sampleChecksum(const int32_t *tokens, const uint8_t *mask,
                        uint32_t length) {
  uint32_t crc = crc32c(tokens, size_t(length) * sizeof(int32_t));
  return crc32c(mask, length, crc);
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

std::string shardFileName(size_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "shard-%05zu.bin", index);
  return name;
}

} // namespace

void validateSample(const TokenSample &sample, int64_t vocabSize,
                    const std::string &origin) {
  if (sample.tokens.empty())
    throw FormatError(origin + ": sample has no tokens");
  if (sample.tokens.size() != sample.lossMask.size())
    throw FormatError(origin + ": " + std::to_string(sample.tokens.size()) +
                      " token ids but " + std::to_string(sample.lossMask.size()) +
                      " loss-mask entries");
  if (sample.tokens.size() > UINT32_MAX)
    throw FormatError(origin + ": sample longer than 2^32-1 tokens");
  for (size_t i = 0; i < sample.tokens.size(); ++i) {
    int32_t id = sample.tokens[i];
    if (id < 0 || id >= vocabSize)
      throw FormatError(origin + ": token id " + std::to_string(id) +
                        " at position " + std::to_string(i) +
                        " is outside the vocabulary [0, " +
                        std::to_string(vocabSize) + ")");
    if (sample.lossMask[i] > 1)
      throw FormatError(origin + ": loss-mask entry " +
                        std::to_string(sample.lossMask[i]) + " at position " +
                        std::to_string(i) + " is neither 0 nor 1");
  }
}

//===----------------------------------------------------------------------===//
// JSONL
//===----------------------------------------------------------------------===//

void sampleFromJson(const JsonValue &line, int64_t vocabSize,
                    const std::string &origin, TokenSample &sample) {
  JsonObject object(line, origin);
  std::vector<int64_t> ids = object.integers("input_ids");
  const JsonValue *mask = line.find("loss_mask");
  if (!mask || !mask->isArray())
    object.fail("loss_mask", "expected an array of 0/1 or booleans");
  sample.tokens.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocabSize)
      throw FormatError(origin + ": token id " + std::to_string(ids[i]) +
                        " at position " + std::to_string(i) +
                        " is outside the vocabulary [0, " +
                        std::to_string(vocabSize) + ")");
    sample.tokens[i] = int32_t(ids[i]);
  }
  sample.lossMask.clear();
  for (const JsonValue &entry : mask->asArray()) {
    if (entry.isBool())
      sample.lossMask.push_back(entry.asBool());
    else if (entry.isInteger() && (entry.asInteger() == 0 || entry.asInteger() == 1))
      sample.lossMask.push_back(uint8_t(entry.asInteger()));
    else
      object.fail("loss_mask", "entry " + std::to_string(sample.lossMask.size()) +
                                   " is neither 0/1 nor a boolean");
  }
}

void parseJsonlSample(std::string_view line, int64_t vocabSize,
                      const std::string &origin, TokenSample &sample) {
  sampleFromJson(parseJsonText(line, origin), vocabSize, origin, sample);
}

JsonlSampleReader::JsonlSampleReader(std::string path, int64_t vocabSize, uint64_t startPosition)
    : path_(std::move(path)), vocabSize_(vocabSize), in_(path_) {
  if (!in_)
    throw IoError("cannot open '" + path_ + "': " + std::strerror(errno));
  TokenSample skipped;
  while (samplesRead_ < startPosition)
    if (!next(skipped))
      throw FormatError(path_ + ": has " + std::to_string(samplesRead_) +
                        " samples, fewer than the start position " + std::to_string(startPosition));
}

std::string JsonlSampleReader::origin() const {
  return path_ + ":" + std::to_string(line_);
}

bool JsonlSampleReader::next(TokenSample &sample) {
  std::string text;
  while (std::getline(in_, text)) {
    ++line_;
    if (text.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    std::string where = origin();
    parseJsonlSample(text, vocabSize_, where, sample);
    ++samplesRead_;
    validateSample(sample, vocabSize_,
                   where + " (sample " + std::to_string(samplesRead_ - 1) + ")");
    return true;
  }
  if (in_.bad())
    throw IoError("cannot read '" + path_ + "' after line " + std::to_string(line_));
  return false;
}

//===----------------------------------------------------------------------===//
// Writing shards
//===----------------------------------------------------------------------===//

TokenDatasetWriter::TokenDatasetWriter(std::string directory, int64_t vocabSize,
                                       uint64_t shardTokens)
    : directory_(std::move(directory)), vocabSize_(vocabSize),
      shardTokens_(shardTokens) {
  if (vocabSize <= 0 || vocabSize > INT32_MAX)
    throw FormatError("vocabulary size " + std::to_string(vocabSize) +
                      " is not in [1, 2^31)");
  if (shardTokens == 0)
    throw FormatError("shard size must be at least one token");
  std::error_code error;
  createdDirectory_ = fs::create_directories(directory_, error);
  if (error)
    throw IoError("cannot create directory '" + directory_ + "': " + error.message());
  fs::path index = fs::path(directory_) / kIndexName;
  fs::remove(index, error);
  if (error)
    throw IoError("cannot remove the old '" + index.string() + "': " + error.message());
  info_.vocabSize = vocabSize;
}

void TokenDatasetWriter::abandon() noexcept {
  if (finished_)
    return;
  std::error_code ignored;
  for (const TokenShardInfo &shard : info_.shards)
    fs::remove(fs::path(directory_) / shard.file, ignored);
  if (createdDirectory_ && fs::is_empty(directory_, ignored))
    fs::remove(directory_, ignored);
  info_.shards.clear();
  info_.numSamples = info_.numTokens = 0;
  firstToken_.clear();
  lengths_.clear();
  checksums_.clear();
  tokens_.clear();
  mask_.clear();
  finished_ = true;
}

void TokenDatasetWriter::add(const TokenSample &sample, const std::string &origin) {
  if (finished_)
    throw FormatError("TokenDatasetWriter::add after finish");
  validateSample(sample, vocabSize_, origin);
  if (!tokens_.empty() && tokens_.size() + sample.tokens.size() > shardTokens_)
    flushShard();
  uint32_t length = uint32_t(sample.tokens.size());
  firstToken_.push_back(tokens_.size());
  lengths_.push_back(length);
  checksums_.push_back(sampleChecksum(sample.tokens.data(), sample.lossMask.data(), length));
  tokens_.insert(tokens_.end(), sample.tokens.begin(), sample.tokens.end());
  mask_.insert(mask_.end(), sample.lossMask.begin(), sample.lossMask.end());
}

void TokenDatasetWriter::flushShard() {
  uint64_t numSamples = lengths_.size(), numTokens = tokens_.size();
  std::vector<uint8_t> table(numSamples * kTableEntryBytes);
  for (uint64_t i = 0; i < numSamples; ++i) {
    uint8_t *entry = table.data() + i * kTableEntryBytes;
    putU64(entry, firstToken_[i]);
    putU32(entry + 8, lengths_[i]);
    putU32(entry + 12, checksums_[i]);
  }
  uint8_t header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, sizeof(kShardMagic));
  putU32(header + 8, kShardVersion);
  putU32(header + 12, uint32_t(kShardHeaderBytes));
  putU64(header + 16, numSamples);
  putU64(header + 24, numTokens);
  putU64(header + 32, uint64_t(vocabSize_));
  putU32(header + 40, crc32c(table.data(), table.size()));
  putU32(header + 60, crc32c(header, 60));

  TokenShardInfo shard;
  shard.file = shardFileName(info_.shards.size());
  AtomicFileWriter out((fs::path(directory_) / shard.file).string());
  out.write(header, sizeof(header));
  out.write(table.data(), table.size());
  // Token ids are stored little-endian, as they are in memory here.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
  out.write(tokens_.data(), tokens_.size() * sizeof(int32_t));
  out.write(mask_.data(), mask_.size());
  shard.bytes = out.bytesWritten();
  out.commit();

  shard.numSamples = numSamples;
  shard.numTokens = numTokens;
  info_.numSamples += numSamples;
  info_.numTokens += numTokens;
  info_.shards.push_back(shard);
  firstToken_.clear();
  lengths_.clear();
  checksums_.clear();
  tokens_.clear();
  mask_.clear();
}

TokenDatasetInfo TokenDatasetWriter::finish() {
  if (finished_)
    return info_;
  if (!lengths_.empty())
    flushShard();
  finished_ = true;
  JsonValue index = JsonValue::object();
  index["format"] = kFormatName;
  index["version"] = int64_t(kShardVersion);
  index["vocab_size"] = info_.vocabSize;
  index["num_samples"] = info_.numSamples;
  index["num_tokens"] = info_.numTokens;
  index["shards"] = JsonValue::array();
  for (const TokenShardInfo &shard : info_.shards) {
    JsonValue entry = JsonValue::object();
    entry["file"] = shard.file;
    entry["num_samples"] = shard.numSamples;
    entry["num_tokens"] = shard.numTokens;
    entry["bytes"] = shard.bytes;
    index["shards"].push(std::move(entry));
  }
  AtomicFileWriter out((fs::path(directory_) / kIndexName).string());
  out.write(writeJson(index, 2));
  out.commit();
  return info_;
}

//===----------------------------------------------------------------------===//
// Reading shards
//===----------------------------------------------------------------------===//

TokenShard::TokenShard(const std::string &path, const TokenShardInfo &expected,
                       int64_t vocabSize, uint64_t firstDatasetIndex)
    : firstDatasetIndex_(firstDatasetIndex) {
  file_ = MappedFile::open(path);
  const uint8_t *data = file_->data();
  auto fail = [&](const std::string &problem) {
    throw FormatError(path + ": " + problem);
  };
  if (file_->size() < kShardHeaderBytes)
    fail("truncated: " + std::to_string(file_->size()) +
         " bytes is shorter than the shard header");
  if (std::memcmp(data, kShardMagic, sizeof(kShardMagic)) != 0)
    fail("not a dflex token shard (bad magic)");
  if (uint32_t stored = getU32(data + 60), computed = crc32c(data, 60);
      stored != computed)
    fail("header checksum mismatch (stored " + hex32(stored) + ", computed " +
         hex32(computed) + "): the shard is corrupted");
  if (uint32_t version = getU32(data + 8); version != kShardVersion)
    fail("unsupported shard version " + std::to_string(version));
  numSamples_ = getU64(data + 16);
  uint64_t numTokens = getU64(data + 24);
  if (int64_t(getU64(data + 32)) != vocabSize)
    fail("written for vocabulary size " + std::to_string(getU64(data + 32)) +
         " but the index says " + std::to_string(vocabSize));
  if (numSamples_ != expected.numSamples || numTokens != expected.numTokens)
    fail("holds " + std::to_string(numSamples_) + " samples / " +
         std::to_string(numTokens) + " tokens but the index says " +
         std::to_string(expected.numSamples) + " / " +
         std::to_string(expected.numTokens));
  uint64_t tableBytes = numSamples_ * kTableEntryBytes;
  uint64_t size = kShardHeaderBytes + tableBytes + numTokens * 5;
  if (file_->size() != size)
    fail("is " + std::to_string(file_->size()) + " bytes but its header needs " +
         std::to_string(size) + (file_->size() < size ? ": truncated" : ""));
  table_ = data + kShardHeaderBytes;
  if (uint32_t stored = getU32(data + 40), computed = crc32c(table_, tableBytes);
      stored != computed)
    fail("sample table checksum mismatch (stored " + hex32(stored) +
         ", computed " + hex32(computed) + "): the shard is corrupted");
  tokens_ = reinterpret_cast<const int32_t *>(table_ + tableBytes);
  mask_ = reinterpret_cast<const uint8_t *>(tokens_ + numTokens);
  // Samples are stored back to back in table order.
  uint64_t next = 0;
  for (uint64_t i = 0; i < numSamples_; ++i) {
    const uint8_t *entry = table_ + i * kTableEntryBytes;
    if (getU64(entry) != next || getU32(entry + 8) == 0)
      fail("sample table entry " + std::to_string(i) + " is inconsistent");
    next += getU32(entry + 8);
  }
  if (next != numTokens)
    fail("sample lengths add up to " + std::to_string(next) + " tokens, not " +
         std::to_string(numTokens));
}

std::string TokenShard::describe(uint64_t index) const {
  return file_->path() + " sample " + std::to_string(index) + " (dataset sample " +
         std::to_string(firstDatasetIndex_ + index) + ")";
}

TokenSampleView TokenShard::sample(uint64_t index) const {
  if (index >= numSamples_)
    throw FormatError(file_->path() + ": no sample " + std::to_string(index) +
                      " (holds " + std::to_string(numSamples_) + ")");
  const uint8_t *entry = table_ + index * kTableEntryBytes;
  TokenSampleView view;
  uint64_t first = getU64(entry);
  view.length = getU32(entry + 8);
  view.tokens = tokens_ + first;
  view.lossMask = mask_ + first;
  uint32_t stored = getU32(entry + 12);
  uint32_t computed = sampleChecksum(view.tokens, view.lossMask, view.length);
  if (stored != computed)
    throw FormatError(describe(index) + ": checksum mismatch (stored " +
                      hex32(stored) + ", computed " + hex32(computed) +
                      "): the shard is corrupted");
  return view;
}

TokenDataset TokenDataset::open(const std::string &directory) {
  TokenDataset dataset;
  dataset.directory_ = directory;
  std::string indexPath = (fs::path(directory) / kIndexName).string();
  if (!fs::exists(indexPath))
    throw FormatError(directory + ": no " + kIndexName +
                      " (not a token dataset, or its conversion did not finish)");
  JsonValue root = readJsonFile(indexPath);
  JsonObject index(root, indexPath);
  if (index.string("format") != kFormatName)
    index.fail("format", "expected \"" + std::string(kFormatName) + "\"");
  if (index.integer("version") != kShardVersion)
    index.fail("version", "unsupported version " +
                              std::to_string(index.integer("version")));
  TokenDatasetInfo &info = dataset.info_;
  info.vocabSize = index.integer("vocab_size");
  const JsonValue &shards = *root.find("shards");
  if (!shards.isArray())
    index.fail("shards", "expected an array");
  for (const JsonValue &entry : shards.asArray()) {
    JsonObject fields(entry, indexPath + ": shards[" +
                                 std::to_string(info.shards.size()) + "]");
    TokenShardInfo shard;
    shard.file = fields.string("file");
    if (shard.file.find('/') != std::string::npos)
      fields.fail("file", "must be a file name in the dataset directory");
    shard.numSamples = uint64_t(fields.integer("num_samples"));
    shard.numTokens = uint64_t(fields.integer("num_tokens"));
    shard.bytes = uint64_t(fields.integer("bytes"));
    fs::path path = fs::path(directory) / shard.file;
    std::error_code error;
    uint64_t actual = fs::file_size(path, error);
    if (error)
      throw FormatError(indexPath + ": shard " + shard.file + ": " + error.message());
    if (actual != shard.bytes)
      throw FormatError(path.string() + ": " + std::to_string(actual) +
                        " bytes but the index says " + std::to_string(shard.bytes) +
                        (actual < shard.bytes ? ": truncated" : ""));
    dataset.firstSample_.push_back(info.numSamples);
    info.numSamples += shard.numSamples;
    info.numTokens += shard.numTokens;
    info.shards.push_back(shard);
  }
  if (info.numSamples != uint64_t(index.integer("num_samples")) ||
      info.numTokens != uint64_t(index.integer("num_tokens")))
    index.fail("num_samples", "totals disagree with the shards");
  return dataset;
}

TokenShard TokenDataset::openShard(size_t index) const {
  return TokenShard((fs::path(directory_) / info_.shards.at(index).file).string(),
                    info_.shards[index], info_.vocabSize, firstSample_[index]);
}

//===----------------------------------------------------------------------===//
// Streaming reader
//===----------------------------------------------------------------------===//

TokenDatasetReader::TokenDatasetReader(TokenDataset dataset,
                                       TokenDatasetReaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  if (options_.worldSize < 1 || options_.rank < 0 || options_.rank >= options_.worldSize)
    throw FormatError("reader rank " + std::to_string(options_.rank) +
                      " is outside world size " + std::to_string(options_.worldSize));
  shardOrder_.resize(dataset_.info().shards.size());
  std::iota(shardOrder_.begin(), shardOrder_.end(), size_t(0));
  if (options_.shuffle) {
    SplitMix64 random(mixSeed(options_.seed, options_.epoch));
    random.shuffle(shardOrder_);
  }
  // Skip whole shards before the start position without opening them, then
  // land on this rank's first position at or after it.
  position_ = options_.startPosition;
  uint64_t remainder = position_ % uint64_t(options_.worldSize);
  position_ += (uint64_t(options_.rank) + options_.worldSize - remainder) %
               uint64_t(options_.worldSize);
  shardStartPosition_ = 0;
  shardOrderIndex_ = 0;
  while (shardOrderIndex_ < shardOrder_.size() &&
         shardStartPosition_ +
                 dataset_.info().shards[shardOrder_[shardOrderIndex_]].numSamples <=
             position_) {
    shardStartPosition_ +=
        dataset_.info().shards[shardOrder_[shardOrderIndex_]].numSamples;
    ++shardOrderIndex_;
  }
}

void TokenDatasetReader::enterShard(size_t orderIndex) {
  currentShard_ = shardOrder_[orderIndex];
  loadedOrderIndex_ = orderIndex;
  shard_.reset(); // one shard mapped at a time
  shard_ = std::make_unique<TokenShard>(dataset_.openShard(currentShard_));
  sampleOrder_.resize(shard_->numSamples());
  std::iota(sampleOrder_.begin(), sampleOrder_.end(), uint64_t(0));
  if (options_.shuffle) {
    SplitMix64 random(mixSeed(options_.seed, options_.epoch, currentShard_ + 1));
    random.shuffle(sampleOrder_);
  }
}

bool TokenDatasetReader::next(TokenSample &sample) {
  const TokenDatasetInfo &info = dataset_.info();
  while (shardOrderIndex_ < shardOrder_.size()) {
    uint64_t shardSamples = info.shards[shardOrder_[shardOrderIndex_]].numSamples;
    if (position_ >= shardStartPosition_ + shardSamples) {
      shardStartPosition_ += shardSamples;
      ++shardOrderIndex_;
      continue;
    }
    if (!shard_ || loadedOrderIndex_ != shardOrderIndex_)
      enterShard(shardOrderIndex_);
    lastInShard_ = sampleOrder_[position_ - shardStartPosition_];
    TokenSampleView view = shard_->sample(lastInShard_);
    sample.tokens.assign(view.tokens, view.tokens + view.length);
    sample.lossMask.assign(view.lossMask, view.lossMask + view.length);
    lastDatasetIndex_ = dataset_.firstSampleOf(currentShard_) + lastInShard_;
    position_ += uint64_t(options_.worldSize);
    return true;
  }
  return false;
}

std::string TokenDatasetReader::origin() const {
  return shard_ ? shard_->describe(lastInShard_) : dataset_.directory();
}

} // namespace dflex::runtime
