#include "dflex/runtime/train/Trainer.h"

#include "dflex/Support/Error.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/JsonObject.h"
#include "dflex/runtime/bundle/GatedDeltaBundle.h"
#include "dflex/runtime/bundle/KernelBundle.h"
#include "dflex/runtime/checkpoint/CheckpointStore.h"
#include "dflex/runtime/checkpoint/SafeTensors.h"
#include "dflex/runtime/data/ChatData.h"
#include "dflex/runtime/distributed/DataParallel.h"
#include "dflex/runtime/eval/SpeculativeDecoding.h"
#include "dflex/runtime/models/KernelHooks.h"
#include "dflex/runtime/support/FileIo.h"
#include "dflex/runtime/support/Random.h"
#include "dflex/runtime/support/Version.h"
#include "dflex/runtime/train/DrafterStep.h"
#include "dflex/runtime/train/FeaturePipeline.h"
#include "dflex/runtime/train/TrainingData.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>

namespace dflex::runtime {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTrainerStateFormat = 1;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double wallClockSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void writeTextFile(const std::string &path, const std::string &text) {
  AtomicFileWriter writer(path);
  writer.write(text);
  writer.commit();
}

/// Where the run stands besides weights and optimizer: what an exact resume
/// restores.
struct RunState {
  int64_t step = 0;            // updates attempted
  int64_t skippedSteps = 0;    // of them, without an update
  int64_t consecutiveBad = 0;
  DataCursor data;
};

// --- Checkpoints ------------------------------------------------------------------

NamedTensors pendingTensors(const std::vector<PendingSample> &pending) {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  std::vector<int64_t> lengths, indices;
  for (const PendingSample &p : pending) {
    tokens.insert(tokens.end(), p.sample.tokens.begin(), p.sample.tokens.end());
    mask.insert(mask.end(), p.sample.lossMask.begin(), p.sample.lossMask.end());
    lengths.push_back(int64_t(p.sample.tokens.size()));
    indices.push_back(int64_t(p.datasetIndex));
  }
  if (pending.empty())
    return {};
  auto tensorOf = [](auto &values, torch::ScalarType dtype) {
    return torch::from_blob(values.data(), {int64_t(values.size())}, dtype).clone();
  };
  return {{"data.rank0.pending_tokens", tensorOf(tokens, torch::kInt)},
          {"data.rank0.pending_loss_mask", tensorOf(mask, torch::kByte)},
          {"data.rank0.pending_lengths", tensorOf(lengths, torch::kLong)},
          {"data.rank0.pending_dataset_indices", tensorOf(indices, torch::kLong)}};
}

std::vector<PendingSample> pendingFrom(const SafeTensorsFile &file, uint64_t count) {
  std::vector<PendingSample> pending(count);
  if (count == 0)
    return pending;
  const torch::Tensor tokens = file.tensor("data.rank0.pending_tokens").contiguous();
  const torch::Tensor mask = file.tensor("data.rank0.pending_loss_mask").contiguous();
  const torch::Tensor lengths = file.tensor("data.rank0.pending_lengths").contiguous();
  const torch::Tensor indices = file.tensor("data.rank0.pending_dataset_indices").contiguous();
  if (uint64_t(lengths.numel()) != count || uint64_t(indices.numel()) != count ||
      lengths.sum().item<int64_t>() != tokens.numel() || tokens.numel() != mask.numel())
    throw FormatError(file.path() + ": the pending samples' tensors disagree with trainer_state.json");
  const int32_t *token = tokens.data_ptr<int32_t>();
  const uint8_t *flag = mask.data_ptr<uint8_t>();
  for (uint64_t i = 0; i < count; ++i) {
    const int64_t length = lengths[int64_t(i)].item<int64_t>();
    pending[i].sample.tokens.assign(token, token + length);
    pending[i].sample.lossMask.assign(flag, flag + length);
    pending[i].datasetIndex = uint64_t(indices[int64_t(i)].item<int64_t>());
    token += length;
    flag += length;
  }
  return pending;
}

torch::Tensor cpuGeneratorState() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void setCpuGeneratorState(const torch::Tensor &state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state.clone());
}

