// Incremental decoding of the target models with TargetCache: token by
// token and in uneven chunks against the uncached forward of the whole
// sequence, rollback (truncate) for speculative decoding, two rows, and the
// errors. On the CPU in float32, float64 and bfloat16, on
// target_reference.py's tiny random models: qwen3,
// qwen3_variant (sliding-window layers of 24 tokens, biases, tied, YaRN) and
// qwen3_5 (gated-delta and gated attention layers).
#include "TestSupport.h"
#include "ModelTestSupport.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/models/GatedDeltaRule.h"
#include "dflex/runtime/models/TargetModel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <algorithm>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>

using namespace dflex::runtime;
using dflex::FormatError;
using namespace dflex::runtime::models;
using dflex::runtime::test::expectError;
using dflex::runtime::test::relativeError;
using dflex::runtime::test::TempDir;

namespace {

TargetModel load(const std::string &model, torch::ScalarType dtype) {
  TargetModelOptions options;
  options.dtype = dtype;
  // The cached path is plain LibTorch: a hook must not be called there.
  options.attention = [](const SelfAttentionCall &) -> torch::Tensor {
    throw std::logic_error("the attention hook ran on the cached path");
  };
  options.gatedDelta = [](const GatedDeltaCall &) -> torch::Tensor {
    throw std::logic_error("the gated-delta hook ran on the cached path");
  };
  return TargetModel::load(test::referenceTarget(model), options);
}

/// Every layer and the logits of `ids` [B, T], without a cache (and without
/// hooks: the uncached path would call them).
TargetOutputs wholeSequence(const std::string &model, torch::ScalarType dtype,
                            const torch::Tensor &ids) {
  TargetModelOptions options;
  options.dtype = dtype;
  const TargetModel target = TargetModel::load(test::referenceTarget(model), options);
  TargetInputs in;
  in.inputIds = ids;
  in.computeLogits = true;
  in.captureLayers.resize(target.config().numHiddenLayers);
  std::iota(in.captureLayers.begin(), in.captureLayers.end(), 0);
  return target.forward(in);
}

/// Outputs of consecutive cached calls, written into tensors poisoned with
/// NaN so that a token no call produced fails the comparison.
struct Assembled {
  std::vector<torch::Tensor> layers;
  torch::Tensor logits;

  Assembled(const TargetOutputs &like, int64_t length) {
    auto poisoned = [&](const torch::Tensor &t) {
      std::vector<int64_t> shape = t.sizes().vec();
      shape[1] = length;
      return torch::full(shape, NAN, t.options());
    };
    for (const torch::Tensor &h : like.hiddenStates)
      layers.push_back(poisoned(h));
    logits = poisoned(like.logits);
  }

