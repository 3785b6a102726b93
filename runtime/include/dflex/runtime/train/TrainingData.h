// One rank's stream of packed rows over the epochs of a run, and where it
// stands (DataCursor), so that a resumed run reads exactly the rows the
// interrupted one would have. A binary dataset is read in a shuffled order
// that depends on (seed, epoch) only, every worldSize-th sample from `rank`;
// a JSONL file in file order, on one rank.
#pragma once

#include "dflex/runtime/data/Batching.h"
#include "dflex/runtime/train/TrainConfig.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dflex::runtime {

/// A rank's place in the data: the epoch, the source's position in it, and
/// the samples the packer had read but not yet packed.
struct DataCursor {
  int64_t epoch = 0;
  uint64_t position = 0;
  std::vector<PendingSample> pending;
  uint64_t rowsInEpoch = 0; ///< rows already taken from this epoch
};

class TrainingData {
public:
  /// Opens `config.dataset` (a directory with dataset.json, or a JSONL file)
  /// for tokens in [0, vocabSize), at `cursor`. Throws FormatError naming
  /// the file.
  TrainingData(const TrainConfig &config, int64_t vocabSize, int rank, int worldSize,
               DataCursor cursor = {});
  ~TrainingData();
  TrainingData(TrainingData &&);
  TrainingData &operator=(TrainingData &&);

  /// The next row, moving into the next epoch when this one is used up.
  /// Throws FormatError when an epoch has no row at all.
  PackedRow next();

  DataCursor cursor() const;

  /// Reads epoch 0 whole (validating every sample: vocabulary, loss mask,
  /// checksums) and returns its row count: what the schedule's length is
  /// made of, and bad data named before the first step.
  uint64_t countEpochRows() const;

  const std::string &path() const { return path_; }

private:
  std::unique_ptr<SampleSource> openSource(int64_t epoch, uint64_t position) const;

  std::string path_;
  bool binary_;
  int64_t vocabSize_;
  uint64_t seed_;
  int rank_, worldSize_;
  PackingOptions packing_;
  int64_t epoch_ = 0;
  uint64_t rowsInEpoch_ = 0;
  std::unique_ptr<SampleSource> source_;
  std::unique_ptr<Packer> packer_;
};

} // namespace dflex::runtime
