// Compile-time configurations of the attention kernels: element type, head
// dimension, tile sizes and warp layout, with the shared memory they need.
// Every configuration must fit sm_120's 101,376 B of shared memory per block.
#pragma once

#include "../common/mma.cuh"

namespace dflex {
namespace kernels {

// How the forward overlaps the loads of key tile j + 1 with the work of tile j
// (kernels/attention/forward.cuh). Every pipeline has one V buffer, whose
// load overlaps S = Q K(j)^T and the softmax.
enum class ForwardPipeline {
  kSharedQuery,           // Q read from shared memory per tile; one K buffer, K(j + 1) fetched under O += P V(j)
  kSharedQueryEarlyKey,   // as kSharedQuery, K(j + 1) fetched right after S(j), under the softmax too (a third barrier)
  kRegisterQuery,         // Q's fragments held in registers and two K buffers: K(j + 1) under all of tile j
};

// Forward: one block per (query tile of kBlockM, query head, batch); each of
// the kWarps warps owns kBlockM / kWarps query rows (kMAtoms blocks of 16) and
// walks the listed key tiles of kBlockN keys.
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_,
          ForwardPipeline kPipeline_ = ForwardPipeline::kSharedQuery>
struct AttentionForwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr ForwardPipeline kPipeline = kPipeline_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMAtoms = kBlockM / (16 * kWarps);
  using QTile = SwizzledTile<kBlockM, kHeadDim>;   // Q, then O on the way out
  using KVTile = SwizzledTile<kBlockN, kHeadDim>;  // K and V buffers
  static constexpr bool kRegisterQuery = kPipeline == ForwardPipeline::kRegisterQuery;
  // Q, one K and one V buffer; or with kRegisterQuery two K buffers and V's,
  // Q loaded over the second K buffer and V's (both free until the first key
  // tile's loads, which wait for Q's fragments) and O staged there at the end.
  static constexpr int kSharedBytes = kRegisterQuery ? 3 * KVTile::kBytes : QTile::kBytes + 2 * KVTile::kBytes;
  static_assert(!kRegisterQuery || QTile::kBytes <= 2 * KVTile::kBytes,
                "Q in registers: Q must fit the second K buffer and V's");

  static_assert(kHeadDim % 64 == 0, "head_dim must be a multiple of 64");
  static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0, "tiles are made of 16x16 mma blocks");
  static_assert(kMAtoms >= 1 && kMAtoms * 16 * kWarps == kBlockM, "query rows must split into 16-row blocks per warp");
  static_assert(kSharedBytes <= kMaxSharedMemoryPerBlock, "forward config exceeds sm_120 shared memory per block");
};

// Backward: one block per (key tile of kBlockN, key/value head, batch),
// holding dK and dV of its tile in registers while it walks, for each query
// head of the group, the query tiles (kBlockM) that see the key tile.
// Three warp layouts share the block's warps:
//   scores  S, dP   kBlockM x kBlockN: every warp, kBlockM/16 warp rows
//   dV | dK         kBlockN x kHeadDim: the first half of the warps accumulates
//                   dV, the second half dK, each warp kKeyMAtoms 16-row blocks
//   dQ              kBlockM x kHeadDim: kQueryMAtoms 16-row blocks per warp, in
//                   column chunks of kGradQChunk
// Two 16-row blocks per warp in the dV/dK and dQ products let each B
// fragment read from shared memory serve both, and give each warp twice the
// independent accumulators (shared-memory reads and mma latency are what
// bound this kernel); splitting dV from dK keeps the registers per thread
// what one block of each would cost.
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kGradQChunk_>
struct AttentionBackwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kGradQChunk = kGradQChunk_;

  static constexpr int kScoreWarpsN = kWarps / (kBlockM / 16);
  static constexpr int kScoreCols = kBlockN / kScoreWarpsN;

  static constexpr int kProductWarps = kWarps / 2;  // dV warps, then as many dK warps
  static constexpr int kKeyMAtoms = kBlockN >= 32 ? 2 : 1;
  static constexpr int kKeyWarpsM = kBlockN / (16 * kKeyMAtoms);
  static constexpr int kKeyWarpsN = kProductWarps / kKeyWarpsM;
  static constexpr int kKeyCols = kHeadDim / kKeyWarpsN;

  static constexpr int kQueryMAtoms = kBlockM >= 32 ? 2 : 1;
  static constexpr int kQueryWarpsM = kBlockM / (16 * kQueryMAtoms);
  static constexpr int kQueryWarpsN = kWarps / kQueryWarpsM;
  static constexpr int kQueryCols = kHeadDim / kQueryWarpsN;

  using QTile = SwizzledTile<kBlockM, kHeadDim>;      // Q and dO
  using KVTile = SwizzledTile<kBlockN, kHeadDim>;     // K and V, then dK and dV on the way out
  using ScoreTile = SwizzledTile<kBlockM, kBlockN>;   // P and dS
  static constexpr int kSharedBytes =
      2 * KVTile::kBytes + 2 * QTile::kBytes + 2 * ScoreTile::kBytes + 2 * kBlockM * int(sizeof(float));

  static_assert(kHeadDim % 64 == 0, "head_dim must be a multiple of 64");
  static_assert(kWarps % (kBlockM / 16) == 0, "warps must split evenly over the score tile's 16-row groups");
  static_assert(kScoreWarpsN * (kBlockM / 16) == kWarps && kBlockN % kScoreWarpsN == 0 && kScoreCols % 16 == 0,
                "score tile columns per warp must be a multiple of 16");
  static_assert(kWarps % 2 == 0 && kKeyWarpsM * kKeyWarpsN == kProductWarps && kHeadDim % kKeyWarpsN == 0 &&
                    kKeyCols % 16 == 0,
                "half the warps must cover the dV (and dK) tile in column groups of a multiple of 16");
  static_assert(kQueryWarpsM * kQueryWarpsN == kWarps && kHeadDim % kQueryWarpsN == 0 &&
                    kQueryCols % kGradQChunk == 0 && kGradQChunk % 16 == 0,
                "dQ columns per warp must be whole chunks of a multiple of 16");
  static_assert(kSharedBytes <= kMaxSharedMemoryPerBlock, "backward config exceeds sm_120 shared memory per block");
};

