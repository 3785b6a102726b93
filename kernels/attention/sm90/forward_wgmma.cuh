// Attention forward for Hopper (sm_90a): the semantics, parameters, tile list
// and variant contract of attention_forward_kernel (../forward.cuh), computed
// with wgmma by two consumer warpgroups while a producer warpgroup streams the
// listed K/V tiles into a ring of shared-memory stages.
//
// Per consumer warpgroup (64 query rows) and listed key tile j:
//   S(j) = Q K(j)^T          wgmma, Q and K from shared memory, issued with ...
//   O += P(j-1) V(j-1)       ... wgmma, P from registers, which runs on while
//   softmax(S(j)) -> P(j)    the online softmax turns S(j) into P(j) (a second
//                            P buffer); then O is rescaled to the new maxima
// The two warpgroups also take turns issuing their products (ping-pong), so
// the tensor cores work for one while the other runs its softmax.
#pragma once

#include "../logits.cuh"
#include "../params.cuh"
#include "../variant.cuh"
#include "config.cuh"

namespace dflex {
namespace kernels {

// Shared-memory map of the forward (Config's offsets from the aligned base).
template <class Config>
struct Sm90ForwardSharedMap {
  unsigned base;  // 1024-byte aligned shared-window address
  __device__ __forceinline__ unsigned q_tile() const { return base + Config::kQOffset; }
  __device__ __forceinline__ unsigned k_tile(int stage) const {
    return base + Config::kKOffset + stage * Config::KVTile::kBytes;
  }
  __device__ __forceinline__ unsigned v_tile(int stage) const {
    return base + Config::kVOffset + stage * Config::KVTile::kBytes;
  }
  __device__ __forceinline__ unsigned barrier(int index) const { return base + Config::kBarrierOffset + 8 * index; }
  __device__ __forceinline__ unsigned q_full() const { return barrier(0); }
  __device__ __forceinline__ unsigned k_full(int stage) const { return barrier(1 + stage); }
  __device__ __forceinline__ unsigned v_full(int stage) const { return barrier(1 + Config::kStages + stage); }
  __device__ __forceinline__ unsigned k_empty(int stage) const { return barrier(1 + 2 * Config::kStages + stage); }
  __device__ __forceinline__ unsigned v_empty(int stage) const { return barrier(1 + 3 * Config::kStages + stage); }
};

// One consumer warpgroup of the forward: 64 query rows, their O accumulator,
// running row maxima and sums, and the P of the previous key tile.
template <class Config, class Variant>
struct Sm90ForwardConsumer {
  using Element = typename Config::Element;
  using QTile = typename Config::QTile;
  using KVTile = typename Config::KVTile;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kStages = Config::kStages;
  static constexpr int kScoreBlocks = kBlockN / 8;
  static constexpr int kOutBlocks = Config::kHeadDim / 8;
  static constexpr int kKeySteps = kBlockN / 16;
  static constexpr int kDimSteps = Config::kHeadDim / 16;
  static constexpr int kTurnBarrier = 3;  // named barriers 3 and 4 (1, 2: epilogues)

  Sm90ForwardSharedMap<Config> smem;
  const int* entries;  // this query tile's tile-list entries
  LogitMap<Variant> logits;
  int warpgroup;  // consumer warpgroup, 0 or 1
  int row0;       // first query row of the warpgroup in the tile
  int thread_q;  // query of this thread's upper row (the lower one is 8 further)
  int lane;
  int q_len;
  int kv_len;
  bool query_edge;  // the tile crosses q_len
  // The consumer warps' column parts of a checked key tile (LogitMap::stage_varying).
  using ColumnStage = VaryingPartsStage<Variant, false, kBlockN, kConsumerThreads / 32,
                                        kMaxSharedMemoryPerBlockSm90 - Config::kSharedBytes>;
  typename ColumnStage::Part* columns;  // this warp's
  // The consumer warps' score_mod column parts of each key tile (LogitMap::fetch_score_parts).
  using ScoreStage = ScorePartsStage<Variant, false, kBlockN, kConsumerThreads / 32,
                                      kMaxSharedMemoryPerBlockSm90 - Config::kSharedBytes - ColumnStage::kUsedBytes>;
  typename ScoreStage::Part* score_columns;  // this warp's
  typename LogitMap<Variant>::ScoreRow score_rows[2];  // of rows thread_q and thread_q + 8