/// `generators`: every rank's CPU generator state, by rank.
void writeCheckpoint(const std::string &directory, const TrainingPlan &plan,
                     const models::DFlashDrafter &drafter, const DrafterOptimizer &optimizer,
                     const RunState &state, const torch::Tensor &generators) {
  const int64_t worldSize = generators.size(0);
  drafter->save(directory, torch::kBFloat16);
  NamedTensors tensors;
  for (const auto &[name, tensor] : optimizer.state())
    tensors.push_back({"optimizer." + name, tensor});
  tensors.push_back({"rng.torch_cpu", generators});
  for (auto &entry : pendingTensors(state.data.pending))
    tensors.push_back(std::move(entry));
  saveSafeTensors((fs::path(directory) / checkpoint_files::kTrainingState).string(), tensors);

  JsonValue json = JsonValue::object();
  json["format"] = kTrainerStateFormat;
  json["dflex_version"] = versionString();
  json["step"] = state.step;
  json["skipped_steps"] = state.skippedSteps;
  json["consecutive_bad_steps"] = state.consecutiveBad;
  // The cursor is the same on every rank (TrainingData): one for all, and
  // a resume with another number of ranks continues the same row order.
  json["world_size"] = worldSize;
  JsonValue rank = JsonValue::object();
  rank["epoch"] = state.data.epoch;
  rank["position"] = state.data.position;
  rank["rows_in_epoch"] = state.data.rowsInEpoch;
  rank["pending_samples"] = uint64_t(state.data.pending.size());
  json["data"].push(std::move(rank));
  writeTextFile((fs::path(directory) / checkpoint_files::kTrainerState).string(), writeJson(json));
  writeTextFile((fs::path(directory) / checkpoint_files::kConfig).string(), toYaml(plan.config));
}

/// Restores a checkpoint into the optimizer (and so the drafter's
/// parameters) and the generator; returns the run state.
RunState readCheckpoint(const std::string &directory, const TrainConfig &config,
                        DrafterOptimizer &optimizer, int thisRank) {
  const std::string configPath = (fs::path(directory) / checkpoint_files::kConfig).string();
  const TrainConfig saved = loadTrainConfig(configPath);
  const std::vector<std::string> differing = differingKeys(saved, config, true);
  if (!differing.empty()) {
    std::string keys;
    for (const std::string &key : differing)
      keys += (keys.empty() ? "" : ", ") + key;
    throw FormatError("resume: " + directory + " was trained with a different configuration: " + keys +
                      " (see " + configPath + "; only lengths, intervals and devices may change)");
  }
  const std::string statePath = (fs::path(directory) / checkpoint_files::kTrainerState).string();
  const JsonValue json = readJsonFile(statePath);
  const JsonObject object(json, statePath);
  if (object.integer("format") != kTrainerStateFormat)
    object.fail("format", "is " + std::to_string(object.integer("format")) + ", this trainer reads " +
                              std::to_string(kTrainerStateFormat));
  RunState state;
  state.step = object.integer("step");
  state.skippedSteps = object.integer("skipped_steps");
  state.consecutiveBad = object.integer("consecutive_bad_steps");
  const JsonValue *ranks = json.find("data");
  if (!ranks || !ranks->isArray() || ranks->asArray().size() != 1)
    object.fail("data", "expected the run's data cursor");
  const JsonObject rank(ranks->asArray().front(), statePath + ": data[0]");
  state.data.epoch = rank.integer("epoch");
  state.data.position = uint64_t(rank.integer("position"));
  state.data.rowsInEpoch = uint64_t(rank.integer("rows_in_epoch"));

  const SafeTensorsFile tensors =
      SafeTensorsFile::open((fs::path(directory) / checkpoint_files::kTrainingState).string());
  std::map<std::string, torch::Tensor> optimizerState;
  for (const SafeTensorInfo &info : tensors.tensors())
    if (info.name.rfind("optimizer.", 0) == 0)
      optimizerState[info.name.substr(10)] = tensors.tensor(info.name);
  optimizer.loadState(optimizerState);
  // This rank's generator; on another number of ranks, a new rank takes
  // rank 0's (nothing in a step draws from it: anchors come from the row).
  const torch::Tensor generators = tensors.tensor("rng.torch_cpu");
  setCpuGeneratorState(generators.dim() == 1 ? generators
                                             : generators[thisRank < generators.size(0) ? thisRank : 0].contiguous());
  state.data.pending = pendingFrom(tensors, uint64_t(rank.integer("pending_samples")));
  return state;
}

