//===- KeyIntervals.cpp - a mask as intervals of keys per query row -------===//

#include "dflex/Codegen/KeyIntervals.h"

#include "dflex/Codegen/ValueFacts.h"
#include "dflex/Expr/Semantics.h"

#include <algorithm>
#include <map>
#include <optional>

namespace dflex::codegen {

using expr::Instruction;
using expr::Opcode;
using expr::Program;
using expr::ScalarType;

namespace {

/// The largest key position (integerRanges' bound on kv_idx).
constexpr int64_t kLastKey = (int64_t(1) << 31) - 1;
/// Contributions added as they are: each coefficient times its value's
/// magnitude at most this.
constexpr int64_t kSmallTerm = int64_t(1) << 40;
/// Where a wider value is clamped: beyond the key position plus every small
/// contribution, so the comparison keeps its outcome.
constexpr int64_t kFar = int64_t(1) << 45;
/// The largest coefficient of a clamped value (the product stays in 62 bits).
constexpr int64_t kLargestClampedCoefficient = int64_t(1) << 16;

/// An exact integer value: kv times `kv` (-1, 0 or 1) plus the sum of
/// `terms` (values that do not change with the key, times a coefficient)
/// plus `constant`.
struct Linear {
  int kv = 0;
  std::map<int32_t, int64_t> terms;
  int64_t constant = 0;

  Linear scaled(int64_t factor) const {
    Linear out;
    out.kv = kv * static_cast<int>(factor);
    for (const auto &[value, coefficient] : terms)
      out.terms[value] = coefficient * factor;
    out.constant = constant * factor;
    return out;
  }
  Linear plus(const Linear &other, int64_t sign = 1) const {
    Linear out = *this;
    out.kv += sign * other.kv;
    for (const auto &[value, coefficient] : other.terms)
      if ((out.terms[value] += sign * coefficient) == 0)
        out.terms.erase(value);
    out.constant += sign * other.constant;
    return out;
  }
  Linear plus(int64_t value) const {
    Linear out = *this;
    out.constant += value;
    return out;
  }
};

/// A bound on the key: kv >= value (lower) or kv <= value, where `value`
/// does not change with the key. `facts` are the comparisons that hold
/// wherever the bound decides the mask (the magnitudes of its terms).
struct Bound {
  Linear value;
  int32_t facts;
};

/// The keys of one row where all `conditions` hold (row values, true when
/// `second` is set) and the key is within every bound.
struct Interval {
  std::vector<std::pair<int32_t, bool>> conditions;
  std::vector<Bound> lower, upper;
};
using IntervalSet = std::vector<Interval>; // their union; empty: no key

class Rewriter {
public:
  explicit Rewriter(const Program &mask)
      : mask(mask), out(mask), variance(bodyVariance(mask)), range(integerRanges(mask)),
        guards(guardsOf(mask)) {}

  KeyIntervalForm run() {
    KeyIntervalForm form;
    form.program = mask;
    if (mask.result < 0 || mask.instructions[mask.result].type != ScalarType::I1 ||
        variance[mask.result] != Variance::Pair)
      return form;
    const std::optional<IntervalSet> set = keysOf(mask.result);
    if (!set || set->size() > size_t(kMaxKeyIntervals))
      return form;
    // A subtraction and a comparison per interval, and the ors between them.
    const int pairCost = 3 * static_cast<int>(set->size()) - 1;
    if (pairCost >= pairInstructions())
      return form;
    const std::optional<int32_t> test = emitTest(*set);
    if (!test)
      return form;
    out.result = *test;
    form.program = std::move(out);
    form.first = std::move(firsts);
    form.count = std::move(counts);
    return form;
  }

private:
  /// The instructions of the mask's pair part.
  int pairInstructions() const {
    const std::vector<bool> live = reachesResult(mask);
    int count = 0;
    for (size_t n = 0; n < live.size(); ++n)
      count += live[n] && variance[n] == Variance::Pair;
    return count;
  }

