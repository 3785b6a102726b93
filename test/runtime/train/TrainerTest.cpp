// The training run on a tiny Qwen3 target (random weights from
// transformers) and a tiny drafter, on the CPU: the loss falls, an
// interrupted and resumed run is bitwise the uninterrupted one, resuming
// with another configuration is refused, the checkpoint is the serving
// format and reloads into the same drafter, non-finite steps abort, and bad
// data is named before the first step.
#include "TestSupport.h"
#include "models/ModelTestSupport.h"

#include "dflex/Support/Error.h"
#include "dflex/Support/JsonObject.h"
#include "dflex/runtime/checkpoint/SafeTensors.h"
#include "dflex/runtime/data/TokenData.h"
#include "dflex/runtime/models/Drafter.h"
#include "dflex/runtime/models/TargetModel.h"
#include "dflex/runtime/support/Random.h"
#include "dflex/runtime/train/DrafterInputs.h"
#include "dflex/runtime/train/DrafterStep.h"
#include "dflex/runtime/train/FeaturePipeline.h"
#include "dflex/runtime/train/Trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::runtime::test::TempDir;

namespace {

namespace fs = std::filesystem;

/// The tiny Qwen3 target of target_reference.py (vocab 512, hidden 64, 3
/// layers), made once for all tests.
std::string targetDir() { return test::referenceTarget("qwen3"); }

/// Samples a drafter can learn: arithmetic progressions of a few strides.
std::vector<TokenSample> learnableSamples(size_t count, uint64_t seed) {
  SplitMix64 random(seed);
  std::vector<TokenSample> samples(count);
  for (TokenSample &sample : samples) {
    const int32_t start = int32_t(random.below(400)), stride = int32_t(1 + random.below(3));
    const size_t length = 12 + random.below(28);
    for (size_t i = 0; i < length; ++i) {
      sample.tokens.push_back((start + stride * int32_t(i)) % 500);
      sample.lossMask.push_back(i >= 2);
    }
  }
  return samples;
}

std::string writeJsonl(const TempDir &dir, const std::vector<TokenSample> &samples) {
  const std::string path = dir.file("data.jsonl");
  std::ofstream out(path);
  for (const TokenSample &sample : samples) {
    out << "{\"input_ids\": [";
    for (size_t i = 0; i < sample.tokens.size(); ++i)
      out << (i ? ", " : "") << sample.tokens[i];
    out << "], \"loss_mask\": [";
    for (size_t i = 0; i < sample.lossMask.size(); ++i)
      out << (i ? ", " : "") << int(sample.lossMask[i]);
    out << "]}\n";
  }
  return path;
}

std::string writeDataset(const TempDir &dir, const std::vector<TokenSample> &samples) {
  const std::string path = dir.file("dataset");
  TokenDatasetWriter writer(path, 512, 400); // several shards
  for (size_t i = 0; i < samples.size(); ++i)
    writer.add(samples[i], "sample " + std::to_string(i));
  writer.finish();
  return path;
}

TrainConfig tinyConfig(const std::string &data, const std::string &run,
                       std::vector<std::string> overrides = {}) {
  std::vector<std::string> settings = {
      "target.dir=" + targetDir(), "target.dtype=float32", "drafter.dtype=float32",
      "drafter.num_layers=2", "drafter.layer_types=[full_attention, sliding_attention]",
      "drafter.sliding_window=8", "drafter.intermediate_size=96", "drafter.target_layer_ids=[0, 1]",
      "drafter.block_size=4", "drafter.mask_token_id=511", "data.path=" + data,
      "data.token_budget=64", "data.max_anchors=8", "optimizer.lr=3e-3", "optimizer.warmup_ratio=0.1",
      "train.max_steps=40", "checkpoint.dir=" + run, "checkpoint.interval=20", "log.interval=1"};
  settings.insert(settings.end(), overrides.begin(), overrides.end());
  return loadTrainConfig("", settings);
}

std::vector<dflex::JsonValue> metricLines(const std::string &run) {
  std::ifstream in(run + "/metrics.jsonl");
  std::vector<dflex::JsonValue> lines;
  std::string line;
  while (std::getline(in, line))
    lines.push_back(dflex::parseJsonText(line, "metrics.jsonl"));
  return lines;
}

std::vector<double> losses(const std::string &run) {
  std::vector<double> values;
  for (const dflex::JsonValue &line : metricLines(run))
    values.push_back(line.find("loss")->asNumber());
  return values;
}

} // namespace