// --- Metrics ------------------------------------------------------------------------

/// Peak bytes of each device since the last call (and resets the peak).
JsonValue peakMemory(const TrainingPlan &plan) {
  JsonValue peaks = JsonValue::object();
  std::vector<torch::Device> devices = {plan.targetDevice};
  if (plan.drafterDevice != plan.targetDevice)
    devices.push_back(plan.drafterDevice); // each read resets the peak: once per device
  for (const torch::Device &device : devices) {
    if (device.is_cuda()) {
      const int index = device.has_index() ? device.index() : 0;
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
      peaks["cuda:" + std::to_string(index)] =
          stats.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].peak;
      c10::cuda::CUDACachingAllocator::resetPeakStats(index);
    } else {
      rusage usage{};
      getrusage(RUSAGE_SELF, &usage);
      peaks["cpu"] = int64_t(usage.ru_maxrss) * 1024; // the process's peak resident set
    }
  }
  return peaks;
}

/// Sums over the updates of one log interval.
struct IntervalMetrics {
  int64_t updates = 0, applied = 0, tokens = 0;
  double lossSum = 0, gradNormSum = 0, seconds = 0, dataMs = 0;
  StepTimes times;
  BlockAccuracy accuracy;
  double learningRate = 0;

  void add(const StepMetrics &m, double dataMilliseconds, double stepSeconds) {
    ++updates;
    tokens += m.contextTokens;
    seconds += stepSeconds;
    dataMs += dataMilliseconds;
    learningRate = m.learningRate;
    times.featuresMs += m.times.featuresMs;
    times.transferMs += m.times.transferMs;
    times.forwardMs += m.times.forwardMs;
    times.backwardMs += m.times.backwardMs;
    times.optimizerMs += m.times.optimizerMs;
    if (!m.applied)
      return;
    ++applied;
    lossSum += m.loss;
    gradNormSum += m.gradNorm;
    const BlockAccuracy &a = m.accuracy;
    if (accuracy.correct.empty()) {
      accuracy.correct.assign(a.correct.size(), 0);
      accuracy.counted.assign(a.counted.size(), 0);
    }
    for (size_t k = 0; k < a.correct.size(); ++k) {
      accuracy.correct[k] += a.correct[k];
      accuracy.counted[k] += a.counted[k];
    }
    accuracy.blocks += a.blocks;
    accuracy.acceptedTokens += a.acceptedTokens;
  }
  double loss() const { return applied ? lossSum / double(applied) : NAN; }
  double tokensPerSecond() const { return seconds > 0 ? double(tokens) / seconds : 0; }
};

