//===- IntervalEvaluator.cpp - abstract evaluation of body programs -------===//
//
// Every rule below returns a range that holds the exact result (as
// dflex/Expr/Semantics.h defines it) for every choice of operands in the
// operand ranges. Rules compute endpoints in 128-bit arithmetic and use
// monotonicity: an operation monotone in each operand separately (for any
// fixed value of the others) takes its extremes at the corners of the box.
//
//===----------------------------------------------------------------------===//

#include "dflex/Analysis/IntervalEvaluator.h"
#include "dflex/Expr/ProgramJson.h"
#include "dflex/Expr/Semantics.h"

#include "TensorSummary.h"

#include <algorithm>
#include <limits>

namespace dflex::analysis {

using expr::Instruction;
using expr::Opcode;
using expr::ScalarType;

const char *toString(Truth truth) {
  switch (truth) {
  case Truth::False: return "false";
  case Truth::True: return "true";
  case Truth::Both: return "both";
  }
  return "?";
}

namespace {

using i128 = __int128;
using u64 = uint64_t;

int64_t minSigned(int w) { return sem::minSigned(w); }
int64_t maxSigned(int w) {
  return w >= 64 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>((u64{1} << (w - 1)) - 1);
}
AbstractValue fullRange(int w) { return AbstractValue::ofRange(minSigned(w), maxSigned(w)); }
AbstractValue point(int64_t v) { return AbstractValue::ofRange(v, v); }

i128 floorDiv(i128 a, i128 d) { // d > 0
  i128 q = a / d;
  return (a % d < 0) ? q - 1 : q;
}

/// The values {x mod 2^w, sign-extended : x in [lo, hi]} as a range: exact
/// when the range does not cross a wrap-around point, else the full range.
AbstractValue wrapRange(i128 lo, i128 hi, int w) {
  const i128 span = i128{1} << w;
  if (hi - lo >= span)
    return fullRange(w);
  const i128 base = minSigned(w);
  i128 k = floorDiv(lo - base, span);
  if (floorDiv(hi - base, span) != k)
    return fullRange(w);
  return AbstractValue::ofRange(static_cast<int64_t>(lo - k * span),
                                static_cast<int64_t>(hi - k * span));
}

/// The smallest 2^k - 1 >= v, for v >= 0.
int64_t bitsUpTo(int64_t v) {
  return v == 0 ? 0 : static_cast<int64_t>(~u64{0} >> __builtin_clzll(static_cast<u64>(v)));
}

/// A union of ranges, kept as its hull.
struct Hull {
  i128 lo = 0, hi = 0;
  bool any = false;
  void add(i128 l, i128 h) {
    lo = any ? std::min(lo, l) : l;
    hi = any ? std::max(hi, h) : h;
    any = true;
  }
  void add(const AbstractValue &v) { add(v.lo, v.hi); }
  void addPoint(i128 v) { add(v, v); }
  /// Only called with values inside the width's range.
  AbstractValue value() const {
    return AbstractValue::ofRange(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  }
};

/// A range of unsigned values of some width.
struct UnsignedRange {
  u64 lo, hi;
};

/// The unsigned values of a signed range: one or two pieces.
int toUnsigned(const AbstractValue &v, int w, UnsignedRange pieces[2]) {
  if (v.lo >= 0) {
    pieces[0] = {static_cast<u64>(v.lo), static_cast<u64>(v.hi)};
    return 1;
  }
  if (v.hi < 0) {
    pieces[0] = {sem::asUnsigned(v.lo, w), sem::asUnsigned(v.hi, w)};
    return 1;
  }
  pieces[0] = {0, static_cast<u64>(v.hi)};
  pieces[1] = {sem::asUnsigned(v.lo, w), sem::lowMask(w)};
  return 2;
}

/// Adds the signed values of an unsigned range of width w.
void addUnsigned(Hull &hull, u64 lo, u64 hi, int w) {
  const u64 half = u64{1} << (w - 1);
  if ((lo < half) == (hi < half))
    hull.add(sem::wrap(lo, w), sem::wrap(hi, w));
  else
    hull.add(fullRange(w));
}

Truth join(Truth a, Truth b) { return a == b ? a : Truth::Both; }
Truth negate(Truth t) {
  return t == Truth::True ? Truth::False : t == Truth::False ? Truth::True : Truth::Both;
}
AbstractValue ofTruth(Truth t) {
  return t == Truth::True    ? point(-1)
         : t == Truth::False ? point(0)
                             : AbstractValue::ofRange(-1, 0);
}

/// Ordered comparisons of two ranges of one signedness.
template <class T> Truth lessThan(T alo, T ahi, T blo, T bhi) {
  if (ahi < blo)
    return Truth::True;
  if (alo >= bhi)
    return Truth::False;
  return Truth::Both;
}
template <class T> Truth lessEqual(T alo, T ahi, T blo, T bhi) {
  if (ahi <= blo)
    return Truth::True;
  if (alo > bhi)
    return Truth::False;
  return Truth::Both;
}
template <class T> Truth equal(T alo, T ahi, T blo, T bhi) {
  if (alo == ahi && blo == bhi && alo == blo)
    return Truth::True;
  if (ahi < blo || bhi < alo)
    return Truth::False;
  return Truth::Both;
}

template <class T> Truth compare(int predicate, T alo, T ahi, T blo, T bhi) {
  switch (predicate) {
  case sem::EQ: return equal(alo, ahi, blo, bhi);
  case sem::NE: return negate(equal(alo, ahi, blo, bhi));
  case sem::SLT: case sem::ULT: return lessThan(alo, ahi, blo, bhi);
  case sem::SLE: case sem::ULE: return lessEqual(alo, ahi, blo, bhi);
  case sem::SGT: case sem::UGT: return lessThan(blo, bhi, alo, ahi);
  default: return lessEqual(blo, bhi, alo, ahi);
  }
}

Truth compareIntegers(int predicate, const AbstractValue &a, const AbstractValue &b, int w) {
  if (predicate < sem::ULT)
    return compare<int64_t>(predicate, a.lo, a.hi, b.lo, b.hi);
  UnsignedRange pa[2], pb[2];
  int na = toUnsigned(a, w, pa), nb = toUnsigned(b, w, pb);
  Truth result = compare<u64>(predicate, pa[0].lo, pa[0].hi, pb[0].lo, pb[0].hi);
  for (int i = 0; i < na; ++i)
    for (int j = 0; j < nb; ++j)
      result = join(result, compare<u64>(predicate, pa[i].lo, pa[i].hi, pb[j].lo, pb[j].hi));
  return result;
}

/// divsi, floordivsi and ceildivsi: exact quotients rounded by a monotone
/// rule, so monotone in each operand on each side of zero; -1 negates (and
/// wraps the minimum), 0 gives 0.
template <class Divide>
AbstractValue signedDivision(const AbstractValue &a, const AbstractValue &b, int w,
                             Divide divide) {
  Hull hull;
  if (b.lo <= 0 && b.hi >= 0)
    hull.addPoint(0);
  if (b.lo <= -1 && b.hi >= -1)
    hull.add(wrapRange(-static_cast<i128>(a.hi), -static_cast<i128>(a.lo), w));
  auto corners = [&](int64_t blo, int64_t bhi) {
    if (blo > bhi)
      return;
    for (int64_t x : {a.lo, a.hi})
      for (int64_t y : {blo, bhi})
        hull.addPoint(divide(x, y, w));
  };
  corners(b.lo, std::min<int64_t>(b.hi, -2));
  corners(std::max<int64_t>(b.lo, 1), b.hi);
  return hull.value();
}

AbstractValue signedRemainder(const AbstractValue &a, const AbstractValue &b) {
  Hull hull;
  if (b.lo <= 0 && b.hi >= -1)
    hull.addPoint(0); // x % 0 == x % -1 == 0
  // |b| over b outside {-1, 0}.
  i128 minAbs = 0, maxAbs = 0;
  bool any = false;
  auto addDivisors = [&](i128 lo, i128 hi) { // 1 <= lo <= hi
    minAbs = any ? std::min(minAbs, lo) : lo;
    maxAbs = any ? std::max(maxAbs, hi) : hi;
    any = true;
  };
  if (b.lo <= -2)
    addDivisors(-static_cast<i128>(std::min<int64_t>(b.hi, -2)), -static_cast<i128>(b.lo));
  if (b.hi >= 1)
    addDivisors(std::max<int64_t>(b.lo, 1), b.hi);
  if (!any)
    return hull.value();
  // The magnitude of the remainder for dividends of magnitude [lo, hi] >= 0.
  auto magnitude = [&](i128 lo, i128 hi, i128 &rlo, i128 &rhi) {
    if (hi < minAbs) {
      rlo = lo;
      rhi = hi;
    } else if (minAbs == maxAbs && lo / minAbs == hi / minAbs) {
      rlo = lo % minAbs;
      rhi = hi % minAbs;
    } else {
      rlo = 0;
      rhi = std::min(hi, maxAbs - 1);
    }
  };
  i128 rlo, rhi;
  if (a.hi >= 0) {
    magnitude(std::max<int64_t>(a.lo, 0), a.hi, rlo, rhi);
    hull.add(rlo, rhi);
  }
  if (a.lo < 0) { // the remainder takes the dividend's sign
    magnitude(-static_cast<i128>(std::min<int64_t>(a.hi, -1)), -static_cast<i128>(a.lo), rlo, rhi);
    hull.add(-rhi, -rlo);
  }
  return hull.value();
}

/// divui, ceildivui and remui on the unsigned pieces of the operands.
enum class UnsignedDivision { Quotient, CeilQuotient, Remainder };
AbstractValue unsignedDivision(const AbstractValue &a, const AbstractValue &b, int w,
                               UnsignedDivision kind) {
  UnsignedRange pa[2], pb[2];
  int na = toUnsigned(a, w, pa), nb = toUnsigned(b, w, pb);
  Hull hull;
  for (int j = 0; j < nb; ++j) {
    u64 dlo = pb[j].lo, dhi = pb[j].hi;
    if (dlo == 0) {
      hull.addPoint(0); // division by zero
      if (dhi == 0)
        continue;
      dlo = 1;
    }
    for (int i = 0; i < na; ++i) {
      u64 lo = pa[i].lo, hi = pa[i].hi;
      switch (kind) {
      case UnsignedDivision::Quotient:
        addUnsigned(hull, lo / dhi, hi / dlo, w);
        break;
      case UnsignedDivision::CeilQuotient:
        addUnsigned(hull, lo / dhi + (lo % dhi != 0), hi / dlo + (hi % dlo != 0), w);
        break;
      case UnsignedDivision::Remainder:
        if (hi < dlo)
          addUnsigned(hull, lo, hi, w);
        else if (dlo == dhi && lo / dlo == hi / dlo)
          addUnsigned(hull, lo % dlo, hi % dlo, w);
        else
          addUnsigned(hull, 0, std::min(hi, dhi - 1), w);
        break;
      }
    }
  }
  return hull.value();
}

/// maxui / minui: the result is one of the operands.
AbstractValue unsignedMinMax(const AbstractValue &a, const AbstractValue &b, int w, bool isMax) {
  UnsignedRange pa[2], pb[2];
  int na = toUnsigned(a, w, pa), nb = toUnsigned(b, w, pb);
  Hull hull;
  for (int i = 0; i < na; ++i)
    for (int j = 0; j < nb; ++j) {
      if (isMax)
        addUnsigned(hull, std::max(pa[i].lo, pb[j].lo), std::max(pa[i].hi, pb[j].hi), w);
      else
        addUnsigned(hull, std::min(pa[i].lo, pb[j].lo), std::min(pa[i].hi, pb[j].hi), w);
    }
  return hull.value();
}

Truth truthOf(const AbstractValue &v) { return v.truth(); }

AbstractValue bitwise(Opcode op, const AbstractValue &a, const AbstractValue &b, int w) {
  if (w == 1) { // three-valued logic on {false, true}
    Truth x = truthOf(a), y = truthOf(b);
    if (op == Opcode::AndI)
      return ofTruth(x == Truth::False || y == Truth::False ? Truth::False
                     : x == Truth::True && y == Truth::True ? Truth::True
                                                            : Truth::Both);
    if (op == Opcode::OrI)
      return ofTruth(x == Truth::True || y == Truth::True ? Truth::True
                     : x == Truth::False && y == Truth::False ? Truth::False
                                                              : Truth::Both);
    if (x == Truth::Both || y == Truth::Both)
      return ofTruth(Truth::Both);
    return ofTruth(x == y ? Truth::False : Truth::True);
  }
  if (a.lo == a.hi && b.lo == b.hi)
    return point(op == Opcode::AndI  ? sem::andi(a.lo, b.lo, w)
                 : op == Opcode::OrI ? sem::ori(a.lo, b.lo, w)
                                     : sem::xori(a.lo, b.lo, w));
  const bool aNonNegative = a.lo >= 0, bNonNegative = b.lo >= 0;
  const bool aNegative = a.hi < 0, bNegative = b.hi < 0;
  if (op == Opcode::AndI) {
    // Clearing bits never raises a value of a given sign; a non-negative
    // operand keeps the sign bit clear.
    int64_t lo = aNonNegative || bNonNegative ? 0 : minSigned(w);
    int64_t hi = aNonNegative && bNonNegative ? std::min(a.hi, b.hi)
                 : aNonNegative               ? a.hi
                 : bNonNegative               ? b.hi
                 : aNegative && bNegative     ? std::min(a.hi, b.hi)
                                              : std::max(a.hi, b.hi);
    return AbstractValue::ofRange(lo, hi);
  }
  if (op == Opcode::OrI) {
    // Setting bits never lowers a value of a given sign; a negative operand
    // makes the result negative.
    int64_t lo = (aNonNegative && bNonNegative) || (aNegative && bNegative)
                     ? std::max(a.lo, b.lo)
                 : aNegative ? a.lo
                 : bNegative ? b.lo
                             : std::min(a.lo, b.lo);
    int64_t hi = aNegative || bNegative ? -1 : bitsUpTo(std::max(a.hi, b.hi));
    return AbstractValue::ofRange(lo, hi);
  }
  // xor: every operand fits in k + 1 signed bits, so does the result.
  int64_t magnitude = std::max({a.hi, b.hi, ~a.lo, ~b.lo, int64_t{0}});
  int64_t bound = bitsUpTo(magnitude);
  bool aKnown = aNonNegative || aNegative, bKnown = bNonNegative || bNegative;
  if (aKnown && bKnown)
    return aNegative == bNegative ? AbstractValue::ofRange(0, bound)
                                  : AbstractValue::ofRange(~bound, -1);
  return AbstractValue::ofRange(~bound, bound);
}

/// Shifts: the amount is an unsigned value of the width; amounts >= w give
/// 0 (shli, shrui) or the sign (shrsi).
AbstractValue shift(Opcode op, const AbstractValue &a, const AbstractValue &b, int w) {
  UnsignedRange amounts[2];
  int n = toUnsigned(b, w, amounts);
  Hull hull;
  for (int i = 0; i < n; ++i) {
    u64 lo = amounts[i].lo, hi = amounts[i].hi;
    if (hi >= static_cast<u64>(w)) {
      if (op == Opcode::ShRSI) {
        if (a.lo < 0)
          hull.addPoint(-1);
        if (a.hi >= 0)
          hull.addPoint(0);
      } else {
        hull.addPoint(0);
      }
      hi = static_cast<u64>(w) - 1;
    }
    if (lo > hi)
      continue;
    int s0 = static_cast<int>(lo), s1 = static_cast<int>(hi);
    if (op == Opcode::ShLI) {
      i128 c[4] = {static_cast<i128>(a.lo) << s0, static_cast<i128>(a.lo) << s1,
                   static_cast<i128>(a.hi) << s0, static_cast<i128>(a.hi) << s1};
      hull.add(wrapRange(*std::min_element(c, c + 4), *std::max_element(c, c + 4), w));
    } else if (op == Opcode::ShRSI) {
      int64_t c[4] = {a.lo >> s0, a.lo >> s1, a.hi >> s0, a.hi >> s1};
      hull.add(*std::min_element(c, c + 4), *std::max_element(c, c + 4));
    } else {
      UnsignedRange values[2];
      int m = toUnsigned(a, w, values);
      for (int j = 0; j < m; ++j)
        addUnsigned(hull, values[j].lo >> s1, values[j].hi >> s0, w);
    }
  }
  return hull.value();
}

bool isInexactMath(Opcode op) {
  switch (op) {
  case Opcode::Exp: case Opcode::Exp2: case Opcode::ExpM1: case Opcode::Log:
  case Opcode::Log2: case Opcode::Log1p: case Opcode::Tanh: case Opcode::Sin:
  case Opcode::Cos: case Opcode::Erf: case Opcode::PowF:
    return true;
  default:
    return false;
  }
}

/// Whether an instruction computes with floats (result or operands).
bool touchesFloat(const Instruction &inst) {
  return expr::isFloat(inst.type) || inst.op == Opcode::CmpF ||
         inst.op == Opcode::FPToSI || inst.op == Opcode::FPToUI;
}

bool isWidth(int64_t w) { return w == 1 || w == 8 || w == 16 || w == 32 || w == 64; }

/// Checks what evaluation relies on; returns a message naming the problem.
std::string checkProgram(const expr::Program &program) {
  const auto &insts = program.instructions;
  auto where = [&](size_t n) {
    std::string text = "'" + program.name + "' instruction " + std::to_string(n) +
                       " (" + expr::toString(insts[n].op) + ")";
    return text;
  };
  if (program.result < 0 || static_cast<size_t>(program.result) >= insts.size())
    return "'" + program.name + "' has no result instruction";
  for (size_t n = 0; n < insts.size(); ++n) {
    const Instruction &inst = insts[n];
    for (int32_t operand : inst.operands)
      if (operand < 0 || static_cast<size_t>(operand) >= n)
        return where(n) + " uses operand " + std::to_string(operand) +
               ", not an earlier instruction";
    int expected = expr::operandCount(inst.op, 0); // a Read's rank is set below
    bool needsCapture = inst.op == Opcode::Capture || inst.op == Opcode::Read ||
                        inst.op == Opcode::Dim;
    if (needsCapture) {
      if (inst.imm < 0 || static_cast<size_t>(inst.imm) >= program.captures.size())
        return where(n) + " names capture " + std::to_string(inst.imm) + ", which does not exist";
      const expr::CaptureDecl &decl = program.captures[inst.imm];
      if (decl.isTensor != (inst.op != Opcode::Capture))
        return where(n) + " uses capture '" + decl.name + "' as a " +
               (decl.isTensor ? "scalar" : "tensor");
      if (inst.op == Opcode::Read) {
        expected = decl.rank;
        if (inst.type != decl.elementType)
          return where(n) + " reads '" + decl.name + "' as " + expr::toString(inst.type);
      }
      if (inst.op == Opcode::Dim && (inst.imm2 < 0 || inst.imm2 >= decl.rank))
        return where(n) + " asks for dimension " + std::to_string(inst.imm2) + " of '" +
               decl.name + "'";
    }
    if (static_cast<int>(inst.operands.size()) != expected)
      return where(n) + " has " + std::to_string(inst.operands.size()) +
             " operands, expected " + std::to_string(expected);
    if (inst.op == Opcode::Argument &&
        (inst.imm < 0 || inst.imm >= static_cast<int64_t>(program.numLeadingArguments())))
      return where(n) + " names leading argument " + std::to_string(inst.imm);
    if ((inst.op == Opcode::CmpI || inst.op == Opcode::ExtUI ||
         inst.op == Opcode::IndexCastUI || inst.op == Opcode::UIToFP) &&
        !isWidth(inst.imm2))
      return where(n) + " has operand width " + std::to_string(inst.imm2);
    if (inst.op == Opcode::Constant && !expr::isFloat(inst.type) &&
        sem::wrap(static_cast<u64>(inst.imm), expr::intWidth(inst.type)) != inst.imm)
      return where(n) + " holds " + std::to_string(inst.imm) + ", out of range for " +
             expr::toString(inst.type);
  }
  return "";
}

} // namespace

Dependencies computeDependencies(const expr::Program &program) {
  Dependencies deps;
  deps.leading.assign(program.numLeadingArguments(), false);
  deps.captures.assign(program.captures.size(), false);
  std::vector<bool> live(program.instructions.size(), false);
  if (program.result >= 0 && static_cast<size_t>(program.result) < live.size())
    live[program.result] = true;
  for (size_t n = live.size(); n-- > 0;) {
    if (!live[n])
      continue;
    const Instruction &inst = program.instructions[n];
    for (int32_t operand : inst.operands)
      if (operand >= 0 && static_cast<size_t>(operand) < n)
        live[operand] = true;
    if (inst.op == Opcode::Argument && inst.imm >= 0 &&
        static_cast<size_t>(inst.imm) < deps.leading.size())
      deps.leading[inst.imm] = true;
    if ((inst.op == Opcode::Capture || inst.op == Opcode::Read || inst.op == Opcode::Dim) &&
        inst.imm >= 0 && static_cast<size_t>(inst.imm) < deps.captures.size())
      deps.captures[inst.imm] = true;
    if (touchesFloat(inst))
      deps.floatArithmetic = true;
  }
  return deps;
}

//===----------------------------------------------------------------------===//
// The evaluator.
//===----------------------------------------------------------------------===//

struct IntervalEvaluator::Impl {
  expr::Program program;
  std::vector<expr::CaptureValue> captures;
  Dependencies deps;
  std::vector<AbstractValue> values;
  AbstractValue leading[5];

