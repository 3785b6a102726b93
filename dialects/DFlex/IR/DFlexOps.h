//===- DFlexOps.h - dflex operations ----------------------------*- C++ -*-===//

#ifndef DFLEX_IR_DFLEXOPS_H
#define DFLEX_IR_DFLEXOPS_H

#include "DFlex/IR/DFlexDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "DFlex/IR/DFlexOpsEnums.h.inc"
#include "DFlex/IR/DFlexInterfaces.h.inc"

#define GET_OP_CLASSES
#include "DFlex/IR/DFlexOps.h.inc"

namespace mlir::dflex {

/// The most operations a body may hold once its calls are inlined.
constexpr size_t kMaxInlinedOperations = 1 << 20;

/// Whether `type` may be the type of a value computed in a mask or score_mod
/// body: index, i1/i8/i16/i32/i64, f16, bf16, f32.
bool isSupportedBodyType(Type type);

/// Whether `op` is one the interpreter and codegen implement. Every op a
/// verified body holds satisfies this.
bool isSupportedBodyOp(Operation *op);

} // namespace mlir::dflex

#endif // DFLEX_IR_DFLEXOPS_H
