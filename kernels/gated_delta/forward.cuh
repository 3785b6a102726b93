// Forward of the chunked gated delta rule, three kernels per call (after
// gated_delta_chunk_table_kernel for varlen):
//
//   prepare  grid (max_chunks, Hv), kThreads      per chunk and value head, in parallel:
//            cumulative gates c, A = strict_lower(B (K K^T) o Gamma), T = (I + A)^-1,
//            W = T B E K, U = T B V, key_decay D / |k|  -> workspace
//   state    grid (Dv / kValueBlock, Hv, N), kStateThreads   sequential over the chunks of a sequence:
//            S0 of each chunk -> chunk_states; delta = U - W S0 -> workspace;
//            S = exp(c_last) S0 + (D K)^T delta; final state (D K's rows as the
//            raw keys scaled by key_decay = D / |k|, applied to delta's rows)
//   output   grid (max_chunks, Hv), kThreads      per chunk and value head, in parallel:
//            O = scale (E Q S0 + lower(Q K^T o Gamma) delta)
//
// Notation as in docs/gated-delta.md: per chunk, c_i is the cumulative log
// gate, E = diag(exp(c)), Gamma_ij = exp(c_i - c_j), D_j = exp(c_last - c_j),
// B = diag(beta); K, Q are L2-normalised when the configuration says so.
// Without the delta rule, delta = V and the prepare kernel only writes the
// gates and key_decay.
#pragma once

#include "common.cuh"

namespace dflex {
namespace kernels {

// acc += X Y, a product of the solve, for X = x_high + x_low (its 16 rows
// at x_row0, reduction columns x_k0..) and Y likewise (tiles stored [K][N],
// columns y_n0.., reduction rows y_k0..), to near fp32 accuracy:
// high*high + high*low + low*high.
template <int kSteps, int kBlocksN>
__device__ __forceinline__ void split_mma(float (&acc)[kBlocksN][4], const __nv_bfloat16* x_high,
                                          const __nv_bfloat16* x_low, int x_row0, int x_k0,
                                          const __nv_bfloat16* y_high, const __nv_bfloat16* y_low, int y_n0,
                                          int y_k0, int lane) {
  using Tile = SwizzledTile<64, 64>;
  warp_mma<__nv_bfloat16, kBlocksN, kSteps, false, true, Tile, Tile>(acc, x_high, x_row0, x_k0, y_high, y_n0, y_k0,
                                                                     lane);
  warp_mma<__nv_bfloat16, kBlocksN, kSteps, false, true, Tile, Tile>(acc, x_high, x_row0, x_k0, y_low, y_n0, y_k0,
                                                                     lane);
  warp_mma<__nv_bfloat16, kBlocksN, kSteps, false, true, Tile, Tile>(acc, x_low, x_row0, x_k0, y_high, y_n0, y_k0,
                                                                     lane);
}

// x as bf16 high and low parts (x - high), packed in pairs.
__device__ __forceinline__ void split_pair(float x, float y, unsigned& high, unsigned& low) {
  high = ElementTraits<__nv_bfloat16>::pack(x, y);
  const float2 h = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&high));
  low = ElementTraits<__nv_bfloat16>::pack(x - h.x, y - h.y);
}

// acc (16 x 8*kBlocksN accumulator at (row0, col0)) times `factor`, stored as
// high and low parts.
template <int kBlocksN>
__device__ __forceinline__ void store_split(__nv_bfloat16* high, __nv_bfloat16* low, const float (&acc)[kBlocksN][4],
                                            float factor, int row0, int col0, int lane) {
  using Tile = SwizzledTile<64, 64>;
#pragma unroll
  for (int j = 0; j < kBlocksN; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int offset = Tile::offset(row0 + fragment_row(lane, 2 * half), col0 + fragment_col(lane, j, 0));
      split_pair(factor * acc[j][2 * half], factor * acc[j][2 * half + 1], *reinterpret_cast<unsigned*>(high + offset),
                 *reinterpret_cast<unsigned*>(low + offset));
    }
}