  // Live instructions by what they depend on: none (evaluated once, at
  // creation), any leading argument, and per mask argument v those that do
  // not depend on v (fixed) and those that do (varying).
  std::vector<int32_t> dependentOrder;
  std::vector<int32_t> fixedOrder[4], varyingOrder[4];
  int varyingArgument = -1; // of the last fix(), -1 before

  std::vector<std::unique_ptr<TensorSummary>> summaries; // per integer tensor capture

  // Float instructions evaluate through the interpreter when their operands
  // are exact: a copy of the instruction behind one constant per operand.
  std::vector<int32_t> singleIndex; // per instruction, -1 if none
  std::vector<expr::Program> singles;
  std::vector<expr::Value> scratch;

  AbstractValue readInteger(const Instruction &inst);
  AbstractValue exactFloatInstruction(size_t n);
  AbstractValue step(size_t n);
  void run(const std::vector<int32_t> &order) {
    for (int32_t n : order)
      values[n] = step(n);
  }
};

AbstractValue IntervalEvaluator::Impl::readInteger(const Instruction &inst) {
  const expr::CaptureValue &tensor = captures[inst.imm];
  const TensorSummary &summary = *summaries[inst.imm];
  const size_t rank = inst.operands.size();
  Hull hull;
  bool inRange = true;    // some index tuple is in range
  bool outOfRange = false; // some index tuple is out of range
  // In-range index ranges per dimension.
  int64_t first[8], last[8];
  std::vector<int64_t> firstHeap, lastHeap;
  int64_t *lo = first, *hi = last;
  if (rank > 8) {
    firstHeap.resize(rank);
    lastHeap.resize(rank);
    lo = firstHeap.data();
    hi = lastHeap.data();
  }
  for (size_t d = 0; d < rank; ++d) {
    const AbstractValue &index = values[inst.operands[d]];
    int64_t size = tensor.sizes[d];
    if (index.lo < 0 || index.hi >= size)
      outOfRange = true;
    lo[d] = std::max<int64_t>(index.lo, 0);
    hi[d] = std::min<int64_t>(index.hi, size - 1);
    if (lo[d] > hi[d])
      inRange = false;
  }
  if (outOfRange)
    hull.addPoint(inst.hasPadding ? inst.paddingInt : 0);
  if (!inRange)
    return hull.value();
  if (rank == 0) {
    int64_t mn, mx;
    summary.rowRange(0, 0, 0, mn, mx);
    hull.add(mn, mx);
    return hull.value();
  }
  // Rows: every combination of the leading indices, up to a limit.
  constexpr int64_t kMaxRows = 64;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < rank && rows <= kMaxRows; ++d)
    rows *= hi[d] - lo[d] + 1;
  if (rows > kMaxRows) {
    hull.add(summary.globalMin(), summary.globalMax());
    return hull.value();
  }
  int64_t position[8] = {0};
  std::vector<int64_t> positionHeap(rank > 8 ? rank : 0);
  int64_t *pos = rank > 8 ? positionHeap.data() : position;
  for (size_t d = 0; d + 1 < rank; ++d)
    pos[d] = lo[d];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t row = 0;
    for (size_t d = 0; d + 1 < rank; ++d)
      row = row * tensor.sizes[d] + pos[d];
    int64_t mn, mx;
    summary.rowRange(row, lo[rank - 1], hi[rank - 1], mn, mx);
    hull.add(mn, mx);
    for (size_t d = rank - 1; d-- > 0;) {
      if (++pos[d] <= hi[d])
        break;
      pos[d] = lo[d];
    }
  }
  return hull.value();
}

