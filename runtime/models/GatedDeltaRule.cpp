// GatedDeltaRule.h: the chunked gated delta rule and the causal depthwise
// convolution of Qwen3.5's linear-attention layers, in plain LibTorch.
#include "dflex/runtime/models/GatedDeltaRule.h"

#include "dflex/Support/Error.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace dflex::runtime::models {

namespace {

using torch::Tensor;

std::string shapeOf(const Tensor &t) { return c10::str(t.sizes()); }

} // namespace

GatedDeltaOptions shortCallOptions(int64_t tokens) {
  GatedDeltaOptions options;
  options.chunkSize = std::min(options.chunkSize, tokens);
  return options;
}

Tensor gatedDeltaRule(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g,
                      const Tensor &beta, const GatedDeltaOptions &options) {
  return gatedDeltaRuleWithState(q, k, v, g, beta, Tensor(), options).output;
}

GatedDeltaResult gatedDeltaRuleWithState(const Tensor &q, const Tensor &k, const Tensor &v,
                                         const Tensor &g, const Tensor &beta,
                                         const Tensor &initialState,
                                         const GatedDeltaOptions &options,
                                         const std::vector<int64_t> &statesAfter) {
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.dim() != 4 || v.size(0) != q.size(0) ||
      v.size(1) != q.size(1) || q.size(2) == 0 || v.size(2) % q.size(2) != 0 ||
      g.sizes() != v.sizes().slice(0, 3) || beta.sizes() != g.sizes())
    throw FormatError("gated delta rule: expected q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] with Hv "
                      "a multiple of Hk, g and beta [B, T, Hv], got q " +
                      shapeOf(q) + ", k " + shapeOf(k) + ", v " + shapeOf(v) + ", g " +
                      shapeOf(g) + ", beta " + shapeOf(beta));
  if (initialState.defined() &&
      initialState.sizes() != torch::IntArrayRef({q.size(0), v.size(2), q.size(3), v.size(3)}))
    throw FormatError("gated delta rule: the initial state must be [B, Hv, Dk, Dv] = " +
                      c10::str(torch::IntArrayRef({q.size(0), v.size(2), q.size(3), v.size(3)})) +
                      ", got " + shapeOf(initialState));
  if (options.chunkSize <= 0)
    throw FormatError("gated delta rule: chunk size must be positive");
  const torch::ScalarType wide = computeType(q);
  const int64_t batch = q.size(0), length = q.size(1), keyDim = q.size(3);
  const int64_t heads = v.size(2), valueDim = v.size(3), groups = heads / q.size(2);
  const int64_t chunk = options.chunkSize;
  const int64_t padding = (chunk - length % chunk) % chunk;
  const int64_t chunks = (length + padding) / chunk;

  // [B, Hv, T, D] in the compute type, padded to whole chunks with zeros
  // (beta = 0 and g = 0 there: no state update, no decay).
  auto perHead = [&](const Tensor &x) {
    return torch::constant_pad_nd(x.to(wide).transpose(1, 2), {0, 0, 0, padding});
  };
  auto perHeadScalar = [&](const Tensor &x) {
    return torch::constant_pad_nd(x.to(wide).transpose(1, 2), {0, padding});
  };
  Tensor query = repeatHeads(q, groups).to(wide);
  Tensor key = repeatHeads(k, groups).to(wide);
  if (options.qkL2Norm) {
    query = query * torch::rsqrt(query.pow(2).sum(-1, true) + 1e-6);
    key = key * torch::rsqrt(key.pow(2).sum(-1, true) + 1e-6);
  }
  query = query * (options.scale > 0 ? options.scale : 1.0 / std::sqrt(double(keyDim)));
  const std::vector<int64_t> chunked{batch, heads, chunks, chunk};
  auto withDim = [&](int64_t dim) {
    return std::vector<int64_t>{batch, heads, chunks, chunk, dim};
  };
  query = perHead(query).reshape(withDim(keyDim));
  key = perHead(key).reshape(withDim(keyDim));
  const Tensor value = perHead(v).reshape(withDim(valueDim));
  const Tensor betas = perHeadScalar(beta).reshape(chunked).unsqueeze(-1);
  // Cumulative log decay within each chunk: gamma_t = g_1 + ... + g_t.
  const Tensor gamma = perHeadScalar(g).reshape(chunked).cumsum(-1);

  // decay[i, j] = exp(gamma_i - gamma_j) for j <= i, else 0.
  const Tensor lower = torch::ones({chunk, chunk}, torch::TensorOptions(torch::kBool)
                                                       .device(q.device()))
                           .tril();
  const Tensor decay =
      (gamma.unsqueeze(-1) - gamma.unsqueeze(-2)).masked_fill(lower.logical_not(), -INFINITY).exp();
  const Tensor keyT = key.transpose(-1, -2);
  // Within a chunk, the values written to the state solve
  // (I + A) u = beta v - beta exp(gamma) k S_0 with A[i, j] = beta_i
  // exp(gamma_i - gamma_j) k_i.k_j strictly below the diagonal (the
  // unit-triangular solve ignores the diagonal).
  const Tensor system = torch::matmul(key * betas, keyT) * decay;
  const Tensor newValues =
      torch::linalg_solve_triangular(system, value * betas, /*upper=*/false, /*left=*/true,
                                     /*unitriangular=*/true);
  const Tensor stateReads = torch::linalg_solve_triangular(
      system, key * betas * gamma.exp().unsqueeze(-1), false, true, true);
  const Tensor intra = torch::matmul(query, keyT) * decay;
  const Tensor decayedQuery = query * gamma.exp().unsqueeze(-1);
  const Tensor last = gamma.narrow(-1, chunk - 1, 1);
  const Tensor decayedKeyT = (key * (last - gamma).exp().unsqueeze(-1)).transpose(-1, -2);
  const Tensor chunkDecay = last.exp().unsqueeze(-1); // [B, Hv, n, 1, 1]

  Tensor state = initialState.defined()
                     ? initialState.to(query.device(), wide)
                     : torch::zeros({batch, heads, keyDim, valueDim}, query.options());
  // The states asked for, by chunk: (the token's index in its chunk, p).
  std::vector<Tensor> kept(statesAfter.size());
  std::vector<std::vector<std::pair<int64_t, size_t>>> wanted(chunks);
  for (size_t p = 0; p < statesAfter.size(); ++p) {
    const int64_t tokens = statesAfter[p];
    if (tokens < 0 || tokens > length)
      throw FormatError("gated delta rule: a state after " + std::to_string(tokens) +
                        " tokens was asked for, the call has " + std::to_string(length));
    if (tokens == 0)
      kept[p] = state;
    else
      wanted[(tokens - 1) / chunk].push_back({(tokens - 1) % chunk, p});
  }
  std::vector<Tensor> outputs;
  outputs.reserve(chunks);
  for (int64_t c = 0; c < chunks; ++c) {
    const Tensor u = newValues.select(2, c) - torch::matmul(stateReads.select(2, c), state);
    outputs.push_back(torch::matmul(decayedQuery.select(2, c), state) +
                      torch::matmul(intra.select(2, c), u));
    if (!wanted[c].empty()) {
      // After token i of the chunk: exp(gamma_i) S_0 + sum_{j <= i}
      // exp(gamma_i - gamma_j) k_j u_j^T, decay's row i.
      std::vector<int64_t> rows;
      for (const auto &entry : wanted[c])
        rows.push_back(entry.first);
      const Tensor index = torch::tensor(rows, torch::kLong).to(q.device());
      const Tensor weights = decay.select(2, c).index_select(2, index); // [B, Hv, p, C]
      const Tensor weightedKeysT =
          keyT.select(2, c).unsqueeze(2) * weights.unsqueeze(-2); // [B, Hv, p, Dk, C]
      const Tensor growth = gamma.select(2, c).index_select(2, index).exp(); // [B, Hv, p]
      const Tensor states = state.unsqueeze(2) * growth.unsqueeze(-1).unsqueeze(-1) +
                            torch::matmul(weightedKeysT, u.unsqueeze(2));
      for (size_t i = 0; i < rows.size(); ++i)
        kept[wanted[c][i].second] = states.select(2, int64_t(i));
    }
    state = state * chunkDecay.select(2, c) + torch::matmul(decayedKeyT.select(2, c), u);
  }
  // The padding (beta = 0, g = 0) leaves the state as the last token left it.
  GatedDeltaResult result{
      torch::cat(outputs, 2).narrow(2, 0, length).transpose(1, 2).to(q.scalar_type()), state, {}};
  if (!kept.empty())
    result.states = torch::stack(kept, 1);
  return result;
}

