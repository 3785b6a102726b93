// The DFlash drafter: its mask, forward and backward against an independent
// PyTorch implementation (python/drafter_reference.py), checkpoints, the
// dflex attention op as its attention (on CUDA in DrafterCuda.*), and
// training on a target model.
#include "TestSupport.h"
#include "DrafterTestSupport.h"
#include "ModelTestSupport.h"

#include "dflex/runtime/data/Batching.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/support/Random.h"
#include "dflex/runtime/checkpoint/SafeTensors.h"
#include "dflex/runtime/bundle/GatedDeltaBundle.h"
#include "dflex/runtime/models/Drafter.h"
#include "dflex/runtime/models/KernelHooks.h"
#include "dflex/runtime/models/TargetModel.h"
#include "dflex/runtime/train/DrafterInputs.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <iomanip>
#include <iostream>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using namespace dflex::runtime::models;
using dflex::runtime::test::expectError;
using dflex::runtime::test::relativeError;
using dflex::runtime::test::TempDir;

namespace {

using test::kBlockSize;
using test::kHidden;
using test::kVocab;
using test::packedRow;
using test::tinyDrafterConfig;

/// Two rows of 30 tokens: two documents (the second block set sees context
/// from a later document start), and one document with padding.
TrainingBatch tinyBatch(int64_t maxAnchors = 5) {
  BlockOptions options;
  options.blockSize = kBlockSize;
  options.maxAnchors = maxAnchors;
  options.maskTokenId = 299;
  return makeTrainingBatch({packedRow({13, 17}, 30, 1), packedRow({21}, 30, 2)}, options, 11);
}

struct Problem {
  TrainingBatch batch;
  torch::Tensor features, embed, lmHead;
};

Problem tinyProblem(torch::ScalarType dtype) {
  Problem p;
  p.batch = tinyBatch();
  torch::manual_seed(5);
  p.features = torch::randn({2, 30, 2 * kHidden}, torch::kDouble).to(dtype);
  p.embed = torch::randn({kVocab, kHidden}, torch::kDouble).to(dtype);
  p.lmHead = (torch::randn({kVocab, kHidden}, torch::kDouble) * 0.2).to(dtype);
  return p;
}

DrafterInputs inputsOf(const Problem &p) {
  return drafterInputs(p.batch, p.features, torch::kCPU);
}

} // namespace

