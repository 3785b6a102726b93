// Target models against transformers on tiny random models (built by
// python/target_reference.py), also with their attention and gated-delta
// layers through the dflex ops (on the CPU; on CUDA with the kernels in
// TargetModelCuda.*), the gated delta rule against a sequential recurrence,
// and the token layouts of packed rows.
#include "TestSupport.h"
#include "ModelTestSupport.h"

#include "dflex/runtime/attention/AttentionOp.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/gated_delta/GatedDeltaOp.h"
#include "dflex/runtime/checkpoint/SafeTensors.h"
#include "dflex/runtime/models/GatedDeltaRule.h"
#include "dflex/runtime/models/KernelHooks.h"
#include "dflex/runtime/models/TargetModel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <iostream>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using namespace dflex::runtime::models;
using dflex::runtime::test::expectError;
using dflex::runtime::test::relativeError;
using dflex::runtime::test::randomGatedDelta;
using dflex::runtime::test::RuleInputs;
using dflex::runtime::test::sequentialGatedDelta;
using dflex::runtime::test::TempDir;

namespace {

/// target_reference.py's model and what transformers computes with it, on
/// `device` ("cpu" or "cuda").
void writeReference(const std::string &model, const TempDir &dir,
                    const std::string &device = "cpu") {
  auto result = test::runPythonScript("target_reference.py", "--model " + model + " --out \"" +
                                                                 dir.path().string() +
                                                                 "\" --device " + device);
  ASSERT_EQ(result.exitCode, 0) << result.output;
}

std::string dtypeName(torch::ScalarType dtype) {
  return dtype == torch::kFloat ? "float32" : "bfloat16";
}

struct Tolerance {
  double hidden, logits;
};

/// The worst relative errors of one model against one reference.
struct ParityErrors {
  double layers = 0, packedLayers = 0, finalNorm = 0, logits = 0;
};

/// Loads the model with `options`, runs the plain and the packed inputs of
/// the reference (transformers in `referenceDtype`, default options.dtype),
/// checks every layer, the final norm and the logits, and prints the worst
/// errors.
ParityErrors expectMatchesReference(const std::string &model, const TempDir &dir,
                                    const TargetModelOptions &options, Tolerance tolerance,
                                    const std::string &label = "",
                                    std::optional<torch::ScalarType> referenceDtype = {}) {
  const torch::ScalarType dtype = options.dtype;
  const std::string dtypeName =
      ::dtypeName(dtype) +
      (referenceDtype ? " against transformers in " + ::dtypeName(*referenceDtype) : "");
  const SafeTensorsCheckpoint reference = SafeTensorsCheckpoint::open(
      dir.file("reference_" + ::dtypeName(referenceDtype.value_or(dtype)) + ".safetensors"));
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
  std::cout << "[ parity   ] " << model << " " << dtypeName << label
            << ": worst layer relative error " << worstHidden << ", packed " << worstPacked
            << ", final norm " << finalError << ", logits " << logitError << "\n";
  return {worstHidden, worstPacked, finalError, logitError};
}

TargetModelOptions onCpu(torch::ScalarType dtype) {
  TargetModelOptions options;
  options.dtype = dtype;
  return options;
}

// Both sides compute float32 in the same order up to rounding.
constexpr Tolerance kFloat32Tolerance{2e-5, 2e-5};
// bfloat16 keeps 8 bits: both sides round after every operation, in
// slightly different orders.
constexpr Tolerance kBfloat16Tolerance{1.5e-2, 1.5e-2};

void expectParity(const std::string &model) {
  TempDir dir;
  writeReference(model, dir);
  if (::testing::Test::HasFatalFailure())
    return;
  expectMatchesReference(model, dir, onCpu(torch::kFloat), kFloat32Tolerance);
  expectMatchesReference(model, dir, onCpu(torch::kBFloat16), kBfloat16Tolerance);
}

// --- Through the dflex ops ------------------------------------------------------------

/// How often the hooks ran, and whether every call was on the model's device.
struct HookCalls {
  int attention = 0, gatedDelta = 0;
  bool onModelDevice = true;
};

/// `options` with the dflex ops of model_specs.mlir as the hooks of
/// target_reference.py's `model` (qwen3_gpu or qwen3_5_gpu), counting calls.
TargetModelOptions withKernelHooks(TargetModelOptions options, const std::string &bundle,
                                   const std::string &model,
                                   const std::shared_ptr<HookCalls> &calls) {
  const bool hybrid = model == "qwen3_5_gpu";
  const SelfAttentionFn attention =
      hybrid ? attentionHook(KernelBundle::openCached(bundle), "qwen3_5_attention")
             : attentionHook(KernelBundle::openCached(bundle), "qwen3_attention", "qwen3_sliding_attention");
  // The type only: the model's "cuda" is the tensors' "cuda:0".
  const torch::DeviceType device = options.device.type();
  options.attention = [attention, calls, device](const SelfAttentionCall &call) {
    ++calls->attention;
    calls->onModelDevice = calls->onModelDevice && call.q.device().type() == device;
    return attention(call);
  };
  if (hybrid) {
    const GatedDeltaFn gatedDelta = gatedDeltaHook(GatedDeltaBundle::openCached(bundle), "qwen3_5_gated_delta");
    options.gatedDelta = [gatedDelta, calls, device](const GatedDeltaCall &call) {
      ++calls->gatedDelta;
      calls->onModelDevice = calls->onModelDevice && call.q.device().type() == device;
      return gatedDelta(call);
    };
  }
  return options;
}

/// Each forward of expectMatchesReference (plain and packed) runs every
/// layer once: qwen3_gpu has 4 attention layers, qwen3_5_gpu 2 of each kind.
void expectEveryLayerHooked(const std::string &model, const HookCalls &calls, int forwards) {
  const bool hybrid = model == "qwen3_5_gpu";
  EXPECT_EQ(calls.attention, forwards * (hybrid ? 2 : 4)) << model;
  EXPECT_EQ(calls.gatedDelta, forwards * (hybrid ? 2 : 0)) << model;
  EXPECT_TRUE(calls.onModelDevice) << model;
}

/// On the CPU the attention hook runs the op's float64 reference (the
/// gated-delta hook is the model's own rule there): the results stay within
/// the tolerances of the plain model.
void expectHookedParityOnCpu(const std::string &model) {
  const std::string bundle = test::modelSpecsBundle();
  if (bundle.empty())
    GTEST_SKIP() << "no model_specs bundle (build dflex-compile, or set "
                    "DFLEX_MODEL_BUNDLES to a folder holding model_specs/)";
  TempDir dir;
  writeReference(model, dir);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto calls = std::make_shared<HookCalls>();
  expectMatchesReference(model, dir, withKernelHooks(onCpu(torch::kFloat), bundle, model, calls),
                         kFloat32Tolerance, " through the dflex ops");
  expectMatchesReference(model, dir,
                         withKernelHooks(onCpu(torch::kBFloat16), bundle, model, calls),
                         kBfloat16Tolerance, " through the dflex ops");
  expectEveryLayerHooked(model, *calls, 4);
}

} // namespace

