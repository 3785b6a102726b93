// Target models against transformers on tiny random models (built by
// python/target_reference.py), the gated delta rule against a sequential
// recurrence, and the token layouts of packed rows.
#include "../TestSupport.h"

#include "dflex/runtime/Error.h"
#include "dflex/runtime/SafeTensors.h"
#include "dflex/runtime/models/GatedDelta.h"
#include "dflex/runtime/models/TargetModel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <iostream>

using namespace dflex::runtime;
using namespace dflex::runtime::models;
using dflex::runtime::test::expectError;
using dflex::runtime::test::TempDir;

namespace {

/// max |actual - expected| / max |expected|, in float64.
double relativeError(const torch::Tensor &actual, const torch::Tensor &expected) {
  const torch::Tensor a = actual.to(torch::kDouble), e = expected.to(torch::kDouble);
  return (a - e).abs().max().item<double>() / std::max(e.abs().max().item<double>(), 1e-30);
}

void writeReference(const std::string &model, const TempDir &dir) {
  auto result = test::runPythonScript("target_reference.py",
                                      "--model " + model + " --out \"" + dir.path().string() + "\"");
  ASSERT_EQ(result.exitCode, 0) << result.output;
}

struct Tolerance {
  double hidden, logits;
};

/// Loads the model in `dtype`, runs the plain and the packed inputs of the
/// reference, and checks every layer, the final norm and the logits.
void expectMatchesReference(const std::string &model, const TempDir &dir,
                            torch::ScalarType dtype, Tolerance tolerance) {
  const std::string dtypeName = dtype == torch::kFloat ? "float32" : "bfloat16";
  const SafeTensorsCheckpoint reference =
      SafeTensorsCheckpoint::open(dir.file("reference_" + dtypeName + ".safetensors"));
  TargetModelOptions options;
  options.dtype = dtype;
  const TargetModel target = TargetModel::load(dir.file("model"), options);
  const int64_t layers = target.config().numHiddenLayers;

  TargetInputs plain;
  plain.inputIds = reference.tensor("input_ids");
  plain.computeLogits = true;
  for (int64_t l = 0; l < layers; ++l)
    plain.captureLayers.push_back(l);
  const TargetOutputs out = target.forward(plain);
  double worstHidden = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const torch::Tensor &h = out.hiddenStates[l];
    EXPECT_EQ(h.scalar_type(), dtype);
    const double error = relativeError(h, reference.tensor("layer_" + std::to_string(l)));
    EXPECT_LE(error, tolerance.hidden) << model << " " << dtypeName << " layer " << l;
    worstHidden = std::max(worstHidden, error);
  }
  const double finalError = relativeError(out.finalHidden, reference.tensor("final"));
  const double logitError = relativeError(out.logits, reference.tensor("logits"));
  EXPECT_LE(finalError, tolerance.hidden) << model << " " << dtypeName << " final norm";
  EXPECT_LE(logitError, tolerance.logits) << model << " " << dtypeName << " logits";

  TargetInputs packed;
  packed.inputIds = reference.tensor("packed_input_ids");
  packed.positionIds = reference.tensor("packed_position_ids");
  packed.cuSeqlens = reference.tensor("cu_seqlens");
  packed.captureLayers = plain.captureLayers;
  const TargetOutputs packedOut = target.forward(packed);
  EXPECT_FALSE(packedOut.logits.defined());
  double worstPacked = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const double error = relativeError(packedOut.hiddenStates[l],
                                       reference.tensor("packed_layer_" + std::to_string(l)));
    EXPECT_LE(error, tolerance.hidden) << model << " " << dtypeName << " packed layer " << l;
    worstPacked = std::max(worstPacked, error);
  }
  std::cout << "[ parity   ] " << model << " " << dtypeName
            << ": worst layer relative error " << worstHidden << ", packed " << worstPacked
            << ", final norm " << finalError << ", logits " << logitError << "\n";
}

