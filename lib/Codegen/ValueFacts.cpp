//===- ValueFacts.cpp - what the code generator proves of a body's values -===//

#include "dflex/Codegen/ValueFacts.h"

#include "dflex/Bundle/Specs.h"
#include "dflex/Expr/Semantics.h"

#include <algorithm>
#include <iterator>
#include <optional>

namespace dflex::codegen {

using expr::Instruction;
using expr::Opcode;
using expr::Program;
using expr::ScalarType;

std::vector<bool> launchInvariant(const Program &program) {
  std::vector<bool> invariant(program.instructions.size(), false);
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    const Instruction &inst = program.instructions[n];
    bool fixed = inst.op != Opcode::Argument && inst.op != Opcode::Read;
    for (int32_t operand : inst.operands)
      fixed = fixed && invariant[operand];
    invariant[n] = fixed;
  }
  return invariant;
}

namespace {

/// Whether instruction n is leading argument `argument` (q_idx or kv_idx's
/// index) itself, or casts of it at 32 bits or more.
bool isExactPosition(const Program &program, int32_t n, int64_t argument) {
  const Instruction &inst = program.instructions[n];
  switch (inst.op) {
  case Opcode::Argument: return inst.imm + (program.isScoreMod ? 0 : 1) == argument;
  case Opcode::IndexCast:
  case Opcode::IndexCastUI:
  case Opcode::ExtSI:
  case Opcode::ExtUI:
  case Opcode::TruncI:
    return expr::intWidth(inst.type) >= 32 && isExactPosition(program, inst.operands[0], argument);
  default: return false;
  }
}

/// The variance of a value computed from values of variances a and b.
Variance join(Variance a, Variance b) {
  if (a == b || b == Variance::Fixed)
    return a;
  if (a == Variance::Fixed)
    return b;
  return Variance::Pair;
}

} // namespace

bool isPositionDistance(const Program &program, int32_t n) {
  const Instruction &inst = program.instructions[n];
  return inst.op == Opcode::SubI && expr::intWidth(inst.type) >= 32 &&
         isExactPosition(program, inst.operands[0], 3) && isExactPosition(program, inst.operands[1], 4);
}

std::vector<Variance> bodyVariance(const Program &program, bool distances) {
  std::vector<Variance> variance(program.instructions.size(), Variance::Fixed);
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    const Instruction &inst = program.instructions[n];
    if (distances && isPositionDistance(program, int32_t(n))) {
      variance[n] = Variance::Distance;
      continue;
    }
    if (inst.op == Opcode::Argument) { // (score,) b, h, q_idx, kv_idx
      const int64_t index = inst.imm + (program.isScoreMod ? 0 : 1);
      variance[n] = index == 0   ? Variance::Pair
                    : index == 3 ? Variance::Row
                    : index == 4 ? Variance::Column
                                 : Variance::Fixed;
      continue;
    }
    Variance joined = Variance::Fixed;
    for (int32_t operand : inst.operands)
      joined = join(joined, variance[operand]);
    variance[n] = joined;
  }
  return variance;
}

