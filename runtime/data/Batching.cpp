#include "dflex/runtime/data/Batching.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/support/Random.h"

#include <algorithm>
#include <cmath>

namespace dflex::runtime {

//===----------------------------------------------------------------------===//
// Packing
//===----------------------------------------------------------------------===//

Packer::Packer(SampleSource &source, PackingOptions options, std::vector<PendingSample> buffered)
    : source_(source), options_(options), pending_(std::move(buffered)) {
  if (options_.tokenBudget <= 0 || options_.tokenBudget > INT32_MAX)
    throw FormatError("packing token budget " +
                      std::to_string(options_.tokenBudget) +
                      " is not in [1, 2^31)");
  if (options_.lookahead == 0)
    throw FormatError("packing lookahead must be at least 1");
}

void Packer::refill() {
  while (pending_.size() < options_.lookahead && !sourceDone_) {
    Pending pending;
    if (!source_.next(pending.sample)) {
      sourceDone_ = true;
      break;
    }
    pending.datasetIndex = source_.datasetIndex();
    TokenSample &sample = pending.sample;
    if (std::find(sample.lossMask.begin(), sample.lossMask.end(), 1) ==
        sample.lossMask.end()) {
      ++stats_.droppedWithoutLoss;
      continue;
    }
    if (int64_t(sample.tokens.size()) > options_.tokenBudget) {
      if (!options_.truncateLongSamples)
        throw FormatError(source_.origin() + ": " +
                          std::to_string(sample.tokens.size()) +
                          " tokens exceed the packing budget of " +
                          std::to_string(options_.tokenBudget));
      sample.tokens.resize(size_t(options_.tokenBudget));
      sample.lossMask.resize(size_t(options_.tokenBudget));
      ++stats_.truncated;
    }
    pending_.push_back(std::move(pending));
  }
}

bool Packer::next(PackedRow &row) {
  refill();
  if (pending_.empty())
    return false;
  const size_t budget = size_t(options_.tokenBudget);
  row.tokens.assign(budget, options_.padTokenId);
  row.lossMask.assign(budget, 0);
  row.positionIds.assign(budget, 0);
  row.documentIds.assign(budget, -1);
  row.documentStarts.assign(1, 0);
  row.sampleIndices.clear();
  size_t used = 0;
  while (true) {
    // The longest buffered sample that still fits; the earliest among equals.
    auto best = pending_.end();
    for (auto it = pending_.begin(); it != pending_.end(); ++it)
      if (used + it->sample.tokens.size() <= budget &&
          (best == pending_.end() ||
           it->sample.tokens.size() > best->sample.tokens.size()))
        best = it;
    if (best == pending_.end())
      break;
    const TokenSample &sample = best->sample;
    int32_t document = int32_t(row.sampleIndices.size());
    for (size_t i = 0; i < sample.tokens.size(); ++i) {
      row.tokens[used + i] = sample.tokens[i];
      row.lossMask[used + i] = sample.lossMask[i];
      row.positionIds[used + i] = int32_t(i);
      row.documentIds[used + i] = document;
    }
    used += sample.tokens.size();
    row.documentStarts.push_back(int32_t(used));
    row.sampleIndices.push_back(best->datasetIndex);
    ++stats_.samples;
    pending_.erase(best);
    refill();
  }
  row.numTokens = int32_t(used);
  ++stats_.rows;
  stats_.realTokens += used;
  stats_.paddingTokens += budget - used;
  return true;
}

//===----------------------------------------------------------------------===//
// Anchors and blocks
//===----------------------------------------------------------------------===//

namespace {

void checkOptions(const BlockOptions &options) {
  if (options.blockSize < 2)
    throw FormatError("block size must be at least 2, got " +
                      std::to_string(options.blockSize));
  if (options.maxAnchors < 1)
    throw FormatError("anchors per row must be at least 1, got " +
                      std::to_string(options.maxAnchors));
  if (!(options.gamma > 0))
    throw FormatError("loss decay gamma must be positive");
}

} // namespace

std::vector<int32_t> eligibleAnchors(const PackedRow &row, int64_t blockSize) {
  std::vector<int32_t> eligible;
  for (size_t d = 0; d + 1 < row.documentStarts.size(); ++d) {
    int32_t begin = row.documentStarts[d], end = row.documentStarts[d + 1];
    // Walking backwards, `nextLoss` is the nearest loss position after a.
    int64_t nextLoss = end;
    std::vector<int32_t> documentAnchors;
    for (int32_t a = end - 1; a >= begin; --a) {
      if (row.lossMask[a] && nextLoss < end && nextLoss - a < blockSize)
        documentAnchors.push_back(a);
      if (row.lossMask[a])
        nextLoss = a;
    }
    eligible.insert(eligible.end(), documentAnchors.rbegin(), documentAnchors.rend());
  }
  return eligible;
}

std::vector<int32_t> sampleAnchors(const PackedRow &row, const BlockOptions &options,
                                   uint64_t seed) {
  checkOptions(options);
  std::vector<int32_t> eligible = eligibleAnchors(row, options.blockSize);
  size_t count = std::min(eligible.size(), size_t(options.maxAnchors));
  SplitMix64 random(seed);
  // A partial Fisher-Yates shuffle picks `count` distinct positions.
  for (size_t i = 0; i < count && count < eligible.size(); ++i)
    std::swap(eligible[i], eligible[i + random.below(eligible.size() - i)]);
  eligible.resize(count);
  std::sort(eligible.begin(), eligible.end());
  return eligible;
}

TrainingBatch makeTrainingBatch(const std::vector<PackedRow> &rows,
                                const BlockOptions &options, uint64_t seed) {
  checkOptions(options);
  if (rows.empty())
    throw FormatError("a training batch needs at least one row");
  const int64_t B = int64_t(rows.size());
  const int64_t T = int64_t(rows.front().tokens.size());
  const int64_t K = options.blockSize;
  if (B * T >= INT32_MAX)
    throw FormatError("a batch of " + std::to_string(B) + " rows of " +
                      std::to_string(T) + " tokens overflows int32 cu_seqlens");
  std::vector<std::vector<int32_t>> anchors;
  int64_t N = 1;
  for (int64_t r = 0; r < B; ++r) {
    if (int64_t(rows[r].tokens.size()) != T)
      throw FormatError("row " + std::to_string(r) + " has " +
                        std::to_string(rows[r].tokens.size()) +
                        " tokens but row 0 has " + std::to_string(T));
    anchors.push_back(sampleAnchors(rows[r], options, mixSeed(seed, uint64_t(r))));
    N = std::max<int64_t>(N, int64_t(anchors.back().size()));
  }

  TrainingBatch batch;
  auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  auto i32 = torch::TensorOptions().dtype(torch::kInt32);
  batch.tokens = torch::empty({B, T}, i64);
  batch.positionIds = torch::empty({B, T}, i64);
  batch.documentIds = torch::empty({B, T}, i32);
  batch.lossMask = torch::empty({B, T}, torch::kBool);
  batch.anchors = torch::zeros({B, N}, i64);
  batch.blockValid = torch::zeros({B, N}, torch::kBool);
  batch.contextStart = torch::zeros({B, N}, i32);
  batch.blockTokens = torch::full({B, N, K}, int64_t(options.maskTokenId), i64);
  batch.blockPositionIds = torch::zeros({B, N, K}, i64);
  batch.labels = torch::full({B, N, K}, int64_t(-1), i64);
  batch.weights = torch::zeros({B, N, K}, torch::kFloat);

  auto tokens = batch.tokens.accessor<int64_t, 2>();
  auto positions = batch.positionIds.accessor<int64_t, 2>();
  auto documents = batch.documentIds.accessor<int32_t, 2>();
  auto lossMask = batch.lossMask.accessor<bool, 2>();
  auto anchorOut = batch.anchors.accessor<int64_t, 2>();
  auto valid = batch.blockValid.accessor<bool, 2>();
  auto contextStart = batch.contextStart.accessor<int32_t, 2>();
  auto blockTokens = batch.blockTokens.accessor<int64_t, 3>();
  auto blockPositions = batch.blockPositionIds.accessor<int64_t, 3>();
  auto labels = batch.labels.accessor<int64_t, 3>();
  auto weights = batch.weights.accessor<float, 3>();

  std::vector<float> decay(size_t(K), 0.0f);
  for (int64_t k = 1; k < K; ++k)
    decay[k] = float(std::exp(-double(k - 1) / options.gamma));

  std::vector<int32_t> segmentStarts;
  for (int64_t r = 0; r < B; ++r) {
    const PackedRow &row = rows[r];
    for (int64_t t = 0; t < T; ++t) {
      tokens[r][t] = row.tokens[t];
      positions[r][t] = row.positionIds[t];
      documents[r][t] = row.documentIds[t];
      lossMask[r][t] = row.lossMask[t] != 0;
    }
    for (size_t d = 0; d + 1 < row.documentStarts.size(); ++d)
      segmentStarts.push_back(int32_t(r * T) + row.documentStarts[d]);
    if (row.numTokens < T)
      segmentStarts.push_back(int32_t(r * T) + row.numTokens);

    for (size_t i = 0; i < anchors[r].size(); ++i) {
      int32_t a = anchors[r][i];
      int32_t document = row.documentIds[a];
      int32_t documentEnd = row.documentStarts[document + 1];
      anchorOut[r][i] = a;
      valid[r][i] = true;
      contextStart[r][i] = row.documentStarts[document];
      blockTokens[r][i][0] = row.tokens[a];
      for (int64_t k = 0; k < K; ++k) {
        blockPositions[r][i][k] = row.positionIds[a] + k;
        if (k >= 1 && a + k < documentEnd && row.lossMask[a + k]) {
          labels[r][i][k] = row.tokens[a + k];
          weights[r][i][k] = decay[k];
        }
      }
    }
    batch.sampleIndices.push_back(row.sampleIndices);
  }
  segmentStarts.push_back(int32_t(B * T));
  batch.cuSeqlens = torch::tensor(segmentStarts, i32);
  for (size_t s = 0; s + 1 < segmentStarts.size(); ++s)
    batch.maxSeqlen =
        std::max<int64_t>(batch.maxSeqlen, segmentStarts[s + 1] - segmentStarts[s]);
  return batch;
}

} // namespace dflex::runtime
