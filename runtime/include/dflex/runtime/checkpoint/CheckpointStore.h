// The checkpoints of a run: one directory each (step-NNNNNNNN) under the
// run's checkpoint directory, written atomically, and a `latest` file naming
// the newest, replaced last. A checkpoint is built in a temporary sibling
// directory, its files synced, renamed into place and the parent synced;
// only then does `latest` move to it, and only then are checkpoints beyond
// the newest keepLast removed (never the one `latest` names). A writer
// killed at any point leaves the previous checkpoint complete and `latest`
// naming it; the next store removes the leftovers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dflex::runtime {

class CheckpointStore {
public:
  /// Creates `root` if needed and removes leftovers of interrupted writes.
  /// Throws IoError naming the directory.
  CheckpointStore(std::string root, int64_t keepLast);

  const std::string &root() const { return root_; }

  /// Writes the checkpoint of `step`: `write` fills the directory it is
  /// given (every file it writes must be complete and synced, as
  /// AtomicFileWriter leaves them). Returns the checkpoint's directory.
  /// Throws what `write` throws, or IoError; either way `latest` is
  /// unchanged and nothing half-written stays behind.
  std::string save(int64_t step, const std::function<void(const std::string &directory)> &write);

  /// The directory `latest` names, if any (checked to exist).
  std::optional<std::string> latest() const;

  /// "latest" (the run's newest checkpoint) or a checkpoint directory.
  /// Throws FormatError when there is none.
  std::string resolve(const std::string &which) const;

  /// The checkpoint directories, oldest first.
  std::vector<std::string> list() const;

  /// The directory name of `step`'s checkpoint.
  static std::string nameOf(int64_t step);

private:
  std::string root_;
  int64_t keepLast_;
};

} // namespace dflex::runtime
