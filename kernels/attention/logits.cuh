// From raw dot products to the logits the softmax sees, through the variant:
// logit = score_mod(scale * q.k) (or scale * q.k), kept in log2 units
// (multiplied by log2(e)) so the kernels exponentiate with exp2; pairs the
// mask hides or that lie past the sequence ends become -inf.
#pragma once

#include "../common/device.cuh"
#include "config.cuh"
#include "variant.cuh"

namespace dflex {
namespace kernels {

// The two sides of LogitMap::visibility's pairs as mask parts: the fixed
// side's two indices are queries (rows) and the varying side's keys
// (columns), or, with kKeysFixed, the other way round. Rows fixed, a mask
// with key intervals (variant.cuh) takes them as the row's part and the key
// itself as the column's.
template <class Variant, bool kKeysFixed, bool kIntervals = !kKeysFixed && HasKeyIntervals<Variant>::value>
struct VisibilitySides {
  using Parts = MaskParts<Variant>;
  using Fixed = typename Select<kKeysFixed, typename Parts::Column, typename Parts::Row>::Type;
  using Varying = typename Select<kKeysFixed, typename Parts::Row, typename Parts::Column>::Type;
  static constexpr bool kStaged = kKeysFixed ? Parts::kStageRows : Parts::kStageColumns;  // worth staging
  __device__ __forceinline__ static Fixed fixed(const Parts& parts, int index) {
    if constexpr (kKeysFixed) return parts.column(index);
    else return parts.row(index);
  }
  __device__ __forceinline__ static Varying varying(const Parts& parts, int index) {
    if constexpr (kKeysFixed) return parts.row(index);
    else return parts.column(index);
  }
  __device__ __forceinline__ static bool pair(const Parts& parts, const Fixed& fixed, const Varying& varying) {
    if constexpr (kKeysFixed) return parts.pair(varying, fixed);
    else return parts.pair(fixed, varying);
  }
};

template <class Variant>
struct VisibilitySides<Variant, false, true> {
  using Parts = MaskParts<Variant>;
  using Fixed = typename Variant::KeyIntervals;
  using Varying = int;
  static constexpr bool kStaged = false;  // the key is its own part
  __device__ __forceinline__ static Fixed fixed(const Parts& parts, int q) {
    return parts.variant.key_intervals(parts.b, parts.h, q);
  }
  __device__ __forceinline__ static Varying varying(const Parts&, int kv) { return kv; }
  __device__ __forceinline__ static bool pair(const Parts&, const Fixed& row, int kv) {
    return in_key_intervals<Variant>(row, kv);
  }
};

// Static shared memory for the varying side's parts of kCount consecutive
// indices, one array per warp of kWarps (LogitMap::stage_varying), used
// (kUsed) where the variant's parts are staged and the arrays fit in the
// kBytesFree bytes the kernel's block has left; else a single element, never
// read, which the compiler leaves out of the block's shared memory.
template <class Variant, bool kKeysFixed, int kCount, int kWarps, int kBytesFree>
struct VaryingPartsStage {
  using Part = typename VisibilitySides<Variant, kKeysFixed>::Varying;
  static constexpr int kWantedBytes = int(sizeof(Part)) * kWarps * kCount;
  static constexpr bool kUsed = VisibilitySides<Variant, kKeysFixed>::kStaged && kWantedBytes <= kBytesFree;
  static constexpr int kUsedBytes = kUsed ? kWantedBytes : 0;  // an unused stage is never read: no shared memory
  Part parts[kUsed ? kWarps : 1][kUsed ? kCount : 1];
  __device__ __forceinline__ Part* of_warp(int warp) { return parts[kUsed ? warp : 0]; }
};

// The bytes a portable kernel's block with `dynamic_bytes` of dynamic shared
// memory has left for a stage: those that do not cost an sm_120 SM one of its
// blocks. The portable kernels are sm_120's, whose 100 KB per SM are the least
// of their targets: a 48 KB block has 1 KB to spare, and a stage that took an
// SM's second block would cost more than it saves.
__host__ __device__ constexpr int portable_stage_bytes(int dynamic_bytes) {
  return occupancy_free_shared_bytes(dynamic_bytes, shared_bytes_per_sm(120));
}

template <class Variant>
struct LogitMap {
  // The score_mod's parts (variant.cuh): the batch and head's, worked out
  // once; a row's and a column's, worked out by the kernels once per row or
  // column of a thread's tile (score_row, score_column) and passed to logit.
  static constexpr bool kSplitScore = Variant::kHasScoreMod && HasScoreHead<Variant>::value;
  using ScoreParts = ScorePartsOf<Variant>;
  using ScoreRow = typename ScoreParts::Row;
  using ScoreColumn = typename ScoreParts::Column;
  using ScoreDistance = typename ScoreParts::Distance;

