//===- DFlexDialect.h - dflex dialect ---------------------------*- C++ -*-===//

#ifndef DFLEX_IR_DFLEXDIALECT_H
#define DFLEX_IR_DFLEXDIALECT_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Dialect.h"

#include "DFlex/IR/DFlexOpsDialect.h.inc"

#endif // DFLEX_IR_DFLEXDIALECT_H
