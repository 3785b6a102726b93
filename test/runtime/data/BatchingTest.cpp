#include "TestSupport.h"

#include "dflex/runtime/data/Batching.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/support/Random.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using namespace dflex::runtime::test;

namespace {

class VectorSource : public SampleSource {
public:
  explicit VectorSource(std::vector<TokenSample> samples, size_t start = 0)
      : samples_(std::move(samples)), next_(start) {}
  bool next(TokenSample &sample) override {
    if (next_ == samples_.size())
      return false;
    sample = samples_[next_++];
    return true;
  }
  std::string origin() const override { return "vector sample " + std::to_string(next_ - 1); }
  uint64_t datasetIndex() const override { return next_ - 1; }
  uint64_t position() const override { return next_; }

private:
  std::vector<TokenSample> samples_;
  size_t next_ = 0;
};

TokenSample sampleOf(std::vector<int32_t> tokens, std::vector<uint8_t> mask) {
  return TokenSample{std::move(tokens), std::move(mask)};
}

std::vector<TokenSample> randomSamples(size_t count, uint64_t seed, size_t maxLength) {
  SplitMix64 random(seed);
  std::vector<TokenSample> samples(count);
  for (TokenSample &sample : samples) {
    size_t length = 1 + random.below(maxLength);
    for (size_t i = 0; i < length; ++i) {
      sample.tokens.push_back(int32_t(random.below(500)));
      sample.lossMask.push_back(random.below(3) != 0);
    }
    sample.lossMask[random.below(length)] = 1; // every sample trains on something
  }
  return samples;
}

std::vector<PackedRow> packAll(const std::vector<TokenSample> &samples, PackingOptions options,
                               PackingStats *stats = nullptr) {
  VectorSource source(samples);
  Packer packer(source, options);
  std::vector<PackedRow> rows;
  PackedRow row;
  while (packer.next(row))
    rows.push_back(row);
  if (stats)
    *stats = packer.stats();
  return rows;
}

// The definition of an eligible anchor, checked position by position.
std::vector<int32_t> eligibleByDefinition(const PackedRow &row, int64_t blockSize) {
  std::vector<int32_t> out;
  for (int32_t a = 0; a < row.numTokens; ++a) {
    int32_t end = row.documentStarts[row.documentIds[a] + 1];
    bool hasLabel = false;
    for (int64_t k = 1; k < blockSize; ++k)
      hasLabel |= a + k < end && row.lossMask[a + k];
    if (row.lossMask[a] && hasLabel)
      out.push_back(a);
  }
  return out;
}

} // namespace