// Type selection without <type_traits> (NVRTC compiles these headers too).
template <bool kFirst, class First, class Second>
struct Select {
  using Type = First;
};
template <class First, class Second>
struct Select<false, First, Second> {
  using Type = Second;
};

// The row-wise kernels (backward preprocess, dQ conversion): threads per
// block, (batch, head, query) rows per warp and per block.
constexpr int kRowKernelThreads = 256;
constexpr int kRowKernelRowsPerWarp = 1;
constexpr int kRowKernelRows = kRowKernelThreads / 32 * kRowKernelRowsPerWarp;

// The configurations dflex instantiates, per element type, head dim and
// target (kComputeCapability 90: H100/H200; 120: RTX PRO 6000 / RTX 5090).
// sm_90 forwards give each warp 32 query rows where registers allow (each K/V
// fragment read from shared memory serves twice the rows); sm_120's compiler
// spills those, so its forwards keep 16 rows per warp. sm_120's forward
// pipelines were timed at sm_120's occupancy (docs/perf.md).
template <class Element, int kHeadDim, int kComputeCapability = 90>
struct DefaultAttentionConfigs;

#if defined(__CUDA_ARCH__)
// The compute capability the device code is compiled for (90 for sm_90 and
// sm_90a, 120 for sm_120): generated modules pick their configs with it, so
// each arch's binary, and the launch constants compiled into it, carry that
// arch's configs. A host pass has no target, hence no value.
constexpr int kCompiledComputeCapability = __CUDA_ARCH__ / 10;
#endif

template <class Element, int kComputeCapability>
struct DefaultAttentionConfigs<Element, 64, kComputeCapability> {
  using Forward = typename Select<(kComputeCapability >= 120),
                                  AttentionForwardConfig<Element, 64, 64, 128, 4,
                                                         ForwardPipeline::kRegisterQuery>,  // 48 KB
                                  AttentionForwardConfig<Element, 64, 128, 64, 4>>::Type;  // 32 KB
  using Backward = AttentionBackwardConfig<Element, 64, 64, 64, 4, 32>;                // 48.5 KB
};

template <class Element, int kComputeCapability>
struct DefaultAttentionConfigs<Element, 128, kComputeCapability> {
  using Forward = typename Select<(kComputeCapability >= 120),
                                  AttentionForwardConfig<Element, 128, 64, 64, 4,
                                                         ForwardPipeline::kSharedQueryEarlyKey>,  // 48 KB
                                  AttentionForwardConfig<Element, 128, 128, 64, 4>>::Type;  // 64 KB
  using Backward = AttentionBackwardConfig<Element, 128, 64, 64, 8, 16>;               // 80.5 KB
};

template <class Element, int kComputeCapability>
struct DefaultAttentionConfigs<Element, 256, kComputeCapability> {
  using Forward = typename Select<(kComputeCapability >= 120),
                                  AttentionForwardConfig<Element, 256, 64, 32, 4,
                                                         ForwardPipeline::kRegisterQuery>,  // 48 KB
                                  AttentionForwardConfig<Element, 256, 64, 64, 4>>::Type;  // 96 KB
  using Backward = AttentionBackwardConfig<Element, 256, 32, 32, 4, 16>;               // 68.25 KB
};

}  // namespace kernels
}  // namespace dflex
