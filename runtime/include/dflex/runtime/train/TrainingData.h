// One rank's stream of packed rows over the epochs of a run, and where it
// stands (DataCursor), so that a resumed run reads exactly the rows the
// interrupted one would have. Every rank packs the same stream (a binary
// dataset in a shuffled order that depends on (seed, epoch) only, a JSONL
// file in file order) and takes row `rank` of each group of worldSize rows:
// the ranks of a data-parallel run see the rows a single rank would see in
// the same order, at every group boundary their cursors are the same, and a
// run resumed with another number of ranks continues the same row order.
#pragma once

#include "dflex/runtime/data/Batching.h"
#include "dflex/runtime/train/TrainConfig.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dflex::runtime {

/// The place in the data, the same on every rank between micro-steps: the
/// epoch, the source's position in it, and the samples the packer had read
/// but not yet packed.
struct DataCursor {
  int64_t epoch = 0;
  uint64_t position = 0;
  std::vector<PendingSample> pending;
  uint64_t rowsInEpoch = 0; ///< rows already packed in this epoch (all ranks')
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

  /// This rank's row of the next group of worldSize rows, moving into the
  /// next epoch when this one is used up. Throws FormatError when an epoch
  /// has no row at all.
  PackedRow next();
  /// Names the row next() last returned (its epoch and index in it), the
  /// same on every rank count: what its anchors are drawn from.
  uint64_t rowKey() const { return rowKey_; }

  DataCursor cursor() const;

  /// Reads epoch 0 whole (validating every sample: vocabulary, loss mask,
  /// checksums) and returns its row count (of all ranks): what the
  /// schedule's length is made of, and bad data named before the first step.
  uint64_t countEpochRows() const;

  const std::string &path() const { return path_; }

private:
  std::unique_ptr<SampleSource> openSource(int64_t epoch, uint64_t position) const;
  PackedRow nextOfAll();

  std::string path_;
  bool binary_;
  int64_t vocabSize_;
  uint64_t seed_;
  int rank_, worldSize_;
  PackingOptions packing_;
  int64_t epoch_ = 0;
  uint64_t rowsInEpoch_ = 0;
  uint64_t rowKey_ = 0;
  std::unique_ptr<SampleSource> source_;
  std::unique_ptr<Packer> packer_;
};

} // namespace dflex::runtime