// acc += Z Y for a 16 x 16*kSteps Z held as accumulators (z[2s], z[2s+1] are
// columns 16s..16s+15: an accumulator pair has the layout of an A fragment)
// and Y = y_high + y_low (stored [K][N], reduction rows from y_k0), again
// high*high + high*low + low*high.
template <int kSteps, int kBlocksN>
__device__ __forceinline__ void split_mma_registers(float (&acc)[kBlocksN][4], const float (&z)[2 * kSteps][4],
                                                    const __nv_bfloat16* y_high, const __nv_bfloat16* y_low,
                                                    int y_n0, int y_k0, int lane) {
  using Tile = SwizzledTile<64, 64>;
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    unsigned a_high[4], a_low[4];
    split_pair(z[2 * step][0], z[2 * step][1], a_high[0], a_low[0]);
    split_pair(z[2 * step][2], z[2 * step][3], a_high[1], a_low[1]);
    split_pair(z[2 * step + 1][0], z[2 * step + 1][1], a_high[2], a_low[2]);
    split_pair(z[2 * step + 1][2], z[2 * step + 1][3], a_high[3], a_low[3]);
#pragma unroll
    for (int pair = 0; pair < kBlocksN / 2; ++pair) {
      unsigned b_high[4], b_low[4];
      load_b_pair_transposed<Tile>(b_high, y_high, y_n0 + 16 * pair, y_k0 + 16 * step, lane);
      load_b_pair_transposed<Tile>(b_low, y_low, y_n0 + 16 * pair, y_k0 + 16 * step, lane);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float(&c)[4] = acc[2 * pair + n];
        ElementTraits<__nv_bfloat16>::mma(c, a_high, b_high[2 * n], b_high[2 * n + 1]);
        ElementTraits<__nv_bfloat16>::mma(c, a_high, b_low[2 * n], b_low[2 * n + 1]);
        ElementTraits<__nv_bfloat16>::mma(c, a_low, b_high[2 * n], b_high[2 * n + 1]);
      }
    }
  }
}

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
  constexpr int kRow = Config::kDiagonalRow;
  static_assert(kThreads == 128, "the solve maps the chunk's four 16-row blocks onto four warps");
  Element* keys = reinterpret_cast<Element*>(shared + Layout::kKeys);
  Element* values = reinterpret_cast<Element*>(shared + Layout::kValues);
  Element* t_high = reinterpret_cast<Element*>(shared + Layout::kTInverse);  // T in bf16 once solved
  Element* t_low = reinterpret_cast<Element*>(shared + Layout::kTLow);
  Element* a_high = reinterpret_cast<Element*>(shared + Layout::kAHigh);
  Element* a_low = reinterpret_cast<Element*>(shared + Layout::kALow);
  float* gates = reinterpret_cast<float*>(shared + Layout::kGates);
  float* betas = gates + 64;
  float* key_factors = betas + 64;  // as the prepare kernel lays them out
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  // Warp w's fp32 diagonal block A_ww.
  float* diagonal = reinterpret_cast<float*>(shared + Layout::kDiagonal) + 16 * warp * kRow;

  // A = strict_lower(B (K K^T) o Gamma); warp w owns rows 16w..16w+15.
  {
    float acc[8][4];
    zero(acc);
    warp_mma<Element, 8, kDk / 16, false, false, KeyTile, KeyTile>(acc, keys, 16 * warp, 0, keys, 0, 0, lane);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = 16 * warp + fragment_row(lane, e), col = fragment_col(lane, j, e);
        acc[j][e] = col < row ? betas[row] * fast_exp(gates[row] - gates[col]) * acc[j][e] : 0.f;
        if (j / 2 == warp) diagonal[(row - 16 * warp) * kRow + col - 16 * warp] = acc[j][e];
      }
    }
    store_split(a_high, a_low, acc, 1.f, 16 * warp, 0, lane);
  }
  __syncwarp();

  // T = (I + A)^-1, unit lower triangular, by blocks (T_IJ = -T_II A_IJ T_JJ
  // for a split into diagonal blocks I, J). First the 16x16 diagonal blocks
  // in fp32 by forward substitution (warp w inverts block w, a lane per
  // column), with the warp's blocks right of the diagonal zero.
  {
    const int column = lane & 15, base = 16 * warp;
    float t[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float sum = i == column ? 1.f : 0.f;
#pragma unroll
      for (int j = 0; j < i; ++j) sum -= diagonal[i * kRow + j] * t[j];
      t[i] = sum;
    }
    if (lane < 16) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int offset = ChunkTile::offset(base + i, base + column);
        const Element high = __float2bfloat16_rn(t[i]);
        t_high[offset] = high;
        t_low[offset] = __float2bfloat16_rn(t[i] - __bfloat162float(high));
      }
    }
    for (int c = lane; c < 16 * 8; c += 32) {
      const int row = base + c / 8, col = 8 * (c % 8);
      if (col >= base + 16) {
        *reinterpret_cast<uint4*>(t_high + ChunkTile::offset(row, col)) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(t_low + ChunkTile::offset(row, col)) = make_uint4(0, 0, 0, 0);
      }
    }
  }
  __syncthreads();
  // 32x32 diagonal blocks: warp p < 2 computes T_(2p+1)(2p) = -(T_(2p+1)(2p+1) A_(2p+1)(2p)) T_(2p)(2p).
  if (warp < 2) {
    const int i = 32 * warp + 16, j = 32 * warp;
    float z[2][4];
    zero(z);
    split_mma<1>(z, t_high, t_low, i, i, a_high, a_low, j, i, lane);
    float out[2][4];
    zero(out);
    split_mma_registers<1>(out, z, t_high, t_low, j, j, lane);
    store_split(t_high, t_low, out, -1.f, i, j, lane);
  }
  __syncthreads();
  // The lower-left 32x32 block: T_10 = -(T_11 A_10) T_00 in 32-row blocks.
  // Warp w: rows 32 + 16 (w / 2), columns 16 (w % 2) (Z's 16 x 32 strip is
  // computed by both warps of a row strip). No warp reads the block it writes.
  {
    const int row0 = 32 + 16 * (warp >> 1), col0 = 16 * (warp & 1);
    float z[4][4];
    zero(z);
    split_mma<2>(z, t_high, t_low, row0, 32, a_high, a_low, 0, 32, lane);
    float out[2][4];
    zero(out);
    split_mma_registers<2>(out, z, t_high, t_low, col0, 0, lane);
    store_split(t_high, t_low, out, -1.f, row0, col0, lane);
  }

  // K rows scaled by beta exp(c), V rows by beta. (Scaling T's columns
  // instead moves fewer bytes but doubled dg's error: the gate gradients'
  // cancellation is sensitive to where W and U are rounded.)
  scale_rows<KeyTile, kThreads>(keys, key_factors, thread);
  scale_rows<ValueTile, kThreads>(values, betas, thread);
  __syncthreads();

  // W = T (B E K), U = T (B V); each written over its operand once every warp has read it.
  {
    float acc[kDk / 8][4];
    zero(acc);
    warp_mma<Element, kDk / 8, 4, false, true, ChunkTile, KeyTile>(acc, t_high, 16 * warp, 0, keys, 0, 0, lane);
    __syncthreads();
    store_accumulator<KeyTile>(keys, acc, 1.f, 1.f, 16 * warp, 0, lane);
  }
  {
    float acc[kDv / 8][4];
    zero(acc);
    warp_mma<Element, kDv / 8, 4, false, true, ChunkTile, ValueTile>(acc, t_high, 16 * warp, 0, values, 0, 0, lane);
    __syncthreads();
    store_accumulator<ValueTile>(values, acc, 1.f, 1.f, 16 * warp, 0, lane);
  }
  __syncthreads();
  store_tile<KeyTile, kThreads>(p.workspace.w + static_cast<long long>(chunk.start) * hv_count * kDk + hv * kDk,
                                static_cast<long long>(hv_count) * kDk, keys, chunk.length, thread);
  store_tile<ValueTile, kThreads>(p.workspace.u + static_cast<long long>(chunk.start) * hv_count * kDv + hv * kDv,
                                  static_cast<long long>(hv_count) * kDv, values, chunk.length, thread);
  store_tile<ChunkTile, kThreads>(p.workspace.t_inverse + (static_cast<long long>(chunk.index) * hv_count + hv) * 64 * 64,
                                  64, t_high, 64, thread);
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
  float* key_factors = betas + 64;   // beta_i exp(c_i)
  float* key_norms = key_factors + 64;  // 1 / |k_i|
  float* scratch = key_norms + 64;

  const ChunkCoordinates chunk = locate_chunk<Config>(p, blockIdx.x);
  if (chunk.sequence < 0) return;
  const int hv = blockIdx.y;
  const int hk = hv / (p.value_heads / p.key_heads);
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x;

  if constexpr (Config::kDeltaRule || Config::kQkL2Norm)
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
  float decay = 0.f;  // D_i of thread i's token
  if (thread < 64) {
    if (thread < chunk.length) decay = fast_exp(gates[chunk.length - 1] - gate);
    key_factors[thread] = beta * fast_exp(gate);
    if (thread < chunk.length) {
      const long long index = static_cast<long long>(chunk.start + thread) * hv_count + hv;
      p.workspace.gate_cumsum[index] = gate;
      if constexpr (Config::kDeltaRule) p.workspace.beta[index] = beta;
    }
  }
  cp_async_wait<0>();
  if constexpr (Config::kQkL2Norm) {
    normalise_rows<KeyTile, kThreads>(keys, key_norms, thread);
  } else {
    __syncthreads();
  }
  // The state kernels' scale of K^T's columns: D_j / |k_j|.
  if (thread < chunk.length)
    p.workspace.key_decay[static_cast<long long>(chunk.start + thread) * hv_count + hv] =
        Config::kQkL2Norm ? decay * key_norms[thread] : decay;
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
  Element* delta_tile = reinterpret_cast<Element*>(shared + Layout::kDelta);              // delta, for the workspace
  Element* scaled_delta = reinterpret_cast<Element*>(shared + Layout::kScaledDelta);      // key_decay delta

  const int column0 = blockIdx.x * kBlock, hv = blockIdx.y, sequence = blockIdx.z;
  const int hk = hv / (p.value_heads / p.key_heads);
  const int hv_count = p.value_heads;
  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  const SequenceCoordinates seq = locate_sequence<Config>(p, sequence);
  const int chunks = seq.chunks();
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

  // Chunk i's W, U block (V block without the delta rule) and keys.
  const Element* w_rows = p.workspace.w + hv * kDk;
  const Element* value_rows_base =
      Config::kDeltaRule ? p.workspace.u + hv * kDv + column0 : p.v + hv * kDv + column0;
  const long long value_stride = Config::kDeltaRule ? value_rows : p.v_row_stride;
  const Element* key_rows_base = p.k + hk * kDk;

  // Stage i of chunk i, a step ahead, in two copy groups by when the step
  // needs them: first W and the value block, then the keys (for the state
  // update at the end of the step).
  auto issue = [&](int i) {
    const long long start = seq.chunk_start(i);
    const int rows = seq.chunk_rows(i);
    if constexpr (Config::kDeltaRule)
      async_load_tile<KeyTile, kThreads>(stage(i, kWOffset), w_rows + start * key_rows, key_rows, rows, thread);
    async_load_tile<ValueBlockTile, kThreads>(stage(i, kValuesOffset), value_rows_base + start * value_stride,
                                              value_stride, rows, thread);
    cp_async_commit();
    async_load_tile<KeyTile, kThreads>(stage(i, kKeysOffset), key_rows_base + start * p.k_row_stride,
                                       p.k_row_stride, rows, thread);
    cp_async_commit();
  };

  StateStepScalars next;
  if (chunks > 0) {
    issue(0);
    next = load_state_step_scalars(p, seq, 0, hv, delta_row0, lane);
  }
  for (int i = 0; i < chunks; ++i) {
    const long long start = seq.chunk_start(i);
    const int rows = seq.chunk_rows(i);
    const StateStepScalars now = next;
    const bool prefetching = i + 1 < chunks;
    cp_async_wait<1>();  // the first group of chunk i
    store_accumulator<StateBlockTile>(state_tile, state, 1.f, 1.f, 16 * warp, 0, lane);
    // Every warp is past step i - 1 here: its stage, the last one read by the
    // update, takes chunk i + 1 (so the step ends without a barrier).
    __syncthreads();
    if (prefetching) {
      issue(i + 1);
      next = load_state_step_scalars(p, seq, i + 1, hv, delta_row0, lane);
    }
    store_tile<StateBlockTile, kThreads>(
        p.workspace.chunk_states + (static_cast<long long>(seq.first_chunk + i) * hv_count + hv) * kDk * kDv + column0,
        kDv, state_tile, kDk, thread);

    // delta = U - W S0 (V without the rule) for the warp's 16 rows and column
    // slice, and its rows scaled by key_decay for the update.
    {
      float acc[kSliceColumns / 8][4];
      zero(acc);
      if constexpr (Config::kDeltaRule)
        warp_mma<Element, kSliceColumns / 8, kDk / 16, false, true, KeyTile, StateBlockTile>(
            acc, stage(i, kWOffset), delta_row0, 0, state_tile, delta_col0, 0, lane);
#pragma unroll
      for (int j = 0; j < kSliceColumns / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = delta_row0 + fragment_row(lane, 2 * half), col = delta_col0 + fragment_col(lane, j, 0);
          const float2 u = load_pair<ValueBlockTile>(stage(i, kValuesOffset), row, col);
          const float x = u.x - acc[j][2 * half], y = u.y - acc[j][2 * half + 1];
          if constexpr (Config::kDeltaRule) store_pair<ValueBlockTile>(delta_tile, row, col, x, y);
          store_pair<ValueBlockTile>(scaled_delta, row, col, now.key_decay[half] * x, now.key_decay[half] * y);
        }
    }
    if (prefetching) {
      cp_async_wait<2>();  // the second group of chunk i
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (Config::kDeltaRule)
      store_tile<ValueBlockTile, kThreads>(p.workspace.delta + start * value_rows + hv * kDv + column0, value_rows,
                                           delta_tile, rows, thread);
    // S = exp(c_last) S0 + K^T diag(key_decay) delta
    const float decay = fast_exp(now.gate_last);
#pragma unroll
    for (int j = 0; j < kBlock / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) state[j][e] *= decay;
    warp_mma<Element, kBlock / 8, 4, true, true, KeyTile, ValueBlockTile>(state, stage(i, kKeysOffset), 16 * warp, 0,
                                                                         scaled_delta, 0, 0, lane);
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
