// dflex-data: converts tokenized JSONL to the sharded binary format,
// tokenizes chat JSONL with a target's tokenizer into it, answers prompts
// with the target to make such data (both through the Python chat helper,
// dflex/runtime/data/ChatData.h), and checks or prints datasets
// (docs/data.md).
#include "dflex/Support/Error.h"
#include "dflex/Support/Json.h"
#include "dflex/runtime/checkpoint/ModelConfig.h"
#include "dflex/runtime/data/ChatData.h"
#include "dflex/runtime/data/TokenData.h"

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

using namespace dflex;
using namespace dflex::runtime;

namespace {

const char *kUsage =
    "usage:\n"
    "  dflex-data convert --vocab-size N [--shard-tokens N] OUTPUT_DIR INPUT.jsonl...\n"
    "      Validates every sample (ids in [0, N), one 0/1 loss-mask entry per id)\n"
    "      and writes shard-NNNNN.bin files plus dataset.json into OUTPUT_DIR.\n"
    "  dflex-data prepare --target DIR [--last-turn-only | --each-turn] [--max-length N]\n"
    "                     [--shard-tokens N] OUTPUT_DIR INPUT.jsonl...\n"
    "      Tokenizes chat records ({\"messages\": [{\"role\", \"content\"}]} or\n"
    "      {\"conversations\": [{\"from\", \"value\"}]}) with the target's tokenizer\n"
    "      and chat template (Python transformers; DFLEX_PYTHON, default python3),\n"
    "      the loss mask on the assistant turns, and writes them as convert does.\n"
    "  dflex-data regenerate --target DIR [--max-new-tokens N] [--batch-size B]\n"
    "                        [--temperature T] [--top-p P] [--seed S] [--device D]\n"
    "                        [--journal FILE] [--max-length N] [--shard-tokens N]\n"
    "                        OUTPUT_DIR INPUT.jsonl...\n"
    "      Answers each chat record's last user turn with the target (greedy at\n"
    "      temperature 0, the default; batched, on the GPU when there is one) in\n"
    "      place of the record's answer, and writes the conversations as prepare\n"
    "      does, trained on the target's answers. The answers go to the journal\n"
    "      (default OUTPUT_DIR.journal.jsonl) batch by batch: run the same command\n"
    "      again after an interruption and it continues where it stopped.\n"
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

/// The target's vocabulary size, from its config.json: the model's, which
/// may be larger than the tokenizer's.
int64_t targetVocabSize(const std::string &target) {
  const std::string configFile = (std::filesystem::path(target) / "config.json").string();
  try {
    return loadTransformerConfig(configFile).vocabSize;
  } catch (const std::exception &error) {
    throw FormatError("cannot read the target's vocabulary size from " + configFile + ": " + error.what());
  }
}

/// The options prepare and regenerate share; the rest are returned in order.
struct ChatOptions {
  std::string target;
  uint64_t shardTokens = 16u << 20;
  std::vector<std::string> tokenizeOptions; ///< passed to the helper's tokenize
  std::vector<std::string> positional;      ///< OUTPUT_DIR INPUT.jsonl...
};

/// Parses argv into `options`; `other(arg, value)` takes a command's own
/// options with a value (returning false for unknown ones).
ChatOptions parseChatOptions(int argc, char **argv, const std::string &command,
                             const std::function<bool(const std::string &, const char *)> &other) {
  ChatOptions options;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    const char *next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (command == "prepare" && (arg == "--last-turn-only" || arg == "--each-turn")) {
      options.tokenizeOptions.push_back(arg);
    } else if (arg == "--target" && next) {
      options.target = argv[++i];
    } else if (arg == "--shard-tokens" && next) {
      options.shardTokens = parseCount(arg, argv[++i]);
    } else if (arg == "--max-length" && next) {
      options.tokenizeOptions.push_back(arg);
      options.tokenizeOptions.push_back(std::to_string(parseCount(arg, argv[++i])));
    } else if (arg.rfind("--", 0) == 0) {
      if (!next || !other(arg, next))
        usage("unknown option or missing value: " + arg);
      ++i;
    } else {
      options.positional.push_back(arg);
    }
  }
  if (options.target.empty())
    usage(command + " needs --target (the target model's directory)");
  if (options.positional.size() < 2)
    usage(command + " needs an output directory and at least one input file");
  return options;
}

/// Tokenizes `inputs` into the output directory, reporting what was written.
int writeDataset(const std::string &command, const ChatOptions &options, const std::vector<std::string> &inputs) {
  const std::string &output = options.positional[0];
  try {
    const TokenDatasetInfo info = writeChatDataset(options.target, targetVocabSize(options.target),
                                                   options.tokenizeOptions, inputs, output, options.shardTokens);
    std::cout << "wrote " << info.numSamples << " samples, " << info.numTokens << " tokens in "
              << info.shards.size() << " shard(s) to " << output << "\n";
    return 0;
  } catch (const ChatHelperError &error) {
    std::cerr << "dflex-data: " << command << ": " << error.what() << "; nothing was written to " << output
              << "\n";
    return error.status();
  }
}

int prepare(int argc, char **argv) {
  const ChatOptions options =
      parseChatOptions(argc, argv, "prepare", [](const std::string &, const char *) { return false; });
  return writeDataset("prepare", options, {options.positional.begin() + 1, options.positional.end()});
}

int regenerate(int argc, char **argv) {
  std::vector<std::string> generateOptions;
  std::string journal;
  ChatOptions options = parseChatOptions(argc, argv, "regenerate", [&](const std::string &arg, const char *value) {
    static const char *const kGenerateOptions[] = {"--max-new-tokens", "--batch-size", "--temperature",
                                                   "--top-p", "--seed", "--device"};
    if (arg == "--journal") {
      journal = value;
      return true;
    }
    for (const char *name : kGenerateOptions)
      if (arg == name) {
        generateOptions.push_back(arg);
        generateOptions.push_back(value);
        return true;
      }
    return false;
  });
  const std::string &output = options.positional[0];
  if (journal.empty())
    journal = std::filesystem::path(output).lexically_normal().string() + ".journal.jsonl";
  std::vector<std::string> args = {"regenerate", "--target", options.target, "--journal", journal};
  args.insert(args.end(), generateOptions.begin(), generateOptions.end());
  args.insert(args.end(), options.positional.begin() + 1, options.positional.end());
  try {
    runChatHelper(args, [](const JsonValue &, const std::string &where) {
      throw IoError("the chat helper printed " + where + " while regenerating (it writes to its journal)");
    });
  } catch (const ChatHelperError &error) {
    std::cerr << "dflex-data: regenerate: " << error.what() << "; the answers so far are kept in " << journal
              << ", and the same command continues from them\n";
    return error.status();
  }
  // Only the target's answer, the conversation's last turn, is trained on.
  options.tokenizeOptions.push_back("--last-turn-only");
  return writeDataset("regenerate", options, {journal});
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
    if (command == "prepare")
      return prepare(argc - 2, argv + 2);
    if (command == "regenerate")
      return regenerate(argc - 2, argv + 2);
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
