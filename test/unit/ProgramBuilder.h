//===- ProgramBuilder.h - programs built by hand for tests ------*- C++ -*-===//

#ifndef DFLEX_TEST_PROGRAMBUILDER_H
#define DFLEX_TEST_PROGRAMBUILDER_H

#include "dflex/Expr/Program.h"

#include <vector>

namespace dflex::test {

inline expr::ScalarType intType(int width) {
  switch (width) {
  case 1: return expr::ScalarType::I1;
  case 8: return expr::ScalarType::I8;
  case 16: return expr::ScalarType::I16;
  case 32: return expr::ScalarType::I32;
  default: return expr::ScalarType::I64;
  }
}

/// Builds a program instruction by instruction; the last one is the result.
struct ProgramBuilder {
  expr::Program program;
  int32_t add(expr::Opcode op, expr::ScalarType type, std::vector<int32_t> operands = {},
              int64_t imm = 0, int64_t imm2 = 0) {
    expr::Instruction inst;
    inst.op = op;
    inst.type = type;
    inst.operands = std::move(operands);
    inst.imm = imm;
    inst.imm2 = imm2;
    program.instructions.push_back(inst);
    program.result = static_cast<int32_t>(program.instructions.size() - 1);
    return program.result;
  }
  /// Leading argument `n` (b, h, q_idx, kv_idx) narrowed to `width` bits.
  int32_t argument(int n, int width) {
    int32_t arg = add(expr::Opcode::Argument, expr::ScalarType::Index, {}, n);
    return width == 64 ? arg : add(expr::Opcode::TruncI, intType(width), {arg});
  }
};

} // namespace dflex::test

#endif // DFLEX_TEST_PROGRAMBUILDER_H
