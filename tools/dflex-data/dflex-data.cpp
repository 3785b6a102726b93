// dflex-data: converts tokenized JSONL to the sharded binary format,
// tokenizes chat JSONL with a target's tokenizer into it (through the Python
// helper dflex-data-prepare-chat.py, installed next to this binary), and
// checks or prints such datasets (docs/data.md).
#include "dflex/Support/Error.h"
#include "dflex/Support/JsonObject.h"
#include "dflex/runtime/checkpoint/ModelConfig.h"
#include "dflex/runtime/data/TokenData.h"

#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
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

/// `text` as one word for /bin/sh.
std::string shellQuote(const std::string &text) {
  std::string quoted = "'";
  for (char c : text)
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

/// The helper script installed next to this binary.
std::string helperScript() {
  std::error_code error;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error)
    throw IoError("cannot find this binary (/proc/self/exe): " + error.message());
  std::filesystem::path script = self.parent_path() / "dflex-data-prepare-chat.py";
  if (!std::filesystem::exists(script))
    throw IoError("cannot find the chat helper " + script.string() +
                  " (it is installed next to dflex-data by the build)");
  return script.string();
}

int prepare(int argc, char **argv) {
  std::string target;
  uint64_t shardTokens = 16u << 20;
  std::vector<std::string> helperOptions, positional;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--target" && i + 1 < argc) {
      target = argv[++i];
    } else if (arg == "--shard-tokens" && i + 1 < argc) {
      shardTokens = parseCount(arg, argv[++i]);
    } else if (arg == "--max-length" && i + 1 < argc) {
      helperOptions.push_back(arg);
      helperOptions.push_back(std::to_string(parseCount(arg, argv[++i])));
    } else if (arg == "--last-turn-only" || arg == "--each-turn") {
      helperOptions.push_back(arg);
    } else if (arg.rfind("--", 0) == 0) {
      usage("unknown option or missing value: " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (target.empty())
    usage("prepare needs --target (the target model's directory)");
  if (positional.size() < 2)
    usage("prepare needs an output directory and at least one input file");

  // Ids are checked against the model's vocabulary (which may be larger than
  // the tokenizer's).
  std::string configFile = (std::filesystem::path(target) / "config.json").string();
  int64_t vocabSize;
  try {
    vocabSize = loadTransformerConfig(configFile).vocabSize;
  } catch (const std::exception &error) {
    throw FormatError("cannot read the target's vocabulary size from " + configFile +
                      ": " + error.what());
  }

  const char *python = std::getenv("DFLEX_PYTHON");
  std::string command = std::string(python && *python ? python : "python3") + " " +
                        shellQuote(helperScript()) + " --target " + shellQuote(target);
  for (const std::string &option : helperOptions)
    command += " " + shellQuote(option);
  for (size_t i = 1; i < positional.size(); ++i)
    command += " " + shellQuote(positional[i]);

  // The helper prints one tokenized sample per line, naming its record in
  // "origin"; its errors and summary go straight to stderr.
  TokenDatasetWriter writer(positional[0], vocabSize, shardTokens);
  std::fflush(nullptr);
  FILE *pipe = popen(command.c_str(), "r");
  if (!pipe)
    throw IoError("cannot run '" + command + "': " + std::strerror(errno));
  TokenSample sample;
  char *buffer = nullptr;
  size_t capacity = 0;
  uint64_t lineNumber = 0;
  try {
    ssize_t length;
    while ((length = getline(&buffer, &capacity, pipe)) > 0) {
      ++lineNumber;
      std::string where = "chat helper output line " + std::to_string(lineNumber);
      JsonValue line = parseJsonText(std::string_view(buffer, size_t(length)), where);
      std::string origin = JsonObject(line, where).string("origin");
      sampleFromJson(line, vocabSize, origin, sample);
      writer.add(sample, origin);
    }
  } catch (...) {
    // Closing the pipe stops the helper at its next write.
    std::free(buffer);
    pclose(pipe);
    writer.abandon();
    throw;
  }
  std::free(buffer);
  int status = pclose(pipe);
  if (status != 0) {
    writer.abandon();
    int code = status == -1 ? 1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::cerr << "dflex-data: prepare: the chat helper failed (" << command
              << " exited with status " << code << "); nothing was written to "
              << positional[0] << "\n";
    return code;
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
    if (command == "prepare")
      return prepare(argc - 2, argv + 2);
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
