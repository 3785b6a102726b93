// Helpers for the cache tests: temporary directories and child processes.
#ifndef DFLEX_TEST_UNIT_CACHE_TESTUTIL_H
#define DFLEX_TEST_UNIT_CACHE_TESTUTIL_H

#include <filesystem>
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dflex::test {

/// A fresh directory under the system temp dir, removed at scope exit.
class TempDir {
public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "dflex-test-XXXXXX")
            .string();
    if (::mkdtemp(pattern.data()))
      path_ = pattern;
    // Reachable by the unprivileged children of the permission tests.
    ::chmod(path_.c_str(), 0755);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path &path() const { return path_; }
  std::string str() const { return path_.string(); }

private:
  std::filesystem::path path_;
};

/// Runs `body` in a forked child; returns what it returned (empty means
/// success), or a description of how the child died. With `unprivileged`,
/// a root child first drops to the "nobody" user so that file permissions
/// apply to it.
inline std::string runInChild(const std::function<std::string()> &body,
                              bool unprivileged = false) {
  int pipeFds[2];
  if (::pipe(pipeFds) != 0)
    return "pipe failed";
  pid_t pid = ::fork();
  if (pid < 0)
    return "fork failed";
  if (pid == 0) {
    ::close(pipeFds[0]);
    std::string report;
    if (unprivileged && ::geteuid() == 0 &&
        (::setgid(65534) != 0 || ::setuid(65534) != 0))
      report = "cannot drop privileges";
    else
      report = body();
    ssize_t ignored = ::write(pipeFds[1], report.data(), report.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(pipeFds[1]);
  std::string report;
  char buffer[4096];
  ssize_t got;
  while ((got = ::read(pipeFds[0], buffer, sizeof(buffer))) > 0)
    report.append(buffer, size_t(got));
  ::close(pipeFds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "child died (status " + std::to_string(status) + ") " + report;
  return report;
}

} // namespace dflex::test

#endif