TEST(DFlashMask, FollowsTheDefinition) {
  // One row, T = 8, blocks of 2: block 0 anchored at 5 seeing context [2, 5),
  // block 1 a padding block.
  DFlashBlocks blocks;
  blocks.anchors = torch::tensor({{5, 0}}, torch::kLong);
  blocks.blockValid = torch::tensor({{true, false}});
  blocks.contextStart = torch::tensor({{2, 0}}, torch::kLong);
  blocks.blockSize = 2;
  blocks.contextLength = 8;
  const torch::Tensor full = dflashMask(blocks, std::nullopt);
  ASSERT_EQ(full.sizes(), torch::IntArrayRef({1, 4, 12}));
  const std::vector<std::vector<int>> expectedFull{
      {0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0},
      {0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0},
      {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
  // Window 2: query j of block 0 sits at 5 + j and sees context c with
  // 5 + j - c < 2, and block keys j' <= j.
  const std::vector<std::vector<int>> expectedWindow{
      {0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0},
      {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0},
      {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}};
  const torch::Tensor windowed = dflashMask(blocks, 2);
  for (int q = 0; q < 4; ++q)
    for (int kv = 0; kv < 12; ++kv) {
      EXPECT_EQ(full[0][q][kv].item<bool>(), bool(expectedFull[q][kv])) << q << " " << kv;
      EXPECT_EQ(windowed[0][q][kv].item<bool>(), bool(expectedWindow[q][kv])) << q << " " << kv;
    }
}

namespace {

/// Saves the drafter and the problem (CPU tensors) in `dir` and runs the
/// Python reference (float64) on them, on `device` ("cpu" or "cuda").
void writeDrafterReference(const TempDir &dir, const DFlashDrafter &drafter, const Problem &p,
                           const std::string &device = "cpu") {
  drafter->save(dir.file("drafter"));
  saveSafeTensors(dir.file("inputs.safetensors"),
                  {{"context_features", p.features},
                   {"context_positions", p.batch.positionIds},
                   {"block_tokens", p.batch.blockTokens},
                   {"block_positions", p.batch.blockPositionIds},
                   {"anchors", p.batch.anchors},
                   {"block_valid", p.batch.blockValid},
                   {"context_start", p.batch.contextStart},
                   {"embed_tokens", p.embed},
                   {"lm_head", p.lmHead},
                   {"labels", p.batch.labels},
                   {"weights", p.batch.weights}});
  auto script = test::runPythonScript(
      "drafter_reference.py", "--checkpoint \"" + dir.file("drafter") + "\" --inputs \"" +
                                  dir.file("inputs.safetensors") + "\" --out \"" +
                                  dir.file("reference.safetensors") + "\" --device " + device);
  ASSERT_EQ(script.exitCode, 0) << script.output;
}

/// Forward and backward of a drafter in `dtype` against the Python
/// reference (float64) on the same saved weights and inputs.
void expectMatchesReference(torch::ScalarType dtype, double tolerance) {
  TempDir dir;
  const Problem p = tinyProblem(dtype);
  DFlashDrafter drafter(tinyDrafterConfig(), 0, 42);
  drafter->to(dtype);
  writeDrafterReference(dir, drafter, p);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const SafeTensorsFile reference = SafeTensorsFile::open(dir.file("reference.safetensors"));

  drafter->setTargetWeights(p.embed, p.lmHead);
  const torch::Tensor hidden = drafter->forward(inputsOf(p));
  const BlockLossResult loss = drafter->loss(hidden, p.batch.labels, p.batch.weights);
  loss.loss.backward();
  const double hiddenError = relativeError(hidden, reference.tensor("hidden"));
  const double lossError = relativeError(loss.loss, reference.tensor("loss"));
  EXPECT_LE(hiddenError, tolerance);
  EXPECT_LE(lossError, tolerance);
  double worstGrad = 0;
  size_t parameters = 0;
  for (const auto &item : drafter->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const double error =
        relativeError(item.value().grad(), reference.tensor("grad." + item.key()));
    EXPECT_LE(error, tolerance) << item.key();
    worstGrad = std::max(worstGrad, error);
    ++parameters;
  }
  EXPECT_EQ(parameters + 2, reference.tensors().size()); // every parameter has a gradient
  std::cout << "[ parity   ] drafter " << c10::toString(dtype) << ": hidden " << hiddenError
            << ", loss " << lossError << ", worst gradient " << worstGrad << " over "
            << parameters << " parameters\n";
}

} // namespace

TEST(Drafter, MatchesAnIndependentImplementationInFloat64) {
  expectMatchesReference(torch::kDouble, 1e-10);
}

TEST(Drafter, MatchesAnIndependentImplementationInFloat32) {
  expectMatchesReference(torch::kFloat, 1e-4);
}

TEST(Drafter, CheckpointsUseThePublicTensorNames) {
  DFlashDrafter drafter(tinyDrafterConfig(), 0, 1);
  std::vector<std::string> names;
  for (const auto &item : drafter->named_parameters())
    names.push_back(item.key());
  std::sort(names.begin(), names.end());
  const std::vector<std::string> layer0{
      "layers.0.input_layernorm.weight",    "layers.0.mlp.down_proj.weight",
      "layers.0.mlp.gate_proj.weight",      "layers.0.mlp.up_proj.weight",
      "layers.0.post_attention_layernorm.weight", "layers.0.self_attn.k_norm.weight",
      "layers.0.self_attn.k_proj.weight",   "layers.0.self_attn.o_proj.weight",
      "layers.0.self_attn.q_norm.weight",   "layers.0.self_attn.q_proj.weight",
      "layers.0.self_attn.v_proj.weight"};
  EXPECT_EQ(names.size(), 3 + 3 * layer0.size());
  EXPECT_EQ(names[0], "fc.weight");
  EXPECT_EQ(names[1], "hidden_norm.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 2, names.begin() + 2 + layer0.size()), layer0);
  EXPECT_EQ(names.back(), "norm.weight");
  EXPECT_EQ(drafter->named_parameters()["fc.weight"].sizes(),
            torch::IntArrayRef({kHidden, 2 * kHidden}));
}

TEST(Drafter, SaveAndLoadRoundTrip) {
  TempDir dir;
  const Problem p = tinyProblem(torch::kFloat);
  DFlashDrafter drafter(tinyDrafterConfig(), 0, 3);
  drafter->setTargetWeights(p.embed, p.lmHead);
  torch::NoGradGuard noGrad;
  const torch::Tensor expected = drafter->forward(inputsOf(p));

  drafter->save(dir.file("single"));
  EXPECT_TRUE(std::filesystem::exists(dir.file("single/model.safetensors")));
  DFlashDrafter single(DFlashDrafterImpl::load(dir.file("single")));
  single->setTargetWeights(p.embed, p.lmHead);
  EXPECT_TRUE(torch::equal(single->forward(inputsOf(p)), expected));
  const DrafterConfig config = loadDrafterConfig(dir.file("single"));
  EXPECT_EQ(config.dflash.targetLayerIds, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(config.dflash.maskTokenId, 299);
  EXPECT_EQ(config.model.dtype, "float32");

  drafter->save(dir.file("sharded"), std::nullopt, 20000);
  EXPECT_TRUE(std::filesystem::exists(dir.file("sharded/model.safetensors.index.json")));
  DFlashDrafter sharded(DFlashDrafterImpl::load(dir.file("sharded")));
  sharded->setTargetWeights(p.embed, p.lmHead);
  EXPECT_TRUE(torch::equal(sharded->forward(inputsOf(p)), expected));

  drafter->save(dir.file("bf16"), torch::kBFloat16);
  EXPECT_EQ(loadDrafterConfig(dir.file("bf16")).model.dtype, "bfloat16");
  EXPECT_EQ(SafeTensorsCheckpoint::open(dir.file("bf16")).info("fc.weight").dtype,
            torch::kBFloat16);
  DFlashDrafter rounded(DFlashDrafterImpl::load(dir.file("bf16"), torch::kBFloat16));
  for (const auto &item : drafter->named_parameters())
    EXPECT_TRUE(torch::equal(rounded->named_parameters()[item.key()],
                             item.value().to(torch::kBFloat16)))
        << item.key();
}

TEST(Drafter, LoadRejectsIncompleteOrForeignCheckpoints) {
  TempDir dir;
  DFlashDrafter drafter(tinyDrafterConfig(), 0, 3);
  drafter->save(dir.file("good"));
  const SafeTensorsFile good = SafeTensorsFile::open(dir.file("good/model.safetensors"));
  auto variant = [&](const std::string &name, const std::function<void(NamedTensors &)> &edit) {
    NamedTensors tensors;
    for (const SafeTensorInfo &info : good.tensors())
      tensors.emplace_back(info.name, good.tensor(info.name));
    edit(tensors);
    std::filesystem::create_directories(dir.file(name));
    std::filesystem::copy_file(dir.file("good/config.json"), dir.file(name + "/config.json"));
    saveSafeTensors(dir.file(name + "/model.safetensors"), tensors);
    return dir.file(name);
  };
  const std::string missing = variant("missing", [](NamedTensors &t) {
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const auto &item) { return item.first == "layers.2.mlp.up_proj.weight"; }),
            t.end());
  });
  expectError<FormatError>([&] { DFlashDrafterImpl::load(missing); },
                           {"missing tensor 'layers.2.mlp.up_proj.weight'"});
  const std::string foreign = variant("foreign", [](NamedTensors &t) {
    t.emplace_back("candidate_selector.hidden_projection.weight", torch::zeros({4, 48}));
  });
  expectError<FormatError>([&] { DFlashDrafterImpl::load(foreign); },
                           {"tensors the drafter does not have: candidate_selector.hidden_projection.weight"});
  const std::string misshapen = variant("misshapen", [](NamedTensors &t) {
    for (auto &item : t)
      if (item.first == "layers.1.self_attn.q_norm.weight")
        item.second = torch::ones({8});
  });
  expectError<FormatError>([&] { DFlashDrafterImpl::load(misshapen); },
                           {"'layers.1.self_attn.q_norm.weight' has shape [8]", "implies [16]"});
  DrafterConfig withGatedDelta = tinyDrafterConfig();
  withGatedDelta.model.layerKinds[1] = LayerKind::LinearAttention;
  expectError<FormatError>([&] { DFlashDrafter{withGatedDelta}; },
                           {"layer 1 is a linear_attention layer", "linear_num_key_heads"});
}

TEST(Drafter, RefusesInputsOfTheWrongShape) {
  const Problem p = tinyProblem(torch::kFloat);
  DFlashDrafter drafter(tinyDrafterConfig(), 0, 3);
  expectError<FormatError>([&] { drafter->forward(inputsOf(p)); }, {"setTargetWeights"});
  drafter->setTargetWeights(p.embed, p.lmHead);
  DrafterInputs in = inputsOf(p);
  in.contextFeatures = in.contextFeatures.narrow(2, 0, kHidden);
  expectError<FormatError>([&] { drafter->forward(in); }, {"context features must be [B, T, 96]"});
  expectError<FormatError>([&] { drafter->setTargetWeights(torch::zeros({10, 7}), p.lmHead); },
                           {"[V, 48]"});
}

// --- Gated-delta drafter layers ------------------------------------------------------

namespace {

constexpr int64_t kGatedContext = 83;

/// Blocks of 4 over two rows of 83 context tokens where the per-block
/// recurrence has its edges: row 0 holds documents [0, 9) and [9, 83) with
/// anchors at both starts (no context), just after them (less context than
/// the convolution's 3 taps), at the end of the first, and where the
/// second's context fills one 64-token chunk (73) or crosses into the next;
/// row 1 one document, anchors around the chunk boundary, then padding.
DFlashBlocks edgeBlocks() {
  DFlashBlocks blocks;
  blocks.anchors = torch::tensor({0L, 1L, 2L, 8L, 9L, 10L, 11L, 40L, 73L, 74L, 80L,
                                  3L, 63L, 64L, 65L, 82L, 0L, 0L, 0L, 0L, 0L, 0L})
                       .view({2, 11});
  blocks.contextStart = torch::tensor({0L, 0L, 0L, 0L, 9L, 9L, 9L, 9L, 9L, 9L, 9L,
                                       0L, 0L, 0L, 0L, 0L, 0L, 0L, 0L, 0L, 0L, 0L})
                            .view({2, 11});
  blocks.blockValid = torch::arange(22).view({2, 11}) < 16;
  blocks.blockSize = kBlockSize;
  blocks.contextLength = kGatedContext;
  return blocks;
}

/// The tiny config of one gated-delta layer.
TransformerConfig tinyGatedDelta() { return tinyDrafterConfig(R"("linear_attention")").model; }

/// The same with the shapes of model_specs.mlir's drafter_gated_delta
/// spec, which the CUDA kernels take: 1 key head and 2 value heads of 64.
TransformerConfig opShapedGatedDelta() {
  TransformerConfig config = tinyGatedDelta();
  config.gatedDelta = GatedDeltaConfig{1, 2, 64, 64, 3};
  return config;
}

/// A gated-delta layer of `config` in float64, every parameter random
/// (no zeros; decays between exp(-0.2) and ~1 per token so that a long
/// context still counts).
DrafterGatedDelta randomGatedDeltaLayer(const TransformerConfig &config = tinyGatedDelta()) {
  DrafterGatedDelta layer(config);
  layer->to(torch::kDouble);
  torch::manual_seed(21);
  torch::NoGradGuard noGrad;
  GatedDeltaWeights &w = layer->weights;
  for (torch::Tensor *linear : {&w.inProjQkv, &w.inProjZ, &w.inProjB, &w.outProj})
    linear->copy_(torch::randn(linear->sizes(), torch::kDouble) / std::sqrt(double(kHidden)));
  w.inProjA.copy_(torch::randn(w.inProjA.sizes(), torch::kDouble) * 0.05);
  w.conv.copy_(torch::randn(w.conv.sizes(), torch::kDouble) * 0.6);
  w.aLog.copy_((0.01 + 0.09 * torch::rand(w.aLog.sizes(), torch::kDouble)).log());
  w.dtBias.copy_(torch::randn(w.dtBias.sizes(), torch::kDouble) * 0.5);
  w.norm.copy_(1 + 0.2 * torch::randn(w.norm.sizes(), torch::kDouble));
  return layer;
}

/// The gated-delta drafter layer from its definition, block by block, one
/// token at a time: the sequence context[s, a) then the block's h, the
/// causal convolution from zeros and the recurrence from a zero state over
/// it (test::sequentialGatedDelta), the last K outputs through the gated
/// norm and out_proj; padding blocks 0.
torch::Tensor referenceGatedDelta(const DrafterGatedDeltaImpl &layer, const torch::Tensor &context,
                                  const torch::Tensor &h, const DFlashBlocks &blocks,
                                  const GatedDeltaConfig &g = *tinyGatedDelta().gatedDelta) {
  const GatedDeltaWeights &w = layer.weights;
  const int64_t keyWidth = g.numKeyHeads * g.keyHeadDim, taps = g.convKernelDim;
  std::vector<torch::Tensor> rows;
  for (int64_t b = 0; b < context.size(0); ++b) {
    std::vector<torch::Tensor> outputs;
    for (int64_t n = 0; n < blocks.anchors.size(1); ++n) {
      const torch::Tensor block = h[b].narrow(0, n * kBlockSize, kBlockSize);
      if (!blocks.blockValid[b][n].item<bool>()) {
        outputs.push_back(torch::zeros_like(block));
        continue;
      }
      const int64_t anchor = blocks.anchors[b][n].item<int64_t>();
      const int64_t start = blocks.contextStart[b][n].item<int64_t>();
      const torch::Tensor sequence = torch::cat({context[b].narrow(0, start, anchor - start), block});
      const int64_t length = sequence.size(0);
      const torch::Tensor mixed = torch::matmul(sequence, w.inProjQkv.t());
      std::vector<torch::Tensor> convolved;
      for (int64_t t = 0; t < length; ++t) {
        torch::Tensor sum = torch::zeros({mixed.size(1)}, torch::kDouble);
        for (int64_t i = 0; i < taps; ++i)
          if (t + i - (taps - 1) >= 0)
            sum = sum + w.conv.select(1, 0).select(1, i) * mixed[t + i - (taps - 1)];
        convolved.push_back(torch::silu(sum));
      }
      const torch::Tensor act = torch::stack(convolved).unsqueeze(0);
      const torch::Tensor q = act.narrow(2, 0, keyWidth).view({1, length, -1, g.keyHeadDim});
      const torch::Tensor k = act.narrow(2, keyWidth, keyWidth).view({1, length, -1, g.keyHeadDim});
      const torch::Tensor v = act.narrow(2, 2 * keyWidth, g.numValueHeads * g.valueHeadDim)
                                  .view({1, length, -1, g.valueHeadDim});
      const torch::Tensor beta = torch::sigmoid(torch::matmul(sequence, w.inProjB.t())).unsqueeze(0);
      const torch::Tensor decay =
          (-w.aLog.exp() * torch::softplus(torch::matmul(sequence, w.inProjA.t()) + w.dtBias)).unsqueeze(0);
      const torch::Tensor o = test::sequentialGatedDelta(q, k, v, decay, beta)[0].narrow(0, length - kBlockSize, kBlockSize);
      const torch::Tensor z = torch::matmul(block, w.inProjZ.t()).view({kBlockSize, -1, g.valueHeadDim});
      const torch::Tensor normed =
          o * torch::rsqrt(o.pow(2).mean(-1, true) + 1e-6) * w.norm * torch::silu(z);
      outputs.push_back(torch::matmul(normed.reshape({kBlockSize, -1}), w.outProj.t()));
    }
    rows.push_back(torch::cat(outputs));
  }
  return torch::stack(rows);
}

struct GatedDeltaProblem {
  DFlashBlocks blocks = edgeBlocks();
  torch::Tensor context, h, weights; ///< weights: of the loss sum(out * weights)
};

GatedDeltaProblem gatedDeltaProblem() {
  torch::manual_seed(22);
  GatedDeltaProblem p;
  p.context = torch::randn({2, kGatedContext, kHidden}, torch::kDouble).requires_grad_();
  p.h = torch::randn({2, 11 * kBlockSize, kHidden}, torch::kDouble).requires_grad_();
  p.weights = torch::randn({2, 11 * kBlockSize, kHidden}, torch::kDouble);
  return p;
}

} // namespace

TEST(DrafterGatedDelta, MatchesAPerTokenRecurrenceOverEachBlocksContext) {
  const DrafterGatedDelta layer = randomGatedDeltaLayer();
  const GatedDeltaProblem p = gatedDeltaProblem();
  torch::NoGradGuard noGrad;
  const torch::Tensor out = layer->forward(p.context, p.h, p.blocks);
  const torch::Tensor expected = referenceGatedDelta(*layer, p.context, p.h, p.blocks);
  ASSERT_EQ(out.sizes(), expected.sizes());
  const double error = relativeError(out, expected);
  EXPECT_LE(error, 1e-12);
  // Padding blocks are 0; a block whose anchor starts its document sees no
  // context: the same tokens anchored at 0 of a one-token context agree.
  EXPECT_EQ(out[1].narrow(0, 5 * kBlockSize, 6 * kBlockSize).abs().max().item<double>(), 0.0);
  DFlashBlocks alone;
  alone.anchors = torch::zeros({1, 1}, torch::kLong);
  alone.contextStart = torch::zeros({1, 1}, torch::kLong);
  alone.blockValid = torch::ones({1, 1}, torch::kBool);
  alone.blockSize = kBlockSize;
  alone.contextLength = 1;
  const torch::Tensor atStart =
      layer->forward(p.context[0].narrow(0, 9, 1).unsqueeze(0), p.h[0].narrow(0, 4 * kBlockSize, kBlockSize).unsqueeze(0), alone);
  EXPECT_LE(relativeError(atStart[0], out[0].narrow(0, 4 * kBlockSize, kBlockSize)), 1e-14);
  expectError<FormatError>([&] { layer->forward(p.context, p.h.narrow(1, 0, 8), p.blocks); },
                           {"h [B, N*K = 44, H]", "got context [2, 83, 48], h [2, 8, 48]"});
  std::cout << "[ parity   ] gated-delta drafter layer against the per-token recurrence (float64): "
            << error << "\n";
}

TEST(DrafterGatedDelta, GradientsMatchTheReferenceAndFiniteDifferences) {
  DrafterGatedDelta layer = randomGatedDeltaLayer();
  GatedDeltaProblem p = gatedDeltaProblem();
  // The others as padding keep the reference's backward short; these still
  // have no context, a short one, one from a document's second start, and
  // ones across the 64-token chunk.
  p.blocks.blockValid = torch::tensor({1, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0,
                                       0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0})
                            .view({2, 11})
                            .to(torch::kBool);
  auto gradients = [&](const torch::Tensor &out) {
    layer->zero_grad();
    p.context.mutable_grad() = torch::Tensor();
    p.h.mutable_grad() = torch::Tensor();
    (out * p.weights).sum().backward();
    std::vector<torch::Tensor> grads{p.context.grad().clone(), p.h.grad().clone()};
    for (const torch::Tensor &parameter : layer->parameters())
      grads.push_back(parameter.grad().clone());
    return grads;
  };
  const auto ours = gradients(layer->forward(p.context, p.h, p.blocks));
  const auto expected = gradients(referenceGatedDelta(*layer, p.context, p.h, p.blocks));
  double worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_GT(expected[i].abs().max().item<double>(), 0) << i;
    worst = std::max(worst, relativeError(ours[i], expected[i]));
  }
  EXPECT_LE(worst, 1e-11);
  // Central differences of the loss along a random direction of all
  // parameters against the gradient's projection on it.
  torch::NoGradGuard noGrad;
  std::vector<torch::Tensor> direction;
  double projected = 0;
  for (size_t i = 0; i < layer->parameters().size(); ++i) {
    direction.push_back(torch::randn(ours[i + 2].sizes(), torch::kDouble));
    projected += (direction.back() * ours[i + 2]).sum().item<double>();
  }
  auto lossAt = [&](double step) {
    const std::vector<torch::Tensor> parameters = layer->parameters();
    for (size_t i = 0; i < parameters.size(); ++i)
      parameters[i].add_(direction[i], step);
    const double loss = (layer->forward(p.context, p.h, p.blocks) * p.weights).sum().item<double>();
    for (size_t i = 0; i < parameters.size(); ++i)
      parameters[i].sub_(direction[i], step);
    return loss;
  };
  const double epsilon = 1e-6;
  const double difference = (lossAt(epsilon) - lossAt(-epsilon)) / (2 * epsilon);
  EXPECT_NEAR(difference, projected, 1e-6 * std::abs(projected));
  std::cout << "[ gradient ] gated-delta drafter layer: worst relative error against the "
               "reference's autograd "
            << worst << " over " << ours.size() << " tensors; directional derivative "
            << std::setprecision(12) << difference << " vs " << projected << "\n";
}

