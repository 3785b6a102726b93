// dflex-data: converts tokenized JSONL to the sharded binary format and
// checks or prints such datasets (docs/data.md).
#include "dflex/Support/Error.h"
#include "dflex/runtime/data/TokenData.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

using namespace dflex::runtime;

namespace {

const char *kUsage =
    "usage:\n"
    "  dflex-data convert --vocab-size N [--shard-tokens N] OUTPUT_DIR INPUT.jsonl...\n"
    "      Validates every sample (ids in [0, N), one 0/1 loss-mask entry per id)\n"
    "      and writes shard-NNNNN.bin files plus dataset.json into OUTPUT_DIR.\n"
    "  dflex-data verify DIR\n"
    "      Reads every sample of a dataset, checking sizes and checksums.\n"
    "  dflex-data dump DIR\n"
    "      Prints the dataset as JSONL (input_ids, loss_mask) in stored order.\n";

[[noreturn]] void usage(const std::string &problem) {
  std::cerr << "dflex-data: " << problem << "\n" << kUsage;
  std::exit(2);
}

uint64_t parseCount(const std::string &option, const char *text) {
  char *end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (errno || !end || *end || value == 0 || text[0] == '-')
    usage(option + " needs a positive integer, got '" + text + "'");
  return value;
}

int convert(int argc, char **argv) {
  int64_t vocabSize = 0;
  uint64_t shardTokens = 16u << 20;
  std::vector<std::string> positional;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--vocab-size" || arg == "--shard-tokens") && i + 1 < argc) {
      uint64_t value = parseCount(arg, argv[++i]);
      if (arg == "--vocab-size")
        vocabSize = int64_t(value);
      else
        shardTokens = value;
    } else if (arg.rfind("--", 0) == 0) {
      usage("unknown option or missing value: " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (vocabSize == 0)
    usage("convert needs --vocab-size");
  if (positional.size() < 2)
    usage("convert needs an output directory and at least one input file");

  TokenDatasetWriter writer(positional[0], vocabSize, shardTokens);
  TokenSample sample;
  for (size_t i = 1; i < positional.size(); ++i) {
    JsonlSampleReader reader(positional[i], vocabSize);
    while (reader.next(sample))
      writer.add(sample, reader.origin());
  }
  TokenDatasetInfo info = writer.finish();
  std::cout << "wrote " << info.numSamples << " samples, " << info.numTokens
            << " tokens in " << info.shards.size() << " shard(s) to "
            << positional[0] << "\n";
  return 0;
}

int verify(const std::string &directory) {
  TokenDatasetReader reader(TokenDataset::open(directory));
  TokenSample sample;
  uint64_t samples = 0, tokens = 0, trained = 0;
  while (reader.next(sample)) {
    ++samples;
    tokens += sample.tokens.size();
    for (uint8_t bit : sample.lossMask)
      trained += bit;
  }
  std::cout << directory << ": ok, " << samples << " samples, " << tokens
            << " tokens (" << trained << " in the loss mask)\n";
  return 0;
}

int dump(const std::string &directory) {
  TokenDatasetReader reader(TokenDataset::open(directory));
  TokenSample sample;
  std::string line;
  while (reader.next(sample)) {
    line = "{\"input_ids\": [";
    for (size_t i = 0; i < sample.tokens.size(); ++i)
      line += (i ? ", " : "") + std::to_string(sample.tokens[i]);
    line += "], \"loss_mask\": [";
    for (size_t i = 0; i < sample.lossMask.size(); ++i)
      line += (i ? ", " : "") + std::to_string(int(sample.lossMask[i]));
    line += "]}\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  if (argc < 2)
    usage("missing command");
  std::string command = argv[1];
  try {
    if (command == "convert")
      return convert(argc - 2, argv + 2);
    if (command == "verify" && argc == 3)
      return verify(argv[2]);
    if (command == "dump" && argc == 3)
      return dump(argv[2]);
    if (command == "--help" || command == "-h") {
      std::cout << kUsage;
      return 0;
    }
    usage("bad command line");
  } catch (const std::exception &error) {
    std::cerr << "dflex-data: error: " << error.what() << "\n";
    return 1;
  }
}
