// The variant contract: how generated code customises the attention templates.
//
// A variant is a struct, passed by value as a kernel parameter, that holds the
// captures of a mask / score_mod (device pointers, sizes, constants) and
// provides:
//
//   static constexpr bool kHasScoreMod;
//   __device__ bool  mask(long long b, long long h, long long q, long long kv) const;
//   struct MaskRow; struct MaskColumn;
//   __device__ MaskRow    mask_row(long long b, long long h, long long q) const;
//   __device__ MaskColumn mask_column(long long b, long long h, long long kv) const;
//   __device__ bool       mask_pair(const MaskRow& row, const MaskColumn& column) const;
//   __device__ float score_mod(float s, long long b, long long h, long long q, long long kv) const;
//   __device__ float score_mod_grad(float s, long long b, long long h, long long q, long long kv) const;
//
// b is the batch, h the QUERY head, q and kv absolute positions. s is the
// scaled score scale * dot(q, k); score_mod returns the logit that enters the
// softmax and score_mod_grad its derivative d score_mod / d s. When
// kHasScoreMod is false the logit is s and the two functions are never called
// (they must still exist). mask is called only for tiles the tile list marks
// partial.
//
// mask_pair(mask_row(b, h, q), mask_column(b, h, kv)) equals mask(b, h, q, kv):
// the mask split by what its values change with (dflex-compile emits the
// three), so a kernel works out a row's part once per row and a column's once
// per column and only the rest per pair. A variant may leave the three out
// (hand-written ones do): MaskParts then splits nothing. A part whose values
// are read from captured memory says so with
//   static constexpr bool kReadsMemory = true;
// in its struct: the kernels then work it out once per index for a whole
// warp and share it through shared memory (LogitMap::stage_varying).
//
// Likewise the score_mod split: a variant may provide
//   struct ScoreHead; struct ScoreRow; struct ScoreColumn; struct ScoreDistance;
//   __device__ ScoreHead     score_head(long long b, long long h) const;
//   __device__ ScoreRow      score_row(const ScoreHead& head, long long q) const;
//   __device__ ScoreColumn   score_column(const ScoreHead& head, long long kv) const;
//   __device__ ScoreDistance score_distance(const ScoreHead& head, int distance) const;
//   __device__ float score_pair(const ScoreHead&, const ScoreRow&, const ScoreColumn&, const ScoreDistance&,
//                               float s) const;
//   __device__ float score_grad_pair(<the same>) const;
// with score_pair(head, score_row(head, q), score_column(head, kv),
// score_distance(head, q - kv), s), head = score_head(b, h), equal to
// score_mod(s, b, h, q, kv) (score_grad_pair to score_mod_grad): the kernels
// then work out what depends on the batch and head alone (a slope read per
// head, say) once per batch and head, and what depends on a row, a column
// or the distance q - kv alone (a relative-position bias) once per row,
// column or distinct distance of a thread's tile, instead of once per pair
// (LogitMap). A ScoreColumn read from captured memory says so with
// kReadsMemory as a mask part does: the forwards then read a key tile's
// columns once per warp, before the tile's products, and share them through
// shared memory (ScorePartsStage).

// A mask whose visible keys of a query row form a few intervals may say so
// (dflex-compile emits it where the test is shorter than mask_pair):
//   static constexpr int kKeyIntervals = N;
//   struct KeyIntervals { int first[N]; unsigned count[N]; };
//   __device__ KeyIntervals key_intervals(long long b, long long h, long long q) const;
// mask(b, h, q, kv) then equals, for every in-range kv, whether kv is in one
// of the intervals (in_key_intervals; first in [0, 2^31)): the kernels whose
// rows are fixed along their loop test that per pair instead of mask_pair.
//
// The kernels call these functions only for in-range arguments:
// 0 <= b < batch, 0 <= h < q_heads, 0 <= q < q_len, 0 <= kv < kv_len, so a
// functor may index its captures with them without bounds checks of its own.
// Functions may be __host__ __device__ (the test harness reuses them on the
// host to build tile lists and references).
#pragma once

