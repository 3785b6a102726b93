//===- DFlexToProgram.h - mask and score_mod bodies to programs -*- C++ -*-===//

#ifndef DFLEX_CONVERSION_DFLEXTOPROGRAM_DFLEXTOPROGRAM_H
#define DFLEX_CONVERSION_DFLEXTOPROGRAM_DFLEXTOPROGRAM_H

#include "DFlex/IR/DFlexOps.h"
#include "dflex/Expr/Program.h"

namespace mlir::dflex {

/// Translates a verified mask or score_mod into a portable program, its calls
/// inlined (by inlineCalls, on a copy of the body: `op` and its module are
/// left as they are). Emits a diagnostic and fails on anything the program
/// form cannot express; a verified body always translates unless its calls
/// inline to more than kMaxInlinedOperations operations.
FailureOr<::dflex::expr::Program> lowerToProgram(BodyOpInterface op);

/// The portable type of a verified body type.
::dflex::expr::ScalarType toScalarType(Type type);

} // namespace mlir::dflex

#endif // DFLEX_CONVERSION_DFLEXTOPROGRAM_DFLEXTOPROGRAM_H
