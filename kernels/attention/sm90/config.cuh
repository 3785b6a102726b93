// Configurations of the Hopper (sm_90a) attention kernels: tile shapes,
// warpgroup roles, register split and the shared-memory map, all fixed at
// compile time. Both kernels run one producer warpgroup (cp.async loads into a
// ring of stages, completion through mbarriers) and two consumer warpgroups
// (wgmma); the producer gives registers to the consumers with setmaxnreg.
#pragma once

#include "../../common/pipeline.cuh"
#include "../../common/wgmma.cuh"
#include "../params.cuh"

namespace dflex {
namespace kernels {

// A compile-time bool as a value (selects template instantiations of generic lambdas).
template <bool kValue>
struct BoolConstant {
  static constexpr bool value = kValue;
};

// Sizes in bytes of the shared-memory map, laid out from a 1024-byte aligned
// base (the 128-byte swizzle repeats every 1024 bytes); the slack pays for
// aligning the dynamic shared-memory window.
constexpr int kSwizzleAlignment = 1024;

// Both kernels: warpgroup 0 produces, warpgroups 1 and 2 consume.
constexpr int kProducerThreads = 128;
constexpr int kConsumerThreads = 256;

// The 1024-byte aligned shared-window address of the block's shared-memory map.
__device__ __forceinline__ unsigned aligned_shared_base(const void* dynamic_shared_memory) {
  return (shared_address(dynamic_shared_memory) + kSwizzleAlignment - 1) &
         ~static_cast<unsigned>(kSwizzleAlignment - 1);
}

// Initialises a block's pipeline barriers, 8 bytes apart from `first`: `filled`
// ones that the producer threads complete (one cp.async arrival each), then
// `released` ones that the consumer threads complete. One thread calls it,
// the block synchronises before using them.
__device__ __forceinline__ void init_pipeline_barriers(unsigned first, int filled, int released) {
  for (int i = 0; i < filled; ++i) mbarrier_init(first + 8 * i, kProducerThreads);
  for (int i = filled; i < filled + released; ++i) mbarrier_init(first + 8 * i, kConsumerThreads);
}

// Forward: one block per (query tile of 128, query head, batch). Each consumer
// warpgroup owns 64 query rows and walks the listed key tiles of kBlockN keys
// with an online softmax: S = Q K^T (A and B from shared memory), then
// O += P V with P from registers. The producer fills a ring of kStages K/V
// buffer pairs.
template <class Element_, int kHeadDim_, int kBlockN_ = 128, int kStages_ = 2>
struct Sm90AttentionForwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 3 * 128;  // producer warpgroup, two consumer warpgroups
  // The block starts with 168 registers per thread (65,536 / 384, rounded
  // down to 8); the producer gives up 144, each consumer thread takes 72.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  using QTile = Sw128Tile<kBlockM, kHeadDim>;   // Q, then O on the way out
  using KVTile = Sw128Tile<kBlockN, kHeadDim>;  // K and V of one stage

  // Barriers: Q full; per stage K full, V full (128 producer arrivals each),
  // K empty, V empty (256 consumer arrivals each).
  static constexpr int kBarrierCount = 1 + 4 * kStages;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + QTile::kBytes;
  static constexpr int kVOffset = kKOffset + kStages * KVTile::kBytes;
  static constexpr int kBarrierOffset = kVOffset + kStages * KVTile::kBytes;
  static constexpr int kSharedBytes = kBarrierOffset + 8 * kBarrierCount + kSwizzleAlignment;

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "sm90 forward: head_dim 64, 128 or 256");
  static_assert(kBlockN == 64 || kBlockN == 128, "sm90 forward: key tiles of 64 or 128 (wgmma N of S)");
  // O of 256 columns is 128 registers per consumer thread: S of more than 64
  // keys would not fit beside it.
  static_assert(kHeadDim < 256 || kBlockN == 64, "sm90 forward: head_dim 256 takes key tiles of 64");
  static_assert(kStages >= 2, "sm90 forward: at least two K/V stages");
  static_assert(kSharedBytes <= kMaxSharedMemoryPerBlockSm90, "sm90 forward config exceeds shared memory");
};

