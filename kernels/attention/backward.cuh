// Attention backward without a score matrix in memory. Three launches:
//   1. attention_backward_preprocess_kernel: delta = rowsum(dO * O), and zero
//      the fp32 dQ accumulator.
//   2. attention_backward_kernel: per key tile, recompute P from Q, K and the
//      forward LSE for every query tile that sees it (all query heads of the
//      group), accumulate dV (half the warps) and dK (the other half) in
//      registers, add dS K into the dQ accumulator with fp32 vector
//      reductions (columns grouped as the threads hold them:
//      portable_grad_q_column).
//   3. attention_backward_grad_q_kernel: dQ accumulator -> dQ in Element.
// Without the accumulator (attention_backward_grad_q_pass_kernel below): the
// preprocess computes only delta, the main kernel only dK and dV, and a pass
// over the query tiles recomputes S and dP for dQ.
// With logit = score_mod(scale * q.k):
//   dP = dO V^T, dS = P * (dP - delta) * d logit / d(q.k),
//   dV = P^T dO, dK = dS^T Q, dQ = dS K.
#pragma once

#include "config.cuh"
#include "logits.cuh"
#include "params.cuh"
#include "variant.cuh"

namespace dflex {
namespace kernels {

// Index of one (batch, query head, query) row in the row-major
// [B, q_heads, q_len] layout of LSE, delta and the dQ accumulator.
struct QueryRow {
  int batch;
  int head;
  int q;
  long long flat;