TEST(TargetModel, Qwen3MatchesTransformers) { expectParity("qwen3"); }

TEST(TargetModel, Qwen3TiedBiasedSlidingYarnMatchesTransformers) {
  expectParity("qwen3_variant");
}

TEST(TargetModel, Qwen35HybridMatchesTransformers) { expectParity("qwen3_5"); }

TEST(TargetModelHooks, Qwen3ThroughTheAttentionOpMatchesTransformers) {
  expectHookedParityOnCpu("qwen3_gpu");
}

TEST(TargetModelHooks, Qwen35ThroughTheOpsMatchesTransformers) {
  expectHookedParityOnCpu("qwen3_5_gpu");
}

namespace {

struct AttentionProblem {
  torch::Tensor q, k, v;
};

AttentionProblem randomAttention(int64_t length, int64_t heads, int64_t kvHeads, int64_t headDim) {
  torch::manual_seed(17);
  return {torch::randn({2, length, heads, headDim}, torch::kDouble),
          torch::randn({2, length, kvHeads, headDim}, torch::kDouble),
          torch::randn({2, length, kvHeads, headDim}, torch::kDouble)};
}

} // namespace

TEST(TargetModelHooks, AttentionHookIsTheModelsAttention) {
  const std::string bundle = test::modelSpecsBundle();
  if (bundle.empty())
    GTEST_SKIP() << "no model_specs bundle";
  const SelfAttentionFn hook = attentionHook(KernelBundle::openCached(bundle), "qwen3_attention", "qwen3_sliding_attention");
  const AttentionProblem p = randomAttention(37, 4, 2, 128);
  const double scale = 1.0 / std::sqrt(128.0);
  // Rows; packed rows of 10 + 27 and 1 + 36 tokens; full and windowed.
  for (const TokenLayout &layout :
       {TokenLayout::rows(2, 37, torch::kCPU),
        TokenLayout::packed(torch::tensor({0, 10, 37, 38, 74}, torch::kInt), 2, 37, torch::kCPU)})
    for (std::optional<int64_t> window : {std::optional<int64_t>(), std::optional<int64_t>(5)}) {
      const torch::Tensor got = hook({p.q, p.k, p.v, layout, window, scale});
      const torch::Tensor want = causalAttention(p.q, p.k, p.v, layout, window, scale);
      // float64 on both sides; the spec holds its scale as a float32.
      EXPECT_LE(relativeError(got, want), 1e-7)
          << (layout.isPacked() ? "packed" : "rows") << " window " << window.value_or(0);
    }
}