void expectParity(const std::string &model) {
  TempDir dir;
  writeReference(model, dir);
  if (::testing::Test::HasFatalFailure())
    return;
  expectMatchesReference(model, dir, torch::kFloat, {2e-5, 2e-5});
  // bfloat16 keeps 8 bits: both sides round after every operation, in
  // slightly different orders.
  expectMatchesReference(model, dir, torch::kBFloat16, {1.5e-2, 1.5e-2});
}

} // namespace

TEST(TargetModel, Qwen3MatchesTransformers) { expectParity("qwen3"); }

TEST(TargetModel, Qwen3TiedBiasedSlidingYarnMatchesTransformers) {
  expectParity("qwen3_variant");
}

TEST(TargetModel, Qwen35HybridMatchesTransformers) { expectParity("qwen3_5"); }

TEST(TargetModel, StopsAfterTheLastCapturedLayer) {
  TempDir dir;
  writeReference("qwen3_5", dir);
  ASSERT_FALSE(HasFatalFailure());
  TargetModelOptions options;
  options.dtype = torch::kFloat;
  const TargetModel target = TargetModel::load(dir.file("model"), options);
  TargetInputs inputs;
  inputs.inputIds = torch::randint(0, 512, {1, 20}, torch::kLong);
  inputs.captureLayers = {2, 0};
  const TargetOutputs out = target.forward(inputs);
  ASSERT_EQ(out.hiddenStates.size(), 2u);
  EXPECT_FALSE(out.logits.defined());
  inputs.captureLayers = {0, 1, 2, 3};
  const TargetOutputs all = target.forward(inputs);
  EXPECT_TRUE(torch::equal(out.hiddenStates[0], all.hiddenStates[2]));
  EXPECT_TRUE(torch::equal(out.hiddenStates[1], all.hiddenStates[0]));
  inputs.captureLayers = {4};
  expectError<FormatError>([&] { target.forward(inputs); },
                           {"capture layer 4", "outside [0, 4)"});
}

TEST(TargetModel, ReadsTheMultimodalQwen35Layout) {
  // The released Qwen3.5 checkpoints nest the text config under text_config
  // and the language model under model.language_model, next to vision and
  // MTP tensors.
  TempDir dir;
  writeReference("qwen3_5", dir);
  ASSERT_FALSE(HasFatalFailure());
  TempDir multimodal;
  test::writeBytes(multimodal.file("config.json"),
                   R"({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                       "text_config": )" +
                       test::readBytes(dir.file("model/config.json")) + "}");
  const SafeTensorsCheckpoint original = SafeTensorsCheckpoint::open(dir.file("model"));
  NamedTensors tensors{{"model.visual.patch_embed.proj.weight", torch::zeros({4, 4})},
                       {"mtp.fc.weight", torch::zeros({4, 4})}};
  for (const std::string &name : original.names())
    tensors.emplace_back(name.rfind("model.", 0) == 0 ? "model.language_model." + name.substr(6)
                                                      : name,
                         original.tensor(name));
  saveSafeTensors(multimodal.file("model.safetensors"), tensors);

  TargetModelOptions options;
  options.dtype = torch::kFloat;
  TargetInputs inputs;
  inputs.inputIds = torch::randint(0, 512, {1, 20}, torch::kLong);
  inputs.computeLogits = true;
  const TargetOutputs expected = TargetModel::load(dir.file("model"), options).forward(inputs);
  const TargetOutputs out =
      TargetModel::load(multimodal.path().string(), options).forward(inputs);
  EXPECT_TRUE(torch::equal(out.logits, expected.logits));
}

