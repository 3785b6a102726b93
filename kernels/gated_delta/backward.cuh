// Backward of the chunked gated delta rule. It reads the forward's workspace
// (gates, key_decay, W, delta, T, chunk states) and runs, in order:
//
//   prepare   grid (max_chunks, Hv), kThreads        per chunk, in parallel:
//             d delta partial = scale lower(Q K^T o Gamma)^T dO  -> grad_delta
//             M = scale Q^T E dO  (Dk x Dv)                      -> chunk_state_grads
//   state     grid (Dv / kValueBlock, Hv, N), kStateThreads   sequential, last chunk first, dS = dL/d(state):
//             dH of each chunk (= dS at its end)                 -> chunk_state_grads (over M)
//             d delta = partial + (D K) dS                        -> grad_delta (grad_v without the rule)
//             (D K dS as the raw keys' product scaled by key_decay = D / |k| per row)
//             dS = exp(c_last) dS + M - W^T d delta; d initial state
//   chunk     grid (max_chunks, Hv), kChunkBackwardThreads   per chunk, in parallel: dq, dk, dv,
//             dg, dbeta (or da, db and per-chunk dA_log, d dt_bias partials)
//   finalize  grid ceil(T Hk / 8), 256 threads        only when Hv > Hk: dq, dk summed over the group
//             (fp32 accumulators) through the L2 normalisation to bf16
//   gate_params  grid Hv, 256 threads                 only with the in-kernel gate: dA_log, d dt_bias
//
// The chunk kernel's algebra (docs/gated-delta.md): with dX = T^T d delta,
//   dV = B dX, dA = -strict_lower(dX delta^T), dP = scale lower(dO delta^T), Z = -E dX S0^T,
//   dQ = scale E dO S0^T + (dP o Gamma) K,
//   dK = (dP o Gamma)^T Q + D delta dH^T + B Z + G K + G^T K,  G = dA o B Gamma,
//   dbeta_i = v_i.dX_i + k_i.Z_i + sum_j dA_ij (K K^T o Gamma)_ij,
//   dc_i = q_i.dQ_i - sum_i' dP_i'i P_i'i - r_i + beta_i k_i.Z_i + sum_j dA_ij A_ij - sum_i' dA_i'i A_i'i,
//   r_j = D_j k_j.(dH delta_j),  dc_last += sum_j r_j + exp(c_last) <S0, dH>,
//   dg = reverse cumulative sum of dc inside the chunk.
#pragma once

#include "common.cuh"

