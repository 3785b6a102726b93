// The CPU path of the attention op, straight from the definition in float64
// (the programs themselves compute in their own types, f32 for scores):
//   s = scale * q.k, logit = score_mod(s) (or s), over the keys the mask shows;
//   lse = log sum exp(logit), P = exp(logit - lse), o = P V;
//   a query that sees no key: o = 0, lse = -inf, no gradient.
//   dlogit = P * (dO.v - dO.o), ds = dlogit * score_mod'(s) * scale,
//   dQ = ds K, dK = ds^T Q, dV = P^T dO (dK, dV summed over a group's heads).
#include "AttentionInternal.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

namespace dflex::runtime::detail {

namespace {

/// Row-major float64 copy of a [B, T, H, D] tensor with index helpers.
struct Rows {
  torch::Tensor tensor;
  const double *data;
  int64_t length, heads, dim;

  explicit Rows(const torch::Tensor &t)
      : tensor(t.to(torch::kDouble).contiguous()), data(tensor.data_ptr<double>()),
        length(t.size(1)), heads(t.size(2)), dim(t.size(3)) {}
  const double *row(int64_t b, int64_t t, int64_t h) const {
    return data + ((b * length + t) * heads + h) * dim;
  }
};

double dot(const double *a, const double *b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += a[i] * b[i];
  return sum;
}

/// Evaluates the mask and score_mod of one spec; one per thread.
class Logits {
public:
  Logits(const AttentionKernelSpec &spec, const BoundCaptures &captures)
      : spec_(spec), maskCaptures_(captures.forProgram(spec.mask, spec.layout)) {
    if (spec.scoreMod)
      scoreCaptures_ = captures.forProgram(*spec.scoreMod, spec.layout);
  }