AbstractValue IntervalEvaluator::Impl::exactFloatInstruction(size_t n) {
  const Instruction &inst = program.instructions[n];
  const bool floatResult = expr::isFloat(inst.type);
  auto unknown = [&]() {
    return floatResult ? AbstractValue::anyFloat() : fullRange(expr::intWidth(inst.type));
  };
  if (isInexactMath(inst.op))
    return unknown();
  expr::Program &single = singles[singleIndex[n]];
  for (size_t k = 0; k < inst.operands.size(); ++k) {
    const Instruction &operand = program.instructions[inst.operands[k]];
    const AbstractValue &v = values[inst.operands[k]];
    Instruction &constant = single.instructions[k];
    if (expr::isFloat(operand.type)) {
      if (!v.exact)
        return unknown();
      constant.fimm = v.f;
    } else {
      if (v.lo != v.hi)
        return unknown();
      constant.imm = v.lo;
    }
  }
  expr::Value result = expr::evaluate(single, nullptr, captures, scratch);
  return floatResult ? AbstractValue::ofFloat(result.f) : point(result.i);
}

AbstractValue IntervalEvaluator::Impl::step(size_t n) {
  const Instruction &inst = program.instructions[n];
  const int w = expr::intWidth(inst.type);
  auto A = [&](int k) -> const AbstractValue & { return values[inst.operands[k]]; };
  switch (inst.op) {
  case Opcode::Argument:
    return leading[inst.imm];
  case Opcode::Capture: {
    expr::Value v = captures[inst.imm].scalar;
    return expr::isFloat(inst.type) ? AbstractValue::ofFloat(v.f) : point(v.i);
  }
  case Opcode::Constant:
    return expr::isFloat(inst.type) ? AbstractValue::ofFloat(inst.fimm) : point(inst.imm);
  case Opcode::Dim:
    return point(captures[inst.imm].sizes[inst.imm2]);
  case Opcode::Read:
    if (expr::isFloat(inst.type))
      return exactFloatInstruction(n);
    return readInteger(inst);
  case Opcode::Select: {
    Truth condition = A(0).truth();
    if (condition == Truth::True)
      return A(1);
    if (condition == Truth::False)
      return A(2);
    const AbstractValue &x = A(1), &y = A(2);
    if (expr::isFloat(inst.type))
      return x.exact && y.exact && sem::floatBits(x.f) == sem::floatBits(y.f)
                 ? x
                 : AbstractValue::anyFloat();
    return AbstractValue::ofRange(std::min(x.lo, y.lo), std::max(x.hi, y.hi));
  }
  case Opcode::AddI:
    return wrapRange(static_cast<i128>(A(0).lo) + A(1).lo, static_cast<i128>(A(0).hi) + A(1).hi, w);
  case Opcode::SubI:
    return wrapRange(static_cast<i128>(A(0).lo) - A(1).hi, static_cast<i128>(A(0).hi) - A(1).lo, w);
  case Opcode::MulI: {
    const AbstractValue &a = A(0), &b = A(1);
    i128 c[4] = {static_cast<i128>(a.lo) * b.lo, static_cast<i128>(a.lo) * b.hi,
                 static_cast<i128>(a.hi) * b.lo, static_cast<i128>(a.hi) * b.hi};
    return wrapRange(*std::min_element(c, c + 4), *std::max_element(c, c + 4), w);
  }
  case Opcode::DivSI:
    return signedDivision(A(0), A(1), w, sem::divsi);
  case Opcode::FloorDivSI:
    return signedDivision(A(0), A(1), w, sem::floordivsi);
  case Opcode::CeilDivSI:
    return signedDivision(A(0), A(1), w, sem::ceildivsi);
  case Opcode::RemSI:
    return signedRemainder(A(0), A(1));
  case Opcode::DivUI:
    return unsignedDivision(A(0), A(1), w, UnsignedDivision::Quotient);
  case Opcode::CeilDivUI:
    return unsignedDivision(A(0), A(1), w, UnsignedDivision::CeilQuotient);
  case Opcode::RemUI:
    return unsignedDivision(A(0), A(1), w, UnsignedDivision::Remainder);
  case Opcode::MaxSI:
    return AbstractValue::ofRange(std::max(A(0).lo, A(1).lo), std::max(A(0).hi, A(1).hi));
  case Opcode::MinSI:
    return AbstractValue::ofRange(std::min(A(0).lo, A(1).lo), std::min(A(0).hi, A(1).hi));
  case Opcode::MaxUI:
    return unsignedMinMax(A(0), A(1), w, true);
  case Opcode::MinUI:
    return unsignedMinMax(A(0), A(1), w, false);
  case Opcode::AndI:
  case Opcode::OrI:
  case Opcode::XOrI:
    return bitwise(inst.op, A(0), A(1), w);
  case Opcode::ShLI:
  case Opcode::ShRSI:
  case Opcode::ShRUI:
    return shift(inst.op, A(0), A(1), w);
  case Opcode::AbsI: {
    const AbstractValue &a = A(0);
    if (a.lo >= 0)
      return a;
    if (a.hi <= 0)
      return wrapRange(-static_cast<i128>(a.hi), -static_cast<i128>(a.lo), w);
    return wrapRange(0, std::max(-static_cast<i128>(a.lo), static_cast<i128>(a.hi)), w);
  }
  case Opcode::CmpI:
    return ofTruth(compareIntegers(static_cast<int>(inst.imm), A(0), A(1),
                                   static_cast<int>(inst.imm2)));
  case Opcode::CmpF:
    if (inst.imm == sem::AlwaysFalse || inst.imm == sem::AlwaysTrue)
      return ofTruth(inst.imm == sem::AlwaysTrue ? Truth::True : Truth::False);
    return exactFloatInstruction(n);
  case Opcode::ExtSI:
  case Opcode::IndexCast:
  case Opcode::TruncI:
    return wrapRange(A(0).lo, A(0).hi, w);
  case Opcode::ExtUI:
  case Opcode::IndexCastUI: {
    UnsignedRange pieces[2];
    int count = toUnsigned(A(0), static_cast<int>(inst.imm2), pieces);
    Hull hull;
    for (int i = 0; i < count; ++i)
      hull.add(wrapRange(static_cast<i128>(pieces[i].lo), static_cast<i128>(pieces[i].hi), w));
    return hull.value();
  }
  default: // float arithmetic, conversions from and to floats
    return exactFloatInstruction(n);
  }
}