namespace dflex {
namespace kernels {

template <class Config>
__global__ void __launch_bounds__(Config::kThreads) gated_delta_backward_prepare_kernel(const GatedDeltaParams p) {
  using Element = typename Config::Element;
  using KeyTile = typename Config::KeyTile;
  using ValueTile = typename Config::ValueTile;
  using ChunkTile = typename Config::ChunkTile;
  using HalfStateTile = typename Config::HalfStateTile;
  using Layout = typename Config::BackwardPrepare;
  constexpr int kDk = Config::kKeyDim, kDv = Config::kValueDim, kThreads = Config::kThreads;
  constexpr int kAtoms = Config::kStateAtoms, kRowsPerWarp = Config::kStateRowsPerWarp;

  extern __shared__ __align__(128) unsigned char shared[];
  Element* queries = reinterpret_cast<Element*>(shared + Layout::kQueries);
  Element* keys = reinterpret_cast<Element*>(shared + Layout::kKeys);
  Element* grad_o = reinterpret_cast<Element*>(shared + Layout::kGradO);
  Element* scores = reinterpret_cast<Element*>(shared + Layout::kScores);
  Element* staging = reinterpret_cast<Element*>(shared + Layout::kStaging);
  float* gates = reinterpret_cast<float*>(shared + Layout::kGates);

  const ChunkCoordinates chunk = locate_chunk<Config>(p, blockIdx.x);
  if (chunk.sequence < 0) return;
  const int hv = blockIdx.y;
  const int hk = hv / (p.value_heads / p.key_heads);
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  const long long start = chunk.start;

  async_load_tile<KeyTile, kThreads>(queries, p.q + start * p.q_row_stride + hk * kDk, p.q_row_stride, chunk.length,
                                     thread);
  async_load_tile<KeyTile, kThreads>(keys, p.k + start * p.k_row_stride + hk * kDk, p.k_row_stride, chunk.length,
                                     thread);
  async_load_tile<ValueTile, kThreads>(grad_o, p.grad_o + start * p.grad_o_row_stride + hv * kDv,
                                       p.grad_o_row_stride, chunk.length, thread);
  cp_async_commit();
  if (thread < 64) gates[thread] = p.workspace.gate_cumsum[(start + min(thread, chunk.length - 1)) * hv_count + hv];
  cp_async_wait<0>();
  if constexpr (Config::kQkL2Norm) {
    normalise_rows<KeyTile, kThreads>(queries, nullptr, thread);
    normalise_rows<KeyTile, kThreads>(keys, nullptr, thread);
  } else {
    __syncthreads();
  }

  // P = scale lower(Q K^T o Gamma); then the warp's own query rows become scale exp(c) q.
  {
    store_chunk_scores<Config>(scores, queries, keys, gates, p.scale, warp, lane);
    for (int c = lane; c < 16 * KeyTile::kChunksPerRow; c += 32) {
      const int row = 16 * warp + c / KeyTile::kChunksPerRow, col = (c % KeyTile::kChunksPerRow) * 8;
      uint4* address = reinterpret_cast<uint4*>(queries + KeyTile::offset(row, col));
      *address = scale_chunk(*address, p.scale * fast_exp(gates[row]));
    }
  }
  __syncthreads();

  // d delta partial = P^T dO (rows = key positions).
  {
    float acc[kDv / 8][4];
    zero(acc);
    warp_mma<Element, kDv / 8, 4, true, true, ChunkTile, ValueTile>(acc, scores, 16 * warp, 0, grad_o, 0, 0, lane);
    store_accumulator<ValueTile>(staging, acc, 1.f, 1.f, 16 * warp, 0, lane);
  }
  __syncthreads();
  store_tile<ValueTile, kThreads>(p.workspace.grad_delta + start * hv_count * kDv + hv * kDv,
                                  static_cast<long long>(hv_count) * kDv, staging, chunk.length, thread);

  // M = (scale E Q)^T dO, 64 value columns at a time.
  Element* chunk_grad = p.workspace.chunk_state_grads + (static_cast<long long>(chunk.index) * hv_count + hv) * kDk * kDv;
#pragma unroll 1
  for (int half = 0; half < kDv / 64; ++half) {
    float acc[kAtoms][8][4];
#pragma unroll
    for (int m = 0; m < kAtoms; ++m) {
      zero(acc[m]);
      warp_mma<Element, 8, 4, true, true, KeyTile, ValueTile>(acc[m], queries, warp * kRowsPerWarp + 16 * m, 0,
                                                              grad_o, 64 * half, 0, lane);
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < kAtoms; ++m)
      store_accumulator<HalfStateTile>(staging, acc[m], 1.f, 1.f, warp * kRowsPerWarp + 16 * m, 0, lane);
    __syncthreads();
    store_tile<HalfStateTile, kThreads>(chunk_grad + 64 * half, kDv, staging, kDk, thread);
  }
}

template <class Config>
__global__ void __launch_bounds__(Config::kStateThreads) gated_delta_backward_state_kernel(const GatedDeltaParams p) {
  using Element = typename Config::Element;
  using KeyTile = typename Config::KeyTile;
  using ValueBlockTile = typename Config::ValueBlockTile;
  using StateBlockTile = typename Config::StateBlockTile;
  using Layout = typename Config::BackwardState;
  constexpr int kDk = Config::kKeyDim, kDv = Config::kValueDim, kThreads = Config::kStateThreads;
  constexpr int kBlock = Config::kValueBlock, kSliceColumns = kBlock / Config::kStateSlices;
  constexpr int kMOffset = 0;
  constexpr int kKeysOffset = StateBlockTile::kBytes;
  constexpr int kGradDeltaOffset = kKeysOffset + KeyTile::kBytes;
  constexpr int kWOffset = kGradDeltaOffset + ValueBlockTile::kBytes;

  extern __shared__ __align__(128) unsigned char shared[];
  auto stage = [&](int index, int offset) {
    return reinterpret_cast<Element*>(shared + Layout::kStages + (index & 1) * Layout::kStageBytes + offset);
  };
  Element* state_grad_tile = reinterpret_cast<Element*>(shared + Layout::kStateGrad);

  const int column0 = blockIdx.x * kBlock, hv = blockIdx.y, sequence = blockIdx.z;
  const int hk = hv / (p.value_heads / p.key_heads);
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  const SequenceCoordinates seq = locate_sequence<Config>(p, sequence);
  const int chunks = seq.chunks();
  const long long key_rows = static_cast<long long>(hv_count) * kDk;
  const long long value_rows = static_cast<long long>(hv_count) * kDv;
  const long long state_base = (static_cast<long long>(sequence) * hv_count + hv) * kDk * kDv + column0;
  auto chunk_grad = [&](int i) {
    return p.workspace.chunk_state_grads + (static_cast<long long>(seq.first_chunk + i) * hv_count + hv) * kDk * kDv +
           column0;
  };

  // The warp's rows and columns of the 64-row product d delta = partial + (D K) dS.
  const int delta_row0 = 16 * (warp & 3), delta_col0 = kSliceColumns * (warp >> 2);

  // dS, fp32 in registers: warp w owns rows 16w..16w+15.
  float grad_state[kBlock / 8][4];
#pragma unroll
  for (int j = 0; j < kBlock / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + fragment_row(lane, e), col = fragment_col(lane, j, e);
      grad_state[j][e] = Config::kFinalState ? p.grad_final_state[state_base + row * kDv + col] : 0.f;
    }

  // Chunk i's keys, d delta partial block, M block and W.
  const Element* key_rows_base = p.k + hk * kDk;
  const Element* grad_delta_rows = p.workspace.grad_delta + hv * kDv + column0;
  const Element* w_rows = p.workspace.w + hv * kDk;

  // Stage i of chunk i, a step ahead, in two copy groups by when the step
  // needs them: first the keys and the d delta partial, then the M
  // block and W (for the dS update at the end of the step).
  auto issue = [&](int i) {
    const long long start = seq.chunk_start(i);
    const int rows = seq.chunk_rows(i);
    async_load_tile<KeyTile, kThreads>(stage(i, kKeysOffset), key_rows_base + start * p.k_row_stride,
                                       p.k_row_stride, rows, thread);
    async_load_tile<ValueBlockTile, kThreads>(stage(i, kGradDeltaOffset), grad_delta_rows + start * value_rows,
                                              value_rows, rows, thread);
    cp_async_commit();
    async_load_tile<StateBlockTile, kThreads>(stage(i, kMOffset), chunk_grad(i), kDv, kDk, thread);
    if constexpr (Config::kDeltaRule)
      async_load_tile<KeyTile, kThreads>(stage(i, kWOffset), w_rows + start * key_rows, key_rows, rows, thread);
    cp_async_commit();
  };

  StateStepScalars next;
  if (chunks > 0) {
    issue(chunks - 1);
    next = load_state_step_scalars(p, seq, chunks - 1, hv, delta_row0, lane);
  }
  for (int i = chunks - 1; i >= 0; --i) {
    const long long start = seq.chunk_start(i);
    const int rows = seq.chunk_rows(i);
    const StateStepScalars now = next;
    if (i > 0) {
      issue(i - 1);
      next = load_state_step_scalars(p, seq, i - 1, hv, delta_row0, lane);
      cp_async_wait<3>();  // the first group of chunk i
    } else {
      cp_async_wait<1>();
    }
    store_accumulator<StateBlockTile>(state_grad_tile, grad_state, 1.f, 1.f, 16 * warp, 0, lane);
    __syncthreads();

    // d delta = partial + (D K) dS, written over the partial in shared memory.
    Element* grad_delta = stage(i, kGradDeltaOffset);
    {
      float acc[kSliceColumns / 8][4];
      zero(acc);
      warp_mma<Element, kSliceColumns / 8, kDk / 16, false, true, KeyTile, StateBlockTile>(
          acc, stage(i, kKeysOffset), delta_row0, 0, state_grad_tile, delta_col0, 0, lane);
#pragma unroll
      for (int j = 0; j < kSliceColumns / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = delta_row0 + fragment_row(lane, 2 * half), col = delta_col0 + fragment_col(lane, j, 0);
          const float2 partial = load_pair<ValueBlockTile>(grad_delta, row, col);
          store_pair<ValueBlockTile>(grad_delta, row, col, partial.x + now.key_decay[half] * acc[j][2 * half],
                                     partial.y + now.key_decay[half] * acc[j][2 * half + 1]);
        }
    }
    if (i > 0) {
      cp_async_wait<2>();  // the second group of chunk i
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    // dH of chunk i over its M block, which is in shared memory now.
    store_tile<StateBlockTile, kThreads>(chunk_grad(i), kDv, state_grad_tile, kDk, thread);
    if constexpr (Config::kDeltaRule) {
      store_tile<ValueBlockTile, kThreads>(p.workspace.grad_delta + start * value_rows + hv * kDv + column0,
                                           value_rows, grad_delta, rows, thread);
    } else {
      store_tile<ValueBlockTile, kThreads>(p.grad_v + start * p.grad_v_row_stride + hv * kDv + column0,
                                           p.grad_v_row_stride, grad_delta, rows, thread);
    }

    // dS = exp(c_last) dS + M - W^T d delta
    const float decay = fast_exp(now.gate_last);
    const Element* m_block = stage(i, kMOffset);
#pragma unroll
    for (int j = 0; j < kBlock / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = 16 * warp + fragment_row(lane, 2 * half), col = fragment_col(lane, j, 0);
        const float2 add = load_pair<StateBlockTile>(m_block, row, col);
        grad_state[j][2 * half] = decay * grad_state[j][2 * half] + add.x;
        grad_state[j][2 * half + 1] = decay * grad_state[j][2 * half + 1] + add.y;
      }
    if constexpr (Config::kDeltaRule) {
      float acc[kBlock / 8][4];
      zero(acc);
      warp_mma<Element, kBlock / 8, 4, true, true, KeyTile, ValueBlockTile>(acc, stage(i, kWOffset), 16 * warp, 0,
                                                                           grad_delta, 0, 0, lane);
#pragma unroll
      for (int j = 0; j < kBlock / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) grad_state[j][e] -= acc[j][e];
    }
    __syncthreads();
  }

  if constexpr (Config::kInitialState) {
#pragma unroll
    for (int j = 0; j < kBlock / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = 16 * warp + fragment_row(lane, 2 * half), col = fragment_col(lane, j, 0);
        *reinterpret_cast<float2*>(p.grad_initial_state + state_base + row * kDv + col) =
            make_float2(grad_state[j][2 * half], grad_state[j][2 * half + 1]);
      }
  }
}

// Column sums of a warp's 16 x 8*kBlocksN fp32 block (value (j, c) = column
// 8j + 2t + c, summed over the 16 rows) written to columns[col0 + column] by
// lanes 0..3.
template <int kBlocksN>
__device__ __forceinline__ void store_column_sums(float (&sums)[kBlocksN][2], float* columns, int col0, int lane) {
#pragma unroll
  for (int j = 0; j < kBlocksN; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float s = sums[j][c];
      s += __shfl_xor_sync(0xffffffffu, s, 4);
      s += __shfl_xor_sync(0xffffffffu, s, 8);
      s += __shfl_xor_sync(0xffffffffu, s, 16);
      if (lane < 4) columns[col0 + 8 * j + 2 * lane + c] = s;
    }
}

template <class Config>
__global__ void __launch_bounds__(Config::kChunkBackwardThreads)
    gated_delta_backward_chunk_kernel(const GatedDeltaParams p) {
  using Element = typename Config::Element;
  using KeyTile = typename Config::KeyTile;
  using ChunkTile = typename Config::ChunkTile;
  using ValueBlockTile = typename Config::ValueBlockTile;
  using StateBlockTile = typename Config::StateBlockTile;
  using Layout = typename Config::BackwardChunk;
  constexpr int kDk = Config::kKeyDim, kDv = Config::kValueDim, kThreads = Config::kChunkBackwardThreads;
  constexpr int kBlock = Config::kValueBlock;
  // Warp w owns rows 16 (w % 4).. of every 64-row product and column slice
  // w / 4 of its columns: kSlices slices of the key columns, of the chunk's
  // 64 columns, and (dX only, in 16-column slices) of the value block.
  constexpr int kSlices = Config::kChunkBackwardSlices;
  constexpr int kKeyBlocks = kDk / kSlices / 8;  // 8-column blocks of a warp's key-column slice
  constexpr int kChunkBlocks = 64 / kSlices / 8;  // 8-column blocks of a warp's chunk-column slice
  constexpr int kGradXSlices = kBlock / 16;        // warps of a row block that form dX
  static_assert(kSlices * 128 == kThreads && kKeyBlocks % 2 == 0 && kChunkBlocks % 2 == 0 && kGradXSlices <= kSlices,
                "backward chunk: warps must split the key and chunk columns into even 8-column blocks");
  constexpr bool kDelta = Config::kDeltaRule;

  extern __shared__ __align__(128) unsigned char shared[];
  auto stage = [&](int index, int offset) {
    return reinterpret_cast<Element*>(shared + Layout::kStages + (index & 1) * Layout::kStageBytes + offset);
  };
  Element* t_tile = reinterpret_cast<Element*>(shared + Layout::kTInverse);
  Element* grad_x_block = reinterpret_cast<Element*>(shared + Layout::kGradX);
  Element* decayed_grad_x_block = reinterpret_cast<Element*>(shared + Layout::kDecayedGradX);
  float* gates = reinterpret_cast<float*>(shared + Layout::kScalars);
  float* betas = gates + 64;
  float* q_inverse = gates + 128;
  float* k_inverse = gates + 192;
  float* grad_gate_rows = gates + 256;  // dc before the reverse scan

  const int hv = blockIdx.y;
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  const ChunkCoordinates chunk = locate_chunk<Config>(p, blockIdx.x);
  if (chunk.sequence < 0) {
    if constexpr (Config::kInKernelGate) {
      if (thread < 2) p.workspace.gate_param_partials[(static_cast<long long>(blockIdx.x) * hv_count + hv) * 2 + thread] = 0.f;
    }
    return;
  }
  const int hk = hv / (p.value_heads / p.key_heads);
  const long long start = chunk.start;
  const int length = chunk.length;
  const int row0 = 16 * (warp & 3);
  const int slice = warp >> 2;
  const int key_col0 = slice * kKeyBlocks * 8;
  const int chunk_col0 = slice * kChunkBlocks * 8;
  // Per-row sums, each [kSlices][64]: one partial per warp column slice. Shared
  // float atomics would be compare-and-swap loops, so every warp writes its own.
  float* row_partials = grad_gate_rows + 64;
  enum RowSum { kGateRow, kBetaRow, kRRow, kQDotRow, kKDotRow };
  auto row_partial = [&](RowSum sum, int row) -> float& { return row_partials[(sum * kSlices + slice) * 64 + row]; };
  auto row_total = [&](RowSum sum, int row) {
    float total = 0.f;
#pragma unroll
    for (int s = 0; s < kSlices; ++s) total += row_partials[(sum * kSlices + s) * 64 + row];
    return total;
  };
  float* gate_columns = row_partials + Layout::kRowSums * kSlices * 64;  // [4 row blocks][64]
  float* state_dots = gate_columns + 4 * 64;                             // [warps]
  float* totals = state_dots + kThreads / 32;  // [0] scan scratch, [1..2] sum r per warp, [3] dA_log, [4] d dt_bias
  const long long value_rows = static_cast<long long>(hv_count) * kDv;
  const long long chunk_head = static_cast<long long>(chunk.index) * hv_count + hv;
  const long long state_offset = chunk_head * kDk * kDv;

  constexpr int kValueBlocks = kDv / kBlock;
  // Value block b into stage b; after the last block, q and k into the free stage.
  auto issue = [&](int b) {
    if (b == kValueBlocks) {
      async_load_tile<KeyTile, kThreads>(stage(b, 0), p.q + start * p.q_row_stride + hk * kDk, p.q_row_stride, length,
                                         thread);
      async_load_tile<KeyTile, kThreads>(stage(b, KeyTile::kBytes), p.k + start * p.k_row_stride + hk * kDk,
                                         p.k_row_stride, length, thread);
    } else {
      const int column0 = b * kBlock;
      async_load_tile<ValueBlockTile, kThreads>(stage(b, Layout::kGradOOffset),
                                                p.grad_o + start * p.grad_o_row_stride + hv * kDv + column0,
                                                p.grad_o_row_stride, length, thread);
      async_load_tile<StateBlockTile, kThreads>(stage(b, Layout::kStateOffset),
                                                p.workspace.chunk_states + state_offset + column0, kDv, kDk, thread);
      async_load_tile<StateBlockTile, kThreads>(stage(b, Layout::kStateGradOffset),
                                                p.workspace.chunk_state_grads + state_offset + column0, kDv, kDk,
                                                thread);
      if constexpr (kDelta) {
        async_load_tile<ValueBlockTile, kThreads>(stage(b, Layout::kDeltaOffset),
                                                  p.workspace.delta + start * value_rows + hv * kDv + column0,
                                                  value_rows, length, thread);
        async_load_tile<ValueBlockTile, kThreads>(stage(b, Layout::kGradDeltaOffset),
                                                  p.workspace.grad_delta + start * value_rows + hv * kDv + column0,
                                                  value_rows, length, thread);
        async_load_tile<ValueBlockTile, kThreads>(stage(b, Layout::kValuesOffset),
                                                  p.v + start * p.v_row_stride + hv * kDv + column0, p.v_row_stride,
                                                  length, thread);
      } else {
        async_load_tile<ValueBlockTile, kThreads>(stage(b, Layout::kDeltaOffset),
                                                  p.v + start * p.v_row_stride + hv * kDv + column0, p.v_row_stride,
                                                  length, thread);
      }
    }
    cp_async_commit();
  };

  if constexpr (kDelta)
    async_load_tile<ChunkTile, kThreads>(t_tile, p.workspace.t_inverse + chunk_head * 64 * 64, 64, 64, thread);
  issue(0);
  if (thread < 64) {
    const long long index = (start + min(thread, length - 1)) * hv_count + hv;
    gates[thread] = p.workspace.gate_cumsum[index];
    betas[thread] = kDelta && thread < length ? p.workspace.beta[index] : 0.f;
  }
  if (thread < 8) totals[thread] = 0.f;

  float grad_q[kKeyBlocks][4], grad_k[kKeyBlocks][4], z[kKeyBlocks][4], grad_a[kChunkBlocks][4],
      grad_p[kChunkBlocks][4];
  zero(grad_q);
  zero(grad_k);
  zero(z);
  zero(grad_a);
  zero(grad_p);
  float v_dot_dx[2] = {0.f, 0.f};
  float state_dot = 0.f;

#pragma unroll 1
  for (int block = 0; block < kValueBlocks; ++block) {
    const int column0 = block * kBlock;
    issue(block + 1);
    cp_async_wait<1>();
    __syncthreads();
    const Element* grad_o_block = stage(block, Layout::kGradOOffset);
    const Element* state_block = stage(block, Layout::kStateOffset);
    const Element* state_grad_block = stage(block, Layout::kStateGradOffset);
    const Element* delta_block = stage(block, Layout::kDeltaOffset);
    const Element* grad_delta_block = stage(block, Layout::kGradDeltaOffset);
    const Element* value_block = stage(block, Layout::kValuesOffset);

    if constexpr (kDelta) {
      // dX = T^T d delta (the warp's 16 rows x 16 of the block's columns), dV = B dX.
      if (slice < kGradXSlices) {
        float x[2][4];
        zero(x);
        warp_mma<Element, 2, 4, true, true, ChunkTile, ValueBlockTile>(x, t_tile, row0, 0, grad_delta_block,
                                                                       16 * slice, 0, lane);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = row0 + fragment_row(lane, 2 * half), col = 16 * slice + fragment_col(lane, j, 0);
            const float dx0 = x[j][2 * half], dx1 = x[j][2 * half + 1];
            const float2 v = load_pair<ValueBlockTile>(value_block, row, col);
            v_dot_dx[half] += v.x * dx0 + v.y * dx1;
            if (row < length)
              store_global_pair(p.grad_v + (start + row) * p.grad_v_row_stride + hv * kDv + column0 + col,
                                betas[row] * dx0, betas[row] * dx1);
            store_pair<ValueBlockTile>(grad_x_block, row, col, dx0, dx1);
            const float decay = fast_exp(gates[row]);
            store_pair<ValueBlockTile>(decayed_grad_x_block, row, col, decay * dx0, decay * dx1);
          }
      }
      __syncthreads();
      warp_mma<Element, kChunkBlocks, kBlock / 16, false, false, ValueBlockTile, ValueBlockTile>(
          grad_a, grad_x_block, row0, 0, delta_block, chunk_col0, 0, lane);
      warp_mma<Element, kKeyBlocks, kBlock / 16, false, false, ValueBlockTile, StateBlockTile>(
          z, decayed_grad_x_block, row0, 0, state_block, key_col0, 0, lane);
    }
    warp_mma<Element, kChunkBlocks, kBlock / 16, false, false, ValueBlockTile, ValueBlockTile>(
        grad_p, grad_o_block, row0, 0, delta_block, chunk_col0, 0, lane);
    warp_mma<Element, kKeyBlocks, kBlock / 16, false, false, ValueBlockTile, StateBlockTile>(
        grad_q, grad_o_block, row0, 0, state_block, key_col0, 0, lane);
    warp_mma<Element, kKeyBlocks, kBlock / 16, false, false, ValueBlockTile, StateBlockTile>(
        grad_k, delta_block, row0, 0, state_grad_block, key_col0, 0, lane);
    for (int c = thread; c < kDk * StateBlockTile::kChunksPerRow; c += kThreads) {
      const int row = c / StateBlockTile::kChunksPerRow, col = (c % StateBlockTile::kChunksPerRow) * 8;
      const uint4 s_raw = *reinterpret_cast<const uint4*>(state_block + StateBlockTile::offset(row, col));
      const uint4 d_raw = *reinterpret_cast<const uint4*>(state_grad_block + StateBlockTile::offset(row, col));
      const __nv_bfloat162* s_pairs = reinterpret_cast<const __nv_bfloat162*>(&s_raw);
      const __nv_bfloat162* d_pairs = reinterpret_cast<const __nv_bfloat162*>(&d_raw);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 s = __bfloat1622float2(s_pairs[i]), d = __bfloat1622float2(d_pairs[i]);
        state_dot += s.x * d.x + s.y * d.y;
      }
    }
    __syncthreads();
  }

