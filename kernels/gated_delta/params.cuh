// Kernel parameters of the gated-delta-rule templates: one plain struct passed
// by value to every kernel (the same bytes through cudaLaunchKernel or
// cuLaunchKernel), and the workspace the launcher allocates.
//
// Layout. Sequences are packed along one token axis of T tokens: q, k are
// [T, Hk, Dk], v, o, dO [T, Hv, Dv], each token row `*_row_stride` elements
// after the previous one and heads contiguous inside a row (so [B, T, H, D]
// tensors are B sequences of T tokens packed as B*T rows). Row strides must
// be multiples of 8 and base pointers 16-byte aligned (16-byte copies).
// Gates g (fp32), beta, a, b (bf16) are [T, Hv] with their own row strides;
// A_log, dt_bias (fp32) are [Hv]. States are fp32 [N, Hv, Dk, Dv], contiguous.
// Gradients of gate inputs are fp32 [T, Hv] contiguous.
//
// Host code includes this header on its own (the runtime's launcher, after
// <cuda_runtime_api.h> for __host__ / __device__): it needs nothing from the
// device-side headers.
#pragma once

#include <cuda_bf16.h>

namespace dflex {
namespace kernels {

constexpr int kGatedDeltaChunk = 64;  // tokens per chunk (the WY / UT block)

// Buffers the launcher provides (sizes in gated_delta_workspace_bytes). The
// forward fills the first group; the backward reads it (keep it between the
// two, or run the forward again before the backward) and uses the second.
struct GatedDeltaWorkspace {
  // varlen: written by gated_delta_chunk_table_kernel from cu_seqlens.
  int* chunk_offsets;   // [N + 1]: first chunk of each sequence
  int* chunk_sequence;  // [max_chunks]: sequence of each chunk, -1 past the last
  // Forward.
  float* gate_cumsum;          // [T, Hv] cumulative log gate inside each chunk
  float* beta;                 // [T, Hv]
  __nv_bfloat16* w;            // [T, Hv, Dk]  T (beta exp(gate) k)
  __nv_bfloat16* u;            // [T, Hv, Dv]  T (beta v)
  float* key_decay;            // [T, Hv]  exp(gate_last - gate) / |k| (the norm only with q/k L2
                               // normalisation): the state kernels scale K^T's columns by it
  __nv_bfloat16* delta;        // [T, Hv, Dv]  the rule's corrected values
  __nv_bfloat16* t_inverse;    // [max_chunks, Hv, 64, 64]  (I + A)^-1
  __nv_bfloat16* chunk_states; // [max_chunks, Hv, Dk, Dv]  state at each chunk's start
  // Backward.
  __nv_bfloat16* grad_delta;        // [T, Hv, Dv]
  __nv_bfloat16* chunk_state_grads; // [max_chunks, Hv, Dk, Dv]  dL/d(state at each chunk's end)
  float* grad_q_accum;              // [T, Hk, Dk] zeroed before the backward when Hv > Hk
  float* grad_k_accum;              // [T, Hk, Dk] likewise
  float* gate_param_partials;       // [max_chunks, Hv, 2] (in-kernel gate: dA_log, d dt_bias per chunk)
};

struct GatedDeltaParams {
  int num_sequences;    // N
  int sequence_length;  // tokens per sequence without varlen
  int total_tokens;     // T
  int key_heads;        // Hk
  int value_heads;      // Hv, a multiple of Hk: value head hv reads key head hv / (Hv / Hk)
  int max_chunks;       // grid.x of the per-chunk kernels (gated_delta_max_chunks)
  float scale;
  const int* cu_seqlens;  // varlen: [N + 1] token offsets, cu_seqlens[0] = 0, cu_seqlens[N] = T

  // Forward inputs.
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  long long q_row_stride, k_row_stride, v_row_stride;
  const float* g;              // gate(scalar_log) without in_kernel_gate
  const __nv_bfloat16* beta;   // delta rule without in_kernel_gate
  long long g_row_stride, beta_row_stride;
  const __nv_bfloat16* a;      // in_kernel_gate: g = -exp(A_log) softplus(a + dt_bias)
  const __nv_bfloat16* b;      // in_kernel_gate: beta = sigmoid(b)
  long long a_row_stride, b_row_stride;
  const float* a_log;
  const float* dt_bias;
  const float* initial_state;  // initial_state

