#include "dflex/runtime/checkpoint/CheckpointStore.h"

#include "dflex/Support/Error.h"
#include "dflex/Support/File.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <unistd.h>

namespace dflex::runtime {

namespace fs = std::filesystem;

namespace {

constexpr const char *kLatest = "latest";
constexpr const char *kPrefix = "step-";
constexpr const char *kPartial = ".partial-";

void check(const Status &status) {
  if (!status.ok())
    throw IoError(status.message());
}

bool isCheckpoint(const fs::path &path) {
  const std::string name = path.filename().string();
  return name.rfind(kPrefix, 0) == 0 && name.find(kPartial) == std::string::npos &&
         fs::is_directory(path);
}

} // namespace

CheckpointStore::CheckpointStore(std::string root, int64_t keepLast)
    : root_(std::move(root)), keepLast_(std::max<int64_t>(keepLast, 1)) {
  check(createDirectories(root_));
  // Leftovers of writers that did not finish: partial checkpoints and
  // temporary `latest` files.
  std::error_code error;
  for (const fs::directory_entry &entry : fs::directory_iterator(root_)) {
    const std::string name = entry.path().filename().string();
    if (name.find(kPartial) != std::string::npos ||
        name.rfind(atomicTempPrefix(kLatest), 0) == 0)
      fs::remove_all(entry.path(), error);
  }
}

std::string CheckpointStore::nameOf(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kPrefix, static_cast<long long>(step));
  return name;
}

std::string CheckpointStore::save(int64_t step,
                                  const std::function<void(const std::string &)> &write) {
  const fs::path target = fs::path(root_) / nameOf(step);
  const fs::path staging =
      fs::path(root_) / (nameOf(step) + kPartial + std::to_string(::getpid()));
  std::error_code error;
  fs::remove_all(staging, error);
  try {
    check(createDirectories(staging.string()));
    write(staging.string());
    check(syncDirectory(staging.string()));
    // A checkpoint of the same step (a re-run after a resume) is replaced.
    if (fs::exists(target)) {
      const fs::path old = target.string() + kPartial + "old";
      fs::remove_all(old, error);
      fs::rename(target, old);
      fs::remove_all(old, error);
    }
    fs::rename(staging, target);
    check(syncDirectory(root_));
  } catch (...) {
    fs::remove_all(staging, error);
    throw;
  }
  check(writeFileAtomic((fs::path(root_) / kLatest).string(), nameOf(step) + "\n"));

  // Keep the newest keepLast; `latest` names the newest, so it stays.
  std::vector<std::string> all = list();
  const std::string latestDir = target.string();
  for (size_t i = 0; i + size_t(keepLast_) < all.size(); ++i)
    if (all[i] != latestDir)
      fs::remove_all(all[i], error);
  return target.string();
}

std::optional<std::string> CheckpointStore::latest() const {
  Result<std::string> text = readFile((fs::path(root_) / kLatest).string());
  if (!text.ok())
    return std::nullopt;
  std::string name = text.value();
  name.erase(name.find_last_not_of(" \n\r\t") + 1);
  const fs::path directory = fs::path(root_) / name;
  if (name.empty() || name.find('/') != std::string::npos || !isCheckpoint(directory))
    return std::nullopt;
  return directory.string();
}

std::string CheckpointStore::resolve(const std::string &which) const {
  if (which == kLatest) {
    if (std::optional<std::string> directory = latest())
      return *directory;
    throw FormatError(root_ + ": no checkpoint to resume from ('latest' names none)");
  }
  if (!fs::is_directory(which))
    throw FormatError(which + ": no such checkpoint directory");
  return which;
}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::string> checkpoints;
  for (const fs::directory_entry &entry : fs::directory_iterator(root_))
    if (isCheckpoint(entry.path()))
      checkpoints.push_back(entry.path().string());
  // Names are zero-padded steps: text order is step order.
  std::sort(checkpoints.begin(), checkpoints.end());
  return checkpoints;
}

} // namespace dflex::runtime