  __device__ __forceinline__ static QueryRow at(long long flat, const AttentionShape& shape) {
    QueryRow row;
    row.flat = flat;
    row.q = static_cast<int>(flat % shape.q_len);
    row.head = static_cast<int>((flat / shape.q_len) % shape.q_heads);
    row.batch = static_cast<int>(flat / (static_cast<long long>(shape.q_len) * shape.q_heads));
    return row;
  }
  // The row of this thread's warp in a row kernel.
  __device__ __forceinline__ static QueryRow of_warp(const AttentionShape& shape) {
    static_assert(kRowKernelRowsPerWarp == 1, "the row kernels take one row a warp");
    return at(static_cast<long long>(blockIdx.x) * kRowKernelRows + (threadIdx.x >> 5), shape);
  }
};

// The offset a backward takes P = exp2(logit - offset) against, from a
// row's forward LSE: +inf for a row that saw nothing (LSE -inf), so that its
// P is 0.
__device__ __forceinline__ float lse_exponent_offset(float lse) {
  return lse == negative_infinity() ? positive_infinity() : lse * kLog2e;
}

// Grid: ceil(batch * q_heads * q_len / kRowKernelRows); kRowKernelThreads threads.
// kZeroAccumulator = false leaves the accumulator alone (the dQ pass needs none).
template <class Config, bool kZeroAccumulator = true>
__global__ void __launch_bounds__(kRowKernelThreads) attention_backward_preprocess_kernel(const AttentionBackwardParams params) {
  using Element = typename Config::Element;
  constexpr int kHeadDim = Config::kHeadDim;
  const AttentionShape& shape = params.shape;
  const QueryRow row = QueryRow::of_warp(shape);
  if (row.batch >= shape.batch) return;
  const int lane = threadIdx.x & 31;

  const Element* o = static_cast<const Element*>(params.o) + row.batch * params.o_strides.batch +
                     row.head * params.o_strides.head + row.q * params.o_strides.row;
  const Element* grad_o = static_cast<const Element*>(params.grad_o) + row.batch * params.grad_o_strides.batch +
                          row.head * params.grad_o_strides.head + row.q * params.grad_o_strides.row;
  float sum = 0.f;
#pragma unroll
  for (int col = lane; col < kHeadDim; col += 32) {
    sum += ElementTraits<Element>::to_float(o[col]) * ElementTraits<Element>::to_float(grad_o[col]);
  }
  sum = warp_sum(sum);
  if (lane == 0) params.delta[row.flat] = sum;

  if constexpr (kZeroAccumulator) {
    float4* accum = reinterpret_cast<float4*>(params.grad_q_accum + row.flat * kHeadDim);
#pragma unroll
    for (int i = lane; i < kHeadDim / 4; i += 32) accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The accumulator holds each 16-column group of a
// row as the quads the backward adds: the thread of quad lane t holds columns
// 2t, 2t + 1 of both 8-column blocks, stored at 4t .. 4t + 3. The first of
// the two dQ columns whose accumulator quad starts at `position` (a multiple
// of 4); the other pair is 8 columns on.
__device__ __forceinline__ int portable_grad_q_column(int position) {
  return (position & ~15) | ((position & 15) >> 1);
}

// Grid: ceil(batch * q_heads * q_len / kRowKernelRows); kRowKernelThreads threads.
template <class Config>
__global__ void __launch_bounds__(kRowKernelThreads) attention_backward_grad_q_kernel(const AttentionBackwardParams params) {
  using Element = typename Config::Element;
  constexpr int kHeadDim = Config::kHeadDim;
  const AttentionShape& shape = params.shape;
  const QueryRow row = QueryRow::of_warp(shape);
  if (row.batch >= shape.batch) return;
  const int lane = threadIdx.x & 31;

  const float* accum = params.grad_q_accum + row.flat * kHeadDim;
  Element* grad_q = static_cast<Element*>(params.grad_q) + row.batch * params.grad_q_strides.batch +
                    row.head * params.grad_q_strides.head + row.q * params.grad_q_strides.row;
#pragma unroll
  for (int quad = lane; quad < kHeadDim / 4; quad += 32) {
    const float4 value = reinterpret_cast<const float4*>(accum)[quad];
    const int col = portable_grad_q_column(4 * quad);
    *reinterpret_cast<unsigned*>(grad_q + col) = ElementTraits<Element>::pack(value.x, value.y);
    *reinterpret_cast<unsigned*>(grad_q + col + 8) = ElementTraits<Element>::pack(value.z, value.w);
  }
}

// P and, in place of dP, dS = P * (dP - delta) * d logit / d(q.k) of a warp's
// score fragments: element (j, i) is the pair (q0 + 8 * (i / 2), kv0 + 8 * j +
// i % 2). kChecked hides the pairs whose bit in `shown` (LogitMap::visibility)
// is clear and evaluates the score_mod on the pair clamped into range; the
// caller picks the instantiation once per tile. Selects, not branches.
template <bool kChecked, class Variant, int kBlocks>
__device__ __forceinline__ void backward_gradients(const LogitMap<Variant>& logits, unsigned long long shown, int q0,
                                                   int kv0, const AttentionShape& shape, const float (&lse_log2)[2],
                                                   const float (&delta)[2], float (&scores)[kBlocks][4],
                                                   float (&grad_p)[kBlocks][4]) {
  using Logits = LogitMap<Variant>;
  auto row_of = [&](int q) { return kChecked ? min(q, shape.q_len - 1) : q; };
  auto column_of = [&](int kv) { return kChecked ? min(kv, shape.kv_len - 1) : kv; };
  // The score parts of the thread's two rows once, of each column pair once
  // per key block, and of each distance once (as LogitMap::apply_shown).
  // The distances are the unclamped pairs': a clamped pair is hidden.
  const typename Logits::ScoreRow rows[2] = {logits.score_row(row_of(q0)), logits.score_row(row_of(q0 + 8))};
  // Rolled here rather than by LogitMap::BlockDistances, whose form made this
  // kernel 3% slower (relative_bias, sm_120's configs on an H100).
  const int distance0 = q0 - kv0;
  typename Logits::ScoreDistance second_row[2] = {logits.score_distance(distance0 + 8),
                                                  logits.score_distance(distance0 + 7)};
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
    const typename Logits::ScoreColumn columns[2] = {logits.score_column(column_of(kv0 + 8 * j)),
                                                     logits.score_column(column_of(kv0 + 8 * j + 1))};
    const typename Logits::ScoreDistance first_row[2] = {logits.score_distance(distance0 - 8 * j),
                                                         logits.score_distance(distance0 - 8 * j - 1)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const typename Logits::ScoreDistance& distance = (i >> 1) ? second_row[i & 1] : first_row[i & 1];
      const float p =
          fast_exp2(logits.logit(scores[j][i], rows[i >> 1], columns[i & 1], distance) - lse_log2[i >> 1]);
      const float grad_s = p * (grad_p[j][i] - delta[i >> 1]) *
                           logits.logit_grad(scores[j][i], rows[i >> 1], columns[i & 1], distance);
      const bool visible = !kChecked || ((shown >> (4 * j + i)) & 1);
      scores[j][i] = visible ? p : 0.f;
      grad_p[j][i] = visible ? grad_s : 0.f;
    }
    second_row[0] = first_row[0];
    second_row[1] = first_row[1];
  }
}

// Grid: (ceil(kv_len / kBlockN), kv_heads, batch); Config::kThreads threads;
// Config::kSharedBytes of dynamic shared memory. Needs the preprocess kernel
// to have run (delta, zeroed accumulator) and the backward tile list.
// kGradQ = false leaves dQ out (no accumulator): attention_backward_grad_q_pass_kernel computes it.
template <class Config, class Variant, bool kGradQ = true>
__global__ void __launch_bounds__(Config::kThreads)
    attention_backward_kernel(const AttentionBackwardParams params, const Variant variant) {
  static_assert(VariantCheck<Variant>::kOk, "");
  using Element = typename Config::Element;
  using QTile = typename Config::QTile;
  using KVTile = typename Config::KVTile;
  using ScoreTile = typename Config::ScoreTile;
  constexpr int kHeadDim = Config::kHeadDim;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kThreads = Config::kThreads;
  constexpr int kScoreBlocks = Config::kScoreCols / 8;
  constexpr int kKeyBlocks = Config::kKeyCols / 8;
  constexpr int kKeyMAtoms = Config::kKeyMAtoms;
  constexpr int kQueryMAtoms = Config::kQueryMAtoms;
  constexpr int kChunkBlocks = Config::kGradQChunk / 8;

  extern __shared__ __align__(16) unsigned char shared_memory[];
  Element* k_tile = reinterpret_cast<Element*>(shared_memory);
  Element* v_tile = k_tile + kBlockN * kHeadDim;
  Element* q_tile = v_tile + kBlockN * kHeadDim;
  Element* grad_o_tile = q_tile + kBlockM * kHeadDim;
  Element* p_tile = grad_o_tile + kBlockM * kHeadDim;
  Element* grad_s_tile = p_tile + kBlockM * kBlockN;
  float* lse_tile = reinterpret_cast<float*>(grad_s_tile + kBlockM * kBlockN);
  float* delta_tile = lse_tile + kBlockM;

  const AttentionShape& shape = params.shape;
  const int thread = threadIdx.x;
  const int lane = thread & 31;
  const int warp = thread >> 5;
  const int score_row0 = (warp / Config::kScoreWarpsN) * 16;
  const int score_col0 = (warp % Config::kScoreWarpsN) * Config::kScoreCols;
  const bool value_warp = warp < Config::kProductWarps;  // accumulates dV; the others dK
  const int product_warp = value_warp ? warp : warp - Config::kProductWarps;
  const int key_row0 = (product_warp / Config::kKeyWarpsN) * 16 * kKeyMAtoms;
  const int key_col0 = (product_warp % Config::kKeyWarpsN) * Config::kKeyCols;
  const int query_row0 = (warp / Config::kQueryWarpsN) * 16 * kQueryMAtoms;
  const int query_col0 = (warp % Config::kQueryWarpsN) * Config::kQueryCols;

  const int key_tile = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int batch = blockIdx.z;
  const int group = shape.q_heads / shape.kv_heads;
  const int first_head = kv_head * group;
  const int kv_start = key_tile * kBlockN;
  const int kv_rows = min(kBlockN, shape.kv_len - kv_start);

  const Element* k = static_cast<const Element*>(params.k) + batch * params.k_strides.batch +
                     kv_head * params.k_strides.head + kv_start * params.k_strides.row;
  const Element* v = static_cast<const Element*>(params.v) + batch * params.v_strides.batch +
                     kv_head * params.v_strides.head + kv_start * params.v_strides.row;
  async_load_tile<KVTile, kThreads>(k_tile, k, params.k_strides.row, kv_rows, thread);
  async_load_tile<KVTile, kThreads>(v_tile, v, params.v_strides.row, kv_rows, thread);

  // Work cursor: query head first_head + head_offset, tile-list entry `index`
  // of that head's row, which ends at `last`. `entry` is entries[index], read
  // when its tile's loads were issued; `ahead` is entries[index + 1], read
  // one tile early so that no load of the list stalls the loop.
  int head_offset = 0;
  int index = 0;
  int last = 0;
  int entry = 0;
  int ahead = 0;
  // The open head's Q, dO and first (LSE, delta, dQ accumulator) row.
  const Element* head_q = nullptr;
  const Element* head_grad_o = nullptr;
  long long head_row = 0;
  auto open_row = [&](int offset) {
    const int head = first_head + offset;
    const int list_row = params.tiles.row(batch, head, key_tile);
    index = params.tiles.row_offsets[list_row];
    last = params.tiles.row_offsets[list_row + 1];
    head_q = static_cast<const Element*>(params.q) + batch * params.q_strides.batch + head * params.q_strides.head;
    head_grad_o = static_cast<const Element*>(params.grad_o) + batch * params.grad_o_strides.batch +
                  head * params.grad_o_strides.head;
    head_row = (static_cast<long long>(batch) * shape.q_heads + head) * shape.q_len;
  };
  auto skip_empty_rows = [&]() {
    while (index == last && head_offset + 1 < group) open_row(++head_offset);
  };
  auto load_queries = [&](int next_entry) {
    entry = next_entry;
    const int q_start = tile_entry_index(entry) * kBlockM;
    const int q_rows = min(kBlockM, shape.q_len - q_start);
    async_load_tile<QTile, kThreads>(q_tile, head_q + q_start * params.q_strides.row, params.q_strides.row, q_rows,
                                     thread);
    async_load_tile<QTile, kThreads>(grad_o_tile, head_grad_o + q_start * params.grad_o_strides.row,
                                     params.grad_o_strides.row, q_rows, thread);
    const long long row_base = head_row + q_start;
    // LSE, then delta, of the tile's rows, copied like the tiles so that no
    // thread waits on a global load here. Rows past q_len are zero-filled:
    // their pairs are out of range, hence never visible.
#pragma unroll
    for (int pass = 0; pass < (2 * kBlockM + kThreads - 1) / kThreads; ++pass) {
      const int i = thread + pass * kThreads;
      if (i < 2 * kBlockM) {
        const int row = i % kBlockM;
        const float* source = (i < kBlockM ? params.lse : params.delta) + row_base + row;
        cp_async_4(shared_address(lse_tile + i), source, row < q_rows);
      }
    }
  };
  open_row(0);
  skip_empty_rows();
  if (index < last) load_queries(params.tiles.entries[index]);
  cp_async_commit();

  float grad_kv[kKeyMAtoms][kKeyBlocks][4];  // this warp's part of dV or dK
  zero(grad_kv);
  // The mask's parts of this warp's score columns (LogitMap::stage_varying):
  // the block's keys are fixed, so they change only with the query head.
  using ColumnStage = VaryingPartsStage<Variant, false, Config::kScoreCols, Config::kWarps,
                                        portable_stage_bytes(Config::kSharedBytes)>;
  __shared__ ColumnStage column_stage;
  typename ColumnStage::Part* const warp_columns = column_stage.of_warp(warp);
  int staged_head = -1;  // the query head whose column parts warp_columns holds

  while (index < last) {
    const int head = first_head + head_offset;
    const int q_start = tile_entry_index(entry) * kBlockM;
    const bool partial = tile_entry_partial(entry);
    const long long current_row = head_row;  // head_row moves on when the next tile is in another head
    if (index + 1 < last) ahead = params.tiles.entries[index + 1];
    // With a score_mod every tile takes the checked code: the score_mod's work
    // per pair dwarfs the select, and a second copy costs NVRTC time.
    const bool checked =
        Variant::kHasScoreMod || partial || q_start + kBlockM > shape.q_len || kv_rows < kBlockN;
    const LogitMap<Variant> logits(variant, batch, head, shape.scale);
    const int thread_q = q_start + score_row0 + (lane >> 2);
    const int thread_kv = kv_start + score_col0 + 2 * (lane & 3);
    // Positions only: worked out before the products, while fewer registers are live.
    if (partial && head != staged_head) {
      logits.template stage_varying<Config::kScoreCols, false, ColumnStage::kUsed>(
          warp_columns, kv_start + score_col0, shape.q_len, shape.kv_len, lane);
      staged_head = head;
    }
    const unsigned long long shown =
        checked ? logits.template visibility<kScoreBlocks, false, ColumnStage::kUsed>(
                      partial, thread_q, thread_kv, shape.q_len, shape.kv_len, warp_columns + 2 * (lane & 3))
                : ~0ull;

    cp_async_wait<0>();  // Q, dO, LSE, delta (and on the first pass K, V) have landed
    __syncthreads();     // ... for every thread, and everyone is done with the previous dS

    float scores[kScoreBlocks][4];
    float grad_p[kScoreBlocks][4];
    zero(scores);
    zero(grad_p);
    warp_mma_two<Element, kScoreBlocks, kHeadDim / 16, QTile, KVTile>(scores, q_tile, k_tile, grad_p, grad_o_tile,
                                                                     v_tile, score_row0, score_col0, lane);

    // P and dS in place of the score and dP accumulators.
    const int row_upper = score_row0 + (lane >> 2);
    const float row_lse[2] = {lse_exponent_offset(lse_tile[row_upper]), lse_exponent_offset(lse_tile[row_upper + 8])};
    const float row_delta[2] = {delta_tile[row_upper], delta_tile[row_upper + 8]};
    if (checked) {
      backward_gradients<true>(logits, shown, thread_q, thread_kv, shape, row_lse, row_delta, scores, grad_p);
    } else {
      backward_gradients<false>(logits, shown, thread_q, thread_kv, shape, row_lse, row_delta, scores, grad_p);
    }
    store_accumulator<ScoreTile>(p_tile, scores, 1.f, 1.f, score_row0, score_col0, lane);
    store_accumulator<ScoreTile>(grad_s_tile, grad_p, 1.f, 1.f, score_row0, score_col0, lane);
    __syncthreads();

    // dV += P^T dO on the value warps, dK += dS^T Q on the others.
    warp_mma_rows<Element, kKeyMAtoms, kKeyBlocks, kBlockM / 16, true, true, ScoreTile, QTile>(
        grad_kv, value_warp ? p_tile : grad_s_tile, key_row0, 0, value_warp ? grad_o_tile : q_tile, key_col0, 0,
        lane);
    __syncthreads();  // Q, dO, LSE and delta buffers are free: fetch the next query tile

    ++index;
    const bool same_row = index < last;
    skip_empty_rows();
    if (index < last) load_queries(same_row ? ahead : params.tiles.entries[index]);
    cp_async_commit();

    if constexpr (kGradQ) {
      // dQ += dS K, straight into the fp32 accumulator of (head, q_start). One
      // address register and constant offsets for all of a thread's reductions:
      // a reduction holds its registers until the memory pipe has read them.
      float* thread_accum =
          params.grad_q_accum + (current_row + q_start + query_row0 + (lane >> 2)) * kHeadDim + query_col0 +
          4 * (lane & 3);
      const int rows_left = shape.q_len - (q_start + query_row0 + (lane >> 2));  // > row offset: in range
#pragma unroll
      for (int chunk = 0; chunk < Config::kQueryCols / Config::kGradQChunk; ++chunk) {
        const int col0 = query_col0 + chunk * Config::kGradQChunk;
        float grad_q[kQueryMAtoms][kChunkBlocks][4];
        zero(grad_q);
        warp_mma_rows<Element, kQueryMAtoms, kChunkBlocks, kBlockN / 16, false, true, ScoreTile, KVTile>(
            grad_q, grad_s_tile, query_row0, 0, k_tile, col0, 0, lane);
        keep_in_register(thread_accum);  // not recomputed per row block
#pragma unroll
        for (int m = 0; m < kQueryMAtoms; ++m) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row_offset = 16 * m + 8 * half;
            if (row_offset < rows_left) {
              float* row_accum = thread_accum + row_offset * kHeadDim + chunk * Config::kGradQChunk;
              // Column blocks 2p and 2p + 1 of the thread's pairs as one quad
              // (portable_grad_q_column).
#pragma unroll
              for (int p = 0; p < kChunkBlocks / 2; ++p) {
                global_add_quad(row_accum + 16 * p, grad_q[m][2 * p][2 * half], grad_q[m][2 * p][2 * half + 1],
                                grad_q[m][2 * p + 1][2 * half], grad_q[m][2 * p + 1][2 * half + 1]);
              }
            }
          }
        }
      }
    }
  }

