// The gated-delta op: input checks, the CPU reference, autograd, and the
// target-model hook. The CPU reference is the token-by-token recurrence in
// float64 (docs/runtime-gated-delta.md); its backward is reverse-mode
// differentiation of the same steps, with the state recomputed from a
// checkpoint every kCheckpointTokens tokens.
#include "GatedDeltaInternal.h"

#include "dflex/runtime/Error.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <optional>

namespace dflex::runtime {

namespace detail {

namespace {

std::string shapeText(const torch::Tensor &t) { return c10::str(t.sizes()); }
std::string dtypeText(torch::ScalarType type) { return std::string(c10::toString(type)); }

} // namespace

std::string where(const GatedDeltaKernelSpec &spec) { return "dflex gated_delta '" + spec.name + "'"; }

GatedDeltaProblem checkInputs(const GatedDeltaKernelSpec &spec, const GatedDeltaInputs &in) {
  auto fail = [&](const std::string &problem) { throw FormatError(where(spec) + ": " + problem); };
  const torch::Tensor &q = in.q, &k = in.k, &v = in.v;
  if (!q.defined() || !k.defined() || !v.defined())
    fail("q, k and v must be tensors");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    fail("q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv] must have 4 dimensions, got q " + shapeText(q) +
         ", k " + shapeText(k) + ", v " + shapeText(v));
  GatedDeltaProblem p;
  p.batch = q.size(0);
  p.length = q.size(1);
  p.tokens = p.batch * p.length;
  p.keyHeads = q.size(2);
  p.keyDim = q.size(3);
  p.valueHeads = v.size(2);
  p.valueDim = v.size(3);
  if (k.sizes() != q.sizes() || v.size(0) != p.batch || v.size(1) != p.length)
    fail("shapes do not agree: q " + shapeText(q) + ", k " + shapeText(k) + ", v " + shapeText(v) +
         " (expected q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv])");
  if (p.keyHeads != spec.numKeyHeads || p.valueHeads != spec.numValueHeads)
    fail("the spec has " + std::to_string(spec.numKeyHeads) + " key heads (q, k) and " +
         std::to_string(spec.numValueHeads) + " value heads (v), got " + std::to_string(p.keyHeads) +
         " and " + std::to_string(p.valueHeads));
  if (p.keyDim != spec.keyDim || p.valueDim != spec.valueDim)
    fail("the spec has key_dim " + std::to_string(spec.keyDim) + " (q, k) and value_dim " +
         std::to_string(spec.valueDim) + " (v), got " + std::to_string(p.keyDim) + " and " +
         std::to_string(p.valueDim));
  const torch::Device device = q.device();
  const bool cuda = q.is_cuda();
  if (!cuda && !q.is_cpu())
    fail("tensors must be on the CPU or a CUDA device, got " + device.str());

  // One tensor input: present exactly when the spec takes it, on q's device,
  // floating, of `shape`, and of `cudaType` on CUDA.
  auto check = [&](const torch::Tensor &t, const std::string &name, bool taken, const std::string &why,
                   const std::vector<int64_t> &shape, const char *shapeName, torch::ScalarType cudaType) {
    if (!taken) {
      if (t.defined())
        fail(name + " is not an input of this spec (" + why + ")");
      return;
    }
    if (!t.defined())
      fail(name + " is required (" + why + ")");
    if (t.device() != device)
      fail(name + " is on " + t.device().str() + ", q on " + device.str());
    if (!t.is_floating_point())
      fail(name + " must be a floating-point tensor, got " + dtypeText(t.scalar_type()));
    if (t.sizes() != torch::IntArrayRef(shape))
      fail(name + " must be " + shapeName + " " + c10::str(torch::IntArrayRef(shape)) + ", got " +
           shapeText(t));
    if (cuda && t.scalar_type() != cudaType)
      fail("the kernels take " + name + " as " + dtypeText(cudaType) + ", got " +
           dtypeText(t.scalar_type()));
  };
  const std::vector<int64_t> gateShape{p.batch, p.length, p.valueHeads};
  const std::vector<int64_t> headShape{p.valueHeads};
  check(q, "q", true, "", q.sizes().vec(), "[B, T, Hk, Dk]", torch::kBFloat16);
  check(k, "k", true, "", q.sizes().vec(), "[B, T, Hk, Dk]", torch::kBFloat16);
  check(v, "v", true, "", v.sizes().vec(), "[B, T, Hv, Dv]", torch::kBFloat16);
  const bool scalarGate = spec.gate == "scalar_log";
  const std::string inKernel = "in_kernel_gate: the kernels compute g = -exp(A_log) softplus(a + dt_bias)";
  check(in.g, "g", scalarGate && !spec.inKernelGate,
        spec.inKernelGate ? inKernel : scalarGate ? "the spec's gate is scalar_log" : "the spec's gate is none",
        gateShape, "[B, T, Hv]", torch::kFloat);
  check(in.beta, "beta", spec.deltaRule && !spec.inKernelGate,
        spec.inKernelGate ? "in_kernel_gate: the kernels compute beta = sigmoid(b)"
        : spec.deltaRule  ? "the spec has the delta rule"
                          : "the spec has no delta rule",
        gateShape, "[B, T, Hv]", torch::kBFloat16);
  const std::string noInKernel = "the spec has no in_kernel_gate";
  check(in.a, "a", spec.inKernelGate, spec.inKernelGate ? inKernel : noInKernel, gateShape, "[B, T, Hv]",
        torch::kBFloat16);
  check(in.b, "b", spec.inKernelGate && spec.deltaRule,
        !spec.inKernelGate ? noInKernel
        : spec.deltaRule   ? "in_kernel_gate with the delta rule: beta = sigmoid(b)"
                           : "the spec has no delta rule",
        gateShape, "[B, T, Hv]", torch::kBFloat16);
  check(in.aLog, "A_log", spec.inKernelGate, spec.inKernelGate ? inKernel : noInKernel, headShape, "[Hv]",
        torch::kFloat);
  check(in.dtBias, "dt_bias", spec.inKernelGate, spec.inKernelGate ? inKernel : noInKernel, headShape,
        "[Hv]", torch::kFloat);

  // Sequences: the rows, or cu_seqlens over the flattened rows.
  const torch::Tensor &cu = in.cuSeqlens;
  if (!spec.varlen) {
    if (cu.defined())
      fail("cu_seqlens is not an input of this spec (it has no varlen: every row is one sequence)");
    p.sequences = p.batch;
    for (int64_t n = 0; n <= p.batch; ++n)
      p.offsets.push_back(n * p.length);
  } else {
    if (!cu.defined())
      fail("cu_seqlens is required (the spec has varlen)");
    if (cu.scalar_type() != torch::kInt || cu.dim() != 1 || cu.numel() < 1)
      fail("cu_seqlens must be a 1-D int32 tensor [N + 1], got " + dtypeText(cu.scalar_type()) + " " +
           shapeText(cu));
    if (!cu.is_cpu() && cu.device() != device)
      fail("cu_seqlens is on " + cu.device().str() + "; it must be on the CPU or on q's device " +
           device.str());
    const torch::Tensor host = cu.cpu().to(torch::kLong).contiguous();
    const int64_t *values = host.data_ptr<int64_t>();
    p.offsets.assign(values, values + host.numel());
    p.sequences = host.numel() - 1;
    if (p.offsets.front() != 0)
      fail("cu_seqlens[0] must be 0, got " + std::to_string(p.offsets.front()));
    if (p.offsets.back() != p.tokens)
      fail("cu_seqlens[" + std::to_string(p.sequences) + "] must be B*T = " + std::to_string(p.tokens) +
           ", got " + std::to_string(p.offsets.back()));
    for (int64_t n = 1; n <= p.sequences; ++n)
      if (p.offsets[n] <= p.offsets[n - 1])
        fail("cu_seqlens must increase strictly (every sequence has a token): cu_seqlens[" +
             std::to_string(n) + "] = " + std::to_string(p.offsets[n]) + " after " +
             std::to_string(p.offsets[n - 1]));
  }
  check(in.initialState, "initial_state", spec.initialState && in.initialState.defined(),
        "the spec has no initial_state", {p.sequences, p.valueHeads, p.keyDim, p.valueDim},
        "[N, Hv, Dk, Dv]", torch::kFloat);

  if (cuda) {
    const int64_t kIntMax = std::numeric_limits<int32_t>::max();
    if (p.tokens > kIntMax || p.sequences > 65535 || p.valueHeads > 65535 ||
        (p.tokens * p.keyHeads + 7) / 8 > kIntMax)
      fail("sizes beyond the kernels' limits (B*T < 2^31, at most 65535 sequences and value heads)");
  }
  return p;
}

void checkOutputGrads(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &p,
                      const GatedDeltaInputs &in, const torch::Tensor &gradOut,
                      const torch::Tensor &gradFinalState) {
  auto fail = [&](const std::string &problem) {
    throw FormatError(where(spec) + " backward: " + problem);
  };
  const bool cuda = in.q.is_cuda();
  auto check = [&](const torch::Tensor &t, const char *name, const std::vector<int64_t> &shape,
                   const char *shapeName, torch::ScalarType cudaType) {
    if (!t.defined())
      return;
    if (t.sizes() != torch::IntArrayRef(shape))
      fail(std::string(name) + " must be " + shapeName + " " + c10::str(torch::IntArrayRef(shape)) +
           ", got " + shapeText(t));
    if (t.device() != in.q.device())
      fail(std::string(name) + " is on " + t.device().str() + ", q on " + in.q.device().str());
    if (!t.is_floating_point() || (cuda && t.scalar_type() != cudaType))
      fail(std::string(name) + " must be " + (cuda ? dtypeText(cudaType) : "floating-point") + ", got " +
           dtypeText(t.scalar_type()));
  };
  check(gradOut, "grad_o", {p.batch, p.length, p.valueHeads, p.valueDim}, "[B, T, Hv, Dv]",
        torch::kBFloat16);
  if (gradFinalState.defined() && !spec.finalState)
    fail("grad_final_state given, but the spec has no final_state");
  check(gradFinalState, "grad_final_state", {p.sequences, p.valueHeads, p.keyDim, p.valueDim},
        "[N, Hv, Dk, Dv]", torch::kFloat);
}

// --- CPU reference ---------------------------------------------------------------

namespace {

/// Tokens between the backward's state checkpoints (each block is replayed
/// forward, keeping every state, then differentiated in reverse).
constexpr int64_t kCheckpointTokens = 64;

torch::Tensor wide(const torch::Tensor &t) { return t.to(torch::kDouble).contiguous(); }

/// The inputs in float64, packed as [tokens, heads, ...], with the gates and
/// the normalised q and k the recurrence reads.
struct ReferenceInputs {
  ReferenceInputs(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &problem)
      : p(problem), group(problem.valueHeads / problem.keyHeads), scale(spec.scale),
        deltaRule(spec.deltaRule) {}