  bool keyInvariant(int32_t value) const {
    return variance[value] == Variance::Fixed || variance[value] == Variance::Row;
  }
  bool isInteger(int32_t value) const { return !expr::isFloat(mask.instructions[value].type); }
  ValueRange rangeUnder(int32_t value, int32_t factsOf) const {
    return rangeWhere(mask, range, value, guards[factsOf]);
  }

  /// `value` as a Linear, exactly wherever it matters; none where a sum may
  /// wrap or the key enters otherwise than added or subtracted.
  std::optional<Linear> linearOf(int32_t value) {
    if (auto found = linear.find(value); found != linear.end())
      return found->second;
    std::optional<Linear> result = computeLinear(value);
    linear[value] = result;
    return result;
  }

  std::optional<Linear> computeLinear(int32_t value) {
    const Instruction &inst = mask.instructions[value];
    if (!isInteger(value))
      return std::nullopt;
    Linear out;
    if (inst.op == Opcode::Constant) {
      out.constant = inst.imm;
      return out;
    }
    if (keyInvariant(value)) {
      out.terms[value] = 1;
      return out;
    }
    if (inst.op == Opcode::Argument) { // kv_idx (the others do not change with the key)
      out.kv = 1;
      return out;
    }
    const int width = expr::intWidth(inst.type);
    auto fits = [&](__int128 lo, __int128 hi) {
      return lo >= -(__int128(1) << (width - 1)) && hi < (__int128(1) << (width - 1));
    };
    switch (inst.op) {
    case Opcode::AddI:
    case Opcode::SubI: {
      const std::optional<Linear> a = linearOf(inst.operands[0]), b = linearOf(inst.operands[1]);
      if (!a || !b)
        return std::nullopt;
      const ValueRange ra = rangeUnder(inst.operands[0], value), rb = rangeUnder(inst.operands[1], value);
      const bool add = inst.op == Opcode::AddI;
      const __int128 lo = add ? __int128(ra.first) + rb.first : __int128(ra.first) - rb.second;
      const __int128 hi = add ? __int128(ra.second) + rb.second : __int128(ra.second) - rb.first;
      if (!fits(lo, hi))
        return std::nullopt;
      out = a->plus(*b, add ? 1 : -1);
      if (out.kv < -1 || out.kv > 1)
        return std::nullopt;
      return out;
    }
    case Opcode::ExtSI:
    case Opcode::IndexCast:
    case Opcode::TruncI: {
      const ValueRange r = rangeUnder(inst.operands[0], value);
      if (!fits(r.first, r.second))
        return std::nullopt;
      return linearOf(inst.operands[0]);
    }
    case Opcode::ExtUI:
    case Opcode::IndexCastUI: {
      const ValueRange r = rangeUnder(inst.operands[0], value);
      if (r.first < 0 || !fits(r.first, r.second))
        return std::nullopt;
      return linearOf(inst.operands[0]);
    }
    default: return std::nullopt;
    }
  }