  float out[kOutBlocks][4];
  float row_max[2];  // log2 units, rows thread_q and thread_q + 8
  float row_sum[2];  // this thread's partial sums of the same rows

  using PTile = unsigned[kKeySteps][4];  // P of one key tile, the A operand of P V

  // S(j) = Q K(j)^T, issued and committed.
  __device__ __forceinline__ void issue_scores(int j, float (&scores)[kScoreBlocks][4]) const {
    const int stage = j % kStages;
    mbarrier_wait(smem.k_full(stage), (j / kStages) & 1);
    fence_proxy_async();  // K(j) came through the generic proxy, wgmma reads through the async one
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < kDimSteps; ++step) {
      Wgmma<Element, kBlockN>::template ss<0, 0>(scores, QTile::k_major(smem.q_tile(), row0, 16 * step),
                                                 KVTile::k_major(smem.k_tile(stage), 0, 16 * step), step > 0);
    }
    wgmma_commit();
  }

  // O += P V(j) with the P of key tile j, issued and committed; O's columns
  // in products of at most 128 (head_dim 256: two, one per half of V).
  static constexpr int kOutN = Config::kHeadDim < 128 ? Config::kHeadDim : 128;
  __device__ __forceinline__ void issue_values(int j, const PTile& p) {
    const int stage = j % kStages;
    mbarrier_wait(smem.v_full(stage), (j / kStages) & 1);
    fence_proxy_async();
    wgmma_fence();
#pragma unroll
    for (int half = 0; half < Config::kHeadDim / kOutN; ++half) {
      float(&out_part)[kOutN / 8][4] = *reinterpret_cast<float(*)[kOutN / 8][4]>(&out[half * kOutN / 8]);
#pragma unroll
      for (int step = 0; step < kKeySteps; ++step) {
        Wgmma<Element, kOutN>::template rs<1>(out_part, p[step],
                                              KVTile::mn_major(smem.v_tile(stage), 16 * step, half * kOutN), true);
      }
    }
    wgmma_commit();
  }

  // Whether key tile j needs the per-pair visibility test: partial tiles and
  // tiles crossing a sequence end.
  __device__ __forceinline__ bool checked(int j) const {
    const int entry = entries[j];
    return tile_entry_partial(entry) || query_edge || (tile_entry_index(entry) + 1) * kBlockN > kv_len;
  }

  // The first key of this thread's score columns in key tile j.
  __device__ __forceinline__ int first_key(int j) const {
    return tile_entry_index(entries[j]) * kBlockN + 2 * (lane & 3);
  }

  // Visibility bits of key tile j's pairs (all set for an unchecked tile).
  template <bool kChecked>
  __device__ __forceinline__ unsigned long long visibility(int j) const {
    if (!kChecked || !checked(j)) return ~0ull;
    const int entry = entries[j];
    if (tile_entry_partial(entry)) {
      logits.template stage_varying<kBlockN, false, ColumnStage::kUsed>(columns, tile_entry_index(entry) * kBlockN,
                                                                        q_len, kv_len, lane);
    }
    return logits.template visibility<kScoreBlocks, false, ColumnStage::kUsed>(
        tile_entry_partial(entry), thread_q, first_key(j), q_len, kv_len, columns + 2 * (lane & 3));
  }

  // Logits of S(j) (pairs not in `visible` hidden), the rows' exponent bases
  // (moved lazily: move_exponent_bases) and sums; P(j) into next_p. Returns
  // whether the bases moved, with the factor that rescales O in `correction`.
  // Key tile j's score_mod column parts: read before its products, stored
  // for softmax() after them.
  __device__ __forceinline__ void fetch_score_columns(int j, typename ScoreStage::Fetched& fetched) const {
    logits.template fetch_score_parts<false, kBlockN, ScoreStage::kUsed>(tile_entry_index(entries[j]) * kBlockN,
                                                                         kv_len, lane, fetched);
  }
  __device__ __forceinline__ void store_score_columns(const typename ScoreStage::Fetched& fetched) const {
    logits.template store_score_parts<kBlockN, ScoreStage::kUsed>(fetched, lane, score_columns);
  }

