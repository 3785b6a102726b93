// Attention forward: FlashAttention-2 style online softmax over the key tiles
// that the tile list gives for each query tile. Writes O and the natural-log
// LSE of every row; a row that sees no key gets O = 0 and LSE = -inf.
//
// Pipeline (Config::kPipeline, ForwardPipeline): the load of V(j) overlaps
// S = Q K(j)^T and the softmax; the load of K(j+1) overlaps O += P V(j), or
// the softmax too (kSharedQueryEarlyKey, a third barrier per key tile), or
// all of tile j (kRegisterQuery: Q's fragments stay in registers, so its
// shared memory serves a second K buffer).
#pragma once

#include "config.cuh"
#include "logits.cuh"
#include "params.cuh"
#include "variant.cuh"

namespace dflex {
namespace kernels {

// Grid: (ceil(q_len / kBlockM), q_heads, batch); Config::kThreads threads;
// Config::kSharedBytes of dynamic shared memory.
template <class Config, class Variant>
__global__ void __launch_bounds__(Config::kThreads)
    attention_forward_kernel(const AttentionForwardParams params, const Variant variant) {
  static_assert(VariantCheck<Variant>::kOk, "");
  using Element = typename Config::Element;
  using QTile = typename Config::QTile;
  using KVTile = typename Config::KVTile;
  constexpr int kHeadDim = Config::kHeadDim;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kThreads = Config::kThreads;
  constexpr int kScoreBlocks = kBlockN / 8;
  constexpr int kOutBlocks = kHeadDim / 8;
  constexpr int kMAtoms = Config::kMAtoms;

  constexpr ForwardPipeline kPipeline = Config::kPipeline;
  constexpr bool kRegisterQuery = Config::kRegisterQuery;
  extern __shared__ __align__(16) unsigned char shared_memory[];
  Element* const shared_base = reinterpret_cast<Element*>(shared_memory);
  // Config::kSharedBytes: Q, K, V; with kRegisterQuery K, second K, V, with Q over the last two.
  Element* const k_tile = kRegisterQuery ? shared_base : shared_base + kBlockM * kHeadDim;
  Element* const second_k_tile = k_tile + kBlockN * kHeadDim;  // kRegisterQuery only
  Element* const v_tile = kRegisterQuery ? second_k_tile + kBlockN * kHeadDim : k_tile + kBlockN * kHeadDim;
  Element* const q_tile = kRegisterQuery ? second_k_tile : shared_base;

  const AttentionShape& shape = params.shape;
  const int thread = threadIdx.x;
  const int lane = thread & 31;
  const int warp_row0 = (thread >> 5) * 16 * kMAtoms;
  // Later query tiles usually see more keys (causal, DFlash): start them first.
  const int query_tile = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / (shape.q_heads / shape.kv_heads);
  const int q_start = query_tile * kBlockM;
  const int q_rows = min(kBlockM, shape.q_len - q_start);
  const bool query_edge = q_rows < kBlockM;

  const Element* q = static_cast<const Element*>(params.q) + batch * params.q_strides.batch +
                     head * params.q_strides.head + q_start * params.q_strides.row;
  const Element* k =
      static_cast<const Element*>(params.k) + batch * params.k_strides.batch + kv_head * params.k_strides.head;
  const Element* v =
      static_cast<const Element*>(params.v) + batch * params.v_strides.batch + kv_head * params.v_strides.head;

  const int list_row = params.tiles.row(batch, head, query_tile);
  const int first = params.tiles.row_offsets[list_row];
  const int last = params.tiles.row_offsets[list_row + 1];

  async_load_tile<QTile, kThreads>(q_tile, q, params.q_strides.row, q_rows, thread);
  if (first < last) {
    const int kv_start = tile_entry_index(params.tiles.entries[first]) * kBlockN;
    async_load_tile<KVTile, kThreads>(k_tile, k + kv_start * params.k_strides.row, params.k_strides.row,
                                      min(kBlockN, shape.kv_len - kv_start), thread);
  }
  cp_async_commit();

  float out[kMAtoms][kOutBlocks][4];
  // Running row maxima (log2 units) and partial row sums of this thread's rows:
  // in m-atom m, warp_row0 + 16m + lane/4 ("upper", index 0) and 8 below.
  float row_max[kMAtoms][2];
  float row_sum[kMAtoms][2];
#pragma unroll
  for (int m = 0; m < kMAtoms; ++m) {
    zero(out[m]);
    row_max[m][0] = row_max[m][1] = negative_infinity();
    row_sum[m][0] = row_sum[m][1] = 0.f;
  }
  const LogitMap<Variant> logits(variant, batch, head, shape.scale);
  const float exponent_scale = logits.exponent_scale();
  const int thread_q = q_start + warp_row0 + (lane >> 2);
  // The mask's column parts of a checked key tile, per warp (LogitMap::stage_varying).
  using ColumnStage =
      VaryingPartsStage<Variant, false, kBlockN, Config::kWarps, portable_stage_bytes(Config::kSharedBytes)>;
  __shared__ ColumnStage column_stage;
  typename VisibilitySides<Variant, false>::Varying* warp_columns = column_stage.of_warp(thread >> 5);
  // The score_mod's column parts of each key tile, per warp (LogitMap::fetch_score_parts).
  using ScoreStage = ScorePartsStage<Variant, false, kBlockN, Config::kWarps,
                                      portable_stage_bytes(Config::kSharedBytes) - ColumnStage::kUsedBytes>;
  __shared__ ScoreStage score_column_stage;
  typename ScoreStage::Part* warp_score_columns = score_column_stage.of_warp(thread >> 5);
  typename LogitMap<Variant>::ScoreRow score_rows[kMAtoms][2];
#pragma unroll
  for (int m = 0; m < kMAtoms; ++m) logits.score_rows(thread_q + 16 * m, shape.q_len, score_rows[m]);

  // The K buffer of list entry `index` (kRegisterQuery: the two alternate).
  auto key_buffer = [&](int index) { return kRegisterQuery && ((index - first) & 1) ? second_k_tile : k_tile; };
  // K of the tile after `index` into its buffer, as its own cp.async group.
  auto load_next_keys = [&](int index) {
    if (index + 1 < last) {
      const int next_start = tile_entry_index(params.tiles.entries[index + 1]) * kBlockN;
      async_load_tile<KVTile, kThreads>(key_buffer(index + 1), k + next_start * params.k_strides.row,
                                        params.k_strides.row, min(kBlockN, shape.kv_len - next_start), thread);
    }
    cp_async_commit();
  };
  unsigned q_fragments[kRegisterQuery ? kMAtoms : 1][kRegisterQuery ? kHeadDim / 16 : 1][4];
  if constexpr (kRegisterQuery) {
    cp_async_wait<0>();  // Q and K(first) have landed
    __syncthreads();     // ... for every thread; the loop's first barrier frees Q's place
    load_a_fragments<QTile>(q_fragments, q_tile, warp_row0, lane);
  }

  for (int index = first; index < last; ++index) {
    const int entry = params.tiles.entries[index];
    const int kv_start = tile_entry_index(entry) * kBlockN;
    const int kv_rows = min(kBlockN, shape.kv_len - kv_start);

    cp_async_wait<0>();  // K(j) has landed
    __syncthreads();     // ... for every thread, and everyone is done with V(j-1)
    async_load_tile<KVTile, kThreads>(v_tile, v + kv_start * params.v_strides.row, params.v_strides.row, kv_rows,
                                      thread);
    cp_async_commit();
    if constexpr (kRegisterQuery) load_next_keys(index);  // into the buffer K(j - 1) left

    const bool checked = tile_entry_partial(entry) || query_edge || kv_rows < kBlockN;
    if (tile_entry_partial(entry)) logits.template stage_varying<kBlockN, false, ColumnStage::kUsed>(warp_columns, kv_start, shape.q_len, shape.kv_len, lane);
    typename ScoreStage::Fetched fetched;
    logits.template fetch_score_parts<false, kBlockN, ScoreStage::kUsed>(kv_start, shape.kv_len, lane, fetched);
    float scores[kMAtoms][kScoreBlocks][4];
#pragma unroll
    for (int m = 0; m < kMAtoms; ++m) zero(scores[m]);
    if constexpr (kRegisterQuery) {
      warp_mma_rows_from_fragments<Element, kMAtoms, kScoreBlocks, kHeadDim / 16, false, KVTile>(
          scores, q_fragments, key_buffer(index), 0, 0, lane);
    } else {
      warp_mma_rows<Element, kMAtoms, kScoreBlocks, kHeadDim / 16, false, false, QTile, KVTile>(
          scores, q_tile, warp_row0, 0, k_tile, 0, 0, lane);
    }
    if constexpr (kPipeline == ForwardPipeline::kSharedQueryEarlyKey) {
      __syncthreads();  // every warp has read K(j): fetch K(j + 1) under the softmax and O += P V(j)
      load_next_keys(index);
    }

    logits.template store_score_parts<kBlockN, ScoreStage::kUsed>(fetched, lane, warp_score_columns);
#pragma unroll
    for (int m = 0; m < kMAtoms; ++m) {
      logits.template apply<ColumnStage::kUsed, ScoreStage::kUsed>(
          scores[m], checked, tile_entry_partial(entry), score_rows[m], thread_q + 16 * m, kv_start + 2 * (lane & 3),
          shape.q_len, shape.kv_len, warp_columns + 2 * (lane & 3), warp_score_columns + 2 * (lane & 3));
      // Online softmax, the exponent bases moved lazily (move_exponent_bases).
      float tile_max[2];
      exponent_tile_max(scores[m], row_max[m], exponent_scale, tile_max);
      float correction[2];
      if (move_exponent_bases(row_max[m], tile_max, correction)) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          row_sum[m][half] *= correction[half];
#pragma unroll
          for (int j = 0; j < kOutBlocks; ++j) {
            out[m][j][2 * half] *= correction[half];
            out[m][j][2 * half + 1] *= correction[half];
          }
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float base = exponent_base(row_max[m][half]);
#pragma unroll
        for (int j = 0; j < kScoreBlocks; ++j) {
          scores[m][j][2 * half] = fast_exp2(fmaf(scores[m][j][2 * half], exponent_scale, -base));
          scores[m][j][2 * half + 1] = fast_exp2(fmaf(scores[m][j][2 * half + 1], exponent_scale, -base));
          row_sum[m][half] += scores[m][j][2 * half] + scores[m][j][2 * half + 1];
        }
      }
    }

    constexpr bool kKeysAhead = kPipeline != ForwardPipeline::kSharedQuery;  // K(j + 1) committed after V(j)
    cp_async_wait<kKeysAhead ? 1 : 0>();  // V(j) has landed (K(j + 1) may be in flight)
    __syncthreads();                      // ... for every thread, and everyone is done with K(j)
    if constexpr (!kKeysAhead) load_next_keys(index);

    // O += P V, P taken straight from the score accumulators.
    warp_mma_from_accumulators<Element, KVTile>(out, scores, v_tile, lane);
  }

  float inverse_sum[kMAtoms][2];
#pragma unroll
  for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float total = quad_sum(row_sum[m][half]);
      inverse_sum[m][half] = total > 0.f ? 1.f / total : 0.f;
      const int q_index = thread_q + 16 * m + 8 * half;
      if ((lane & 3) == 0 && q_index < shape.q_len) {
        params.lse[(static_cast<long long>(batch) * shape.q_heads + head) * shape.q_len + q_index] =
            total > 0.f ? (row_max[m][half] + log2f(total)) * kLn2 : negative_infinity();
      }
    }
  }

  // Stage O through the Q buffer for 16-byte stores.
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kMAtoms; ++m) {
    store_accumulator<QTile>(q_tile, out[m], inverse_sum[m][0], inverse_sum[m][1], warp_row0 + 16 * m, 0, lane);
  }
  __syncthreads();
  Element* o = static_cast<Element*>(params.o) + batch * params.o_strides.batch + head * params.o_strides.head +
               q_start * params.o_strides.row;
  store_tile<QTile, kThreads>(o, params.o_strides.row, q_tile, q_rows, thread);
}

}  // namespace kernels
}  // namespace dflex
