//===- dflex-opt.cpp - dflex optimizer driver -----------------------------===//

#include "DFlex/IR/DFlexDialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

#include "DFlex/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::registerTransformsPasses();
  mlir::dflex::registerDFlexPasses();

  mlir::DialectRegistry registry;
  registry.insert<mlir::dflex::DFlexDialect, mlir::arith::ArithDialect,
                  mlir::math::MathDialect>();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "dflex optimizer driver\n", registry));
}