TEST(TargetModel, RejectsMissingAndMisshapenTensors) {
  TempDir dir;
  writeReference("qwen3", dir);
  ASSERT_FALSE(HasFatalFailure());
  const SafeTensorsCheckpoint original = SafeTensorsCheckpoint::open(dir.file("model"));
  auto rewrite = [&](const std::function<void(NamedTensors &)> &edit) {
    NamedTensors tensors;
    for (const std::string &name : original.names())
      tensors.emplace_back(name, original.tensor(name).clone());
    edit(tensors);
    TempDir copy;
    std::filesystem::copy_file(dir.file("model/config.json"), copy.file("config.json"));
    saveSafeTensors(copy.file("model.safetensors"), tensors);
    TargetModel::load(copy.path().string());
  };
  expectError<FormatError>(
      [&] {
        rewrite([](NamedTensors &t) {
          t.erase(std::remove_if(t.begin(), t.end(),
                                 [](const auto &item) {
                                   return item.first == "model.layers.1.self_attn.k_norm.weight";
                                 }),
                  t.end());
        });
      },
      {"missing tensor 'model.layers.1.self_attn.k_norm.weight'"});
  expectError<FormatError>(
      [&] {
        rewrite([](NamedTensors &t) {
          for (auto &item : t)
            if (item.first == "model.layers.0.mlp.up_proj.weight")
              item.second = item.second.narrow(0, 0, 100).clone();
        });
      },
      {"'model.layers.0.mlp.up_proj.weight' has shape [100, 64]", "implies [128, 64]"});
}

// --- The gated delta rule ----------------------------------------------------------

namespace {

/// The recurrence one token at a time, in float64.
torch::Tensor sequentialGatedDelta(const torch::Tensor &q, const torch::Tensor &k,
                                   const torch::Tensor &v, const torch::Tensor &g,
                                   const torch::Tensor &beta) {
  const int64_t batch = q.size(0), length = q.size(1), heads = v.size(2);
  const int64_t groups = heads / q.size(2);
  auto l2 = [](const torch::Tensor &x) {
    return x * torch::rsqrt(x.pow(2).sum(-1, true) + 1e-6);
  };
  const torch::Tensor query = l2(q.to(torch::kDouble)).repeat_interleave(groups, 2) /
                              std::sqrt(double(q.size(3)));
  const torch::Tensor key = l2(k.to(torch::kDouble)).repeat_interleave(groups, 2);
  const torch::Tensor value = v.to(torch::kDouble);
  torch::Tensor state = torch::zeros({batch, heads, q.size(3), v.size(3)}, torch::kDouble);
  std::vector<torch::Tensor> out;
  for (int64_t t = 0; t < length; ++t) {
    const torch::Tensor kt = key.select(1, t), vt = value.select(1, t), qt = query.select(1, t);
    state = state * g.select(1, t).to(torch::kDouble).exp().unsqueeze(-1).unsqueeze(-1);
    const torch::Tensor predicted = (state * kt.unsqueeze(-1)).sum(-2);
    const torch::Tensor delta =
        (vt - predicted) * beta.select(1, t).to(torch::kDouble).unsqueeze(-1);
    state = state + kt.unsqueeze(-1) * delta.unsqueeze(-2);
    out.push_back((state * qt.unsqueeze(-1)).sum(-2));
  }
  return torch::stack(out, 1);
}

struct GatedDeltaInputs {
  torch::Tensor q, k, v, g, beta;
};

GatedDeltaInputs randomGatedDelta(int64_t batch, int64_t length) {
  torch::manual_seed(7);
  const int64_t keyHeads = 2, valueHeads = 6, keyDim = 8, valueDim = 12;
  GatedDeltaInputs in;
  in.q = torch::randn({batch, length, keyHeads, keyDim}, torch::kDouble);
  in.k = torch::randn({batch, length, keyHeads, keyDim}, torch::kDouble);
  in.v = torch::randn({batch, length, valueHeads, valueDim}, torch::kDouble);
  in.g = -torch::rand({batch, length, valueHeads}, torch::kDouble) * 2;
  in.beta = torch::rand({batch, length, valueHeads}, torch::kDouble);
  return in;
}

} // namespace

TEST(GatedDelta, ChunkedMatchesTheSequentialRecurrence) {
  const GatedDeltaInputs in = randomGatedDelta(2, 37);
  const torch::Tensor expected = sequentialGatedDelta(in.q, in.k, in.v, in.g, in.beta);
  for (int64_t chunk : {64, 16, 5, 1}) {
    GatedDeltaOptions options;
    options.chunkSize = chunk;
    const torch::Tensor out = gatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, options);
    EXPECT_EQ(out.sizes(), expected.sizes());
    EXPECT_LE(relativeError(out, expected), 1e-12) << "chunk " << chunk;
  }
  // float32 computes in float32.
  const torch::Tensor single = gatedDeltaRule(in.q.to(torch::kFloat), in.k.to(torch::kFloat),
                                              in.v.to(torch::kFloat), in.g.to(torch::kFloat),
                                              in.beta.to(torch::kFloat));
  EXPECT_EQ(single.scalar_type(), torch::kFloat);
  EXPECT_LE(relativeError(single, expected), 1e-5);
}