namespace {

/// The layer's output and the gradients of sum(out * weights) with respect
/// to context, h and every parameter.
std::vector<torch::Tensor> outputAndGradients(DrafterGatedDeltaImpl &layer,
                                              const GatedDeltaProblem &p,
                                              const DrafterGatedDeltaFn &rule = {}) {
  layer.zero_grad();
  const torch::Tensor context = p.context.detach().requires_grad_();
  const torch::Tensor h = p.h.detach().requires_grad_();
  const torch::Tensor out = layer.forward(context, h, p.blocks, rule);
  (out * p.weights).sum().backward();
  std::vector<torch::Tensor> results{out.detach(), context.grad(), h.grad()};
  for (const torch::Tensor &parameter : layer.parameters())
    results.push_back(parameter.grad().clone());
  return results;
}

/// drafterGatedDeltaHook with a spec of model_specs.mlir, else empty.
DrafterGatedDeltaFn opRule(const std::string &spec = "drafter_gated_delta",
                           const GatedDeltaConfig &layers = *opShapedGatedDelta().gatedDelta) {
  const std::string bundle = test::modelSpecsBundle();
  return bundle.empty() ? DrafterGatedDeltaFn()
                        : drafterGatedDeltaHook(GatedDeltaBundle::openCached(bundle), spec, layers);
}

} // namespace

