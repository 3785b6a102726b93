#include "dflex/runtime/train/TrainingData.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/support/Random.h"

#include <filesystem>

namespace dflex::runtime {

TrainingData::TrainingData(const TrainConfig &config, int64_t vocabSize, int rank, int worldSize,
                           DataCursor cursor)
    : path_(config.dataset), binary_(std::filesystem::is_directory(config.dataset)),
      vocabSize_(vocabSize), seed_(uint64_t(config.seed)), rank_(rank), worldSize_(worldSize),
      epoch_(cursor.epoch), rowsInEpoch_(cursor.rowsInEpoch) {
  if (!std::filesystem::exists(path_))
    throw FormatError("config: data.path: '" + path_ + "' does not exist");
  packing_.tokenBudget = config.tokenBudget;
  source_ = openSource(epoch_, cursor.position);
  packer_ = std::make_unique<Packer>(*source_, packing_, std::move(cursor.pending));
}

TrainingData::~TrainingData() = default;
TrainingData::TrainingData(TrainingData &&) = default;
TrainingData &TrainingData::operator=(TrainingData &&) = default;

std::unique_ptr<SampleSource> TrainingData::openSource(int64_t epoch, uint64_t position) const {
  if (!binary_)
    return std::make_unique<JsonlSampleReader>(path_, vocabSize_, position);
  TokenDataset dataset = TokenDataset::open(path_);
  if (dataset.info().vocabSize > vocabSize_)
    throw FormatError(path_ + ": the dataset's vocabulary of " + std::to_string(dataset.info().vocabSize) +
                      " exceeds the target's " + std::to_string(vocabSize_));
  TokenDatasetReaderOptions options;
  options.shuffle = true;
  options.seed = seed_;
  options.epoch = uint64_t(epoch);
  options.startPosition = position;
  return std::make_unique<TokenDatasetReader>(std::move(dataset), options);
}

PackedRow TrainingData::next() {
  PackedRow mine;
  for (int r = 0; r < worldSize_; ++r) {
    PackedRow row = nextOfAll();
    if (r == rank_) {
      mine = std::move(row);
      rowKey_ = mixSeed(uint64_t(epoch_), rowsInEpoch_);
    }
  }
  return mine;
}

PackedRow TrainingData::nextOfAll() {
  PackedRow row;
  while (!packer_->next(row)) {
    if (rowsInEpoch_ == 0)
      throw FormatError(path_ + ": epoch " + std::to_string(epoch_) +
                        " has no sample with a loss-mask position");
    ++epoch_;
    rowsInEpoch_ = 0;
    packer_.reset();
    source_ = openSource(epoch_, 0);
    packer_ = std::make_unique<Packer>(*source_, packing_);
  }
  ++rowsInEpoch_;
  return row;
}

DataCursor TrainingData::cursor() const {
  return DataCursor{epoch_, source_->position(), packer_->pending(), rowsInEpoch_};
}

uint64_t TrainingData::countEpochRows() const {
  const std::unique_ptr<SampleSource> source = openSource(0, 0);
  Packer packer(*source, packing_);
  PackedRow row;
  uint64_t rows = 0;
  while (packer.next(row))
    ++rows;
  return rows;
}

} // namespace dflex::runtime
