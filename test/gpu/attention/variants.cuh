// Hand-written variants standing in for generated ones: the same contract as
// kernels/attention/variant.cuh, made __host__ __device__ so the host tile-list
// builder and the float64 reference evaluate exactly the same functions.
// Captures are pointers: host copies point at host arrays, device copies at
// device arrays.
#pragma once

#include <cmath>

namespace attention_test {

using i64 = long long;

// Shared by the variants without a score modification.
struct IdentityScore {
  static constexpr bool kHasScoreMod = false;
  __host__ __device__ float score_mod(float s, i64, i64, i64, i64) const { return s; }
  __host__ __device__ float score_mod_grad(float, i64, i64, i64, i64) const { return 1.f; }
};

struct CausalVariant : IdentityScore {
  __host__ __device__ bool mask(i64, i64, i64 q, i64 kv) const { return kv <= q; }
};

// Every pair visible: all tiles full, only the sequence ends are checked.
struct DenseVariant : IdentityScore {
  __host__ __device__ bool mask(i64, i64, i64, i64) const { return true; }
};

// DFlash training mask. Queries come in blocks of kBlockSize; block i of
// batch b has anchor anchors[b * blocks + i] (-1: padding block). Keys are
// [context_len context tokens ; blocks * kBlockSize block tokens]. A query
// sees context keys strictly before its anchor and every key of its own block.
struct DFlashVariant : IdentityScore {
  const int* anchors;
  int blocks;
  int context_len;
  // A constant, as in examples/dflash.mlir: the divisions become shifts.
  static constexpr int kBlockSize = 16;
  __host__ __device__ bool mask(i64 b, i64, i64 q, i64 kv) const {
    const i64 block = q / kBlockSize;
    const int anchor = anchors[b * blocks + block];
    if (anchor < 0) return false;
    if (kv < context_len) return kv < anchor;
    return (kv - context_len) / kBlockSize == block;
  }
};

// Causal sliding window whose width depends on the head (exercises per-head
// tile lists): query q sees kv in (q - window(h), q].
struct HeadWindowVariant : IdentityScore {
  int base_window;
  int window_step;
  __host__ __device__ bool mask(i64, i64 h, i64 q, i64 kv) const {
    return kv <= q && q - kv < base_window + window_step * h;
  }
};

// Rows q % 7 == 3 see nothing (fully masked rows), keys kv % 3 == 1 are
// hidden from everyone; no causality.
struct HolesVariant : IdentityScore {
  __host__ __device__ bool mask(i64, i64, i64 q, i64 kv) const { return q % 7 != 3 && kv % 3 != 1; }
};

// Packed causal documents with the mask split into parts, as generated
// variants have it (variant.cuh): the row and column parts read document ids
// (kReadsMemory), so the kernels stage them in shared memory. Even and odd
// query heads read different layouts, ids[(b * 2 + h % 2) * length + t]: the
// tile lists are per head, and a GQA group's next head restages its parts.
struct DocumentVariant : IdentityScore {
  const int* ids;
  int length;
  struct MaskRow {
    int q;
    int doc;
    static constexpr bool kReadsMemory = true;
  };
  struct MaskColumn {
    int kv;
    int doc;
    static constexpr bool kReadsMemory = true;
  };
  __host__ __device__ int doc(i64 b, i64 h, i64 t) const { return ids[(b * 2 + h % 2) * length + t]; }
  __host__ __device__ MaskRow mask_row(i64 b, i64 h, i64 q) const { return {int(q), doc(b, h, q)}; }
  __host__ __device__ MaskColumn mask_column(i64 b, i64 h, i64 kv) const { return {int(kv), doc(b, h, kv)}; }
  __host__ __device__ bool mask_pair(const MaskRow& row, const MaskColumn& column) const {
    return row.doc == column.doc && column.kv <= row.q;
  }
  __host__ __device__ bool mask(i64 b, i64 h, i64 q, i64 kv) const {
    return mask_pair(mask_row(b, h, q), mask_column(b, h, kv));
  }
};

// Causal mask with tanh soft-capping of the scores.
struct SoftcapCausalVariant {
  static constexpr bool kHasScoreMod = true;
  float cap;
  __host__ __device__ bool mask(i64, i64, i64 q, i64 kv) const { return kv <= q; }
  __host__ __device__ float score_mod(float s, i64, i64, i64, i64) const { return cap * tanhf(s / cap); }
  __host__ __device__ float score_mod_grad(float s, i64, i64, i64, i64) const {
    const float t = tanhf(s / cap);
    return 1.f - t * t;
  }
};

// Causal mask with an ALiBi bias read from a captured per-head slope array.
struct AlibiCausalVariant {
  static constexpr bool kHasScoreMod = true;
  const float* slopes;
  __host__ __device__ bool mask(i64, i64, i64 q, i64 kv) const { return kv <= q; }
  __host__ __device__ float score_mod(float s, i64, i64 h, i64 q, i64 kv) const {
    return s - slopes[h] * static_cast<float>(q - kv);
  }
  __host__ __device__ float score_mod_grad(float, i64, i64, i64, i64) const { return 1.f; }
};

}  // namespace attention_test
