// Kernel parameters of the attention templates. Plain structs passed by value
// (the same bytes through cudaLaunchKernel or cuLaunchKernel).
//
// Tensors are 16-bit (bf16 or fp16, the config's Element) with the head_dim
// axis contiguous and the other three axes strided, so [B, T, H, D] and
// [B, H, T, D] views both work. Strides are in elements and must be multiples
// of 8, base pointers 16-byte aligned (16-byte copies).
#pragma once

#include "tile_list.cuh"

namespace dflex {
namespace kernels {

struct TensorStrides {
  long long batch;
  long long row;   // one position along the sequence
  long long head;
};

// Row `row` of (batch, head) of a [B, T, H, D] / [B, H, T, D] tensor.
template <class Element>
__device__ __forceinline__ Element* tensor_row(void* tensor, const TensorStrides& strides, int batch, int head,
                                               int row) {
  return static_cast<Element*>(tensor) + batch * strides.batch + head * strides.head + row * strides.row;
}
template <class Element>
__device__ __forceinline__ const Element* tensor_row(const void* tensor, const TensorStrides& strides, int batch,
                                                     int head, int row) {
  return static_cast<const Element*>(tensor) + batch * strides.batch + head * strides.head + row * strides.row;
}

struct AttentionShape {
  int batch;
  int q_heads;
  int kv_heads;  // divides q_heads; query head h reads key/value head h / (q_heads / kv_heads)
  int q_len;
  int kv_len;
  float scale;   // scores = scale * dot(q, k), before score_mod; positive (the forwards take a row's largest dot as its largest logit)
};

struct AttentionForwardParams {
  const void* q;  // [B, q_len, q_heads, D] (strided)
  const void* k;  // [B, kv_len, kv_heads, D]
  const void* v;  // [B, kv_len, kv_heads, D]
  void* o;        // [B, q_len, q_heads, D]
  float* lse;     // [B, q_heads, q_len] contiguous, natural log; -inf for a row that sees no key
  TensorStrides q_strides, k_strides, v_strides, o_strides;
  AttentionShape shape;
  TileList tiles;  // forward list: (batch, query head, query tile) -> key tiles
};

struct AttentionBackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;       // forward output
  const void* grad_o;  // [B, q_len, q_heads, D]
  const float* lse;    // forward LSE, [B, q_heads, q_len]
  void* grad_q;        // [B, q_len, q_heads, D]
  void* grad_k;        // [B, kv_len, kv_heads, D]
  void* grad_v;        // [B, kv_len, kv_heads, D]
  // Workspace, written by the preprocess kernel before the main kernel runs.
  float* grad_q_accum;  // [B, q_heads, q_len, D] contiguous fp32, unscaled dQ
  float* delta;         // [B, q_heads, q_len] contiguous fp32, rowsum(dO * O)
  TensorStrides q_strides, k_strides, v_strides, o_strides, grad_o_strides;
  TensorStrides grad_q_strides, grad_k_strides, grad_v_strides;
  AttentionShape shape;
  TileList tiles;  // backward list: (batch, query head, key tile) -> query tiles
};

}  // namespace kernels
}  // namespace dflex