  bool visible(int64_t b, int64_t h, int64_t q, int64_t kv) {
    return expr::evaluateMask(spec_.mask, b, h, q, kv, maskCaptures_, scratch_);
  }
  /// The logit of scaled score `s`; with `slope`, also d logit / d s.
  double logit(double s, int64_t b, int64_t h, int64_t q, int64_t kv, double *slope = nullptr) {
    if (!spec_.scoreMod) {
      if (slope)
        *slope = 1.0;
      return s;
    }
    const float value = expr::evaluateScoreMod(*spec_.scoreMod, static_cast<float>(s), b, h, q,
                                               kv, scoreCaptures_, scratch_);
    if (slope)
      *slope = scratch_[spec_.scoreMod->scoreDerivative].f;
    return value;
  }

private:
  const AttentionKernelSpec &spec_;
  std::vector<expr::CaptureValue> maskCaptures_, scoreCaptures_;
  std::vector<expr::Value> scratch_;
};

torch::ScalarType lseType(const torch::Tensor &q) {
  return q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

} // namespace

AttentionOutputs referenceForward(const AttentionKernelSpec &spec, const AttentionProblem &p,
                                  const torch::Tensor &q, const torch::Tensor &k,
                                  const torch::Tensor &v, const BoundCaptures &captures) {
  const Rows qs(q), ks(k), vs(v);
  torch::Tensor out = torch::zeros({p.batch, p.queryLength, p.qHeads, p.vHeadDim}, torch::kDouble);
  torch::Tensor lse = torch::empty({p.batch, p.qHeads, p.queryLength}, torch::kDouble);
  double *outData = out.data_ptr<double>();
  double *lseData = lse.data_ptr<double>();
  const int64_t group = p.qHeads / p.kvHeads;
  const double scale = spec.scale;

  at::parallel_for(0, p.batch * p.qHeads, 1, [&](int64_t begin, int64_t end) {
    Logits logits(spec, captures);
    std::vector<int64_t> keys;
    std::vector<double> values;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / p.qHeads, h = bh % p.qHeads, hk = h / group;
      for (int64_t t = 0; t < p.queryLength; ++t) {
        keys.clear();
        values.clear();
        double maximum = -std::numeric_limits<double>::infinity();
        for (int64_t kv = 0; kv < p.keyLength; ++kv) {
          if (!logits.visible(b, h, t, kv))
            continue;
          const double s = scale * dot(qs.row(b, t, h), ks.row(b, kv, hk), p.qkHeadDim);
          keys.push_back(kv);
          values.push_back(logits.logit(s, b, h, t, kv));
          maximum = std::max(maximum, values.back());
        }
        double &rowLse = lseData[bh * p.queryLength + t];
        if (keys.empty()) {
          rowLse = -std::numeric_limits<double>::infinity();
          continue;
        }
        double sum = 0;
        for (double value : values)
          sum += std::exp(value - maximum);
        rowLse = maximum + std::log(sum);
        double *o = outData + ((b * p.queryLength + t) * p.qHeads + h) * p.vHeadDim;
        for (size_t i = 0; i < keys.size(); ++i) {
          const double probability = std::exp(values[i] - rowLse);
          const double *vRow = vs.row(b, keys[i], hk);
          for (int64_t d = 0; d < p.vHeadDim; ++d)
            o[d] += probability * vRow[d];
        }
      }
    }
  });
  return {out.to(q.scalar_type()), lse.to(lseType(q))};
}

AttentionGrads referenceBackward(const AttentionKernelSpec &spec, const AttentionProblem &p,
                                 const torch::Tensor &q, const torch::Tensor &k,
                                 const torch::Tensor &v, const torch::Tensor &out,
                                 const torch::Tensor &logSumExp, const torch::Tensor &gradOut,
                                 const BoundCaptures &captures) {
  const Rows qs(q), ks(k), vs(v), os(out), dos(gradOut);
  const torch::Tensor lse = logSumExp.to(torch::kDouble).contiguous();
  const double *lseData = lse.data_ptr<double>();
  torch::Tensor dq = torch::zeros({p.batch, p.queryLength, p.qHeads, p.qkHeadDim}, torch::kDouble);
  torch::Tensor dk = torch::zeros({p.batch, p.keyLength, p.kvHeads, p.qkHeadDim}, torch::kDouble);
  torch::Tensor dv = torch::zeros({p.batch, p.keyLength, p.kvHeads, p.vHeadDim}, torch::kDouble);
  double *dqData = dq.data_ptr<double>();
  double *dkData = dk.data_ptr<double>();
  double *dvData = dv.data_ptr<double>();
  const int64_t group = p.qHeads / p.kvHeads;
  const double scale = spec.scale;

  // One task per (batch, key/value head): it owns those rows of dK and dV,
  // and the dQ rows of its group's query heads.
  at::parallel_for(0, p.batch * p.kvHeads, 1, [&](int64_t begin, int64_t end) {
    Logits logits(spec, captures);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / p.kvHeads, hk = task % p.kvHeads;
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int64_t t = 0; t < p.queryLength; ++t) {
          const double rowLse = lseData[(b * p.qHeads + h) * p.queryLength + t];
          if (std::isinf(rowLse) && rowLse < 0)
            continue; // sees no key
          const double *qRow = qs.row(b, t, h);
          const double *doRow = dos.row(b, t, h);
          const double delta = dot(doRow, os.row(b, t, h), p.vHeadDim);
          double *dqRow = dqData + ((b * p.queryLength + t) * p.qHeads + h) * p.qkHeadDim;
          for (int64_t kv = 0; kv < p.keyLength; ++kv) {
            if (!logits.visible(b, h, t, kv))
              continue;
            const double *kRow = ks.row(b, kv, hk);
            const double *vRow = vs.row(b, kv, hk);
            double slope = 1.0;
            const double s = scale * dot(qRow, kRow, p.qkHeadDim);
            const double probability = std::exp(logits.logit(s, b, h, t, kv, &slope) - rowLse);
            const double dlogit = probability * (dot(doRow, vRow, p.vHeadDim) - delta);
            const double ds = dlogit * slope * scale;
            double *dkRow = dkData + ((b * p.keyLength + kv) * p.kvHeads + hk) * p.qkHeadDim;
            double *dvRow = dvData + ((b * p.keyLength + kv) * p.kvHeads + hk) * p.vHeadDim;
            for (int64_t d = 0; d < p.qkHeadDim; ++d) {
              dqRow[d] += ds * kRow[d];
              dkRow[d] += ds * qRow[d];
            }
            for (int64_t d = 0; d < p.vHeadDim; ++d)
              dvRow[d] += probability * doRow[d];
          }
        }
      }
    }
  });
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

} // namespace dflex::runtime::detail