TEST(TargetModelHooks, AttentionHookRefusesWhatItCannotServe) {
  const std::string bundle = test::modelSpecsBundle();
  if (bundle.empty())
    GTEST_SKIP() << "no model_specs bundle";
  // Specs in the wrong role, or whose mask is not the model's.
  expectError<FormatError>([&] { attentionHook(KernelBundle::openCached(bundle), "qwen3_sliding_attention"); },
                           {"spec 'qwen3_sliding_attention'", "captures a window",
                            "as the sliding-window spec"});
  expectError<FormatError>([&] { attentionHook(KernelBundle::openCached(bundle), "qwen3_attention", "qwen3_attention"); },
                           {"sliding-window layers must capture the window"});
  expectError<FormatError>(
      [&] { attentionHook(KernelBundle::openCached(bundle), "qwen3_attention", "window_too_wide"); },
      {"spec 'window_too_wide'", "not the document-causal sliding-window (q - kv < window) pattern",
       "sequences [0, 5) and [5, 12) with window 3", "query 3 of head 0 sees key 0"});

  // Calls whose layer does not fit the spec.
  const SelfAttentionFn hook = attentionHook(KernelBundle::openCached(bundle), "qwen3_5_attention");
  const TokenLayout rows = TokenLayout::rows(2, 9, torch::kCPU);
  const AttentionProblem wide = randomAttention(9, 4, 2, 128);
  expectError<FormatError>(
      [&] { hook({wide.q, wide.k, wide.v, rows, std::nullopt, 1.0 / std::sqrt(128.0)}); },
      {"spec 'qwen3_5_attention'", "4 query and 2 key/value heads of head_dim 64",
       "the layer q [2, 9, 4, 128]"});
  const AttentionProblem moreHeads = randomAttention(9, 8, 2, 64);
  expectError<FormatError>(
      [&] { hook({moreHeads.q, moreHeads.k, moreHeads.v, rows, std::nullopt, 0.125}); },
      {"the layer q [2, 9, 8, 64]"});
  const AttentionProblem fits = randomAttention(9, 4, 2, 64);
  expectError<FormatError>([&] { hook({fits.q, fits.k, fits.v, rows, std::nullopt, 0.5}); },
                           {"the spec's scale 0.125", "differs from the layer's 0.5"});
  expectError<FormatError>([&] { hook({fits.q, fits.k, fits.v, rows, 4, 0.125}); },
                           {"a sliding-window layer (window 4) needs a spec for sliding-window "
                            "layers; the hook has none"});
}