  // Stage dK and dV through the K and V buffers for 16-byte stores.
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kKeyMAtoms; ++m) {
    store_accumulator<KVTile>(value_warp ? v_tile : k_tile, grad_kv[m], 1.f, 1.f, key_row0 + 16 * m, key_col0, lane);
  }
  __syncthreads();
  Element* grad_k_out = static_cast<Element*>(params.grad_k) + batch * params.grad_k_strides.batch +
                        kv_head * params.grad_k_strides.head + kv_start * params.grad_k_strides.row;
  Element* grad_v_out = static_cast<Element*>(params.grad_v) + batch * params.grad_v_strides.batch +
                        kv_head * params.grad_v_strides.head + kv_start * params.grad_v_strides.row;
  store_tile<KVTile, kThreads>(grad_k_out, params.grad_k_strides.row, k_tile, kv_rows, thread);
  store_tile<KVTile, kThreads>(grad_v_out, params.grad_v_strides.row, v_tile, kv_rows, thread);
}

// dQ without the fp32 accumulator: one block per query tile, as the forward
// (Config is a forward config with 16 query rows per warp, `tiles` the forward
// tile list of its tile sizes), S and dP recomputed for every listed key tile
// and dQ = sum dS K held in registers; with attention_backward_kernel<...,
// false> it replaces the accumulator, its zeroing and its conversion by three
// more products per visible tile. Needs the preprocess kernel's delta.
// Grid: (ceil(q_len / kBlockM), q_heads, batch); Config::kThreads threads;
// kGradQPassSharedBytes<Config> of dynamic shared memory.
template <class Config>
constexpr int kGradQPassSharedBytes = Config::kSharedBytes + Config::QTile::kBytes;  // Q, K, V and dO

