#include "dflex/runtime/support/Subprocess.h"

#include "dflex/Support/Error.h"

#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace dflex::runtime {

std::string shellQuote(const std::string &word) {
  std::string quoted = "'";
  for (char c : word)
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string installedHelper(const std::string &name) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error)
    throw IoError("cannot find this binary (/proc/self/exe): " + error.message());
  const std::filesystem::path helper = self.parent_path() / name;
  if (!std::filesystem::exists(helper))
    throw IoError("cannot find the helper " + helper.string() + " (the build installs it next to " +
                  self.filename().string() + ")");
  return helper.string();
}

std::string pythonHelperCommand(const std::string &script, const std::vector<std::string> &args) {
  const char *python = std::getenv("DFLEX_PYTHON");
  std::string command = std::string(python && *python ? python : "python3") + " " +
                        shellQuote(installedHelper(script));
  for (const std::string &arg : args)
    command += " " + shellQuote(arg);
  return command;
}

int forEachOutputLine(const std::string &command, const std::function<void(std::string_view)> &onLine) {
  std::fflush(nullptr); // what we printed comes before the command's output
  FILE *pipe = popen(command.c_str(), "r");
  if (!pipe)
    throw IoError("cannot run '" + command + "': " + std::strerror(errno));
  char *line = nullptr; // getline's buffer, grown as needed
  size_t capacity = 0;
  try {
    ssize_t length;
    while ((length = getline(&line, &capacity, pipe)) > 0) {
      std::string_view text(line, size_t(length));
      if (text.back() == '\n')
        text.remove_suffix(1);
      onLine(text);
    }
  } catch (...) {
    std::free(line);
    pclose(pipe);
    throw;
  }
  std::free(line);
  const int status = pclose(pipe);
  if (status == -1)
    throw IoError("cannot wait for '" + command + "': " + std::strerror(errno));
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

} // namespace dflex::runtime