  const Variant& variant;
  int batch;
  int head;
  float scale;
  float scale_log2;
  typename ScoreParts::Head score_head;

  __device__ __forceinline__ LogitMap(const Variant& variant_, int batch_, int head_, float scale_)
      : variant(variant_), batch(batch_), head(head_), scale(scale_), scale_log2(scale_ * kLog2e) {
    if constexpr (kSplitScore) score_head = variant.score_head(batch, head);
  }

  __device__ __forceinline__ ScoreRow score_row(int q) const {
    if constexpr (kSplitScore) return variant.score_row(score_head, q);
    else return q;
  }
  __device__ __forceinline__ ScoreColumn score_column(int kv) const {
    if constexpr (kSplitScore) return variant.score_column(score_head, kv);
    else return kv;
  }
  __device__ __forceinline__ ScoreDistance score_distance(int distance) const {
    if constexpr (kSplitScore) return variant.score_distance(score_head, distance);
    else return distance;
  }

  // The distance parts of a thread's score fragment, block by block: its
  // element (j, i) pairs a fixed index with a varying one at distance
  // distance0 + kSign * (8 * j + i % 2 - 8 * (i / 2)) (kSign -1: rows
  // fixed, keys varying, as in a score tile; +1: keys fixed, as in the Hopper
  // backward's S^T). Block j's elements with i / 2 == 1 sit at the distances
  // of block j - 1's with i / 2 == 0, so each block works out two: enter(j)
  // in ascending j, then of(i).
  template <int kSign>
  struct BlockDistances {
    const LogitMap& logits;
    int distance0;
    ScoreDistance first[2];   // block j's elements i / 2 == 0
    ScoreDistance second[2];  // its elements i / 2 == 1: block j - 1's first
    __device__ __forceinline__ BlockDistances(const LogitMap& logits_, int distance0_)
        : logits(logits_), distance0(distance0_) {
      second[0] = logits.score_distance(distance0 - 8 * kSign);
      second[1] = logits.score_distance(distance0 - 7 * kSign);
    }
    __device__ __forceinline__ void enter(int j) {
      if (j > 0) {
        second[0] = first[0];
        second[1] = first[1];
      }
      first[0] = logits.score_distance(distance0 + kSign * 8 * j);
      first[1] = logits.score_distance(distance0 + kSign * (8 * j + 1));
    }
    __device__ __forceinline__ const ScoreDistance& of(int i) const { return (i >> 1) ? second[i & 1] : first[i & 1]; }
  };

  // Logit of an in-range pair (its row's, column's and distance's score
  // parts), in log2 units.
  __device__ __forceinline__ float logit(float dot, const ScoreRow& row, const ScoreColumn& column,
                                         const ScoreDistance& distance) const {
    if constexpr (Variant::kHasScoreMod) {
      return modified_score(dot, row, column, distance) * kLog2e;
    } else {
      return dot * scale_log2;
    }
  }

  // score_mod(scale * dot) of an in-range pair, in natural units.
  __device__ __forceinline__ float modified_score(float dot, const ScoreRow& row, const ScoreColumn& column,
                                                  const ScoreDistance& distance) const {
    static_assert(Variant::kHasScoreMod, "a variant without a score_mod has no modified score");
    if constexpr (kSplitScore) {
      return variant.score_pair(score_head, row, column, distance, dot * scale);
    } else {
      return variant.score_mod(dot * scale, batch, head, row, column);
    }
  }

  // d logit / d dot, in natural units (the scale included).
  __device__ __forceinline__ float logit_grad(float dot, const ScoreRow& row, const ScoreColumn& column,
                                              const ScoreDistance& distance) const {
    if constexpr (kSplitScore) {
      return variant.score_grad_pair(score_head, row, column, distance, dot * scale) * scale;
    } else if constexpr (Variant::kHasScoreMod) {
      return variant.score_mod_grad(dot * scale, batch, head, row, column) * scale;
    } else {
      return scale;
    }
  }

