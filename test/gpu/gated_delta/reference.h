// Float64 CPU references of the gated delta rule, per value head hv (key head
// hk = hv / (Hv / Hk)), state S of Dk x Dv:
//   S' = exp(g_t) S;  delta_t = beta_t (v_t - S'^T k_t)  (without the delta rule: delta_t = v_t)
//   S  = S' + k_t delta_t^T;  o_t = scale S^T q_t
// with q, k optionally L2-normalised (x / sqrt(|x|^2 + 1e-6)) and, with the
// in-kernel gate, g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b).
//
// reference_sequential: the recurrence token by token, and its backward by
//   reverse-mode differentiation of the same steps (the ground truth).
// reference_chunked: the chunk-of-64 WY / UT-transform decomposition that the
//   GPU kernels implement, forward and backward, in float64 with the same
//   intermediate quantities (W, U, T, per-chunk states, dH, ...). It is checked
//   against reference_sequential on the CPU, so the algebra of the kernels is
//   validated independently of the GPU.
//
// Tensors are token-major: q, k [T, Hk, Dk]; v, o, do [T, Hv, Dv];
// g, beta, a, b [T, Hv]; states [N, Hv, Dk, Dv]; T = sum of the sequence lengths.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace gated_delta_test {

constexpr double kNormEpsilon = 1e-6;
constexpr int kChunk = 64;

struct Problem {
  int key_dim = 64;
  int value_dim = 64;
  int key_heads = 1;
  int value_heads = 1;
  std::vector<int> lengths;  // one per sequence
  bool gate = true;          // scalar_log gate (false: g = 0)
  bool delta_rule = true;
  bool qk_l2norm = true;
  bool in_kernel_gate = false;
  bool initial_state = false;
  bool final_state = false;
  double scale = 0.125;

  int sequences() const { return static_cast<int>(lengths.size()); }
  int tokens() const {
    int total = 0;
    for (int length : lengths) total += length;
    return total;
  }
  int start(int sequence) const {
    int offset = 0;
    for (int i = 0; i < sequence; ++i) offset += lengths[i];
    return offset;
  }
  int group() const { return value_heads / key_heads; }
  size_t qk_elements() const { return static_cast<size_t>(tokens()) * key_heads * key_dim; }
  size_t v_elements() const { return static_cast<size_t>(tokens()) * value_heads * value_dim; }
  size_t gate_elements() const { return static_cast<size_t>(tokens()) * value_heads; }
  size_t state_elements() const { return static_cast<size_t>(sequences()) * value_heads * key_dim * value_dim; }
};

struct Inputs {
  std::vector<double> q, k, v;
  std::vector<double> g, beta;                 // used without the in-kernel gate
  std::vector<double> a, b, a_log, dt_bias;    // used with it (a_log, dt_bias: [Hv])
  std::vector<double> initial_state;           // [N, Hv, Dk, Dv] when initial_state
  std::vector<double> grad_o;                  // [T, Hv, Dv]
  std::vector<double> grad_final_state;        // [N, Hv, Dk, Dv] when final_state
};

struct Outputs {
  std::vector<double> o, final_state;
  std::vector<double> grad_q, grad_k, grad_v;
  std::vector<double> grad_g, grad_beta;                  // without the in-kernel gate
  std::vector<double> grad_a, grad_b, grad_a_log, grad_dt_bias;  // with it
  // sum over tokens of |dg g| and |da| per value head: the size of the terms
  // that grad_a_log and grad_dt_bias add up (their sums cancel a lot).
  std::vector<double> grad_a_log_terms, grad_dt_bias_terms;
  std::vector<double> grad_initial_state;
};

// The chunked decomposition's intermediate quantities, laid out as the
// kernels' workspace (to localise a mismatch): token-level [T, Hv, D] and
// chunk-level [chunks, Hv, ...], chunks numbered sequence after sequence.
struct Intermediates {
  std::vector<double> gate_cumsum;        // [T, Hv]
  std::vector<double> key_decay;          // [T, Hv]  exp(c_last - c) / |k|
  std::vector<double> w;                  // [T, Hv, Dk]
  std::vector<double> u, delta, grad_delta;  // [T, Hv, Dv]
  std::vector<double> t_inverse;          // [chunks, Hv, 64, 64], identity past the chunk's end
  std::vector<double> chunk_states;       // [chunks, Hv, Dk, Dv] state at each chunk's start
  std::vector<double> chunk_state_grads;  // [chunks, Hv, Dk, Dv] dL/d(state at each chunk's end)
};

