// Attention backward for Hopper (sm_90a): the semantics, parameters, tile list
// and variant contract of attention_backward_kernel (../backward.cuh),
// FlashAttention-3 style. Three launches, in this order on one stream:
//   1. attention_backward_preprocess_kernel<Config> (../backward.cuh):
//      delta = rowsum(dO * O), zeroes the fp32 dQ accumulator.
//   2. attention_backward_sm90_kernel<Config, Variant>: one block per key tile
//      (see Sm90AttentionBackwardConfig). dK and dV accumulate in registers;
//      each query tile's dQ goes to the accumulator by bulk reduction
//      (cp.reduce.async.bulk .add.f32) issued by the producer warpgroup.
//   3. attention_backward_grad_q_sm90_kernel<Config>: accumulator -> dQ.
// The accumulator holds each query row's dQ with its 16-byte chunks permuted
// by q % 8 (sm90_grad_q_column), which makes staging the wgmma accumulators in
// shared memory free of bank conflicts; only kernels 2 and 3 read it.
#pragma once

#include "../backward.cuh"
#include "../logits.cuh"
#include "../params.cuh"
#include "../variant.cuh"
#include "config.cuh"

namespace dflex {
namespace kernels {

// Position of dQ element (q, col) inside its row of the sm90 accumulator:
// 4-float chunk col / 4 moves to chunk (col / 4) ^ (q % 8).
__device__ __forceinline__ int sm90_grad_q_column(int q, int col) { return ((((col >> 2) ^ (q & 7))) << 2) | (col & 3); }

// Shared-memory map of the backward (Config's offsets from the aligned base).
template <class Config>
struct Sm90BackwardSharedMap {
  unsigned base;  // 1024-byte aligned shared-window address
  __device__ __forceinline__ unsigned k_tile() const { return base + Config::kKOffset; }
  __device__ __forceinline__ unsigned v_tile() const { return base + Config::kVOffset; }
  __device__ __forceinline__ unsigned q_tile(int stage) const {
    return base + Config::kQOffset + stage * Config::QTile::kBytes;
  }
  __device__ __forceinline__ unsigned grad_o_tile(int stage) const {
    return base + Config::kGradOOffset + stage * Config::QTile::kBytes;
  }
  __device__ __forceinline__ unsigned grad_s_tile(int buffer) const {
    return base + Config::kGradSOffset + buffer * Config::GradSTile::kBytes;
  }
  // fp32 dQ (partial `partial`) of query tile i lives in buffer i % kStages until its reduction has read it.
  __device__ __forceinline__ unsigned grad_q_tile(int stage, int partial) const {
    return base + Config::kGradQOffset + (stage * Config::kGradQPartials + partial) * Config::kGradQBytes;
  }
  __device__ __forceinline__ unsigned lse(int stage) const { return base + Config::kLseOffset + stage * Config::kBlockM * 4; }
  __device__ __forceinline__ unsigned delta(int stage) const {
    return base + Config::kDeltaOffset + stage * Config::kBlockM * 4;
  }
  __device__ __forceinline__ unsigned barrier(int index) const { return base + Config::kBarrierOffset + 8 * index; }
  __device__ __forceinline__ unsigned kv_full() const { return barrier(0); }
  __device__ __forceinline__ unsigned full(int stage) const { return barrier(1 + stage); }
  __device__ __forceinline__ unsigned empty(int stage) const { return barrier(1 + Config::kStages + stage); }
};

// A key tile's work: for each query head of the group in turn, the query tiles
// its backward tile-list row names.
struct BackwardTileCursor {
  TileList tiles;
  int batch;
  int first_head;
  int group;
  int key_tile;
  int head_offset;
  int index;
  int last;