/// metrics.jsonl: one line per logged interval. On resume, lines past the
/// checkpoint's step are dropped (the file is rewritten atomically), so the
/// log reads as if the run had not been interrupted.
class MetricsLog {
public:
  MetricsLog(const std::string &directory, std::optional<int64_t> resumedStep)
      : path_((fs::path(directory) / "metrics.jsonl").string()) {
    fs::create_directories(directory);
    if (resumedStep && fs::exists(path_)) {
      std::ifstream in(path_);
      std::string line, kept;
      int64_t lineNumber = 0;
      while (std::getline(in, line)) {
        ++lineNumber;
        const JsonValue value = parseJsonText(line, path_ + ":" + std::to_string(lineNumber));
        if (JsonObject(value, path_).integer("step") > *resumedStep)
          break;
        kept += line + "\n";
      }
      writeTextFile(path_, kept);
    } else if (!resumedStep) {
      writeTextFile(path_, "");
    }
    out_.open(path_, std::ios::app);
    if (!out_)
      throw IoError("cannot append to '" + path_ + "'");
  }
  void append(const JsonValue &line) {
    out_ << writeJson(line, 0) << "\n";
    out_.flush();
  }

private:
  std::string path_;
  std::ofstream out_;
};

std::string formatDuration(double seconds) {
  const int64_t s = int64_t(seconds);
  char text[32];
  std::snprintf(text, sizeof text, "%02lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return text;
}

/// What the user reads: a redrawn bar on a terminal, else one line per log
/// interval.
class Progress {
public:
  Progress(std::ostream *out, bool bar, int64_t totalSteps)
      : out_(out), bar_(bar), total_(totalSteps) {}

  void update(int64_t step, double loss, double tau, double tokensPerSecond, double secondsPerStep,
              bool logLine) {
    if (!out_)
      return;
    const double eta = secondsPerStep * double(total_ - step);
    char text[256];
    std::snprintf(text, sizeof text, "step %lld/%lld  loss %.4f  tau %.3f  %.0f tok/s  ETA %s",
                  static_cast<long long>(step), static_cast<long long>(total_), loss, tau,
                  tokensPerSecond, formatDuration(eta).c_str());
    if (bar_) {
      const int width = 30, filled = int(width * step / std::max<int64_t>(total_, 1));
      *out_ << "\r[" << std::string(size_t(filled), '#') << std::string(size_t(width - filled), '.')
            << "] " << text << "\033[K" << std::flush;
    } else if (logLine) {
      *out_ << text << std::endl;
    }
  }
  void message(const std::string &text) {
    if (!out_)
      return;
    if (bar_)
      *out_ << "\r\033[K";
    *out_ << text << std::endl;
  }

private:
  std::ostream *out_;
  bool bar_;
  int64_t total_;
};

// --- Building the run ---------------------------------------------------------------

models::TargetModel loadTarget(const TrainingPlan &plan) {
  const TrainConfig &c = plan.config;
  models::TargetModelOptions options;
  options.dtype = plan.targetDtype;
  options.device = plan.targetDevice;
  if (plan.targetDevice.is_cuda() && !c.targetBundle.empty())
    options.attention = models::attentionHook(KernelBundle::openCached(c.targetBundle), c.targetFullSpec,
                                              c.targetSlidingSpec);
  if (plan.targetDevice.is_cuda() && !c.targetGatedDeltaBundle.empty())
    options.gatedDelta = models::gatedDeltaHook(GatedDeltaBundle::openCached(c.targetGatedDeltaBundle),
                                                c.targetGatedDeltaSpec);
  try {
    return models::TargetModel::load(c.targetDir, options);
  } catch (const FormatError &error) {
    throw FormatError(std::string("config: target.dir: ") + error.what());
  }
}

models::DFlashDrafter buildDrafter(const TrainingPlan &plan, const models::TargetModel &target) {
  models::DFlashDrafter drafter(plan.drafter, plan.target.hiddenSize, uint64_t(plan.config.seed));
  drafter->to(plan.drafterDevice, plan.drafterDtype);
  drafter->setTargetWeights(target.embedTokens().to(plan.drafterDevice, plan.drafterDtype),
                            target.lmHead().to(plan.drafterDevice, plan.drafterDtype));
  const TransformerConfig &d = plan.drafter.model;
  if (plan.drafterDevice.is_cuda() && d.numLayersOf(LayerKind::LinearAttention) < d.numHiddenLayers) {
    const TrainConfig &c = plan.config;
    const bool sliding = d.slidingWindow.has_value();
    drafter->setAttention(std::make_shared<models::BundleDrafterAttention>(
        KernelBundle::openCached(c.drafterBundle), c.drafterFullSpec,
        sliding ? c.drafterSlidingSpec : std::string(), drafterSlidingBundle(c)));
  }
  drafter->setGatedDelta(drafterGatedDeltaKernels(plan));
  return drafter;
}

std::string outOfMemoryAdvice(const TrainingPlan &plan, int64_t step, const TrainingBatch &batch,
                              const std::string &what) {
  std::ostringstream out;
  out << "step " << step << ": out of memory (" << what << ")\n"
      << "the step's shapes: context [" << batch.tokens.size(0) << ", " << batch.tokens.size(1)
      << "], blocks [" << batch.anchors.size(0) << ", " << batch.anchors.size(1) << "] of "
      << plan.drafter.dflash.blockSize << " positions\n"
      << plan.describe()
      << "to fit: lower data.token_budget or data.max_anchors (use optimizer.grad_accumulation to keep "
         "the tokens per update), or put the drafter on its own GPU (devices: [cuda:0, cuda:1])\n"
      << "no checkpoint was written by this failure; earlier ones are intact";
  return out.str();
}

/// Updates of the run: train.max_steps, else the epochs' rows (of all
/// ranks) in updates of gradAccumulation rows per rank.
int64_t totalUpdates(const TrainConfig &c, uint64_t epochRows, int worldSize) {
  if (c.maxSteps > 0)
    return c.maxSteps;
  const int64_t rowsPerUpdate = c.gradAccumulation * worldSize;
  return std::max<int64_t>(1, (c.epochs * int64_t(epochRows) + rowsPerUpdate - 1) / rowsPerUpdate);
}

/// Ranks that hold different weights have diverged (a bug, or hardware):
/// stop rather than train on.
void checkRanksAgree(DataParallel &ranks, const DrafterOptimizer &optimizer, int64_t step) {
  if (ranks.worldSize() == 1)
    return;
  const std::array<double, 2> mine = optimizer.checksum();
  const std::vector<double> low = ranks.gather(mine[0], "weight checksums");
  const std::vector<double> high = ranks.gather(mine[1], "weight checksums");
  for (int r = 1; r < ranks.worldSize(); ++r)
    if (low[size_t(r)] != low[0] || high[size_t(r)] != high[0])
      throw TrainingAborted("step " + std::to_string(step) + ": the weights of rank " + std::to_string(r) +
                            " differ from rank 0's (their bit-pattern checksums differ)");
}

} // namespace