TEST(DrafterGatedDelta, ThroughTheOpMatchesThePerTokenRecurrenceAndItsGradients) {
  // The op's float64 reference on the CPU: the probes that read each
  // block's anchor state, the blocks from zero states, their sum.
  const DrafterGatedDeltaFn rule = opRule();
  if (!rule)
    GTEST_SKIP() << "no model_specs bundle (build dflex-compile, or set DFLEX_MODEL_BUNDLES)";
  const TransformerConfig config = opShapedGatedDelta();
  DrafterGatedDelta layer = randomGatedDeltaLayer(config);
  const GatedDeltaProblem p = gatedDeltaProblem();
  {
    torch::NoGradGuard noGrad;
    const torch::Tensor out = layer->forward(p.context, p.h, p.blocks, rule);
    const torch::Tensor expected =
        referenceGatedDelta(*layer, p.context, p.h, p.blocks, *config.gatedDelta);
    EXPECT_GT(expected.abs().max().item<double>(), 0.1);
    EXPECT_LE(relativeError(out, expected), 1e-12);
    std::cout << "[ parity   ] gated-delta drafter layer through the op (float64 reference) "
                 "against the per-token recurrence: "
              << relativeError(out, expected) << "\n";
  }
  const auto ours = outputAndGradients(*layer, p, rule);
  const auto libtorch = outputAndGradients(*layer, p);
  double worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_GT(libtorch[i].abs().max().item<double>(), 0) << i;
    worst = std::max(worst, relativeError(ours[i], libtorch[i]));
  }
  EXPECT_LE(worst, 1e-11);
  std::cout << "[ gradient ] gated-delta drafter layer through the op against the LibTorch rule: "
               "worst relative error "
            << worst << " over " << ours.size() << " tensors\n";
}