  // q and k (in the stage after the last block); dP o Gamma and G go to the other.
  cp_async_wait<0>();
  Element* queries = stage(kValueBlocks, 0);
  Element* keys = stage(kValueBlocks, KeyTile::kBytes);
  Element* score_grad = stage(kValueBlocks + 1, 0);
  Element* g_tile = stage(kValueBlocks + 1, ChunkTile::kBytes);
  if constexpr (Config::kQkL2Norm) {
    normalise_rows<KeyTile, kThreads>(queries, q_inverse, thread);
    normalise_rows<KeyTile, kThreads>(keys, k_inverse, thread);
  } else {
    __syncthreads();
  }

  // The warp's two rows' terms of dc (gate), dbeta and r, summed per lane
  // here and over the quad once at the end; column terms of dc per lane.
  float row_gate[2] = {0.f, 0.f}, row_beta[2] = {v_dot_dx[0], v_dot_dx[1]}, row_r[2] = {0.f, 0.f};
  float column_gate[kChunkBlocks][2] = {};

  // Row terms of D delta dH^T (r_j) and of Z = -E dX S0^T, then dK from both:
  // grad_k holds delta dH^T, z holds E dX S0^T.
  const float gate_last = gates[length - 1];
  {
    float k_dh[2] = {0.f, 0.f}, k_z[2] = {0.f, 0.f};  // k . (delta dH^T), k . (E dX S0^T)
    add_row_dots<KeyTile>(k_dh, keys, grad_k, row0, key_col0, lane);
    if constexpr (kDelta) add_row_dots<KeyTile>(k_z, keys, z, row0, key_col0, lane);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + fragment_row(lane, 2 * half);
      row_r[half] = fast_exp(gate_last - gates[row]) * k_dh[half];
      if constexpr (kDelta) {
        row_beta[half] -= k_z[half];
        row_gate[half] -= betas[row] * k_z[half];
      }
    }
#pragma unroll
    for (int j = 0; j < kKeyBlocks; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + fragment_row(lane, e);
        grad_k[j][e] = fast_exp(gate_last - gates[row]) * grad_k[j][e] - (kDelta ? betas[row] * z[j][e] : 0.f);
        grad_q[j][e] *= p.scale * fast_exp(gates[row]);
      }
    // q.dQ of the inter-chunk part (scale E dO S0^T), a gate term.
    add_row_dots<KeyTile>(row_gate, queries, grad_q, row0, key_col0, lane);
  }
  state_dot = warp_sum(state_dot);
  if (lane == 0) state_dots[warp] = state_dot;

