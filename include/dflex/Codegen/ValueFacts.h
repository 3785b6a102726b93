//===- ValueFacts.h - what the code generator proves of a body's values -*- C++ -*-===//
//
// Facts about the values of a mask or score_mod program that hold in every
// launch of the kernels, used to choose how the generated code computes them:
// which values are fixed for a launch, where a mask value changes inside the
// kernels' loops, the range of each integer, and the comparisons that hold
// wherever a value can change the result.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_CODEGEN_VALUEFACTS_H
#define DFLEX_CODEGEN_VALUEFACTS_H

#include "dflex/Expr/Program.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace dflex::codegen {

/// Instructions whose value is fixed for a launch: computed from constants,
/// scalar captures and tensor sizes only (no leading argument, no element
/// read).
std::vector<bool> launchInvariant(const expr::Program &program);

/// Where a value of a mask or score_mod changes inside the kernels' loops.
/// Values of b, h, captures and constants only are fixed for a thread
/// (Fixed); the others change with the query row, the key column, or both
/// (Pair), as a score_mod's score does. With `distances`, the difference
/// q_idx - kv_idx of the positions themselves (at 32 bits or more, so
/// exact), and values of it and fixed ones alone, change with the distance
/// (Distance), which the kernels work out once per distinct distance of a
/// thread's tile.
enum class Variance : uint8_t { Fixed = 0, Row = 1, Column = 2, Pair = 3, Distance = 4 };

std::vector<Variance> bodyVariance(const expr::Program &program, bool distances = false);

/// Whether instruction n is q_idx - kv_idx of the positions themselves:
/// a subtraction, at 32 bits or more, of the query's argument and the
/// key's, or of casts of them at 32 bits or more (the positions are below
/// 2^31, so these keep them and their difference exact).
bool isPositionDistance(const expr::Program &program, int32_t n);

/// A signed range [first, second] of an integer value.
using ValueRange = std::pair<int64_t, int64_t>;

/// Conservative signed ranges of the integer instructions, over every
/// launch the kernels take: b and h at most bundle::kMaxAttentionBatchOrHeads,
/// q_idx and kv_idx below 2^31 (lengths at most bundle::kMaxAttentionLength,
/// and a tile's rows past the end within 2^16 of it); unknown values span
/// their type.
std::vector<ValueRange> integerRanges(const expr::Program &program);

/// The instructions a result of the program (its result, a score_mod's
/// derivative) is computed from.
std::vector<bool> reachesResult(const expr::Program &program);

/// For each instruction, the comparisons that hold wherever its value can
/// change a result of the program: in an andi of i1 values, each operand
/// decides the result only where the other holds (and where that one's own
/// conjuncts hold), and in select(c, x, y), x only where c holds. A value
/// used several times keeps what every use guarantees; one that reaches no
/// result keeps nothing. So a division whose numerator is bounded only under
/// a guard (`q >= kv` before `(q - kv) % n`) may compute garbage where the
/// guard fails: the result does not depend on it there.
std::vector<std::vector<int32_t>> guardsOf(const expr::Program &program);

/// The range of integer instruction `value` wherever the comparisons
/// `facts` hold (guardsOf), from the facts that bound it, on non-negative
/// operands: x - y where x >= y (or x > y) lies in [0, max x - min y], and
/// a value below (or at most) another is at most that one's maximum. An
/// unsigned order with a non-negative larger side also bounds a smaller
/// side of any sign (as unsigned, a negative value is above every
/// non-negative one).
ValueRange rangeWhere(const expr::Program &program, const std::vector<ValueRange> &range, int32_t value,
                      const std::vector<int32_t> &facts);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_VALUEFACTS_H