  const GatedDeltaProblem &p;
  int64_t group; // value heads per key head
  double scale;
  bool deltaRule;
  torch::Tensor qUnit, kUnit, qInverse, kInverse; // [T, Hk, Dk], [T, Hk]
  torch::Tensor v;                                // [T, Hv, Dv]
  torch::Tensor g, beta;                          // [T, Hv] (g = 0, beta = 1 where absent)
  torch::Tensor initialState;                     // [N, Hv, Dk, Dv]; undefined = zeros
};

ReferenceInputs prepare(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &p,
                        const GatedDeltaInputs &in) {
  ReferenceInputs r(spec, p);
  auto normalise = [&](const torch::Tensor &x, torch::Tensor &unit, torch::Tensor &inverse) {
    const torch::Tensor rows = wide(x).reshape({p.tokens, p.keyHeads, p.keyDim});
    inverse = spec.qkL2Norm ? torch::rsqrt(rows.square().sum(-1) + 1e-6)
                            : torch::ones({p.tokens, p.keyHeads}, rows.options());
    unit = (rows * inverse.unsqueeze(-1)).contiguous();
  };
  normalise(in.q, r.qUnit, r.qInverse);
  normalise(in.k, r.kUnit, r.kInverse);
  r.v = wide(in.v).reshape({p.tokens, p.valueHeads, p.valueDim});
  const auto options = r.v.options();
  const std::vector<int64_t> gates{p.tokens, p.valueHeads};
  r.g = torch::zeros(gates, options);
  r.beta = torch::ones(gates, options);
  if (spec.inKernelGate) {
    const torch::Tensor x = wide(in.a).reshape(gates) + wide(in.dtBias);
    r.g = -wide(in.aLog).exp() * torch::softplus(x, 1, 20); // x above 20: x, as the kernels
    if (spec.deltaRule)
      r.beta = torch::sigmoid(wide(in.b).reshape(gates));
  } else {
    if (in.g.defined())
      r.g = wide(in.g).reshape(gates);
    if (in.beta.defined())
      r.beta = wide(in.beta).reshape(gates);
  }
  r.g = r.g.contiguous();
  r.beta = r.beta.contiguous();
  if (in.initialState.defined())
    r.initialState = wide(in.initialState);
  return r;
}

/// One token of the recurrence on a [Dk, Dv] row-major state, and its
/// reverse-mode derivative.
class Recurrence {
public:
  Recurrence(const ReferenceInputs &r, int64_t valueHead)
      : r_(r), hv_(valueHead), hk_(valueHead / r.group), dk_(r.p.keyDim), dv_(r.p.valueDim),
        kv_(dv_), delta_(dv_) {}