IntervalEvaluator::IntervalEvaluator(std::unique_ptr<Impl> impl) : impl(std::move(impl)) {}
IntervalEvaluator::~IntervalEvaluator() = default;

EvaluatorResult IntervalEvaluator::create(const expr::Program &program,
                                          const std::vector<expr::CaptureValue> &captures) {
  EvaluatorResult result;
  if (std::string problem = checkProgram(program); !problem.empty()) {
    result.error = problem;
    return result;
  }
  if (std::string problem = expr::checkCaptures(program, captures); !problem.empty()) {
    result.error = problem;
    return result;
  }
  for (size_t c = 0; c < captures.size(); ++c) {
    const expr::CaptureDecl &decl = program.captures[c];
    if (!decl.isTensor && !expr::isFloat(decl.elementType)) {
      int64_t v = captures[c].scalar.i;
      if (sem::wrap(static_cast<u64>(v), expr::intWidth(decl.elementType)) != v) {
        result.error = "capture '" + decl.name + "' holds " + std::to_string(v) +
                       ", out of range for " + expr::toString(decl.elementType);
        return result;
      }
    }
    if (decl.isTensor) {
      int64_t elements = 1;
      for (int64_t size : captures[c].sizes) {
        if (size < 0) {
          result.error = "capture '" + decl.name + "' has a negative size";
          return result;
        }
        elements *= size;
      }
      if (elements > 0 && !captures[c].data) {
        result.error = "capture '" + decl.name + "' has no data";
        return result;
      }
    }
  }

  auto impl = std::make_unique<Impl>();
  impl->program = program;
  impl->captures = captures;
  impl->deps = computeDependencies(program);
  const auto &insts = impl->program.instructions;
  const size_t count = insts.size();
  impl->values.assign(count, AbstractValue{});

  // Liveness and, per live instruction, the leading arguments it depends on.
  std::vector<bool> live(count, false);
  live[program.result] = true;
  for (size_t n = count; n-- > 0;)
    if (live[n])
      for (int32_t operand : insts[n].operands)
        live[operand] = true;
  std::vector<uint32_t> argumentsOf(count, 0);
  for (size_t n = 0; n < count; ++n) {
    if (insts[n].op == Opcode::Argument)
      argumentsOf[n] = 1u << insts[n].imm;
    for (int32_t operand : insts[n].operands)
      argumentsOf[n] |= argumentsOf[operand];
  }
  // Mask argument v is leading argument v + (score_mod ? 1 : 0).
  const int maskOffset = program.isScoreMod ? 1 : 0;

  impl->singleIndex.assign(count, -1);
  impl->summaries.resize(captures.size());
  std::vector<int32_t> constantOrder;
  for (size_t n = 0; n < count; ++n) {
    if (!live[n])
      continue;
    const Instruction &inst = insts[n];
    if (inst.op == Opcode::Read && !expr::isFloat(inst.type) && !impl->summaries[inst.imm])
      impl->summaries[inst.imm] = std::make_unique<TensorSummary>(captures[inst.imm]);
    if (touchesFloat(inst) && inst.op != Opcode::Select && inst.op != Opcode::Constant &&
        inst.op != Opcode::Capture && inst.op != Opcode::Argument) {
      expr::Program single;
      single.name = program.name;
      single.captures = program.captures;
      for (int32_t operand : inst.operands) {
        Instruction constant;
        constant.op = Opcode::Constant;
        constant.type = insts[operand].type;
        single.instructions.push_back(constant);
      }
      Instruction copy = inst;
      for (size_t k = 0; k < copy.operands.size(); ++k)
        copy.operands[k] = static_cast<int32_t>(k);
      single.instructions.push_back(copy);
      single.result = static_cast<int32_t>(single.instructions.size() - 1);
      impl->singleIndex[n] = static_cast<int32_t>(impl->singles.size());
      impl->singles.push_back(std::move(single));
    }
    uint32_t arguments = argumentsOf[n];
    if (arguments == 0) {
      constantOrder.push_back(static_cast<int32_t>(n));
      continue;
    }
    impl->dependentOrder.push_back(static_cast<int32_t>(n));
    for (int v = 0; v < 4; ++v) {
      if (arguments & (1u << (v + maskOffset)))
        impl->varyingOrder[v].push_back(static_cast<int32_t>(n));
      else
        impl->fixedOrder[v].push_back(static_cast<int32_t>(n));
    }
  }
  if (program.isScoreMod)
    impl->leading[0] = AbstractValue::anyFloat();
  impl->run(constantOrder);
  result.evaluator.reset(new IntervalEvaluator(std::move(impl)));
  return result;
}