  // With kStaged (a VaryingPartsStage's kUsed): the varying side's parts of
  // indices first .. first + kCount - 1, each clamped into range, into the
  // warp's `staged` array, kCount / 32 per lane, so that a part read from
  // memory is read once per warp and index instead of once per thread that
  // needs it. Every lane of the warp calls it; without kStaged it does
  // nothing. visibility<..., kStaged>() then takes the parts from `staged`.
  template <int kCount, bool kKeysFixed, bool kStaged>
  __device__ __forceinline__ void stage_varying(typename VisibilitySides<Variant, kKeysFixed>::Varying* staged,
                                                int first, int q_len, int kv_len, int lane) const {
    using Sides = VisibilitySides<Variant, kKeysFixed>;
    if constexpr (kStaged) {
      const int varying_len = kKeysFixed ? q_len : kv_len;
      const MaskParts<Variant> parts{variant, batch, head};
      __syncwarp();  // every lane is done with what the array held
#pragma unroll
      for (int i = lane; i < kCount; i += 32) staged[i] = Sides::varying(parts, min(first + i, varying_len - 1));
      __syncwarp();
    }
  }

  // The visibility of a thread's score elements as bits, bit 4 * j + i for
  // element (j, i): the pair of fixed index fixed0 + 8 * (i / 2) and varying
  // index varying0 + 8 * j + i % 2, where the fixed indices are queries (a
  // score tile's rows: the pairs of apply below) or, with kKeysFixed, keys
  // (the Hopper backward's S^T, rows = keys). In range and, in a partial
  // tile, unmasked; the mask runs on pairs clamped into range (the variant
  // is never called with an out-of-range index). It depends on positions
  // only, so a kernel can work it out before the scores exist, while fewer
  // registers are live. The mask's parts of the thread's two fixed indices
  // are worked out once, those of each varying index once, and only its
  // pair part per element (the contract in variant.cuh). The loop over
  // blocks stays rolled: the mask's body then appears once per call instead
  // of once per element, which keeps NVRTC's time on the kernels down.
  // With kStaged, `staged` points at the part of varying0 in the warp's
  // array (stage_varying); without, it is not read.
  template <int kBlocks, bool kKeysFixed, bool kStaged>
  __device__ __forceinline__ unsigned long long visibility(
      bool partial, int fixed0, int varying0, int q_len, int kv_len,
      const typename VisibilitySides<Variant, kKeysFixed>::Varying* staged) const {
    static_assert(4 * kBlocks <= 64, "one bit per element of a 64-bit word");
    using Sides = VisibilitySides<Variant, kKeysFixed>;
    const int fixed_len = kKeysFixed ? kv_len : q_len;
    const int varying_len = kKeysFixed ? q_len : kv_len;
    const MaskParts<Variant> parts{variant, batch, head};
    const typename Sides::Fixed fixed[2] = {Sides::fixed(parts, min(fixed0, fixed_len - 1)),
                                            Sides::fixed(parts, min(fixed0 + 8, fixed_len - 1))};
    // The mask per element, in a partial tile only, as two 32-bit words
    // (blocks 0-7 and 8-15); the sequence ends as whole words.
    unsigned low = partial ? 0u : ~0u;
    unsigned high = low;
#pragma unroll 2
    for (int j = 0; partial && j < kBlocks; ++j) {
      typename Sides::Varying varied[2];
      if constexpr (kStaged) {
        varied[0] = staged[8 * j];
        varied[1] = staged[8 * j + 1];
      } else {
        const int varying = varying0 + 8 * j;
        varied[0] = Sides::varying(parts, min(varying, varying_len - 1));
        varied[1] = Sides::varying(parts, min(varying + 1, varying_len - 1));
      }
      unsigned block_bits = 0;  // one shift per block, not per element
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        block_bits |= static_cast<unsigned>(Sides::pair(parts, fixed[i >> 1], varied[i & 1])) << i;
      }
      block_bits <<= 4 * (j & 7);
      if (j < 8) {
        low |= block_bits;
      } else {
        high |= block_bits;
      }
    }
    return ((static_cast<unsigned long long>(high) << 32) | low) &
           in_range_bits<kBlocks>(fixed_len - fixed0, varying_len - varying0);
  }

  // The elements of visibility()'s bit layout whose fixed index (fixed0 +
  // 8 * (i / 2)) and varying index (varying0 + 8 * j + i % 2) are in range,
  // given fixed_left = fixed_len - fixed0 and varying_left = varying_len -
  // varying0: per 4-bit block j, bits 0 and 2 need 8 * j < varying_left,
  // bits 1 and 3 8 * j + 1 < varying_left; bits 0 and 1 need fixed_left > 0,
  // bits 2 and 3 fixed_left > 8.
  template <int kBlocks>
  __device__ __forceinline__ static unsigned long long in_range_bits(int fixed_left, int varying_left) {
    auto first_blocks = [](int blocks) {  // the bits of blocks 0 .. blocks - 1
      blocks = max(0, min(kBlocks, blocks));
      return blocks >= 16 ? ~0ull : (1ull << (4 * blocks)) - 1;
    };
    const unsigned long long columns = (first_blocks((varying_left + 7) >> 3) & 0x5555555555555555ull) |
                                       (first_blocks((varying_left + 6) >> 3) & 0xaaaaaaaaaaaaaaaaull);
    const unsigned long long rows = (fixed_left > 0 ? 0x3333333333333333ull : 0ull) |
                                    (fixed_left > 8 ? 0xccccccccccccccccull : 0ull);
    return columns & rows;
  }