  __device__ __forceinline__ void open(int offset) {
    head_offset = offset;
    const int row = tiles.row(batch, first_head + offset, key_tile);
    index = tiles.row_offsets[row];
    last = tiles.row_offsets[row + 1];
  }
  __device__ __forceinline__ void skip_empty_rows() {
    while (index == last && head_offset + 1 < group) open(head_offset + 1);
  }
  __device__ __forceinline__ void start() {
    open(0);
    skip_empty_rows();
  }
  __device__ __forceinline__ bool valid() const { return index < last; }
  __device__ __forceinline__ void advance() {
    ++index;
    skip_empty_rows();
  }
  __device__ __forceinline__ int head() const { return first_head + head_offset; }
  __device__ __forceinline__ int entry() const { return tiles.entries[index]; }
};

// Where a consumer thread's accumulator elements of one (key tile, query
// tile) pair sit: element (b, e) of S^T is query q_start + 8 * b + col_pair +
// e % 2 and key key0 + 8 * (e / 2), bit 4 * b + e of the tile's
// LogitMap::visibility<kBlocks, true>(partial, key0, q_start + col_pair, ...).
struct BackwardTileCoordinates {
  int q_start;
  int key0;
  int col_pair;
};

// P^T into p_frag (packed: the A operand of dV += P^T dO, k = queries,
// blocks 2s and 2s + 1 forming k-step s) and, in place of S^T,
// P * d logit / d(q.k). kChecked hides the pairs whose bit in `shown` is
// clear (partial tiles and tiles crossing a sequence end); the caller picks
// the instantiation once per tile, not per element. Selects, not branches,
// inside: dP^T is in flight.
template <bool kChecked, class Element, class Variant, int kBlocks, int kSteps>
__device__ __forceinline__ void backward_probabilities(const LogitMap<Variant>& logits,
                                                       const BackwardTileCoordinates& tile, unsigned long long shown,
                                                       unsigned lse_row, float (&scores)[kBlocks][4],
                                                       unsigned (&p_frag)[kSteps][4]) {
  static_assert(kBlocks == 2 * kSteps, "two 8-query blocks per k-step");
  // The score parts of the thread's two keys once, of each query pair once
  // per block, and of each distance once (LogitMap::BlockDistances): element
  // (b, e) is at distance q_start + col_pair - key0 + 8 * (b - e / 2) + e % 2.
  using Logits = LogitMap<Variant>;
  const typename Logits::ScoreColumn columns[2] = {logits.score_column(tile.key0), logits.score_column(tile.key0 + 8)};
  typename Logits::template BlockDistances<1> distances(logits, tile.q_start + tile.col_pair - tile.key0);
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
    const int col = 8 * b + tile.col_pair;
    const float2 lse = load_shared_f32x2(lse_row + 4 * col);
    const float lse_log2[2] = {lse_exponent_offset(lse.x), lse_exponent_offset(lse.y)};
    const typename Logits::ScoreRow rows[2] = {logits.score_row(tile.q_start + col),
                                               logits.score_row(tile.q_start + col + 1)};
    distances.enter(b);
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const typename Logits::ScoreDistance& distance = distances.of(e);
      const float exponentiated =
          fast_exp2(logits.logit(scores[b][e], rows[e & 1], columns[e >> 1], distance) - lse_log2[e & 1]);
      const float factor = exponentiated * logits.logit_grad(scores[b][e], rows[e & 1], columns[e >> 1], distance);
      if constexpr (kChecked) {
        const bool visible = (shown >> (4 * b + e)) & 1;
        p[e] = visible ? exponentiated : 0.f;
        scores[b][e] = visible ? factor : 0.f;
      } else {
        p[e] = exponentiated;
        scores[b][e] = factor;
      }
    }
    p_frag[b / 2][2 * (b & 1)] = ElementTraits<Element>::pack(p[0], p[1]);
    p_frag[b / 2][2 * (b & 1) + 1] = ElementTraits<Element>::pack(p[2], p[3]);
  }
}