  /// state <- the state after token t.
  void step(int64_t t, double *state) {
    const double decay = std::exp(gate(t));
    const double *k = key(t);
    for (int64_t i = 0; i < dk_ * dv_; ++i)
      state[i] *= decay;
    values(t, state);
    for (int64_t i = 0; i < dk_; ++i)
      for (int64_t j = 0; j < dv_; ++j)
        state[i * dv_ + j] += k[i] * delta_[j];
  }

  /// o_t = scale S^T q_t from the state after token t.
  void output(int64_t t, const double *state, double *out) const {
    const double *q = query(t);
    for (int64_t j = 0; j < dv_; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < dk_; ++i)
        sum += state[i * dv_ + j] * q[i];
      out[j] = r_.scale * sum;
    }
  }

  /// Backward of token t from the state before it (`previous`): takes dL/dS
  /// after the token in `gradState` and leaves dL/dS before it there; adds
  /// to the gradients of the normalised q and k rows of this value head.
  struct TokenGrads {
    double *query, *key, *value; // [Dk], [Dk], [Dv]
    double gate = 0, beta = 0;
  };
  void backward(int64_t t, const double *previous, const double *gradOut, double *gradState,
                TokenGrads &grads) {
    const double decay = std::exp(gate(t)), beta = r_.beta.data_ptr<double>()[t * r_.p.valueHeads + hv_];
    const double *q = query(t), *k = key(t), *v = value(t);
    decayed_.resize(dk_ * dv_);
    for (int64_t i = 0; i < dk_ * dv_; ++i)
      decayed_[i] = decay * previous[i];
    values(t, decayed_.data());
    // o = scale S^T q with S = decayed + k delta^T.
    for (int64_t i = 0; i < dk_; ++i) {
      double dq = 0;
      for (int64_t j = 0; j < dv_; ++j) {
        const double s = decayed_[i * dv_ + j] + k[i] * delta_[j];
        dq += s * gradOut[j];
        gradState[i * dv_ + j] += r_.scale * q[i] * gradOut[j];
      }
      grads.query[i] += r_.scale * dq;
    }
    // S = decayed + k delta^T.
    std::vector<double> &gradDelta = gradValues_;
    gradDelta.assign(dv_, 0.0);
    for (int64_t i = 0; i < dk_; ++i) {
      double dk = 0;
      for (int64_t j = 0; j < dv_; ++j) {
        gradDelta[j] += gradState[i * dv_ + j] * k[i];
        dk += gradState[i * dv_ + j] * delta_[j];
      }
      grads.key[i] += dk;
    }
    if (r_.deltaRule) {
      // delta = beta (v - decayed^T k).
      double gradBeta = 0;
      for (int64_t j = 0; j < dv_; ++j) {
        gradBeta += gradDelta[j] * (v[j] - kv_[j]);
        grads.value[j] = beta * gradDelta[j];
      }
      grads.beta = gradBeta;
      for (int64_t i = 0; i < dk_; ++i) {
        double dk = 0;
        for (int64_t j = 0; j < dv_; ++j) {
          const double gradKv = -beta * gradDelta[j];
          gradState[i * dv_ + j] += k[i] * gradKv;
          dk += decayed_[i * dv_ + j] * gradKv;
        }
        grads.key[i] += dk;
      }
    } else {
      for (int64_t j = 0; j < dv_; ++j)
        grads.value[j] = gradDelta[j];
    }
    // decayed = exp(g) previous.
    double gradGate = 0;
    for (int64_t i = 0; i < dk_ * dv_; ++i) {
      gradGate += decayed_[i] * gradState[i];
      gradState[i] *= decay;
    }
    grads.gate = gradGate;
  }

private:
  double gate(int64_t t) const { return r_.g.data_ptr<double>()[t * r_.p.valueHeads + hv_]; }
  const double *query(int64_t t) const {
    return r_.qUnit.data_ptr<double>() + (t * r_.p.keyHeads + hk_) * dk_;
  }
  const double *key(int64_t t) const { return r_.kUnit.data_ptr<double>() + (t * r_.p.keyHeads + hk_) * dk_; }
  const double *value(int64_t t) const {
    return r_.v.data_ptr<double>() + (t * r_.p.valueHeads + hv_) * dv_;
  }
  /// kv_ = S^T k and delta_ for the decayed state S of token t.
  void values(int64_t t, const double *decayed) {
    const double *k = key(t), *v = value(t);
    const double beta = r_.beta.data_ptr<double>()[t * r_.p.valueHeads + hv_];
    for (int64_t j = 0; j < dv_; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < dk_; ++i)
        sum += decayed[i * dv_ + j] * k[i];
      kv_[j] = sum;
      delta_[j] = r_.deltaRule ? beta * (v[j] - sum) : v[j];
    }
  }