  // The forwards exponentiate exponent_scale() * x - base in one FFMA, x what
  // apply() leaves of a visible pair: without a score_mod the dot product
  // itself (the scale goes to exponent_scale()), with one the modified score
  // (log2(e) goes to exponent_scale()); both factors are positive, so a
  // row's largest x is its largest logit.
  __device__ __forceinline__ float exponent_scale() const { return Variant::kHasScoreMod ? kLog2e : scale_log2; }
  __device__ __forceinline__ float exponent_operand(float dot, const ScoreRow& row, const ScoreColumn& column,
                                                    const ScoreDistance& distance) const {
    if constexpr (Variant::kHasScoreMod) {
      return modified_score(dot, row, column, distance);
    } else {
      return dot;
    }
  }

  // The score parts of a thread's two rows, q0 and q0 + 8 (clamped into
  // range): a forward's rows stay for all its key tiles, so it works them
  // out once, before them.
  __device__ __forceinline__ void score_rows(int q0, int q_len, ScoreRow (&rows)[2]) const {
    rows[0] = score_row(min(q0, q_len - 1));
    rows[1] = score_row(min(q0 + 8, q_len - 1));
  }

  // With kStaged (a ScorePartsStage's kUsed): the score parts of rows
  // (kRows) or columns first .. first + kCount - 1, clamped below `length`,
  // kCount / 32 per lane, read into `fetched` before a tile's products, so
  // that the reads' latency passes under them, and stored into the warp's
  // `staged` array after (store_score_parts); the kernels then take a
  // thread's parts from there. Every lane of the warp calls both; without
  // kStaged they do nothing.
  template <bool kRows, int kCount, bool kStaged, class Fetched>
  __device__ __forceinline__ void fetch_score_parts(int first, int length, int lane, Fetched& fetched) const {
    if constexpr (kStaged) {
      static_assert(kCount % 32 == 0, "whole parts per lane");
#pragma unroll
      for (int i = 0; i < kCount / 32; ++i) {
        const int index = min(first + lane + 32 * i, length - 1);
        if constexpr (kRows) fetched.parts[i] = score_row(index);
        else fetched.parts[i] = score_column(index);
      }
    }
  }
  template <int kCount, bool kStaged, class Fetched, class Part>
  __device__ __forceinline__ void store_score_parts(const Fetched& fetched, int lane, Part* staged) const {
    if constexpr (kStaged) {
      __syncwarp();  // every lane is done with what the array held
#pragma unroll
      for (int i = 0; i < kCount / 32; ++i) staged[lane + 32 * i] = fetched.parts[i];
      __syncwarp();
    }
  }

  // apply() with the visibility worked out beforehand (kChecked) or every
  // pair shown. The thread's two rows' score parts come worked out
  // (score_rows); each column pair's are worked out once per key block, or
  // with kScoreStaged taken from `staged_columns` (the warp's array at the
  // thread's first key, store_score_parts); each distance's once
  // (BlockDistances).
  template <bool kChecked, bool kScoreStaged, int kBlocks>
  __device__ __forceinline__ void apply_shown(float (&scores)[kBlocks][4], unsigned long long bits,
                                              const ScoreRow (&rows)[2], int q0, int kv0,
                                              const ScoreColumn* staged_columns) const {
    BlockDistances<-1> distances(*this, q0 - kv0);
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      ScoreColumn columns[2];
      if constexpr (kScoreStaged) {
        columns[0] = staged_columns[8 * j];
        columns[1] = staged_columns[8 * j + 1];
      } else {
        columns[0] = score_column(kv0 + 8 * j);
        columns[1] = score_column(kv0 + 8 * j + 1);
      }
      distances.enter(j);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float operand = exponent_operand(scores[j][i], rows[i >> 1], columns[i & 1], distances.of(i));
        scores[j][i] = !kChecked || ((bits >> (4 * j + i)) & 1) ? operand : negative_infinity();
      }
    }
  }

  // Maps a warp's score accumulators in place to the forwards' exponent
  // operands (exponent_operand; -inf where hidden). Element (j, i) of the thread
  // is the pair (q0 + 8 * (i / 2), kv0 + 8 * j + i % 2), `rows` the score
  // parts of its two rows (score_rows). `checked` selects the per-pair
  // visibility test (partial tiles and tiles crossing a sequence end);
  // kStaged and `staged` as for visibility(), kScoreStaged and
  // `staged_columns` as for apply_shown().
  template <bool kStaged, bool kScoreStaged, int kBlocks>
  __device__ __forceinline__ void apply(float (&scores)[kBlocks][4], bool checked, bool partial,
                                        const ScoreRow (&rows)[2], int q0, int kv0, int q_len, int kv_len,
                                        const typename VisibilitySides<Variant, false>::Varying* staged,
                                        const ScoreColumn* staged_columns) const {
    if (!checked) {
      apply_shown<false, kScoreStaged>(scores, ~0ull, rows, q0, kv0, staged_columns);
    } else {
      const unsigned long long bits = visibility<kBlocks, false, kStaged>(partial, q0, kv0, q_len, kv_len, staged);
      apply_shown<true, kScoreStaged>(scores, bits, rows, q0, kv0, staged_columns);
    }
  }
};

