#include "dflex/runtime/eval/SpeculativeDecoding.h"

#include "dflex/Support/Error.h"

#include <torch/torch.h>

#include <algorithm>

namespace dflex::runtime::eval {

namespace {

torch::Tensor sequenceTensor(const std::vector<int64_t> &tokens, torch::Device device) {
  return torch::tensor(tokens, torch::kLong).view({1, -1}).to(device);
}

/// The target fed `tokens` after what `cache` holds: its greedy next token
/// after each of them, and (when `layers` is not empty) their context
/// features.
struct TargetPass {
  std::vector<int64_t> next;
  torch::Tensor features;
};

TargetPass runTarget(const models::TargetModel &target, models::TargetCache &cache,
                     const std::vector<int64_t> &tokens, const std::vector<int64_t> &layers) {
  models::TargetInputs inputs;
  inputs.inputIds = sequenceTensor(tokens, target.device());
  inputs.captureLayers = layers;
  inputs.computeLogits = true;
  const models::TargetOutputs out = target.forward(inputs, cache);
  TargetPass pass;
  const torch::Tensor next = out.logits[0].argmax(-1).cpu();
  pass.next.assign(next.data_ptr<int64_t>(), next.data_ptr<int64_t>() + next.numel());
  if (!layers.empty())
    pass.features = models::concatContextFeatures(out.hiddenStates);
  return pass;
}

/// Appends `token`; true when generation is over.
bool append(std::vector<int64_t> &generated, int64_t token, const GenerationOptions &options) {
  generated.push_back(token);
  return int64_t(generated.size()) >= options.maxNewTokens ||
         std::find(options.stopTokens.begin(), options.stopTokens.end(), token) != options.stopTokens.end();
}

void checkPrompt(const std::vector<int64_t> &prompt, const models::TargetModel &target) {
  if (prompt.empty())
    throw FormatError("speculative decoding: the prompt is empty");
  for (int64_t id : prompt)
    if (id < 0 || id >= target.config().vocabSize)
      throw FormatError("speculative decoding: prompt token " + std::to_string(id) +
                        " is outside the target's vocabulary of " + std::to_string(target.config().vocabSize));
}

} // namespace

double Generation::acceptanceLength() const {
  if (acceptedDrafts.empty())
    return 0;
  double sum = 0;
  for (int64_t accepted : acceptedDrafts)
    sum += double(accepted + 1);
  return sum / double(acceptedDrafts.size());
}

std::vector<int64_t> greedyDecode(const models::TargetModel &target, const std::vector<int64_t> &prompt,
                                  const GenerationOptions &options) {
  checkPrompt(prompt, target);
  torch::NoGradGuard noGrad;
  models::TargetCache cache;
  std::vector<int64_t> generated;
  std::vector<int64_t> feed = prompt;
  while (options.maxNewTokens > 0) {
    const int64_t token = runTarget(target, cache, feed, {}).next.back();
    feed = {token};
    if (append(generated, token, options))
      break;
  }
  return generated;
}

Generation speculativeDecode(const models::TargetModel &target, models::DFlashDrafterImpl &drafter,
                             const std::vector<int64_t> &prompt, const GenerationOptions &options) {
  checkPrompt(prompt, target);
  torch::NoGradGuard noGrad;
  const DFlashConfig &dflash = drafter.config().dflash;
  const int64_t blockSize = dflash.blockSize;
  const torch::Device device = drafter.fc->weight.device();
  Generation result;
  if (options.maxNewTokens <= 0)
    return result;

  // The prompt's pass gives the first token and the context of the first
  // block. The cache then holds every token but the last, which the next
  // verification feeds first.
  models::TargetCache cache;
  std::vector<int64_t> sequence = prompt;
  TargetPass pass = runTarget(target, cache, sequence, dflash.targetLayerIds);
  torch::Tensor context = pass.features; // [1, tokens fed, n * Ht]
  sequence.push_back(pass.next.back());
  if (append(result.tokens, sequence.back(), options))
    return result;

  while (true) {
    // Draft: the block anchored at the last token sees every token before it.
    const int64_t anchor = int64_t(sequence.size()) - 1;
    models::DrafterInputs inputs;
    inputs.contextFeatures = context.to(device);
    inputs.contextPositions = torch::arange(anchor, torch::kLong).view({1, -1}).to(device);
    std::vector<int64_t> block(size_t(blockSize), dflash.maskTokenId);
    block[0] = sequence.back();
    inputs.blockTokens = torch::tensor(block, torch::kLong).view({1, 1, blockSize}).to(device);
    inputs.blockPositions = (torch::arange(blockSize, torch::kLong) + anchor).view({1, 1, blockSize}).to(device);
    inputs.blocks.anchors = torch::full({1, 1}, anchor, torch::kLong).to(device);
    inputs.blocks.blockValid = torch::ones({1, 1}, torch::kBool).to(device);
    inputs.blocks.contextStart = torch::zeros({1, 1}, torch::kLong).to(device);
    inputs.blocks.blockSize = blockSize;
    inputs.blocks.contextLength = anchor;
    const torch::Tensor hidden = drafter.forward(inputs)[0][0]; // [K, H]
    const torch::Tensor drafted =
        torch::matmul(hidden.narrow(0, 1, blockSize - 1), drafter.lmHead().to(hidden.dtype()).t())
            .argmax(-1)
            .cpu();
    std::vector<int64_t> verified = {sequence.back()};
    verified.insert(verified.end(), drafted.data_ptr<int64_t>(), drafted.data_ptr<int64_t>() + drafted.numel());

    // Verify: the target's next token after each position of the block; the
    // cache keeps the last token and the accepted drafts.
    pass = runTarget(target, cache, verified, dflash.targetLayerIds);
    int64_t accepted = 0;
    while (accepted < blockSize - 1 && verified[size_t(1 + accepted)] == pass.next[size_t(accepted)])
      ++accepted;
    cache.truncate(anchor + 1 + accepted);
    context = torch::cat({context, pass.features.narrow(1, 0, accepted + 1)}, 1);
    result.acceptedDrafts.push_back(accepted);
    bool done = false;
    for (int64_t j = 0; j < accepted && !done; ++j) {
      sequence.push_back(verified[size_t(1 + j)]);
      done = append(result.tokens, sequence.back(), options);
    }
    if (done)
      return result;
    sequence.push_back(pass.next[size_t(accepted)]); // the bonus token
    if (append(result.tokens, sequence.back(), options))
      return result;
  }
}

AcceptanceSummary summarize(const std::vector<Generation> &generations, int64_t blockSize) {
  AcceptanceSummary summary;
  summary.acceptedAtLeast.assign(size_t(std::max<int64_t>(blockSize - 1, 0)), 0.0);
  double tauSum = 0;
  for (const Generation &g : generations) {
    summary.tokens += int64_t(g.tokens.size());
    if (g.acceptedDrafts.empty())
      continue;
    ++summary.responses;
    tauSum += g.acceptanceLength();
    for (int64_t accepted : g.acceptedDrafts) {
      ++summary.verifications;
      for (int64_t k = 1; k <= accepted && k < blockSize; ++k)
        summary.acceptedAtLeast[size_t(k - 1)] += 1;
    }
  }
  summary.tau = summary.responses ? tauSum / double(summary.responses) : 0;
  for (double &share : summary.acceptedAtLeast)
    share = summary.verifications ? share / double(summary.verifications) : 0;
  return summary;
}

} // namespace dflex::runtime::eval