TEST(TargetModelHooks, AttentionHookTakesOnlyTheModelsKindOfMask) {
  // The example specs: a causal mask without document ids (rows only), a
  // score_mod, a mask with captures the model does not have.
  const std::string causal = test::exampleBundle("causal");
  const std::string alibi = test::exampleBundle("alibi");
  const std::string dflash = test::exampleBundle("dflash");
  if (causal.empty() || alibi.empty() || dflash.empty())
    GTEST_SKIP() << "no example attention bundles";
  const SelfAttentionFn hook = attentionHook(KernelBundle::openCached(causal), "causal_attention");
  const AttentionProblem p = randomAttention(20, 32, 8, 128);
  const double scale = 1.0 / std::sqrt(128.0);
  const TokenLayout rows = TokenLayout::rows(2, 20, torch::kCPU);
  EXPECT_LE(relativeError(hook({p.q, p.k, p.v, rows, std::nullopt, scale}),
                          causalAttention(p.q, p.k, p.v, rows, std::nullopt, scale)),
            1e-7);
  const TokenLayout packed =
      TokenLayout::packed(torch::tensor({0, 8, 20, 40}, torch::kInt), 2, 20, torch::kCPU);
  expectError<FormatError>([&] { hook({p.q, p.k, p.v, packed, std::nullopt, scale}); },
                           {"spec 'causal_attention'", "packed rows need a spec whose mask "
                                                       "captures document_ids"});
  expectError<FormatError>([&] { attentionHook(KernelBundle::openCached(alibi), "alibi_attention"); },
                           {"has a score_mod ('alibi')"});
  expectError<FormatError>([&] { attentionHook(KernelBundle::openCached(dflash), "drafter_attention"); },
                           {"capture 'anchors' is not one the target model provides"});
}

// --- On a GPU ------------------------------------------------------------------------
// Skipped without a CUDA device or the model_specs bundle
// ($DFLEX_MODEL_BUNDLES; test/gpu/runtime/models.sh).

namespace {

/// transformers in bfloat16 against itself in float32: the worst relative
/// error over the layers (plain and packed rows), the final norm and the
/// logits. That is bfloat16's own error at this depth, the scale of what two
/// bfloat16 implementations may differ by.
double transformersBfloat16Error(const TempDir &dir) {
  const SafeTensorsCheckpoint wide =
      SafeTensorsCheckpoint::open(dir.file("reference_float32.safetensors"));
  const SafeTensorsCheckpoint narrow =
      SafeTensorsCheckpoint::open(dir.file("reference_bfloat16.safetensors"));
  double worst = 0;
  for (const std::string &name : wide.names())
    if (name.find("layer_") != std::string::npos || name == "final" || name == "logits")
      worst = std::max(worst, relativeError(narrow.tensor(name), wide.tensor(name)));
  return worst;
}

/// The model in bfloat16 on CUDA with its attention and gated-delta layers
/// through the dflex kernels, against transformers on the same GPU: in
/// bfloat16 and in float32, both within twice bfloat16's own error (at
/// least the CPU tolerance).
void expectKernelParity(const std::string &model) {
  const std::string bundle = test::modelSpecsBundle();
  if (!torch::cuda::is_available() || bundle.empty())
    GTEST_SKIP() << "needs a CUDA device and the model_specs bundle (DFLEX_MODEL_BUNDLES)";
  TempDir dir;
  writeReference(model, dir, "cuda");
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const double bfloat16Error = transformersBfloat16Error(dir);
  const double bound = std::max(kBfloat16Tolerance.hidden, 2 * bfloat16Error);
  TargetModelOptions options;
  options.dtype = torch::kBFloat16;
  options.device = torch::kCUDA;
  auto calls = std::make_shared<HookCalls>();
  const TargetModelOptions hooked = withKernelHooks(options, bundle, model, calls);
  const std::string label = " on CUDA through the dflex kernels";
  const ParityErrors errors = expectMatchesReference(model, dir, hooked, {bound, bound}, label);
  const ParityErrors wide =
      expectMatchesReference(model, dir, hooked, {bound, bound}, label, torch::kFloat);
  expectEveryLayerHooked(model, *calls, 4);
  std::cout << "[ gpu parity ] target " << model << " (bfloat16, dflex kernels) against "
            << "transformers on the same GPU: worst layer " << errors.layers << ", packed rows "
            << errors.packedLayers << ", final norm " << errors.finalNorm << ", logits "
            << errors.logits << " (bound " << bound << "); against transformers in float32: "
            << "worst layer " << std::max(wide.layers, wide.packedLayers) << ", logits "
            << wide.logits << ", where transformers' own bfloat16 reaches " << bfloat16Error
            << "\n";
}

} // namespace

TEST(TargetModelCuda, Qwen3ThroughTheKernelsMatchesTransformers) { expectKernelParity("qwen3_gpu"); }

TEST(TargetModelCuda, Qwen35ThroughTheKernelsMatchesTransformers) {
  expectKernelParity("qwen3_5_gpu");
}

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


TEST(GatedDelta, ChunkedMatchesTheSequentialRecurrence) {
  const RuleInputs in = randomGatedDelta(2, 37);
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
  const RuleInputs in = randomGatedDelta(2, 30);
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
