//===- Derivative.h - d(score_mod)/d(score) by differentiation --*- C++ -*-===//

#ifndef DFLEX_CODEGEN_DERIVATIVE_H
#define DFLEX_CODEGEN_DERIVATIVE_H

#include "dflex/Expr/Program.h"
#include "dflex/Support/Status.h"

namespace dflex::codegen {

/// Appends to a score_mod program the instructions computing the derivative
/// of its result with respect to the score (forward-mode differentiation over
/// the arith/math ops, all in f32) and sets `program.scoreDerivative`.
/// Fails with "file:line:col: ..." naming the first op on the score's path
/// that has no derivative (floor, remainder, conversion to integer, ...).
Status appendScoreDerivative(expr::Program &program);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_DERIVATIVE_H
