// Layers.h: norms, rotary embeddings, token layouts and causal attention in
// plain LibTorch.
#include "dflex/runtime/models/Layers.h"

#include "dflex/Support/Error.h"

#include <torch/torch.h>

#include <cmath>
#include <string>

namespace dflex::runtime::models {

namespace {

using torch::Tensor;

Tensor normalized(const Tensor &x, double eps) {
  Tensor wide = x.to(computeType(x));
  return wide * torch::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps);
}

std::string shapeOf(const Tensor &t) { return c10::str(t.sizes()); }

} // namespace

torch::ScalarType computeType(const Tensor &x) {
  return x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

void checkDecoderConfig(const TransformerConfig &c, const std::string &where) {
  if (c.hiddenAct != "silu")
    throw FormatError(where + ": hidden_act '" + c.hiddenAct + "' is not supported (silu)");
  if (c.numKeyValueHeads <= 0 || c.numAttentionHeads % c.numKeyValueHeads != 0)
    throw FormatError(where + ": num_attention_heads " + std::to_string(c.numAttentionHeads) +
                      " is not a multiple of num_key_value_heads " +
                      std::to_string(c.numKeyValueHeads));
}

Tensor rmsNorm(const Tensor &x, const Tensor &weight, double eps) {
  // On CUDA LibTorch's fused kernel, one pass instead of seven over float32
  // copies. It rounds once, after the weight; the reference models round
  // before it (at most one step of the element type apart).
  if (x.is_cuda() && weight.scalar_type() == x.scalar_type())
    return at::rms_norm(x, {x.size(-1)}, weight, eps);
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

Tensor swiGluOfProjection(const Tensor &gateAndUp) {
  const int64_t intermediate = gateAndUp.size(-1) / 2;
  return torch::silu(gateAndUp.narrow(-1, 0, intermediate)) *
         gateAndUp.narrow(-1, intermediate, intermediate);
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

namespace {

void checkAttentionShapes(const Tensor &q, const Tensor &k, const Tensor &v, bool sameLength,
                          const std::string &what) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.size(2) == 0 ||
      q.size(2) % k.size(2) != 0 || k.sizes() != v.sizes() || q.size(0) != k.size(0) ||
      q.size(3) != k.size(3) || (sameLength ? q.size(1) != k.size(1) : q.size(1) > k.size(1)))
    throw FormatError(what + ": expected q [B, " + (sameLength ? "T" : "Tq") +
                      ", Hq, D] and k, v [B, " + (sameLength ? "T" : "Tk >= Tq") +
                      ", Hkv, D] with Hq a multiple of Hkv, got q " + shapeOf(q) + ", k " +
                      shapeOf(k) + ", v " + shapeOf(v));
}

/// Query positions [Tq] against key positions [Tk]: which keys each query
/// sees (kv <= q, and q - kv < window with a window).
Tensor causalVisibility(const Tensor &queryPositions, const Tensor &keyPositions,
                        std::optional<int64_t> window) {
  const Tensor distance = queryPositions.unsqueeze(1) - keyPositions.unsqueeze(0);
  Tensor visible = distance >= 0;
  if (window)
    visible = visible & (distance < *window);
  return visible;
}

/// scaled_dot_product_attention over [B, T, H, D] tensors with grouped
/// key/value heads: causal (top-left aligned, Tq == Tk) without a mask, else
/// the boolean mask [B or 1, Tq, Tk].
Tensor attend(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &mask,
              double scale) {
  const int64_t groups = q.size(2) / k.size(2);
  const Tensor qh = q.transpose(1, 2);
  const Tensor kh = repeatHeads(k, groups).transpose(1, 2);
  const Tensor vh = repeatHeads(v, groups).transpose(1, 2);
  const Tensor out =
      mask.defined()
          ? at::scaled_dot_product_attention(qh, kh, vh, mask.unsqueeze(1), 0.0, false, scale)
          : at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, /*is_causal=*/true, scale);
  return out.transpose(1, 2);
}

} // namespace

Tensor causalAttention(const Tensor &q, const Tensor &k, const Tensor &v,
                       const TokenLayout &layout, std::optional<int64_t> window, double scale) {
  checkAttentionShapes(q, k, v, /*sameLength=*/true, "causal attention");
  if (!layout.isPacked() && !window)
    return attend(q, k, v, Tensor(), scale);
  const Tensor position = torch::arange(q.size(1), layout.offsets().options());
  Tensor mask = causalVisibility(position, position, window).unsqueeze(0); // [1, T, T]
  if (layout.isPacked()) {
    const Tensor &ids = layout.segmentIds();
    mask = mask & (ids.unsqueeze(2) == ids.unsqueeze(1));
  }
  return attend(q, k, v, mask, scale);
}

Tensor causalAttentionAfter(const Tensor &q, const Tensor &k, const Tensor &v,
                            std::optional<int64_t> window, double scale) {
  checkAttentionShapes(q, k, v, /*sameLength=*/false, "causal attention after a prefix");
  const int64_t queries = q.size(1), keys = k.size(1);
  if (queries == keys && !window)
    return attend(q, k, v, Tensor(), scale);
  const auto options = torch::TensorOptions(torch::kLong).device(q.device());
  const Tensor mask = causalVisibility(torch::arange(keys - queries, keys, options),
                                       torch::arange(keys, options), window);
  return attend(q, k, v, mask.unsqueeze(0), scale);
}

} // namespace dflex::runtime::models