TEST(DrafterGatedDelta, TheOpHookRefusesSpecsThatCannotServeTheLayers) {
  if (test::modelSpecsBundle().empty())
    GTEST_SKIP() << "no model_specs bundle";
  // The target's spec normalises q and k in the kernel; the drafter's is
  // for 2 value heads of 64, not the tiny layers' 4 of 8 and 6.
  expectError<FormatError>([] { opRule("qwen3_5_gated_delta"); },
                           {"spec 'qwen3_5_gated_delta'", "without qk_l2norm"});
  expectError<FormatError>([] { opRule("drafter_gated_delta", *tinyGatedDelta().gatedDelta); },
                           {"is heads(2, 2) dims(64, 64)", "need heads(4, 4) dims(8, 6)"});
}

TEST(DrafterCuda, GatedDeltaLayerMatchesTheFloat64CpuRun) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "needs a CUDA device";
  const GatedDeltaProblem p = gatedDeltaProblem();
  // Output and every gradient of a layer of `config` in `dtype` on `device`.
  auto run = [&](const TransformerConfig &config, torch::Device device, torch::ScalarType dtype,
                 const DrafterGatedDeltaFn &rule) {
    DrafterGatedDelta layer = randomGatedDeltaLayer(config);
    layer->to(device, dtype);
    GatedDeltaProblem there;
    there.blocks = p.blocks;
    for (torch::Tensor *t : {&there.blocks.anchors, &there.blocks.contextStart, &there.blocks.blockValid})
      *t = t->to(device);
    there.context = p.context.detach().to(device, dtype);
    there.h = p.h.detach().to(device, dtype);
    there.weights = p.weights.to(device, dtype);
    const auto results = outputAndGradients(*layer, there, rule);
    EXPECT_EQ(results[0].device().type(), device.type());
    return results;
  };
  auto compare = [&](const TransformerConfig &config, torch::ScalarType dtype, double tolerance,
                     const DrafterGatedDeltaFn &rule, const std::string &path) {
    const auto expected = run(config, torch::kCPU, torch::kDouble, {});
    const auto ours = run(config, torch::kCUDA, dtype, rule);
    double worst = 0;
    for (size_t i = 0; i < ours.size(); ++i)
      worst = std::max(worst, relativeError(ours[i], expected[i]));
    EXPECT_LE(worst, tolerance) << c10::toString(dtype) << " " << path;
    std::cout << "[ gpu parity ] gated-delta drafter layer " << path << " in "
              << c10::toString(dtype) << " on CUDA against float64 on the CPU: worst of output and "
              << "gradients " << worst << "\n";
  };
  // The LibTorch rule on CUDA: float32 2.3e-6, bfloat16 4.1e-2.
  compare(tinyGatedDelta(), torch::kFloat, 1e-4, {}, "by the LibTorch rule");
  compare(tinyGatedDelta(), torch::kBFloat16, 8e-2, {}, "by the LibTorch rule");
  // The dflex gated-delta op's kernels (bf16 inputs, fp32 state).
  const DrafterGatedDeltaFn rule = opRule();
  if (!rule)
    GTEST_SKIP() << "needs the model_specs bundle (DFLEX_MODEL_BUNDLES)";
  compare(opShapedGatedDelta(), torch::kBFloat16, 8e-2, rule, "through the gated-delta op");
}