  template <bool kChecked>
  __device__ __forceinline__ bool softmax(int j, float (&scores)[kScoreBlocks][4], unsigned long long visible,
                                          float (&correction)[2], PTile& next_p) {
    logits.template apply_shown<kChecked, ScoreStage::kUsed>(scores, visible, score_rows, thread_q, first_key(j),
                                                             score_columns + 2 * (lane & 3));
    const float exponent_scale = logits.exponent_scale();
    float tile_max[2];
    exponent_tile_max(scores, row_max, exponent_scale, tile_max);
    const bool moved = move_exponent_bases(row_max, tile_max, correction);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (moved) row_sum[half] *= correction[half];
      const float base = exponent_base(row_max[half]);
#pragma unroll
      for (int b = 0; b < kScoreBlocks; ++b) {
        scores[b][2 * half] = fast_exp2(fmaf(scores[b][2 * half], exponent_scale, -base));
        scores[b][2 * half + 1] = fast_exp2(fmaf(scores[b][2 * half + 1], exponent_scale, -base));
        row_sum[half] += scores[b][2 * half] + scores[b][2 * half + 1];
      }
    }
#pragma unroll
    for (int step = 0; step < kKeySteps; ++step) {
      next_p[step][0] = ElementTraits<Element>::pack(scores[2 * step][0], scores[2 * step][1]);
      next_p[step][1] = ElementTraits<Element>::pack(scores[2 * step][2], scores[2 * step][3]);
      next_p[step][2] = ElementTraits<Element>::pack(scores[2 * step + 1][0], scores[2 * step + 1][1]);
      next_p[step][3] = ElementTraits<Element>::pack(scores[2 * step + 1][2], scores[2 * step + 1][3]);
    }
    return moved;
  }

  __device__ __forceinline__ void rescale(const float (&correction)[2]) {
#pragma unroll
    for (int b = 0; b < kOutBlocks; ++b) {
      out[b][0] *= correction[0];
      out[b][1] *= correction[0];
      out[b][2] *= correction[1];
      out[b][3] *= correction[1];
    }
  }

  // Ping-pong between the two consumer warpgroups: a warpgroup issues its
  // products only after the other one has issued its previous batch, so the
  // tensor cores run one warpgroup's products while the other does its softmax.
  __device__ __forceinline__ void wait_turn() const { named_barrier_sync(kTurnBarrier + warpgroup, 256); }
  __device__ __forceinline__ void pass_turn() const { named_barrier_arrive(kTurnBarrier + (warpgroup ^ 1), 256); }

  // Key tile 0: S(0), its softmax into P(0).
  template <bool kChecked>
  __device__ __forceinline__ void first_tile(PTile& p) {
    const unsigned long long visible = visibility<kChecked>(0);
    typename ScoreStage::Fetched fetched;
    fetch_score_columns(0, fetched);
    float scores[kScoreBlocks][4];
    float correction[2];
    wait_turn();
    issue_scores(0, scores);
    pass_turn();
    wgmma_wait<0>();
    register_fence(scores);
    mbarrier_arrive(smem.k_empty(0));
    store_score_columns(fetched);
    softmax<kChecked>(0, scores, visible, correction, p);
  }

  // Key tile j >= 1: S(j) and P(j-1) V(j-1) issued together; the softmax of
  // S(j) into next_p runs while P(j-1) V(j-1) is still on the tensor cores.
  template <bool kChecked>
  __device__ __forceinline__ void next_tile(int j, const PTile& p, PTile& next_p) {
    const unsigned long long visible = visibility<kChecked>(j);  // before the products: fewer live registers
    typename ScoreStage::Fetched fetched;
    fetch_score_columns(j, fetched);
    float scores[kScoreBlocks][4];
    float correction[2];
    wait_turn();
    issue_scores(j, scores);
    issue_values(j - 1, p);
    pass_turn();
    wgmma_wait<1>();  // S(j) is done
    register_fence(scores);
    mbarrier_arrive(smem.k_empty(j % kStages));  // K(j) is free as soon as S(j) is done
    store_score_columns(fetched);
    const bool moved = softmax<kChecked>(j, scores, visible, correction, next_p);
    wgmma_wait<0>();
    register_fence(out);
    register_keep(p);  // p's registers stay P(j-1)'s until its product is done
    mbarrier_arrive(smem.v_empty((j - 1) % kStages));
    if (moved) rescale(correction);
  }