// Grid: (ceil(kv_len / kBlockN), kv_heads, batch); Config::kThreads threads;
// Config::kSharedBytes of dynamic shared memory. Needs the preprocess kernel
// (delta, zeroed accumulator) and the backward tile list. sm_90a only.
template <class Config, class Variant>
__global__ void __launch_bounds__(Config::kThreads, 1)
    attention_backward_sm90_kernel(const AttentionBackwardParams params, const Variant variant) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(VariantCheck<Variant>::kOk, "");
  using Element = typename Config::Element;
  using QTile = typename Config::QTile;
  using KVTile = typename Config::KVTile;
  using GradSTile = typename Config::GradSTile;
  constexpr int kHeadDim = Config::kHeadDim;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kStages = Config::kStages;
  constexpr int kGradQCols = Config::kGradQCols;
  static_assert(kBlockM == 64, "LSE and delta loads: one 4-byte copy per producer thread");

  extern __shared__ __align__(16) unsigned char shared_memory[];
  const Sm90BackwardSharedMap<Config> smem{aligned_shared_base(shared_memory)};

  const AttentionShape& shape = params.shape;
  // Key tiles run from the first, usually the most seen (causal, DFlash
  // context), to the last; heads and batches vary fastest.
  const int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int kv_head = linear % shape.kv_heads;
  const int batch = (linear / shape.kv_heads) % shape.batch;
  const int key_tile = linear / (shape.kv_heads * shape.batch);
  const int group = shape.q_heads / shape.kv_heads;
  const int kv_start = key_tile * kBlockN;
  const int kv_rows = min(kBlockN, shape.kv_len - kv_start);
  const BackwardTileCursor start_cursor{params.tiles, batch, kv_head * group, group, key_tile, 0, 0, 0};

  if (threadIdx.x == 0) init_pipeline_barriers(smem.barrier(0), 1 + kStages, kStages);
  __syncthreads();

  const int warpgroup = warpgroup_index();
  if (warpgroup == 0) {
    // Producer: K and V once; then per query tile i, Q, dO, LSE and delta
    // into stage i % kStages once the consumers have released tile
    // i - kStages, whose dQ (staged in the same buffer index) it first adds
    // to the global accumulator.
    setmaxnreg_decrease<Config::kProducerRegisters>();
    const int thread = threadIdx.x;
    load_tile_async<KVTile, 128>(smem.k_tile(), tensor_row<Element>(params.k, params.k_strides, batch, kv_head, kv_start),
                                 params.k_strides.row, kv_rows, thread);
    load_tile_async<KVTile, 128>(smem.v_tile(), tensor_row<Element>(params.v, params.v_strides, batch, kv_head, kv_start),
                                 params.v_strides.row, kv_rows, thread);
    mbarrier_arrive_on_copies(smem.kv_full());

    // Adds the staged dQ (each partial) of the tile `reduced` points at (thread 0 only).
    auto reduce_grad_q = [&](const BackwardTileCursor& reduced, int stage) {
      if (thread == 0) {
        const int q_start = tile_entry_index(reduced.entry()) * kBlockM;
        const int q_rows = min(kBlockM, shape.q_len - q_start);
        float* accum =
            params.grad_q_accum +
            ((static_cast<long long>(batch) * shape.q_heads + reduced.head()) * shape.q_len + q_start) * kHeadDim;
#pragma unroll
        for (int partial = 0; partial < Config::kGradQPartials; ++partial) {
          bulk_reduce_add_f32(accum, smem.grad_q_tile(stage, partial), q_rows * kHeadDim * 4);
        }
        bulk_commit();
      }
    };

    BackwardTileCursor work = start_cursor;
    BackwardTileCursor reduced = start_cursor;  // kStages tiles behind `work`
    work.start();
    reduced.start();
    int i = 0;
    for (; work.valid(); ++i, work.advance()) {
      const int stage = i % kStages;
      if (i >= kStages) {
        mbarrier_wait(smem.empty(stage), (i / kStages - 1) & 1);
        reduce_grad_q(reduced, stage);
        reduced.advance();
        // The consumers write tile i's dQ into this buffer after full(stage),
        // which this thread's arrival below completes only after the read.
        if (thread == 0) bulk_wait_read<0>();
      }
      const int head = work.head();
      const int q_start = tile_entry_index(work.entry()) * kBlockM;
      const int q_rows = min(kBlockM, shape.q_len - q_start);
      load_tile_async<QTile, 128>(smem.q_tile(stage), tensor_row<Element>(params.q, params.q_strides, batch, head, q_start),
                                  params.q_strides.row, q_rows, thread);
      load_tile_async<QTile, 128>(smem.grad_o_tile(stage),
                                  tensor_row<Element>(params.grad_o, params.grad_o_strides, batch, head, q_start),
                                  params.grad_o_strides.row, q_rows, thread);
      // Threads 0..63 copy LSE, 64..127 delta; rows past q_len read as 0.
      const long long row_base = (static_cast<long long>(batch) * shape.q_heads + head) * shape.q_len + q_start;
      const int row = thread & (kBlockM - 1);
      const float* source = thread < kBlockM ? params.lse : params.delta;
      cp_async_4((thread < kBlockM ? smem.lse(stage) : smem.delta(stage)) + 4 * row,
                 row < q_rows ? source + row_base + row : source, row < q_rows);
      mbarrier_arrive_on_copies(smem.full(stage));
    }
    // The last (up to kStages) tiles' dQ.
    for (int tail = i < kStages ? 0 : i - kStages; tail < i; ++tail) {
      const int stage = tail % kStages;
      mbarrier_wait(smem.empty(stage), (tail / kStages) & 1);
      reduce_grad_q(reduced, stage);
      reduced.advance();
    }
    if (thread == 0) bulk_wait<0>();
    cp_async_wait_all();  // no copy outlives the thread that issued it
  } else {
    // Consumers: warpgroup 1 owns keys 0..63 of the tile, warpgroup 2 keys 64..127.
    setmaxnreg_increase<Config::kConsumerRegisters>();
    constexpr int kQueryBlocks = kBlockM / 8;   // S^T, dP^T columns
    constexpr int kQuerySteps = kBlockM / 16;   // k-steps of dV, dK
    constexpr int kDimBlocks = kHeadDim / 8;    // dK, dV columns
    constexpr int kDimSteps = kHeadDim / 16;    // k-steps of S^T, dP^T
    constexpr int kGradQSteps = Config::kGradQKeys / 16;  // k-steps of dQ
    constexpr int kGradQBlocks = kGradQCols / 8;
    const int consumer = warpgroup - 1;
    const int lane = threadIdx.x & 31;
    const int warp_row = 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);  // and warp_row + 8
    const int key_row = 64 * consumer + warp_row;                        // row of K, V, dK, dV in the tile
    const int col_pair = 2 * (lane & 3);
    // The mask's row parts of a checked query tile, per warp (LogitMap::stage_varying).
    using RowStage = VaryingPartsStage<Variant, true, kBlockM, kConsumerThreads / 32,
                                       kMaxSharedMemoryPerBlockSm90 - Config::kSharedBytes>;
    __shared__ RowStage row_stage;
    typename VisibilitySides<Variant, true>::Varying* const warp_rows =
        row_stage.of_warp((threadIdx.x - kProducerThreads) >> 5);

    // product = (this warpgroup's 64 rows of key_tile) (query_tile)^T, K-major
    // operands both (K or V times Q or dO), issued and committed.
    auto issue_key_query_product = [&](float (&product)[kQueryBlocks][4], unsigned key_tile, unsigned query_tile) {
#pragma unroll
      for (int step = 0; step < kDimSteps; ++step) {
        Wgmma<Element, kBlockM>::template ss<0, 0>(product, KVTile::k_major(key_tile, 64 * consumer, 16 * step),
                                                   QTile::k_major(query_tile, 0, 16 * step), step > 0);
      }
      wgmma_commit();
    };

    float grad_k[kDimBlocks][4];
    float grad_v[kDimBlocks][4];
    zero(grad_k);
    zero(grad_v);
    mbarrier_wait(smem.kv_full(), 0);

    BackwardTileCursor work = start_cursor;
    work.start();
    for (int i = 0; work.valid(); ++i, work.advance()) {
      const int stage = i % kStages;
      const int head = work.head();
      const int entry = work.entry();
      const int q_start = tile_entry_index(entry) * kBlockM;
      const bool partial = tile_entry_partial(entry);
      const bool checked = partial || q_start + kBlockM > shape.q_len || kv_rows < kBlockN;
      const LogitMap<Variant> logits(variant, batch, head, shape.scale);
      // Positions only: worked out before the products, while fewer registers are live.
      if (partial) logits.template stage_varying<kBlockM, true, RowStage::kUsed>(warp_rows, q_start, shape.q_len, shape.kv_len, lane);
      const unsigned long long shown =
          checked ? logits.template visibility<kQueryBlocks, true, RowStage::kUsed>(partial, kv_start + key_row, q_start + col_pair,
                                                                   shape.q_len, shape.kv_len, warp_rows + col_pair)
                  : ~0ull;

      // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys, issued
      // together: dP^T runs on the tensor cores while P^T is computed. Element
      // (b, e) of an accumulator is key key_row + 8 * (e / 2), query
      // 8 * b + col_pair + e % 2.
      float scores[kQueryBlocks][4];
      float grad_p[kQueryBlocks][4];
      mbarrier_wait(smem.full(stage), (i / kStages) & 1);
      fence_proxy_async();  // Q, dO came through the generic proxy, wgmma reads through the async one
      wgmma_fence();
      issue_key_query_product(scores, smem.k_tile(), smem.q_tile(stage));
      issue_key_query_product(grad_p, smem.v_tile(), smem.grad_o_tile(stage));
      wgmma_wait<1>();
      register_fence(scores);

      // P^T (packed: the A operand of dV += P^T dO) and, in place of S^T,
      // P * d logit / d(q.k); the visibility test only where the tile needs it.
      const BackwardTileCoordinates tile{q_start, kv_start + key_row, col_pair};
      unsigned p_frag[kQuerySteps][4];
      if (checked) {
        backward_probabilities<true, Element>(logits, tile, shown, smem.lse(stage), scores, p_frag);
      } else {
        backward_probabilities<false, Element>(logits, tile, shown, smem.lse(stage), scores, p_frag);
      }

      // dS^T = P * (dP - delta) * d logit / d(q.k).
      wgmma_wait<0>();
      register_fence(grad_p);
      unsigned grad_s_frag[kQuerySteps][4];
#pragma unroll
      for (int b = 0; b < kQueryBlocks; ++b) {
        const float2 delta = load_shared_f32x2(smem.delta(stage) + 4 * (8 * b + col_pair));
        grad_s_frag[b / 2][2 * (b & 1)] = ElementTraits<Element>::pack(scores[b][0] * (grad_p[b][0] - delta.x),
                                                                       scores[b][1] * (grad_p[b][1] - delta.y));
        grad_s_frag[b / 2][2 * (b & 1) + 1] = ElementTraits<Element>::pack(scores[b][2] * (grad_p[b][2] - delta.x),
                                                                           scores[b][3] * (grad_p[b][3] - delta.y));
      }
      // dS^T for dQ = dS K, which reads all 128 keys (both warpgroups' rows).
      const unsigned grad_s_tile = smem.grad_s_tile(i & 1);
#pragma unroll
      for (int s = 0; s < kQuerySteps; ++s) {
        const int col = 16 * s + col_pair;
        store_shared_u32(grad_s_tile + GradSTile::offset(key_row, col), grad_s_frag[s][0]);
        store_shared_u32(grad_s_tile + GradSTile::offset(key_row + 8, col), grad_s_frag[s][1]);
        store_shared_u32(grad_s_tile + GradSTile::offset(key_row, col + 8), grad_s_frag[s][2]);
        store_shared_u32(grad_s_tile + GradSTile::offset(key_row + 8, col + 8), grad_s_frag[s][3]);
      }
      fence_proxy_async();

      // dV += P^T dO, dK += dS^T Q (B operands MN-major: rows = queries).
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < kQuerySteps; ++s) {
        Wgmma<Element, kHeadDim>::template rs<1>(grad_v, p_frag[s], QTile::mn_major(smem.grad_o_tile(stage), 16 * s, 0),
                                                 true);
      }
