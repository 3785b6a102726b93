//===- DFlexToProgramTest.cpp - calls inlined, the module left as it was --===//

#include "TestUtil.h"
#include "DFlex/Transforms/Inliner.h"
#include "dflex/Expr/ProgramJson.h"

#include "mlir/IR/Diagnostics.h"

#include <string>

using namespace dflex;

namespace {

mlir::dflex::BodyOpInterface body(test::LoadedModule &loaded, llvm::StringRef name) {
  return mlir::SymbolTable::lookupNearestSymbolFrom<mlir::dflex::BodyOpInterface>(
      *loaded.module, mlir::StringAttr::get(loaded.context.get(), name));
}

std::string printed(mlir::Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os);
  return text;
}

TEST(DFlexToProgram, LeavesTheModuleAsItWas) {
  auto loaded = test::LoadedModule::fromString(test::kCallingMasks);
  ASSERT_TRUE(loaded.module);
  std::string before = printed(*loaded.module);
  expr::Program program = loaded.program("nested");
  EXPECT_EQ(program.instructions.size(), 4u + 1u + 4u); // arguments, capture, body
  EXPECT_EQ(printed(*loaded.module), before);
}

// The conversion inlines with the pass's inliner: converting a body with
// calls and converting it once the pass's function has inlined them in
// place give the same program.
TEST(DFlexToProgram, InlinesAsThePassDoes) {
  auto loaded = test::LoadedModule::fromString(test::kCallingMasks);
  ASSERT_TRUE(loaded.module);
  for (const char *name : {"outer", "nested"}) {
    std::string withCalls = writeJson(expr::toJson(loaded.program(name)));
    ASSERT_TRUE(mlir::succeeded(mlir::dflex::inlineCalls(body(loaded, name))));
    EXPECT_EQ(printed(body(loaded, name)).find("dflex.call"), std::string::npos) << name;
    EXPECT_EQ(writeJson(expr::toJson(loaded.program(name))), withCalls) << name;
  }
}

// Each level calls the one below twice: @l0 2^20 times in @l20.
std::string nestedCalls(int levels) {
  std::string source = "dflex.mask @l0(%b: index, %h: index, %q: index, %kv: index) {\n"
                       "  %r = arith.cmpi uge, %q, %kv : index\n"
                       "  dflex.yield %r : i1\n"
                       "}\n";
  for (int level = 1; level <= levels; ++level) {
    std::string callee = "@l" + std::to_string(level - 1);
    std::string call = " = dflex.call " + callee +
                       "(%b, %h, %q, %kv) : (index, index, index, index) -> i1\n";
    source += "dflex.mask @l" + std::to_string(level) +
              "(%b: index, %h: index, %q: index, %kv: index) {\n"
              "  %x" + call + "  %y" + call +
              "  %r = arith.andi %x, %y : i1\n"
              "  dflex.yield %r : i1\n"
              "}\n";
  }
  return source;
}

TEST(DFlexToProgram, StopsAtTheInlinedSizeLimit) {
  auto loaded = test::LoadedModule::fromString(nestedCalls(20));
  ASSERT_TRUE(loaded.module);
  std::string before = printed(*loaded.module);
  std::vector<std::string> errors;
  mlir::ScopedDiagnosticHandler handler(loaded.context.get(), [&](mlir::Diagnostic &diag) {
    errors.push_back(diag.str());
    return mlir::success();
  });
  EXPECT_TRUE(mlir::failed(mlir::dflex::lowerToProgram(body(loaded, "l20"))));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "'dflex.call' op makes the body larger than 1048576 operations once "
                       "calls are inlined");
  EXPECT_EQ(printed(*loaded.module), before);
  // @l19 inlines to 2^20 operations, its yield included: at the limit, not past it.
  errors.clear();
  EXPECT_TRUE(mlir::succeeded(mlir::dflex::lowerToProgram(body(loaded, "l19"))));
  EXPECT_TRUE(errors.empty());
}

} // namespace