  // Key tile 0 and key tile j >= 1 with the softmax the tile needs, chosen
  // before its products are issued. With a score_mod every tile takes the
  // checked code (an unchecked tile's pairs all visible): the score_mod's
  // work per pair dwarfs the select, and a second copy of the tile's code
  // costs NVRTC seconds.
  static constexpr bool kCheckEveryTile = Variant::kHasScoreMod;
  __device__ __forceinline__ void first(PTile& p) {
    if (kCheckEveryTile || checked(0)) {
      first_tile<true>(p);
    } else {
      first_tile<false>(p);
    }
  }
  __device__ __forceinline__ void next(int j, const PTile& p, PTile& next_p) {
    if (kCheckEveryTile || checked(j)) {
      next_tile<true>(j, p, next_p);
    } else {
      next_tile<false>(j, p, next_p);
    }
  }

  // The last P V, once every key tile's softmax is done.
  __device__ __forceinline__ void last_values(int j, const PTile& p) {
    issue_values(j, p);
    wgmma_wait<0>();
    register_fence(out);
    register_keep(p);
    mbarrier_arrive(smem.v_empty(j % kStages));
  }

  // All `count` listed key tiles. No wgmma is in flight across a run-time
  // branch (one makes the compiler serialise every wgmma of the kernel): the
  // choice between the checked and unchecked softmax is made before a tile's
  // products are issued, and the two P buffers alternate by unrolling by two.
  __device__ __forceinline__ void run(int count) {
    zero(out);
    row_max[0] = row_max[1] = negative_infinity();
    row_sum[0] = row_sum[1] = 0.f;
    mbarrier_wait(smem.q_full(), 0);
    if (count == 0) return;
    logits.score_rows(thread_q, q_len, score_rows);
    PTile p_even, p_odd;  // P of the even and of the odd key tiles
    first(p_even);
    // One call of next() per P buffer: each is two copies of the tile's code
    // (checked and not), and NVRTC's time grows faster than the kernel's size.
    for (int j = 1;; j += 2) {
      if (j >= count) {
        last_values(j - 1, p_even);
        return;
      }
      next(j, p_even, p_odd);
      if (j + 1 >= count) {
        last_values(j, p_odd);
        return;
      }
      next(j + 1, p_odd, p_even);
    }
  }
};