#pragma unroll
      for (int s = 0; s < kQuerySteps; ++s) {
        Wgmma<Element, kHeadDim>::template rs<1>(grad_k, grad_s_frag[s], QTile::mn_major(smem.q_tile(stage), 16 * s, 0),
                                                 true);
      }
      wgmma_commit();

      // The dS^T rows this warpgroup's dQ product reads are in shared memory:
      // both warpgroups' (all keys) or its own (dQ split by keys). Buffers
      // alternate, so the previous tile's dQ products may still read the other one.
      if constexpr (Config::kGradQByKeys) {
        named_barrier_sync(2 + consumer, 128);
      } else {
        named_barrier_sync(1, 256);
      }
      // dQ[:, kGradQCols columns] = dS K over kGradQKeys keys (A = dS^T stored
      // [key][query]: M-major; B = K stored [key][dim]: N-major).
      const int grad_q_key0 = Config::kGradQByKeys ? 64 * consumer : 0;
      const int grad_q_col0 = Config::kGradQByKeys ? 0 : kGradQCols * consumer;
      float grad_q[kGradQBlocks][4];
#pragma unroll
      for (int step = 0; step < kGradQSteps; ++step) {
        const int key = grad_q_key0 + 16 * step;
        Wgmma<Element, kGradQCols>::template ss<1, 1>(grad_q, GradSTile::mn_major(grad_s_tile, key, 0),
                                                      KVTile::mn_major(smem.k_tile(), key, grad_q_col0), step > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      register_fence(grad_q);
      register_fence(grad_v);
      register_fence(grad_k);

      // Stage this tile's dQ for the producer's bulk reduction, then release
      // the stage (Q, dO, LSE, delta and the dQ buffer).
      const unsigned grad_q_tile = smem.grad_q_tile(stage, Config::kGradQByKeys ? consumer : 0);
#pragma unroll
      for (int b = 0; b < kGradQBlocks; ++b) {
        const int col = grad_q_col0 + 8 * b + col_pair;
        store_shared_f32x2(grad_q_tile + 4 * (warp_row * kHeadDim + sm90_grad_q_column(warp_row, col)), grad_q[b][0],
                           grad_q[b][1]);
        store_shared_f32x2(grad_q_tile + 4 * ((warp_row + 8) * kHeadDim + sm90_grad_q_column(warp_row + 8, col)),
                           grad_q[b][2], grad_q[b][3]);
      }
      fence_proxy_async();
      mbarrier_arrive(smem.empty(stage));
    }

    // Every product is complete in both warpgroups: dK and dV go out through
    // the K and V buffers (this warpgroup's rows).
    named_barrier_sync(1, 256);
    store_accumulator_tile<KVTile, Element>(smem.k_tile(), grad_k, 1.f, 1.f, key_row, col_pair);
    store_accumulator_tile<KVTile, Element>(smem.v_tile(), grad_v, 1.f, 1.f, key_row, col_pair);
    named_barrier_sync(consumer == 0 ? 2 : 3, 128);
    store_tile_rows<KVTile, 64, 128>(tensor_row<Element>(params.grad_k, params.grad_k_strides, batch, kv_head, kv_start),
                                     params.grad_k_strides.row, smem.k_tile(), 64 * consumer, kv_rows,
                                     threadIdx.x & 127);
    store_tile_rows<KVTile, 64, 128>(tensor_row<Element>(params.grad_v, params.grad_v_strides, batch, kv_head, kv_start),
                                     params.grad_v_strides.row, smem.v_tile(), 64 * consumer, kv_rows,
                                     threadIdx.x & 127);
  }