TEST(Trainer, TheLossFalls) {
  TempDir dir;
  const TrainConfig config = tinyConfig(writeJsonl(dir, learnableSamples(60, 1)), dir.file("run"),
                                        {"train.max_steps=100", "checkpoint.interval=50", "optimizer.lr=1e-2"});
  const TrainResult result = train(planTraining(config), {});
  EXPECT_EQ(result.steps, 100);
  EXPECT_FALSE(result.interrupted);
  const std::vector<double> loss = losses(dir.file("run"));
  ASSERT_EQ(loss.size(), 100u);
  const double first = (loss[0] + loss[1] + loss[2]) / 3, last = (loss[97] + loss[98] + loss[99]) / 3;
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;

  const std::vector<dflex::JsonValue> lines = metricLines(dir.file("run"));
  const dflex::JsonObject line(lines.back(), "last line");
  EXPECT_EQ(lines.back().find("accuracy")->asArray().size(), 3u);
  EXPECT_GE(line.number("tau"), 1.0);
  EXPECT_LE(line.number("tau"), 4.0);
  EXPECT_GT(line.number("tokens_per_s"), 0);
  for (const char *part : {"data", "target_forward", "transfer", "drafter_forward", "backward", "optimizer"})
    EXPECT_TRUE(line.object("times_ms").hasValue(part)) << part;
  EXPECT_GT(line.object("peak_memory_bytes").integer("cpu"), 0);
  // Checkpoints at 50 and 100.
  EXPECT_EQ(result.checkpoint, dir.file("run") + "/step-00000100");
  EXPECT_TRUE(fs::exists(dir.file("run") + "/step-00000050"));
}

TEST(Trainer, AMixedDrafterWithAGatedDeltaLayerLearns) {
  // A gated-delta and a full-attention layer on the Qwen3 target (hidden
  // 64, no gated-delta shapes of its own): the shapes derive from the hidden
  // size, the plan counts the layer, the loss falls, and the checkpoint
  // carries the shapes and reloads.
  TempDir dir;
  const std::string data = writeJsonl(dir, learnableSamples(60, 11));
  const std::string mixed = "drafter.layer_types=[linear_attention, full_attention]";
  test::expectError<FormatError>(
      [&] { planTraining(tinyConfig(data, dir.file("run"), {mixed, "drafter.linear_num_key_heads=2"})); },
      {"drafter.linear_num_value_heads", "1 is not a multiple of the 2 key heads"});
  const TrainingPlan plan = planTraining(tinyConfig(
      data, dir.file("run"), {mixed, "train.max_steps=60", "checkpoint.interval=60", "optimizer.lr=3e-2"}));
  ASSERT_TRUE(plan.drafter.model.gatedDelta.has_value());
  const GatedDeltaConfig &g = *plan.drafter.model.gatedDelta;
  EXPECT_EQ(std::vector<int64_t>({g.numKeyHeads, g.numValueHeads, g.keyHeadDim, g.valueHeadDim, g.convKernelDim}),
            std::vector<int64_t>({1, 1, 64, 64, 4}));
  int64_t parameters = 0;
  for (const torch::Tensor &p : models::DFlashDrafter(plan.drafter, plan.target.hiddenSize)->parameters())
    parameters += p.numel();
  EXPECT_EQ(plan.drafterParameters, uint64_t(parameters));
  EXPECT_NE(plan.describe().find("gated-delta states at the anchors"), std::string::npos) << plan.describe();
  // On CUDA the gated-delta layers need a bundle of the op's spec too,
  // unless the spec is "" (the LibTorch rule); then only attention layers
  // need the drafter's bundle.
  const std::string gatedOnly = "drafter.layer_types=[linear_attention, linear_attention]";
  test::expectError<FormatError>(
      [&] { planTraining(tinyConfig(data, dir.file("run"), {gatedOnly, "devices=[cuda]"})); },
      {"kernels.drafter_gated_delta_bundle: is required on CUDA", "drafter_gated_delta_spec"});
  const TrainingPlan libtorch = planTraining(tinyConfig(
      data, dir.file("run"), {gatedOnly, "devices=[cuda]", "kernels.drafter_gated_delta_spec=\"\""}));
  EXPECT_NE(libtorch.describe().find("conv 4 (LibTorch rule)"), std::string::npos) << libtorch.describe();

  const TrainResult result = train(plan, {});
  // The first 3 steps against the last 10 (13.2 -> 6.9; two full-attention
  // layers: 13.2 -> 6.8).
  const std::vector<double> loss = losses(dir.file("run"));
  ASSERT_EQ(loss.size(), 60u);
  const double first = (loss[0] + loss[1] + loss[2]) / 3;
  const double last = std::accumulate(loss.end() - 10, loss.end(), 0.0) / 10;
  EXPECT_LT(last, 0.65 * first) << first << " -> " << last;
  const dflex::JsonValue json = dflex::readJsonFile(result.checkpoint + "/config.json");
  const dflex::JsonObject top(json, "config.json");
  EXPECT_EQ(top.strings("layer_types"), (std::vector<std::string>{"linear_attention", "full_attention"}));
  EXPECT_EQ(top.integer("linear_value_head_dim"), 64);
  const auto served = models::DFlashDrafterImpl::load(result.checkpoint);
  EXPECT_TRUE(served->named_parameters().contains("layers.0.linear_attn.in_proj_qkv.weight"));
}

