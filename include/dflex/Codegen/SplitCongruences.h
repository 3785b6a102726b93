//===- SplitCongruences.h - (a - b) % n == 0 as a % n == b % n ---*- C++ -*-===//
//
// A mask such as a dilated window tests whether the difference of a query
// position and a key position is a multiple of some n: `(q - kv) % n == 0`.
// That remainder varies with both positions, so the kernels compute it at
// every pair of a partial tile. The same test reads `q % n == kv % n`, whose
// remainders vary with one position each: the mask's row part computes one,
// its column part the other, and its pair part only compares them
// (bodyVariance, the split the kernels evaluate).
//
// The code generator rewrites a comparison `(a - b) % n == 0` (or `!= 0`)
// where a and b vary with different positions and n with neither, and where
// the two forms agree wherever the comparison can change the mask
// (guardsOf), which docs/language.md's exact semantics allow when
// - remsi: a and b are non-negative (a - b cannot overflow, and the
//   truncated remainders of a and b are their residues modulo |n|);
// - remui: a and b are non-negative and a >= b (a difference that wraps may
//   be a multiple of n whatever a and b's residues are).
// A remainder by zero is 0 on both sides, and n = -1 or the minimum value
// keeps its meaning.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_CODEGEN_SPLITCONGRUENCES_H
#define DFLEX_CODEGEN_SPLITCONGRUENCES_H

#include "dflex/Expr/Program.h"

#include <cstdint>
#include <vector>

namespace dflex::codegen {

struct CongruenceSplit {
  /// The mask with each such comparison reading the two remainders, which
  /// are inserted just before it.
  expr::Program program;
  /// For each instruction of `program`, the instruction of the mask it
  /// copies, or -1 for an inserted remainder.
  std::vector<int32_t> origin;
  /// How many comparisons were rewritten.
  int rewritten = 0;
};

CongruenceSplit splitCongruences(const expr::Program &mask);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_SPLITCONGRUENCES_H