  // dP o Gamma (to shared memory) and the column side of its gate term.
  {
    float qk[kChunkBlocks][4];
    zero(qk);
    warp_mma<Element, kChunkBlocks, kDk / 16, false, false, KeyTile, KeyTile>(qk, queries, row0, 0, keys, chunk_col0,
                                                                              0, lane);
    // The row (+) and column (-) sides of sum dP o P use the same fp32
    // products, so they cancel exactly over the chunk as they do in exact
    // arithmetic (going through the bf16 dP o Gamma product for the row side
    // would not: the gate gradients' sums over tokens then drift).
#pragma unroll
    for (int j = 0; j < kChunkBlocks; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + fragment_row(lane, 2 * half), col = chunk_col0 + fragment_col(lane, j, 0);
        float value[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          value[c] = 0.f;
          if (col + c <= row) {
            const float gamma = fast_exp(gates[row] - gates[col + c]);
            const float dp = p.scale * grad_p[j][2 * half + c];
            const float term = dp * gamma * qk[j][2 * half + c];
            column_gate[j][c] -= term;
            row_gate[half] += term;
            value[c] = dp * gamma;
          }
        }
        store_pair<ChunkTile>(score_grad, row, col, value[0], value[1]);
      }
  }
  if constexpr (kDelta) {
    // G = dA o B Gamma with dA = -strict_lower(dX delta^T), and the A terms of dbeta, dc.
    float kk[kChunkBlocks][4];
    zero(kk);
    warp_mma<Element, kChunkBlocks, kDk / 16, false, false, KeyTile, KeyTile>(kk, keys, row0, 0, keys, chunk_col0, 0,
                                                                              lane);
#pragma unroll
    for (int j = 0; j < kChunkBlocks; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + fragment_row(lane, 2 * half), col = chunk_col0 + fragment_col(lane, j, 0);
        float value[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          value[c] = 0.f;
          if (col + c < row) {
            const float gamma = fast_exp(gates[row] - gates[col + c]);
            const float da = -grad_a[j][2 * half + c];
            const float kk_gamma = gamma * kk[j][2 * half + c];
            const float a = betas[row] * kk_gamma;
            row_beta[half] += da * kk_gamma;
            row_gate[half] += da * a;
            column_gate[j][c] -= da * a;
            value[c] = da * betas[row] * gamma;
          }
        }
        store_pair<ChunkTile>(g_tile, row, col, value[0], value[1]);
      }
  }
  store_column_sums(column_gate, gate_columns + 64 * (warp & 3), chunk_col0, lane);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float gate_sum = quad_sum(row_gate[half]), beta_sum = quad_sum(row_beta[half]), r = quad_sum(row_r[half]);
    if ((lane & 3) == 0) {
      const int row = row0 + fragment_row(lane, 2 * half);
      row_partial(kGateRow, row) = gate_sum;
      row_partial(kBetaRow, row) = beta_sum;
      row_partial(kRRow, row) = r;
    }
  }
  __syncthreads();

  // dQ += (dP o Gamma) K;  dK += (dP o Gamma)^T Q + G K + G^T K.
  warp_mma<Element, kKeyBlocks, 4, false, true, ChunkTile, KeyTile>(grad_q, score_grad, row0, 0, keys, key_col0, 0,
                                                                    lane);
  warp_mma<Element, kKeyBlocks, 4, true, true, ChunkTile, KeyTile>(grad_k, score_grad, row0, 0, queries, key_col0, 0,
                                                                   lane);
  if constexpr (kDelta) {
    warp_mma<Element, kKeyBlocks, 4, false, true, ChunkTile, KeyTile>(grad_k, g_tile, row0, 0, keys, key_col0, 0,
                                                                      lane);
    warp_mma<Element, kKeyBlocks, 4, true, true, ChunkTile, KeyTile>(grad_k, g_tile, row0, 0, keys, key_col0, 0,
                                                                     lane);
  }
  // q.dQ and k.dK per row: the normalisation's projections.
  if constexpr (Config::kQkL2Norm) {
    float qd[2] = {0.f, 0.f}, kd[2] = {0.f, 0.f};
    add_row_dots<KeyTile>(qd, queries, grad_q, row0, key_col0, lane);
    add_row_dots<KeyTile>(kd, keys, grad_k, row0, key_col0, lane);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float qs = quad_sum(qd[half]), ks = quad_sum(kd[half]);
      if ((lane & 3) == 0) {
        const int row = row0 + fragment_row(lane, 2 * half);
        row_partial(kQDotRow, row) = qs;
        row_partial(kKDotRow, row) = ks;
      }
    }
  }
  __syncthreads();

  // dq, dk: summed over the value heads of a group in fp32 (finalised by
  // gated_delta_backward_finalize_kernel), or through the normalisation here.
  const bool grouped = p.value_heads != p.key_heads;
  float q_dot[2] = {0.f, 0.f}, k_dot[2] = {0.f, 0.f};  // of the thread's two rows
  if constexpr (Config::kQkL2Norm) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + fragment_row(lane, 2 * half);
      q_dot[half] = row_total(kQDotRow, row);
      k_dot[half] = row_total(kKDotRow, row);
    }
  }
  // Ungrouped dq, dk go through shared memory (the stage of dP o Gamma and
  // G, free after the products above) for 16-byte row stores.
  Element* grad_q_tile = stage(kValueBlocks + 1, 0);
  Element* grad_k_tile = stage(kValueBlocks + 1, KeyTile::kBytes);
