// Layers.h and GatedDelta.h: norms, rotary embeddings, token layouts, causal
// attention, and the gated delta rule in plain LibTorch.
#include "dflex/runtime/models/GatedDelta.h"
#include "dflex/runtime/models/Layers.h"

#include "dflex/runtime/Error.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

namespace dflex::runtime::models {

namespace {

using torch::Tensor;

/// Norms and recurrences compute in float32, or float64 for float64 inputs
/// (the reference checks).
torch::ScalarType computeType(const Tensor &x) {
  return x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

Tensor normalized(const Tensor &x, double eps) {
  Tensor wide = x.to(computeType(x));
  return wide * torch::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps);
}

std::string shapeOf(const Tensor &t) { return c10::str(t.sizes()); }

} // namespace

void checkDecoderConfig(const TransformerConfig &c, const std::string &where) {
  if (c.hiddenAct != "silu")
    throw FormatError(where + ": hidden_act '" + c.hiddenAct + "' is not supported (silu)");
  if (c.numKeyValueHeads <= 0 || c.numAttentionHeads % c.numKeyValueHeads != 0)
    throw FormatError(where + ": num_attention_heads " + std::to_string(c.numAttentionHeads) +
                      " is not a multiple of num_key_value_heads " +
                      std::to_string(c.numKeyValueHeads));
}

Tensor rmsNorm(const Tensor &x, const Tensor &weight, double eps) {
  return weight * normalized(x, eps).to(x.scalar_type());
}

Tensor zeroCenteredRmsNorm(const Tensor &x, const Tensor &weight, double eps) {
  Tensor wide = normalized(x, eps);
  return (wide * (1.0 + weight.to(wide.scalar_type()))).to(x.scalar_type());
}

Tensor gatedRmsNorm(const Tensor &x, const Tensor &gate, const Tensor &weight, double eps) {
  Tensor scaled = weight * normalized(x, eps).to(x.scalar_type());
  return (scaled * torch::silu(gate.to(computeType(x)))).to(x.scalar_type());
}

Tensor swiGlu(const Tensor &x, const Tensor &gateWeight, const Tensor &upWeight,
              const Tensor &downWeight) {
  return at::linear(torch::silu(at::linear(x, gateWeight)) * at::linear(x, upWeight), downWeight);
}

// --- Rotary embeddings ---------------------------------------------------------

RotaryEmbedding::RotaryEmbedding(const RopeConfig &rope, int64_t headDim) {
  rotaryDim_ = int64_t(double(headDim) * rope.partialRotaryFactor);
  if (rotaryDim_ <= 0 || rotaryDim_ % 2 != 0 || rotaryDim_ > headDim)
    throw FormatError("rope: the rotated dimensions (head_dim " + std::to_string(headDim) +
                      " x partial_rotary_factor " + std::to_string(rope.partialRotaryFactor) +
                      " = " + std::to_string(rotaryDim_) + ") must be even and in (0, head_dim]");
  if (rope.type != "default" && rope.type != "linear" && rope.type != "yarn")
    throw FormatError("rope: rope_type '" + rope.type +
                      "' is not supported (default, linear and yarn are)");
  if (rope.type == "yarn" && !rope.originalMaxPositionEmbeddings)
    throw FormatError("rope: yarn needs original_max_position_embeddings");
  if (rope.type == "yarn" && rope.factor > 1)
    attentionScaling_ = 0.1 * std::log(rope.factor) + 1.0;
  inverseFrequencies_ = inverseFrequencies(rope, torch::kFloat);
  inverseFrequencies64_ = inverseFrequencies(rope, torch::kDouble);
}

Tensor RotaryEmbedding::inverseFrequencies(const RopeConfig &rope,
                                           torch::ScalarType dtype) const {
  const double dim = double(rotaryDim_);
  // base^(2i / dim), in the table's type (float32 for the models' own dtypes,
  // as the reference models compute it).
  const Tensor exponents = torch::arange(0, rotaryDim_, 2, torch::kLong).to(dtype) / dim;
  const Tensor powers = torch::pow(rope.theta, exponents);
  if (rope.type == "default")
    return 1.0 / powers;
  if (rope.type == "linear")
    return 1.0 / powers / rope.factor;
  // YaRN: frequencies that turn fewer than beta_slow times over the original
  // context are interpolated (divided by the factor), those that turn more
  // than beta_fast times are kept, with a linear ramp between.
  const double original = double(*rope.originalMaxPositionEmbeddings);
  const double betaFast = 32, betaSlow = 1;
  auto correctionDim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(rope.theta));
  };
  const double low = std::max(std::floor(correctionDim(betaFast)), 0.0);
  double high = std::min(std::ceil(correctionDim(betaSlow)), dim - 1);
  if (low == high)
    high += 0.001;
  const Tensor ramp =
      ((torch::arange(rotaryDim_ / 2, torch::kFloat).to(dtype) - low) / (high - low)).clamp(0, 1);
  const Tensor extrapolation = 1 - ramp;
  return (1.0 / (rope.factor * powers)) * (1 - extrapolation) + (1.0 / powers) * extrapolation;
}

