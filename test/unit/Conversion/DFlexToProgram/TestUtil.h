//===- TestUtil.h - parsed modules and their bodies' programs --*- C++ -*-===//

#ifndef DFLEX_TEST_CONVERSION_DFLEXTOPROGRAM_TESTUTIL_H
#define DFLEX_TEST_CONVERSION_DFLEXTOPROGRAM_TESTUTIL_H

#include "DFlex/IR/DFlexDialect.h"
#include "DFlex/IR/DFlexOps.h"
#include "dflex/Conversion/DFlexToProgram/DFlexToProgram.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

namespace dflex::test {

/// Masks that call masks: @outer (q >= kv and q - kv < w) calls @inner,
/// @nested calls @outer.
inline constexpr const char *kCallingMasks = R"(
  dflex.mask @inner(%b: index, %h: index, %q: index, %kv: index) captures(%w: index) {
    %d = arith.subi %q, %kv : index
    %r = arith.cmpi ult, %d, %w : index
    dflex.yield %r : i1
  }
  dflex.mask @outer(%b: index, %h: index, %q: index, %kv: index) captures(%w: index) {
    %c = arith.cmpi uge, %q, %kv : index
    %n = dflex.call @inner(%b, %h, %q, %kv, %w) : (index, index, index, index, index) -> i1
    %r = arith.andi %c, %n : i1
    dflex.yield %r : i1
  }
  dflex.mask @nested(%b: index, %h: index, %q: index, %kv: index) captures(%w: index) {
    %r = dflex.call @outer(%b, %h, %q, %kv, %w) : (index, index, index, index, index) -> i1
    dflex.yield %r : i1
  })";

/// A parsed module and the programs of its bodies.
struct LoadedModule {
  std::unique_ptr<mlir::MLIRContext> context;
  mlir::OwningOpRef<mlir::ModuleOp> module;

  static mlir::DialectRegistry registry() {
    mlir::DialectRegistry registry;
    registry.insert<mlir::dflex::DFlexDialect, mlir::arith::ArithDialect,
                    mlir::math::MathDialect>();
    return registry;
  }

  static LoadedModule fromFile(const std::string &path) {
    LoadedModule loaded;
    loaded.context = std::make_unique<mlir::MLIRContext>(registry());
    loaded.module = mlir::parseSourceFile<mlir::ModuleOp>(path, loaded.context.get());
    return loaded;
  }
  static LoadedModule fromString(const std::string &source) {
    LoadedModule loaded;
    loaded.context = std::make_unique<mlir::MLIRContext>(registry());
    loaded.module = mlir::parseSourceString<mlir::ModuleOp>(source, loaded.context.get());
    return loaded;
  }

  /// The program of the body named `name`; fails the test if absent.
  expr::Program program(llvm::StringRef name) {
    EXPECT_TRUE(module) << "module did not parse";
    if (!module)
      return {};
    auto body = mlir::SymbolTable::lookupNearestSymbolFrom<mlir::dflex::BodyOpInterface>(
        *module, mlir::StringAttr::get(context.get(), name));
    EXPECT_TRUE(body) << "no mask or score_mod named " << name.str();
    if (!body)
      return {};
    auto program = mlir::dflex::lowerToProgram(body);
    EXPECT_TRUE(mlir::succeeded(program));
    return mlir::succeeded(program) ? *program : expr::Program{};
  }
};

} // namespace dflex::test

#endif // DFLEX_TEST_CONVERSION_DFLEXTOPROGRAM_TESTUTIL_H
