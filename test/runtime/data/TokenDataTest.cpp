#include "TestSupport.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/support/Random.h"
#include "dflex/runtime/data/TokenData.h"

#include <algorithm>
#include <fstream>
#include <set>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using namespace dflex::runtime::test;

namespace {

constexpr int64_t kVocab = 1000;

std::vector<TokenSample> randomSamples(size_t count, uint64_t seed, size_t maxLength = 40) {
  SplitMix64 random(seed);
  std::vector<TokenSample> samples(count);
  for (TokenSample &sample : samples) {
    size_t length = 1 + random.below(maxLength);
    for (size_t i = 0; i < length; ++i) {
      sample.tokens.push_back(int32_t(random.below(kVocab)));
      sample.lossMask.push_back(uint8_t(random.below(2)));
    }
  }
  return samples;
}

void writeDataset(const std::string &directory, const std::vector<TokenSample> &samples,
                  uint64_t shardTokens) {
  TokenDatasetWriter writer(directory, kVocab, shardTokens);
  for (size_t i = 0; i < samples.size(); ++i)
    writer.add(samples[i], "sample " + std::to_string(i));
  writer.finish();
}

std::vector<TokenSample> readAll(SampleSource &source, std::vector<uint64_t> *indices = nullptr) {
  std::vector<TokenSample> out;
  TokenSample sample;
  while (source.next(sample)) {
    out.push_back(sample);
    if (indices)
      indices->push_back(source.datasetIndex());
  }
  return out;
}

bool same(const TokenSample &a, const TokenSample &b) {
  return a.tokens == b.tokens && a.lossMask == b.lossMask;
}

std::string jsonl(const TokenSample &sample, const std::string &separator = ",") {
  std::string line = "{\"input_ids\": [";
  for (size_t i = 0; i < sample.tokens.size(); ++i)
    line += (i ? separator : "") + std::to_string(sample.tokens[i]);
  line += "], \"loss_mask\": [";
  for (size_t i = 0; i < sample.lossMask.size(); ++i)
    line += (i ? separator : "") + std::to_string(int(sample.lossMask[i]));
  return line + "]}\n";
}

void flipByte(const std::string &path, size_t offset) {
  std::string bytes = readBytes(path);
  bytes[offset] = char(bytes[offset] ^ 0x40);
  writeBytes(path, bytes);
}

uint64_t residentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoull(line.substr(6)) * 1024;
  return 0;
}

} // namespace

TEST(TokenData, ReadsJsonl) {
  TempDir dir;
  std::string path = dir.file("a.jsonl");
  writeBytes(path, "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1], \"source\": \"x\"}\n"
                   "\n"
                   "{\"input_ids\": [7], \"loss_mask\": [true]}\n");
  JsonlSampleReader reader(path, kVocab);
  std::vector<uint64_t> indices;
  std::vector<TokenSample> samples = readAll(reader, &indices);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(samples[0].lossMask, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(samples[1].lossMask, (std::vector<uint8_t>{1}));
  EXPECT_EQ(indices, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(reader.origin(), path + ":3");

  JsonlSampleReader resumed(path, kVocab, 1);
  EXPECT_EQ(resumed.position(), 1u);
  indices.clear();
  samples = readAll(resumed, &indices);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].tokens, (std::vector<int32_t>{7}));
  EXPECT_EQ(indices, (std::vector<uint64_t>{1}));
  EXPECT_THROW(JsonlSampleReader(path, kVocab, 3), dflex::FormatError);
}

TEST(TokenData, BadJsonlSamplesAreNamed) {
  TempDir dir;
  std::string path = dir.file("bad.jsonl");
  auto check = [&](const std::string &secondLine, std::initializer_list<std::string> fragments) {
    writeBytes(path, "{\"input_ids\": [1], \"loss_mask\": [1]}\n" + secondLine + "\n");
    expectError<FormatError>(
        [&] {
          JsonlSampleReader reader(path, kVocab);
          readAll(reader);
        },
        fragments);
  };
  check(R"({"input_ids": [1, 1000], "loss_mask": [1, 1]})",
        {path + ":2", "token id 1000 at position 1", "outside the vocabulary [0, 1000)"});
  check(R"({"input_ids": [1, 2, 3], "loss_mask": [1, 1]})",
        {path + ":2", "sample 1", "3 token ids but 2 loss-mask entries"});
  check(R"({"input_ids": [1, 2], "loss_mask": [1, 2]})", {path + ":2", "loss_mask", "entry 1"});
  check(R"({"input_ids": [-4], "loss_mask": [1]})", {path + ":2", "token id -4"});
  check(R"({"input_ids": [], "loss_mask": []})", {path + ":2", "no tokens"});
  check(R"({"loss_mask": [1]})", {path + ":2", "input_ids: missing"});
  check(R"({"input_ids": [1], "loss_mask": [1])", {path + ":2:"});
}