inline double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Per (token, value head) gate and beta as the kernels define them.
struct Gates {
  std::vector<double> g, beta;
};

inline Gates effective_gates(const Problem& p, const Inputs& in) {
  const int hv_count = p.value_heads;
  Gates gates;
  gates.g.assign(p.gate_elements(), 0.0);
  gates.beta.assign(p.gate_elements(), 1.0);
  for (size_t i = 0; i < p.gate_elements(); ++i) {
    const int hv = static_cast<int>(i % hv_count);
    if (p.in_kernel_gate) {
      gates.g[i] = -std::exp(in.a_log[hv]) * softplus(in.a[i] + in.dt_bias[hv]);
      gates.beta[i] = sigmoid(in.b[i]);
    } else {
      if (p.gate) gates.g[i] = in.g[i];
      if (p.delta_rule) gates.beta[i] = in.beta[i];
    }
  }
  return gates;
}

// L2-normalised copy of rows of length d (or the rows themselves), with 1/norm.
inline void normalise_rows(const std::vector<double>& x, int d, bool enabled, std::vector<double>& unit,
                           std::vector<double>& inverse_norm) {
  const size_t rows = x.size() / d;
  unit = x;
  inverse_norm.assign(rows, 1.0);
  if (!enabled) return;
  for (size_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int i = 0; i < d; ++i) sum += x[r * d + i] * x[r * d + i];
    const double inv = 1.0 / std::sqrt(sum + kNormEpsilon);
    inverse_norm[r] = inv;
    for (int i = 0; i < d; ++i) unit[r * d + i] = x[r * d + i] * inv;
  }
}

// dx = inv (dunit - unit (unit . dunit)) per row; accumulates into grad.
inline void normalise_backward(const std::vector<double>& unit, const std::vector<double>& inverse_norm,
                               const std::vector<double>& grad_unit, int d, bool enabled,
                               std::vector<double>& grad) {
  const size_t rows = unit.size() / d;
  grad.assign(unit.size(), 0.0);
  for (size_t r = 0; r < rows; ++r) {
    double dot = 0;
    if (enabled)
      for (int i = 0; i < d; ++i) dot += unit[r * d + i] * grad_unit[r * d + i];
    for (int i = 0; i < d; ++i)
      grad[r * d + i] = enabled ? inverse_norm[r] * (grad_unit[r * d + i] - unit[r * d + i] * dot) : grad_unit[r * d + i];
  }
}

// Maps dg, dbeta (per token and value head) to the gate inputs' gradients.
inline void gate_backward(const Problem& p, const Inputs& in, const Gates& gates, const std::vector<double>& dg,
                          const std::vector<double>& dbeta, Outputs& out) {
  if (!p.in_kernel_gate) {
    if (p.gate) out.grad_g = dg;
    if (p.delta_rule) out.grad_beta = dbeta;
    return;
  }
  out.grad_a.assign(p.gate_elements(), 0.0);
  out.grad_b.assign(p.gate_elements(), 0.0);
  out.grad_a_log.assign(p.value_heads, 0.0);
  out.grad_dt_bias.assign(p.value_heads, 0.0);
  out.grad_a_log_terms.assign(p.value_heads, 0.0);
  out.grad_dt_bias_terms.assign(p.value_heads, 0.0);
  for (size_t i = 0; i < p.gate_elements(); ++i) {
    const int hv = static_cast<int>(i % p.value_heads);
    const double da = dg[i] * -std::exp(in.a_log[hv]) * sigmoid(in.a[i] + in.dt_bias[hv]);
    out.grad_a[i] = da;
    out.grad_dt_bias[hv] += da;
    out.grad_a_log[hv] += dg[i] * gates.g[i];
    out.grad_dt_bias_terms[hv] += std::abs(da);
    out.grad_a_log_terms[hv] += std::abs(dg[i] * gates.g[i]);
    out.grad_b[i] = dbeta[i] * gates.beta[i] * (1.0 - gates.beta[i]);
  }
}

// ---------------------------------------------------------------------------
// The recurrence, token by token.

