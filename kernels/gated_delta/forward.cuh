// Forward of the chunked gated delta rule, three kernels per call (after
// gated_delta_chunk_table_kernel for varlen):
//
//   prepare  grid (max_chunks, Hv), kThreads      per chunk and value head, in parallel:
//            cumulative gates c, A = strict_lower(B (K K^T) o Gamma), T = (I + A)^-1,
//            W = T B E K, U = T B V, decayed keys D K  -> workspace
//   state    grid (Dv / kValueBlock, Hv, N), kStateThreads   sequential over the chunks of a sequence:
//            S0 of each chunk -> chunk_states; delta = U - W S0 -> workspace;
//            S = exp(c_last) S0 + (D K)^T delta; final state
//   output   grid (max_chunks, Hv), kThreads      per chunk and value head, in parallel:
//            O = scale (E Q S0 + lower(Q K^T o Gamma) delta)
//
// Notation as in docs/gated-delta.md: per chunk, c_i is the cumulative log
// gate, E = diag(exp(c)), Gamma_ij = exp(c_i - c_j), D_j = exp(c_last - c_j),
// B = diag(beta); K, Q are L2-normalised when the configuration says so.
// Without the delta rule, delta = V and the prepare kernel only writes the
// gates and the decayed keys.
#pragma once

#include "common.cuh"

namespace dflex {
namespace kernels {

// The WY / UT part of the forward prepare kernel (delta rule only): A, T,
// W and U of the chunk whose normalised keys, values and gates are in
// shared memory.
template <class Config>
__device__ __forceinline__ void forward_prepare_wy(const GatedDeltaParams& p, const ChunkCoordinates& chunk, int hv,
                                                   unsigned char* shared) {
  using Element = typename Config::Element;
  using KeyTile = typename Config::KeyTile;
  using ValueTile = typename Config::ValueTile;
  using ChunkTile = typename Config::ChunkTile;
  using Layout = typename Config::ForwardPrepare;
  constexpr int kDk = Config::kKeyDim, kDv = Config::kValueDim, kThreads = Config::kThreads;
  constexpr int kRow = Config::kFloatRow, kBlockRow = Config::kBlockRowFloats;
  Element* keys = reinterpret_cast<Element*>(shared + Layout::kKeys);
  Element* values = reinterpret_cast<Element*>(shared + Layout::kValues);
  Element* t_tile = reinterpret_cast<Element*>(shared + Layout::kTInverse);
  float* matrix = reinterpret_cast<float*>(shared + Layout::kMatrix);  // A, then T in place
  float* block_rows = reinterpret_cast<float*>(shared + Layout::kBlockRows);
  float* gates = reinterpret_cast<float*>(shared + Layout::kGates);
  float* betas = gates + 64;
  float* key_factors = gates + 192;
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;


  // A = strict_lower(B (K K^T) o Gamma) in fp32; warp w owns rows 16w..16w+15.
  // T is then computed in place over A.
  {
    float acc[8][4];
    zero(acc);
    warp_mma<Element, 8, kDk / 16, false, false, KeyTile, KeyTile>(acc, keys, 16 * warp, 0, keys, 0, 0, lane);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 16 * warp + fragment_row(lane, e), col = fragment_col(lane, j, e);
        matrix[row * kRow + col] = col < row ? betas[row] * fast_exp(gates[row] - gates[col]) * acc[j][e] : 0.f;
      }
    }
  }
  __syncthreads();

