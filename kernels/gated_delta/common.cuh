// Pieces shared by the gated-delta kernels: where a chunk or a sequence lies
// in the packed token axis, the varlen chunk table, in-place L2
// normalisation of a shared-memory tile, the in-chunk scan of the gates, the
// in-kernel gate, and element access at mma accumulator positions.
#pragma once

#include "config.cuh"

namespace dflex {
namespace kernels {

constexpr float kGatedDeltaNormEpsilon = 1e-6f;

struct ChunkCoordinates {
  int sequence;  // -1: past the last chunk (varlen grids are an upper bound)
  int start;     // first token of the chunk in the packed axis
  int length;    // tokens in the chunk, 1 .. 64
  int index;     // global chunk index (chunk-level workspace buffers)
};

struct SequenceCoordinates {
  int start;
  int length;
  int first_chunk;

  __device__ __forceinline__ int chunks() const { return (length + kGatedDeltaChunk - 1) / kGatedDeltaChunk; }
  // First token of the sequence's chunk i in the packed axis, and its tokens.
  __device__ __forceinline__ long long chunk_start(int i) const {
    return start + static_cast<long long>(kGatedDeltaChunk) * i;
  }
  __device__ __forceinline__ int chunk_rows(int i) const { return min(kGatedDeltaChunk, length - kGatedDeltaChunk * i); }
};

template <class Config>
__device__ __forceinline__ SequenceCoordinates locate_sequence(const GatedDeltaParams& p, int sequence) {
  if constexpr (Config::kVarlen) {
    const int start = p.cu_seqlens[sequence];
    return {start, p.cu_seqlens[sequence + 1] - start, p.workspace.chunk_offsets[sequence]};
  } else {
    const int chunks = (p.sequence_length + kGatedDeltaChunk - 1) / kGatedDeltaChunk;
    return {sequence * p.sequence_length, p.sequence_length, sequence * chunks};
  }
}

template <class Config>
__device__ __forceinline__ ChunkCoordinates locate_chunk(const GatedDeltaParams& p, int chunk) {
  int sequence;
  if constexpr (Config::kVarlen) {
    sequence = p.workspace.chunk_sequence[chunk];
  } else {
    const int chunks = (p.sequence_length + kGatedDeltaChunk - 1) / kGatedDeltaChunk;
    sequence = chunk / chunks;
  }
  if (sequence < 0 || sequence >= p.num_sequences) return {-1, 0, 0, chunk};
  const SequenceCoordinates s = locate_sequence<Config>(p, sequence);
  const int offset = (chunk - s.first_chunk) * kGatedDeltaChunk;
  const int length = min(kGatedDeltaChunk, s.length - offset);
  return {sequence, s.start + offset, length, chunk};
}

// varlen: chunk_offsets[n] = sum over m < n of ceil(len_m / 64), and the
// sequence of each chunk (-1 for the grid's spare chunks). One block of
// kChunkTableThreads threads; any number of sequences. (Templated on the
// configuration like every other kernel, so each instantiation has one name.)
constexpr int kChunkTableThreads = 1024;

template <class Config>
__global__ void __launch_bounds__(kChunkTableThreads) gated_delta_chunk_table_kernel(const GatedDeltaParams p) {
  __shared__ int sums[kChunkTableThreads];
  const int thread = threadIdx.x;
  const int per_thread = (p.num_sequences + kChunkTableThreads - 1) / kChunkTableThreads;
  const int first = thread * per_thread;
  const int last = min(first + per_thread, p.num_sequences);
  int local = 0;
  for (int n = first; n < last; ++n) local += (p.cu_seqlens[n + 1] - p.cu_seqlens[n] + kGatedDeltaChunk - 1) / kGatedDeltaChunk;
  sums[thread] = local;
  __syncthreads();
  // Inclusive Hillis-Steele scan over the per-thread sums.
  for (int offset = 1; offset < kChunkTableThreads; offset <<= 1) {
    const int add = thread >= offset ? sums[thread - offset] : 0;
    __syncthreads();
    sums[thread] += add;
    __syncthreads();
  }
  int offset = sums[thread] - local;
  for (int n = first; n < last; ++n) {
    p.workspace.chunk_offsets[n] = offset;
    const int chunks = (p.cu_seqlens[n + 1] - p.cu_seqlens[n] + kGatedDeltaChunk - 1) / kGatedDeltaChunk;
    for (int c = 0; c < chunks && offset + c < p.max_chunks; ++c) p.workspace.chunk_sequence[offset + c] = n;
    offset += chunks;
  }
  const int total = sums[kChunkTableThreads - 1];
  if (thread == 0) p.workspace.chunk_offsets[p.num_sequences] = total;
  for (int c = total + thread; c < p.max_chunks; c += kChunkTableThreads) p.workspace.chunk_sequence[c] = -1;
}

// Normalises the 64 rows of `tile` in place to x / sqrt(|x|^2 + eps) and
// stores 1/sqrt(|x|^2 + eps) per row in `inverse_norms` (may be null). All
// kThreads threads call it; it begins and ends with a block barrier.
template <class Tile, int kThreads>
__device__ __forceinline__ void normalise_rows(__nv_bfloat16* tile, float* inverse_norms, int thread) {
  constexpr int kThreadsPerRow = kThreads / Tile::kRows;
  constexpr int kChunksPerThread = Tile::kChunksPerRow / kThreadsPerRow;
  static_assert(kThreadsPerRow * Tile::kRows == kThreads && kThreadsPerRow <= 32, "threads must split evenly over rows");
  const int row = thread / kThreadsPerRow;
  const int part = thread % kThreadsPerRow;
  __syncthreads();
  float values[kChunksPerThread][8];
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kChunksPerThread; ++c) {
    const uint4 raw = *reinterpret_cast<const uint4*>(tile + Tile::offset(row, (part * kChunksPerThread + c) * 8));
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      values[c][2 * i] = f.x;
      values[c][2 * i + 1] = f.y;
      sum += f.x * f.x + f.y * f.y;
    }
  }
#pragma unroll
  for (int offset = 1; offset < kThreadsPerRow; offset <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float inverse = rsqrtf(sum + kGatedDeltaNormEpsilon);
  if (inverse_norms != nullptr && part == 0) inverse_norms[row] = inverse;
#pragma unroll
  for (int c = 0; c < kChunksPerThread; ++c) {
    uint4 raw;
    unsigned* packed = reinterpret_cast<unsigned*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      packed[i] = ElementTraits<__nv_bfloat16>::pack(values[c][2 * i] * inverse, values[c][2 * i + 1] * inverse);
    *reinterpret_cast<uint4*>(tile + Tile::offset(row, (part * kChunksPerThread + c) * 8)) = raw;
  }
  __syncthreads();
}

// Inclusive sum over the values of threads 0..63 (thread i holds element i;
// other threads pass anything and get garbage). All threads of the block
// call it (it holds a barrier); `scratch` is one shared float.
__device__ __forceinline__ float chunk_inclusive_sum(float x, int thread, float* scratch) {
  const int lane = thread & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, x, offset);
    if (lane >= offset) x += y;
  }
  if (thread == 31) *scratch = x;
  __syncthreads();
  if (thread >= 32 && thread < 64) x += *scratch;
  __syncthreads();
  return x;
}