  const ReferenceInputs &r_;
  int64_t hv_, hk_, dk_, dv_;
  std::vector<double> kv_, delta_, decayed_, gradValues_;
};

/// The state at the start of sequence n, value head hv.
void loadInitialState(const ReferenceInputs &r, int64_t n, int64_t hv, double *state) {
  const int64_t size = r.p.keyDim * r.p.valueDim;
  if (!r.initialState.defined()) {
    std::fill(state, state + size, 0.0);
    return;
  }
  const double *source = r.initialState.data_ptr<double>() + (n * r.p.valueHeads + hv) * size;
  std::copy(source, source + size, state);
}

torch::ScalarType stateType(const torch::Tensor &q) {
  return q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

} // namespace

GatedDeltaOutputs referenceForward(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &p,
                                   const GatedDeltaInputs &in) {
  const ReferenceInputs r = prepare(spec, p, in);
  const int64_t stateSize = p.keyDim * p.valueDim;
  torch::Tensor out = torch::zeros({p.tokens, p.valueHeads, p.valueDim}, torch::kDouble);
  torch::Tensor finalState = torch::empty({p.sequences, p.valueHeads, p.keyDim, p.valueDim}, torch::kDouble);
  double *outData = out.data_ptr<double>(), *finalData = finalState.data_ptr<double>();
  at::parallel_for(0, p.sequences * p.valueHeads, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> state(stateSize);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / p.valueHeads, hv = item % p.valueHeads;
      Recurrence recurrence(r, hv);
      loadInitialState(r, n, hv, state.data());
      for (int64_t t = p.offsets[n]; t < p.offsets[n + 1]; ++t) {
        recurrence.step(t, state.data());
        recurrence.output(t, state.data(), outData + (t * p.valueHeads + hv) * p.valueDim);
      }
      std::copy(state.begin(), state.end(), finalData + item * stateSize);
    }
  });
  GatedDeltaOutputs outputs;
  outputs.out = out.reshape({p.batch, p.length, p.valueHeads, p.valueDim}).to(in.q.scalar_type());
  if (spec.finalState)
    outputs.finalState = finalState.to(stateType(in.q));
  return outputs;
}

