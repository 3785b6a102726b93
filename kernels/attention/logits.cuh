// From raw dot products to the logits the softmax sees, through the variant:
// logit = score_mod(scale * q.k) (or scale * q.k), kept in log2 units
// (multiplied by log2(e)) so the kernels exponentiate with exp2; pairs the
// mask hides or that lie past the sequence ends become -inf.
#pragma once

#include "../common/device.cuh"

namespace dflex {
namespace kernels {

template <class Variant>
struct LogitMap {
  const Variant& variant;
  int batch;
  int head;
  float scale;
  float scale_log2;

  __device__ __forceinline__ LogitMap(const Variant& variant_, int batch_, int head_, float scale_)
      : variant(variant_), batch(batch_), head(head_), scale(scale_), scale_log2(scale_ * kLog2e) {}

  // Logit of an in-range pair, in log2 units.
  __device__ __forceinline__ float logit(float dot, int q, int kv) const {
    if constexpr (Variant::kHasScoreMod) {
      return variant.score_mod(dot * scale, batch, head, q, kv) * kLog2e;
    } else {
      return dot * scale_log2;
    }
  }

  // d logit / d dot, in natural units (the scale included).
  __device__ __forceinline__ float logit_grad(float dot, int q, int kv) const {
    if constexpr (Variant::kHasScoreMod) {
      return variant.score_mod_grad(dot * scale, batch, head, q, kv) * scale;
    } else {
      return scale;
    }
  }

  // Whether the pair takes part: in range, and (in a partial tile) unmasked.
  // The variant is never called for an out-of-range pair.
  __device__ __forceinline__ bool visible(bool partial, int q, int kv, int q_len, int kv_len) const {
    return q < q_len && kv < kv_len && (!partial || variant.mask(batch, head, q, kv));
  }

  // Maps a warp's score accumulators in place. Element (j, i) of the thread
  // is the pair (q0 + 8 * (i / 2), kv0 + 8 * j + i % 2). `checked` selects the
  // per-pair visibility test (partial tiles and tiles crossing a sequence end).
  template <int kBlocks>
  __device__ __forceinline__ void apply(float (&scores)[kBlocks][4], bool checked, bool partial, int q0, int kv0,
                                        int q_len, int kv_len) const {
    if (!checked) {
#pragma unroll
      for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) scores[j][i] = logit(scores[j][i], q0 + 8 * (i >> 1), kv0 + 8 * j + (i & 1));
      }
    } else {
#pragma unroll
      for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int q = q0 + 8 * (i >> 1);
          const int kv = kv0 + 8 * j + (i & 1);
          scores[j][i] = visible(partial, q, kv, q_len, kv_len) ? logit(scores[j][i], q, kv) : negative_infinity();
        }
      }
    }
  }
};

}  // namespace kernels
}  // namespace dflex