  void write(const TargetOutputs &out, int64_t start) {
    const int64_t n = out.logits.size(1);
    for (size_t l = 0; l < layers.size(); ++l)
      layers[l].narrow(1, start, n).copy_(out.hiddenStates[l]);
    logits.narrow(1, start, n).copy_(out.logits);
  }
};

/// One cached call of `ids` [B, n] capturing every layer, with logits.
TargetOutputs step(const TargetModel &target, TargetCache &cache, const torch::Tensor &ids) {
  TargetInputs in;
  in.inputIds = ids;
  in.computeLogits = true;
  in.captureLayers.resize(target.config().numHiddenLayers);
  std::iota(in.captureLayers.begin(), in.captureLayers.end(), 0);
  const int64_t before = cache.length;
  TargetOutputs out = target.forward(in, cache);
  EXPECT_EQ(cache.length, before + ids.size(1));
  EXPECT_EQ(cache.lengthBeforeLastForward, before);
  EXPECT_EQ(out.logits.sizes(),
            torch::IntArrayRef({ids.size(0), ids.size(1), target.config().vocabSize}));
  return out;
}

/// The worst relative error of the layers and of the logits over tokens
/// [begin, end) against the uncached forward.
struct Errors {
  double layers = 0, logits = 0;
};

Errors compare(const Assembled &got, const TargetOutputs &want, int64_t begin, int64_t end) {
  Errors e;
  auto span = [&](const torch::Tensor &x) { return x.narrow(1, begin, end - begin); };
  for (size_t l = 0; l < got.layers.size(); ++l)
    e.layers = std::max(e.layers, relativeError(span(got.layers[l]), span(want.hiddenStates[l])));
  e.logits = relativeError(span(got.logits), span(want.logits));
  // NaN (a poisoned token) compares false: report it as infinite.
  if (!(e.layers == e.layers))
    e.layers = INFINITY;
  if (!(e.logits == e.logits))
    e.logits = INFINITY;
  return e;
}

/// The cached calls compute the same values in other shapes (and the gated
/// delta rule in other chunks): rounding only, float64's at 1e-16 here,
/// float32's at 4e-7; bfloat16 rounds every step, as the parity tests allow.
double tolerance(torch::ScalarType dtype) {
  return dtype == torch::kDouble ? 1e-13 : dtype == torch::kFloat ? 1e-5 : 1.5e-2;
}

const char *name(torch::ScalarType dtype) {
  return dtype == torch::kDouble ? "float64" : dtype == torch::kFloat ? "float32" : "bfloat16";
}

/// The cache's tensors have the shapes of TargetCache's documentation.
void expectCacheShapes(const TargetModel &target, const TargetCache &cache) {
  const TransformerConfig &c = target.config();
  ASSERT_EQ(int64_t(cache.layers.size()), c.numHiddenLayers);
  for (int64_t l = 0; l < c.numHiddenLayers; ++l) {
    const TargetCache::Layer &layer = cache.layers[l];
    if (c.layerKinds.at(l) == LayerKind::LinearAttention) {
      const GatedDeltaConfig &g = *c.gatedDelta;
      EXPECT_EQ(layer.gatedDelta.state.sizes(),
                torch::IntArrayRef({cache.batch, g.numValueHeads, g.keyHeadDim, g.valueHeadDim}));
      EXPECT_EQ(layer.gatedDelta.conv.sizes(),
                torch::IntArrayRef({cache.batch,
                                    2 * g.numKeyHeads * g.keyHeadDim +
                                        g.numValueHeads * g.valueHeadDim,
                                    g.convKernelDim - 1}));
      EXPECT_FALSE(layer.attention.keys.defined());
    } else {
      const std::vector<int64_t> expected{cache.batch, cache.length, c.numKeyValueHeads, c.headDim};
      EXPECT_EQ(layer.attention.keys.sizes().vec(), expected) << "layer " << l;
      EXPECT_EQ(layer.attention.values.sizes().vec(), expected) << "layer " << l;
      EXPECT_EQ(layer.attention.keys.scalar_type(), target.dtype());
      EXPECT_FALSE(layer.gatedDelta.state.defined());
    }
  }
}

/// Decodes `ids` [B, T] through a cache in calls of `chunks` tokens (summing
/// to T) and compares every call's layers and logits with the uncached
/// forward of the whole sequence.
Errors decodeInChunks(const std::string &model, torch::ScalarType dtype, const torch::Tensor &ids,
                      const std::vector<int64_t> &chunks) {
  const TargetModel target = load(model, dtype);
  const TargetOutputs want = wholeSequence(model, dtype, ids);
  TargetCache cache;
  EXPECT_TRUE(cache.empty());
  std::optional<Assembled> got;
  int64_t start = 0;
  for (int64_t n : chunks) {
    const TargetOutputs out = step(target, cache, ids.narrow(1, start, n));
    if (!got)
      got.emplace(out, ids.size(1));
    got->write(out, start);
    start += n;
  }
  EXPECT_EQ(start, ids.size(1));
  expectCacheShapes(target, cache);
  return compare(*got, want, 0, ids.size(1));
}

constexpr int64_t kLength = 41;

void expectDecodingMatches(const std::string &model) {
  const std::vector<int64_t> tokenByToken(kLength, 1);
  const std::vector<int64_t> uneven{7, 1, 13, 2, 5, 1, 9, 3};
  const std::vector<int64_t> whole{kLength};
  for (torch::ScalarType dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16})
    for (int64_t batch : {1, 2}) {
      torch::manual_seed(100 + batch);
      const torch::Tensor ids = torch::randint(0, 512, {batch, kLength}, torch::kLong);
      for (const auto &[label, chunks] :
           {std::pair{"token by token", tokenByToken}, std::pair{"chunks 7, 1, 13, ...", uneven},
            std::pair{"one call", whole}}) {
        const Errors e = decodeInChunks(model, dtype, ids, chunks);
        EXPECT_LE(e.layers, tolerance(dtype)) << model << " " << name(dtype) << " B=" << batch
                                              << " " << label << " layers";
        EXPECT_LE(e.logits, tolerance(dtype)) << model << " " << name(dtype) << " B=" << batch
                                              << " " << label << " logits";
        std::cout << "[ cache    ] " << model << " " << name(dtype) << " B=" << batch << " "
                  << label << ": worst layer relative error " << e.layers << ", logits "
                  << e.logits << "\n";
      }
    }
}