#else
  __trap();  // built for a target without wgmma: the runtime must pick the portable kernels
#endif
}

// Grid: ceil(batch * q_heads * q_len / kRowKernelRows); kRowKernelThreads threads.
// Converts the sm90 dQ accumulator (chunks permuted per row) to dQ.
template <class Config>
__global__ void __launch_bounds__(kRowKernelThreads)
    attention_backward_grad_q_sm90_kernel(const AttentionBackwardParams params) {
  using Element = typename Config::Element;
  constexpr int kHeadDim = Config::kHeadDim;
  const AttentionShape& shape = params.shape;
  const QueryRow row = QueryRow::of_warp(shape);
  if (row.batch >= shape.batch) return;
  const int lane = threadIdx.x & 31;

  const float* accum = params.grad_q_accum + row.flat * kHeadDim;
  Element* grad_q = tensor_row<Element>(params.grad_q, params.grad_q_strides, row.batch, row.head, row.q);
#pragma unroll
  for (int pair = lane; pair < kHeadDim / 2; pair += 32) {
    const float2 value = *reinterpret_cast<const float2*>(accum + sm90_grad_q_column(row.q, 2 * pair));
    *reinterpret_cast<unsigned*>(grad_q + 2 * pair) = ElementTraits<Element>::pack(value.x, value.y);
  }
}

}  // namespace kernels
}  // namespace dflex