GatedDeltaGrads referenceBackward(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &p,
                                  const GatedDeltaInputs &in, const torch::Tensor &gradOut,
                                  const torch::Tensor &gradFinalState) {
  const ReferenceInputs r = prepare(spec, p, in);
  const int64_t stateSize = p.keyDim * p.valueDim, hv = p.valueHeads;
  const auto options = torch::TensorOptions(torch::kDouble);
  const torch::Tensor gradOutWide = gradOut.defined()
                                        ? wide(gradOut).reshape({p.tokens, hv, p.valueDim})
                                        : torch::zeros({p.tokens, hv, p.valueDim}, options);
  const torch::Tensor gradFinalWide = gradFinalState.defined() ? wide(gradFinalState) : torch::Tensor();
  // Per value head: the key-side gradients are summed over each group after.
  torch::Tensor gradQUnit = torch::zeros({p.tokens, hv, p.keyDim}, options);
  torch::Tensor gradKUnit = torch::zeros({p.tokens, hv, p.keyDim}, options);
  torch::Tensor gradV = torch::zeros({p.tokens, hv, p.valueDim}, options);
  torch::Tensor gradGate = torch::zeros({p.tokens, hv}, options);
  torch::Tensor gradBeta = torch::zeros({p.tokens, hv}, options);
  torch::Tensor gradInitial = torch::zeros({p.sequences, hv, p.keyDim, p.valueDim}, options);

  at::parallel_for(0, p.sequences * hv, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> state(stateSize), gradState(stateSize), checkpoints, block;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / hv, head = item % hv;
      const int64_t first = p.offsets[n], last = p.offsets[n + 1];
      const int64_t blocks = (last - first + kCheckpointTokens - 1) / kCheckpointTokens;
      Recurrence recurrence(r, head);
      // Forward, keeping the state at the start of every block.
      checkpoints.resize(blocks * stateSize);
      loadInitialState(r, n, head, state.data());
      for (int64_t b = 0; b < blocks; ++b) {
        std::copy(state.begin(), state.end(), checkpoints.begin() + b * stateSize);
        for (int64_t t = first + b * kCheckpointTokens; t < std::min(last, first + (b + 1) * kCheckpointTokens);
             ++t)
          recurrence.step(t, state.data());
      }
      if (gradFinalWide.defined()) {
        const double *source = gradFinalWide.data_ptr<double>() + item * stateSize;
        std::copy(source, source + stateSize, gradState.begin());
      } else {
        std::fill(gradState.begin(), gradState.end(), 0.0);
      }
      // Reverse, block by block: replay the block's states, then its tokens.
      for (int64_t b = blocks - 1; b >= 0; --b) {
        const int64_t start = first + b * kCheckpointTokens;
        const int64_t count = std::min(last, start + kCheckpointTokens) - start;
        block.resize(count * stateSize);
        std::copy(checkpoints.begin() + b * stateSize, checkpoints.begin() + (b + 1) * stateSize,
                  state.begin());
        for (int64_t i = 0; i < count; ++i) {
          std::copy(state.begin(), state.end(), block.begin() + i * stateSize);
          recurrence.step(start + i, state.data());
        }
        for (int64_t i = count - 1; i >= 0; --i) {
          const int64_t t = start + i;
          Recurrence::TokenGrads grads;
          grads.query = gradQUnit.data_ptr<double>() + (t * hv + head) * p.keyDim;
          grads.key = gradKUnit.data_ptr<double>() + (t * hv + head) * p.keyDim;
          grads.value = gradV.data_ptr<double>() + (t * hv + head) * p.valueDim;
          recurrence.backward(t, block.data() + i * stateSize,
                              gradOutWide.data_ptr<double>() + (t * hv + head) * p.valueDim,
                              gradState.data(), grads);
          gradGate.data_ptr<double>()[t * hv + head] = grads.gate;
          gradBeta.data_ptr<double>()[t * hv + head] = grads.beta;
        }
      }
      std::copy(gradState.begin(), gradState.end(), gradInitial.data_ptr<double>() + item * stateSize);
    }
  });

  // Sum over each key head's group, then through the normalisation:
  // dx = inverse (dunit - unit (unit . dunit)).
  auto throughNorm = [&](const torch::Tensor &gradUnitPerValueHead, const torch::Tensor &unit,
                         const torch::Tensor &inverse) {
    const torch::Tensor gradUnit =
        gradUnitPerValueHead.reshape({p.tokens, p.keyHeads, r.group, p.keyDim}).sum(2);
    if (!spec.qkL2Norm)
      return gradUnit;
    return inverse.unsqueeze(-1) * (gradUnit - unit * (unit * gradUnit).sum(-1, true));
  };
  auto like = [&](const torch::Tensor &grad, const torch::Tensor &input) {
    return grad.reshape(input.sizes()).to(input.scalar_type());
  };
  GatedDeltaGrads grads;
  grads.q = like(throughNorm(gradQUnit, r.qUnit, r.qInverse), in.q);
  grads.k = like(throughNorm(gradKUnit, r.kUnit, r.kInverse), in.k);
  grads.v = like(gradV, in.v);
  if (spec.inKernelGate) {
    // g = -exp(A_log) softplus(x), x = a + dt_bias; beta = sigmoid(b).
    const std::vector<int64_t> gates{p.tokens, hv};
    const torch::Tensor x = wide(in.a).reshape(gates) + wide(in.dtBias);
    const torch::Tensor gradX = gradGate * -wide(in.aLog).exp() * torch::sigmoid(x);
    grads.a = like(gradX, in.a);
    grads.dtBias = like(gradX.sum(0), in.dtBias);
    grads.aLog = like((gradGate * r.g).sum(0), in.aLog);
    if (spec.deltaRule)
      grads.b = like(gradBeta * r.beta * (1 - r.beta), in.b);
  } else {
    if (in.g.defined())
      grads.g = like(gradGate, in.g);
    if (in.beta.defined())
      grads.beta = like(gradBeta, in.beta);
  }
  if (spec.initialState)
    grads.initialState = gradInitial.to(in.initialState.defined() ? in.initialState.scalar_type()
                                                                  : stateType(in.q));
  return grads;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