namespace dflex {
namespace kernels {

template <class Variant>
struct VariantCheck {
  static_assert(sizeof(Variant::kHasScoreMod) > 0 && (Variant::kHasScoreMod == true || Variant::kHasScoreMod == false),
                "a variant needs static constexpr bool kHasScoreMod");
  static constexpr bool kOk = true;
};

// Whether a variant has the mask's parts (MaskRow, mask_row, ...).
template <class Variant, class = void>
struct HasMaskParts {
  static constexpr bool value = false;
};
template <class Variant>
struct HasMaskParts<Variant, decltype(void(sizeof(typename Variant::MaskRow)))> {
  static constexpr bool value = true;
};

// Whether a variant has the score_mod's parts (ScoreHead, score_head, ...).
template <class Variant, class = void>
struct HasScoreHead {
  static constexpr bool value = false;
};
template <class Variant>
struct HasScoreHead<Variant, decltype(void(sizeof(typename Variant::ScoreHead)))> {
  static constexpr bool value = true;
};

// The variant's score_mod part types, or, for a variant without them, an
// empty head and the indices (and their difference) as the other parts.
template <class Variant, bool = HasScoreHead<Variant>::value>
struct ScorePartsOf {
  struct Head {};
  using Row = int;
  using Column = int;
  using Distance = int;
};
template <class Variant>
struct ScorePartsOf<Variant, true> {
  using Head = typename Variant::ScoreHead;
  using Row = typename Variant::ScoreRow;
  using Column = typename Variant::ScoreColumn;
  using Distance = typename Variant::ScoreDistance;
};

// Whether working out a mask or score part reads captured memory (Part::kReadsMemory).
template <class Part, class = void>
struct ReadsMemory {
  static constexpr bool value = false;
};
template <class Part>
struct ReadsMemory<Part, decltype(void(Part::kReadsMemory))> {
  static constexpr bool value = Part::kReadsMemory;
};

// Whether a variant has its mask's key intervals (kKeyIntervals, ...).
template <class Variant, class = void>
struct HasKeyIntervals {
  static constexpr bool value = false;
};
template <class Variant>
struct HasKeyIntervals<Variant, decltype(void(Variant::kKeyIntervals))> {
  static constexpr bool value = Variant::kKeyIntervals > 0;
};

// Whether key kv (0 <= kv < 2^31) is in one of a row's key intervals.
template <class Variant>
__host__ __device__ __forceinline__ bool in_key_intervals(const typename Variant::KeyIntervals& row, int kv) {
  bool seen = false;
#pragma unroll
  for (int i = 0; i < Variant::kKeyIntervals; ++i) {
    seen |= static_cast<unsigned>(kv - row.first[i]) < row.count[i];
  }
  return seen;
}

// The largest mask part the kernels stage in shared memory (two 32-bit
// values, say a position and the document id read for it): bigger ones would
// cost more shared memory than the sm_120 blocks have to spare.
constexpr int kMaxStagedPartBytes = 8;

// The mask's parts for one batch and head, as the kernels call them: the
// variant's own, or, for a variant written with mask() alone, the indices as
// the row and the column. kStageRows and kStageColumns: whether the kernels
// share a row's or a column's part through shared memory instead of each
// thread working out its own (parts that read memory, and are small).
template <class Variant, bool kOwn = HasMaskParts<Variant>::value>
struct MaskParts {
  using Row = typename Variant::MaskRow;
  using Column = typename Variant::MaskColumn;
  static constexpr bool kStageRows = ReadsMemory<Row>::value && sizeof(Row) <= kMaxStagedPartBytes;
  static constexpr bool kStageColumns = ReadsMemory<Column>::value && sizeof(Column) <= kMaxStagedPartBytes;
  const Variant& variant;
  long long b, h;
  __host__ __device__ Row row(long long q) const { return variant.mask_row(b, h, q); }
  __host__ __device__ Column column(long long kv) const { return variant.mask_column(b, h, kv); }
  __host__ __device__ bool pair(const Row& row, const Column& column) const { return variant.mask_pair(row, column); }
};
template <class Variant>
struct MaskParts<Variant, false> {
  using Row = long long;
  using Column = long long;
  static constexpr bool kStageRows = false;
  static constexpr bool kStageColumns = false;
  const Variant& variant;
  long long b, h;
  __host__ __device__ Row row(long long q) const { return q; }
  __host__ __device__ Column column(long long kv) const { return kv; }
  __host__ __device__ bool pair(Row q, Column kv) const { return variant.mask(b, h, q, kv); }
};

}  // namespace kernels
}  // namespace dflex
