// Tokenized training samples (token ids + loss mask) and the two formats they
// are stored in: JSONL, and sharded binary files with an index and checksums
// (docs/data.md). Reading streams: a dataset of any size is read one sample
// at a time, with one shard mapped at a time.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dflex {
class JsonValue;
} // namespace dflex

namespace dflex::runtime {

class MappedFile;

struct TokenSample {
  std::vector<int32_t> tokens;
  /// 1 where the token is a training target (e.g. assistant text), else 0.
  std::vector<uint8_t> lossMask;
};

/// Throws FormatError "<origin>: ..." unless the sample is non-empty, its mask
/// has one 0/1 entry per token and every id is in [0, vocabSize).
void validateSample(const TokenSample &sample, int64_t vocabSize,
                    const std::string &origin);

/// Reads one JSONL sample, {"input_ids": [ints], "loss_mask": [0/1 or
/// booleans]}, from a parsed line (other keys are ignored) into `sample`.
/// Throws FormatError "<origin>: ..." for a missing or mistyped key, an id
/// outside [0, vocabSize) or a mask entry that is not 0/1; the lengths are
/// not compared (validateSample does that).
void sampleFromJson(const JsonValue &line, int64_t vocabSize,
                    const std::string &origin, TokenSample &sample);
/// The same from the line's text (errors in the JSON itself name
/// "<origin>:<line>:<column>").
void parseJsonlSample(std::string_view line, int64_t vocabSize,
                      const std::string &origin, TokenSample &sample);

/// A stream of samples.
class SampleSource {
public:
  virtual ~SampleSource() = default;
  /// Replaces `sample` with the next one; false at the end. Bad samples throw
  /// FormatError naming the sample.
  virtual bool next(TokenSample &sample) = 0;
  /// Where the sample last returned came from ("data.jsonl:17",
  /// "dir/shard-00002.bin sample 40 (dataset sample 1234)").
  virtual std::string origin() const = 0;
  /// Its index in the whole dataset (file order, before any shuffling).
  virtual uint64_t datasetIndex() const = 0;
  /// Samples of the epoch's order before the next one (a reader opened at
  /// this position continues here).
  virtual uint64_t position() const = 0;
};

/// JSONL: one object per line, {"input_ids": [ints], "loss_mask": [0/1 or
/// booleans]}; other keys are ignored, blank lines skipped. The order is the
/// file's; `startPosition` samples are read and passed over first.
class JsonlSampleReader : public SampleSource {
public:
  JsonlSampleReader(std::string path, int64_t vocabSize, uint64_t startPosition = 0);
  bool next(TokenSample &sample) override;
  std::string origin() const override;
  uint64_t datasetIndex() const override { return samplesRead_ - 1; }
  uint64_t position() const override { return samplesRead_; }

private:
  std::string path_;
  int64_t vocabSize_;
  std::ifstream in_;
  uint64_t line_ = 0;
  uint64_t samplesRead_ = 0;
};

//===----------------------------------------------------------------------===//
// Binary sharded datasets
//===----------------------------------------------------------------------===//

struct TokenShardInfo {
  std::string file; ///< name inside the dataset directory
  uint64_t numSamples = 0;
  uint64_t numTokens = 0;
  uint64_t bytes = 0;
};

/// The index, dataset.json.
struct TokenDatasetInfo {
  int64_t vocabSize = 0;
  uint64_t numSamples = 0;
  uint64_t numTokens = 0;
  std::vector<TokenShardInfo> shards;
};

/// Writes a dataset directory. Samples are validated as they are added; a
/// shard is written (atomically) when it reaches shardTokens tokens, and
/// finish() writes the last one, then dataset.json (atomically, last, so a
/// directory without an index is an interrupted conversion). A dataset.json
/// already in the directory is removed when the writer is created: the
/// shards it names are about to be overwritten.
class TokenDatasetWriter {
public:
  TokenDatasetWriter(std::string directory, int64_t vocabSize,
                     uint64_t shardTokens = 16u << 20);
  /// `origin` names the sample in errors ("input.jsonl:17").
  void add(const TokenSample &sample, const std::string &origin);
  TokenDatasetInfo finish();
  /// Gives up before finish(): removes the shards written so far, and the
  /// directory if the writer created it and nothing else is in it; add() then
  /// throws and finish() writes nothing. Does nothing after finish().
  void abandon() noexcept;

private:
  void flushShard();

