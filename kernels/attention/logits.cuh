// From raw dot products to the logits the softmax sees, through the variant:
// logit = score_mod(scale * q.k) (or scale * q.k), kept in log2 units
// (multiplied by log2(e)) so the kernels exponentiate with exp2; pairs the
// mask hides or that lie past the sequence ends become -inf.
#pragma once

#include "../common/device.cuh"
#include "variant.cuh"

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
  // Branch-free: the mask always runs, on the pair clamped into range (the
  // variant is never called with an out-of-range index), and its answer
  // counts only for in-range pairs of partial tiles.
  __device__ __forceinline__ bool visible(bool partial, int q, int kv, int q_len, int kv_len) const {
    const bool in_range = (q < q_len) & (kv < kv_len);
    return in_range & (!partial | variant.mask(batch, head, min(q, q_len - 1), min(kv, kv_len - 1)));
  }

  // The visibility of a thread's score elements as bits, bit 4 * j + i for
  // element (j, i) (the pairs of apply below). It depends on positions only,
  // so a kernel can work it out before the scores exist, while fewer
  // registers are live. The mask's row parts (the thread's two rows) are
  // worked out once, its column parts once per key column, and only its pair
  // part per element (the contract in variant.cuh). The loop over key blocks
  // stays rolled: the mask's body then appears once per row pair instead of
  // once per element, which keeps NVRTC's time on the kernels down.
  template <int kBlocks>
  __device__ __forceinline__ unsigned long long visibility(bool partial, int q0, int kv0, int q_len,
                                                           int kv_len) const {
    static_assert(4 * kBlocks <= 64, "one bit per element of a 64-bit word");
    const MaskParts<Variant> parts{variant, batch, head};
    const typename MaskParts<Variant>::Row rows[2] = {parts.row(min(q0, q_len - 1)),
                                                      parts.row(min(q0 + 8, q_len - 1))};
    unsigned long long bits = 0;
#pragma unroll 1
    for (int j = 0; j < kBlocks; ++j) {
      const int kv = kv0 + 8 * j;
      const typename MaskParts<Variant>::Column columns[2] = {parts.column(min(kv, kv_len - 1)),
                                                              parts.column(min(kv + 1, kv_len - 1))};
      unsigned block_bits = 0;  // one 64-bit shift per key block, not per element
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool in_range = (q0 + 8 * (i >> 1) < q_len) & (kv + (i & 1) < kv_len);
        const bool shown = in_range & (!partial | parts.pair(rows[i >> 1], columns[i & 1]));
        block_bits |= static_cast<unsigned>(shown) << i;
      }
      bits |= static_cast<unsigned long long>(block_bits) << (4 * j);
    }
    return bits;
  }

  // apply() with the visibility worked out beforehand.
  template <int kBlocks>
  __device__ __forceinline__ void apply_visible(float (&scores)[kBlocks][4], unsigned long long bits, int q0,
                                                int kv0) const {
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool shown = (bits >> (4 * j + i)) & 1;
        scores[j][i] = shown ? logit(scores[j][i], q0 + 8 * (i >> 1), kv0 + 8 * j + (i & 1)) : negative_infinity();
      }
    }
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
      apply_visible(scores, visibility<kBlocks>(partial, q0, kv0, q_len, kv_len), q0, kv0);
    }
  }
};

}  // namespace kernels
}  // namespace dflex