std::vector<ValueRange> integerRanges(const Program &program) {
  constexpr int64_t kMin = INT64_MIN, kMax = INT64_MAX;
  std::vector<ValueRange> range(program.instructions.size(), {kMin, kMax});
  auto fits = [](__int128 lo, __int128 hi) { return lo >= INT64_MIN && hi <= INT64_MAX; };
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    const Instruction &inst = program.instructions[n];
    if (expr::isFloat(inst.type))
      continue;
    const int w = expr::intWidth(inst.type);
    auto r = [&](int k) { return range[inst.operands[k]]; };
    auto nonNegative = [&](int k) { return r(k).first >= 0; };
    ValueRange out{kMin, kMax};
    switch (inst.op) {
    case Opcode::Argument:
      out = {0, inst.imm + (program.isScoreMod ? 0 : 1) <= 2 ? bundle::kMaxAttentionBatchOrHeads
                                                               : bundle::kMaxAttentionLength + (1 << 16) - 1};
      break;
    case Opcode::Constant: out = {inst.imm, inst.imm}; break;
    case Opcode::Dim: out = {0, kMax}; break;
    case Opcode::AddI:
    case Opcode::MulI: {
      const __int128 a0 = r(0).first, a1 = r(0).second, b0 = r(1).first, b1 = r(1).second;
      if (inst.op == Opcode::AddI && fits(a0 + b0, a1 + b1))
        out = {int64_t(a0 + b0), int64_t(a1 + b1)};
      if (inst.op == Opcode::MulI && nonNegative(0) && nonNegative(1) && a1 <= kMax && b1 <= kMax &&
          fits(a0 * b0, a1 * b1))
        out = {int64_t(a0 * b0), int64_t(a1 * b1)};
      break;
    }
    case Opcode::SubI: {
      const __int128 lo = __int128(r(0).first) - r(1).second, hi = __int128(r(0).second) - r(1).first;
      if (fits(lo, hi))
        out = {int64_t(lo), int64_t(hi)};
      break;
    }
    case Opcode::DivUI:
    case Opcode::ShRUI:
      if (nonNegative(0))
        out = {0, r(0).second};
      break;
    case Opcode::RemUI:
      if (nonNegative(0))
        out = {0, r(0).second};
      if (nonNegative(1) && r(1).second > 0)
        out = {0, std::min(nonNegative(0) ? r(0).second : kMax, r(1).second - 1)};
      break;
    case Opcode::RemSI: // the dividend's sign and at most its magnitude (x rem 0 is 0)
      out = {std::min<int64_t>(r(0).first, 0), std::max<int64_t>(r(0).second, 0)};
      if (r(1).first > 0)
        out = {std::max(out.first, 1 - r(1).second), std::min(out.second, r(1).second - 1)};
      break;
    case Opcode::AndI:
      if (nonNegative(0) || nonNegative(1))
        out = {0, std::min(nonNegative(0) ? r(0).second : kMax, nonNegative(1) ? r(1).second : kMax)};
      break;
    case Opcode::MinSI:
      out = {std::min(r(0).first, r(1).first), std::min(r(0).second, r(1).second)};
      break;
    case Opcode::MaxSI:
      out = {std::max(r(0).first, r(1).first), std::max(r(0).second, r(1).second)};
      break;
    case Opcode::Select:
      out = {std::min(r(1).first, r(2).first), std::max(r(1).second, r(2).second)};
      break;
    case Opcode::CmpI:
    case Opcode::CmpF: out = {0, 1}; break;
    case Opcode::ExtSI: // the same signed value (a truncation that does not fit wraps: below)
    case Opcode::IndexCast:
    case Opcode::TruncI: out = r(0); break;
    case Opcode::ExtUI: // the same value if non-negative, else the source width's unsigned range
    case Opcode::IndexCastUI:
      if (nonNegative(0))
        out = r(0);
      else if (inst.imm2 < 64)
        out = {0, (int64_t(1) << inst.imm2) - 1};
      break;
    default: break;
    }
    // A value of width w holds what its wrapped result can be: a range
    // that does not fit w bits is any w-bit value (held sign-extended).
    if (w < 64 && (out.first < -(int64_t(1) << (w - 1)) || out.second >= (int64_t(1) << (w - 1))))
      out = {-(int64_t(1) << (w - 1)), (int64_t(1) << (w - 1)) - 1};
    range[n] = out;
  }
  return range;
}

std::vector<bool> reachesResult(const Program &program) {
  std::vector<bool> live(program.instructions.size(), false);
  for (int32_t root : {program.result, program.scoreDerivative})
    if (root >= 0)
      live[root] = true;
  for (size_t n = live.size(); n-- > 0;)
    if (live[n])
      for (int32_t operand : program.instructions[n].operands)
        live[operand] = true;
  return live;
}