std::string dryRun(const TrainingPlan &plan) {
  checkDevicesExist(plan, int64_t(torch::cuda::device_count()));
  const TrainingData data(plan.config, plan.target.vocabSize, 0, 1);
  const uint64_t rows = data.countEpochRows();
  return plan.describe() + "data: " + data.path() + ": " + std::to_string(rows) +
         " rows per epoch, every sample valid; " +
         std::to_string(totalUpdates(plan.config, rows, plan.ranks.worldSize)) + " updates\n";
}

std::string batchFileName(int64_t update, int rank, int64_t micro) {
  char name[96];
  std::snprintf(name, sizeof name, "batch-%08lld-rank%d-micro%lld.safetensors", static_cast<long long>(update),
                rank, static_cast<long long>(micro));
  return name;
}

void writeTrainingBatch(const std::string &path, const TrainingBatch &batch) {
  saveSafeTensors(path, {{"tokens", batch.tokens},
                         {"position_ids", batch.positionIds},
                         {"document_ids", batch.documentIds},
                         {"loss_mask", batch.lossMask},
                         {"cu_seqlens", batch.cuSeqlens},
                         {"anchors", batch.anchors},
                         {"block_valid", batch.blockValid},
                         {"context_start", batch.contextStart},
                         {"block_tokens", batch.blockTokens},
                         {"block_position_ids", batch.blockPositionIds},
                         {"labels", batch.labels},
                         {"weights", batch.weights}});
}