/// The checked sizes travel to the backward in saved_data (so a device
/// cu_seqlens is not read again).
std::vector<int64_t> packProblem(const GatedDeltaProblem &p) {
  std::vector<int64_t> packed{p.batch,      p.length,     p.tokens, p.sequences,
                              p.keyHeads,   p.valueHeads, p.keyDim, p.valueDim};
  packed.insert(packed.end(), p.offsets.begin(), p.offsets.end());
  return packed;
}

GatedDeltaProblem unpackProblem(const std::vector<int64_t> &packed) {
  GatedDeltaProblem p;
  p.batch = packed[0];
  p.length = packed[1];
  p.tokens = packed[2];
  p.sequences = packed[3];
  p.keyHeads = packed[4];
  p.valueHeads = packed[5];
  p.keyDim = packed[6];
  p.valueDim = packed[7];
  p.offsets.assign(packed.begin() + 8, packed.end());
  return p;
}

/// Autograd node of the op. The bundle travels as its directory (reopened
/// through the cache in backward); on CUDA the forward's workspace and
/// device cu_seqlens are kept for the backward kernels. The inputs a spec
/// may not take are optional (a Function cannot take undefined tensors).
using OptionalTensor = std::optional<torch::Tensor>;

struct GatedDeltaFunction : public torch::autograd::Function<GatedDeltaFunction> {
  static tensor_list forward(AutogradContext *ctx, const std::string &bundleDirectory,
                             const std::string &specName, const torch::Tensor &q, const torch::Tensor &k,
                             const torch::Tensor &v, const OptionalTensor &g, const OptionalTensor &beta,
                             const OptionalTensor &a, const OptionalTensor &b, const OptionalTensor &aLog,
                             const OptionalTensor &dtBias, const OptionalTensor &initialState,
                             const OptionalTensor &cuSeqlens, bool needBackward) {
    std::shared_ptr<const GatedDeltaBundle> bundle = GatedDeltaBundle::openCached(bundleDirectory);
    const GatedDeltaKernelSpec &spec = bundle->spec(specName);
    auto get = [](const OptionalTensor &t) { return t.value_or(torch::Tensor()); };
    const GatedDeltaInputs in{q,       k,          v,       get(g),            get(beta),     get(a),
                              get(b),  get(aLog),  get(dtBias), get(initialState), get(cuSeqlens)};
    const GatedDeltaProblem problem = checkInputs(spec, in);
    GatedDeltaOutputs outputs;
    if (q.is_cuda()) {
      CudaForwardState state = cudaForward(*bundle, spec, problem, in);
      outputs = state.outputs;
      if (needBackward) {
        ctx->saved_data["workspace"] = state.workspace;
        ctx->saved_data["device_cu_seqlens"] = state.cuSeqlens;
      }
    } else {
      outputs = referenceForward(spec, problem, in);
    }
    ctx->save_for_backward(
        {in.q, in.k, in.v, in.g, in.beta, in.a, in.b, in.aLog, in.dtBias, in.initialState});
    ctx->saved_data["cu_seqlens"] = in.cuSeqlens;
    ctx->saved_data["bundle"] = bundleDirectory;
    ctx->saved_data["spec"] = specName;
    ctx->saved_data["problem"] = packProblem(problem);
    // Undefined output gradients stay undefined (zeros are not formed).
    ctx->set_materialize_grads(false);
    // A Function returns defined tensors only: without final_state, an
    // empty placeholder that gatedDelta drops.
    if (!outputs.finalState.defined()) {
      outputs.finalState = torch::empty({0}, q.options());
      ctx->mark_non_differentiable({outputs.finalState});
    }
    return {outputs.out, outputs.finalState};
  }

