// The training run: from a TrainingPlan to a drafter in serving format.
// Loads the target (no gradients) and builds the drafter on their devices,
// streams packed rows, runs DrafterStep updates on the warmup-cosine
// schedule, logs metrics, and writes checkpoints through a CheckpointStore:
// the drafter as SGLang and vLLM load it (config.json, model.safetensors in
// bf16) plus everything an exact resume needs (optimizer, step, RNG, data
// cursor, config). docs/train.md.
#pragma once

#include "dflex/runtime/data/Batching.h"
#include "dflex/runtime/train/TrainingPlan.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>

namespace dflex::runtime {

/// The files of a checkpoint directory besides the drafter's.
namespace checkpoint_files {
inline constexpr const char *kTrainingState = "training_state.safetensors";
inline constexpr const char *kTrainerState = "trainer_state.json";
inline constexpr const char *kConfig = "train_config.yaml";
} // namespace checkpoint_files

struct TrainerOptions {
  /// "latest" or a checkpoint directory to continue from.
  std::optional<std::string> resume;
  /// Progress lines, messages.
  std::ostream *out = nullptr;
  /// A redrawn progress bar instead of periodic lines (for a terminal).
  bool progressBar = false;
  /// Checked between steps: when set, the run checkpoints and returns.
  const std::atomic<bool> *stop = nullptr;
  /// Called after each checkpoint but the initial one (e.g. to render the run report).
  std::function<void()> afterCheckpoint;
  /// Also checkpoint the initialised drafter, as step 0, before the first
  /// update of a new run: the untrained baseline of an evaluation.
  bool checkpointInitial = false;
  /// Also write every micro-step's batch, as this rank draws it, to
  /// `<writeBatches>/<batchFileName(update, rank, micro)>` (writeTrainingBatch):
  /// the exact inputs of the run, for another trainer to run side by side.
  std::optional<std::string> writeBatches;
};

/// "batch-00000001-rank0-micro0.safetensors": micro-step `micro` of update
/// `update` (from 1) on `rank`.
std::string batchFileName(int64_t update, int rank, int64_t micro);

/// Writes `batch` atomically as safetensors under the snake_case names of
/// its members (tokens, position_ids, document_ids, loss_mask, cu_seqlens,
/// anchors, block_valid, context_start, block_tokens, block_position_ids,
/// labels, weights).
void writeTrainingBatch(const std::string &path, const TrainingBatch &batch);

struct TrainResult {
  int64_t steps = 0;          ///< updates done (skipped ones included)
  int64_t skippedSteps = 0;   ///< non-finite loss or gradients
  bool interrupted = false;   ///< stopped by TrainerOptions::stop
  std::string checkpoint;     ///< the last one written
  double lastLoss = 0;
};

/// A run that cannot go on (non-finite steps in a row, out of memory); the
/// message says what happened and what to change. Checkpoints written
/// before it are intact.
class TrainingAborted : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// What `dflex-train --dry-run` prints: the plan, and the data read whole
/// (every sample validated) with its rows per epoch and updates. Throws
/// FormatError naming the file and sample of bad data.
std::string dryRun(const TrainingPlan &plan);

/// Trains per `plan` (see planTraining). Throws FormatError for bad data,
/// bundles or a resume that does not match, IoError, TrainingAborted.
TrainResult train(const TrainingPlan &plan, const TrainerOptions &options);

} // namespace dflex::runtime
