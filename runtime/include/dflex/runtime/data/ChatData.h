// Chat data through the target's own tokenizer and chat template: the Python
// helper tools/dflex-data/chat_helper.py (transformers), which the build
// installs next to the binaries. It tokenizes conversations into training
// samples, renders prompts, and answers prompts with the target
// (docs/data.md).
#pragma once

#include "dflex/runtime/data/TokenData.h"

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dflex {
class JsonValue;
} // namespace dflex

namespace dflex::runtime {

/// The helper ended with a non-zero status, having named the problem on
/// stderr: 2 for bad input (a malformed record, named FILE:LINE), 1 for the rest.
class ChatHelperError : public std::runtime_error {
public:
  ChatHelperError(const std::string &message, int status) : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

private:
  int status_;
};

/// Runs `chat_helper.py <args>` and calls onObject with each JSON object it
/// prints and the object's place ("chat helper output line N"). Throws
/// ChatHelperError when the helper fails, and what onObject throws.
void runChatHelper(const std::vector<std::string> &args,
                   const std::function<void(const JsonValue &, const std::string &where)> &onObject);

/// Tokenizes the chat records of `inputs` with the tokenizer and chat
/// template of the target in `targetDir` (`helperOptions`: --last-turn-only,
/// --each-turn, --max-length N) and writes them as a binary dataset to
/// `outputDir`, checked against the target's vocabulary (the model's
/// vocab_size, which may exceed the tokenizer's). Nothing is left in
/// outputDir when it fails.
TokenDatasetInfo writeChatDataset(const std::string &targetDir, int64_t vocabSize,
                                  const std::vector<std::string> &helperOptions,
                                  const std::vector<std::string> &inputs, const std::string &outputDir,
                                  uint64_t shardTokens);

/// The prompts of a JSONL file: {"input_ids": [...]} lines as they are, chat
/// records ({"messages"} / {"conversations"}) rendered up to their last
/// non-assistant turn with the target's generation prompt. Every id is
/// checked against `vocabSize`; errors name FILE:LINE.
std::vector<std::vector<int64_t>> readPrompts(const std::string &path, const std::string &targetDir,
                                              int64_t vocabSize);

} // namespace dflex::runtime