  /// The keys where i1 `value` holds, for one row.
  std::optional<IntervalSet> keysOf(int32_t value) {
    const Instruction &inst = mask.instructions[value];
    if (inst.type != ScalarType::I1)
      return std::nullopt;
    if (inst.op == Opcode::Constant)
      return inst.imm != 0 ? IntervalSet{Interval{}} : IntervalSet{};
    if (keyInvariant(value))
      return IntervalSet{Interval{{{value, true}}, {}, {}}};
    switch (inst.op) {
    case Opcode::AndI:
    case Opcode::OrI: {
      std::optional<IntervalSet> a = keysOf(inst.operands[0]);
      std::optional<IntervalSet> b = a ? keysOf(inst.operands[1]) : std::nullopt;
      if (!b)
        return std::nullopt;
      return inst.op == Opcode::AndI ? both(*a, *b) : either(*a, *b);
    }
    case Opcode::Select: {
      const int32_t condition = inst.operands[0];
      if (!keyInvariant(condition))
        return std::nullopt;
      std::optional<IntervalSet> a = keysOf(inst.operands[1]);
      std::optional<IntervalSet> b = a ? keysOf(inst.operands[2]) : std::nullopt;
      if (!b)
        return std::nullopt;
      std::optional<IntervalSet> whenTrue = both(IntervalSet{Interval{{{condition, true}}, {}, {}}}, *a);
      std::optional<IntervalSet> whenFalse = both(IntervalSet{Interval{{{condition, false}}, {}, {}}}, *b);
      if (!whenTrue || !whenFalse)
        return std::nullopt;
      return either(*whenTrue, *whenFalse);
    }
    case Opcode::XOrI: { // not c: a comparison with its predicate negated
      const int32_t a = inst.operands[0], b = inst.operands[1];
      auto isTrue = [&](int32_t n) {
        return mask.instructions[n].op == Opcode::Constant && mask.instructions[n].imm != 0;
      };
      const int32_t negated = isTrue(b) ? a : isTrue(a) ? b : -1;
      if (negated < 0 || mask.instructions[negated].op != Opcode::CmpI)
        return std::nullopt;
      return comparison(negated, negate(mask.instructions[negated].imm), value);
    }
    case Opcode::CmpI: return comparison(value, inst.imm, value);
    default: return std::nullopt;
    }
  }

  static int64_t negate(int64_t predicate) {
    switch (predicate) {
    case sem::EQ: return sem::NE;
    case sem::NE: return sem::EQ;
    case sem::SLT: return sem::SGE;
    case sem::SLE: return sem::SGT;
    case sem::SGT: return sem::SLE;
    case sem::SGE: return sem::SLT;
    case sem::ULT: return sem::UGE;
    case sem::ULE: return sem::UGT;
    case sem::UGT: return sem::ULE;
    default: return sem::ULT;
    }
  }
  static int64_t swapped(int64_t predicate) {
    switch (predicate) {
    case sem::SLT: return sem::SGT;
    case sem::SLE: return sem::SGE;
    case sem::SGT: return sem::SLT;
    case sem::SGE: return sem::SLE;
    case sem::ULT: return sem::UGT;
    case sem::ULE: return sem::UGE;
    case sem::UGT: return sem::ULT;
    case sem::UGE: return sem::ULE;
    default: return predicate;
    }
  }
  static bool isUnsignedOrder(int64_t predicate) { return predicate >= sem::ULT; }