  // Forward outputs.
  __nv_bfloat16* o;
  long long o_row_stride;
  float* final_state;  // final_state

  // Backward inputs.
  const __nv_bfloat16* grad_o;
  long long grad_o_row_stride;
  const float* grad_final_state;  // final_state (zeros when the loss ignores it)

  // Backward outputs.
  __nv_bfloat16* grad_q;
  __nv_bfloat16* grad_k;
  __nv_bfloat16* grad_v;
  long long grad_q_row_stride, grad_k_row_stride, grad_v_row_stride;
  float* grad_g;              // [T, Hv]
  float* grad_beta;           // [T, Hv]
  float* grad_a;              // [T, Hv]
  float* grad_b;              // [T, Hv]
  float* grad_a_log;          // [Hv]
  float* grad_dt_bias;        // [Hv]
  float* grad_initial_state;  // [N, Hv, Dk, Dv]

  GatedDeltaWorkspace workspace;
};

// Chunks the per-chunk kernels cover: exact without varlen; with varlen an
// upper bound (every sequence may end in a partial chunk), so no host-side
// look at cu_seqlens is needed.
__host__ __device__ inline int gated_delta_max_chunks(bool varlen, int num_sequences, int sequence_length,
                                                      int total_tokens) {
  if (!varlen) return num_sequences * ((sequence_length + kGatedDeltaChunk - 1) / kGatedDeltaChunk);
  return total_tokens / kGatedDeltaChunk + num_sequences;
}

// Sizes of the workspace buffers in bytes, in GatedDeltaWorkspace's order;
// a buffer the configuration does not use has size 0.
struct GatedDeltaWorkspaceSizes {
  long long chunk_offsets, chunk_sequence, gate_cumsum, beta, w, u, key_decay, delta, t_inverse, chunk_states;
  long long grad_delta, chunk_state_grads, grad_q_accum, grad_k_accum, gate_param_partials;
};

// The sizes for the configuration's key/value dims and options, given by
// value (host code that does not instantiate GatedDeltaConfig).
__host__ __device__ inline GatedDeltaWorkspaceSizes gated_delta_workspace_sizes(int key_dim, int value_dim, bool delta_rule,
                                                                               bool in_kernel_gate, bool varlen,
                                                                               int num_sequences, int total_tokens,
                                                                               int key_heads, int value_heads,
                                                                               int max_chunks) {
  const long long t = total_tokens, hv = value_heads, chunks = max_chunks, chunk = kGatedDeltaChunk;
  const long long state = static_cast<long long>(key_dim) * value_dim;
  const bool grouped = value_heads != key_heads;
  GatedDeltaWorkspaceSizes s;
  s.chunk_offsets = varlen ? (num_sequences + 1) * 4LL : 0;
  s.chunk_sequence = varlen ? chunks * 4 : 0;
  s.gate_cumsum = t * hv * 4;
  s.beta = delta_rule ? t * hv * 4 : 0;
  s.w = delta_rule ? t * hv * key_dim * 2 : 0;
  s.u = delta_rule ? t * hv * value_dim * 2 : 0;
  s.key_decay = t * hv * 4;
  s.delta = delta_rule ? t * hv * value_dim * 2 : 0;
  s.t_inverse = delta_rule ? chunks * hv * chunk * chunk * 2 : 0;
  s.chunk_states = chunks * hv * state * 2;
  s.grad_delta = t * hv * value_dim * 2;
  s.chunk_state_grads = chunks * hv * state * 2;
  s.grad_q_accum = grouped ? t * key_heads * key_dim * 4 : 0;
  s.grad_k_accum = s.grad_q_accum;
  s.gate_param_partials = in_kernel_gate ? chunks * hv * 2 * 4 : 0;
  return s;
}

template <class Config>
__host__ __device__ inline GatedDeltaWorkspaceSizes gated_delta_workspace_sizes(int num_sequences, int total_tokens,
                                                                               int key_heads, int value_heads,
                                                                               int max_chunks) {
  return gated_delta_workspace_sizes(Config::kKeyDim, Config::kValueDim, Config::kDeltaRule, Config::kInKernelGate,
                                     Config::kVarlen, num_sequences, total_tokens, key_heads, value_heads, max_chunks);
}

}  // namespace kernels
}  // namespace dflex
