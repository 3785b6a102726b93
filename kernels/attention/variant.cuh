// The variant contract: how generated code customises the attention templates.
//
// A variant is a struct, passed by value as a kernel parameter, that holds the
// captures of a mask / score_mod (device pointers, sizes, constants) and
// provides:
//
//   static constexpr bool kHasScoreMod;
//   __device__ bool  mask(long long b, long long h, long long q, long long kv) const;
//   __device__ float score_mod(float s, long long b, long long h, long long q, long long kv) const;
//   __device__ float score_mod_grad(float s, long long b, long long h, long long q, long long kv) const;
//
// b is the batch, h the QUERY head, q and kv absolute positions. s is the
// scaled score scale * dot(q, k); score_mod returns the logit that enters the
// softmax and score_mod_grad its derivative d score_mod / d s. When
// kHasScoreMod is false the logit is s and the two functions are never called
// (they must still exist). mask is called only for tiles the tile list marks
// partial.
//
// The kernels call these functions only for in-range arguments:
// 0 <= b < batch, 0 <= h < q_heads, 0 <= q < q_len, 0 <= kv < kv_len, so a
// functor may index its captures with them without bounds checks of its own.
// Functions may be __host__ __device__ (the test harness reuses them on the
// host to build tile lists and references).
#pragma once

namespace dflex {
namespace kernels {

template <class Variant>
struct VariantCheck {
  static_assert(sizeof(Variant::kHasScoreMod) > 0 && (Variant::kHasScoreMod == true || Variant::kHasScoreMod == false),
                "a variant needs static constexpr bool kHasScoreMod");
  static constexpr bool kOk = true;
};

}  // namespace kernels
}  // namespace dflex
