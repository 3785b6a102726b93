// dflex-train: trains a DFlash drafter from a config file and --set
// overrides (docs/train.md). Exit status: 0 done, or stopped by SIGTERM /
// SIGINT after a checkpoint; 2 bad input (configuration, data, checkpoint,
// bundle), named; 1 a failed run (out of memory, non-finite steps, I/O).
#include "dflex/Support/Error.h"
#include "dflex/runtime/train/Trainer.h"

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

using namespace dflex::runtime;

namespace {

std::atomic<bool> stopRequested{false};

void requestStop(int signal) {
  stopRequested.store(true);
  // A second signal ends the process at once.
  std::signal(signal, SIG_DFL);
}

/// dflex-report next to this executable renders the plots and TensorBoard
/// scalars of `logDir`; its absence or failure is reported, not fatal.
void runReport(const std::string &logDir) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::filesystem::path report = self.parent_path() / "dflex-report";
  if (error || !std::filesystem::exists(report)) {
    std::cerr << "dflex-train: dflex-report not found next to dflex-train; plots not rendered\n";
    return;
  }
  const std::string command = "'" + report.string() + "' '" + logDir + "'";
  if (std::system(command.c_str()) != 0)
    std::cerr << "dflex-train: " << command << " failed; metrics.jsonl is complete\n";
}

/// Runs `body`; the exit status of what it throws: 2 for bad input (a
/// FormatError, named), 1 for any other failure.
int runReporting(const std::function<void()> &body) {
  try {
    body();
    return 0;
  } catch (const dflex::FormatError &error) {
    std::cerr << "dflex-train: " << error.what() << "\n";
    return 2;
  } catch (const std::exception &error) {
    std::cerr << "dflex-train: " << error.what() << "\n";
    return 1;
  }
}

} // namespace

int main(int argc, char **argv) {
  CLI::App app{"dflex-train: trains a DFlash drafter (docs/train.md)"};
  std::string configPath, resume, writeBatches;
  std::vector<std::string> overrides;
  bool checkOnly = false, plain = false, noReport = false, checkpointInitial = false;
  app.add_option("--config", configPath, "YAML config file (every key has a default)");
  app.add_option("--set", overrides, "key=value override with a dotted key, e.g. optimizer.lr=1e-4")
      ->take_all();
  app.add_option("--resume", resume, "continue a run: 'latest' or a checkpoint directory");
  app.add_flag("--dry-run", checkOnly,
               "check config, data, target, kernel bundles; print the memory plan; do not train");
  app.add_flag("--plain", plain, "periodic lines instead of a progress bar on a terminal");
  app.add_flag("--no-report", noReport, "do not render plots and TensorBoard scalars (dflex-report)");
  app.add_flag("--checkpoint-initial", checkpointInitial,
               "also checkpoint the untrained drafter as step 0 (a baseline for dflex-eval)");
  app.add_option("--write-batches", writeBatches,
                 "also write every micro-step's batch to this directory (safetensors), for a trainer run "
                 "side by side");
  app.footer("Configuration keys (YAML sections before the dot; --set takes the dotted name):\n" +
             describeTrainConfigKeys());
  CLI11_PARSE(app, argc, argv);

  TrainingPlan plan;
  if (const int status = runReporting([&] {
        plan = planTraining(loadTrainConfig(configPath, overrides), RankEnvironment::fromEnvironment());
      }))
    return status;
  if (checkOnly)
    return runReporting([&] { std::cout << dryRun(plan); });

  std::signal(SIGTERM, requestStop);
  std::signal(SIGINT, requestStop);
  TrainerOptions options;
  if (!resume.empty())
    options.resume = resume;
  options.out = &std::cout;
  options.progressBar = !plain && isatty(STDOUT_FILENO);
  options.stop = &stopRequested;
  options.checkpointInitial = checkpointInitial;
  if (!writeBatches.empty())
    options.writeBatches = writeBatches;
  const std::string logDir = plan.config.logDir.empty() ? plan.config.checkpointDir : plan.config.logDir;
  if (!noReport)
    options.afterCheckpoint = [&] { runReport(logDir); };
  return runReporting([&] {
    const TrainResult result = train(plan, options);
    if (result.interrupted)
      std::cout << "dflex-train: stopped by signal after step " << result.steps << "; resume with --resume "
                << result.checkpoint << "\n";
    else
      std::cout << "dflex-train: done, " << result.steps << " updates (" << result.skippedSteps
                << " skipped); the drafter is in " << result.checkpoint << "\n";
  });
}
