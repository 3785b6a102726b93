// Compile-time configuration of the chunked gated-delta-rule kernels: what a
// `dflex.gated_delta` spec fixes (key/value dims, gate kind, delta rule, q/k
// L2 normalisation, in-kernel gate, initial/final state, varlen), the tiles
// derived from it, and the shared memory of every kernel, each checked against
// sm_120's 101,376 B per block.
#pragma once

#include "../common/mma.cuh"
#include "params.cuh"

namespace dflex {
namespace kernels {

enum class GateKind { kNone, kScalarLog, kChannelLog };

__host__ __device__ constexpr int align_up_128(int bytes) { return (bytes + 127) / 128 * 128; }

template <int kKeyDim_, int kValueDim_, GateKind kGate_, bool kDeltaRule_, bool kQkL2Norm_, bool kInKernelGate_,
          bool kInitialState_, bool kFinalState_, bool kVarlen_>
struct GatedDeltaConfig {
  using Element = __nv_bfloat16;
  static constexpr int kKeyDim = kKeyDim_;
  static constexpr int kValueDim = kValueDim_;
  static constexpr GateKind kGate = kGate_;
  static constexpr bool kDeltaRule = kDeltaRule_;
  static constexpr bool kQkL2Norm = kQkL2Norm_;
  static constexpr bool kInKernelGate = kInKernelGate_;
  static constexpr bool kInitialState = kInitialState_;
  static constexpr bool kFinalState = kFinalState_;
  static constexpr bool kVarlen = kVarlen_;
  static constexpr bool kHasGate = kGate != GateKind::kNone;

  static_assert(kKeyDim == 64 || kKeyDim == 128, "gated delta: key_dim must be 64 or 128");
  static_assert(kValueDim == 64 || kValueDim == 128, "gated delta: value_dim must be 64 or 128");
  static_assert(kGate != GateKind::kChannelLog,
                "gated delta: gate(channel_log) is not supported by these kernels (per-channel decay needs "
                "sub-chunk rescaling that is not implemented)");
  static_assert(!kInKernelGate || kGate == GateKind::kScalarLog, "gated delta: in_kernel_gate requires gate(scalar_log)");

  static constexpr int kChunk = kGatedDeltaChunk;
  // Value columns per block of the sequential state kernels and per step of
  // the backward chunk kernel: the state recurrence is independent per value
  // column, so more blocks run side by side over the heads.
  static constexpr int kValueBlock = 32;
  static constexpr int kThreads = 128;          // every kernel but the backward chunk kernel
  static constexpr int kChunkBackwardThreads = 256;
  static constexpr int kChunkBackwardSlices = kChunkBackwardThreads / 128;  // warp column slices per 16-row block
  static constexpr int kWarps = kThreads / 32;

  using KeyTile = SwizzledTile<kChunk, kKeyDim>;            // q, k, W of one chunk
  using ValueTile = SwizzledTile<kChunk, kValueDim>;        // v, delta, dO of one chunk
  using ChunkTile = SwizzledTile<kChunk, kChunk>;           // T, P, dP, G
  using StateTile = SwizzledTile<kKeyDim, kValueDim>;       // one chunk state
  using ValueBlockTile = SwizzledTile<kChunk, kValueBlock>; // a value-column block of a chunk tile
  using StateBlockTile = SwizzledTile<kKeyDim, kValueBlock>;  // a value-column block of a state
  using HalfStateTile = SwizzledTile<kKeyDim, 64>;          // 64 value columns of a state

  // State rows per warp of the backward prepare kernel's Q^T dO (kKeyDim rows).
  static constexpr int kStateRowsPerWarp = kKeyDim / kWarps;
  static constexpr int kStateAtoms = kStateRowsPerWarp / 16;
  static_assert(kStateAtoms * 16 * kWarps == kKeyDim, "state rows must split into 16-row blocks per warp");
  // The sequential state kernels: one warp per 16 rows of the kKeyDim x
  // kValueBlock state (more warps shorten each chunk step, which is latency
  // bound); their 64-row products split into 4 row blocks x kStateSlices
  // column slices of the value block.
  static constexpr int kStateThreads = 2 * kKeyDim;
  static constexpr int kStateSlices = kStateThreads / 128;
  static_assert(kValueDim % kValueBlock == 0, "value dim must be whole value blocks");

