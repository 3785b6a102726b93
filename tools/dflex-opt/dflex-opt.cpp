//===- dflex-opt.cpp - dflex optimizer driver -----------------------------===//

#include "DFlex/IR/DFlexDialect.h"
#include "DFlex/Transforms/Passes.h"
#include "dflex/Support/InputLimits.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  mlir::registerTransformsPasses();
  mlir::dflex::registerDFlexPasses();

  mlir::DialectRegistry registry;
  registry.insert<mlir::dflex::DFlexDialect, mlir::arith::ArithDialect,
                  mlir::math::MathDialect>();
  auto [inputFilename, outputFilename] = mlir::registerAndParseCLIOptions(
      argc, argv, "dflex optimizer driver\n", registry);
  mlir::MlirOptMainConfig config = mlir::MlirOptMainConfig::createFromCLOptions();

  std::string errorMessage;
  std::unique_ptr<llvm::MemoryBuffer> input =
      mlir::openInputFile(inputFilename, &errorMessage);
  if (!input) {
    llvm::WithColor::error() << errorMessage << "\n";
    return 1;
  }
  // The parser recurses per nesting level: refuse inputs that would
  // overflow its stack before parsing them.
  if (auto problem = dflex::checkInputLimits(input->getBuffer())) {
    llvm::errs() << (inputFilename == "-" ? "<stdin>" : inputFilename) << ":"
                 << problem->line << ":" << problem->column
                 << ": error: " << problem->message << "\n";
    return 1;
  }
  std::unique_ptr<llvm::ToolOutputFile> output =
      mlir::openOutputFile(outputFilename, &errorMessage);
  if (!output) {
    llvm::WithColor::error() << errorMessage << "\n";
    return 1;
  }
  if (mlir::failed(mlir::MlirOptMain(output->os(), std::move(input), registry,
                                     config)))
    return 1;
  output->keep();
  return 0;
}