  static tensor_list backward(AutogradContext *ctx, tensor_list outputGrads) {
    const tensor_list saved = ctx->get_saved_variables();
    GatedDeltaInputs in{saved[0], saved[1], saved[2], saved[3], saved[4],
                        saved[5], saved[6], saved[7], saved[8], saved[9],
                        ctx->saved_data["cu_seqlens"].toTensor()};
    std::shared_ptr<const GatedDeltaBundle> bundle =
        GatedDeltaBundle::openCached(ctx->saved_data["bundle"].toStringRef());
    const GatedDeltaKernelSpec &spec = bundle->spec(ctx->saved_data["spec"].toStringRef());
    const torch::Tensor gradOut = outputGrads[0];
    const torch::Tensor gradFinalState = spec.finalState ? outputGrads[1] : torch::Tensor();
    if (!gradOut.defined() && !gradFinalState.defined())
      return tensor_list(14);
    const GatedDeltaProblem problem = unpackProblem(ctx->saved_data["problem"].toIntVector());
    checkOutputGrads(spec, problem, in, gradOut, gradFinalState);
    GatedDeltaGrads grads;
    if (in.q.is_cuda()) {
      CudaForwardState forward;
      forward.workspace = ctx->saved_data["workspace"].toTensor();
      forward.cuSeqlens = ctx->saved_data["device_cu_seqlens"].toTensor();
      grads = cudaBackward(*bundle, spec, problem, in, forward, gradOut, gradFinalState);
    } else {
      grads = referenceBackward(spec, problem, in, gradOut, gradFinalState);
    }
    // No gradient for an input that was not given (initial_state defaults to zeros).
    if (!in.initialState.defined())
      grads.initialState = torch::Tensor();
    return {torch::Tensor(), torch::Tensor(), grads.q,     grads.k,    grads.v,
            grads.g,         grads.beta,      grads.a,     grads.b,    grads.aLog,
            grads.dtBias,    grads.initialState, torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

} // namespace detail

GatedDeltaOutputs gatedDeltaForward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                                    const GatedDeltaInputs &inputs) {
  using namespace detail;
  const GatedDeltaProblem problem = checkInputs(spec, inputs);
  if (!inputs.q.is_cuda())
    return referenceForward(spec, problem, inputs);
  return cudaForward(bundle, spec, problem, inputs).outputs;
}

GatedDeltaGrads gatedDeltaBackward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                                   const GatedDeltaInputs &inputs, const torch::Tensor &gradOut,
                                   const torch::Tensor &gradFinalState) {
  using namespace detail;
  const GatedDeltaProblem problem = checkInputs(spec, inputs);
  checkOutputGrads(spec, problem, inputs, gradOut, gradFinalState);
  GatedDeltaGrads grads;
  if (!inputs.q.is_cuda()) {
    grads = referenceBackward(spec, problem, inputs, gradOut, gradFinalState);
  } else {
    const CudaForwardState forward = cudaForward(bundle, spec, problem, inputs);
    grads = cudaBackward(bundle, spec, problem, inputs, forward, gradOut, gradFinalState);
  }
  if (!inputs.initialState.defined())
    grads.initialState = torch::Tensor();
  return grads;
}