Tensor gatedDeltaRule(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g,
                      const Tensor &beta, const TokenLayout &layout,
                      const GatedDeltaOptions &options) {
  if (!layout.isPacked())
    return gatedDeltaRule(q, k, v, g, beta, options);
  Tensor out = torch::empty({v.size(0), v.size(1), v.size(2), v.size(3)}, q.options());
  for (const TokenLayout::Segment &s : layout.segments()) {
    auto piece = [&](const Tensor &x) {
      return x.narrow(0, s.row, 1).narrow(1, s.begin, s.end - s.begin);
    };
    piece(out).copy_(gatedDeltaRule(piece(q), piece(k), piece(v), piece(g), piece(beta), options));
  }
  return out;
}

Tensor causalDepthwiseConv(const Tensor &x, const Tensor &weight, const TokenLayout &layout) {
  if (x.dim() != 3 || weight.dim() != 3 || weight.size(0) != x.size(2) || weight.size(1) != 1)
    throw FormatError("causal depthwise convolution: expected x [B, T, C] and weight [C, 1, K], "
                      "got x " +
                      shapeOf(x) + ", weight " + shapeOf(weight));
  const torch::ScalarType wide = computeType(x);
  const int64_t length = x.size(1), taps = weight.size(2);
  const Tensor input = x.to(wide);
  const Tensor w = weight.to(wide).squeeze(1); // [C, K]
  Tensor out = torch::zeros(input.sizes(), input.options());
  // Tap K - 1 - shift reads x[t - shift]; oldest first, as a convolution sums.
  for (int64_t shift = std::min(taps - 1, length - 1); shift >= 0; --shift) {
    Tensor shifted =
        shift == 0 ? input
                   : torch::constant_pad_nd(input.narrow(1, 0, length - shift), {0, 0, shift, 0});
    if (layout.isPacked() && shift > 0)
      shifted = shifted * (layout.offsets() >= shift).unsqueeze(-1).to(wide);
    out = out + shifted * w.select(1, taps - 1 - shift);
  }
  return out.to(x.scalar_type());
}

} // namespace dflex::runtime::models