#pragma unroll
  for (int j = 0; j < kKeyBlocks; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + fragment_row(lane, 2 * half), col = key_col0 + fragment_col(lane, j, 0);
      float dq0 = grad_q[j][2 * half], dq1 = grad_q[j][2 * half + 1];
      float dk0 = grad_k[j][2 * half], dk1 = grad_k[j][2 * half + 1];
      if (grouped) {
        if (row >= length) continue;
        const long long offset = ((start + row) * p.key_heads + hk) * kDk + col;
        global_add_pair(p.workspace.grad_q_accum + offset, dq0, dq1);
        global_add_pair(p.workspace.grad_k_accum + offset, dk0, dk1);
        continue;
      }
      if constexpr (Config::kQkL2Norm) {
        const float2 q = load_pair<KeyTile>(queries, row, col), k = load_pair<KeyTile>(keys, row, col);
        dq0 = q_inverse[row] * (dq0 - q.x * q_dot[half]);
        dq1 = q_inverse[row] * (dq1 - q.y * q_dot[half]);
        dk0 = k_inverse[row] * (dk0 - k.x * k_dot[half]);
        dk1 = k_inverse[row] * (dk1 - k.y * k_dot[half]);
      }
      store_pair<KeyTile>(grad_q_tile, row, col, dq0, dq1);
      store_pair<KeyTile>(grad_k_tile, row, col, dk0, dk1);
    }
  if (!grouped) {
    __syncthreads();
    store_tile<KeyTile, kThreads>(p.grad_q + start * p.grad_q_row_stride + hk * kDk, p.grad_q_row_stride,
                                  grad_q_tile, length, thread);
    store_tile<KeyTile, kThreads>(p.grad_k + start * p.grad_k_row_stride + hk * kDk, p.grad_k_row_stride,
                                  grad_k_tile, length, thread);
  }

  // dc per row, then dg = reverse cumulative sum over the chunk; thread i
  // handles row 63 - i so that the scan runs forward.
  if constexpr (Config::kHasGate || kDelta) {
    float dc = 0.f, r = 0.f;
    if (thread < 64) {
      r = row_total(kRRow, thread);
      dc = row_total(kGateRow, thread) - r;
#pragma unroll
      for (int block = 0; block < 4; ++block) dc += gate_columns[64 * block + thread];
    }
    r = warp_sum(r);
    if (lane == 0 && warp < 2) totals[1 + warp] = r;
    __syncthreads();
    if (thread < 64) {
      if (thread == length - 1) {
        float state_total = 0.f;
        for (int w = 0; w < kThreads / 32; ++w) state_total += state_dots[w];
        dc += totals[1] + totals[2] + fast_exp(gate_last) * state_total;
      }
      grad_gate_rows[thread] = thread < length ? dc : 0.f;
    }
    __syncthreads();
    const int row = 63 - thread;
    const float dg = chunk_inclusive_sum(thread < 64 ? grad_gate_rows[row] : 0.f, thread, &totals[0]);
    const bool valid = thread < 64 && row < length;
    const long long index = (start + row) * hv_count + hv;
    if constexpr (Config::kInKernelGate) {
      float a_log_part = 0.f, dt_part = 0.f;
      if (valid) {
        const float x = __bfloat162float(p.a[(start + row) * p.a_row_stride + hv]) + p.dt_bias[hv];
        const float decay_rate = __expf(p.a_log[hv]);
        const float da = dg * -decay_rate * sigmoid(x);
        p.grad_a[index] = da;
        a_log_part = dg * -decay_rate * softplus(x);
        dt_part = da;
        if constexpr (kDelta) p.grad_b[index] = row_total(kBetaRow, row) * betas[row] * (1.f - betas[row]);
      }
      a_log_part = warp_sum(a_log_part);
      dt_part = warp_sum(dt_part);
      if (lane == 0 && thread < 64) {
        atomicAdd(&totals[3], a_log_part);
        atomicAdd(&totals[4], dt_part);
      }
      __syncthreads();
      if (thread < 2)
        p.workspace.gate_param_partials[chunk_head * 2 + thread] = totals[3 + thread];
    } else if (valid) {
      if constexpr (Config::kHasGate) p.grad_g[index] = dg;
      if constexpr (kDelta) p.grad_beta[index] = row_total(kBetaRow, row);
    }
  }
}