TEST(TokenData, ShardsRoundTripInOrder) {
  TempDir dir;
  std::vector<TokenSample> samples = randomSamples(500, 1);
  writeDataset(dir.path().string(), samples, 1000);
  TokenDataset dataset = TokenDataset::open(dir.path().string());
  EXPECT_GT(dataset.info().shards.size(), 5u);
  EXPECT_EQ(dataset.info().numSamples, 500u);
  TokenDatasetReader reader(dataset);
  std::vector<uint64_t> indices;
  std::vector<TokenSample> read = readAll(reader, &indices);
  ASSERT_EQ(read.size(), samples.size());
  for (size_t i = 0; i < read.size(); ++i) {
    EXPECT_TRUE(same(read[i], samples[i])) << i;
    EXPECT_EQ(indices[i], i);
  }
  EXPECT_NE(reader.origin().find("sample"), std::string::npos);
}

TEST(TokenData, ShuffledEpochsArePermutationsAndRanksPartitionThem) {
  TempDir dir;
  std::vector<TokenSample> samples = randomSamples(300, 2);
  writeDataset(dir.path().string(), samples, 700);
  TokenDataset dataset = TokenDataset::open(dir.path().string());
  auto order = [&](uint64_t epoch, int rank, int world, uint64_t start = 0) {
    TokenDatasetReaderOptions options;
    options.shuffle = true;
    options.seed = 42;
    options.epoch = epoch;
    options.rank = rank;
    options.worldSize = world;
    options.startPosition = start;
    TokenDatasetReader reader(dataset, options);
    std::vector<uint64_t> indices;
    std::vector<TokenSample> read = readAll(reader, &indices);
    for (size_t i = 0; i < read.size(); ++i)
      EXPECT_TRUE(same(read[i], samples[indices[i]]));
    return indices;
  };
  std::vector<uint64_t> epoch0 = order(0, 0, 1);
  std::vector<uint64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    ASSERT_EQ(sorted[i], i);
  EXPECT_FALSE(std::is_sorted(epoch0.begin(), epoch0.end()));
  EXPECT_EQ(order(0, 0, 1), epoch0);
  EXPECT_NE(order(1, 0, 1), epoch0);

  // Three ranks take every third sample of the same epoch order.
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<uint64_t> mine = order(0, rank, 3);
    ASSERT_EQ(mine.size(), 100u);
    for (size_t i = 0; i < mine.size(); ++i)
      EXPECT_EQ(mine[i], epoch0[3 * i + rank]);
  }
  // Resuming at a position continues the same order.
  std::vector<uint64_t> resumed = order(0, 1, 3, 151);
  ASSERT_FALSE(resumed.empty());
  EXPECT_EQ(resumed.front(), epoch0[151]); // 151 is rank 1's (151 % 3 == 1)
  EXPECT_EQ(resumed.back(), epoch0[298]);
  std::vector<uint64_t> tail = order(0, 0, 1, 250);
  EXPECT_EQ(tail, std::vector<uint64_t>(epoch0.begin() + 250, epoch0.end()));
}

TEST(TokenData, WriterRejectsBadSamplesNamingThem) {
  TempDir dir;
  TokenDatasetWriter writer(dir.path().string(), kVocab);
  TokenSample sample{{1, 2000}, {1, 1}};
  expectError<FormatError>([&] { writer.add(sample, "input.jsonl:9"); },
                           {"input.jsonl:9", "token id 2000"});
  sample = {{1, 2}, {1}};
  expectError<FormatError>([&] { writer.add(sample, "input.jsonl:10"); },
                           {"input.jsonl:10", "2 token ids but 1 loss-mask entries"});
}

TEST(TokenData, CorruptedShardsAreNamed) {
  TempDir dir;
  std::vector<TokenSample> samples = randomSamples(50, 3);
  writeDataset(dir.path().string(), samples, 1u << 20); // one shard
  std::string shard = dir.file("shard-00000.bin");
  std::string original = readBytes(shard);
  auto readEverything = [&] {
    TokenDatasetReader reader(TokenDataset::open(dir.path().string()));
    readAll(reader);
  };

  // A token of sample 7 changes: its checksum names it.
  uint64_t tableEnd = 64 + 16 * samples.size();
  uint64_t before = 0;
  for (int i = 0; i < 7; ++i)
    before += samples[i].tokens.size();
  flipByte(shard, tableEnd + 4 * before + 1);
  expectError<FormatError>(readEverything, {shard, "sample 7 (dataset sample 7)",
                                            "checksum mismatch", "corrupted"});
  // Its loss mask changes.
  writeBytes(shard, original);
  uint64_t totalTokens = 0;
  for (const TokenSample &s : samples)
    totalTokens += s.tokens.size();
  flipByte(shard, tableEnd + 4 * totalTokens + before);
  expectError<FormatError>(readEverything, {"sample 7", "checksum mismatch"});
  // The sample table changes.
  writeBytes(shard, original);
  flipByte(shard, 64 + 16 * 3 + 8);
  expectError<FormatError>(readEverything, {shard, "sample table checksum mismatch"});
  // The header changes.
  writeBytes(shard, original);
  flipByte(shard, 20);
  expectError<FormatError>(readEverything, {shard, "header checksum mismatch"});
  // The shard is truncated: the index names it before anything is read.
  writeBytes(shard, original.substr(0, original.size() - 10));
  expectError<FormatError>([&] { TokenDataset::open(dir.path().string()); },
                           {shard, "truncated"});
  // The index is missing.
  writeBytes(shard, original);
  std::filesystem::remove(dir.file("dataset.json"));
  expectError<FormatError>([&] { TokenDataset::open(dir.path().string()); },
                           {"no dataset.json"});
}