// The in-kernel gate of Qwen3.5: g = -exp(A_log) softplus(a + dt_bias).
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(__expf(x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// Log gate and beta of one (token, value head), as the configuration defines them.
template <class Config>
__device__ __forceinline__ void token_gate(const GatedDeltaParams& p, int token, int hv, float& gate, float& beta) {
  gate = 0.f;
  beta = 1.f;
  if constexpr (Config::kInKernelGate) {
    const float a = __bfloat162float(p.a[token * p.a_row_stride + hv]);
    gate = -__expf(p.a_log[hv]) * softplus(a + p.dt_bias[hv]);
    if constexpr (Config::kDeltaRule) beta = sigmoid(__bfloat162float(p.b[token * p.b_row_stride + hv]));
  } else {
    if constexpr (Config::kHasGate) gate = p.g[token * p.g_row_stride + hv];
    if constexpr (Config::kDeltaRule) beta = __bfloat162float(p.beta[token * p.beta_row_stride + hv]);
  }
}

// exp(x) through the hardware 2^x (relative error ~2^-22).
__device__ __forceinline__ float fast_exp(float x) { return fast_exp2(x * kLog2e); }

// Two consecutive 16-bit elements of a swizzled tile (col even) as floats.
template <class Tile>
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* tile, int row, int col) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(tile + Tile::offset(row, col)));
}

template <class Tile>
__device__ __forceinline__ void store_pair(__nv_bfloat16* tile, int row, int col, float x, float y) {
  *reinterpret_cast<unsigned*>(tile + Tile::offset(row, col)) = ElementTraits<__nv_bfloat16>::pack(x, y);
}

// Eight 16-bit elements (one 16-byte chunk) multiplied by `factor`.
__device__ __forceinline__ uint4 scale_chunk(uint4 raw, float factor) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
  uint4 out;
  unsigned* packed = reinterpret_cast<unsigned*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    packed[i] = ElementTraits<__nv_bfloat16>::pack(f.x * factor, f.y * factor);
  }
  return out;
}