inline Outputs reference_sequential(const Problem& p, const Inputs& in, bool with_backward) {
  const int dk = p.key_dim, dv = p.value_dim, hk_count = p.key_heads, hv_count = p.value_heads;
  const Gates gates = effective_gates(p, in);
  std::vector<double> qn, kn, q_inv, k_inv;
  normalise_rows(in.q, dk, p.qk_l2norm, qn, q_inv);
  normalise_rows(in.k, dk, p.qk_l2norm, kn, k_inv);

  Outputs out;
  out.o.assign(p.v_elements(), 0.0);
  out.final_state.assign(p.state_elements(), 0.0);
  std::vector<double> dqn(p.qk_elements(), 0.0), dkn(p.qk_elements(), 0.0), dg(p.gate_elements(), 0.0),
      dbeta(p.gate_elements(), 0.0);
  out.grad_v.assign(p.v_elements(), 0.0);
  out.grad_initial_state.assign(p.state_elements(), 0.0);

  const size_t state_size = static_cast<size_t>(dk) * dv;
  for (int n = 0; n < p.sequences(); ++n) {
    const int start = p.start(n), length = p.lengths[n];
    for (int hv = 0; hv < hv_count; ++hv) {
      const int hk = hv / p.group();
      const size_t state_offset = (static_cast<size_t>(n) * hv_count + hv) * state_size;
      auto qrow = [&](int t) { return &qn[(static_cast<size_t>(start + t) * hk_count + hk) * dk]; };
      auto krow = [&](int t) { return &kn[(static_cast<size_t>(start + t) * hk_count + hk) * dk]; };
      auto vrow = [&](int t) { return &in.v[(static_cast<size_t>(start + t) * hv_count + hv) * dv]; };
      auto gate_index = [&](int t) { return static_cast<size_t>(start + t) * hv_count + hv; };
      // states[t] = S after token t; states[0..] with the initial state in front.
      std::vector<double> states(static_cast<size_t>(length + 1) * state_size, 0.0);
      if (p.initial_state)
        std::copy(in.initial_state.begin() + state_offset, in.initial_state.begin() + state_offset + state_size,
                  states.begin());
      std::vector<double> deltas(static_cast<size_t>(length) * dv);
      for (int t = 0; t < length; ++t) {
        const double decay = std::exp(gates.g[gate_index(t)]), beta = gates.beta[gate_index(t)];
        const double* previous = &states[static_cast<size_t>(t) * state_size];
        double* state = &states[static_cast<size_t>(t + 1) * state_size];
        for (size_t i = 0; i < state_size; ++i) state[i] = decay * previous[i];
        const double* kt = krow(t);
        double* delta = &deltas[static_cast<size_t>(t) * dv];
        for (int j = 0; j < dv; ++j) {
          if (p.delta_rule) {
            double prediction = 0;
            for (int i = 0; i < dk; ++i) prediction += state[i * dv + j] * kt[i];
            delta[j] = beta * (vrow(t)[j] - prediction);
          } else {
            delta[j] = vrow(t)[j];
          }
        }
        for (int i = 0; i < dk; ++i)
          for (int j = 0; j < dv; ++j) state[i * dv + j] += kt[i] * delta[j];
        double* o = &out.o[(static_cast<size_t>(start + t) * hv_count + hv) * dv];
        for (int j = 0; j < dv; ++j) {
          double sum = 0;
          for (int i = 0; i < dk; ++i) sum += state[i * dv + j] * qrow(t)[i];
          o[j] = p.scale * sum;
        }
      }
      std::copy(states.end() - state_size, states.end(), out.final_state.begin() + state_offset);
      if (!with_backward) continue;

      std::vector<double> ds(state_size, 0.0), dprevious(state_size);
      if (p.final_state)
        std::copy(in.grad_final_state.begin() + state_offset,
                  in.grad_final_state.begin() + state_offset + state_size, ds.begin());
      for (int t = length - 1; t >= 0; --t) {
        const double decay = std::exp(gates.g[gate_index(t)]), beta = gates.beta[gate_index(t)];
        const double* previous = &states[static_cast<size_t>(t) * state_size];
        const double* state = &states[static_cast<size_t>(t + 1) * state_size];
        const double* dot = &in.grad_o[(static_cast<size_t>(start + t) * hv_count + hv) * dv];
        const double* qt = qrow(t);
        const double* kt = krow(t);
        double* dq = &dqn[(static_cast<size_t>(start + t) * hk_count + hk) * dk];
        double* dkt = &dkn[(static_cast<size_t>(start + t) * hk_count + hk) * dk];
        // o = scale S^T q
        for (int i = 0; i < dk; ++i) {
          double sum = 0;
          for (int j = 0; j < dv; ++j) {
            ds[i * dv + j] += p.scale * qt[i] * dot[j];
            sum += state[i * dv + j] * dot[j];
          }
          dq[i] += p.scale * sum;
        }
        // S = S' + k delta^T
        const double* delta = &deltas[static_cast<size_t>(t) * dv];
        std::vector<double> ddelta(dv, 0.0);
        for (int i = 0; i < dk; ++i)
          for (int j = 0; j < dv; ++j) {
            dkt[i] += ds[i * dv + j] * delta[j];
            ddelta[j] += ds[i * dv + j] * kt[i];
          }
        // S' (= decay * previous) receives ds, plus the delta-rule prediction's share.
        std::vector<double> dstate_prime = ds;
        double* dv_row = &out.grad_v[(static_cast<size_t>(start + t) * hv_count + hv) * dv];
        if (p.delta_rule) {
          double dbeta_t = 0;
          for (int j = 0; j < dv; ++j) {
            double prediction = 0;
            for (int i = 0; i < dk; ++i) prediction += decay * previous[i * dv + j] * kt[i];
            dv_row[j] = beta * ddelta[j];
            dbeta_t += ddelta[j] * (vrow(t)[j] - prediction);
            const double dprediction = -beta * ddelta[j];
            for (int i = 0; i < dk; ++i) {
              dstate_prime[i * dv + j] += kt[i] * dprediction;
              dkt[i] += decay * previous[i * dv + j] * dprediction;
            }
          }
          dbeta[gate_index(t)] = dbeta_t;
        } else {
          for (int j = 0; j < dv; ++j) dv_row[j] = ddelta[j];
        }
        double dgt = 0;
        for (size_t i = 0; i < state_size; ++i) {
          dgt += decay * previous[i] * dstate_prime[i];
          dprevious[i] = decay * dstate_prime[i];
        }
        dg[gate_index(t)] = dgt;
        ds.swap(dprevious);
      }
      std::copy(ds.begin(), ds.end(), out.grad_initial_state.begin() + state_offset);
    }
  }
  if (with_backward) {
    normalise_backward(qn, q_inv, dqn, dk, p.qk_l2norm, out.grad_q);
    normalise_backward(kn, k_inv, dkn, dk, p.qk_l2norm, out.grad_k);
    gate_backward(p, in, gates, dg, dbeta, out);
  }
  return out;
}