// Grid: (ceil(q_len / kBlockM), q_heads, batch); Config::kThreads threads;
// Config::kSharedBytes of dynamic shared memory (above 48 KB: raise the
// function's limit first). sm_90a only.
template <class Config, class Variant>
__global__ void __launch_bounds__(Config::kThreads, 1)
    attention_forward_sm90_kernel(const AttentionForwardParams params, const Variant variant) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(VariantCheck<Variant>::kOk, "");
  using Element = typename Config::Element;
  using QTile = typename Config::QTile;
  using KVTile = typename Config::KVTile;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kStages = Config::kStages;

  extern __shared__ __align__(16) unsigned char shared_memory[];
  const Sm90ForwardSharedMap<Config> smem{aligned_shared_base(shared_memory)};

  const AttentionShape& shape = params.shape;
  // Heads and batches vary fastest; query tiles run from the last, usually the
  // busiest (causal, DFlash), to the first, and the heads of a group that read
  // the same K/V tiles run side by side.
  const int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int head = linear % shape.q_heads;
  const int batch = (linear / shape.q_heads) % shape.batch;
  const int query_tile = gridDim.x - 1 - linear / (shape.q_heads * shape.batch);
  const int kv_head = head / (shape.q_heads / shape.kv_heads);
  const int q_start = query_tile * kBlockM;
  const int q_rows = min(kBlockM, shape.q_len - q_start);
  const int list_row = params.tiles.row(batch, head, query_tile);
  const int first = params.tiles.row_offsets[list_row];
  const int count = params.tiles.row_offsets[list_row + 1] - first;
  const int* entries = params.tiles.entries + first;

  if (threadIdx.x == 0) init_pipeline_barriers(smem.barrier(0), 1 + 2 * kStages, 2 * kStages);
  __syncthreads();

  const int warpgroup = warpgroup_index();
  if (warpgroup == 0) {
    // Producer: Q once, then K(j) and V(j) into stage j % kStages once the
    // consumers have released what that stage held. K and V are released
    // separately: K(j) is read only by S(j), a tile before V(j) is done with,
    // so the next K load starts that much earlier.
    setmaxnreg_decrease<Config::kProducerRegisters>();
    const int thread = threadIdx.x;
    const Element* k = tensor_row<Element>(params.k, params.k_strides, batch, kv_head, 0);
    const Element* v = tensor_row<Element>(params.v, params.v_strides, batch, kv_head, 0);
    load_tile_async<QTile, 128>(smem.q_tile(), tensor_row<Element>(params.q, params.q_strides, batch, head, q_start),
                                params.q_strides.row, q_rows, thread);
    mbarrier_arrive_on_copies(smem.q_full());
    for (int j = 0; j < count; ++j) {
      const int stage = j % kStages;
      const int kv_start = tile_entry_index(entries[j]) * kBlockN;
      const int kv_rows = min(kBlockN, shape.kv_len - kv_start);
      if (j >= kStages) mbarrier_wait(smem.k_empty(stage), (j / kStages - 1) & 1);
      load_tile_async<KVTile, 128>(smem.k_tile(stage), k + kv_start * params.k_strides.row, params.k_strides.row,
                                   kv_rows, thread);
      mbarrier_arrive_on_copies(smem.k_full(stage));
      if (j >= kStages) mbarrier_wait(smem.v_empty(stage), (j / kStages - 1) & 1);
      load_tile_async<KVTile, 128>(smem.v_tile(stage), v + kv_start * params.v_strides.row, params.v_strides.row,
                                   kv_rows, thread);
      mbarrier_arrive_on_copies(smem.v_full(stage));
    }
    cp_async_wait_all();  // no copy outlives the thread that issued it
  } else {
    // Consumers: warpgroup 1 owns query rows 0..63 of the tile, warpgroup 2 rows 64..127.
    setmaxnreg_increase<Config::kConsumerRegisters>();
    __shared__ typename Sm90ForwardConsumer<Config, Variant>::ColumnStage column_stage;
    __shared__ typename Sm90ForwardConsumer<Config, Variant>::ScoreStage score_column_stage;
    const int lane = threadIdx.x & 31;
    const int row0 = 64 * (warpgroup - 1);
    const int thread_row = row0 + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);  // and thread_row + 8
    Sm90ForwardConsumer<Config, Variant> consumer{smem,
                                                  entries,
                                                  LogitMap<Variant>(variant, batch, head, shape.scale),
                                                  warpgroup - 1,
                                                  row0,
                                                  q_start + thread_row,
                                                  lane,
                                                  shape.q_len,
                                                  shape.kv_len,
                                                  q_rows < kBlockM,
                                                  column_stage.of_warp((threadIdx.x - kProducerThreads) >> 5),
                                                  score_column_stage.of_warp((threadIdx.x - kProducerThreads) >> 5)};
    // The first warpgroup takes the first turn.
    if (warpgroup == 2) named_barrier_arrive(Sm90ForwardConsumer<Config, Variant>::kTurnBarrier, 256);
    consumer.run(count);

    float inverse_sum[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float total = quad_sum(consumer.row_sum[half]);
      inverse_sum[half] = total > 0.f ? 1.f / total : 0.f;
      const int q_index = consumer.thread_q + 8 * half;
      if ((lane & 3) == 0 && q_index < shape.q_len) {
        params.lse[(static_cast<long long>(batch) * shape.q_heads + head) * shape.q_len + q_index] =
            total > 0.f ? (consumer.row_max[half] + log2f(total)) * kLn2 : negative_infinity();
      }
    }
    // O through this warpgroup's rows of the Q buffer (its S products are
    // complete; the other warpgroup only reads its own rows).
    store_accumulator_tile<QTile, Element>(smem.q_tile(), consumer.out, inverse_sum[0], inverse_sum[1], thread_row,
                                           2 * (lane & 3));
    named_barrier_sync(warpgroup == 1 ? 1 : 2, 128);
    store_tile_rows<QTile, 64, 128>(tensor_row<Element>(params.o, params.o_strides, batch, head, q_start),
                                    params.o_strides.row, smem.q_tile(), row0, q_rows, threadIdx.x & 127);
  }
#else
  __trap();  // built for a target without wgmma: the runtime must pick the portable kernels
#endif
}

}  // namespace kernels
}  // namespace dflex