  // T = (I + A)^-1. The four 16x16 diagonal blocks by forward substitution
  // (warp w inverts block w, a lane per column, and writes T_ww over A_ww).
  {
    const int column = lane & 15, base = 16 * warp;
    float t[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float sum = i == column ? 1.f : 0.f;
#pragma unroll
      for (int j = 0; j < i; ++j) sum -= matrix[(base + i) * kRow + base + j] * t[j];
      t[i] = sum;
    }
    __syncwarp();
    if (lane < 16) {
#pragma unroll
      for (int i = 0; i < 16; ++i) matrix[(base + i) * kRow + base + column] = t[i];
    }
  }
  __syncthreads();
  // Then block rows I = 1..3 below the diagonal: T_IJ = -T_II sum_{J<=K<I} A_IK T_KJ,
  // first Y = sum_K A_IK T_KJ into block_rows, then -T_II Y. Thread (r, g) =
  // (thread % 16, thread / 16) computes row 16I + r at the 4-column groups g
  // and g + 8 with 16-byte shared loads, one load per four multiply-adds
  // (this solve is bound by shared-memory bandwidth). A warp's two groups lie
  // in one column block J, so its k range (from 16J) is warp-uniform.
  static_assert(kThreads == 128, "the block-row solve maps 16 rows x 8 column groups onto 128 threads");
  static_assert(kRow % 4 == 0 && kBlockRow % 4 == 0, "the block-row solve reads 16-byte rows");
  {
    const int r = thread & 15, g = thread >> 4;
    auto row4 = [](const float* row) { return *reinterpret_cast<const float4*>(row); };
    auto fma4 = [](float4& sum, float a, const float4& b) {
      sum.x += a * b.x;
      sum.y += a * b.y;
      sum.z += a * b.z;
      sum.w += a * b.w;
    };
#pragma unroll
    for (int block = 1; block < 4; ++block) {
      const int base = 16 * block;
      float a_row[48];
#pragma unroll
      for (int k = 0; k < base; k += 4) {
        const float4 a = row4(matrix + (base + r) * kRow + k);
        a_row[k] = a.x;
        a_row[k + 1] = a.y;
        a_row[k + 2] = a.z;
        a_row[k + 3] = a.w;
      }
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int group = g + 8 * m;
        if (group < 4 * block) {
          const int c = 4 * group, k0 = 16 * (group / 4);
          float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int k = 0; k < base; ++k)
            if (k >= k0) fma4(sum, a_row[k], row4(matrix + k * kRow + c));
          *reinterpret_cast<float4*>(block_rows + r * kBlockRow + c) = sum;
        }
      }
      __syncthreads();
      float t_row[16];
#pragma unroll
      for (int k = 0; k < 16; k += 4) {
        const float4 t = row4(matrix + (base + r) * kRow + base + k);
        t_row[k] = t.x;
        t_row[k + 1] = t.y;
        t_row[k + 2] = t.z;
        t_row[k + 3] = t.w;
      }
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int group = g + 8 * m;
        if (group < 4 * block) {
          const int c = 4 * group;
          float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
          for (int k = 0; k < 16; ++k) fma4(sum, -t_row[k], row4(block_rows + k * kBlockRow + c));
          *reinterpret_cast<float4*>(matrix + (base + r) * kRow + c) = sum;
        }
      }
      __syncthreads();
    }
  }

  // T to bf16 (lower triangle), K rows scaled by beta exp(c), V rows by beta.
  for (int index = thread; index < 64 * 32; index += kThreads) {
    const int row = index / 32, col = (index % 32) * 2;
    store_pair<ChunkTile>(t_tile, row, col, col <= row ? matrix[row * kRow + col] : 0.f,
                          col + 1 <= row ? matrix[row * kRow + col + 1] : 0.f);
  }
  scale_rows<KeyTile, kThreads>(keys, key_factors, thread);
  scale_rows<ValueTile, kThreads>(values, betas, thread);
  __syncthreads();

  // W = T (B E K), U = T (B V); each written over its operand once every warp has read it.
  {
    float acc[kDk / 8][4];
    zero(acc);
    warp_mma<Element, kDk / 8, 4, false, true, ChunkTile, KeyTile>(acc, t_tile, 16 * warp, 0, keys, 0, 0, lane);
    __syncthreads();
    store_accumulator<KeyTile>(keys, acc, 1.f, 1.f, 16 * warp, 0, lane);
  }
  {
    float acc[kDv / 8][4];
    zero(acc);
    warp_mma<Element, kDv / 8, 4, false, true, ChunkTile, ValueTile>(acc, t_tile, 16 * warp, 0, values, 0, 0, lane);
    __syncthreads();
    store_accumulator<ValueTile>(values, acc, 1.f, 1.f, 16 * warp, 0, lane);
  }
  __syncthreads();
  store_tile<KeyTile, kThreads>(p.workspace.w + static_cast<long long>(chunk.start) * hv_count * kDk + hv * kDk,
                                static_cast<long long>(hv_count) * kDk, keys, chunk.length, thread);
  store_tile<ValueTile, kThreads>(p.workspace.u + static_cast<long long>(chunk.start) * hv_count * kDv + hv * kDv,
                                  static_cast<long long>(hv_count) * kDv, values, chunk.length, thread);
  store_tile<ChunkTile, kThreads>(p.workspace.t_inverse + (static_cast<long long>(chunk.index) * hv_count + hv) * 64 * 64,
                                  64, t_tile, 64, thread);
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads) gated_delta_forward_prepare_kernel(const GatedDeltaParams p) {
  using Element = typename Config::Element;
  using KeyTile = typename Config::KeyTile;
  using ValueTile = typename Config::ValueTile;
  using Layout = typename Config::ForwardPrepare;
  constexpr int kDk = Config::kKeyDim, kDv = Config::kValueDim, kThreads = Config::kThreads;

  extern __shared__ __align__(128) unsigned char shared[];
  Element* keys = reinterpret_cast<Element*>(shared + Layout::kKeys);
  Element* values = reinterpret_cast<Element*>(shared + Layout::kValues);
  float* gates = reinterpret_cast<float*>(shared + Layout::kGates);  // c_i
  float* betas = gates + 64;
  float* decays = betas + 64;       // D_i
  float* key_factors = decays + 64; // beta_i exp(c_i)
  float* scratch = key_factors + 64;

  const ChunkCoordinates chunk = locate_chunk<Config>(p, blockIdx.x);
  if (chunk.sequence < 0) return;
  const int hv = blockIdx.y;
  const int hk = hv / (p.value_heads / p.key_heads);
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x;

  async_load_tile<KeyTile, kThreads>(keys, p.k + chunk.start * p.k_row_stride + hk * kDk, p.k_row_stride,
                                     chunk.length, thread);
  if constexpr (Config::kDeltaRule)
    async_load_tile<ValueTile, kThreads>(values, p.v + chunk.start * p.v_row_stride + hv * kDv, p.v_row_stride,
                                         chunk.length, thread);
  cp_async_commit();

  // Gates of the chunk's tokens (padding rows: g = 0, beta = 0), scanned.
  float gate = 0.f, beta = 0.f;
  if (thread < chunk.length) token_gate<Config>(p, chunk.start + thread, hv, gate, beta);
  gate = chunk_inclusive_sum(gate, thread, scratch);
  if (thread < 64) {
    gates[thread] = gate;
    betas[thread] = beta;
  }
  __syncthreads();
  if (thread < 64) {
    const float last = gates[chunk.length - 1];
    decays[thread] = thread < chunk.length ? fast_exp(last - gate) : 0.f;
    key_factors[thread] = beta * fast_exp(gate);
    if (thread < chunk.length) {
      const long long index = static_cast<long long>(chunk.start + thread) * hv_count + hv;
      p.workspace.gate_cumsum[index] = gate;
      if constexpr (Config::kDeltaRule) p.workspace.beta[index] = beta;
    }
  }
  cp_async_wait<0>();
  if constexpr (Config::kQkL2Norm) {
    normalise_rows<KeyTile, kThreads>(keys, nullptr, thread);
  } else {
    __syncthreads();
  }

  // Decayed keys D_j k_j for the state update.
  {
    Element* out = p.workspace.decayed_k + static_cast<long long>(chunk.start) * hv_count * kDk + hv * kDk;
    constexpr int kChunks = 64 * KeyTile::kChunksPerRow;
    for (int c = thread; c < kChunks; c += kThreads) {
      const int row = c / KeyTile::kChunksPerRow, col = (c % KeyTile::kChunksPerRow) * 8;
      if (row >= chunk.length) continue;
      *reinterpret_cast<uint4*>(out + static_cast<long long>(row) * hv_count * kDk + col) =
          scale_chunk(*reinterpret_cast<const uint4*>(keys + KeyTile::offset(row, col)), decays[row]);
    }
  }
  if constexpr (Config::kDeltaRule) forward_prepare_wy<Config>(p, chunk, hv, shared);
}