// ---------------------------------------------------------------------------
// The chunked decomposition (chunk of C = 64 tokens; the last chunk of a
// sequence may be shorter). Per chunk with state S0 at its start, in-chunk
// cumulative log gates c_i = g_0 + ... + g_i, E = diag(exp(c)),
// Gamma_ij = exp(c_i - c_j), D_j = exp(c_last - c_j), B = diag(beta):
//   A = strict_lower(B (K K^T) o Gamma),  T = (I + A)^-1
//   W = T B E K,  U = T B V,  delta = U - W S0
//   O = scale (E Q S0 + lower(Q K^T o Gamma) delta)
//   S_last = exp(c_last) S0 + K^T D delta
// Backward, with dH = dL/dS_last (from the next chunk):
//   ddelta = scale lower(Q K^T o Gamma)^T dO + D K dH
//   dS0 = exp(c_last) dH + scale Q^T E dO - W^T ddelta
//   dX = T^T ddelta,  dV = B dX,  dA = -strict_lower(dX delta^T)
//   dP = scale lower(dO delta^T),  Z = -E dX S0^T
//   dQ = scale E dO S0^T + (dP o Gamma) K
//   dK = (dP o Gamma)^T Q + D delta dH^T + B Z + G K + G^T K,  G = dA o B Gamma
//   dbeta_i = v_i . dX_i + k_i . Z_i + sum_j dA_ij (K K^T o Gamma)_ij
//   dc_i = q_i . dQ_i - sum_i' dP_i'i P_i'i - r_i + beta_i k_i . Z_i
//          + sum_j dA_ij A_ij - sum_i' dA_i'i A_i'i,   r_j = D_j k_j . (dH delta_j)
//   dc_last += sum_j r_j + exp(c_last) <S0, dH>
//   dg = reverse cumulative sum of dc within the chunk.
// Without the delta rule, delta = V (no A, T, W, U) and dV = ddelta.

namespace chunked {

using Matrix = std::vector<double>;  // row-major, sizes passed alongside

inline Matrix multiply(const Matrix& a, const Matrix& b, int m, int k, int n, bool transpose_a = false,
                       bool transpose_b = false) {
  Matrix c(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int l = 0; l < k; ++l) {
      const double x = transpose_a ? a[static_cast<size_t>(l) * m + i] : a[static_cast<size_t>(i) * k + l];
      if (x == 0) continue;
      for (int j = 0; j < n; ++j)
        c[static_cast<size_t>(i) * n + j] +=
            x * (transpose_b ? b[static_cast<size_t>(j) * k + l] : b[static_cast<size_t>(l) * n + j]);
    }
  return c;
}

}  // namespace chunked