/// Speculative decoding's rollback: 10 tokens, a draft of 6 of which 2 are
/// kept, then 4 other tokens and 12 more (past qwen3_variant's window): the
/// same as the uncached forward of the sequence that results. Also the
/// limits of truncate.
void expectRollbackMatches(const std::string &model, torch::ScalarType dtype, int64_t batch) {
  const TargetModel target = load(model, dtype);
  torch::manual_seed(7 + batch);
  const torch::Tensor prefix = torch::randint(0, 512, {batch, 10}, torch::kLong);
  const torch::Tensor draft = torch::randint(0, 512, {batch, 6}, torch::kLong);
  const torch::Tensor other = torch::randint(0, 512, {batch, 4}, torch::kLong);
  const torch::Tensor more = torch::randint(0, 512, {batch, 12}, torch::kLong);
  const torch::Tensor sequence =
      torch::cat({prefix, draft.narrow(1, 0, 2), other, more}, 1); // 28 tokens
  const TargetOutputs want = wholeSequence(model, dtype, sequence);

  TargetCache cache;
  const TargetOutputs first = step(target, cache, prefix);
  Assembled got(first, sequence.size(1));
  got.write(first, 0);
  const TargetOutputs drafted = step(target, cache, draft);
  got.write(drafted, 10); // tokens 10 and 11 are kept, 12.. overwritten below
  // Truncating twice within the last call: to 14 tokens, then to 12.
  cache.truncate(14);
  EXPECT_EQ(cache.length, 14);
  cache.truncate(12);
  EXPECT_EQ(cache.length, 12);
  expectCacheShapes(target, cache);
  expectError<FormatError>([&] { cache.truncate(9); },
                           {"cannot truncate to 9 tokens", "from 10 (before the last forward)",
                            "to 12"});
  expectError<FormatError>([&] { cache.truncate(13); }, {"cannot truncate to 13 tokens"});
  got.write(step(target, cache, other), 12);
  expectError<FormatError>([&] { cache.truncate(11); },
                           {"cannot truncate to 11 tokens", "from 12 (before the last forward)",
                            "to 16"});
  EXPECT_EQ(cache.length, 16); // the failed truncate changed nothing
  got.write(step(target, cache, more), 16);
  const Errors e = compare(got, want, 0, sequence.size(1));
  EXPECT_LE(e.layers, tolerance(dtype)) << model << " " << name(dtype) << " B=" << batch;
  EXPECT_LE(e.logits, tolerance(dtype)) << model << " " << name(dtype) << " B=" << batch;

  // Rolling the whole draft back (to the last call's start), then on.
  TargetCache again;
  Assembled whole(first, sequence.size(1));
  whole.write(step(target, again, prefix), 0);
  step(target, again, draft);
  again.truncate(10);
  whole.write(step(target, again, sequence.narrow(1, 10, 18)), 10);
  const Errors all = compare(whole, want, 0, sequence.size(1));
  EXPECT_LE(all.layers, tolerance(dtype)) << model << " whole draft rolled back";
  EXPECT_LE(all.logits, tolerance(dtype)) << model << " whole draft rolled back";
  std::cout << "[ rollback ] " << model << " " << name(dtype) << " B=" << batch
            << ": worst layer relative error " << std::max(e.layers, all.layers) << ", logits "
            << std::max(e.logits, all.logits) << "\n";
}

} // namespace

TEST(TargetCache, Qwen3DecodesLikeTheWholeSequence) { expectDecodingMatches("qwen3"); }