// Multiplies each row r of a shared tile by factors[r]; rows are spread over
// kThreads threads in 16-byte chunks (no barrier inside).
template <class Tile, int kThreads>
__device__ __forceinline__ void scale_rows(__nv_bfloat16* tile, const float* factors, int thread) {
  constexpr int kChunks = Tile::kRows * Tile::kChunksPerRow;
  for (int c = thread; c < kChunks; c += kThreads) {
    const int row = c / Tile::kChunksPerRow, col = (c % Tile::kChunksPerRow) * 8;
    uint4* chunk = reinterpret_cast<uint4*>(tile + Tile::offset(row, col));
    *chunk = scale_chunk(*chunk, factors[row]);
  }
}

__device__ __forceinline__ void store_global_pair(__nv_bfloat16* address, float x, float y) {
  *reinterpret_cast<unsigned*>(address) = ElementTraits<__nv_bfloat16>::pack(x, y);
}

// The scalars on a state-kernel step's critical path, loaded a step ahead:
// chunk i's last cumulative gate and key_decay of a thread's two rows of a
// 16-row block at row0 (rows row0 + lane/4 and 8 below; 0 past the chunk).
struct StateStepScalars {
  float gate_last = 0.f;
  float key_decay[2] = {0.f, 0.f};
};

__device__ __forceinline__ StateStepScalars load_state_step_scalars(const GatedDeltaParams& p,
                                                                    const SequenceCoordinates& seq, int i, int hv,
                                                                    int row0, int lane) {
  const long long start = seq.chunk_start(i);
  const int rows = seq.chunk_rows(i);
  StateStepScalars scalars;
  scalars.gate_last = p.workspace.gate_cumsum[(start + rows - 1) * p.value_heads + hv];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + (lane >> 2) + 8 * half;
    if (row < rows) scalars.key_decay[half] = p.workspace.key_decay[(start + row) * p.value_heads + hv];
  }
  return scalars;
}

// Accumulator element positions of a warp's 16 x 8*kBlocksN tile: element
// (j, e) of acc[j][e] sits at row (lane/4) + 8*(e/2), column 8j + 2*(lane%4) + e%2.
__device__ __forceinline__ int fragment_row(int lane, int e) { return (lane >> 2) + ((e >> 1) << 3); }
__device__ __forceinline__ int fragment_col(int lane, int j, int e) { return 8 * j + 2 * (lane & 3) + (e & 1); }

// Adds to sums[h] this lane's share of the dot products between rows
// row0 + lane/4 + 8h of a warp's accumulator (16 x 8*kBlocksN at column col0)
// and the same positions of a tile; quad_sum completes a row.
template <class Tile, int kBlocksN>
__device__ __forceinline__ void add_row_dots(float (&sums)[2], const __nv_bfloat16* tile,
                                             const float (&acc)[kBlocksN][4], int row0, int col0, int lane) {
#pragma unroll
  for (int j = 0; j < kBlocksN; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 x = load_pair<Tile>(tile, row0 + fragment_row(lane, 2 * half), col0 + fragment_col(lane, j, 0));
      sums[half] += x.x * acc[j][2 * half] + x.y * acc[j][2 * half + 1];
    }
}

// P = scale lower(Q K^T o Gamma) for the 16 rows 16*warp.. of a chunk: one
// warp of the block writes its rows of `scores` (a ChunkTile) from the q and
// k tiles and the chunk's cumulative gates, and is then done with them.
template <class Config>
__device__ __forceinline__ void store_chunk_scores(__nv_bfloat16* scores, const __nv_bfloat16* queries,
                                                   const __nv_bfloat16* keys, const float* gates, float scale,
                                                   int warp, int lane) {
  using KeyTile = typename Config::KeyTile;
  using ChunkTile = typename Config::ChunkTile;
  float acc[8][4];
  zero(acc);
  warp_mma<__nv_bfloat16, 8, Config::kKeyDim / 16, false, false, KeyTile, KeyTile>(acc, queries, 16 * warp, 0, keys,
                                                                                   0, 0, lane);
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * warp + fragment_row(lane, 2 * half), col = fragment_col(lane, j, 0);
      const float x = col <= row ? scale * fast_exp(gates[row] - gates[col]) * acc[j][2 * half] : 0.f;
      const float y = col + 1 <= row ? scale * fast_exp(gates[row] - gates[col + 1]) * acc[j][2 * half + 1] : 0.f;
      store_pair<ChunkTile>(scores, row, col, x, y);
    }
  __syncwarp();
}

}  // namespace kernels
}  // namespace dflex
