//===- SplitCongruences.cpp - (a - b) % n == 0 as a % n == b % n ----------===//

#include "dflex/Codegen/SplitCongruences.h"

#include "dflex/Codegen/ValueFacts.h"
#include "dflex/Expr/Semantics.h"

#include <optional>

namespace dflex::codegen {

using expr::Instruction;
using expr::Opcode;
using expr::Program;

namespace {

/// The parts of a comparison `(a - b) % n ==/!= 0`: the remainder, a, b and n.
struct Congruence {
  int32_t remainder, a, b, divisor;
};

std::optional<Congruence> congruenceOf(const Program &mask, const Instruction &compare) {
  if (compare.op != Opcode::CmpI || (compare.imm != sem::EQ && compare.imm != sem::NE))
    return std::nullopt;
  auto isZero = [&](int32_t n) {
    const Instruction &inst = mask.instructions[n];
    return inst.op == Opcode::Constant && inst.imm == 0;
  };
  const int32_t remainder = isZero(compare.operands[1])   ? compare.operands[0]
                            : isZero(compare.operands[0]) ? compare.operands[1]
                                                          : -1;
  if (remainder < 0)
    return std::nullopt;
  const Instruction &rem = mask.instructions[remainder];
  if (rem.op != Opcode::RemSI && rem.op != Opcode::RemUI)
    return std::nullopt;
  const Instruction &difference = mask.instructions[rem.operands[0]];
  if (difference.op != Opcode::SubI)
    return std::nullopt;
  return Congruence{remainder, difference.operands[0], difference.operands[1], rem.operands[1]};
}

} // namespace

CongruenceSplit splitCongruences(const Program &mask) {
  const std::vector<Variance> variance = bodyVariance(mask);
  const std::vector<ValueRange> range = integerRanges(mask);
  const std::vector<std::vector<int32_t>> guards = guardsOf(mask);
  auto splits = [&](int32_t compare, const Congruence &c) {
    const bool apart = variance[c.a] != Variance::Pair && variance[c.b] != Variance::Pair &&
                       variance[mask.instructions[c.remainder].operands[0]] == Variance::Pair &&
                       variance[c.divisor] == Variance::Fixed;
    if (!apart || range[c.a].first < 0 || range[c.b].first < 0)
      return false;
    if (mask.instructions[c.remainder].op == Opcode::RemSI)
      return true;
    // remui: a >= b wherever the comparison decides the mask.
    const int32_t difference = mask.instructions[c.remainder].operands[0];
    return rangeWhere(mask, range, difference, guards[compare]).first >= 0;
  };

  CongruenceSplit split;
  split.program = mask;
  split.program.instructions.clear();
  std::vector<int32_t> renamed(mask.instructions.size(), -1);
  auto append = [&](Instruction inst, int32_t origin) {
    split.program.instructions.push_back(std::move(inst));
    split.origin.push_back(origin);
    return static_cast<int32_t>(split.program.instructions.size() - 1);
  };
  for (size_t n = 0; n < mask.instructions.size(); ++n) {
    Instruction inst = mask.instructions[n];
    for (int32_t &operand : inst.operands)
      operand = renamed[operand];
    const std::optional<Congruence> congruence = congruenceOf(mask, mask.instructions[n]);
    if (congruence && splits(int32_t(n), *congruence)) {
      const Instruction &rem = mask.instructions[congruence->remainder];
      auto remainderOf = [&](int32_t value) {
        Instruction r = rem;
        r.operands = {renamed[value], renamed[congruence->divisor]};
        r.location = inst.location;
        return append(std::move(r), -1);
      };
      const int32_t ofA = remainderOf(congruence->a);
      const int32_t ofB = remainderOf(congruence->b);
      inst.operands = {ofA, ofB};
      ++split.rewritten;
    }
    renamed[n] = append(std::move(inst), int32_t(n));
  }
  split.program.result = mask.result >= 0 ? renamed[mask.result] : -1;
  split.program.scoreDerivative = mask.scoreDerivative >= 0 ? renamed[mask.scoreDerivative] : -1;
  return split;
}

} // namespace dflex::codegen