TEST(Trainer, AResumedRunIsBitwiseTheUninterruptedOne) {
  // A binary dataset (shuffled per epoch, several shards), two micro-steps
  // per update and an epoch boundary inside the run: every part of the
  // cursor matters.
  TempDir dir;
  const std::string data = writeDataset(dir, learnableSamples(30, 2));
  const std::vector<std::string> settings = {"optimizer.grad_accumulation=2", "train.max_steps=14",
                                             "checkpoint.interval=5"};
  TrainerOptions writing;
  writing.writeBatches = dir.file("whole-batches");
  train(planTraining(tinyConfig(data, dir.file("whole"), settings)), writing);

  std::atomic<bool> stop{false};
  TrainerOptions interrupted;
  interrupted.writeBatches = dir.file("parts-batches");
  interrupted.stop = &stop;
  interrupted.afterCheckpoint = [&] { stop = true; };
  const TrainResult first = train(planTraining(tinyConfig(data, dir.file("parts"), settings)), interrupted);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.steps, 5);
  TrainerOptions resumed;
  resumed.resume = "latest";
  resumed.writeBatches = dir.file("parts-batches");
  const TrainResult second = train(planTraining(tinyConfig(data, dir.file("parts"), settings)), resumed);
  EXPECT_EQ(second.steps, 14);

  const std::vector<double> whole = losses(dir.file("whole")), parts = losses(dir.file("parts"));
  ASSERT_EQ(whole.size(), 14u);
  ASSERT_EQ(parts.size(), 14u);
  for (size_t i = 0; i < whole.size(); ++i)
    EXPECT_EQ(whole[i], parts[i]) << "step " << i + 1; // bitwise: no tolerance
  EXPECT_TRUE(test::readBytes(dir.file("whole") + "/step-00000014/model.safetensors") ==
              test::readBytes(dir.file("parts") + "/step-00000014/model.safetensors"));
  // Optimizer state and data cursor alike (the generator's state is the
  // process's: other tests ran before the first run).
  const SafeTensorsFile whole14 = SafeTensorsFile::open(dir.file("whole") + "/step-00000014/training_state.safetensors");
  const SafeTensorsFile parts14 = SafeTensorsFile::open(dir.file("parts") + "/step-00000014/training_state.safetensors");
  ASSERT_EQ(whole14.tensors().size(), parts14.tensors().size());
  for (const SafeTensorInfo &info : whole14.tensors())
    if (info.name != "rng.torch_cpu")
      EXPECT_TRUE(torch::equal(whole14.tensor(info.name), parts14.tensor(info.name))) << info.name;

  // The batches each run wrote: one file per micro-step, the resumed run's
  // continuing the interrupted one's, byte for byte the uninterrupted run's;
  // a block's labels are the tokens after its anchor.
  for (int64_t update = 1; update <= 14; ++update)
    for (int64_t micro = 0; micro < 2; ++micro) {
      const std::string name = batchFileName(update, 0, micro);
      ASSERT_TRUE(fs::exists(dir.file("parts-batches") + "/" + name)) << name;
      EXPECT_TRUE(test::readBytes(dir.file("whole-batches") + "/" + name) ==
                  test::readBytes(dir.file("parts-batches") + "/" + name))
          << name;
    }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.file("whole-batches")), fs::directory_iterator()), 28);
  const SafeTensorsFile batch = SafeTensorsFile::open(dir.file("whole-batches") + "/" + batchFileName(9, 0, 1));
  const torch::Tensor tokens = batch.tensor("tokens"), anchors = batch.tensor("anchors");
  const torch::Tensor labels = batch.tensor("labels"), weights = batch.tensor("weights");
  EXPECT_EQ(tokens.sizes(), torch::IntArrayRef({1, 64}));
  int64_t checked = 0;
  for (int64_t n = 0; n < anchors.size(1); ++n)
    for (int64_t k = 0; k < labels.size(2); ++k)
      if (weights[0][n][k].item<float>() > 0) {
        EXPECT_EQ(labels[0][n][k].item<int64_t>(), tokens[0][anchors[0][n].item<int64_t>() + k].item<int64_t>());
        ++checked;
      }
  EXPECT_GT(checked, 0);
}