GatedDeltaOutputs gatedDelta(const std::string &bundleDirectory, const std::string &specName,
                             const GatedDeltaInputs &in) {
  bool needBackward = false;
  if (torch::GradMode::is_enabled())
    for (const torch::Tensor *t : {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.a, &in.b, &in.aLog,
                                   &in.dtBias, &in.initialState})
      needBackward = needBackward || (t->defined() && t->requires_grad());
  auto optional = [](const torch::Tensor &t) -> detail::OptionalTensor {
    return t.defined() ? detail::OptionalTensor(t) : std::nullopt;
  };
  const torch::autograd::tensor_list outputs = detail::GatedDeltaFunction::apply(
      bundleDirectory, specName, in.q, in.k, in.v, optional(in.g), optional(in.beta), optional(in.a),
      optional(in.b), optional(in.aLog), optional(in.dtBias), optional(in.initialState),
      optional(in.cuSeqlens), needBackward);
  const bool finalState = GatedDeltaBundle::openCached(bundleDirectory)->spec(specName).finalState;
  return {outputs[0], finalState ? outputs[1] : torch::Tensor()};
}

namespace {

/// cu_seqlens (int32, CPU) of a layout's sequences over the flattened rows.
torch::Tensor layoutOffsets(const models::TokenLayout &layout, const std::string &context) {
  std::vector<int32_t> offsets{0};
  for (const models::TokenLayout::Segment &s : layout.segments()) {
    if (s.row * layout.length() + s.begin != offsets.back())
      throw FormatError(context + ": the layout's sequences do not tile the rows in order");
    offsets.push_back(static_cast<int32_t>(s.row * layout.length() + s.end));
  }
  return torch::tensor(offsets, torch::kInt);
}

} // namespace

models::GatedDeltaFn gatedDeltaHook(const std::string &bundleDirectory, const std::string &specName) {
  std::shared_ptr<const GatedDeltaBundle> bundle = GatedDeltaBundle::openCached(bundleDirectory);
  const GatedDeltaKernelSpec &spec = bundle->spec(specName);
  const std::string context = detail::where(spec) + " as the target model's gated delta rule";
  if (spec.gate != "scalar_log" || !spec.deltaRule || !spec.qkL2Norm || spec.inKernelGate)
    throw FormatError(context + ": needs gate scalar_log, delta_rule and qk_l2norm without in_kernel_gate");
  const double modelScale = 1.0 / std::sqrt(double(spec.keyDim));
  if (std::abs(spec.scale - modelScale) > 1e-6 * modelScale)
    throw FormatError(context + ": the model scales q by 1/sqrt(key_dim) = " + std::to_string(modelScale) +
                      ", the spec by " + std::to_string(spec.scale));
  const bool varlen = spec.varlen;
  return [bundleDirectory, specName, varlen, context](const models::GatedDeltaCall &call) {
    if (!call.q.is_cuda())
      return models::gatedDeltaRule(call.q, call.k, call.v, call.g, call.beta, call.layout);
    GatedDeltaInputs in;
    in.q = call.q;
    in.k = call.k;
    in.v = call.v;
    in.g = call.g;
    in.beta = call.beta;
    if (varlen)
      in.cuSeqlens = layoutOffsets(call.layout, context);
    else if (call.layout.isPacked())
      throw FormatError(context + ": packed rows need a varlen spec");
    return gatedDelta(bundleDirectory, specName, in).out;
  };
}

} // namespace dflex::runtime