std::pair<Tensor, Tensor> RotaryEmbedding::table(const Tensor &positions,
                                                 torch::ScalarType dtype) const {
  const bool wide = dtype == torch::kDouble;
  const Tensor &inverse = wide ? inverseFrequencies64_ : inverseFrequencies_;
  const Tensor frequencies = positions.to(inverse.scalar_type()).unsqueeze(-1) *
                             inverse.to(positions.device());
  const Tensor angles = torch::cat({frequencies, frequencies}, -1);
  Tensor cos = angles.cos(), sin = angles.sin();
  if (attentionScaling_ != 1.0) {
    cos = cos * attentionScaling_;
    sin = sin * attentionScaling_;
  }
  return {cos.to(dtype), sin.to(dtype)};
}

Tensor applyRotary(const Tensor &x, const Tensor &cos, const Tensor &sin) {
  const int64_t rotary = cos.size(-1), dim = x.size(-1);
  const Tensor c = cos.unsqueeze(2), s = sin.unsqueeze(2);
  const Tensor rotated = rotary == dim ? x : x.narrow(-1, 0, rotary);
  const Tensor first = rotated.narrow(-1, 0, rotary / 2);
  const Tensor second = rotated.narrow(-1, rotary / 2, rotary / 2);
  const Tensor turned = torch::cat({-second, first}, -1);
  Tensor out = rotated * c + turned * s;
  if (rotary == dim)
    return out;
  return torch::cat({out, x.narrow(-1, rotary, dim - rotary)}, -1);
}

// --- Token layouts -------------------------------------------------------------

TokenLayout TokenLayout::rows(int64_t batch, int64_t length, torch::Device device) {
  TokenLayout layout;
  layout.batch_ = batch;
  layout.length_ = length;
  for (int64_t row = 0; row < batch; ++row)
    layout.segments_.push_back({row, 0, length});
  layout.offsets_ = torch::arange(length, torch::TensorOptions(torch::kLong).device(device))
                        .unsqueeze(0)
                        .expand({batch, length});
  return layout;
}

TokenLayout TokenLayout::packed(const Tensor &cuSeqlens, int64_t batch, int64_t length,
                                torch::Device device) {
  const std::string where = "cu_seqlens";
  if (!cuSeqlens.defined() || cuSeqlens.dim() != 1 || cuSeqlens.is_floating_point() ||
      cuSeqlens.size(0) < 2)
    throw FormatError(where + ": expected an integer tensor [S + 1] with S >= 1, got " +
                      (cuSeqlens.defined() ? shapeOf(cuSeqlens) : std::string("none")));
  const Tensor bounds = cuSeqlens.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t *b = bounds.data_ptr<int64_t>();
  const int64_t count = bounds.size(0) - 1;
  if (b[0] != 0 || b[count] != batch * length)
    throw FormatError(where + ": must run from 0 to B*T = " + std::to_string(batch * length) +
                      ", got " + std::to_string(b[0]) + " .. " + std::to_string(b[count]));
  TokenLayout layout;
  layout.batch_ = batch;
  layout.length_ = length;
  layout.packed_ = true;
  Tensor ids = torch::empty({batch, length}, torch::kLong);
  Tensor offsets = torch::empty({batch, length}, torch::kLong);
  int64_t *idData = ids.data_ptr<int64_t>(), *offsetData = offsets.data_ptr<int64_t>();
  for (int64_t s = 0; s < count; ++s) {
    if (b[s + 1] < b[s])
      throw FormatError(where + ": decreases at entry " + std::to_string(s + 1));
    if (b[s + 1] == b[s])
      continue;
    const int64_t row = b[s] / length;
    if ((b[s + 1] - 1) / length != row)
      throw FormatError(where + ": segment " + std::to_string(s) + " [" + std::to_string(b[s]) +
                        ", " + std::to_string(b[s + 1]) + ") crosses the end of row " +
                        std::to_string(row) + " (rows hold " + std::to_string(length) +
                        " tokens)");
    layout.segments_.push_back({row, b[s] - row * length, b[s + 1] - row * length});
    for (int64_t t = b[s]; t < b[s + 1]; ++t) {
      idData[t] = s;
      offsetData[t] = t - b[s];
    }
  }
  layout.segmentIds_ = ids.to(device);
  layout.offsets_ = offsets.to(device);
  return layout;
}

