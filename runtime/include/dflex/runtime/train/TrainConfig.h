// The trainer's configuration: every key once, with its type, default,
// range and help (trainConfigKeys), read from a YAML file and `--set
// key=value` overrides with dotted keys, as SpecForge users write them.
// Unknown keys, wrong types and out-of-range values are FormatErrors that
// name the key, where it was written (file:line:col, or the --set), and for
// an unknown key the closest valid one.
//
// Defaults follow the published DFlash recipe (SpecForge's qwen3-8b DFlash
// config): block 16, 512 anchors, loss decay gamma 7, AdamW lr 6e-4 with
// warmup ratio 0.04 then cosine, grad-norm clip 1.0, 6 epochs. Sizes left at
// 0 take the target's (hidden size, heads, head dim, intermediate size), and
// empty target_layer_ids spread over 1 .. L-3 (defaultTargetLayerIds).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace dflex::runtime {

struct TrainConfig {
  // target
  std::string targetDir;
  std::string targetDtype = "bfloat16";
  // drafter
  int64_t drafterLayers = 5;
  /// Per layer: full_attention, sliding_attention or linear_attention
  /// (gated delta); empty: all full_attention.
  std::vector<std::string> drafterLayerTypes;
  std::string drafterDtype = "bfloat16"; // trained in; optimizer state is float32
  int64_t slidingWindow = 2048;
  int64_t hiddenSize = 0;        // 0: the target's
  int64_t intermediateSize = 0;  // 0: the target's
  int64_t numAttentionHeads = 0; // 0: the target's
  int64_t numKeyValueHeads = 0;  // 0: the target's
  int64_t headDim = 0;           // 0: the target's
  // Shapes of linear_attention layers; 0: the target's (Qwen3.5), else
  // derived from the hidden size (TrainingPlan).
  int64_t linearNumKeyHeads = 0;
  int64_t linearNumValueHeads = 0;
  int64_t linearKeyHeadDim = 0;
  int64_t linearValueHeadDim = 0;
  int64_t linearConvKernelDim = 0;
  std::vector<int64_t> targetLayerIds; // empty: spread over 1 .. L-3
  int64_t blockSize = 16;
  int64_t maskTokenId = -1; // -1: the target tokenizer's mask token must be given
  // kernels (CUDA devices): bundles written by dflex-compile and their specs
  std::string drafterBundle;
  std::string drafterFullSpec = "drafter_attention";
  std::string drafterSlidingSpec = "drafter_sliding_window_attention";
  std::string drafterSlidingBundle; // empty: drafterBundle
  std::string drafterGatedDeltaBundle; // empty: drafterBundle
  std::string drafterGatedDeltaSpec = "drafter_gated_delta"; // empty: plain LibTorch
  std::string targetBundle; // empty: the target's attention in plain LibTorch
  std::string targetFullSpec = "document_attention";
  std::string targetSlidingSpec;
  std::string targetGatedDeltaBundle; // empty: the recurrence in plain LibTorch
  std::string targetGatedDeltaSpec;
  // data
  std::string dataset; // binary dataset directory or tokenized JSONL
  int64_t tokenBudget = 8192;
  int64_t maxAnchors = 512;
  // loss
  double lossGamma = 7.0;
  // optimizer (AdamW; fp32 master weights and moments)
  double learningRate = 6e-4;
  std::vector<double> betas = {0.9, 0.999}; // betas, eps and weight decay: torch.optim.AdamW's
  double eps = 1e-8;
  double weightDecay = 0.01;
  double warmupRatio = 0.04;
  double gradClip = 1.0;
  int64_t gradAccumulation = 1;
  // run
  int64_t epochs = 6;
  int64_t maxSteps = 0; // 0: the epochs decide
  int64_t seed = 0;
  int64_t maxBadSteps = 10; // consecutive NaN/Inf steps before aborting
  // checkpoints
  std::string checkpointDir = "checkpoints";
  int64_t checkpointInterval = 1000;
  int64_t keepLast = 3;
  // logging
  std::string logDir; // empty: checkpoint.dir
  int64_t logInterval = 10;
  int64_t evalInterval = 0; // 0: no periodic eval
  std::string evalPrompts;  // JSONL of held-out prompts (input_ids)
  int64_t evalMaxNewTokens = 64;
  /// "cpu", "cuda" (one GPU holding target and drafter), "cuda:N", or two
  /// devices: the target's, then the drafter's.
  std::vector<std::string> devices = {"cpu"};
  int64_t distributedTimeoutSeconds = 600; // a collective waits this long for the other ranks
};

/// One configuration key.
struct TrainConfigKey {
  using Field = std::variant<int64_t TrainConfig::*, double TrainConfig::*, std::string TrainConfig::*,
                             std::vector<int64_t> TrainConfig::*, std::vector<double> TrainConfig::*,
                             std::vector<std::string> TrainConfig::*>;
  const char *name; // dotted: "optimizer.lr"
  Field field;
  const char *help;
  /// Inclusive bounds of a number (of each element of a list of numbers).
  std::optional<double> min, max;
  /// The values a string (each element of a list of strings) may take;
  /// empty: any.
  std::vector<std::string> choices;
  /// May differ when resuming a run (lengths, intervals, devices).
  bool changesOnResume = false;
  /// What other trainers call it ("learning_rate"): an unknown key of that
  /// name suggests this one.
  const char *otherName = nullptr;
};

/// Every key, in the order --help and written configs list them.
const std::vector<TrainConfigKey> &trainConfigKeys();

/// The defaults with `path`'s YAML (if not empty) and then `overrides`
/// ("key=value", the value in YAML: 3, 1e-4, [1, 2], text) applied, then
/// checked (checkTrainConfig). Throws IoError when the file cannot be read,
/// FormatError naming the key and where it was written otherwise.
TrainConfig loadTrainConfig(const std::string &path, const std::vector<std::string> &overrides = {});

/// Checks what no single key's range says: list lengths against
/// drafter.num_layers, required keys. Throws FormatError naming the key.
void checkTrainConfig(const TrainConfig &config);

/// The configuration as YAML, every key (sections as nested maps): what a
/// checkpoint records and loadTrainConfig reads back to an equal config.
std::string toYaml(const TrainConfig &config);

/// The keys whose values differ; with `ignoreResumable`, not those that may
/// change on resume.
std::vector<std::string> differingKeys(const TrainConfig &a, const TrainConfig &b,
                                       bool ignoreResumable);

/// One line or more per key: name, type, default, range or choices, help.
std::string describeTrainConfigKeys();

bool operator==(const TrainConfig &a, const TrainConfig &b);

} // namespace dflex::runtime
