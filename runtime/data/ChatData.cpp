#include "dflex/runtime/data/ChatData.h"

#include "dflex/Support/Error.h"
#include "dflex/Support/JsonObject.h"
#include "dflex/runtime/support/Subprocess.h"

#include <filesystem>
#include <fstream>

namespace dflex::runtime {

namespace {

// The name the build installs tools/dflex-data/chat_helper.py under.
constexpr const char *kChatHelper = "dflex-chat-helper.py";

std::vector<int64_t> checkedPrompt(const JsonValue &value, const std::string &where, int64_t vocabSize) {
  std::vector<int64_t> prompt = JsonObject(value, where).integers("input_ids");
  if (prompt.empty())
    throw FormatError(where + ": input_ids is empty");
  for (int64_t id : prompt)
    if (id < 0 || id >= vocabSize)
      throw FormatError(where + ": prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                        std::to_string(vocabSize) + ")");
  return prompt;
}

} // namespace

void runChatHelper(const std::vector<std::string> &args,
                   const std::function<void(const JsonValue &, const std::string &where)> &onObject) {
  const std::string command = pythonHelperCommand(kChatHelper, args);
  uint64_t lineNumber = 0;
  const int status = forEachOutputLine(command, [&](std::string_view line) {
    const std::string where = "chat helper output line " + std::to_string(++lineNumber);
    onObject(parseJsonText(line, where), where);
  });
  if (status != 0)
    throw ChatHelperError("the chat helper failed (" + command + " exited with status " +
                              std::to_string(status) + ")",
                          status);
}

TokenDatasetInfo writeChatDataset(const std::string &targetDir, int64_t vocabSize,
                                  const std::vector<std::string> &helperOptions,
                                  const std::vector<std::string> &inputs, const std::string &outputDir,
                                  uint64_t shardTokens) {
  std::vector<std::string> args = {"tokenize", "--target", targetDir};
  args.insert(args.end(), helperOptions.begin(), helperOptions.end());
  args.insert(args.end(), inputs.begin(), inputs.end());
  TokenDatasetWriter writer(outputDir, vocabSize, shardTokens);
  TokenSample sample;
  try {
    // Each sample names its record in "origin".
    runChatHelper(args, [&](const JsonValue &line, const std::string &where) {
      const std::string origin = JsonObject(line, where).string("origin");
      sampleFromJson(line, vocabSize, origin, sample);
      writer.add(sample, origin);
    });
  } catch (...) {
    writer.abandon();
    throw;
  }
  return writer.finish();
}

std::vector<std::vector<int64_t>> readPrompts(const std::string &path, const std::string &targetDir,
                                              int64_t vocabSize) {
  std::ifstream in(path);
  if (!in)
    throw IoError("cannot open '" + path + "'");
  std::vector<std::vector<int64_t>> prompts;
  std::string line;
  bool chatRecords = false; // only those need the tokenizer
  for (int64_t number = 1; std::getline(in, line) && !chatRecords; ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    const std::string where = path + ":" + std::to_string(number);
    const JsonValue value = parseJsonText(line, where);
    chatRecords = !value.isObject() || !JsonObject(value, where).has("input_ids");
    if (!chatRecords)
      prompts.push_back(checkedPrompt(value, where, vocabSize));
  }
  if (chatRecords) { // the helper renders them and passes token ids through
    prompts.clear();
    runChatHelper({"prompts", "--target", targetDir, path}, [&](const JsonValue &object, const std::string &where) {
      prompts.push_back(checkedPrompt(object, JsonObject(object, where).string("origin"), vocabSize));
    });
  }
  if (prompts.empty())
    throw FormatError(path + ": no prompts");
  return prompts;
}

} // namespace dflex::runtime
