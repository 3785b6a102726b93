//===- DFlexDialect.cpp - dflex dialect -----------------------------------===//

#include "DFlex/IR/DFlexDialect.h"
#include "DFlex/IR/DFlexOps.h"

using namespace mlir;
using namespace mlir::dflex;

#include "DFlex/IR/DFlexOpsDialect.cpp.inc"

void DFlexDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "DFlex/IR/DFlexOps.cpp.inc"
      >();
}

Operation *DFlexDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                             Type type, Location loc) {
  return arith::ConstantOp::materialize(builder, value, type, loc);
}