TEST(Trainer, ResumingWithAnotherConfigurationIsRefusedNamingTheKey) {
  TempDir dir;
  const std::string data = writeJsonl(dir, learnableSamples(20, 3));
  train(planTraining(tinyConfig(data, dir.file("run"), {"train.max_steps=2"})), {});
  TrainerOptions resume;
  resume.resume = "latest";
  test::expectError<FormatError>(
      [&] { train(planTraining(tinyConfig(data, dir.file("run"), {"train.max_steps=4", "loss.gamma=5"})), resume); },
      {"loss.gamma", "different configuration"});
  // Lengths and intervals may change.
  const TrainResult longer =
      train(planTraining(tinyConfig(data, dir.file("run"), {"train.max_steps=4", "log.interval=2"})), resume);
  EXPECT_EQ(longer.steps, 4);
}

TEST(Trainer, TheCheckpointIsTheServingFormatAndReloadsIntoTheSameDrafter) {
  TempDir dir;
  const TrainConfig config = tinyConfig(writeJsonl(dir, learnableSamples(20, 4)), dir.file("run"),
                                        {"train.max_steps=3", "drafter.dtype=bfloat16"});
  const TrainingPlan plan = planTraining(config);
  const std::string checkpoint = train(plan, {}).checkpoint;

  const dflex::JsonValue json = dflex::readJsonFile(checkpoint + "/config.json");
  const dflex::JsonObject top(json, "config.json");
  EXPECT_EQ(top.strings("architectures"), std::vector<std::string>{"DFlashDraftModel"});
  EXPECT_EQ(top.integer("block_size"), 4);
  EXPECT_EQ(top.integer("num_target_layers"), 3);
  EXPECT_EQ(top.object("dflash_config").integers("target_layer_ids"), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(top.object("dflash_config").integer("mask_token_id"), 511);
  EXPECT_EQ(top.strings("layer_types"), (std::vector<std::string>{"full_attention", "sliding_attention"}));
  EXPECT_EQ(top.integer("sliding_window"), 8);
  EXPECT_EQ(top.string("hidden_act"), "silu");
  EXPECT_EQ(top.string("dtype"), "bfloat16");
  EXPECT_FALSE(top.has("eagle_aux_hidden_state_layer_ids"));

  const SafeTensorsCheckpoint weights = SafeTensorsCheckpoint::open(checkpoint);
  EXPECT_TRUE(weights.contains("fc.weight"));
  EXPECT_TRUE(weights.contains("layers.1.self_attn.q_proj.weight"));
  EXPECT_FALSE(weights.contains("embed_tokens.weight"));
  for (const std::string &name : weights.names())
    EXPECT_EQ(weights.info(name).dtype, torch::kBFloat16) << name;

  // The served drafter is the trained one: its weights are the optimizer's
  // master weights in bf16, so its outputs are identical.
  auto served = models::DFlashDrafterImpl::load(checkpoint, torch::kBFloat16);
  models::DFlashDrafter trained(plan.drafter, plan.target.hiddenSize, 99);
  trained->to(torch::kBFloat16);
  const SafeTensorsFile state = SafeTensorsFile::open(checkpoint + "/training_state.safetensors");
  {
    torch::NoGradGuard noGrad;
    for (auto &[name, parameter] : trained->named_parameters().pairs())
      parameter.copy_(state.tensor("optimizer.master." + name));
  }
  const models::TargetModel target = [&] {
    models::TargetModelOptions options;
    options.dtype = torch::kBFloat16;
    return models::TargetModel::load(targetDir(), options);
  }();
  served->setTargetWeights(target.embedTokens(), target.lmHead());
  trained->setTargetWeights(target.embedTokens(), target.lmHead());
  BlockOptions blocks;
  blocks.blockSize = 4;
  blocks.maxAnchors = 8;
  blocks.maskTokenId = 511;
  PackedRow row;
  for (int32_t t = 0; t < 32; ++t) {
    row.tokens.push_back(3 * t % 500);
    row.lossMask.push_back(1);
    row.positionIds.push_back(t);
    row.documentIds.push_back(0);
  }
  row.documentStarts = {0, 32};
  row.sampleIndices = {0};
  row.numTokens = 32;
  const TrainingBatch batch = makeTrainingBatch({row}, blocks, 5);
  const torch::Tensor features = torch::randn({1, 32, 2 * 64}).to(torch::kBFloat16);
  const models::DrafterInputs inputs = drafterInputs(batch, features, torch::kCPU);
  torch::NoGradGuard noGrad;
  EXPECT_TRUE(torch::equal(served->forward(inputs), trained->forward(inputs)));
}

TEST(Trainer, NonFiniteStepsAreSkippedThenAbortTheRun) {
  TempDir dir;
  // A target whose embedding holds NaN: every context feature is NaN.
  fs::copy(targetDir(), dir.file("nan-target"), fs::copy_options::recursive);
  {
    const SafeTensorsCheckpoint original = SafeTensorsCheckpoint::open(dir.file("nan-target"));
    NamedTensors tensors;
    for (const std::string &name : original.names())
      tensors.push_back({name, original.tensor(name).clone()});
    for (auto &[name, tensor] : tensors)
      if (name == "model.embed_tokens.weight")
        tensor.fill_(NAN);
    saveSafeTensors(dir.file("nan-target") + "/model.safetensors", tensors);
  }
  TrainConfig config = tinyConfig(writeJsonl(dir, learnableSamples(20, 5)), dir.file("run"),
                                  {"train.max_bad_steps=3"});
  config.targetDir = dir.file("nan-target");
  test::expectError<TrainingAborted>([&] { train(planTraining(config), {}); },
                                          {"step 3", "3 steps in a row", "loss"});
  EXPECT_FALSE(fs::exists(dir.file("run") + "/latest"));
}

TEST(Trainer, BadDataIsNamedBeforeTheFirstStep) {
  TempDir dir;
  std::vector<TokenSample> samples = learnableSamples(20, 6);
  samples[13].tokens[4] = 700; // beyond the target's 512 tokens
  const TrainConfig config = tinyConfig(writeJsonl(dir, samples), dir.file("run"));
  test::expectError<FormatError>([&] { train(planTraining(config), {}); },
                                      {"data.jsonl:14", "700"});
  EXPECT_FALSE(fs::exists(dir.file("run") + "/metrics.jsonl"));
}

TEST(Trainer, PlanNamesTheKeyOfWhatDoesNotFitTheTarget) {
  TempDir dir;
  const std::string data = writeJsonl(dir, learnableSamples(4, 7));
  test::expectError<FormatError>(
      [&] { planTraining(tinyConfig(data, dir.file("run"), {"drafter.target_layer_ids=[0, 3]"})); },
      {"drafter.target_layer_ids", "layer 3"});
  test::expectError<FormatError>(
      [&] { planTraining(tinyConfig(data, dir.file("run"), {"drafter.mask_token_id=-1"})); },
      {"drafter.mask_token_id", "not set"});
  test::expectError<FormatError>(
      [&] { planTraining(tinyConfig(data, dir.file("run"), {"devices=[cuda]"})); },
      {"kernels.drafter_bundle", "required on CUDA"});
  const TrainingPlan plan = planTraining(tinyConfig(data, dir.file("run")));
  // The parameter count is the drafter's.
  models::DFlashDrafter drafter(plan.drafter, plan.target.hiddenSize);
  int64_t parameters = 0;
  for (const torch::Tensor &p : drafter->parameters())
    parameters += p.numel();
  EXPECT_EQ(plan.drafterParameters, uint64_t(parameters));
  const std::string text = plan.describe();
  EXPECT_NE(text.find("memory on cpu"), std::string::npos) << text;
  EXPECT_NE(text.find("AdamW master weights"), std::string::npos) << text;
}

TEST(Trainer, TheDrafterBundleMustServeTheDrafterShapesAndBlockSize) {
  const std::string bundle = test::exampleBundle("dflash"); // heads(32, 8) x 128, blocks of 16
  if (bundle.empty())
    GTEST_SKIP() << "needs the example bundles ($DFLEX_ATTENTION_BUNDLES or a build with dflex-compile)";
  TempDir dir;
  const std::string data = writeJsonl(dir, learnableSamples(4, 8));
  std::vector<std::string> cuda = {"devices=[cuda]", "drafter.dtype=bfloat16",
                                   "kernels.drafter_bundle=" + bundle,
                                   "drafter.layer_types=[full_attention, full_attention]"};
  test::expectError<FormatError>([&] { planTraining(tinyConfig(data, dir.file("run"), cuda)); },
                                 {"kernels.drafter_full_spec", "heads(32, 8) head_dim(128)", "heads(4, 2)"});
  for (const char *shape : {"drafter.num_attention_heads=32", "drafter.num_key_value_heads=8", "drafter.head_dim=128"})
    cuda.push_back(shape);
  test::expectError<FormatError>([&] { planTraining(tinyConfig(data, dir.file("run"), cuda)); },
                                 {"kernels.drafter_full_spec", "DFlash pattern of block_size 4"});
  cuda.push_back("drafter.block_size=16");
  EXPECT_NO_THROW(planTraining(tinyConfig(data, dir.file("run"), cuda)));
}

TEST(FeaturePipeline, FeaturesComeInOrderEqualToTheTargetsAndErrorsReachTheConsumer) {
  models::TargetModelOptions options;
  options.dtype = torch::kFloat;
  const models::TargetModel target = models::TargetModel::load(targetDir(), options);
  BlockOptions blocks;
  blocks.blockSize = 4;
  blocks.maskTokenId = 511;
  std::vector<TrainingBatch> batches;
  for (int b = 0; b < 4; ++b) {
    PackedRow row;
    for (int32_t t = 0; t < 24; ++t) {
      row.tokens.push_back((7 * t + 31 * b) % 500);
      row.lossMask.push_back(1);
      row.positionIds.push_back(t % 12);
      row.documentIds.push_back(t / 12);
    }
    row.documentStarts = {0, 12, 24};
    row.sampleIndices = {0, 1};
    row.numTokens = 24;
    batches.push_back(makeTrainingBatch({row}, blocks, uint64_t(b)));
  }
  const ContextFeatureProducer direct = targetFeatures(target, {0, 1});
  FeaturePipeline pipeline(target, {0, 1}, torch::kCPU, 2);
  pipeline.submit(batches[0]);
  pipeline.submit(batches[1]);
  EXPECT_TRUE(torch::equal(pipeline.next(), direct(batches[0])));
  pipeline.submit(batches[2]);
  EXPECT_TRUE(torch::equal(pipeline.next(), direct(batches[1])));
  EXPECT_TRUE(torch::equal(pipeline.next(), direct(batches[2])));
  EXPECT_EQ(pipeline.take().batches, 3);

  // What is queued when a run stops is dropped.
  pipeline.submit(batches[0]);
  pipeline.submit(batches[1]);
  pipeline.drain();
  pipeline.submit(batches[3]);
  EXPECT_TRUE(torch::equal(pipeline.next(), direct(batches[3])));

  TrainingBatch bad = batches[0];
  bad.tokens = bad.tokens.clone();
  bad.tokens[0][3] = 100000; // beyond the vocabulary: the target's forward throws
  pipeline.submit(bad);
  EXPECT_ANY_THROW(pipeline.next());
  pipeline.submit(batches[2]); // and the pipeline goes on
  EXPECT_TRUE(torch::equal(pipeline.next(), direct(batches[2])));
}

TEST(Trainer, DevicesBeyondTheVisibleGpusAreNamed) {
  const std::string bundle = test::exampleBundle("dflash");
  if (bundle.empty())
    GTEST_SKIP() << "needs the example bundles ($DFLEX_ATTENTION_BUNDLES or a build with dflex-compile)";
  TempDir dir;
  const std::string data = writeJsonl(dir, learnableSamples(4, 9));
  const std::vector<std::string> pairSettings = {
      "devices=[pair]", "drafter.dtype=bfloat16", "kernels.drafter_bundle=" + bundle,
      "drafter.layer_types=[full_attention, full_attention]", "drafter.num_attention_heads=32",
      "drafter.num_key_value_heads=8", "drafter.head_dim=128", "drafter.block_size=16"};
  RankEnvironment second;
  second.localRank = 1;
  second.localWorldSize = 2;
  second.rank = 1;
  second.worldSize = 2;
  const TrainingPlan pair = planTraining(tinyConfig(data, dir.file("run"), pairSettings), second);
  EXPECT_EQ(pair.targetDevice, torch::Device(torch::kCUDA, 2));
  EXPECT_EQ(pair.drafterDevice, torch::Device(torch::kCUDA, 3));
  test::expectError<FormatError>([&] { checkDevicesExist(pair, 3); },
                                 {"devices", "local rank 1 would use cuda:3", "4 GPUs are needed for 2 local rank(s)",
                                  "3 GPU(s) are visible"});
  EXPECT_NO_THROW(checkDevicesExist(pair, 4));
  const TrainingPlan cpu = planTraining(tinyConfig(data, dir.file("run")), second);
  EXPECT_NO_THROW(checkDevicesExist(cpu, 0));
}

TEST(Trainer, EvaluatesBySpeculativeDecodingOnHeldOutPrompts) {
  TempDir dir;
  const std::string data = writeJsonl(dir, learnableSamples(20, 10));
  {
    std::ofstream prompts(dir.file("prompts.jsonl"));
    prompts << "{\"input_ids\": [3, 6, 9, 12]}\n{\"input_ids\": [100, 101]}\n";
  }
  test::expectError<FormatError>(
      [&] { tinyConfig(data, dir.file("run"), {"log.eval_interval=5"}); },
      {"log.eval_prompts", "log.eval_interval = 5"});
  const TrainConfig config =
      tinyConfig(data, dir.file("run"), {"train.max_steps=10", "log.interval=3", "log.eval_interval=5",
                                         "log.eval_prompts=" + dir.file("prompts.jsonl"),
                                         "log.eval_max_new_tokens=6"});
  train(planTraining(config), {});
  std::vector<int64_t> evaluated;
  for (const dflex::JsonValue &line : metricLines(dir.file("run")))
    if (const dflex::JsonValue *tau = line.find("eval_tau")) {
      evaluated.push_back(line.find("step")->asInteger());
      EXPECT_GE(tau->asNumber(), 1.0);
      EXPECT_EQ(line.find("eval_accepted_at_least_k")->asArray().size(), 3u);
    }
  EXPECT_EQ(evaluated, (std::vector<int64_t>{5, 10}));
}
