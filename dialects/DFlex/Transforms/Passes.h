//===- Passes.h - dflex passes ----------------------------------*- C++ -*-===//

#ifndef DFLEX_TRANSFORMS_PASSES_H
#define DFLEX_TRANSFORMS_PASSES_H

#include "DFlex/IR/DFlexOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::dflex {

#define GEN_PASS_DECL
#include "DFlex/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "DFlex/Transforms/Passes.h.inc"

} // namespace mlir::dflex

#endif // DFLEX_TRANSFORMS_PASSES_H