  std::string directory_;
  int64_t vocabSize_;
  uint64_t shardTokens_;
  TokenDatasetInfo info_;
  // The shard being filled.
  std::vector<uint64_t> firstToken_;
  std::vector<uint32_t> lengths_;
  std::vector<uint32_t> checksums_;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> mask_;
  bool finished_ = false;
  bool createdDirectory_ = false;
};

/// A view of one sample inside a mapped shard.
struct TokenSampleView {
  const int32_t *tokens = nullptr;
  const uint8_t *lossMask = nullptr;
  uint32_t length = 0;
};

/// One mapped shard, its header and table verified on open.
class TokenShard {
public:
  /// `firstDatasetIndex` is the dataset index of its sample 0 (for errors).
  TokenShard(const std::string &path, const TokenShardInfo &expected,
             int64_t vocabSize, uint64_t firstDatasetIndex);
  uint64_t numSamples() const { return numSamples_; }
  /// The sample's bytes after checking its checksum (FormatError naming shard
  /// and sample on mismatch). Valid while the shard lives.
  TokenSampleView sample(uint64_t index) const;
  std::string describe(uint64_t index) const;

private:
  std::shared_ptr<const MappedFile> file_;
  uint64_t numSamples_ = 0;
  uint64_t firstDatasetIndex_ = 0;
  const uint8_t *table_ = nullptr;
  const int32_t *tokens_ = nullptr;
  const uint8_t *mask_ = nullptr;
};

/// An opened dataset directory.
class TokenDataset {
public:
  /// Reads dataset.json and checks that every shard exists with the size the
  /// index records (a truncated shard is named here).
  static TokenDataset open(const std::string &directory);
  const std::string &directory() const { return directory_; }
  const TokenDatasetInfo &info() const { return info_; }
  /// Maps shard `index` and verifies its header and sample table.
  TokenShard openShard(size_t index) const;
  /// Dataset index of the first sample of each shard.
  uint64_t firstSampleOf(size_t shard) const { return firstSample_[shard]; }

private:
  std::string directory_;
  TokenDatasetInfo info_;
  std::vector<uint64_t> firstSample_;
};

struct TokenDatasetReaderOptions {
  /// Shuffle the shard order and the sample order inside each shard, by a
  /// permutation that depends only on (seed, epoch).
  bool shuffle = false;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  /// Data parallelism: this reader returns every worldSize-th sample of the
  /// epoch's order, starting at `rank`, so the ranks partition the epoch.
  int rank = 0;
  int worldSize = 1;
  /// Position in the epoch's order (counted over all ranks) to resume from.
  uint64_t startPosition = 0;
};

/// Streams a dataset in (shuffled) epoch order, one shard mapped at a time;
/// each sample's checksum is verified as it is read.
class TokenDatasetReader : public SampleSource {
public:
  TokenDatasetReader(TokenDataset dataset, TokenDatasetReaderOptions options = {});
  bool next(TokenSample &sample) override;
  std::string origin() const override;
  uint64_t datasetIndex() const override { return lastDatasetIndex_; }
  /// Counted over all ranks: this rank's next sample is at or after it.
  uint64_t position() const override { return position_; }

private:
  void enterShard(size_t orderIndex);

  TokenDataset dataset_;
  TokenDatasetReaderOptions options_;
  std::vector<size_t> shardOrder_;
  size_t shardOrderIndex_ = 0;
  std::unique_ptr<TokenShard> shard_; // the shard last read from
  size_t loadedOrderIndex_ = 0;
  std::vector<uint64_t> sampleOrder_; // inside the current shard
  uint64_t shardStartPosition_ = 0;   // epoch position of its first sample
  uint64_t position_ = 0;
  size_t currentShard_ = 0;
  uint64_t lastInShard_ = 0;
  uint64_t lastDatasetIndex_ = 0;
};

} // namespace dflex::runtime