// Grouped heads: dq, dk of each (token, key head) from the fp32 sums over
// the group, through the L2 normalisation. One warp per row.
constexpr int kFinalizeThreads = 256;

template <class Config>
__global__ void __launch_bounds__(kFinalizeThreads) gated_delta_backward_finalize_kernel(const GatedDeltaParams p) {
  constexpr int kDk = Config::kKeyDim, kPerLane = kDk / 32;
  const int lane = threadIdx.x % 32;
  const long long row = static_cast<long long>(blockIdx.x) * (kFinalizeThreads / 32) + threadIdx.x / 32;
  if (row >= static_cast<long long>(p.total_tokens) * p.key_heads) return;
  const long long token = row / p.key_heads;
  const int hk = static_cast<int>(row % p.key_heads);
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    const __nv_bfloat16* x = (which == 0 ? p.q + token * p.q_row_stride : p.k + token * p.k_row_stride) + hk * kDk;
    const float* grad = (which == 0 ? p.workspace.grad_q_accum : p.workspace.grad_k_accum) + row * kDk;
    __nv_bfloat16* out =
        (which == 0 ? p.grad_q + token * p.grad_q_row_stride : p.grad_k + token * p.grad_k_row_stride) + hk * kDk;
    float xs[kPerLane], gs[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      xs[i] = __bfloat162float(x[lane * kPerLane + i]);
      gs[i] = grad[lane * kPerLane + i];
    }
    if constexpr (Config::kQkL2Norm) {
      float squares = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) squares += xs[i] * xs[i];
      const float inverse = rsqrtf(warp_sum(squares) + kGatedDeltaNormEpsilon);
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) dot += xs[i] * inverse * gs[i];
      dot = warp_sum(dot);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) gs[i] = inverse * (gs[i] - xs[i] * inverse * dot);
    }