TEST(TargetCache, Qwen3SlidingWindowDecodesLikeTheWholeSequence) {
  // Layers 2 and 3 slide over 24 tokens; 41 tokens leave the window.
  const TransformerConfig config = load("qwen3_variant", torch::kFloat).config();
  ASSERT_EQ(config.slidingWindow.value_or(0), 24);
  ASSERT_EQ(std::count(config.layerKinds.begin(), config.layerKinds.end(),
                       LayerKind::SlidingAttention),
            2);
  expectDecodingMatches("qwen3_variant");
}

TEST(TargetCache, Qwen35HybridDecodesLikeTheWholeSequence) { expectDecodingMatches("qwen3_5"); }

TEST(TargetCache, RollbackMatchesTheAcceptedSequence) {
  for (const std::string model : {"qwen3_variant", "qwen3_5"})
    for (torch::ScalarType dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16})
      for (int64_t batch : {1, 2})
        expectRollbackMatches(model, dtype, batch);
}

TEST(TargetCache, RejectsWhatItCannotServe) {
  const TargetModel target = load("qwen3_5", torch::kFloat);
  TargetCache cache;
  TargetInputs in;
  in.inputIds = torch::randint(0, 512, {2, 5}, torch::kLong);
  target.forward(in, cache);
  EXPECT_EQ(cache.batch, 2);
  in.inputIds = torch::randint(0, 512, {3, 5}, torch::kLong);
  expectError<FormatError>([&] { target.forward(in, cache); },
                           {"the cache holds 2 rows", "input_ids [3, 5]"});
  in.inputIds = torch::randint(0, 512, {2, 0}, torch::kLong);
  expectError<FormatError>([&] { target.forward(in, cache); }, {"holds no token"});
  in.inputIds = torch::randint(0, 512, {2, 5}, torch::kLong);
  in.cuSeqlens = torch::tensor({0, 5, 10}, torch::kInt);
  expectError<FormatError>([&] { target.forward(in, cache); }, {"packed rows"});
  in.cuSeqlens = torch::Tensor();
  in.positionIds = torch::zeros({2, 4}, torch::kLong);
  expectError<FormatError>([&] { target.forward(in, cache); }, {"position_ids [2, 4]"});
  // The failed calls left the cache as it was.
  EXPECT_EQ(cache.length, 5);
  EXPECT_EQ(cache.lengthBeforeLastForward, 0);
  expectCacheShapes(target, cache);
}

// --- The pieces of the cached path ---------------------------------------------------

TEST(GatedDelta, ContinuesFromAState) {
  // 37 tokens in calls of 20, 1 and 16 carry the state over: the outputs of
  // the whole sequence, the final state of the whole sequence.
  const int64_t batch = 2, length = 37;
  const test::RuleInputs in = test::randomGatedDelta(batch, length);
  const torch::Tensor &q = in.q, &k = in.k, &v = in.v, &g = in.g, &beta = in.beta;
  const GatedDeltaResult whole = gatedDeltaRuleWithState(q, k, v, g, beta, {});
  EXPECT_TRUE(torch::equal(whole.output, gatedDeltaRule(q, k, v, g, beta)));
  EXPECT_EQ(whole.state.sizes(), torch::IntArrayRef({batch, 6, 8, 12}));
  torch::Tensor state, out = torch::full(whole.output.sizes(), NAN, whole.output.options());
  int64_t start = 0;
  for (int64_t n : {20, 1, 16}) {
    auto piece = [&](const torch::Tensor &x) { return x.narrow(1, start, n); };
    const GatedDeltaResult part =
        gatedDeltaRuleWithState(piece(q), piece(k), piece(v), piece(g), piece(beta), state);
    piece(out).copy_(part.output);
    state = part.state;
    start += n;
  }
  EXPECT_LE(relativeError(out, whole.output), 1e-12);
  EXPECT_LE(relativeError(state, whole.state), 1e-12);
  expectError<FormatError>(
      [&] { gatedDeltaRuleWithState(q, k, v, g, beta, torch::zeros({batch, 6, 12, 8})); },
      {"initial state must be [B, Hv, Dk, Dv] = [2, 6, 8, 12]", "got [2, 6, 12, 8]"});
}