const expr::Program &IntervalEvaluator::program() const { return impl->program; }
const Dependencies &IntervalEvaluator::dependencies() const { return impl->deps; }

bool IntervalEvaluator::dependsOn(MaskArgument argument) const {
  size_t index = static_cast<size_t>(argument) + (impl->program.isScoreMod ? 1 : 0);
  return impl->deps.leading[index];
}

AbstractValue IntervalEvaluator::evaluate(const AbstractValue *leading) {
  std::copy(leading, leading + impl->program.numLeadingArguments(), impl->leading);
  impl->run(impl->dependentOrder);
  impl->varyingArgument = -1;
  return impl->values[impl->program.result];
}

namespace {
AbstractValue ofRange(IntRange r) { return AbstractValue::ofRange(r.lo, r.hi); }
} // namespace

Truth IntervalEvaluator::evaluateMask(const Box &box) {
  AbstractValue leading[5] = {ofRange(box.b), ofRange(box.h), ofRange(box.q), ofRange(box.kv)};
  if (impl->program.isScoreMod) {
    std::copy(leading, leading + 4, leading + 1);
    leading[0] = AbstractValue::anyFloat();
  }
  return evaluate(leading).truth();
}

void IntervalEvaluator::fix(const Box &box, MaskArgument varying) {
  const int offset = impl->program.isScoreMod ? 1 : 0;
  impl->leading[offset + 0] = ofRange(box.b);
  impl->leading[offset + 1] = ofRange(box.h);
  impl->leading[offset + 2] = ofRange(box.q);
  impl->leading[offset + 3] = ofRange(box.kv);
  impl->varyingArgument = static_cast<int>(varying);
  impl->run(impl->fixedOrder[impl->varyingArgument]);
}

Truth IntervalEvaluator::evaluateVarying(IntRange range) {
  const int v = impl->varyingArgument;
  if (v < 0)
    return Truth::Both; // fix() was not called: nothing is known
  impl->leading[v + (impl->program.isScoreMod ? 1 : 0)] = ofRange(range);
  impl->run(impl->varyingOrder[v]);
  return impl->values[impl->program.result].truth();
}

} // namespace dflex::analysis