TrainResult train(const TrainingPlan &plan, const TrainerOptions &options) {
  const TrainConfig &c = plan.config;
  checkDevicesExist(plan, int64_t(torch::cuda::device_count()));
  // Rank 0 writes checkpoints and logs; every rank takes the same steps.
  DataParallel ranks(plan.ranks, plan.drafterDevice, std::chrono::seconds(c.distributedTimeoutSeconds));
  const bool leader = ranks.rank() == 0;
  std::ostream *out = leader ? options.out : nullptr;
  Progress progress(out, options.progressBar, 0);

  // The leader removes leftovers of interrupted writes before others look.
  std::optional<CheckpointStore> store;
  if (leader)
    store.emplace(c.checkpointDir, c.keepLast);
  ranks.sum(0.0, "checkpoint directory opened");
  if (!leader)
    store.emplace(c.checkpointDir, c.keepLast);
  std::optional<std::string> resumeFrom;
  if (options.resume)
    resumeFrom = store->resolve(*options.resume);

  // Held-out prompts of the periodic evaluation, checked before the first step.
  std::vector<std::vector<int64_t>> evalPrompts;
  if (c.evalInterval > 0)
    evalPrompts = readPrompts(c.evalPrompts, c.targetDir, plan.target.vocabSize);

  // Data first: bad samples are named before anything heavy loads.
  TrainingData data(c, plan.target.vocabSize, ranks.rank(), ranks.worldSize());
  const uint64_t epochRows = data.countEpochRows();
  const int64_t totalSteps = totalUpdates(c, epochRows, ranks.worldSize());
  const LearningRateSchedule schedule =
      LearningRateSchedule::warmupCosine(c.learningRate, c.warmupRatio, totalSteps);

  const models::TargetModel target = loadTarget(plan);
  models::DFlashDrafter drafter = buildDrafter(plan, target);
  AdamWOptions adamw;
  adamw.beta1 = c.betas[0];
  adamw.beta2 = c.betas[1];
  adamw.eps = c.eps;
  adamw.weightDecay = c.weightDecay;
  adamw.gradClip = c.gradClip;
  DrafterOptimizer optimizer(drafter->named_parameters().pairs(), adamw);

  RunState state;
  if (resumeFrom) {
    state = readCheckpoint(*resumeFrom, c, optimizer, ranks.rank());
    data = TrainingData(c, plan.target.vocabSize, ranks.rank(), ranks.worldSize(), std::move(state.data));
  }
  const std::string logDir = c.logDir.empty() ? c.checkpointDir : c.logDir;
  std::optional<MetricsLog> metrics;
  if (leader)
    metrics.emplace(logDir, resumeFrom ? std::optional<int64_t>(state.step) : std::nullopt);

  progress = Progress(out, options.progressBar, totalSteps);
  progress.message((resumeFrom ? "resuming " + *resumeFrom + " at step " + std::to_string(state.step)
                               : "training " + std::to_string(totalSteps) + " updates (" +
                                     std::to_string(epochRows) + " rows per epoch)") +
                   (ranks.worldSize() > 1 ? " on " + std::to_string(ranks.worldSize()) + " ranks" : ""));

  BlockOptions blocks;
  blocks.blockSize = c.blockSize;
  blocks.maxAnchors = c.maxAnchors;
  blocks.maskTokenId = int32_t(c.maskTokenId);
  blocks.gamma = c.lossGamma;
  // The target computes the next update's features while the drafter
  // trains on this one's.
  FeaturePipeline pipeline(target, plan.drafter.dflash.targetLayerIds, plan.drafterDevice,
                           size_t(2 * c.gradAccumulation));
  DrafterStep step(drafter, optimizer, [&](const TrainingBatch &) { return pipeline.next(); }, {},
                   &ranks);
  struct Update {
    std::vector<TrainingBatch> microBatches;
    DataCursor cursorAfter; // where the data stands once this update is done
    double dataMs = 0;
  };
  if (options.writeBatches)
    fs::create_directories(*options.writeBatches);
  int64_t updatesRead = state.step;
  auto readUpdate = [&] {
    const Clock::time_point start = Clock::now();
    Update update;
    ++updatesRead;
    for (int64_t micro = 0; micro < c.gradAccumulation; ++micro) {
      const PackedRow row = data.next();
      update.microBatches.push_back(makeTrainingBatch({row}, blocks, mixSeed(uint64_t(c.seed), data.rowKey())));
      if (options.writeBatches)
        writeTrainingBatch((fs::path(*options.writeBatches) / batchFileName(updatesRead, ranks.rank(), micro)).string(),
                           update.microBatches.back());
      pipeline.submit(update.microBatches.back());
    }
    update.cursorAfter = data.cursor();
    update.dataMs = secondsSince(start) * 1e3;
    return update;
  };
  state.data = data.cursor();

  TrainResult result;
  auto checkpoint = [&] { // state.data: the same on every rank
    const torch::Tensor generators = ranks.gatherRows(cpuGeneratorState(), "generator states");
    if (leader) {
      store->save(state.step, [&](const std::string &directory) {
        writeCheckpoint(directory, plan, drafter, optimizer, state, generators);
      });
    }
    ranks.sum(0.0, "checkpoint written");
    result.checkpoint = (fs::path(c.checkpointDir) / CheckpointStore::nameOf(state.step)).string();
    progress.message("checkpoint " + result.checkpoint);
    if (leader && options.afterCheckpoint && state.step > 0) // the initial one has no metrics to report
      options.afterCheckpoint();
  };
  if (options.checkpointInitial && !resumeFrom)
    checkpoint();
  int64_t lastCheckpoint = state.step;
  IntervalMetrics interval;
  double secondsPerStep = 0;
  peakMemory(plan); // the intervals' peaks start here
  std::deque<Update> ahead;
  if (state.step < totalSteps)
    ahead.push_back(readUpdate());

  while (state.step < totalSteps) {
    // A signal to any rank stops them all, after the same step.
    if (ranks.any(options.stop && options.stop->load(), "stop request")) {
      result.interrupted = true;
      break;
    }
    const Clock::time_point start = Clock::now();
    if (state.step + 1 < totalSteps)
      ahead.push_back(readUpdate());
    const Update &update = ahead.front();
    const double dataMs = ahead.back().dataMs;

    StepMetrics m;
    try {
      m = step.run(update.microBatches, schedule.at(state.step));
    } catch (const c10::OutOfMemoryError &error) {
      throw TrainingAborted(outOfMemoryAdvice(plan, state.step, update.microBatches.front(),
                                              error.what_without_backtrace()));
    }
    ++state.step;
    state.data = update.cursorAfter;
    ahead.pop_front();
    if (m.applied) {
      state.consecutiveBad = 0;
      result.lastLoss = m.loss;
    } else {
      ++state.skippedSteps;
      ++state.consecutiveBad;
      progress.message("step " + std::to_string(state.step) + ": skipped, non-finite " + m.badTensor);
      if (state.consecutiveBad >= c.maxBadSteps)
        throw TrainingAborted(
            "step " + std::to_string(state.step) + ": " + std::to_string(state.consecutiveBad) +
            " steps in a row had a non-finite loss or gradient (the last: " + m.badTensor +
            "); stopping (train.max_bad_steps). " +
            (result.checkpoint.empty() && lastCheckpoint == 0
                 ? std::string("No checkpoint was written yet.")
                 : "The last checkpoint is intact: resume from it with a lower optimizer.lr."));
    }
    const double stepSeconds = secondsSince(start);
    secondsPerStep = secondsPerStep == 0 ? stepSeconds : 0.9 * secondsPerStep + 0.1 * stepSeconds;
    interval.add(m, dataMs, stepSeconds);

    // Rank 0 evaluates by real speculative decoding; the others wait at the
    // next collective.
    const bool evalNow = c.evalInterval > 0 && state.step % c.evalInterval == 0;
    std::optional<eval::AcceptanceSummary> evaluation;
    if (evalNow && leader) {
      eval::GenerationOptions generation;
      generation.maxNewTokens = c.evalMaxNewTokens;
      generation.stopTokens = target.config().eosTokenIds;
      std::vector<eval::Generation> generations;
      for (const std::vector<int64_t> &prompt : evalPrompts)
        generations.push_back(eval::speculativeDecode(target, *drafter, prompt, generation));
      evaluation = eval::summarize(generations, c.blockSize);
      progress.message("step " + std::to_string(state.step) + ": speculative decoding of " +
                       std::to_string(evalPrompts.size()) + " held-out prompts: tau " +
                       std::to_string(evaluation->tau));
    }
    const bool logNow = state.step % c.logInterval == 0 || state.step == totalSteps || evalNow;
    progress.update(state.step, interval.loss(), interval.accuracy.acceptanceLength(),
                    interval.tokensPerSecond(), secondsPerStep, logNow);
    if (logNow) {
      JsonValue line = JsonValue::object();
      line["step"] = state.step;
      line["epoch"] = data.cursor().epoch;
      line["time"] = wallClockSeconds();
      line["loss"] = interval.loss();
      std::vector<double> accuracy = interval.accuracy.byPosition();
      if (accuracy.empty()) // no update applied in the interval
        accuracy.assign(size_t(c.blockSize - 1), NAN);
      for (double value : accuracy)
        line["accuracy"].push(value);
      line["tau"] = interval.accuracy.acceptanceLength();
      if (evaluation) {
        line["eval_tau"] = evaluation->tau;
        for (double share : evaluation->acceptedAtLeast)
          line["eval_accepted_at_least_k"].push(share);
      }
      line["lr"] = interval.learningRate;
      line["grad_norm"] = interval.applied ? interval.gradNormSum / double(interval.applied) : NAN;
      line["tokens_per_s"] = interval.tokensPerSecond();
      line["skipped"] = interval.applied == 0;
      const double per = 1.0 / double(interval.updates);
      JsonValue &times = line["times_ms"];
      times = JsonValue::object();
      const PipelineTimes pair = pipeline.take();
      times["data"] = interval.dataMs * per;
      times["target_forward"] = pair.targetForwardMs * per;
      times["target_idle"] = pair.targetIdleMs * per;
      times["drafter_wait"] = interval.times.featuresMs * per;
      times["feature_copy"] = pair.copyMs * per;
      times["transfer"] = interval.times.transferMs * per;
      times["drafter_forward"] = interval.times.forwardMs * per;
      times["backward"] = interval.times.backwardMs * per;
      times["optimizer"] = interval.times.optimizerMs * per;
      if (ranks.connected())
        times["all_reduce"] = interval.times.allReduceMs * per;
      line["peak_memory_bytes"] = peakMemory(plan);
      if (metrics)
        metrics->append(line);
      interval = IntervalMetrics();
      checkRanksAgree(ranks, optimizer, state.step);
    }
    if (state.step % c.checkpointInterval == 0 || state.step == totalSteps) {
      checkpoint();
      lastCheckpoint = state.step;
    }
  }
  pipeline.drain();
  if (state.step > lastCheckpoint)
    checkpoint();
  if (options.progressBar && options.out)
    *options.out << "\n";
  result.steps = state.step;
  result.skippedSteps = state.skippedSteps;
  ranks.shutdown();
  return result;
}

} // namespace dflex::runtime