TEST(GatedDelta, StatesAfterChosenTokensAreThePrefixesFinalStates) {
  // 37 tokens in chunks of 16 from a random initial state: states after 0
  // (the initial one), the first token, the ends of the first two chunks,
  // tokens inside chunks and the last, asked for out of order.
  const test::RuleInputs in = test::randomGatedDelta(2, 37);
  const torch::Tensor initial = torch::randn({2, 6, 8, 12}, torch::kDouble);
  GatedDeltaOptions options;
  options.chunkSize = 16;
  auto rule = [&](int64_t tokens, const std::vector<int64_t> &after) {
    auto prefix = [&](const torch::Tensor &x) { return x.narrow(1, 0, tokens); };
    return gatedDeltaRuleWithState(prefix(in.q), prefix(in.k), prefix(in.v), prefix(in.g),
                                   prefix(in.beta), initial, options, after);
  };
  const std::vector<int64_t> after{37, 0, 1, 16, 32, 5, 17, 33, 16};
  const GatedDeltaResult whole = rule(37, after);
  ASSERT_EQ(whole.states.sizes(), torch::IntArrayRef({2, 9, 6, 8, 12}));
  EXPECT_TRUE(torch::equal(whole.output, rule(37, {}).output));
  for (size_t p = 0; p < after.size(); ++p) {
    const torch::Tensor expected = after[p] == 0 ? initial : rule(after[p], {}).state;
    EXPECT_LE(relativeError(whole.states.select(1, int64_t(p)), expected), 1e-12)
        << "after " << after[p];
  }
  expectError<FormatError>([&] { rule(37, {38}); }, {"a state after 38 tokens", "the call has 37"});
}

TEST(GatedDelta, InitialStateQueriesReadTheStatesShareOfTheOutput) {
  // 19 tokens (across the rule's 16-token chunks) from a random state S_0:
  // the output less the zero-state output is scale * S_0^T q~, per value
  // head of a grouped call (6 value heads over 2 key heads).
  const test::RuleInputs in = test::randomGatedDelta(2, 19);
  const torch::Tensor initial = torch::randn({2, 6, 8, 12}, torch::kDouble);
  GatedDeltaOptions options;
  options.chunkSize = 16;
  const torch::Tensor fromState =
      gatedDeltaRuleWithState(in.q, in.k, in.v, in.g, in.beta, initial, options).output;
  const torch::Tensor fromZero = gatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, options);
  const torch::Tensor queries = initialStateQueries(in.q, in.k, in.g, in.beta);
  ASSERT_EQ(queries.sizes(), torch::IntArrayRef({2, 19, 6, 8}));
  const torch::Tensor read = torch::einsum("bhkv,bthk->bthv", {initial, queries}) / std::sqrt(8.0);
  EXPECT_LE(relativeError(fromZero + read, fromState), 1e-12);
  EXPECT_GT((fromState - fromZero).abs().max().item<double>(), 1e-3);
  expectError<FormatError>([&] { initialStateQueries(in.q, in.k, in.g.narrow(2, 0, 5), in.beta); },
                           {"g and beta [B, T, Hv]", "g [2, 19, 5]"});
}

TEST(CausalAttention, TheLastQueriesOverAPrefixAreTheWholeRowsQueries) {
  torch::manual_seed(5);
  const int64_t batch = 2, length = 29;
  const torch::Tensor q = torch::randn({batch, length, 6, 16}, torch::kDouble);
  const torch::Tensor k = torch::randn({batch, length, 2, 16}, torch::kDouble);
  const torch::Tensor v = torch::randn({batch, length, 2, 16}, torch::kDouble);
  const TokenLayout rows = TokenLayout::rows(batch, length, torch::kCPU);
  for (std::optional<int64_t> window : {std::optional<int64_t>(), std::optional<int64_t>(7)}) {
    const torch::Tensor whole = causalAttention(q, k, v, rows, window, 0.25);
    for (int64_t queries : {int64_t(1), int64_t(5), length}) {
      const int64_t from = length - queries;
      const torch::Tensor last =
          causalAttentionAfter(q.narrow(1, from, queries), k, v, window, 0.25);
      EXPECT_LE(relativeError(last, whole.narrow(1, from, queries)), 1e-13)
          << queries << " queries, window " << window.value_or(0);
    }
  }
  expectError<FormatError>(
      [&] { causalAttentionAfter(q, k.narrow(1, 0, 3), v.narrow(1, 0, 3), {}, 1); },
      {"causal attention after a prefix", "Tk >= Tq", "q [2, 29, 6, 16]"});
}
