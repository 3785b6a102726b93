// Float64 CPU reference of masked attention with a score modification,
// forward (O, LSE) and backward (dQ, dK, dV), straight from the definition:
//   s = scale * q.k, logit = score_mod(s) (or s), visible pairs only,
//   P = softmax over visible keys, O = P V, LSE = log sum exp(logit);
//   a row with no visible key: O = 0, LSE = -inf, no gradient.
//   dP = dO V^T, dlogit = P * (dP - rowsum(dO * O)), ds = dlogit * score_mod'(s),
//   dQ = scale * ds K, dK = scale * ds^T Q, dV = P^T dO (dK, dV summed over
//   the query heads of a group).
// Tensors are [B, T, H, D] row-major. The variant's float functions are
// evaluated in float (their own precision) and widened.
#pragma once

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace attention_test {

struct Problem {
  int batch;
  int q_heads;
  int kv_heads;
  int q_len;
  int kv_len;
  int head_dim;
  double scale;

  size_t q_elements() const { return static_cast<size_t>(batch) * q_len * q_heads * head_dim; }
  size_t kv_elements() const { return static_cast<size_t>(batch) * kv_len * kv_heads * head_dim; }
  size_t q_index(int b, int t, int h) const {
    return ((static_cast<size_t>(b) * q_len + t) * q_heads + h) * head_dim;
  }
  size_t kv_index(int b, int t, int h) const {
    return ((static_cast<size_t>(b) * kv_len + t) * kv_heads + h) * head_dim;
  }
};

struct AttentionInputs {
  std::vector<double> q, k, v, grad_o;
};

struct AttentionOutputs {
  std::vector<double> o, lse, grad_q, grad_k, grad_v;  // lse: [B, q_heads, q_len]
};

template <class Variant>
AttentionOutputs reference_attention(const Problem& p, const Variant& variant, const AttentionInputs& in,
                                     bool with_backward = true) {
  const int d = p.head_dim;
  const int group = p.q_heads / p.kv_heads;
  AttentionOutputs out;
  out.o.assign(p.q_elements(), 0.0);
  out.lse.assign(static_cast<size_t>(p.batch) * p.q_heads * p.q_len, 0.0);
  out.grad_q.assign(p.q_elements(), 0.0);
  // Per query head partial dK, dV: [B, q_heads, kv_len, D], summed over groups below.
  std::vector<double> partial_k, partial_v;
  if (with_backward) {
    partial_k.assign(static_cast<size_t>(p.batch) * p.q_heads * p.kv_len * d, 0.0);
    partial_v.assign(partial_k.size(), 0.0);
  }

  auto dot = [d](const double* a, const double* b) {
    double s = 0;
    for (int i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
  };

  auto run_head = [&](int b, int h) {
    const int hk = h / group;
    std::vector<int> visible;
    std::vector<double> raw(p.kv_len), logit(p.kv_len), prob(p.kv_len);
    double* pk = with_backward ? &partial_k[(static_cast<size_t>(b) * p.q_heads + h) * p.kv_len * d] : nullptr;
    double* pv = with_backward ? &partial_v[(static_cast<size_t>(b) * p.q_heads + h) * p.kv_len * d] : nullptr;
    for (int q = 0; q < p.q_len; ++q) {
      const double* qrow = &in.q[p.q_index(b, q, h)];
      double* orow = &out.o[p.q_index(b, q, h)];
      double& lse = out.lse[(static_cast<size_t>(b) * p.q_heads + h) * p.q_len + q];
      visible.clear();
      double max_logit = -std::numeric_limits<double>::infinity();
      for (int kv = 0; kv < p.kv_len; ++kv) {
        if (!variant.mask(b, h, q, kv)) continue;
        visible.push_back(kv);
        raw[kv] = p.scale * dot(qrow, &in.k[p.kv_index(b, kv, hk)]);
        logit[kv] = Variant::kHasScoreMod
                        ? static_cast<double>(variant.score_mod(static_cast<float>(raw[kv]), b, h, q, kv))
                        : raw[kv];
        max_logit = std::max(max_logit, logit[kv]);
      }
      if (visible.empty()) {
        lse = -std::numeric_limits<double>::infinity();
        continue;
      }
      double sum = 0;
      for (int kv : visible) sum += std::exp(logit[kv] - max_logit);
      lse = max_logit + std::log(sum);
      for (int kv : visible) {
        prob[kv] = std::exp(logit[kv] - lse);
        const double* vrow = &in.v[p.kv_index(b, kv, hk)];
        for (int i = 0; i < d; ++i) orow[i] += prob[kv] * vrow[i];
      }
      if (!with_backward) continue;

      const double* dorow = &in.grad_o[p.q_index(b, q, h)];
      double* dqrow = &out.grad_q[p.q_index(b, q, h)];
      const double delta = dot(dorow, orow);
      for (int kv : visible) {
        const double* krow = &in.k[p.kv_index(b, kv, hk)];
        const double* vrow = &in.v[p.kv_index(b, kv, hk)];
        const double dlogit = prob[kv] * (dot(dorow, vrow) - delta);
        const double slope = Variant::kHasScoreMod
                                 ? static_cast<double>(variant.score_mod_grad(static_cast<float>(raw[kv]), b, h, q, kv))
                                 : 1.0;
        const double ds = dlogit * slope * p.scale;
        double* dk = pk + static_cast<size_t>(kv) * d;
        double* dv = pv + static_cast<size_t>(kv) * d;
        for (int i = 0; i < d; ++i) {
          dqrow[i] += ds * krow[i];
          dk[i] += ds * qrow[i];
          dv[i] += prob[kv] * dorow[i];
        }
      }
    }
  };

  const int heads_total = p.batch * p.q_heads;
  const int workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (int w = 0; w < std::min(workers, heads_total); ++w) {
    threads.emplace_back([&, w] {
      for (int i = w; i < heads_total; i += workers) run_head(i / p.q_heads, i % p.q_heads);
    });
  }
  for (auto& t : threads) t.join();

  if (with_backward) {
    out.grad_k.assign(p.kv_elements(), 0.0);
    out.grad_v.assign(p.kv_elements(), 0.0);
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < p.q_heads; ++h) {
        const int hk = h / group;
        for (int kv = 0; kv < p.kv_len; ++kv) {
          const size_t src = ((static_cast<size_t>(b) * p.q_heads + h) * p.kv_len + kv) * d;
          const size_t dst = p.kv_index(b, kv, hk);
          for (int i = 0; i < d; ++i) {
            out.grad_k[dst + i] += partial_k[src + i];
            out.grad_v[dst + i] += partial_v[src + i];
          }
        }
      }
    }
  }
  return out;
}

}  // namespace attention_test