inline Outputs reference_chunked(const Problem& p, const Inputs& in, bool with_backward,
                                 Intermediates* capture = nullptr) {
  using chunked::Matrix;
  using chunked::multiply;
  const int dk = p.key_dim, dv = p.value_dim, hk_count = p.key_heads, hv_count = p.value_heads;
  const Gates gates = effective_gates(p, in);
  std::vector<double> qn, kn, q_inv, k_inv;
  normalise_rows(in.q, dk, p.qk_l2norm, qn, q_inv);
  normalise_rows(in.k, dk, p.qk_l2norm, kn, k_inv);

  Outputs out;
  out.o.assign(p.v_elements(), 0.0);
  out.final_state.assign(p.state_elements(), 0.0);
  std::vector<double> dqn(p.qk_elements(), 0.0), dkn(p.qk_elements(), 0.0), dg(p.gate_elements(), 0.0),
      dbeta(p.gate_elements(), 0.0);
  out.grad_v.assign(p.v_elements(), 0.0);
  out.grad_initial_state.assign(p.state_elements(), 0.0);
  const size_t state_size = static_cast<size_t>(dk) * dv;
  int total_chunks = 0;
  std::vector<int> first_chunk(p.sequences());
  for (int n = 0; n < p.sequences(); ++n) {
    first_chunk[n] = total_chunks;
    total_chunks += (p.lengths[n] + kChunk - 1) / kChunk;
  }
  if (capture != nullptr) {
    const size_t tokens = p.tokens();
    capture->gate_cumsum.assign(tokens * hv_count, 0.0);
    capture->w.assign(tokens * hv_count * dk, 0.0);
    capture->key_decay.assign(tokens * hv_count, 0.0);
    capture->u.assign(tokens * hv_count * dv, 0.0);
    capture->delta.assign(tokens * hv_count * dv, 0.0);
    capture->grad_delta.assign(tokens * hv_count * dv, 0.0);
    capture->t_inverse.assign(static_cast<size_t>(total_chunks) * hv_count * kChunk * kChunk, 0.0);
    capture->chunk_states.assign(static_cast<size_t>(total_chunks) * hv_count * state_size, 0.0);
    capture->chunk_state_grads.assign(static_cast<size_t>(total_chunks) * hv_count * state_size, 0.0);
  }

  struct Chunk {
    int length;
    std::vector<double> c, beta;  // cumulative gate, beta
    Matrix q, k, v, t_inverse, w, u, delta, state;  // state: S0
    Matrix do_;
  };

  for (int n = 0; n < p.sequences(); ++n) {
    const int start = p.start(n), length = p.lengths[n];
    const int chunk_count = (length + kChunk - 1) / kChunk;
    for (int hv = 0; hv < hv_count; ++hv) {
      const int hk = hv / p.group();
      const size_t state_offset = (static_cast<size_t>(n) * hv_count + hv) * state_size;
      std::vector<Chunk> chunks(chunk_count);
      Matrix state(state_size, 0.0);
      if (p.initial_state)
        std::copy(in.initial_state.begin() + state_offset, in.initial_state.begin() + state_offset + state_size,
                  state.begin());
      for (int ci = 0; ci < chunk_count; ++ci) {
        Chunk& ch = chunks[ci];
        const int t0 = start + ci * kChunk, L = std::min(kChunk, length - ci * kChunk);
        ch.length = L;
        ch.c.assign(L, 0.0);
        ch.beta.assign(L, 0.0);
        ch.q.assign(static_cast<size_t>(L) * dk, 0.0);
        ch.k.assign(static_cast<size_t>(L) * dk, 0.0);
        ch.v.assign(static_cast<size_t>(L) * dv, 0.0);
        ch.do_.assign(static_cast<size_t>(L) * dv, 0.0);
        double running = 0;
        for (int i = 0; i < L; ++i) {
          const size_t gi = static_cast<size_t>(t0 + i) * hv_count + hv;
          running += gates.g[gi];
          ch.c[i] = running;
          ch.beta[i] = gates.beta[gi];
          for (int x = 0; x < dk; ++x) {
            ch.q[static_cast<size_t>(i) * dk + x] = qn[(static_cast<size_t>(t0 + i) * hk_count + hk) * dk + x];
            ch.k[static_cast<size_t>(i) * dk + x] = kn[(static_cast<size_t>(t0 + i) * hk_count + hk) * dk + x];
          }
          for (int x = 0; x < dv; ++x) {
            ch.v[static_cast<size_t>(i) * dv + x] = in.v[gi * dv + x];
            if (with_backward) ch.do_[static_cast<size_t>(i) * dv + x] = in.grad_o[gi * dv + x];
          }
        }
        const double last = ch.c[L - 1];
        auto gamma = [&](int i, int j) { return std::exp(ch.c[i] - ch.c[j]); };
        if (p.delta_rule) {
          const Matrix kk = multiply(ch.k, ch.k, L, dk, L, false, true);
          // T = (I + A)^-1 by forward substitution.
          ch.t_inverse.assign(static_cast<size_t>(L) * L, 0.0);
          for (int i = 0; i < L; ++i) {
            for (int col = 0; col <= i; ++col) {
              double sum = i == col ? 1.0 : 0.0;
              for (int j = col; j < i; ++j)
                sum -= ch.beta[i] * kk[static_cast<size_t>(i) * L + j] * gamma(i, j) *
                       ch.t_inverse[static_cast<size_t>(j) * L + col];
              ch.t_inverse[static_cast<size_t>(i) * L + col] = sum;
            }
          }
          Matrix bek = ch.k, bv = ch.v;
          for (int i = 0; i < L; ++i) {
            for (int x = 0; x < dk; ++x) bek[static_cast<size_t>(i) * dk + x] *= ch.beta[i] * std::exp(ch.c[i]);
            for (int x = 0; x < dv; ++x) bv[static_cast<size_t>(i) * dv + x] *= ch.beta[i];
          }
          ch.w = multiply(ch.t_inverse, bek, L, L, dk);
          ch.u = multiply(ch.t_inverse, bv, L, L, dv);
          const Matrix ws = multiply(ch.w, state, L, dk, dv);
          ch.delta = ch.u;
          for (size_t i = 0; i < ch.delta.size(); ++i) ch.delta[i] -= ws[i];
        } else {
          ch.delta = ch.v;
        }
        ch.state = state;
        if (capture != nullptr) {
          const size_t chunk_head = static_cast<size_t>(first_chunk[n] + ci) * hv_count + hv;
          std::copy(state.begin(), state.end(), capture->chunk_states.begin() + chunk_head * state_size);
          double* t_out = &capture->t_inverse[chunk_head * kChunk * kChunk];
          for (int i = 0; i < kChunk; ++i)
            for (int j = 0; j <= i; ++j)
              t_out[i * kChunk + j] =
                  i < L ? (p.delta_rule ? ch.t_inverse[static_cast<size_t>(i) * L + j] : 0.0) : (i == j ? 1.0 : 0.0);
          for (int i = 0; i < L; ++i) {
            const size_t gi = static_cast<size_t>(t0 + i) * hv_count + hv;
            capture->gate_cumsum[gi] = ch.c[i];
            capture->key_decay[gi] = std::exp(ch.c[L - 1] - ch.c[i]) * k_inv[static_cast<size_t>(t0 + i) * hk_count + hk];
            if (p.delta_rule)
              for (int x = 0; x < dk; ++x) capture->w[gi * dk + x] = ch.w[static_cast<size_t>(i) * dk + x];
            for (int x = 0; x < dv; ++x) {
              if (p.delta_rule) capture->u[gi * dv + x] = ch.u[static_cast<size_t>(i) * dv + x];
              capture->delta[gi * dv + x] = ch.delta[static_cast<size_t>(i) * dv + x];
            }
          }
        }
        // O = scale (E Q S0 + lower(Q K^T o Gamma) delta)
        const Matrix qs = multiply(ch.q, state, L, dk, dv);
        Matrix pm = multiply(ch.q, ch.k, L, dk, L, false, true);
        for (int i = 0; i < L; ++i)
          for (int j = 0; j < L; ++j) pm[static_cast<size_t>(i) * L + j] *= j <= i ? gamma(i, j) : 0.0;
        const Matrix intra = multiply(pm, ch.delta, L, L, dv);
        for (int i = 0; i < L; ++i)
          for (int x = 0; x < dv; ++x)
            out.o[(static_cast<size_t>(t0 + i) * hv_count + hv) * dv + x] =
                p.scale * (std::exp(ch.c[i]) * qs[static_cast<size_t>(i) * dv + x] + intra[static_cast<size_t>(i) * dv + x]);
        // S_last = exp(c_last) S0 + K^T D delta
        Matrix dk_delta = ch.delta;
        for (int j = 0; j < L; ++j)
          for (int x = 0; x < dv; ++x) dk_delta[static_cast<size_t>(j) * dv + x] *= std::exp(last - ch.c[j]);
        const Matrix update = multiply(ch.k, dk_delta, dk, L, dv, true, false);
        for (size_t i = 0; i < state_size; ++i) state[i] = std::exp(last) * state[i] + update[i];
      }
      std::copy(state.begin(), state.end(), out.final_state.begin() + state_offset);
      if (!with_backward) continue;

      Matrix dh(state_size, 0.0);
      if (p.final_state)
        std::copy(in.grad_final_state.begin() + state_offset,
                  in.grad_final_state.begin() + state_offset + state_size, dh.begin());
      for (int ci = chunk_count - 1; ci >= 0; --ci) {
        const Chunk& ch = chunks[ci];
        const int t0 = start + ci * kChunk, L = ch.length;
        const double last = ch.c[L - 1];
        auto gamma = [&](int i, int j) { return std::exp(ch.c[i] - ch.c[j]); };
        auto D = [&](int j) { return std::exp(last - ch.c[j]); };
        const Matrix& s0 = ch.state;
        Matrix pm = multiply(ch.q, ch.k, L, dk, L, false, true);  // P = lower(Q K^T o Gamma), unscaled
        for (int i = 0; i < L; ++i)
          for (int j = 0; j < L; ++j) pm[static_cast<size_t>(i) * L + j] *= j <= i ? gamma(i, j) : 0.0;
        // ddelta = scale P^T dO + D K dH
        Matrix ddelta = multiply(pm, ch.do_, L, L, dv, true, false);
        const Matrix kdh = multiply(ch.k, dh, L, dk, dv);
        for (int j = 0; j < L; ++j)
          for (int x = 0; x < dv; ++x)
            ddelta[static_cast<size_t>(j) * dv + x] =
                p.scale * ddelta[static_cast<size_t>(j) * dv + x] + D(j) * kdh[static_cast<size_t>(j) * dv + x];
        // dS0 = exp(c_last) dH + scale Q^T E dO - W^T ddelta
        Matrix edo = ch.do_;
        for (int i = 0; i < L; ++i)
          for (int x = 0; x < dv; ++x) edo[static_cast<size_t>(i) * dv + x] *= p.scale * std::exp(ch.c[i]);
        Matrix ds0 = multiply(ch.q, edo, dk, L, dv, true, false);
        if (p.delta_rule) {
          const Matrix wd = multiply(ch.w, ddelta, dk, L, dv, true, false);
          for (size_t i = 0; i < state_size; ++i) ds0[i] -= wd[i];
        }
        for (size_t i = 0; i < state_size; ++i) ds0[i] += std::exp(last) * dh[i];
        if (capture != nullptr) {
          const size_t chunk_head = static_cast<size_t>(first_chunk[n] + ci) * hv_count + hv;
          std::copy(dh.begin(), dh.end(), capture->chunk_state_grads.begin() + chunk_head * state_size);
          for (int i = 0; i < L; ++i)
            for (int x = 0; x < dv; ++x)
              capture->grad_delta[(static_cast<size_t>(t0 + i) * hv_count + hv) * dv + x] =
                  ddelta[static_cast<size_t>(i) * dv + x];
        }

        std::vector<double> dc(L, 0.0), db(L, 0.0);
        // dP = scale dO delta^T (lower), dQ, dK and the Gamma terms of the intra-chunk product.
        Matrix dp = multiply(ch.do_, ch.delta, L, dv, L, false, true);
        Matrix dpg(static_cast<size_t>(L) * L, 0.0);
        for (int i = 0; i < L; ++i)
          for (int j = 0; j <= i; ++j) {
            const double value = p.scale * dp[static_cast<size_t>(i) * L + j];
            dpg[static_cast<size_t>(i) * L + j] = value * gamma(i, j);
            const double contribution = value * pm[static_cast<size_t>(i) * L + j];
            dc[j] -= contribution;  // the i-side is in q . dQ below
          }
        Matrix dq = multiply(edo, s0, L, dv, dk, false, true);  // scale E dO S0^T
        const Matrix dq_intra = multiply(dpg, ch.k, L, L, dk);
        for (size_t i = 0; i < dq.size(); ++i) dq[i] += dq_intra[i];
        Matrix dkm = multiply(dpg, ch.q, L, L, dk, true, false);
        // D delta dH^T, with r_j = D_j k_j . (dH delta_j)
        const Matrix ddh = multiply(ch.delta, dh, L, dv, dk, false, true);
        double r_sum = 0;
        for (int j = 0; j < L; ++j) {
          double r = 0;
          for (int x = 0; x < dk; ++x) {
            const double value = D(j) * ddh[static_cast<size_t>(j) * dk + x];
            r += ch.k[static_cast<size_t>(j) * dk + x] * value;
            dkm[static_cast<size_t>(j) * dk + x] += value;
          }
          dc[j] -= r;
          r_sum += r;
        }
        double s0_dh = 0;
        for (size_t i = 0; i < state_size; ++i) s0_dh += s0[i] * dh[i];
        dc[L - 1] += r_sum + std::exp(last) * s0_dh;
        Matrix dv_chunk;
        if (p.delta_rule) {
          const Matrix dx = multiply(ch.t_inverse, ddelta, L, L, dv, true, false);
          dv_chunk = dx;
          for (int i = 0; i < L; ++i) {
            double vdx = 0;
            for (int x = 0; x < dv; ++x) {
              vdx += ch.v[static_cast<size_t>(i) * dv + x] * dx[static_cast<size_t>(i) * dv + x];
              dv_chunk[static_cast<size_t>(i) * dv + x] *= ch.beta[i];
            }
            db[i] += vdx;
          }
          // Z = -E dX S0^T
          Matrix z = multiply(dx, s0, L, dv, dk, false, true);
          for (int i = 0; i < L; ++i) {
            double kz = 0;
            for (int x = 0; x < dk; ++x) {
              double& value = z[static_cast<size_t>(i) * dk + x];
              value *= -std::exp(ch.c[i]);
              kz += ch.k[static_cast<size_t>(i) * dk + x] * value;
              dkm[static_cast<size_t>(i) * dk + x] += ch.beta[i] * value;
            }
            db[i] += kz;
            dc[i] += ch.beta[i] * kz;
          }
          // dA = -strict_lower(dX delta^T), G = dA o B Gamma
          const Matrix dxd = multiply(dx, ch.delta, L, dv, L, false, true);
          const Matrix kk = multiply(ch.k, ch.k, L, dk, L, false, true);
          Matrix gm(static_cast<size_t>(L) * L, 0.0);
          for (int i = 0; i < L; ++i)
            for (int j = 0; j < i; ++j) {
              const double da = -dxd[static_cast<size_t>(i) * L + j];
              const double kkg = kk[static_cast<size_t>(i) * L + j] * gamma(i, j);
              db[i] += da * kkg;
              dc[i] += da * ch.beta[i] * kkg;
              dc[j] -= da * ch.beta[i] * kkg;
              gm[static_cast<size_t>(i) * L + j] = da * ch.beta[i] * gamma(i, j);
            }
          const Matrix gk = multiply(gm, ch.k, L, L, dk);
          const Matrix gtk = multiply(gm, ch.k, L, L, dk, true, false);
          for (size_t i = 0; i < dkm.size(); ++i) dkm[i] += gk[i] + gtk[i];
        } else {
          dv_chunk = ddelta;
        }
        // dc_i += q_i . dQ_i (the E Q S0 and the i-side of the intra product)
        for (int i = 0; i < L; ++i) {
          double qdq = 0;
          for (int x = 0; x < dk; ++x) qdq += ch.q[static_cast<size_t>(i) * dk + x] * dq[static_cast<size_t>(i) * dk + x];
          dc[i] += qdq;
        }
        double suffix = 0;
        for (int i = L - 1; i >= 0; --i) {
          suffix += dc[i];
          const size_t gi = static_cast<size_t>(t0 + i) * hv_count + hv;
          dg[gi] = suffix;
          dbeta[gi] = db[i];
          for (int x = 0; x < dk; ++x) {
            dqn[(static_cast<size_t>(t0 + i) * hk_count + hk) * dk + x] += dq[static_cast<size_t>(i) * dk + x];
            dkn[(static_cast<size_t>(t0 + i) * hk_count + hk) * dk + x] += dkm[static_cast<size_t>(i) * dk + x];
          }
          for (int x = 0; x < dv; ++x) out.grad_v[gi * dv + x] = dv_chunk[static_cast<size_t>(i) * dv + x];
        }
        dh = ds0;
      }
      std::copy(dh.begin(), dh.end(), out.grad_initial_state.begin() + state_offset);
    }
  }
  if (with_backward) {
    normalise_backward(qn, q_inv, dqn, dk, p.qk_l2norm, out.grad_q);
    normalise_backward(kn, k_inv, dkn, dk, p.qk_l2norm, out.grad_k);
    gate_backward(p, in, gates, dg, dbeta, out);
  }
  return out;
}

}  // namespace gated_delta_test
