// The gated delta rule of Qwen3.5's linear-attention layers, in plain
// LibTorch (any device): the chunked (UT-transform) algorithm, and the short
// causal depthwise convolution in front of it. On the GPU the dflex
// gated-delta op replaces gatedDeltaRule through TargetModelOptions::gatedDelta
// (gatedDeltaHook, dflex/runtime/models/KernelHooks.h).
//
// Per value head, with the state S [Dk, Dv] in float32:
//   S_t = exp(g_t) S_{t-1};  u_t = beta_t (v_t - S_t^T k_t);
//   S_t = S_t + k_t u_t^T;   o_t = S_t^T (scale q_t)
// q and k optionally L2-normalised first (x / sqrt(sum x^2 + 1e-6)).
#pragma once

#include "dflex/runtime/models/Layers.h"

#include <torch/types.h>

#include <vector>

namespace dflex::runtime::models {

struct GatedDeltaOptions {
  /// Tokens per chunk of the chunked algorithm (the result does not depend
  /// on it beyond rounding).
  int64_t chunkSize = 64;
  bool qkL2Norm = true;
  /// 0: 1 / sqrt(Dk).
  double scale = 0;
};

/// The options of a short call of `tokens` tokens (a decoding step, a
/// drafter block): one chunk of its own length, not padded to 64 (one token
/// at a time is the plain recurrence).
GatedDeltaOptions shortCallOptions(int64_t tokens);

/// q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], g and beta [B, T, Hv] (g <= 0, in
/// log space), Hv a multiple of Hk (key head h serves value heads
/// [h * Hv/Hk, (h + 1) * Hv/Hk)). Every row is one sequence starting from a
/// zero state. Computes in float32 (float64 for float64 inputs); returns
/// [B, T, Hv, Dv] in the dtype of q.
torch::Tensor gatedDeltaRule(const torch::Tensor &q, const torch::Tensor &k,
                             const torch::Tensor &v, const torch::Tensor &g,
                             const torch::Tensor &beta, const GatedDeltaOptions &options = {});

/// The output of a gated-delta call and the states it passes through.
struct GatedDeltaResult {
  torch::Tensor output; ///< [B, T, Hv, Dv] in the dtype of q
  torch::Tensor state;  ///< [B, Hv, Dk, Dv] in the compute type
  /// With statesAfter: [B, P, Hv, Dk, Dv] in the compute type.
  torch::Tensor states;
};

/// gatedDeltaRule continuing from `initialState` [B, Hv, Dk, Dv] (any
/// floating dtype; undefined: zero) instead of a zero state, also returning
/// the state after the last token (the incremental decoding of
/// TargetModel's cached forward). The same computation: with an undefined
/// initial state the output equals gatedDeltaRule's to the bit.
/// `statesAfter` [P] asks for the state after the first statesAfter[p]
/// tokens of every row, each in [0, T] (0: the initial state), taken from
/// the chunk that holds the token (the drafter's states at its anchors).
GatedDeltaResult gatedDeltaRuleWithState(const torch::Tensor &q, const torch::Tensor &k,
                                         const torch::Tensor &v, const torch::Tensor &g,
                                         const torch::Tensor &beta,
                                         const torch::Tensor &initialState,
                                         const GatedDeltaOptions &options = {},
                                         const std::vector<int64_t> &statesAfter = {});

/// q or k as the rule reads them: repeated to `valueHeads` heads (key head h
/// serving value heads [h * Hv/Hk, (h + 1) * Hv/Hk)), in the compute type,
/// L2-normalised under options.qkL2Norm. [B, T, Hk, D] -> [B, T, Hv, D].
torch::Tensor perValueHead(const torch::Tensor &x, int64_t valueHeads,
                           const GatedDeltaOptions &options = {});

/// The queries through which a call's outputs read its initial state: with
/// S_0 that state, the output of gatedDeltaRuleWithState is
/// scale * S_0^T q~_t plus the output of the same call from a zero state
/// (the state is affine in S_0). q, k [B, T, Hk, Dk], g and beta [B, T, Hv];
/// returns q~ [B, T, Hv, Dk] in the compute type, q and k L2-normalised
/// first under options.qkL2Norm, the scale left out. All T tokens form one
/// chunk (for short calls: a drafter block).
torch::Tensor initialStateQueries(const torch::Tensor &q, const torch::Tensor &k,
                                  const torch::Tensor &g, const torch::Tensor &beta,
                                  const GatedDeltaOptions &options = {});

/// gatedDeltaRule over the sequences of `layout`: each segment of a packed
/// row starts from a zero state.
torch::Tensor gatedDeltaRule(const torch::Tensor &q, const torch::Tensor &k,
                             const torch::Tensor &v, const torch::Tensor &g,
                             const torch::Tensor &beta, const TokenLayout &layout,
                             const GatedDeltaOptions &options = {});

/// Causal depthwise convolution over time within each sequence of `layout`:
/// out[t, c] = sum_i weight[c, 0, i] x[t + i - (K - 1), c], with x before
/// the sequence start read as 0. x [B, T, C], weight [C, 1, K]; accumulated
/// in float32 (float64 for float64 input), rounded once to the dtype of x.
torch::Tensor causalDepthwiseConv(const torch::Tensor &x, const torch::Tensor &weight,
                                  const TokenLayout &layout);

} // namespace dflex::runtime::models
