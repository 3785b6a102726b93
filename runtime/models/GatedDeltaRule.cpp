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

namespace {

void checkRuleInputs(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g,
                     const Tensor &beta) {
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.dim() != 4 || v.size(0) != q.size(0) ||
      v.size(1) != q.size(1) || q.size(2) == 0 || v.size(2) % q.size(2) != 0 ||
      g.sizes() != v.sizes().slice(0, 3) || beta.sizes() != g.sizes())
    throw FormatError("gated delta rule: expected q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] with Hv "
                      "a multiple of Hk, g and beta [B, T, Hv], got q " +
                      shapeOf(q) + ", k " + shapeOf(k) + ", v " + shapeOf(v) + ", g " +
                      shapeOf(g) + ", beta " + shapeOf(beta));
}

/// The terms of the chunked algorithm for chunks of C tokens: query, key
/// [B, Hv, n, C, Dk], betas [B, Hv, n, C, 1], gamma [B, Hv, n, C] (the
/// cumulative log decay within each chunk).
struct ChunkTerms {
  Tensor decay;        ///< [.., C, C]: exp(gamma_i - gamma_j) for j <= i, else 0
  Tensor system;       ///< its strictly lower part is A of (I + A) u = ...
  Tensor stateReads;   ///< (I + A)^-1 beta exp(gamma) k: how u reads the chunk's initial state
  Tensor intra;        ///< (q_i . k_j) decay[i, j]
  Tensor decayedQuery; ///< exp(gamma_i) q_i
};

ChunkTerms chunkTerms(const Tensor &query, const Tensor &key, const Tensor &betas,
                      const Tensor &gamma) {
  const int64_t chunk = gamma.size(-1);
  const Tensor lower = torch::ones({chunk, chunk}, torch::TensorOptions(torch::kBool)
                                                       .device(query.device()))
                           .tril();
  ChunkTerms t;
  t.decay =
      (gamma.unsqueeze(-1) - gamma.unsqueeze(-2)).masked_fill(lower.logical_not(), -INFINITY).exp();
  const Tensor keyT = key.transpose(-1, -2);
  // Within a chunk, the values written to the state solve
  // (I + A) u = beta v - beta exp(gamma) k S_0 with A[i, j] = beta_i
  // exp(gamma_i - gamma_j) k_i.k_j strictly below the diagonal (the
  // unit-triangular solve ignores the diagonal).
  t.system = torch::matmul(key * betas, keyT) * t.decay;
  t.stateReads = torch::linalg_solve_triangular(t.system, key * betas * gamma.exp().unsqueeze(-1),
                                                /*upper=*/false, /*left=*/true,
                                                /*unitriangular=*/true);
  t.intra = torch::matmul(query, keyT) * t.decay;
  t.decayedQuery = query * gamma.exp().unsqueeze(-1);
  return t;
}

} // namespace

Tensor perValueHead(const Tensor &x, int64_t valueHeads, const GatedDeltaOptions &options) {
  Tensor y = repeatHeads(x, valueHeads / x.size(2)).to(computeType(x));
  return options.qkL2Norm ? y * torch::rsqrt(y.pow(2).sum(-1, true) + 1e-6) : y;
}

Tensor initialStateQueries(const Tensor &q, const Tensor &k, const Tensor &g, const Tensor &beta,
                           const GatedDeltaOptions &options) {
  if (q.dim() != 4 || k.sizes() != q.sizes() || g.dim() != 3 || g.sizes() != beta.sizes() ||
      g.size(0) != q.size(0) || g.size(1) != q.size(1) || q.size(2) == 0 ||
      g.size(2) % q.size(2) != 0)
    throw FormatError("gated delta rule: expected q, k [B, T, Hk, Dk], g and beta [B, T, Hv] with "
                      "Hv a multiple of Hk, got q " +
                      shapeOf(q) + ", k " + shapeOf(k) + ", g " + shapeOf(g) + ", beta " +
                      shapeOf(beta));
  const int64_t heads = g.size(2);
  // One chunk of all T tokens: [B, Hv, 1, T, D].
  auto chunked = [](const Tensor &x) { return x.transpose(1, 2).unsqueeze(2); };
  const torch::ScalarType wide = computeType(q);
  const Tensor query = chunked(perValueHead(q, heads, options));
  const Tensor key = chunked(perValueHead(k, heads, options));
  const ChunkTerms t = chunkTerms(query, key, chunked(beta.to(wide)).unsqueeze(-1),
                                  chunked(g.to(wide)).cumsum(-1));
  // o_i's part through S_0: exp(gamma_i) q_i S_0 - sum_j intra[i, j] stateReads_j S_0.
  return (t.decayedQuery - torch::matmul(t.intra, t.stateReads)).squeeze(2).transpose(1, 2);
}

GatedDeltaResult gatedDeltaRuleWithState(const Tensor &q, const Tensor &k, const Tensor &v,
                                         const Tensor &g, const Tensor &beta,
                                         const Tensor &initialState,
                                         const GatedDeltaOptions &options,
                                         const std::vector<int64_t> &statesAfter) {
  checkRuleInputs(q, k, v, g, beta);
  if (initialState.defined() &&
      initialState.sizes() != torch::IntArrayRef({q.size(0), v.size(2), q.size(3), v.size(3)}))
    throw FormatError("gated delta rule: the initial state must be [B, Hv, Dk, Dv] = " +
                      c10::str(torch::IntArrayRef({q.size(0), v.size(2), q.size(3), v.size(3)})) +
                      ", got " + shapeOf(initialState));
  if (options.chunkSize <= 0)
    throw FormatError("gated delta rule: chunk size must be positive");
  const torch::ScalarType wide = computeType(q);
  const int64_t batch = q.size(0), length = q.size(1), keyDim = q.size(3);
  const int64_t heads = v.size(2), valueDim = v.size(3);
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
  const double scale = options.scale > 0 ? options.scale : 1.0 / std::sqrt(double(keyDim));
  const std::vector<int64_t> chunked{batch, heads, chunks, chunk};
  auto withDim = [&](int64_t dim) {
    return std::vector<int64_t>{batch, heads, chunks, chunk, dim};
  };
  const Tensor query = perHead(perValueHead(q, heads, options) * scale).reshape(withDim(keyDim));
  const Tensor key = perHead(perValueHead(k, heads, options)).reshape(withDim(keyDim));
  const Tensor value = perHead(v).reshape(withDim(valueDim));
  const Tensor betas = perHeadScalar(beta).reshape(chunked).unsqueeze(-1);
  // Cumulative log decay within each chunk: gamma_t = g_1 + ... + g_t.
  const Tensor gamma = perHeadScalar(g).reshape(chunked).cumsum(-1);
  const ChunkTerms terms = chunkTerms(query, key, betas, gamma);
  const Tensor &decay = terms.decay, &stateReads = terms.stateReads, &intra = terms.intra;
  const Tensor keyT = key.transpose(-1, -2);
  const Tensor newValues =
      torch::linalg_solve_triangular(terms.system, value * betas, /*upper=*/false, /*left=*/true,
                                     /*unitriangular=*/true);
  const Tensor &decayedQuery = terms.decayedQuery;
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
