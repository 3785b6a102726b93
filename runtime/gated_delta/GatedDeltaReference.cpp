// The gated-delta op's CPU reference: the token-by-token recurrence in
// float64 (docs/runtime-gated-delta.md); its backward is reverse-mode
// differentiation of the same steps, with the state recomputed from a
// checkpoint every kCheckpointTokens tokens.
#include "GatedDeltaInternal.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

namespace dflex::runtime::detail {

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

} // namespace dflex::runtime::detail