  std::optional<IntervalSet> both(const IntervalSet &a, const IntervalSet &b) const {
    if (a.size() * b.size() > size_t(kMaxKeyIntervals))
      return std::nullopt;
    IntervalSet out;
    for (const Interval &x : a)
      for (const Interval &y : b) {
        Interval joined = x;
        joined.conditions.insert(joined.conditions.end(), y.conditions.begin(), y.conditions.end());
        joined.lower.insert(joined.lower.end(), y.lower.begin(), y.lower.end());
        joined.upper.insert(joined.upper.end(), y.upper.begin(), y.upper.end());
        out.push_back(std::move(joined));
      }
    return out;
  }
  std::optional<IntervalSet> either(IntervalSet a, const IntervalSet &b) const {
    if (a.size() + b.size() > size_t(kMaxKeyIntervals))
      return std::nullopt;
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  /// The keys where `left relation right` holds, relation one of sem::SGE
  /// (>=), sem::SLE (<=), sem::EQ, sem::NE, on exact integers whose
  /// difference holds the key once (kv coefficient +-1).
  std::optional<IntervalSet> ordered(const Linear &left, int64_t relation, const Linear &right,
                                     int32_t facts) const {
    const Linear difference = left.plus(right, -1); // relation against 0
    if (difference.kv != 1 && difference.kv != -1)
      return std::nullopt;
    // difference = s * kv + rest: s * kv >= -rest, so for s = 1 kv >= -rest
    // and for s = -1 kv <= rest.
    Linear rest = difference;
    rest.kv = 0;
    const Linear bound = difference.kv == 1 ? rest.scaled(-1) : rest;
    auto atLeast = [&](int64_t by) { // difference >= by
      Interval i;
      (difference.kv == 1 ? i.lower : i.upper).push_back({bound.plus(difference.kv == 1 ? by : -by), facts});
      return i;
    };
    auto atMost = [&](int64_t by) { // difference <= by
      Interval i;
      (difference.kv == 1 ? i.upper : i.lower).push_back({bound.plus(difference.kv == 1 ? by : -by), facts});
      return i;
    };
    switch (relation) {
    case sem::SGE: return IntervalSet{atLeast(0)};
    case sem::SLE: return IntervalSet{atMost(0)};
    case sem::EQ: return both(IntervalSet{atLeast(0)}, IntervalSet{atMost(0)});
    default: return IntervalSet{atMost(-1), atLeast(1)}; // NE
    }
  }

  /// The comparison `predicate` of instruction `compare`'s operands, whose
  /// facts (guardsOf) are those of instruction `factsOf`.
  std::optional<IntervalSet> comparison(int32_t compare, int64_t predicate, int32_t factsOf) {
    const Instruction &inst = mask.instructions[compare];
    int32_t a = inst.operands[0], b = inst.operands[1];
    if (!isInteger(a) || !isInteger(b))
      return std::nullopt;
    if (keyInvariant(a)) { // the key on the left
      std::swap(a, b);
      predicate = swapped(predicate);
    }
    if (!keyInvariant(b))
      return std::nullopt; // the key on both sides
    // An unsigned order of a non-negative key side agrees with the signed
    // one once a negative row side (an unsigned value above every key side)
    // reads as far above them.
    const Instruction &left = mask.instructions[a];
    const bool quotient = (left.op == Opcode::DivUI || left.op == Opcode::DivSI ||
                           left.op == Opcode::FloorDivSI) &&
                          keyInvariant(left.operands[1]);
    std::optional<Linear> right;
    if (isUnsignedOrder(predicate)) {
      // (a quotient's numerator is checked non-negative below)
      if (!quotient && rangeUnder(a, factsOf).first < 0)
        return std::nullopt;
      if (rangeUnder(b, factsOf).first < 0) {
        right = Linear{};
        right->terms[farWhenNegative(b)] = 1;
      }
      predicate -= sem::ULT - sem::SLT;
    }
    if (!right)
      right = linearOf(b);
    if (!right)
      return std::nullopt;

    // A quotient by a positive constant: x / c against y.
    if (quotient) {
      const Instruction &divisor = mask.instructions[left.operands[1]];
      const int32_t numerator = left.operands[0];
      const std::optional<Linear> x = linearOf(numerator);
      if (divisor.op != Opcode::Constant || divisor.imm <= 0 || divisor.imm > kLargestClampedCoefficient ||
          !x || rangeUnder(numerator, a).first < 0)
        return std::nullopt;
      const int64_t c = divisor.imm;
      // x / c == y reads c * y <= x <= c * y + c - 1.
      const Linear first = right->scaled(c), last = first.plus(c - 1);
      auto atLeast = [&](const Linear &bound) { return ordered(*x, sem::SGE, bound, factsOf); };
      auto atMost = [&](const Linear &bound) { return ordered(*x, sem::SLE, bound, factsOf); };
      auto joined = [&](std::optional<IntervalSet> p, std::optional<IntervalSet> q, bool intersect) {
        if (!p || !q)
          return std::optional<IntervalSet>();
        return intersect ? both(*p, *q) : either(*p, *q);
      };
      switch (predicate) {
      case sem::EQ: return joined(atLeast(first), atMost(last), true);
      case sem::NE: return joined(atMost(first.plus(-1)), atLeast(last.plus(1)), false);
      case sem::SLT: return atMost(first.plus(-1));
      case sem::SLE: return atMost(last);
      case sem::SGT: return atLeast(last.plus(1));
      default: return atLeast(first); // SGE
      }
    }
    const std::optional<Linear> keySide = linearOf(a);
    if (!keySide)
      return std::nullopt;
    switch (predicate) {
    case sem::SLT: return ordered(*keySide, sem::SLE, right->plus(-1), factsOf);
    case sem::SGT: return ordered(*keySide, sem::SGE, right->plus(1), factsOf);
    default: return ordered(*keySide, predicate, *right, factsOf); // EQ, NE, SLE, SGE
    }
  }

  //===--- Emission -------------------------------------------------------===//

  int32_t append(Opcode op, ScalarType type, std::vector<int32_t> operands, int64_t imm = 0, int64_t imm2 = 0) {
    Instruction inst;
    inst.op = op;
    inst.type = type;
    inst.operands = std::move(operands);
    inst.imm = imm;
    inst.imm2 = imm2;
    inst.location = mask.instructions[mask.result].location;
    out.instructions.push_back(std::move(inst));
    return static_cast<int32_t>(out.instructions.size() - 1);
  }
  int32_t constant(int64_t value, ScalarType type = ScalarType::Index) {
    auto [found, added] = constants.try_emplace({value, type}, -1);
    if (added)
      found->second = append(Opcode::Constant, type, {}, value);
    return found->second;
  }
  std::map<std::pair<int64_t, ScalarType>, int32_t> constants;
  /// A value whose magnitude is known: new instructions have their own.
  std::map<int32_t, int64_t> magnitudeOfNew;

  /// (value < 0) ? kFar : min(value, kFar), for a row side that an unsigned
  /// comparison reads.
  int32_t farWhenNegative(int32_t value) {
    if (auto known = farOf.find(value); known != farOf.end())
      return known->second;
    const int32_t far = constant(kFar);
    const int32_t negative = append(Opcode::CmpI, ScalarType::I1, {value, constant(0)}, sem::SLT, 64);
    const int32_t clamped = append(Opcode::Select, ScalarType::Index,
                                   {negative, far, append(Opcode::MinSI, ScalarType::Index, {value, far})});
    magnitudeOfNew[clamped] = kFar;
    return farOf[value] = clamped;
  }
  std::map<int32_t, int32_t> farOf;

  /// The bound's value as an instruction, its terms clamped where adding
  /// them might overflow; none where more than one would need it.
  std::optional<int32_t> emitBound(const Bound &bound) {
    if (bound.value.constant > kSmallTerm || bound.value.constant < -kSmallTerm)
      return std::nullopt;
    int32_t sum = bound.value.constant != 0 ? constant(bound.value.constant) : -1; // -1: nothing yet
    bool clampedOne = false;
    for (const auto &[term, coefficient] : bound.value.terms) {
      int64_t magnitude;
      if (auto known = magnitudeOfNew.find(term); known != magnitudeOfNew.end()) {
        magnitude = known->second;
      } else {
        const ValueRange r = rangeUnder(term, bound.facts);
        magnitude = std::max(r.first == INT64_MIN ? INT64_MAX : std::abs(r.first), std::abs(r.second));
      }
      const int64_t size = coefficient < 0 ? -coefficient : coefficient;
      int32_t value = term;
      if (magnitude > kSmallTerm / size) {
        if (clampedOne || size > kLargestClampedCoefficient)
          return std::nullopt;
        clampedOne = true;
        if (magnitude > kFar)
          value = append(Opcode::MaxSI, ScalarType::Index,
                         {append(Opcode::MinSI, ScalarType::Index, {value, constant(kFar)}), constant(-kFar)});
      }
      if (mask.instructions.size() > size_t(value) && expr::intWidth(mask.instructions[value].type) != 64)
        value = append(Opcode::ExtSI, ScalarType::Index, {value}, 0, expr::intWidth(mask.instructions[value].type));
      if (size != 1)
        value = append(Opcode::MulI, ScalarType::Index, {value, constant(size)});
      if (sum < 0 && coefficient > 0)
        sum = value;
      else
        sum = append(coefficient < 0 ? Opcode::SubI : Opcode::AddI, ScalarType::Index,
                     {sum < 0 ? constant(0) : sum, value});
    }
    return sum < 0 ? constant(0) : sum;
  }

  /// kv in one of the intervals, as `kv - first <u count` per interval;
  /// none where a bound cannot be added up without overflow.
  std::optional<int32_t> emitTest(const IntervalSet &set) {
    int32_t keyArgument = -1;
    for (size_t n = 0; n < mask.instructions.size(); ++n)
      if (mask.instructions[n].op == Opcode::Argument && mask.instructions[n].imm == 3)
        keyArgument = static_cast<int32_t>(n);
    if (keyArgument < 0)
      keyArgument = append(Opcode::Argument, ScalarType::Index, {}, 3);
    const int32_t key = append(Opcode::TruncI, ScalarType::I32, {keyArgument});
    int32_t result = -1;
    for (const Interval &interval : set) {
      int32_t first = constant(0), last = constant(kLastKey);
      for (const Bound &bound : interval.lower) {
        const std::optional<int32_t> value = emitBound(bound);
        if (!value)
          return std::nullopt;
        first = append(Opcode::MaxSI, ScalarType::Index, {first, *value});
      }
      for (const Bound &bound : interval.upper) {
        const std::optional<int32_t> value = emitBound(bound);
        if (!value)
          return std::nullopt;
        last = append(Opcode::MinSI, ScalarType::Index, {last, *value});
      }
      // first in [0, 2^31], last in [-1, 2^31 - 1]: count in [0, 2^31],
      // an unsigned 32-bit value; first is kept within 31 bits (it does not
      // matter when count is 0).
      first = append(Opcode::MinSI, ScalarType::Index, {first, constant(kLastKey + 1)});
      last = append(Opcode::MaxSI, ScalarType::Index, {last, constant(-1)});
      int32_t count = append(Opcode::AddI, ScalarType::Index,
                             {append(Opcode::SubI, ScalarType::Index, {last, first}), constant(1)});
      count = append(Opcode::MaxSI, ScalarType::Index, {count, constant(0)});
      first = append(Opcode::MinSI, ScalarType::Index, {first, constant(kLastKey)});
      for (const auto &[condition, holds] : interval.conditions) {
        const int32_t none = constant(0);
        count = append(Opcode::Select, ScalarType::Index, {condition, holds ? count : none, holds ? none : count});
      }
      firsts.push_back(append(Opcode::TruncI, ScalarType::I32, {first}));
      counts.push_back(append(Opcode::TruncI, ScalarType::I32, {count}));
      const int32_t offset = append(Opcode::SubI, ScalarType::I32, {key, firsts.back()});
      const int32_t hit = append(Opcode::CmpI, ScalarType::I1, {offset, counts.back()}, sem::ULT, 32);
      result = result < 0 ? hit : append(Opcode::OrI, ScalarType::I1, {result, hit});
    }
    return result >= 0 ? result : constant(0, ScalarType::I1);
  }

  const Program &mask;
  Program out;
  std::vector<int32_t> firsts, counts;
  const std::vector<Variance> variance;
  const std::vector<ValueRange> range;
  const std::vector<std::vector<int32_t>> guards;
  std::map<int32_t, std::optional<Linear>> linear;
};

} // namespace

KeyIntervalForm keyIntervals(const Program &mask) { return Rewriter(mask).run(); }

} // namespace dflex::codegen