TEST(TokenData, StreamingAMillionSamplesKeepsMemoryBounded) {
  TempDir dir;
  const uint64_t count = 1'000'000, length = 24;
  {
    TokenDatasetWriter writer(dir.path().string(), kVocab, 2u << 20);
    TokenSample sample;
    sample.tokens.resize(length);
    sample.lossMask.assign(length, 1);
    for (uint64_t i = 0; i < count; ++i) {
      for (uint64_t t = 0; t < length; ++t)
        sample.tokens[t] = int32_t((i + t) % kVocab);
      writer.add(sample, "generated");
    }
    writer.finish();
  }
  TokenDataset dataset = TokenDataset::open(dir.path().string());
  uint64_t datasetBytes = 0;
  for (const TokenShardInfo &shard : dataset.info().shards)
    datasetBytes += shard.bytes;
  ASSERT_GT(datasetBytes, 120u << 20);

  TokenDatasetReader reader(dataset);
  TokenSample sample;
  uint64_t baseline = residentBytes(), peak = baseline, read = 0;
  while (reader.next(sample)) {
    ASSERT_EQ(sample.tokens[0], int32_t(read % kVocab));
    if (++read % 50'000 == 0)
      peak = std::max(peak, residentBytes());
  }
  EXPECT_EQ(read, count);
  RecordProperty("dataset_mib", int(datasetBytes >> 20));
  RecordProperty("resident_growth_mib", int((peak - baseline) >> 20));
  // One ~11 MB shard is mapped at a time, not the whole ~136 MB.
  EXPECT_LT(peak - baseline, 40u << 20) << "resident memory grew by "
                                        << (peak - baseline) / (1 << 20) << " MiB";
}

TEST(TokenData, ConverterToolRoundTripsAndNamesBadSamples) {
  TempDir dir;
  std::vector<TokenSample> samples = randomSamples(120, 4);
  std::string input;
  for (const TokenSample &sample : samples)
    input += jsonl(sample);
  writeBytes(dir.file("in.jsonl"), input);
  std::string tool = DFLEX_DATA_TOOL;
  auto run = [](const std::string &command) {
    CommandResult result;
    FILE *pipe = popen((command + " 2>&1").c_str(), "r");
    char buffer[4096];
    size_t got;
    while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0)
      result.output.append(buffer, got);
    int status = pclose(pipe);
    result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
  };
  CommandResult convert = run(tool + " convert --vocab-size 1000 --shard-tokens 500 " +
                              dir.file("out") + " " + dir.file("in.jsonl"));
  ASSERT_EQ(convert.exitCode, 0) << convert.output;
  EXPECT_NE(convert.output.find("wrote 120 samples"), std::string::npos) << convert.output;
  CommandResult verify = run(tool + " verify " + dir.file("out"));
  EXPECT_EQ(verify.exitCode, 0) << verify.output;
  CommandResult dump = run(tool + " dump " + dir.file("out"));
  EXPECT_EQ(dump.exitCode, 0);
  std::string expected;
  for (const TokenSample &sample : samples)
    expected += jsonl(sample, ", ");
  EXPECT_TRUE(dump.output == expected) << "dump differs from the input";

  writeBytes(dir.file("bad.jsonl"), input + "{\"input_ids\": [5, 1000], \"loss_mask\": [1, 1]}\n");
  CommandResult bad = run(tool + " convert --vocab-size 1000 " + dir.file("bad-out") + " " +
                          dir.file("bad.jsonl"));
  EXPECT_EQ(bad.exitCode, 1);
  EXPECT_NE(bad.output.find(dir.file("bad.jsonl") + ":121"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("token id 1000"), std::string::npos) << bad.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad-out/dataset.json")));
  CommandResult usage = run(tool + " convert " + dir.file("x"));
  EXPECT_EQ(usage.exitCode, 2);
}