  // Forward prepare: k, v; T and A as bf16 high and low parts (x = high +
  // low to about 2^-16, so the tensor-core solve keeps fp32 accuracy; T's high
  // part is T in bf16); the fp32 diagonal 16x16 blocks of A; gates.
  static constexpr int kDiagonalRow = 17;  // padded fp32 row of a diagonal block
  struct ForwardPrepare {
    static constexpr int kKeys = 0;
    static constexpr int kValues = kKeys + KeyTile::kBytes;
    static constexpr int kTInverse = kValues + (kDeltaRule ? ValueTile::kBytes : 0);
    static constexpr int kTLow = kTInverse + (kDeltaRule ? ChunkTile::kBytes : 0);
    static constexpr int kAHigh = kTLow + (kDeltaRule ? ChunkTile::kBytes : 0);
    static constexpr int kALow = kAHigh + (kDeltaRule ? ChunkTile::kBytes : 0);
    static constexpr int kDiagonal = kALow + (kDeltaRule ? ChunkTile::kBytes : 0);
    static constexpr int kGates = kDiagonal + (kDeltaRule ? align_up_128(kChunk * kDiagonalRow * 4) : 0);
    static constexpr int kBytes = kGates + align_up_128((4 * kChunk + 2) * 4);
  };
  // Forward state: two stages of (W, k, U block), the state block, the delta
  // block and delta's rows scaled by key_decay.
  struct ForwardState {
    static constexpr int kStageBytes = (kDeltaRule ? KeyTile::kBytes : 0) + KeyTile::kBytes + ValueBlockTile::kBytes;
    static constexpr int kStages = 0;
    static constexpr int kState = kStages + 2 * kStageBytes;
    static constexpr int kDelta = kState + StateBlockTile::kBytes;
    static constexpr int kScaledDelta = kDelta + (kDeltaRule ? ValueBlockTile::kBytes : 0);
    static constexpr int kBytes = kScaledDelta + ValueBlockTile::kBytes;
  };
  // Forward output: q, k, chunk state, delta, P, gates.
  struct ForwardOutput {
    static constexpr int kQueries = 0;
    static constexpr int kKeys = kQueries + KeyTile::kBytes;
    static constexpr int kState = kKeys + KeyTile::kBytes;
    static constexpr int kDelta = kState + StateTile::kBytes;
    static constexpr int kScores = kDelta + ValueTile::kBytes;
    static constexpr int kGates = kScores + ChunkTile::kBytes;
    static constexpr int kBytes = kGates + align_up_128(kChunk * 4);
  };
  // Backward prepare: q, k, dO, P, an output staging tile, gates.
  struct BackwardPrepare {
    static constexpr int kStagingBytes =
        ValueTile::kBytes > HalfStateTile::kBytes ? ValueTile::kBytes : HalfStateTile::kBytes;
    static constexpr int kQueries = 0;
    static constexpr int kKeys = kQueries + KeyTile::kBytes;
    static constexpr int kGradO = kKeys + KeyTile::kBytes;
    static constexpr int kScores = kGradO + ValueTile::kBytes;
    static constexpr int kStaging = kScores + ChunkTile::kBytes;
    static constexpr int kGates = kStaging + kStagingBytes;
    static constexpr int kBytes = kGates + align_up_128(kChunk * 4);
  };
  // Backward state: two stages of (M block, k, d delta block, W), dS block.
  struct BackwardState {
    static constexpr int kStageBytes =
        StateBlockTile::kBytes + KeyTile::kBytes + ValueBlockTile::kBytes + (kDeltaRule ? KeyTile::kBytes : 0);
    static constexpr int kStages = 0;
    static constexpr int kStateGrad = kStages + 2 * kStageBytes;
    static constexpr int kBytes = kStateGrad + StateBlockTile::kBytes;
  };
  // Backward chunk: T, two stages of per-value-block tiles (the stage free
  // during the last block receives q and k), dX blocks (dX, E dX), per-row
  // scalars. After the value loop, dP o Gamma and G overlay the other
  // stage, and then dq and dk on their way out.
  struct BackwardChunk {
    static constexpr int kGradOOffset = 0;  // offsets inside a stage
    static constexpr int kStateOffset = kGradOOffset + ValueBlockTile::kBytes;
    static constexpr int kStateGradOffset = kStateOffset + StateBlockTile::kBytes;
    static constexpr int kDeltaOffset = kStateGradOffset + StateBlockTile::kBytes;  // delta (v without the rule)
    static constexpr int kGradDeltaOffset = kDeltaOffset + ValueBlockTile::kBytes;
    static constexpr int kValuesOffset = kGradDeltaOffset + (kDeltaRule ? ValueBlockTile::kBytes : 0);
    static constexpr int kBlockBytes = kValuesOffset + (kDeltaRule ? ValueBlockTile::kBytes : 0);
    static constexpr int kStageBytes = kBlockBytes > 2 * KeyTile::kBytes ? kBlockBytes : 2 * KeyTile::kBytes;
    static constexpr int kTInverse = 0;
    static constexpr int kStages = kTInverse + (kDeltaRule ? ChunkTile::kBytes : 0);
    static constexpr int kGradX = kStages + 2 * kStageBytes;
    static constexpr int kDecayedGradX = kGradX + (kDeltaRule ? ValueBlockTile::kBytes : 0);
    static constexpr int kScalars = kDecayedGradX + (kDeltaRule ? ValueBlockTile::kBytes : 0);
    static constexpr int kRowSums = 5;  // per-slice partials of dgate, dbeta, r, q.dq, k.dk
    // gate, beta, 1/|q|, 1/|k|, dc; the row sums' partials; column partials of dgate per row block
    static constexpr int kScalarRows = 5 + kRowSums * kChunkBackwardSlices + 4;
    static constexpr int kBytes =
        kScalars + align_up_128((kScalarRows * kChunk + kChunkBackwardThreads / 32 + 8) * 4);
    static_assert(2 * ChunkTile::kBytes <= kStageBytes, "dP o Gamma and G must fit in one stage");
  };

  static_assert(ForwardPrepare::kBytes <= kMaxSharedMemoryPerBlock, "gated delta forward prepare exceeds sm_120 shared memory");
  static_assert(ForwardState::kBytes <= kMaxSharedMemoryPerBlock, "gated delta forward state exceeds sm_120 shared memory");
  static_assert(ForwardOutput::kBytes <= kMaxSharedMemoryPerBlock, "gated delta forward output exceeds sm_120 shared memory");
  static_assert(BackwardPrepare::kBytes <= kMaxSharedMemoryPerBlock, "gated delta backward prepare exceeds sm_120 shared memory");
  static_assert(BackwardState::kBytes <= kMaxSharedMemoryPerBlock, "gated delta backward state exceeds sm_120 shared memory");
  static_assert(BackwardChunk::kBytes <= kMaxSharedMemoryPerBlock, "gated delta backward chunk exceeds sm_120 shared memory");
};

}  // namespace kernels
}  // namespace dflex