// Backward: one block per (key tile of 128, key/value head, batch). Each
// consumer warpgroup owns 64 keys of the tile: per query tile of 64 (all
// query heads of the group) it computes S^T = K Q^T and dP^T = V dO^T, so that
// P^T and dS^T sit in its registers as the A operands of dV += P^T dO and
// dK += dS^T Q; dK and dV stay in registers for the whole block. dS^T also
// goes to shared memory for dQ = dS K, whose fp32 tile is staged in shared
// memory and added to the global accumulator by bulk reduction:
//   head_dim 128: both warpgroups read all 128 keys of dS^T, each computing
//     64 of the 128 dQ columns; one staged tile.
//   head_dim 64: an MN-major wgmma operand spans whole 64-column swizzle
//     blocks, so the columns cannot split; each warpgroup computes every
//     column over its own 64 keys, and both partial tiles are reduced.
// The producer fills a ring of kStages (Q, dO, LSE, delta) stages.
template <class Element_, int kHeadDim_, int kStages_ = 2>
struct Sm90AttentionBackwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 3 * 128;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static constexpr bool kGradQByKeys = kHeadDim == 64;                // dQ split by keys, not by columns
  static constexpr int kGradQCols = kGradQByKeys ? kHeadDim : kHeadDim / 2;  // dQ columns per consumer warpgroup
  static constexpr int kGradQKeys = kGradQByKeys ? kBlockN / 2 : kBlockN;   // keys each dQ product reduces over
  static constexpr int kGradQPartials = kGradQByKeys ? 2 : 1;               // staged dQ tiles per query tile

  using QTile = Sw128Tile<kBlockM, kHeadDim>;      // Q and dO of one stage
  using KVTile = Sw128Tile<kBlockN, kHeadDim>;     // K and V, then dK and dV on the way out
  using GradSTile = Sw128Tile<kBlockN, kBlockM>;   // dS^T: rows = keys, columns = queries
  static constexpr int kGradQBytes = kBlockM * kHeadDim * 4;  // fp32 dQ staging tile

  // Barriers: K/V full; per stage full (128 producer arrivals) and empty (256 consumer arrivals).
  static constexpr int kBarrierCount = 1 + 2 * kStages;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + KVTile::kBytes;
  static constexpr int kQOffset = kVOffset + KVTile::kBytes;
  static constexpr int kGradOOffset = kQOffset + kStages * QTile::kBytes;
  static constexpr int kGradSOffset = kGradOOffset + kStages * QTile::kBytes;  // two buffers
  static constexpr int kGradQOffset = kGradSOffset + 2 * GradSTile::kBytes;    // two buffers
  static constexpr int kLseOffset = kGradQOffset + kStages * kGradQPartials * kGradQBytes;  // raw LSE per stage
  static constexpr int kDeltaOffset = kLseOffset + kStages * kBlockM * 4;
  static constexpr int kBarrierOffset = kDeltaOffset + kStages * kBlockM * 4;
  static constexpr int kSharedBytes = kBarrierOffset + 8 * kBarrierCount + kSwizzleAlignment;

  static_assert(kHeadDim == 64 || kHeadDim == 128, "sm90 backward: head_dim 64 or 128 (64-column swizzle blocks)");
  static_assert(kStages >= 2, "sm90 backward: at least two query stages");
  static_assert(kSharedBytes <= kMaxSharedMemoryPerBlockSm90, "sm90 backward config exceeds shared memory");
};

// The Hopper configurations dflex instantiates (sm_90a only). Head dims
// without an entry use the portable kernels; where kHasBackward is false,
// the Hopper forward pairs with the portable backward.
template <class Element, int kHeadDim>
struct Sm90AttentionConfigs;

template <class Element>
struct Sm90AttentionConfigs<Element, 64> {
  using Forward = Sm90AttentionForwardConfig<Element, 64, 128, 2>;  // 97 KB
  using Backward = Sm90AttentionBackwardConfig<Element, 64, 2>;    // 162 KB
  static constexpr bool kHasBackward = true;
};

template <class Element>
struct Sm90AttentionConfigs<Element, 128> {
  using Forward = Sm90AttentionForwardConfig<Element, 128, 128, 2>;  // 161 KB
  using Backward = Sm90AttentionBackwardConfig<Element, 128, 2>;    // 226 KB
  static constexpr bool kHasBackward = true;
};

// The backward's K, V, Q and dO tiles alone would take 192 KB at head_dim 256.
template <class Element>
struct Sm90AttentionConfigs<Element, 256> {
  using Forward = Sm90AttentionForwardConfig<Element, 256, 64, 2>;  // 193 KB
  static constexpr bool kHasBackward = false;
};

}  // namespace kernels
}  // namespace dflex