TEST(Drafter, GatedDeltaLayersUseQwen35NamesAndReloadIdentically) {
  TempDir dir;
  const Problem p = tinyProblem(torch::kFloat);
  DFlashDrafter drafter(
      tinyDrafterConfig(R"("linear_attention", "full_attention", "sliding_attention")"), 0, 3);
  std::vector<std::string> layer0;
  for (const auto &item : drafter->named_parameters())
    if (item.key().rfind("layers.0.", 0) == 0)
      layer0.push_back(item.key());
  std::sort(layer0.begin(), layer0.end());
  EXPECT_EQ(layer0, (std::vector<std::string>{
                        "layers.0.input_layernorm.weight", "layers.0.linear_attn.A_log",
                        "layers.0.linear_attn.conv1d.weight", "layers.0.linear_attn.dt_bias",
                        "layers.0.linear_attn.in_proj_a.weight", "layers.0.linear_attn.in_proj_b.weight",
                        "layers.0.linear_attn.in_proj_qkv.weight", "layers.0.linear_attn.in_proj_z.weight",
                        "layers.0.linear_attn.norm.weight", "layers.0.linear_attn.out_proj.weight",
                        "layers.0.mlp.down_proj.weight", "layers.0.mlp.gate_proj.weight",
                        "layers.0.mlp.up_proj.weight", "layers.0.post_attention_layernorm.weight"}));
  auto parameter = [&](const std::string &name) { return drafter->named_parameters()["layers.0.linear_attn." + name]; };
  // q and k: 2 heads of 8 each, v: 4 heads of 6.
  EXPECT_EQ(parameter("in_proj_qkv.weight").sizes(), torch::IntArrayRef({56, kHidden}));
  EXPECT_EQ(parameter("conv1d.weight").sizes(), torch::IntArrayRef({56, 1, 3}));
  EXPECT_TRUE(torch::equal(parameter("dt_bias"), torch::ones({4})));
  EXPECT_TRUE((parameter("A_log").exp() < 16).all().item<bool>());
  EXPECT_GT(parameter("conv1d.weight").std().item<double>(), 0.01);

  drafter->setTargetWeights(p.embed, p.lmHead);
  torch::Tensor expected;
  {
    torch::NoGradGuard noGrad;
    expected = drafter->forward(inputsOf(p));
  }
  drafter->save(dir.file("drafter"));
  const DrafterConfig config = loadDrafterConfig(dir.file("drafter"));
  ASSERT_TRUE(config.model.gatedDelta.has_value());
  EXPECT_EQ(config.model.gatedDelta->numValueHeads, 4);
  EXPECT_EQ(config.model.gatedDelta->valueHeadDim, 6);
  EXPECT_EQ(config.model.gatedDelta->convKernelDim, 3);
  EXPECT_EQ(config.model.layerKinds[0], LayerKind::LinearAttention);
  DFlashDrafter loaded(DFlashDrafterImpl::load(dir.file("drafter")));
  loaded->setTargetWeights(p.embed, p.lmHead);
  torch::NoGradGuard noGrad;
  EXPECT_TRUE(torch::equal(loaded->forward(inputsOf(p)), expected));

  // A config without a linear-attention shape names the key.
  std::string json = test::readBytes(dir.file("drafter/config.json"));
  const size_t key = json.find("\"linear_conv_kernel_dim\"");
  ASSERT_NE(key, std::string::npos);
  json.erase(key, json.find('\n', key) - key + 1);
  test::writeBytes(dir.file("drafter/config.json"), json);
  expectError<FormatError>([&] { DFlashDrafterImpl::load(dir.file("drafter")); },
                           {"linear_conv_kernel_dim"});
}