// --- Attention -----------------------------------------------------------------

Tensor repeatHeads(const Tensor &x, int64_t groups) {
  if (groups == 1)
    return x;
  return x.unsqueeze(3)
      .expand({x.size(0), x.size(1), x.size(2), groups, x.size(3)})
      .reshape({x.size(0), x.size(1), x.size(2) * groups, x.size(3)});
}

Tensor causalAttention(const Tensor &q, const Tensor &k, const Tensor &v,
                       const TokenLayout &layout, std::optional<int64_t> window, double scale) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.size(2) == 0 ||
      q.size(2) % k.size(2) != 0 || k.sizes() != v.sizes() || q.size(1) != k.size(1))
    throw FormatError("causal attention: expected q [B, T, Hq, D] and k, v [B, T, Hkv, D] "
                      "with Hq a multiple of Hkv, got q " +
                      shapeOf(q) + ", k " + shapeOf(k) + ", v " + shapeOf(v));
  const int64_t groups = q.size(2) / k.size(2);
  const Tensor qh = q.transpose(1, 2);
  const Tensor kh = repeatHeads(k, groups).transpose(1, 2);
  const Tensor vh = repeatHeads(v, groups).transpose(1, 2);
  Tensor out;
  if (!layout.isPacked() && !window) {
    out = at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true, scale);
  } else {
    const Tensor &offsets = layout.offsets();
    const Tensor position = torch::arange(q.size(1), offsets.options());
    Tensor visible = position.unsqueeze(1) >= position.unsqueeze(0); // [T, T]: q >= kv
    if (window)
      visible = visible & (position.unsqueeze(1) - position.unsqueeze(0) < *window);
    Tensor mask = visible.unsqueeze(0);
    if (layout.isPacked()) {
      const Tensor &ids = layout.segmentIds();
      mask = mask & (ids.unsqueeze(2) == ids.unsqueeze(1));
    }
    out = at::scaled_dot_product_attention(qh, kh, vh, mask.unsqueeze(1), 0.0, false, scale);
  }
  return out.transpose(1, 2);
}

// --- Gated delta rule ------------------------------------------------------------

Tensor gatedDeltaRule(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g,
                      const Tensor &beta, const GatedDeltaOptions &options) {
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.dim() != 4 || v.size(0) != q.size(0) ||
      v.size(1) != q.size(1) || q.size(2) == 0 || v.size(2) % q.size(2) != 0 ||
      g.sizes() != v.sizes().slice(0, 3) || beta.sizes() != g.sizes())
    throw FormatError("gated delta rule: expected q, k [B, T, Hk, Dk], v [B, T, Hv, Dv] with Hv "
                      "a multiple of Hk, g and beta [B, T, Hv], got q " +
                      shapeOf(q) + ", k " + shapeOf(k) + ", v " + shapeOf(v) + ", g " +
                      shapeOf(g) + ", beta " + shapeOf(beta));
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

  Tensor state = torch::zeros({batch, heads, keyDim, valueDim}, query.options());
  std::vector<Tensor> outputs;
  outputs.reserve(chunks);
  for (int64_t c = 0; c < chunks; ++c) {
    const Tensor u = newValues.select(2, c) - torch::matmul(stateReads.select(2, c), state);
    outputs.push_back(torch::matmul(decayedQuery.select(2, c), state) +
                      torch::matmul(intra.select(2, c), u));
    state = state * chunkDecay.select(2, c) + torch::matmul(decayedKeyT.select(2, c), u);
  }
  return torch::cat(outputs, 2).narrow(2, 0, length).transpose(1, 2).to(q.scalar_type());
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