TEST(GatedDelta, PackedSegmentsStartFromAZeroState) {
  const GatedDeltaInputs in = randomGatedDelta(2, 30);
  // Row 0: [0, 12), [12, 30); row 1: [0, 1), [1, 30).
  const torch::Tensor cu = torch::tensor({0, 12, 30, 31, 60}, torch::kInt);
  const TokenLayout layout = TokenLayout::packed(cu, 2, 30, torch::kCPU);
  const torch::Tensor out = gatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, layout);
  const std::vector<std::array<int64_t, 3>> segments{{0, 0, 12}, {0, 12, 30}, {1, 0, 1}, {1, 1, 30}};
  for (const auto &[row, begin, end] : segments) {
    auto piece = [&](const torch::Tensor &x) {
      return x.narrow(0, row, 1).narrow(1, begin, end - begin);
    };
    const torch::Tensor expected =
        sequentialGatedDelta(piece(in.q), piece(in.k), piece(in.v), piece(in.g), piece(in.beta));
    EXPECT_LE(relativeError(piece(out), expected), 1e-12) << row << " " << begin;
  }
}

TEST(GatedDelta, ConvolutionMatchesConv1dAndRestartsPerSegment) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({2, 10, 5}, torch::kDouble);
  const torch::Tensor w = torch::randn({5, 1, 4}, torch::kDouble);
  const torch::Tensor out = causalDepthwiseConv(x, w, TokenLayout::rows(2, 10, torch::kCPU));
  const torch::Tensor expected =
      torch::conv1d(x.transpose(1, 2), w, {}, 1, 3, 1, 5).narrow(2, 0, 10).transpose(1, 2);
  EXPECT_LE(relativeError(out, expected), 1e-14);
  // Row 0 split at 4: the second segment convolves as if it began the row.
  const TokenLayout layout =
      TokenLayout::packed(torch::tensor({0, 4, 10, 20}, torch::kInt), 2, 10, torch::kCPU);
  const torch::Tensor packed = causalDepthwiseConv(x, w, layout);
  const torch::Tensor tail = causalDepthwiseConv(x.narrow(0, 0, 1).narrow(1, 4, 6), w,
                                                 TokenLayout::rows(1, 6, torch::kCPU));
  EXPECT_LE(relativeError(packed.narrow(0, 0, 1).narrow(1, 4, 6), tail), 1e-14);
  EXPECT_LE(relativeError(packed.narrow(0, 1, 1), out.narrow(0, 1, 1)), 1e-14);
}

TEST(TokenLayout, RejectsBadCuSeqlens) {
  expectError<FormatError>(
      [] { TokenLayout::packed(torch::tensor({0, 5, 19}, torch::kInt), 2, 10, torch::kCPU); },
      {"cu_seqlens", "from 0 to B*T = 20"});
  expectError<FormatError>(
      [] { TokenLayout::packed(torch::tensor({0, 12, 20}, torch::kInt), 2, 10, torch::kCPU); },
      {"segment 0 [0, 12) crosses the end of row 0"});
  expectError<FormatError>(
      [] { TokenLayout::packed(torch::tensor({0, 8, 6, 20}, torch::kInt), 2, 10, torch::kCPU); },
      {"decreases at entry 2"});
  const TokenLayout ok =
      TokenLayout::packed(torch::tensor({0, 3, 10, 10, 20}, torch::kInt), 2, 10, torch::kCPU);
  ASSERT_EQ(ok.segments().size(), 3u); // the empty segment is skipped
  EXPECT_EQ(ok.offsets()[0][4].item<int64_t>(), 1);
  EXPECT_EQ(ok.segmentIds()[1][0].item<int64_t>(), 3);
}