TEST(Drafter, AGatedDeltaDrafterLearnsThroughItsContext) {
  // With gated-delta layers only, the context features reach the blocks
  // through the context part of the recurrence alone.
  const Problem p = tinyProblem(torch::kFloat);
  DFlashDrafter drafter(tinyDrafterConfig(R"("linear_attention")"), 0, 5);
  drafter->setTargetWeights(p.embed, p.lmHead);
  drafter->loss(drafter->forward(inputsOf(p)), p.batch.labels, p.batch.weights).loss.backward();
  for (const auto &item : drafter->named_parameters())
    EXPECT_GT(item.value().grad().abs().max().item<double>(), 0) << item.key();
}

// --- The dflex attention op as the drafter's attention ------------------------------

TEST(Drafter, BundleAttentionMatchesDenseAttention) {
  const std::string dflash = test::exampleBundle("dflash");
  const std::string slidingWindow = test::exampleBundle("dflash_sliding_window");
  if (dflash.empty() || slidingWindow.empty())
    GTEST_SKIP() << "no example attention bundles (build dflex-compile, or set "
                    "DFLEX_ATTENTION_BUNDLES to the bundles of examples/*.mlir)";
  // examples/dflash.mlir and dflash_sliding_window.mlir: blocks of 16, 32
  // query and 8 key/value heads of 128; a window of 6, shorter than a block.
  DrafterConfig config =
      tinyDrafterConfig(R"("full_attention", "sliding_attention")", 32, 8, 128);
  config.dflash.blockSize = 16;
  BlockOptions options;
  options.blockSize = 16;
  options.maxAnchors = 3;
  options.maskTokenId = 299;
  torch::manual_seed(9);
  const torch::Tensor features = torch::randn({2, 40, 2 * kHidden}, torch::kDouble);
  const torch::Tensor embed = torch::randn({kVocab, kHidden}, torch::kDouble);
  const torch::Tensor lmHead = torch::randn({kVocab, kHidden}, torch::kDouble) * 0.2;
  auto run = [&](const TrainingBatch &batch, std::shared_ptr<const DrafterAttention> attention) {
    DFlashDrafter drafter(config, 0, 8);
    drafter->to(torch::kDouble);
    drafter->setTargetWeights(embed, lmHead);
    drafter->setAttention(std::move(attention));
    const torch::Tensor hidden = drafter->forward(drafterInputs(batch, features, torch::kCPU));
    drafter->loss(hidden, batch.labels, batch.weights).loss.backward();
    std::vector<torch::Tensor> results{hidden.detach()};
    for (const auto &item : drafter->named_parameters())
      results.push_back(item.value().grad());
    return results;
  };
  // One document per row, then rows packed with several documents (the
  // mask's context_start keeps each block inside its anchor's document).
  for (const auto &[what, batch] :
       {std::pair<const char *, TrainingBatch>{
            "one document per row",
            makeTrainingBatch({packedRow({40}, 40, 1), packedRow({29}, 40, 2)}, options, 5)},
        {"packed rows",
         makeTrainingBatch({packedRow({17, 23}, 40, 3), packedRow({11, 9, 20}, 40, 4)}, options,
                           6)}}) {
    SCOPED_TRACE(what);
    const auto dense = run(batch, std::make_shared<DenseDrafterAttention>());
    const auto bundle = run(batch, std::make_shared<BundleDrafterAttention>(
                                       KernelBundle::openCached(dflash), "drafter_attention",
                                       "drafter_sliding_window_attention",
                                       KernelBundle::openCached(slidingWindow)));
    ASSERT_EQ(dense.size(), bundle.size());
    double worst = 0;
    for (size_t i = 0; i < dense.size(); ++i)
      worst = std::max(worst, relativeError(bundle[i], dense[i]));
    // Both compute in float64, but the spec holds its scale as a float32.
    EXPECT_LE(worst, 1e-6);
    std::cout << "[ parity   ] bundle attention against dense, " << what
              << ": worst relative error " << worst << "\n";
  }
}

// --- The drafter through the dflex kernels, against the independent implementation ---