#pragma unroll
    for (int i = 0; i < kPerLane; i += 2) store_global_pair(out + lane * kPerLane + i, gs[i], gs[i + 1]);
  }
}

// In-kernel gate: dA_log and d dt_bias of value head blockIdx.x from the
// per-chunk partials.
template <class Config>
__global__ void __launch_bounds__(kFinalizeThreads) gated_delta_backward_gate_params_kernel(const GatedDeltaParams p) {
  __shared__ float warp_totals[2][kFinalizeThreads / 32];
  const int hv = blockIdx.x, thread = threadIdx.x, lane = thread % 32, warp = thread / 32;
  float a_log = 0.f, dt_bias = 0.f;
  for (int c = thread; c < p.max_chunks; c += kFinalizeThreads) {
    const long long index = (static_cast<long long>(c) * p.value_heads + hv) * 2;
    a_log += p.workspace.gate_param_partials[index];
    dt_bias += p.workspace.gate_param_partials[index + 1];
  }
  a_log = warp_sum(a_log);
  dt_bias = warp_sum(dt_bias);
  if (lane == 0) {
    warp_totals[0][warp] = a_log;
    warp_totals[1][warp] = dt_bias;
  }
  __syncthreads();
  if (thread == 0) {
    float sum_a_log = 0.f, sum_dt_bias = 0.f;
    for (int w = 0; w < kFinalizeThreads / 32; ++w) {
      sum_a_log += warp_totals[0][w];
      sum_dt_bias += warp_totals[1][w];
    }
    p.grad_a_log[hv] = sum_a_log;
    p.grad_dt_bias[hv] = sum_dt_bias;
  }
}

}  // namespace kernels
}  // namespace dflex
