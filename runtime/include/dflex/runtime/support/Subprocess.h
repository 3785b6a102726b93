// Commands dflex's tools run: the helper programs the build installs next to
// the binaries, and reading a command's output line by line.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dflex::runtime {

/// `word` as one word for /bin/sh.
std::string shellQuote(const std::string &word);

/// The path of `name` in the directory of the running binary, where the build
/// installs helper programs; throws IoError naming it when it is not there.
std::string installedHelper(const std::string &name);

/// A command line running the installed Python helper `script` with `args`
/// (quoted), under $DFLEX_PYTHON or python3.
std::string pythonHelperCommand(const std::string &script, const std::vector<std::string> &args);

/// Runs `command` through /bin/sh and calls onLine with each line of its
/// stdout (without the newline); its stderr is ours. Returns its exit status
/// (128 + the signal when one ended it). If onLine throws, the pipe is closed
/// (the command stops at its next write) and the exception propagates.
int forEachOutputLine(const std::string &command, const std::function<void(std::string_view)> &onLine);

} // namespace dflex::runtime
