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

/// The start of a random body: its draws from `seed`, and a program over
/// b, h, q_idx and kv_idx with a scalar capture `n` and a tensor `t`.
struct RandomBody {
  std::mt19937_64 rng;
  ProgramBuilder builder;
  RandomBody(const std::string &name, uint64_t seed) : rng(seed) {
    builder.program.name = name + std::to_string(seed);
    builder.program.captures = {{"n", false, expr::ScalarType::Index, 0},
                                {"t", true, expr::ScalarType::I32, 1},
                                {"u", true, expr::ScalarType::I32, 2}};
  }
  /// A draw in [0, n).
  int64_t below(uint64_t n) { return static_cast<int64_t>(rng() % n); }
  /// t[x] or, one time in three, u[x, y] (x and y from `first` and `second`),
  /// padded or not, widened back to an index.
  template <class First, class Second>
  int32_t read(First first, Second second) {
    const bool wide = below(3) == 0;
    const int32_t x = first();
    const int32_t read = wide ? builder.add(expr::Opcode::Read, expr::ScalarType::I32, {x, second()}, 2)
                              : builder.add(expr::Opcode::Read, expr::ScalarType::I32, {x}, 1);
    builder.program.instructions[read].hasPadding = below(2) == 0;
    builder.program.instructions[read].paddingInt = -1;
    return builder.add(expr::Opcode::ExtSI, expr::ScalarType::Index, {read}, 0, 32);
  }
};

