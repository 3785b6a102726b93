//===- KeyIntervals.h - a mask as intervals of keys per query row -*- C++ -*-===//
//
// Many masks show each query row one or two runs of keys whose ends follow
// from the row: a sliding window (q - window < kv <= q), the DFlash masks
// (the context before the block's anchor, then the block's own keys up to
// the query). Their pair part, evaluated at every pair of a partial tile,
// recomputes those ends from the row's values and compares the key with
// each one. The same mask reads
//
//   kv - first_i <u count_i   for some interval i,
//
// where first_i and count_i are worked out once per row, so a pair costs a
// subtraction and a comparison per interval (the variant's key_intervals:
// kernels/attention/variant.cuh).
//
// The rewrite applies where the result is built by andi, ori and select
// (on a row condition) from
// - row conditions (values that do not change with the key);
// - comparisons whose two sides are, exactly, the key position times +-1
//   plus values that do not change with the key (sums and differences that
//   provably do not wrap wherever the comparison decides the mask:
//   guardsOf), signed, or unsigned where the side holding the key is
//   non-negative there;
// - such comparisons of a quotient x / c (c a positive constant, x such a
//   sum, non-negative there) with a row value: x / c == y reads
//   c * y <= x <= c * y + c - 1.
// Values too wide to add without overflow are clamped first, to a magnitude
// beyond every key position, which keeps each comparison's outcome. The
// intervals are clamped to the key positions [0, 2^31), so first_i is a
// 31-bit value and count_i an unsigned 32-bit one. It is made only where the test is shorter than
// the mask's pair part (a causal mask's one comparison stays as it is).
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_CODEGEN_KEYINTERVALS_H
#define DFLEX_CODEGEN_KEYINTERVALS_H

#include "dflex/Expr/Program.h"

#include <cstdint>
#include <vector>

namespace dflex::codegen {

/// The most intervals a rewritten mask tests per pair.
constexpr int kMaxKeyIntervals = 4;

struct KeyIntervalForm {
  /// The mask, with the interval test appended and made its result when
  /// `first` is not empty (the instructions before it are the input's).
  expr::Program program;
  /// Per interval, the i32 values of `program` that hold its first key and
  /// its count of keys (row values; the count as unsigned); empty where the
  /// mask is not rewritten.
  std::vector<int32_t> first, count;
};

KeyIntervalForm keyIntervals(const expr::Program &mask);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_KEYINTERVALS_H
