// Greedy speculative decoding on a tiny Qwen3 target (random weights from
// transformers), and a hybrid Qwen3.5 one: the tokens equal the target's own greedy decoding with an
// untrained drafter and with one trained on the target's outputs, which gets
// drafts accepted; the acceptance summary is the DFlash authors' tau.
#include "TestSupport.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/eval/SpeculativeDecoding.h"
#include "dflex/runtime/support/Random.h"
#include "dflex/runtime/train/Trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

using namespace dflex::runtime;
using dflex::runtime::test::TempDir;

namespace {

models::TargetModel loadTarget(const std::string &directory) {
  models::TargetModelOptions options;
  options.dtype = torch::kDouble; // argmax ties cannot flip between passes of other lengths
  return models::TargetModel::load(directory, options);
}

std::vector<std::vector<int64_t>> prompts(size_t count, uint64_t seed) {
  SplitMix64 random(seed);
  std::vector<std::vector<int64_t>> out(count);
  for (auto &prompt : out)
    for (size_t i = 0, n = 4 + random.below(8); i < n; ++i)
      prompt.push_back(int64_t(random.below(500)));
  return out;
}

std::shared_ptr<models::DFlashDrafterImpl> drafterFor(const models::TargetModel &target, const std::string &checkpoint) {
  std::shared_ptr<models::DFlashDrafterImpl> drafter =
      models::DFlashDrafterImpl::load(checkpoint, torch::kDouble);
  drafter->setTargetWeights(target.embedTokens(), target.lmHead());
  return drafter;
}

} // namespace

TEST(SpeculativeDecoding, IsLosslessAndATrainedDrafterGetsDraftsAccepted) {
  TempDir dir;
  // target_reference.py's tiny Qwen3 (vocab 512, hidden 64, 3 layers).
  const std::string targetDir = test::referenceTarget("qwen3");
  const models::TargetModel target = loadTarget(targetDir);
  eval::GenerationOptions options;
  options.maxNewTokens = 40;

  // The target's own greedy answers are the training data (regeneration).
  {
    std::ofstream data(dir.file("answers.jsonl"));
    for (const auto &prompt : prompts(40, 1)) {
      std::vector<int64_t> sample = prompt;
      const std::vector<int64_t> answer = eval::greedyDecode(target, prompt, options);
      sample.insert(sample.end(), answer.begin(), answer.end());
      data << "{\"input_ids\": [";
      for (size_t i = 0; i < sample.size(); ++i)
        data << (i ? ", " : "") << sample[i];
      data << "], \"loss_mask\": [";
      for (size_t i = 0; i < sample.size(); ++i)
        data << (i ? ", " : "") << (i >= prompt.size() ? 1 : 0);
      data << "]}\n";
    }
  }
  auto config = [&](const std::string &run, int64_t steps) {
    return loadTrainConfig("", {"target.dir=" + targetDir, "target.dtype=float32", "drafter.dtype=float32",
                                "drafter.num_layers=2", "drafter.intermediate_size=128",
                                "drafter.target_layer_ids=[0, 1]", "drafter.block_size=4",
                                "drafter.mask_token_id=511", "data.path=" + dir.file("answers.jsonl"),
                                "data.token_budget=128", "data.max_anchors=32", "optimizer.lr=3e-3",
                                "train.max_steps=" + std::to_string(steps), "checkpoint.dir=" + dir.file(run),
                                "log.interval=50"});
  };
  const std::string untrained = train(planTraining(config("untrained", 1)), {}).checkpoint;
  const std::string trained = train(planTraining(config("trained", 150)), {}).checkpoint;

  const std::vector<std::vector<int64_t>> heldOut = prompts(8, 2);
  double tau[2] = {0, 0};
  int index = 0;
  for (const std::string &checkpoint : {untrained, trained}) {
    const auto drafter = drafterFor(target, checkpoint);
    std::vector<eval::Generation> generations;
    for (const auto &prompt : heldOut) {
      eval::Generation g = eval::speculativeDecode(target, *drafter, prompt, options);
      EXPECT_EQ(g.tokens, eval::greedyDecode(target, prompt, options)) << checkpoint;
      generations.push_back(std::move(g));
    }
    const eval::AcceptanceSummary summary = eval::summarize(generations, 4);
    EXPECT_EQ(summary.tokens, int64_t(heldOut.size()) * options.maxNewTokens);
    ASSERT_EQ(summary.acceptedAtLeast.size(), 3u);
    EXPECT_GE(summary.acceptedAtLeast[0], summary.acceptedAtLeast[1]);
    EXPECT_GE(summary.acceptedAtLeast[1], summary.acceptedAtLeast[2]);
    tau[index++] = summary.tau;
    RecordProperty(index == 1 ? "untrained_tau" : "trained_tau", std::to_string(summary.tau));
  }
  EXPECT_GE(tau[0], 1.0);
  EXPECT_GT(tau[1], tau[0] + 0.3) << "untrained " << tau[0] << ", trained " << tau[1];

  // A stop token ends the response after it, as it ends the target's.
  const auto drafter = drafterFor(target, trained);
  const std::vector<int64_t> full = eval::greedyDecode(target, heldOut[0], options);
  eval::GenerationOptions stopping = options;
  stopping.stopTokens = {full[7]};
  const std::vector<int64_t> stopped = eval::speculativeDecode(target, *drafter, heldOut[0], stopping).tokens;
  EXPECT_EQ(stopped, eval::greedyDecode(target, heldOut[0], stopping));
  EXPECT_LE(stopped.size(), 8u);
  EXPECT_EQ(stopped.back(), full[7]);
  test::expectError<dflex::FormatError>(
      [&] { eval::speculativeDecode(target, *drafter, {3, 600}, options); }, {"prompt token 600", "512"});
}

TEST(SpeculativeDecoding, TauIsEachResponsesMeanThenTheirMean) {
  eval::Generation g;
  g.acceptedDrafts = {0, 3, 1};
  EXPECT_DOUBLE_EQ(g.acceptanceLength(), (1 + 4 + 2) / 3.0);
  const eval::AcceptanceSummary summary = eval::summarize({g, eval::Generation{{1, 2}, {3}}}, 4);
  EXPECT_DOUBLE_EQ(summary.tau, ((1 + 4 + 2) / 3.0 + 4) / 2);
  EXPECT_EQ(summary.acceptedAtLeast, (std::vector<double>{0.75, 0.5, 0.5}));
  EXPECT_EQ(summary.tokens, 2);
}

TEST(SpeculativeDecoding, IsLosslessOnAHybridGatedDeltaTarget) {
  const std::string targetDir = test::referenceTarget("qwen3_5");
  const models::TargetModel target = loadTarget(targetDir);
  const TrainingPlan plan = planTraining(loadTrainConfig(
      "", {"target.dir=" + targetDir, "drafter.num_layers=2", "drafter.target_layer_ids=[0, 2]",
           "drafter.block_size=4", "drafter.mask_token_id=511", "data.path=unused.jsonl"}));
  models::DFlashDrafter drafter(plan.drafter, plan.target.hiddenSize, 3);
  drafter->to(torch::kDouble);
  drafter->setTargetWeights(target.embedTokens(), target.lmHead());
  eval::GenerationOptions options;
  options.maxNewTokens = 12;
  for (const auto &prompt : prompts(3, 3))
    EXPECT_EQ(eval::speculativeDecode(target, *drafter, prompt, options).tokens,
              eval::greedyDecode(target, prompt, options));
}
