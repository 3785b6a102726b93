//===- RandomMasks.h - random mask bodies for property tests ----*- C++ -*-===//
//
// Integer mask bodies over b, h, q_idx and kv_idx, a scalar capture `n` and a
// tensor capture `t`, drawn from a seed: arithmetic, divisions and remainders
// (by `n`, strength-reduced, and by other values), differences guarded by
// their order (x - y where x >= y is a condition), congruences ((x - y) % d
// compared with 0, guarded by an order or not), reads of `t`, comparisons,
// selects and logic, mixing the arguments in every way the split into row,
// column and pair parts meets, and the interval rules of the tile analysis
// meet in combination. A seed always gives the same body, so the codegen
// test's generated variants and the test itself build the same ones.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_TEST_RANDOMMASKS_H
#define DFLEX_TEST_RANDOMMASKS_H

#include "ProgramBuilder.h"
#include "dflex/Expr/Semantics.h"

#include <random>
#include <string>

namespace dflex::test {

inline expr::Program randomMask(uint64_t seed) {
  using expr::Opcode;
  using expr::ScalarType;
  std::mt19937_64 rng(seed);
  auto below = [&](uint64_t n) { return static_cast<int64_t>(rng() % n); };
  ProgramBuilder builder;
  expr::Program &program = builder.program;
  program.name = "random_mask_" + std::to_string(seed);
  program.captures = {{"n", false, ScalarType::Index, 0}, {"t", true, ScalarType::I32, 1}};
  std::vector<int32_t> values, conditions;
  for (int argument = 0; argument < 4; ++argument)
    values.push_back(builder.add(Opcode::Argument, ScalarType::Index, {}, argument));
  const int32_t n = builder.add(Opcode::Capture, ScalarType::Index, {}, 0);
  values.push_back(n);
  values.push_back(builder.add(Opcode::Constant, ScalarType::Index, {}, 1 + below(16)));
  auto anyValue = [&] { return values[below(values.size())]; };
  static const Opcode kArithmetic[] = {Opcode::AddI,  Opcode::SubI,  Opcode::MulI, Opcode::MinSI,
                                       Opcode::MaxSI, Opcode::XOrI, Opcode::DivUI, Opcode::RemUI,
                                       Opcode::DivSI, Opcode::RemSI};
  const int steps = 6 + static_cast<int>(below(12));
  for (int step = 0; step < steps; ++step) {
    switch (below(8)) {
    case 0:
    case 1: {
      const Opcode op = kArithmetic[below(std::size(kArithmetic))];
      const bool byCapture = below(2) == 0; // a launch-invariant divisor
      values.push_back(builder.add(op, ScalarType::Index, {anyValue(), byCapture ? n : anyValue()}));
      break;
    }
    case 2: { // t[x], padded or not, widened back to an index
      const int32_t read = builder.add(Opcode::Read, ScalarType::I32, {anyValue()}, 1);
      expr::Instruction &inst = program.instructions[read];
      inst.hasPadding = below(2) == 0;
      inst.paddingInt = -1;
      values.push_back(builder.add(Opcode::ExtSI, ScalarType::Index, {read}, 0, 32));
      break;
    }
    case 3:
      conditions.push_back(builder.add(Opcode::CmpI, ScalarType::I1, {anyValue(), anyValue()}, below(10), 64));
      break;
    case 4:
      if (!conditions.empty())
        values.push_back(builder.add(Opcode::Select, ScalarType::Index,
                             {conditions[below(conditions.size())], anyValue(), anyValue()}));
      break;
    case 5: { // x - y where x >= y (or x > y) is a condition: bounded where the condition holds
      const int32_t x = anyValue(), y = anyValue();
      static const int64_t kOrders[] = {sem::UGE, sem::UGT, sem::SGE};
      conditions.push_back(builder.add(Opcode::CmpI, ScalarType::I1, {x, y}, kOrders[below(3)], 64));
      values.push_back(builder.add(Opcode::SubI, ScalarType::Index, {x, y}));
      break;
    }
    case 6: { // (x - y) % d ==/!= 0, often of q_idx and kv_idx: SplitCongruences.h's pattern
      const int32_t x = below(2) ? values[2] : anyValue(), y = below(2) ? values[3] : anyValue();
      if (below(2))
        conditions.push_back(builder.add(Opcode::CmpI, ScalarType::I1, {x, y}, sem::UGE, 64));
      const int32_t difference = builder.add(Opcode::SubI, ScalarType::Index, {x, y});
      const int32_t remainder = builder.add(below(2) ? Opcode::RemUI : Opcode::RemSI, ScalarType::Index,
                                            {difference, below(2) ? n : anyValue()});
      const int32_t zero = builder.add(Opcode::Constant, ScalarType::Index, {}, 0);
      conditions.push_back(
          builder.add(Opcode::CmpI, ScalarType::I1, {remainder, zero}, below(2) ? sem::EQ : sem::NE, 64));
      break;
    }
    default:
      if (conditions.size() >= 2)
        conditions.push_back(builder.add(below(2) ? Opcode::AndI : Opcode::OrI, ScalarType::I1,
                                 {conditions[below(conditions.size())], conditions[below(conditions.size())]}));
      break;
    }
  }
  // The result compares the last value and joins every condition drawn.
  int32_t result = builder.add(Opcode::CmpI, ScalarType::I1, {values.back(), anyValue()}, below(10), 64);
  for (int32_t condition : conditions)
    result = builder.add(below(2) ? Opcode::AndI : Opcode::OrI, ScalarType::I1, {result, condition});
  program.result = result;
  return program;
}

/// How many random masks the test checks.
constexpr int kRandomMasks = 48;

} // namespace dflex::test

#endif // DFLEX_TEST_RANDOMMASKS_H