template <class Config>
__global__ void __launch_bounds__(Config::kStateThreads) gated_delta_forward_state_kernel(const GatedDeltaParams p) {
  using Element = typename Config::Element;
  using KeyTile = typename Config::KeyTile;
  using ValueBlockTile = typename Config::ValueBlockTile;
  using StateBlockTile = typename Config::StateBlockTile;
  using Layout = typename Config::ForwardState;
  constexpr int kDk = Config::kKeyDim, kDv = Config::kValueDim, kThreads = Config::kStateThreads;
  constexpr int kBlock = Config::kValueBlock, kSliceColumns = kBlock / Config::kStateSlices;
  constexpr int kWOffset = 0;
  constexpr int kKeysOffset = Config::kDeltaRule ? KeyTile::kBytes : 0;
  constexpr int kValuesOffset = kKeysOffset + KeyTile::kBytes;

  extern __shared__ __align__(128) unsigned char shared[];
  auto stage = [&](int index, int offset) {
    return reinterpret_cast<Element*>(shared + Layout::kStages + (index & 1) * Layout::kStageBytes + offset);
  };
  Element* state_tile = reinterpret_cast<Element*>(shared + Layout::kState);
  Element* delta_tile = reinterpret_cast<Element*>(shared + Layout::kDelta);

  const int column0 = blockIdx.x * kBlock, hv = blockIdx.y, sequence = blockIdx.z;
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  const SequenceCoordinates seq = locate_sequence<Config>(p, sequence);
  const int chunks = (seq.length + 63) / 64;
  const long long key_rows = static_cast<long long>(hv_count) * kDk;    // row stride of [T, Hv, Dk]
  const long long value_rows = static_cast<long long>(hv_count) * kDv;  // row stride of [T, Hv, Dv]
  const long long state_base = (static_cast<long long>(sequence) * hv_count + hv) * kDk * kDv + column0;
  // The warp's rows and columns of the 64-row product delta = U - W S0.
  const int delta_row0 = 16 * (warp & 3), delta_col0 = kSliceColumns * (warp >> 2);

  // The state block, fp32 in registers: warp w owns rows 16w..16w+15.
  float state[kBlock / 8][4];
#pragma unroll
  for (int j = 0; j < kBlock / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + fragment_row(lane, e), col = fragment_col(lane, j, e);
      state[j][e] = Config::kInitialState ? p.initial_state[state_base + row * kDv + col] : 0.f;
    }

  // Stage i of chunk i, a step ahead, in two copy groups by when the step
  // needs them: first W and U (V without the delta rule), then the decayed
  // keys (for the state update at the end of the step).
  auto issue = [&](int i) {
    const long long start = seq.start + 64 * i;
    const int rows = min(64, seq.length - 64 * i);
    if constexpr (Config::kDeltaRule) {
      async_load_tile<KeyTile, kThreads>(stage(i, kWOffset), p.workspace.w + start * key_rows + hv * kDk, key_rows,
                                         rows, thread);
      async_load_tile<ValueBlockTile, kThreads>(stage(i, kValuesOffset),
                                                p.workspace.u + start * value_rows + hv * kDv + column0, value_rows,
                                                rows, thread);
    } else {
      async_load_tile<ValueBlockTile, kThreads>(stage(i, kValuesOffset),
                                                p.v + start * p.v_row_stride + hv * kDv + column0, p.v_row_stride,
                                                rows, thread);
    }
    cp_async_commit();
    async_load_tile<KeyTile, kThreads>(stage(i, kKeysOffset), p.workspace.decayed_k + start * key_rows + hv * kDk,
                                       key_rows, rows, thread);
    cp_async_commit();
  };

  // The chunk's last cumulative gate, loaded a step ahead (it is on the critical path).
  auto last_gate = [&](int i) {
    const int rows = min(64, seq.length - 64 * i);
    return p.workspace.gate_cumsum[(seq.start + 64LL * i + rows - 1) * hv_count + hv];
  };
  float next_gate_last = 0.f;
  if (chunks > 0) {
    issue(0);
    next_gate_last = last_gate(0);
  }
  for (int i = 0; i < chunks; ++i) {
    const long long start = seq.start + 64 * i;
    const int rows = min(64, seq.length - 64 * i);
    const float gate_last = next_gate_last;
    const bool prefetching = i + 1 < chunks;
    if (prefetching) {
      issue(i + 1);
      next_gate_last = last_gate(i + 1);
      cp_async_wait<3>();  // the first group of chunk i
    } else {
      cp_async_wait<1>();
    }
    store_accumulator<StateBlockTile>(state_tile, state, 1.f, 1.f, 16 * warp, 0, lane);
    __syncthreads();
    store_tile<StateBlockTile, kThreads>(
        p.workspace.chunk_states + (static_cast<long long>(seq.first_chunk + i) * hv_count + hv) * kDk * kDv + column0,
        kDv, state_tile, kDk, thread);

    const Element* delta_source = stage(i, kValuesOffset);
    if constexpr (Config::kDeltaRule) {
      // delta = U - W S0 for the warp's 16 rows and column slice.
      float acc[kSliceColumns / 8][4];
      zero(acc);
      warp_mma<Element, kSliceColumns / 8, kDk / 16, false, true, KeyTile, StateBlockTile>(
          acc, stage(i, kWOffset), delta_row0, 0, state_tile, delta_col0, 0, lane);
#pragma unroll
      for (int j = 0; j < kSliceColumns / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = delta_row0 + fragment_row(lane, 2 * half), col = delta_col0 + fragment_col(lane, j, 0);
          const float2 u = load_pair<ValueBlockTile>(stage(i, kValuesOffset), row, col);
          store_pair<ValueBlockTile>(delta_tile, row, col, u.x - acc[j][2 * half], u.y - acc[j][2 * half + 1]);
        }
    }
    if (prefetching) {
      cp_async_wait<2>();  // the second group of chunk i
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (Config::kDeltaRule) {
      store_tile<ValueBlockTile, kThreads>(p.workspace.delta + start * value_rows + hv * kDv + column0, value_rows,
                                           delta_tile, rows, thread);
      delta_source = delta_tile;
    }
    // S = exp(c_last) S0 + (D K)^T delta
    const float decay = fast_exp(gate_last);
#pragma unroll
    for (int j = 0; j < kBlock / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) state[j][e] *= decay;
    warp_mma<Element, kBlock / 8, 4, true, true, KeyTile, ValueBlockTile>(state, stage(i, kKeysOffset), 16 * warp, 0,
                                                                         delta_source, 0, 0, lane);
    __syncthreads();
  }

  if constexpr (Config::kFinalState) {
#pragma unroll
    for (int j = 0; j < kBlock / 8; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = 16 * warp + fragment_row(lane, 2 * half), col = fragment_col(lane, j, 0);
        *reinterpret_cast<float2*>(p.final_state + state_base + row * kDv + col) =
            make_float2(state[j][2 * half], state[j][2 * half + 1]);
      }
  }
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads) gated_delta_forward_output_kernel(const GatedDeltaParams p) {
  using Element = typename Config::Element;
  using KeyTile = typename Config::KeyTile;
  using ValueTile = typename Config::ValueTile;
  using ChunkTile = typename Config::ChunkTile;
  using StateTile = typename Config::StateTile;
  using Layout = typename Config::ForwardOutput;
  constexpr int kDk = Config::kKeyDim, kDv = Config::kValueDim, kThreads = Config::kThreads;

  extern __shared__ __align__(128) unsigned char shared[];
  Element* queries = reinterpret_cast<Element*>(shared + Layout::kQueries);
  Element* keys = reinterpret_cast<Element*>(shared + Layout::kKeys);
  Element* state = reinterpret_cast<Element*>(shared + Layout::kState);
  Element* delta = reinterpret_cast<Element*>(shared + Layout::kDelta);
  Element* scores = reinterpret_cast<Element*>(shared + Layout::kScores);
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
  async_load_tile<StateTile, kThreads>(
      state, p.workspace.chunk_states + (static_cast<long long>(chunk.index) * hv_count + hv) * kDk * kDv, kDv, kDk,
      thread);
  if constexpr (Config::kDeltaRule) {
    async_load_tile<ValueTile, kThreads>(delta, p.workspace.delta + start * hv_count * kDv + hv * kDv,
                                         static_cast<long long>(hv_count) * kDv, chunk.length, thread);
  } else {
    async_load_tile<ValueTile, kThreads>(delta, p.v + start * p.v_row_stride + hv * kDv, p.v_row_stride,
                                         chunk.length, thread);
  }
  cp_async_commit();
  if (thread < 64) gates[thread] = p.workspace.gate_cumsum[(start + min(thread, chunk.length - 1)) * hv_count + hv];
  cp_async_wait<0>();
  if constexpr (Config::kQkL2Norm) {
    normalise_rows<KeyTile, kThreads>(queries, nullptr, thread);
    normalise_rows<KeyTile, kThreads>(keys, nullptr, thread);
  } else {
    __syncthreads();
  }

  // P = scale lower(Q K^T o Gamma), the warp's 16 rows.
  store_chunk_scores<Config>(scores, queries, keys, gates, p.scale, warp, lane);
  // O = scale E Q S0 + P delta
  float acc[kDv / 8][4];
  zero(acc);
  warp_mma<Element, kDv / 8, kDk / 16, false, true, KeyTile, StateTile>(acc, queries, 16 * warp, 0, state, 0, 0, lane);
  const float upper = p.scale * fast_exp(gates[16 * warp + fragment_row(lane, 0)]);
  const float lower = p.scale * fast_exp(gates[16 * warp + fragment_row(lane, 2)]);
#pragma unroll
  for (int j = 0; j < kDv / 8; ++j) {
    acc[j][0] *= upper;
    acc[j][1] *= upper;
    acc[j][2] *= lower;
    acc[j][3] *= lower;
  }
  warp_mma<Element, kDv / 8, 4, false, true, ChunkTile, ValueTile>(acc, scores, 16 * warp, 0, delta, 0, 0, lane);
  __syncthreads();
  store_accumulator<ValueTile>(delta, acc, 1.f, 1.f, 16 * warp, 0, lane);
  __syncthreads();
  store_tile<ValueTile, kThreads>(p.o + start * p.o_row_stride + hv * kDv, p.o_row_stride, delta, chunk.length, thread);
}

}  // namespace kernels
}  // namespace dflex
