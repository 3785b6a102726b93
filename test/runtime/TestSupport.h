// Helpers shared by the runtime tests: scratch directories, running the
// Python reference scripts, and checking error messages.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace dflex::runtime::test {

/// A fresh directory under the system temp dir, removed with its contents.
class TempDir {
public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dflex-test-XXXXXX").string();
    if (!mkdtemp(pattern.data()))
      throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;

  const std::filesystem::path &path() const { return path_; }
  std::string file(const std::string &name) const { return (path_ / name).string(); }

private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exitCode = -1;
  std::string output; // stdout and stderr
};

/// Runs the Python file `path` with python3 (the interpreter the build
/// found), capturing its output.
inline CommandResult runPythonFile(const std::string &path, const std::string &arguments) {
  std::string command = std::string("\"") + DFLEX_TEST_PYTHON + "\" \"" + path + "\" " +
                        arguments + " 2>&1";
  CommandResult result;
  FILE *pipe = popen(command.c_str(), "r");
  if (!pipe)
    return result;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    result.output.append(buffer, got);
  int status = pclose(pipe);
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

/// Runs a script from the test folder's python/ with python3 (the interpreter the
/// build found), capturing its output.
inline CommandResult runPythonScript(const std::string &script,
                                     const std::string &arguments) {
  return runPythonFile(std::string(DFLEX_TEST_SOURCE_DIR) + "/python/" + script, arguments);
}

/// The directory of target_reference.py's tiny random model `model`
/// (qwen3, qwen3_5, ...; test/runtime/models/python), made once per test
/// program and shared by its tests, which only read it.
inline std::string referenceTarget(const std::string &model) {
  static std::map<std::string, std::unique_ptr<TempDir>> built;
  std::unique_ptr<TempDir> &dir = built[model];
  if (!dir) {
    auto fresh = std::make_unique<TempDir>();
    const CommandResult result =
        runPythonFile(std::string(DFLEX_TEST_SOURCE_DIR) + "/../models/python/target_reference.py",
                      "--model " + model + " --out \"" + fresh->path().string() + "\"");
    if (result.exitCode != 0)
      throw std::runtime_error("target_reference.py --model " + model + " failed:\n" + result.output);
    dir = std::move(fresh);
  }
  return dir->file("model");
}

inline std::string readBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

/// Expects `body` to throw an exception of type E whose message contains
/// every string in `fragments`.
template <typename E>
void expectError(const std::function<void()> &body,
                 std::initializer_list<std::string> fragments) {
  try {
    body();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E &error) {
    std::string message = error.what();
    for (const std::string &fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks \"" << fragment << "\": " << message;
  }
}

} // namespace dflex::runtime::test