std::vector<std::vector<int32_t>> guardsOf(const Program &program) {
  const size_t count = program.instructions.size();
  auto isConjunction = [&](const Instruction &inst) {
    return inst.op == Opcode::AndI && inst.type == ScalarType::I1;
  };
  // Adds `more` to the sorted set `set`.
  auto addAll = [](std::vector<int32_t> &set, const std::vector<int32_t> &more) {
    set.insert(set.end(), more.begin(), more.end());
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
  };
  std::vector<std::vector<int32_t>> conjuncts(count);
  for (size_t n = 0; n < count; ++n) {
    const Instruction &inst = program.instructions[n];
    conjuncts[n] = {int32_t(n)};
    if (isConjunction(inst))
      for (int32_t operand : inst.operands)
        addAll(conjuncts[n], conjuncts[operand]);
  }
  std::vector<std::optional<std::vector<int32_t>>> guards(count); // unset: no use reaches a result
  for (int32_t root : {program.result, program.scoreDerivative})
    if (root >= 0)
      guards[root].emplace();
  for (size_t n = count; n-- > 0;) {
    if (!guards[n])
      continue;
    const Instruction &inst = program.instructions[n];
    for (size_t k = 0; k < inst.operands.size(); ++k) {
      const int32_t operand = inst.operands[k];
      std::vector<int32_t> guard = *guards[n];
      int32_t condition = -1; // what must hold for this operand to matter here
      if (isConjunction(inst) && inst.operands[1 - k] != operand)
        condition = inst.operands[1 - k];
      if (inst.op == Opcode::Select && k == 1 && inst.operands[0] != operand)
        condition = inst.operands[0];
      if (condition >= 0)
        addAll(guard, conjuncts[condition]);
      if (!guards[operand]) {
        guards[operand] = std::move(guard);
        continue;
      }
      std::vector<int32_t> common;
      std::set_intersection(guards[operand]->begin(), guards[operand]->end(), guard.begin(), guard.end(),
                            std::back_inserter(common));
      guards[operand] = std::move(common);
    }
  }
  std::vector<std::vector<int32_t>> result(count);
  for (size_t n = 0; n < count; ++n)
    if (guards[n])
      result[n] = std::move(*guards[n]);
  return result;
}

ValueRange rangeWhere(const Program &program, const std::vector<ValueRange> &range, int32_t value,
                      const std::vector<int32_t> &facts) {
  ValueRange bounded = range[value];
  const Instruction &inst = program.instructions[value];
  for (int32_t fact : facts) {
    const Instruction &compare = program.instructions[fact];
    if (compare.op != Opcode::CmpI)
      continue;
    int32_t larger = compare.operands[0], smaller = compare.operands[1];
    bool strict = false;
    switch (compare.imm) {
    case sem::SGT:
    case sem::UGT: strict = true; [[fallthrough]];
    case sem::SGE:
    case sem::UGE: break;
    case sem::SLT:
    case sem::ULT: strict = true; [[fallthrough]];
    case sem::SLE:
    case sem::ULE: std::swap(larger, smaller); break;
    default: continue;
    }
    // On non-negative values, signed and unsigned comparisons agree; a
    // value at most a non-negative one as unsigned is non-negative itself
    // (a negative one reads as 2^w - |value|).
    const bool isUnsigned = compare.imm >= sem::ULT;
    if (range[larger].first < 0 || (range[smaller].first < 0 && !isUnsigned))
      continue;
    const int64_t smallest = std::max<int64_t>(range[smaller].first, 0);
    if (inst.op == Opcode::SubI && inst.operands[0] == larger && inst.operands[1] == smaller)
      bounded = {std::max<int64_t>(bounded.first, strict ? 1 : 0),
                 std::min(bounded.second, range[larger].second - smallest)};
    if (value == smaller)
      bounded = {std::max<int64_t>(bounded.first, 0), std::min(bounded.second, range[larger].second - strict)};
  }
  return bounded;
}

} // namespace dflex::codegen