inline expr::Program randomMask(uint64_t seed) {
  using expr::Opcode;
  using expr::ScalarType;
  RandomBody body("random_mask_", seed);
  auto below = [&](uint64_t n) { return body.below(n); };
  ProgramBuilder &builder = body.builder;
  expr::Program &program = builder.program;
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
    case 2: // t[x] or u[x, y]: a pair's read may have a row's or a column's index
      values.push_back(body.read(anyValue, anyValue));
      break;
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

/// Mask bodies made of the pieces KeyIntervals.h reads a mask's key
/// intervals from, and of some it does not: comparisons, signed and
/// unsigned, of kv_idx plus or minus row values (q_idx, the capture `n`, a
/// read `t[q_idx]`, quotients of q_idx by constants, sums of those) with row
/// values, often guarded by an order that keeps a difference from wrapping;
/// quotients of such sums by constants compared with row values; row
/// conditions; joined into clauses by andi, the clauses by ori, select on a
/// row condition or a negation.
inline expr::Program randomIntervalMask(uint64_t seed) {
  using expr::Opcode;
  using expr::ScalarType;
  RandomBody body("random_interval_mask_", seed);
  auto below = [&](uint64_t n) { return body.below(n); };
  ProgramBuilder &builder = body.builder;
  expr::Program &program = builder.program;
  const int32_t q = builder.add(Opcode::Argument, ScalarType::Index, {}, 2);
  const int32_t kv = builder.add(Opcode::Argument, ScalarType::Index, {}, 3);
  auto constant = [&](int64_t value) { return builder.add(Opcode::Constant, ScalarType::Index, {}, value); };
  std::vector<int32_t> rows = {q, builder.add(Opcode::Capture, ScalarType::Index, {}, 0), constant(below(40))};
  {
    const int32_t read = builder.add(Opcode::Read, ScalarType::I32, {q}, 1);
    program.instructions[read].hasPadding = true;
    program.instructions[read].paddingInt = -1;
    rows.push_back(builder.add(Opcode::ExtSI, ScalarType::Index, {read}, 0, 32));
    rows.push_back(builder.add(Opcode::DivUI, ScalarType::Index, {q, constant(1 + below(20))}));
  }
  auto row = [&] { return rows[below(rows.size())]; };
  for (int extra = 0; extra < 3; ++extra)
    rows.push_back(builder.add(below(2) ? Opcode::AddI : Opcode::SubI, ScalarType::Index, {row(), row()}));
  // A key side: kv, kv +- a row value (a difference guarded by its order,
  // mostly, or not), or a row value less kv; `guard` is set to the order
  // when drawn, and `nonNegative` where the side is (kv, a guarded
  // difference): unsigned orders and quotients mostly take those.
  auto keySide = [&](int32_t &guard, bool &nonNegative) {
    guard = -1;
    nonNegative = false;
    const int32_t other = row();
    switch (below(4)) {
    case 0: nonNegative = true; return kv;
    case 1: return builder.add(Opcode::AddI, ScalarType::Index, {kv, other});
    case 2:
      if (below(4)) {
        guard = builder.add(Opcode::CmpI, ScalarType::I1, {kv, other}, below(4) ? sem::UGE : sem::SGE, 64);
        nonNegative = true;
      }
      return builder.add(Opcode::SubI, ScalarType::Index, {kv, other});
    default:
      if (below(4)) {
        guard = builder.add(Opcode::CmpI, ScalarType::I1, {other, kv}, below(4) ? sem::UGE : sem::UGT, 64);
        nonNegative = true;
      }
      return builder.add(Opcode::SubI, ScalarType::Index, {other, kv});
    }
  };
  auto predicateFor = [&](bool nonNegative) {
    return nonNegative || below(6) == 0 ? below(10) : below(6); // unsigned ones from sem::ULT on
  };
  auto andGuard = [&](int32_t atom, int32_t guard) {
    return guard < 0 ? atom : builder.add(Opcode::AndI, ScalarType::I1, {guard, atom});
  };
  auto atom = [&]() -> int32_t {
    int32_t guard;
    bool nonNegative;
    switch (below(5)) {
    case 0: // a row condition
      return builder.add(Opcode::CmpI, ScalarType::I1, {row(), row()}, below(10), 64);
    case 1: { // a quotient by a constant
      int32_t key = keySide(guard, nonNegative);
      for (int retry = 0; !nonNegative && retry < 3; ++retry)
        key = keySide(guard, nonNegative);
      const int32_t quotient = builder.add(below(2) ? Opcode::DivUI : Opcode::DivSI, ScalarType::Index,
                                           {key, constant(1 + below(24))});
      const bool swap = below(2);
      const int32_t compare = builder.add(Opcode::CmpI, ScalarType::I1,
                                          {swap ? row() : quotient, swap ? quotient : row()}, below(10), 64);
      return andGuard(compare, guard);
    }
    default: {
      const int32_t key = keySide(guard, nonNegative);
      const bool swap = below(2);
      int32_t compare = builder.add(Opcode::CmpI, ScalarType::I1,
                                    {swap ? row() : key, swap ? key : row()}, predicateFor(nonNegative), 64);
      if (below(6) == 0)
        compare = builder.add(Opcode::XOrI, ScalarType::I1, {compare, builder.add(Opcode::Constant, ScalarType::I1, {}, -1)});
      return andGuard(compare, guard);
    }
    }
  };
  auto clause = [&] {
    int32_t joined = atom();
    for (int64_t more = below(3); more > 0; --more)
      joined = builder.add(Opcode::AndI, ScalarType::I1, {joined, atom()});
    return joined;
  };
  int32_t result = clause();
  for (int64_t more = below(3); more > 0; --more) {
    if (below(3) == 0) {
      const int32_t condition = builder.add(Opcode::CmpI, ScalarType::I1, {row(), row()}, below(10), 64);
      result = builder.add(Opcode::Select, ScalarType::I1, {condition, result, clause()});
    } else {
      result = builder.add(Opcode::OrI, ScalarType::I1, {result, clause()});
    }
  }
  program.result = result;
  return program;
}

/// How many random interval masks the test checks.
constexpr int kRandomIntervalMasks = 48;

/// Score_mod bodies over the score, b, h, q_idx and kv_idx and RandomBody's
/// captures: integer values drawn as randomMask draws them, many of b and h
/// alone (arithmetic on them, reads of `t` at them), turned into floats and
/// joined with the score by addf, subf, mulf and selects on comparisons, so
/// that the split into the parts of (b, h), of a row, of a column, of the
/// distance q_idx - kv_idx and the rest per pair (Variant.cpp) hands values
/// of every kind from one to another.
inline expr::Program randomScoreMod(uint64_t seed) {
  using expr::Opcode;
  using expr::ScalarType;
  RandomBody body("random_score_mod_", seed);
  auto below = [&](uint64_t n) { return body.below(n); };
  ProgramBuilder &builder = body.builder;
  builder.program.isScoreMod = true;
  const int32_t score = builder.add(Opcode::Argument, ScalarType::F32, {}, 0);
  std::vector<int32_t> heads, values; // heads: values of b, h and the captures alone
  for (int argument = 1; argument <= 4; ++argument)
    values.push_back(builder.add(Opcode::Argument, ScalarType::Index, {}, argument));
  heads = {values[0], values[1], builder.add(Opcode::Capture, ScalarType::Index, {}, 0),
           builder.add(Opcode::Constant, ScalarType::Index, {}, 1 + below(16))};
  values.insert(values.end(), heads.begin() + 2, heads.end());
  if (below(2) == 0) // q_idx - kv_idx, a distance the split works out once per distinct value
    values.push_back(builder.add(Opcode::SubI, ScalarType::Index, {values[2], values[3]}));
  auto pick = [&](const std::vector<int32_t> &from) { return from[below(from.size())]; };
  static const Opcode kArithmetic[] = {Opcode::AddI,  Opcode::SubI,  Opcode::MulI, Opcode::MinSI, Opcode::MaxSI,
                                       Opcode::XOrI, Opcode::DivUI, Opcode::RemUI, Opcode::DivSI};
  const int steps = 4 + static_cast<int>(below(8));
  for (int step = 0; step < steps; ++step) {
    const bool ofHead = below(2) == 0;
    const std::vector<int32_t> &from = ofHead ? heads : values;
    int32_t made;
    if (below(3) == 0) { // t[x] or u[x, y]: u[head value, pair value] reads per pair with a head's index
      made = body.read([&] { return pick(from); }, [&] { return pick(values); });
    } else {
      made = builder.add(kArithmetic[below(std::size(kArithmetic))], ScalarType::Index, {pick(from), pick(from)});
    }
    values.push_back(made);
    if (ofHead)
      heads.push_back(made);
  }
  int32_t result = score;
  const int joins = 1 + static_cast<int>(below(3));
  for (int join = 0; join < joins; ++join) {
    const int32_t term = builder.add(Opcode::SIToFP, ScalarType::F32, {pick(below(2) ? heads : values)});
    static const Opcode kJoins[] = {Opcode::AddF, Opcode::SubF, Opcode::MulF};
    const int32_t joined = builder.add(kJoins[below(3)], ScalarType::F32, {result, term});
    if (below(3) == 0) {
      const int32_t condition = builder.add(Opcode::CmpI, ScalarType::I1, {pick(values), pick(heads)}, below(10), 64);
      result = builder.add(Opcode::Select, ScalarType::F32, {condition, joined, result});
    } else {
      result = joined;
    }
  }
  builder.program.result = result;
  return builder.program;
}

/// The mask the random score_mods are emitted under: q_idx >= kv_idx.
inline expr::Program causalMask() {
  ProgramBuilder builder;
  builder.add(expr::Opcode::CmpI, expr::ScalarType::I1,
              {builder.add(expr::Opcode::Argument, expr::ScalarType::Index, {}, 2),
               builder.add(expr::Opcode::Argument, expr::ScalarType::Index, {}, 3)},
              sem::UGE, 64);
  return builder.program;
}

/// How many random score_mods the test checks.
constexpr int kRandomScoreMods = 96;

} // namespace dflex::test

#endif // DFLEX_TEST_RANDOMMASKS_H