// Static shared memory for the score_mod's row (kRows) or column parts of
// kCount consecutive queries or keys, one array per warp of kWarps
// (LogitMap::fetch_score_parts and store_score_parts), used (kUsed) where
// that part reads memory and the arrays fit in the kBytesFree bytes the
// kernel's block has left; else a single element, never read. Fetched: one
// lane's parts on their way.
template <class Variant, bool kRows, int kCount, int kWarps, int kBytesFree>
struct ScorePartsStage {
  using Logits = LogitMap<Variant>;
  using Part = typename Select<kRows, typename Logits::ScoreRow, typename Logits::ScoreColumn>::Type;
  static constexpr int kWantedBytes = int(sizeof(Part)) * kWarps * kCount;
  static constexpr bool kUsed = Logits::kSplitScore && ReadsMemory<Part>::value && kWantedBytes <= kBytesFree;
  struct Fetched {
    Part parts[kUsed ? kCount / 32 : 1];
  };
  Part parts[kUsed ? kWarps : 1][kUsed ? kCount : 1];
  __device__ __forceinline__ Part* of_warp(int warp) { return parts[kUsed ? warp : 0]; }
};

// The forwards' online softmax moves a row's exponent base (the maximum its
// exponents are taken against) lazily: only when some row of the warp has
// grown past its base by more than kRescaleSlack (log2 units). P then stays
// below 2^kRescaleSlack, and most key tiles skip rescaling O and the row
// sums. The result does not depend on when a base moved: the end divides by
// the sum taken against the same base, and the LSE adds that base back.
constexpr float kRescaleSlack = 8.f;

// A row's exponent base for the running maximum `row_max`: 0 while the row
// has seen nothing (max -inf), so that exp2(-inf - -inf) never makes a NaN.
__device__ __forceinline__ float exponent_base(float row_max) {
  return row_max == negative_infinity() ? 0.f : row_max;
}

// The maxima, in the exponents' units, of the thread's two rows of a score
// tile that apply() mapped, each with its row's base: what
// move_exponent_bases takes as tile_max.
template <int kBlocks>
__device__ __forceinline__ void exponent_tile_max(const float (&scores)[kBlocks][4], const float (&row_max)[2],
                                                  float exponent_scale, float (&tile_max)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float largest = negative_infinity();
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) largest = fmaxf(largest, fmaxf(scores[j][2 * half], scores[j][2 * half + 1]));
    tile_max[half] = fmaxf(row_max[half], quad_max(largest) * exponent_scale);
  }
}

// The thread's two rows (row_max: their bases) after a tile whose maxima
// (bases included) are tile_max: moves both bases to the maxima if the warp
// needs it, with the factors that rescale what was taken against the old
// ones in `correction`. Every lane of the warp calls it; returns whether the
// bases moved.
__device__ __forceinline__ bool move_exponent_bases(float (&row_max)[2], const float (&tile_max)[2],
                                                    float (&correction)[2]) {
  const bool grown = tile_max[0] > row_max[0] + kRescaleSlack || tile_max[1] > row_max[1] + kRescaleSlack;
  if (!__any_sync(0xffffffffu, grown)) return false;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    correction[half] = fast_exp2(row_max[half] - exponent_base(tile_max[half]));
    row_max[half] = tile_max[half];
  }
  return true;
}

}  // namespace kernels
}  // namespace dflex