TEST(Packing, GreedyRowsRecordDocuments) {
  std::vector<TokenSample> samples = {
      sampleOf({1, 2, 3, 4, 5}, {0, 1, 1, 1, 1}),
      sampleOf({6, 7, 8}, {1, 1, 0}),
      sampleOf({9, 10, 11, 12, 13, 14}, {0, 0, 1, 1, 1, 1}),
  };
  PackingOptions options;
  options.tokenBudget = 10;
  options.padTokenId = 99;
  options.lookahead = 1;
  PackingStats stats;
  std::vector<PackedRow> rows = packAll(samples, options, &stats);
  ASSERT_EQ(rows.size(), 2u);
  const PackedRow &first = rows[0];
  EXPECT_EQ(first.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 99, 99}));
  EXPECT_EQ(first.lossMask, (std::vector<uint8_t>{0, 1, 1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(first.positionIds, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 0, 0}));
  EXPECT_EQ(first.documentIds, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1, -1, -1}));
  EXPECT_EQ(first.documentStarts, (std::vector<int32_t>{0, 5, 8}));
  EXPECT_EQ(first.sampleIndices, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(first.numTokens, 8);
  EXPECT_EQ(rows[1].documentStarts, (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(rows[1].sampleIndices, (std::vector<uint64_t>{2}));
  EXPECT_EQ(stats.rows, 2u);
  EXPECT_EQ(stats.realTokens, 14u);
  EXPECT_EQ(stats.paddingTokens, 6u);
}

TEST(Packing, LookaheadFillsRowsBetterAndKeepsEverySampleOnce) {
  std::vector<TokenSample> samples = randomSamples(400, 7, 300);
  PackingOptions options;
  options.tokenBudget = 512;
  options.lookahead = 1;
  std::vector<PackedRow> greedy = packAll(samples, options);
  options.lookahead = 64;
  PackingStats stats;
  std::vector<PackedRow> packed = packAll(samples, options, &stats);
  EXPECT_LT(packed.size(), greedy.size());
  RecordProperty("greedy_rows", int(greedy.size()));
  RecordProperty("lookahead_rows", int(packed.size()));
  EXPECT_GT(double(stats.realTokens) / double(stats.realTokens + stats.paddingTokens), 0.95);

  std::multiset<uint64_t> seen;
  for (const PackedRow &row : packed) {
    ASSERT_EQ(row.tokens.size(), 512u);
    for (size_t d = 0; d < row.sampleIndices.size(); ++d) {
      const TokenSample &sample = samples[row.sampleIndices[d]];
      int32_t begin = row.documentStarts[d], end = row.documentStarts[d + 1];
      ASSERT_EQ(size_t(end - begin), sample.tokens.size());
      for (int32_t t = begin; t < end; ++t) {
        EXPECT_EQ(row.tokens[t], sample.tokens[t - begin]);
        EXPECT_EQ(row.lossMask[t], sample.lossMask[t - begin]);
        EXPECT_EQ(row.documentIds[t], int32_t(d));
        EXPECT_EQ(row.positionIds[t], t - begin);
      }
      seen.insert(row.sampleIndices[d]);
    }
  }
  ASSERT_EQ(seen.size(), samples.size());
  for (uint64_t i = 0; i < samples.size(); ++i)
    EXPECT_EQ(seen.count(i), 1u) << i;
}

TEST(Packing, APackerResumedFromItsPendingSamplesMakesTheSameRows) {
  const std::vector<TokenSample> samples = randomSamples(300, 8, 300);
  PackingOptions options;
  options.tokenBudget = 512;
  options.lookahead = 16;
  const std::vector<PackedRow> whole = packAll(samples, options);

  VectorSource first(samples);
  Packer interrupted(first, options);
  PackedRow row;
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(interrupted.next(row));
  ASSERT_EQ(interrupted.pending().size(), options.lookahead);
  VectorSource rest(samples, first.position());
  Packer resumed(rest, options, interrupted.pending());
  size_t index = 20;
  while (resumed.next(row)) {
    ASSERT_LT(index, whole.size());
    EXPECT_EQ(row.tokens, whole[index].tokens) << "row " << index;
    EXPECT_EQ(row.sampleIndices, whole[index].sampleIndices) << "row " << index;
    ++index;
  }
  EXPECT_EQ(index, whole.size());
}

TEST(Packing, LongSamplesAreCutAndSamplesWithoutLossDropped) {
  std::vector<TokenSample> samples = {
      sampleOf({1, 2, 3}, {0, 0, 0}),
      sampleOf({1, 2, 3, 4, 5, 6, 7}, {1, 1, 1, 1, 1, 1, 1}),
      sampleOf({8, 9}, {1, 1}),
  };
  PackingOptions options;
  options.tokenBudget = 4;
  PackingStats stats;
  std::vector<PackedRow> rows = packAll(samples, options, &stats);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(rows[1].sampleIndices, (std::vector<uint64_t>{2}));
  EXPECT_EQ(stats.truncated, 1u);
  EXPECT_EQ(stats.droppedWithoutLoss, 1u);

  options.truncateLongSamples = false;
  expectError<FormatError>([&] { packAll(samples, options); },
                           {"vector sample 1", "7 tokens exceed the packing budget of 4"});
}

TEST(Anchors, EligiblePositionsFollowTheDefinition) {
  // Two documents; block size 4.
  PackingOptions options;
  options.tokenBudget = 12;
  std::vector<PackedRow> rows = packAll({sampleOf({1, 2, 3, 4, 5, 6}, {1, 1, 0, 0, 0, 1}),
                                         sampleOf({7, 8, 9, 10}, {1, 0, 0, 1})},
                                        options);
  ASSERT_EQ(rows.size(), 1u);
  // 0: next loss at 1. 1: next loss at 5 (k = 4, too far). 5: end of document.
  // 6: next loss at 9 (k = 3). 9: end of document.
  EXPECT_EQ(eligibleAnchors(rows[0], 4), (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(eligibleAnchors(rows[0], 5), (std::vector<int32_t>{0, 1, 6}));

  for (const PackedRow &row : packAll(randomSamples(60, 11, 90), {256, 0, 8, true}))
    for (int64_t blockSize : {2, 4, 16})
      EXPECT_EQ(eligibleAnchors(row, blockSize), eligibleByDefinition(row, blockSize));
}

TEST(Anchors, SampledAnchorsAreASortedUniformSubset) {
  std::vector<PackedRow> rows = packAll(randomSamples(30, 3, 200), {1024, 0, 8, true});
  const PackedRow &row = rows.front();
  std::vector<int32_t> eligible = eligibleAnchors(row, 16);
  ASSERT_GT(eligible.size(), 100u);
  BlockOptions options;
  options.maxAnchors = 32;
  std::map<int32_t, int> hits;
  const int draws = 4000;
  for (int seed = 0; seed < draws; ++seed) {
    std::vector<int32_t> anchors = sampleAnchors(row, options, uint64_t(seed));
    ASSERT_EQ(anchors.size(), 32u);
    ASSERT_TRUE(std::is_sorted(anchors.begin(), anchors.end()));
    ASSERT_EQ(std::set<int32_t>(anchors.begin(), anchors.end()).size(), anchors.size());
    for (int32_t a : anchors) {
      ASSERT_TRUE(std::binary_search(eligible.begin(), eligible.end(), a));
      ++hits[a];
    }
  }
  EXPECT_EQ(sampleAnchors(row, options, 5), sampleAnchors(row, options, 5));
  EXPECT_NE(sampleAnchors(row, options, 5), sampleAnchors(row, options, 6));
  // Each eligible position is drawn with probability 32 / |eligible|.
  double expected = draws * 32.0 / double(eligible.size());
  for (int32_t a : eligible)
    EXPECT_NEAR(hits[a], expected, 6 * std::sqrt(expected)) << a;

  options.maxAnchors = int64_t(eligible.size()) + 10;
  EXPECT_EQ(sampleAnchors(row, options, 1), eligible);
}

TEST(Blocks, BatchHoldsBlocksLabelsAndWeights) {
  std::vector<TokenSample> samples = randomSamples(40, 5, 120);
  std::vector<PackedRow> rows = packAll(samples, {256, 0, 16, true});
  rows.resize(3);
  rows[2] = packAll({sampleOf({4, 5, 6}, {1, 1, 0})}, {256, 0, 1, true}).front(); // one anchor
  BlockOptions options;
  options.blockSize = 16;
  options.maxAnchors = 20;
  options.maskTokenId = 777;
  TrainingBatch batch = makeTrainingBatch(rows, options, 123);

  const int64_t B = 3, T = 256, K = 16;
  const int64_t N = batch.anchors.size(1);
  EXPECT_EQ(N, 20);
  EXPECT_EQ(batch.tokens.sizes(), (std::vector<int64_t>{B, T}));
  EXPECT_EQ(batch.blockTokens.sizes(), (std::vector<int64_t>{B, N, K}));
  EXPECT_EQ(batch.weights.scalar_type(), torch::kFloat);

  for (int64_t r = 0; r < B; ++r) {
    const PackedRow &row = rows[r];
    std::vector<int32_t> anchors =
        sampleAnchors(row, options, dflex::runtime::mixSeed(123, uint64_t(r)));
    for (int64_t i = 0; i < N; ++i) {
      bool valid = i < int64_t(anchors.size());
      ASSERT_EQ(batch.blockValid[r][i].item<bool>(), valid);
      if (!valid) {
        EXPECT_EQ(batch.weights[r][i].sum().item<float>(), 0.0f);
        EXPECT_EQ(batch.contextStart[r][i].item<int32_t>(),
                  batch.anchors[r][i].item<int64_t>());
        EXPECT_TRUE((batch.blockTokens[r][i] == 777).all().item<bool>());
        continue;
      }
      int32_t a = anchors[i];
      int32_t doc = row.documentIds[a];
      int32_t begin = row.documentStarts[doc], end = row.documentStarts[doc + 1];
      EXPECT_EQ(batch.anchors[r][i].item<int64_t>(), a);
      EXPECT_EQ(batch.contextStart[r][i].item<int32_t>(), begin);
      EXPECT_EQ(batch.blockTokens[r][i][0].item<int64_t>(), row.tokens[a]);
      for (int64_t k = 0; k < K; ++k) {
        if (k > 0)
          EXPECT_EQ(batch.blockTokens[r][i][k].item<int64_t>(), 777);
        EXPECT_EQ(batch.blockPositionIds[r][i][k].item<int64_t>(), row.positionIds[a] + k);
        bool trained = k >= 1 && a + k < end && row.lossMask[a + k];
        float weight = trained ? float(std::exp(-double(k - 1) / 7.0)) : 0.0f;
        EXPECT_FLOAT_EQ(batch.weights[r][i][k].item<float>(), weight);
        EXPECT_EQ(batch.labels[r][i][k].item<int64_t>(), trained ? row.tokens[a + k] : -1);
      }
    }
  }
  EXPECT_EQ(batch.blockValid[2].sum().item<int64_t>(), 1);

  // Segments: every document, plus each row's padding tail, cover B*T tokens.
  std::vector<int32_t> expected;
  int64_t longest = 0;
  for (int64_t r = 0; r < B; ++r) {
    for (size_t d = 0; d + 1 < rows[r].documentStarts.size(); ++d) {
      expected.push_back(int32_t(r * T) + rows[r].documentStarts[d]);
      longest = std::max<int64_t>(longest, rows[r].documentStarts[d + 1] -
                                               rows[r].documentStarts[d]);
    }
    if (rows[r].numTokens < T) {
      expected.push_back(int32_t(r * T) + rows[r].numTokens);
      longest = std::max<int64_t>(longest, T - rows[r].numTokens);
    }
  }
  expected.push_back(int32_t(B * T));
  torch::Tensor cu = batch.cuSeqlens;
  EXPECT_EQ(std::vector<int32_t>(cu.data_ptr<int32_t>(), cu.data_ptr<int32_t>() + cu.numel()),
            expected);
  EXPECT_EQ(batch.maxSeqlen, longest);
  EXPECT_TRUE(torch::equal(batch.documentIds[2].slice(0, 3), torch::full({T - 3}, -1, torch::kInt)));
}

TEST(Blocks, BadOptionsAndRowsAreErrors) {
  std::vector<PackedRow> rows = packAll({sampleOf({1, 2, 3}, {1, 1, 1})}, {8, 0, 1, true});
  BlockOptions options;
  options.blockSize = 1;
  expectError<FormatError>([&] { makeTrainingBatch(rows, options, 0); }, {"block size"});
  options = BlockOptions();
  options.gamma = 0;
  expectError<FormatError>([&] { makeTrainingBatch(rows, options, 0); }, {"gamma"});
  options = BlockOptions();
  rows.push_back(packAll({sampleOf({1, 2, 3}, {1, 1, 1})}, {16, 0, 1, true}).front());
  expectError<FormatError>([&] { makeTrainingBatch(rows, options, 0); },
                           {"row 1 has 16 tokens but row 0 has 8"});
}
