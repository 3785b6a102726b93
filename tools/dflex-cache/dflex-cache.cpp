//===- dflex-cache.cpp - Inspect and maintain the kernel cache --------------===//
#include "dflex/Cache/KernelCache.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

using namespace dflex;
using namespace dflex::cache;

namespace {

// Exit statuses (documented in docs/cache.md).
constexpr int kExitUsage = 1;
constexpr int kExitFailed = 2;
constexpr int kExitBadEntries = 3;

constexpr const char *kUsage =
    "usage: dflex-cache [--dir DIR] <command>\n"
    "\n"
    "commands:\n"
    "  ls                   list entries: key, size, last use (UTC)\n"
    "  verify               check every entry; move corrupt ones to the\n"
    "                       quarantine folder (exit status 3 if any)\n"
    "  gc --max-size SIZE   evict least-recently-used entries until the\n"
    "                       cache holds at most SIZE (e.g. 500M, 2G)\n"
    "  clear                remove every entry\n"
    "\n"
    "options:\n"
    "  --dir DIR            cache directory (default: $DFLEX_CACHE_DIR, else\n"
    "                       $XDG_CACHE_HOME/dflex, else ~/.cache/dflex)\n";

int usageError(const std::string &message) {
  std::fprintf(stderr, "dflex-cache: %s\n%s", message.c_str(), kUsage);
  return kExitUsage;
}

std::string humanSize(uint64_t bytes) {
  const char *units[] = {"B", "K", "M", "G", "T"};
  double value = double(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f%s" : "%.1f%s", value,
                units[unit]);
  return text;
}

std::string utcTime(int64_t seconds) {
  std::time_t time = std::time_t(seconds);
  std::tm parts;
  gmtime_r(&time, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &parts);
  return text;
}

int list(KernelCache &cache) {
  std::vector<EntryInfo> entries = cache.list();
  std::sort(entries.begin(), entries.end(),
            [](const EntryInfo &a, const EntryInfo &b) {
              return a.lastUsed != b.lastUsed ? a.lastUsed > b.lastUsed
                                              : a.key < b.key;
            });
  uint64_t total = 0;
  for (const EntryInfo &entry : entries) {
    std::printf("%s  %8s  %s\n", entry.key.c_str(),
                humanSize(entry.fileBytes).c_str(),
                utcTime(entry.lastUsed).c_str());
    total += entry.fileBytes;
  }
  std::printf("%zu entries, %s in %s\n", entries.size(),
              humanSize(total).c_str(), cache.directory().c_str());
  return 0;
}

int verify(KernelCache &cache) {
  VerifyReport report = cache.verify();
  for (const std::string &problem : report.problems)
    std::printf("bad: %s\n", problem.c_str());
  std::printf("%zu entries checked, %zu valid, %zu bad\n", report.checked,
              report.valid, report.problems.size());
  return report.problems.empty() ? 0 : kExitBadEntries;
}

int collectGarbage(KernelCache &cache, uint64_t maxBytes) {
  GcReport report = cache.gc(maxBytes);
  std::printf("evicted %zu entries (%s); kept %zu entries (%s); removed %zu "
              "quarantined or temporary files\n",
              report.evictedEntries, humanSize(report.evictedBytes).c_str(),
              report.keptEntries, humanSize(report.keptBytes).c_str(),
              report.removedLeftovers);
  return 0;
}

int clear(KernelCache &cache) {
  size_t count = cache.list().size();
  Status status = cache.clear();
  if (!status.ok()) {
    std::fprintf(stderr, "dflex-cache: %s\n", status.message().c_str());
    return kExitFailed;
  }
  std::printf("removed %zu entries from %s\n", count,
              cache.directory().c_str());
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  std::string directory, command, maxSizeText;
  bool haveMaxSize = false;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &arg = args[i];
    auto value = [&](const std::string &option, std::string &out) {
      if (arg.rfind(option + "=", 0) == 0) {
        out = arg.substr(option.size() + 1);
        return true;
      }
      if (arg != option)
        return false;
      if (i + 1 == args.size()) {
        out.clear();
        return true;
      }
      out = args[++i];
      return true;
    };
    if (arg == "-h" || arg == "--help") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (value("--dir", directory)) {
      if (directory.empty())
        return usageError("--dir needs a directory");
    } else if (value("--max-size", maxSizeText)) {
      haveMaxSize = true;
    } else if (!arg.empty() && arg[0] == '-') {
      return usageError("unknown option '" + arg + "'");
    } else if (command.empty()) {
      command = arg;
    } else {
      return usageError("unexpected argument '" + arg + "'");
    }
  }
  if (command.empty())
    return usageError("missing command");
  if (command != "ls" && command != "verify" && command != "gc" &&
      command != "clear")
    return usageError("unknown command '" + command + "'");
  if (haveMaxSize && command != "gc")
    return usageError("--max-size only applies to gc");
  uint64_t maxBytes = 0;
  if (command == "gc") {
    if (!haveMaxSize)
      return usageError("gc needs --max-size SIZE");
    Result<uint64_t> parsed = parseByteSize(maxSizeText);
    if (!parsed.ok())
      return usageError(parsed.error());
    maxBytes = parsed.value();
  }

  KernelCache cache(CacheConfig{directory, stderrWarningSink()});
  if (!cache.enabled()) {
    std::fprintf(stderr, "dflex-cache: no usable cache directory\n");
    return kExitFailed;
  }
  if (command == "ls")
    return list(cache);
  if (command == "verify")
    return verify(cache);
  if (command == "gc")
    return collectGarbage(cache, maxBytes);
  return clear(cache);
}