namespace {

/// A drafter that the example DFlash specs serve (blocks of 16, 32 query and
/// 8 key/value heads of 128): full, sliding-window, full layers.
DrafterConfig exampleSpecDrafterConfig() {
  DrafterConfig config =
      tinyDrafterConfig(R"("full_attention", "sliding_attention", "full_attention")", 32, 8, 128);
  config.dflash.blockSize = 16;
  config.model.slidingWindow = 20;
  return config;
}

/// Two rows of 150 tokens (not a multiple of any tile): documents of 60 and
/// 90 tokens (blocks of the second see context from 60 on), and of 35 and 80
/// tokens with padding; bfloat16 features.
Problem exampleSpecProblem() {
  BlockOptions options;
  options.blockSize = 16;
  options.maxAnchors = 6;
  options.maskTokenId = 299;
  Problem p;
  p.batch = makeTrainingBatch({packedRow({60, 90}, 150, 7), packedRow({35, 80}, 150, 8)},
                              options, 9);
  torch::manual_seed(12);
  p.features = torch::randn({2, 150, 2 * kHidden}).to(torch::kBFloat16);
  p.embed = torch::randn({kVocab, kHidden}).to(torch::kBFloat16);
  p.lmHead = (torch::randn({kVocab, kHidden}) * 0.2).to(torch::kBFloat16);
  return p;
}

/// The worst relative errors of one drafter run against the reference.
struct DrafterErrors {
  double hidden = 0, loss = 0, gradient = 0;
  std::string worstParameter;
};

/// Runs `drafter` (its parameters' gradients cleared first) with `attention`
/// on `device`, forward and backward, and measures it against `reference`.
DrafterErrors runAgainstReference(DFlashDrafter &drafter,
                                  std::shared_ptr<const DrafterAttention> attention,
                                  const Problem &p, torch::Device device,
                                  const SafeTensorsFile &reference) {
  drafter->zero_grad();
  drafter->setTargetWeights(p.embed.to(device), p.lmHead.to(device));
  drafter->setAttention(std::move(attention));
  const torch::Tensor hidden =
      drafter->forward(drafterInputs(p.batch, p.features.to(device), device));
  EXPECT_EQ(hidden.device().type(), device.type());
  const BlockLossResult loss =
      drafter->loss(hidden, p.batch.labels.to(device), p.batch.weights.to(device));
  loss.loss.backward();
  DrafterErrors errors;
  errors.hidden = relativeError(hidden, reference.tensor("hidden"));
  errors.loss = relativeError(loss.loss, reference.tensor("loss"));
  for (const auto &item : drafter->named_parameters()) {
    if (!item.value().grad().defined()) {
      ADD_FAILURE() << item.key() << " has no gradient";
      continue;
    }
    const double error = relativeError(item.value().grad(), reference.tensor("grad." + item.key()));
    if (error > errors.gradient) {
      errors.gradient = error;
      errors.worstParameter = item.key();
    }
  }
  return errors;
}

/// The drafter in bfloat16 on `device` through the example DFlash specs
/// (forward and backward), and through the dense attention for scale,
/// against the float64 reference on the same device.
void expectKernelAttentionMatchesReference(torch::Device device) {
  const std::string full = test::exampleBundle("dflash");
  const std::string sliding = test::exampleBundle("dflash_sliding_window");
  if (full.empty() || sliding.empty())
    GTEST_SKIP() << "needs the dflash and dflash_sliding_window example bundles (build "
                    "dflex-compile, or set DFLEX_ATTENTION_BUNDLES)";
  TempDir dir;
  const Problem p = exampleSpecProblem();
  DFlashDrafter drafter(exampleSpecDrafterConfig(), 0, 42);
  drafter->to(device, torch::kBFloat16);
  writeDrafterReference(dir, drafter, p, device.is_cuda() ? "cuda" : "cpu");
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const SafeTensorsFile reference = SafeTensorsFile::open(dir.file("reference.safetensors"));
  // Packed rows: the reference sees blocks whose context starts after 0.
  ASSERT_TRUE((p.batch.blockValid & (p.batch.contextStart > 0)).any().item<bool>());

  const DrafterErrors kernels = runAgainstReference(
      drafter,
      std::make_shared<BundleDrafterAttention>(KernelBundle::openCached(full), "drafter_attention",
                                               "drafter_sliding_window_attention",
                                               KernelBundle::openCached(sliding)),
      p, device, reference);
  const DrafterErrors dense =
      runAgainstReference(drafter, std::make_shared<DenseDrafterAttention>(), p, device, reference);
  // bfloat16 against float64. On the CPU the op computes in float64 and
  // rounds once: hidden 7.8e-3, loss 3.9e-5, worst gradient 1.0e-2 (the
  // dense path: 7.8e-3, 4.2e-5, 1.3e-2); the CUDA kernels also round the
  // softmax weights to bfloat16 for P V, hence the margin.
  EXPECT_LE(kernels.hidden, 2e-2);
  EXPECT_LE(kernels.loss, 2e-3);
  EXPECT_LE(kernels.gradient, 4e-2) << kernels.worstParameter;
  std::cout << "[ " << (device.is_cuda() ? "gpu parity" : "parity  ") << " ] drafter bfloat16 on "
            << device << " through the dflex "
            << (device.is_cuda() ? "kernels" : "op's CPU path") << " against float64: hidden "
            << kernels.hidden << ", loss " << kernels.loss << ", worst gradient "
            << kernels.gradient << " (" << kernels.worstParameter
            << "); dense attention in bfloat16: hidden " << dense.hidden << ", loss "
            << dense.loss << ", worst gradient " << dense.gradient << "\n";
}

} // namespace

TEST(Drafter, BundleAttentionInBfloat16MatchesTheIndependentImplementation) {
  expectKernelAttentionMatchesReference(torch::kCPU);
}

// --- On a GPU -----------------------------------------------------------------------
// Skipped without a CUDA device or the example bundles
// ($DFLEX_ATTENTION_BUNDLES; test/gpu/runtime/models.sh).

TEST(DrafterCuda, KernelAttentionMatchesTheIndependentImplementation) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "needs a CUDA device";
  expectKernelAttentionMatchesReference(torch::kCUDA);
}

// --- Training on a target model -------------------------------------------------------

TEST(Drafter, LearnsFromATargetModel) {
  TargetModelOptions targetOptions;
  targetOptions.dtype = torch::kFloat;
  const TargetModel target = TargetModel::load(test::referenceTarget("qwen3"), targetOptions);
  const int64_t hidden = target.config().hiddenSize, vocab = target.config().vocabSize;

  DrafterConfig config = tinyDrafterConfig(R"("full_attention", "sliding_attention")");
  config.model.hiddenSize = hidden;
  config.model.vocabSize = vocab;
  config.dflash.targetLayerIds = {0, 1};
  DFlashDrafter drafter(config, 0, 4);
  drafter->setTargetWeights(target.embedTokens(), target.lmHead());

  BlockOptions options;
  options.blockSize = kBlockSize;
  options.maxAnchors = 8;
  options.maskTokenId = 299;
  const TrainingBatch batch =
      makeTrainingBatch({packedRow({24, 40}, 64, 21), packedRow({64}, 64, 22)}, options, 3);
  TargetInputs targetInputs;
  targetInputs.inputIds = batch.tokens;
  targetInputs.positionIds = batch.positionIds;
  targetInputs.cuSeqlens = batch.cuSeqlens;
  targetInputs.captureLayers = config.dflash.targetLayerIds;
  const torch::Tensor features =
      concatContextFeatures(target.forward(targetInputs).hiddenStates).clone();
  const DrafterInputs inputs = drafterInputs(batch, features, torch::kCPU);

  torch::optim::Adam optimizer(drafter->parameters(), torch::optim::AdamOptions(1e-2));
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    optimizer.zero_grad();
    const BlockLossResult loss =
        drafter->loss(drafter->forward(inputs), batch.labels, batch.weights);
    loss.loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first) << "loss " << first << " -> " << last;
  std::cout << "[ training ] drafter on a Qwen3 target: loss " << first << " -> " << last
            << " in 25 steps\n";
}