template <class Config, class Variant>
__global__ void __launch_bounds__(Config::kThreads)
    attention_backward_grad_q_pass_kernel(const AttentionBackwardParams params, const TileList tiles,
                                          const Variant variant) {
  static_assert(VariantCheck<Variant>::kOk, "");
  static_assert(Config::kMAtoms == 1, "the dQ pass gives each warp 16 query rows");
  static_assert(kGradQPassSharedBytes<Config> <= kMaxSharedMemoryPerBlock,
                "dQ pass config exceeds sm_120 shared memory per block");
  using Element = typename Config::Element;
  using QTile = typename Config::QTile;
  using KVTile = typename Config::KVTile;
  constexpr int kHeadDim = Config::kHeadDim;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kThreads = Config::kThreads;
  constexpr int kScoreBlocks = kBlockN / 8;
  constexpr int kOutBlocks = kHeadDim / 8;

  extern __shared__ __align__(16) unsigned char shared_memory[];
  Element* q_tile = reinterpret_cast<Element*>(shared_memory);
  Element* k_tile = q_tile + kBlockM * kHeadDim;
  Element* v_tile = k_tile + kBlockN * kHeadDim;
  Element* grad_o_tile = v_tile + kBlockN * kHeadDim;

  const AttentionShape& shape = params.shape;
  const int thread = threadIdx.x;
  const int lane = thread & 31;
  const int warp_row0 = (thread >> 5) * 16;
  const int query_tile = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / (shape.q_heads / shape.kv_heads);
  const int q_start = query_tile * kBlockM;
  const int q_rows = min(kBlockM, shape.q_len - q_start);
  const bool query_edge = q_rows < kBlockM;

  const int list_row = tiles.row(batch, head, query_tile);
  const int first = tiles.row_offsets[list_row];
  const int last = tiles.row_offsets[list_row + 1];
  auto load_keys = [&](int index) {
    const int kv_start = tile_entry_index(tiles.entries[index]) * kBlockN;
    const int kv_rows = min(kBlockN, shape.kv_len - kv_start);
    async_load_tile<KVTile, kThreads>(k_tile, tensor_row<Element>(params.k, params.k_strides, batch, kv_head, kv_start),
                                      params.k_strides.row, kv_rows, thread);
    async_load_tile<KVTile, kThreads>(v_tile, tensor_row<Element>(params.v, params.v_strides, batch, kv_head, kv_start),
                                      params.v_strides.row, kv_rows, thread);
  };
  async_load_tile<QTile, kThreads>(q_tile, tensor_row<Element>(params.q, params.q_strides, batch, head, q_start),
                                   params.q_strides.row, q_rows, thread);
  async_load_tile<QTile, kThreads>(grad_o_tile,
                                   tensor_row<Element>(params.grad_o, params.grad_o_strides, batch, head, q_start),
                                   params.grad_o_strides.row, q_rows, thread);
  if (first < last) load_keys(first);
  cp_async_commit();

  // LSE (as the exponent offset) and delta of the thread's two rows; a row
  // past q_len or one that sees nothing gets P = 0.
  const int thread_q = q_start + warp_row0 + (lane >> 2);
  const long long row_base = (static_cast<long long>(batch) * shape.q_heads + head) * shape.q_len;
  float row_lse[2];
  float row_delta[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int q = thread_q + 8 * half;
    row_lse[half] = lse_exponent_offset(q < shape.q_len ? params.lse[row_base + q] : negative_infinity());
    row_delta[half] = q < shape.q_len ? params.delta[row_base + q] : 0.f;
  }

  float grad_q[1][kOutBlocks][4];
  zero(grad_q);
  const LogitMap<Variant> logits(variant, batch, head, shape.scale);
  using ColumnStage =
      VaryingPartsStage<Variant, false, kBlockN, Config::kWarps, portable_stage_bytes(kGradQPassSharedBytes<Config>)>;
  __shared__ ColumnStage column_stage;
  typename VisibilitySides<Variant, false>::Varying* warp_columns = column_stage.of_warp(thread >> 5);

  for (int index = first; index < last; ++index) {
    const int entry = tiles.entries[index];
    const int kv_start = tile_entry_index(entry) * kBlockN;
    const int kv_rows = min(kBlockN, shape.kv_len - kv_start);
    const bool partial = tile_entry_partial(entry);
    const bool checked = Variant::kHasScoreMod || partial || query_edge || kv_rows < kBlockN;
    const int thread_kv = kv_start + 2 * (lane & 3);
    if (partial) {
      logits.template stage_varying<kBlockN, false, ColumnStage::kUsed>(warp_columns, kv_start, shape.q_len,
                                                                        shape.kv_len, lane);
    }
    const unsigned long long shown =
        checked ? logits.template visibility<kScoreBlocks, false, ColumnStage::kUsed>(
                      partial, thread_q, thread_kv, shape.q_len, shape.kv_len, warp_columns + 2 * (lane & 3))
                : ~0ull;

    cp_async_wait<0>();  // K and V (and on the first pass Q and dO) have landed
    __syncthreads();     // ... for every thread

    float scores[kScoreBlocks][4];
    float grad_p[1][kScoreBlocks][4];  // one m-atom: the A operand of the dQ product
    zero(scores);
    zero(grad_p);
    warp_mma_two<Element, kScoreBlocks, kHeadDim / 16, QTile, KVTile>(scores, q_tile, k_tile, grad_p[0], grad_o_tile,
                                                                     v_tile, warp_row0, 0, lane);
    if (checked) {
      backward_gradients<true>(logits, shown, thread_q, thread_kv, shape, row_lse, row_delta, scores, grad_p[0]);
    } else {
      backward_gradients<false>(logits, shown, thread_q, thread_kv, shape, row_lse, row_delta, scores, grad_p[0]);
    }

    // dQ += dS K, dS taken straight from the dP accumulators.
    warp_mma_from_accumulators<Element, KVTile>(grad_q, grad_p, k_tile, lane);

    __syncthreads();  // everyone is done with K and V
    if (index + 1 < last) load_keys(index + 1);
    cp_async_commit();
  }

  // Stage dQ through the Q buffer for 16-byte stores.
  cp_async_wait<0>();
  __syncthreads();
  store_accumulator<QTile>(q_tile, grad_q[0], 1.f, 1.f, warp_row0, 0, lane);
  __syncthreads();
  store_tile<QTile, kThreads>(tensor_row<Element>(params.grad_q, params.grad_q_strides, batch, head, q_start),
                              params.grad_q_strides.row, q_tile, q_rows, thread);
}

}  // namespace kernels
}  // namespace dflex
