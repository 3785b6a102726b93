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

/// An integer range inside the evaluator (16 bytes: returned in registers).
struct Range {
  int64_t lo, hi;
  Truth truth() const { return AbstractValue::ofRange(lo, hi).truth(); }
};
Range ofRange(int64_t lo, int64_t hi) { return Range{lo, hi}; }


/// A float: its value when exact, else any float (NaN included).
struct FloatValue {
  float f = 0.0f;
  bool exact = false;
};

int64_t minSigned(int w) { return sem::minSigned(w); }
int64_t maxSigned(int w) {
  return w >= 64 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>((u64{1} << (w - 1)) - 1);
}
Range fullRange(int w) { return ofRange(minSigned(w), maxSigned(w)); }
Range point(int64_t v) { return ofRange(v, v); }

i128 floorDiv(i128 a, i128 d) { // d > 0
  i128 q = a / d;
  return (a % d < 0) ? q - 1 : q;
}

/// The values {x mod 2^w, sign-extended : x in [lo, hi]} as a range: exact
/// when the range does not cross a wrap-around point, else the full range.
Range wrapRange(i128 lo, i128 hi, int w) {
  if (lo >= minSigned(w) && hi <= maxSigned(w))
    return ofRange(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  const i128 span = i128{1} << w;
  if (hi - lo >= span)
    return fullRange(w);
  const i128 base = minSigned(w);
  i128 k = floorDiv(lo - base, span);
  if (floorDiv(hi - base, span) != k)
    return fullRange(w);
  return ofRange(static_cast<int64_t>(lo - k * span),
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
  void add(const Range &v) { add(v.lo, v.hi); }
  void addPoint(i128 v) { add(v, v); }
  /// Only called with values inside the width's range.
  Range value() const {
    return ofRange(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
  }
};

/// A range of unsigned values of some width.
struct UnsignedRange {
  u64 lo, hi;
};

/// The unsigned values of a signed range: one or two pieces.
int toUnsigned(const Range &v, int w, UnsignedRange pieces[2]) {
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
inline __attribute__((always_inline)) Truth negate(Truth t) {
  return t == Truth::True ? Truth::False : t == Truth::False ? Truth::True : Truth::Both;
}
inline __attribute__((always_inline)) Range ofTruth(Truth t) {
  return t == Truth::True    ? point(-1)
         : t == Truth::False ? point(0)
                             : ofRange(-1, 0);
}

/// Ordered comparisons of two ranges of one signedness.
template <class T> inline __attribute__((always_inline)) Truth lessThan(T alo, T ahi, T blo, T bhi) {
  if (ahi < blo)
    return Truth::True;
  if (alo >= bhi)
    return Truth::False;
  return Truth::Both;
}
template <class T> inline __attribute__((always_inline)) Truth lessEqual(T alo, T ahi, T blo, T bhi) {
  if (ahi <= blo)
    return Truth::True;
  if (alo > bhi)
    return Truth::False;
  return Truth::Both;
}
template <class T> inline __attribute__((always_inline)) Truth equal(T alo, T ahi, T blo, T bhi) {
  if (alo == ahi && blo == bhi && alo == blo)
    return Truth::True;
  if (ahi < blo || bhi < alo)
    return Truth::False;
  return Truth::Both;
}

template <class T> inline __attribute__((always_inline)) Truth compare(int predicate, T alo, T ahi, T blo, T bhi) {
  switch (predicate) {
  case sem::EQ: return equal(alo, ahi, blo, bhi);
  case sem::NE: return negate(equal(alo, ahi, blo, bhi));
  case sem::SLT: case sem::ULT: return lessThan(alo, ahi, blo, bhi);
  case sem::SLE: case sem::ULE: return lessEqual(alo, ahi, blo, bhi);
  case sem::SGT: case sem::UGT: return lessThan(blo, bhi, alo, ahi);
  default: return lessEqual(blo, bhi, alo, ahi);
  }
}

Truth compareIntegers(int predicate, const Range &a, const Range &b, int w) {
  // Non-negative values order the same way signed and unsigned.
  if (predicate < sem::ULT || (a.lo >= 0 && b.lo >= 0))
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
Range signedDivision(const Range &a, const Range &b, int w,
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

Range signedRemainder(const Range &a, const Range &b) {
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
Range unsignedDivision(const Range &a, const Range &b, int w,
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
Range unsignedMinMax(const Range &a, const Range &b, int w, bool isMax) {
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

Range bitwise(Opcode op, const Range &a, const Range &b, int w) {
  if (w == 1) { // three-valued logic on {false, true}
    Truth x = a.truth(), y = b.truth();
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
    return ofRange(lo, hi);
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
    return ofRange(lo, hi);
  }
  // xor: every operand fits in k + 1 signed bits, so does the result.
  int64_t magnitude = std::max({a.hi, b.hi, ~a.lo, ~b.lo, int64_t{0}});
  int64_t bound = bitsUpTo(magnitude);
  bool aKnown = aNonNegative || aNegative, bKnown = bNonNegative || bNegative;
  if (aKnown && bKnown)
    return aNegative == bNegative ? ofRange(0, bound)
                                  : ofRange(~bound, -1);
  return ofRange(~bound, bound);
}

/// Shifts: the amount is an unsigned value of the width; amounts >= w give
/// 0 (shli, shrui) or the sign (shrsi).
Range shift(Opcode op, const Range &a, const Range &b, int w) {
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

/// A live instruction, decoded for a fast evaluation loop.
struct Step {
  Opcode op;
  uint8_t width;        // of the result, for integers
  uint8_t operandWidth; // imm2 of comparisons and unsigned extensions
  bool floatResult;
  int32_t result;       // the instruction number
  int32_t a, b, c;      // operands (or -1)
  int64_t imm;
  int64_t padding;      // Read: the value of an out-of-range read
  uint32_t rank;        // Read: the tensor's rank
};

struct IntervalEvaluator::Impl {
  expr::Program program;
  std::vector<expr::CaptureValue> captures;
  Dependencies deps;
  // Integer results live in `ranges`, float results in `floats` (kept apart
  // so that the hot integer rules return their 16 bytes in registers).
  std::vector<Range> ranges;
  std::vector<FloatValue> floats;
  Range leadingRanges[5];
  FloatValue score; // a score_mod's first argument
  bool floatResult = false;

  // Live instructions by what they depend on: none (evaluated once per set
  // of captures), any leading argument, and per mask argument v those that
  // do not depend on v (fixed) and those that do (varying).
  std::vector<Step> constantOrder;
  std::vector<Step> dependentOrder;
  std::vector<Step> fixedOrder[4], varyingOrder[4];
  std::vector<int32_t> varyingSlots[4]; // the Argument instructions of v
  int varyingArgument = -1; // of the last fix(), -1 before
  std::vector<int64_t> breakpoints; // of the last fix()
  std::vector<int64_t> offsets;     // per instruction, scratch of findBreakpoints
  std::vector<bool> affine;         // per instruction: varying argument + offsets[n]
  std::vector<uint8_t> varyingIn;   // per instruction: bit v if in varyingOrder[v]
  // Per mask argument v: the steps that may be v plus offsets (casts,
  // additions and subtractions of other values, starting from the slots of
  // v) and the comparisons of those with other values, in order; empty when
  // there is no such comparison.
  std::vector<Step> affineOrder[4];

  std::vector<std::unique_ptr<TensorSummary>> summaries; // per integer tensor capture

  // Float instructions evaluate through the interpreter when their operands
  // are exact: a copy of the instruction behind one constant per operand.
  std::vector<int32_t> singleIndex; // per instruction, -1 if none
  std::vector<expr::Program> singles;
  std::vector<expr::Value> scratch;

  Range readInteger(const Instruction &inst);

  /// Reads of rank 1 and 2 whose leading index is one point: one row query.
  bool readOneRow(const Step &s, Range &out) {
    if (s.rank == 0 || s.rank > 2)
      return false;
    const int64_t *sizes = captures[s.imm].sizes.data();
    int64_t row = 0;
    bool outOfRange = false;
    if (s.rank == 2) {
      const Range &lead = ranges[s.a];
      if (lead.lo != lead.hi)
        return false;
      row = lead.lo;
      outOfRange = row < 0 || row >= sizes[0];
    }
    const Range &index = ranges[s.rank == 2 ? s.b : s.a];
    const int64_t length = sizes[s.rank - 1];
    const int64_t first = std::max<int64_t>(index.lo, 0);
    const int64_t last = std::min<int64_t>(index.hi, length - 1);
    outOfRange |= index.lo < 0 || index.hi >= length;
    const bool inRange = first <= last && row >= 0 && (s.rank == 1 || row < sizes[0]);
    int64_t min = s.padding, max = s.padding;
    if (inRange) {
      summaries[s.imm]->rowRange(row, first, last, min, max);
      if (outOfRange) {
        min = std::min(min, s.padding);
        max = std::max(max, s.padding);
      }
    }
    out = Range{min, max};
    return true;
  }
  void findBreakpoints();
  void collectAffineOrders();
  bool evaluateExactly(size_t n, expr::Value &out);
  Range integerStep(const Step &s);
  FloatValue floatStep(const Step &s);
  /// Evaluates `order`; the operations masks use most are done inline
  /// (without widening or special cases), everything else by the full rules.
  void run(const std::vector<Step> &order) {
    Range *r = ranges.data();
    for (const Step &s : order) {
      Range &out = r[s.result];
      switch (s.op) {
      case Opcode::Argument:
        if (s.floatResult)
          break;
        out = leadingRanges[s.imm];
        continue;
      case Opcode::CmpI: {
        const Range &a = r[s.a], &b = r[s.b];
        if (s.imm >= sem::ULT && (a.lo < 0 || b.lo < 0))
          break;
        out = ofTruth(compare<int64_t>(static_cast<int>(s.imm), a.lo, a.hi, b.lo, b.hi));
        continue;
      }
      case Opcode::AndI:
      case Opcode::OrI: {
        if (s.width != 1)
          break;
        // i1 ranges lie in [-1, 0] (true is -1): and/or are monotone, so
        // they apply to the endpoints.
        const Range &a = r[s.a], &b = r[s.b];
        out = s.op == Opcode::AndI ? Range{a.lo & b.lo, a.hi & b.hi}
                                        : Range{a.lo | b.lo, a.hi | b.hi};
        continue;
      }
      case Opcode::AddI:
      case Opcode::SubI: {
        const Range &a = r[s.a], &b = r[s.b];
        int64_t lo, hi;
        bool overflow = s.op == Opcode::AddI
                            ? __builtin_add_overflow(a.lo, b.lo, &lo) | __builtin_add_overflow(a.hi, b.hi, &hi)
                            : __builtin_sub_overflow(a.lo, b.hi, &lo) | __builtin_sub_overflow(a.hi, b.lo, &hi);
        if (overflow || lo < minSigned(s.width) || hi > maxSigned(s.width))
          break;
        out = Range{lo, hi};
        continue;
      }
      case Opcode::IndexCast:
      case Opcode::ExtSI:
      case Opcode::TruncI: {
        const Range &a = r[s.a];
        if (a.lo < minSigned(s.width) || a.hi > maxSigned(s.width))
          break; // wraps
        out = a;
        continue;
      }
      case Opcode::Read:
        if (s.floatResult || !readOneRow(s, out))
          break;
        continue;
      case Opcode::DivUI: {
        const Range &a = r[s.a], &b = r[s.b];
        if (a.lo < 0 || b.lo <= 0)
          break;
        if (b.lo == b.hi && (b.lo & (b.lo - 1)) == 0) { // a power of two: no divisions
          int shift = __builtin_ctzll(static_cast<uint64_t>(b.lo));
          out = Range{a.lo >> shift, a.hi >> shift};
        } else {
          out = Range{a.lo / b.hi, a.hi / b.lo};
        }
        continue;
      }
      default:
        break;
      }
      if (s.floatResult)
        floats[s.result] = floatStep(s);
      else
        out = integerStep(s);
    }
  }
  /// The result as a condition; a float result (a score_mod's) is no
  /// condition, so nothing is known.
  Truth resultTruth() const {
    return floatResult ? Truth::Both : ranges[program.result].truth();
  }
  AbstractValue result() const {
    size_t n = static_cast<size_t>(program.result);
    if (expr::isFloat(program.instructions[n].type))
      return floats[n].exact ? AbstractValue::ofFloat(floats[n].f) : AbstractValue::anyFloat();
    return AbstractValue::ofRange(ranges[n].lo, ranges[n].hi);
  }
};

Range IntervalEvaluator::Impl::readInteger(const Instruction &inst) {
  const expr::CaptureValue &tensor = captures[inst.imm];
  const TensorSummary &summary = *summaries[inst.imm];
  const size_t rank = inst.operands.size();
  int64_t min = std::numeric_limits<int64_t>::max(), max = std::numeric_limits<int64_t>::min();
  auto add = [&](int64_t lo, int64_t hi) {
    min = std::min(min, lo);
    max = std::max(max, hi);
  };
  // The in-range part of each index range; is any tuple in or out of range?
  constexpr size_t kInline = 8;
  int64_t firstInline[kInline], lastInline[kInline], positionInline[kInline];
  std::vector<int64_t> heap(rank > kInline ? 3 * rank : 0);
  int64_t *first = rank > kInline ? heap.data() : firstInline;
  int64_t *last = rank > kInline ? heap.data() + rank : lastInline;
  int64_t *position = rank > kInline ? heap.data() + 2 * rank : positionInline;
  bool inRange = true, outOfRange = false;
  for (size_t d = 0; d < rank; ++d) {
    const Range &index = ranges[inst.operands[d]];
    const int64_t size = tensor.sizes[d];
    outOfRange |= index.lo < 0 || index.hi >= size;
    first[d] = std::max<int64_t>(index.lo, 0);
    last[d] = std::min<int64_t>(index.hi, size - 1);
    inRange &= first[d] <= last[d];
  }
  if (outOfRange) {
    int64_t padding = inst.hasPadding ? inst.paddingInt : 0;
    add(padding, padding);
  }
  if (!inRange)
    return Range{min, max};
  if (rank == 0) {
    int64_t lo, hi;
    summary.rowRange(0, 0, 0, lo, hi);
    add(lo, hi);
    return Range{min, max};
  }
  // Rows: every combination of the leading indices, up to a limit.
  constexpr int64_t kMaxRows = 64;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < rank && rows <= kMaxRows; ++d)
    rows *= last[d] - first[d] + 1;
  if (rows > kMaxRows) {
    add(summary.globalMin(), summary.globalMax());
    return Range{min, max};
  }
  for (size_t d = 0; d + 1 < rank; ++d)
    position[d] = first[d];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t row = 0;
    for (size_t d = 0; d + 1 < rank; ++d)
      row = row * tensor.sizes[d] + position[d];
    int64_t lo, hi;
    summary.rowRange(row, first[rank - 1], last[rank - 1], lo, hi);
    add(lo, hi);
    for (size_t d = rank - 1; d-- > 0;) {
      if (++position[d] <= last[d])
        break;
      position[d] = first[d];
    }
  }
  return Range{min, max};
}

/// Tracks which varying instructions are the varying argument plus a fixed
/// offset (through additions, subtractions and integer casts) and where
/// their comparisons with fixed values flip.
void IntervalEvaluator::Impl::findBreakpoints() {
  breakpoints.clear();
  const std::vector<Step> &order = affineOrder[varyingArgument];
  const uint8_t varyingBit = static_cast<uint8_t>(1u << varyingArgument);
  auto isAffine = [&](int32_t n) { return (varyingIn[n] & varyingBit) && affine[n]; };
  auto isFixedPoint = [&](int32_t n) {
    return !(varyingIn[n] & varyingBit) && ranges[n].lo == ranges[n].hi;
  };
  for (int32_t slot : varyingSlots[varyingArgument]) {
    affine[slot] = true;
    offsets[slot] = 0;
  }
  for (const Step &s : order) {
    const int32_t n = s.result;
    affine[n] = false;
    switch (s.op) {
    case Opcode::IndexCast: case Opcode::IndexCastUI: case Opcode::ExtSI: case Opcode::ExtUI:
      affine[n] = isAffine(s.a);
      offsets[n] = offsets[s.a];
      break;
    case Opcode::AddI:
    case Opcode::SubI: {
      int32_t fixed = isAffine(s.a) ? s.b : s.a;
      int32_t moving = isAffine(s.a) ? s.a : s.b;
      if (!isAffine(moving) || !isFixedPoint(fixed) || (s.op == Opcode::SubI && moving != s.a))
        break;
      affine[n] = true;
      offsets[n] = s.op == Opcode::AddI ? offsets[moving] + ranges[fixed].lo
                                        : offsets[moving] - ranges[fixed].lo;
      break;
    }
    case Opcode::CmpI: {
      bool left = isAffine(s.a);
      int32_t fixed = left ? s.b : s.a, moving = left ? s.a : s.b;
      if (!isAffine(moving) || !isFixedPoint(fixed))
        break;
      // (arg + o) PRED c flips at arg = c - o (lt, ge) or c - o + 1 (le, gt);
      // with the operands swapped, le/ge and lt/gt trade places.
      int64_t at = ranges[fixed].lo - offsets[moving];
      int predicate = static_cast<int>(s.imm);
      bool flipsLate = predicate == sem::SLE || predicate == sem::ULE ||
                       predicate == sem::SGT || predicate == sem::UGT;
      bool flipsEarly = predicate == sem::SLT || predicate == sem::ULT ||
                        predicate == sem::SGE || predicate == sem::UGE;
      if (!left)
        std::swap(flipsLate, flipsEarly);
      if (!flipsLate)
        breakpoints.push_back(at);
      if (!flipsEarly)
        breakpoints.push_back(at + 1);
      break;
    }
    default:
      break;
    }
  }
  std::sort(breakpoints.begin(), breakpoints.end());
  breakpoints.erase(std::unique(breakpoints.begin(), breakpoints.end()), breakpoints.end());
}

void IntervalEvaluator::Impl::collectAffineOrders() {
  std::vector<bool> candidate(program.instructions.size());
  for (int v = 0; v < 4; ++v) {
    std::fill(candidate.begin(), candidate.end(), false);
    for (int32_t slot : varyingSlots[v])
      candidate[slot] = true;
    const uint8_t bit = static_cast<uint8_t>(1u << v);
    auto other = [&](int32_t n) { return !(varyingIn[n] & bit); };
    std::vector<Step> steps;
    bool anyComparison = false;
    for (const Step &s : varyingOrder[v]) {
      bool keep = false;
      switch (s.op) {
      case Opcode::IndexCast: case Opcode::IndexCastUI: case Opcode::ExtSI: case Opcode::ExtUI:
        keep = candidate[s.a];
        break;
      case Opcode::AddI:
        keep = (candidate[s.a] && other(s.b)) || (candidate[s.b] && other(s.a));
        break;
      case Opcode::SubI:
        keep = candidate[s.a] && other(s.b);
        break;
      case Opcode::CmpI:
        keep = (candidate[s.a] && other(s.b)) || (candidate[s.b] && other(s.a));
        anyComparison |= keep;
        break;
      default:
        break;
      }
      if (!keep)
        continue;
      candidate[s.result] = s.op != Opcode::CmpI;
      steps.push_back(s);
    }
    if (anyComparison)
      affineOrder[v] = std::move(steps);
  }
}

/// Evaluates instruction `n` through the interpreter when its operands are
/// exact and it is computed the same way on every platform.
bool IntervalEvaluator::Impl::evaluateExactly(size_t n, expr::Value &out) {
  const Instruction &inst = program.instructions[n];
  if (isInexactMath(inst.op))
    return false;
  expr::Program &single = singles[singleIndex[n]];
  for (size_t k = 0; k < inst.operands.size(); ++k) {
    const int32_t operand = inst.operands[k];
    Instruction &constant = single.instructions[k];
    if (expr::isFloat(program.instructions[operand].type)) {
      if (!floats[operand].exact)
        return false;
      constant.fimm = floats[operand].f;
    } else {
      if (ranges[operand].lo != ranges[operand].hi)
        return false;
      constant.imm = ranges[operand].lo;
    }
  }
  out = expr::evaluate(single, nullptr, captures, scratch);
  return true;
}

FloatValue IntervalEvaluator::Impl::floatStep(const Step &s) {
  const size_t n = static_cast<size_t>(s.result);
  const Instruction &inst = program.instructions[n];
  switch (s.op) {
  case Opcode::Argument:
    return score;
  case Opcode::Capture:
    return FloatValue{captures[inst.imm].scalar.f, true};
  case Opcode::Constant:
    return FloatValue{inst.fimm, true};
  case Opcode::Select: {
    Truth condition = ranges[s.a].truth();
    const FloatValue &x = floats[s.b], &y = floats[s.c];
    if (condition == Truth::True)
      return x;
    if (condition == Truth::False)
      return y;
    bool same = x.exact && y.exact && sem::floatBits(x.f) == sem::floatBits(y.f);
    return same ? x : FloatValue{};
  }
  default: {
    expr::Value v;
    return evaluateExactly(n, v) ? FloatValue{v.f, true} : FloatValue{};
  }
  }
}

Range IntervalEvaluator::Impl::integerStep(const Step &s) {
  const int w = s.width;
  auto A = [&](int k) -> const Range & { return ranges[k == 0 ? s.a : k == 1 ? s.b : s.c]; };
  switch (s.op) {
  case Opcode::Argument:
    return leadingRanges[s.imm];
  case Opcode::Capture:
    return point(captures[s.imm].scalar.i);
  case Opcode::Constant:
    return point(s.imm);
  case Opcode::Dim:
    return point(captures[s.imm].sizes[s.operandWidth]);
  case Opcode::Read:
    return readInteger(program.instructions[s.result]);
  case Opcode::Select: {
    Truth condition = A(0).truth();
    if (condition == Truth::True)
      return A(1);
    if (condition == Truth::False)
      return A(2);
    return ofRange(std::min(A(1).lo, A(2).lo), std::max(A(1).hi, A(2).hi));
  }
  case Opcode::AddI:
    return wrapRange(static_cast<i128>(A(0).lo) + A(1).lo, static_cast<i128>(A(0).hi) + A(1).hi, w);
  case Opcode::SubI:
    return wrapRange(static_cast<i128>(A(0).lo) - A(1).hi, static_cast<i128>(A(0).hi) - A(1).lo, w);
  case Opcode::MulI: {
    const Range &a = A(0), &b = A(1);
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
    return ofRange(std::max(A(0).lo, A(1).lo), std::max(A(0).hi, A(1).hi));
  case Opcode::MinSI:
    return ofRange(std::min(A(0).lo, A(1).lo), std::min(A(0).hi, A(1).hi));
  case Opcode::MaxUI:
    return unsignedMinMax(A(0), A(1), w, true);
  case Opcode::MinUI:
    return unsignedMinMax(A(0), A(1), w, false);
  case Opcode::AndI:
  case Opcode::OrI:
  case Opcode::XOrI:
    return bitwise(s.op, A(0), A(1), w);
  case Opcode::ShLI:
  case Opcode::ShRSI:
  case Opcode::ShRUI:
    return shift(s.op, A(0), A(1), w);
  case Opcode::AbsI: {
    const Range &a = A(0);
    if (a.lo >= 0)
      return a;
    if (a.hi <= 0)
      return wrapRange(-static_cast<i128>(a.hi), -static_cast<i128>(a.lo), w);
    return wrapRange(0, std::max(-static_cast<i128>(a.lo), static_cast<i128>(a.hi)), w);
  }
  case Opcode::CmpI:
    return ofTruth(compareIntegers(static_cast<int>(s.imm), A(0), A(1), s.operandWidth));
  case Opcode::ExtSI:
  case Opcode::IndexCast:
  case Opcode::TruncI:
    return wrapRange(A(0).lo, A(0).hi, w);
  case Opcode::ExtUI:
  case Opcode::IndexCastUI: {
    UnsignedRange pieces[2];
    int count = toUnsigned(A(0), s.operandWidth, pieces);
    Hull hull;
    for (int i = 0; i < count; ++i)
      hull.add(wrapRange(static_cast<i128>(pieces[i].lo), static_cast<i128>(pieces[i].hi), w));
    return hull.value();
  }
  case Opcode::CmpF:
    if (s.imm == sem::AlwaysFalse || s.imm == sem::AlwaysTrue)
      return ofTruth(s.imm == sem::AlwaysTrue ? Truth::True : Truth::False);
    [[fallthrough]];
  default: { // comparisons of and conversions from floats
    expr::Value v;
    return evaluateExactly(static_cast<size_t>(s.result), v) ? point(v.i) : fullRange(w);
  }
  }
}

IntervalEvaluator::IntervalEvaluator(std::unique_ptr<Impl> impl) : impl(std::move(impl)) {}
IntervalEvaluator::~IntervalEvaluator() = default;

namespace {
/// What is wrong with `captures` for `program` (empty when they fit): the
/// checks create and rebind share.
std::string checkCaptureValues(const expr::Program &program,
                               const std::vector<expr::CaptureValue> &captures) {
  if (std::string problem = expr::checkCaptures(program, captures); !problem.empty())
    return problem;
  for (size_t c = 0; c < captures.size(); ++c) {
    const expr::CaptureDecl &decl = program.captures[c];
    if (!decl.isTensor && !expr::isFloat(decl.elementType)) {
      int64_t v = captures[c].scalar.i;
      if (sem::wrap(static_cast<u64>(v), expr::intWidth(decl.elementType)) != v)
        return "capture '" + decl.name + "' holds " + std::to_string(v) + ", out of range for " +
               expr::toString(decl.elementType);
    }
    if (decl.isTensor) {
      int64_t elements = 1;
      for (int64_t size : captures[c].sizes) {
        if (size < 0)
          return "capture '" + decl.name + "' has a negative size";
        elements *= size;
      }
      if (elements > 0 && !captures[c].data)
        return "capture '" + decl.name + "' has no data";
    }
  }
  return {};
}
} // namespace

EvaluatorResult IntervalEvaluator::create(const expr::Program &program,
                                          const std::vector<expr::CaptureValue> &captures) {
  EvaluatorResult result;
  if (std::string problem = checkProgram(program); !problem.empty()) {
    result.error = problem;
    return result;
  }
  if (std::string problem = checkCaptureValues(program, captures); !problem.empty()) {
    result.error = problem;
    return result;
  }

  auto impl = std::make_unique<Impl>();
  impl->program = program;
  impl->captures = captures;
  impl->deps = computeDependencies(program);
  const auto &insts = impl->program.instructions;
  const size_t count = insts.size();
  impl->floatResult = expr::isFloat(insts[program.result].type);
  impl->ranges.assign(count, Range{0, 0});
  impl->offsets.assign(count, 0);
  impl->affine.assign(count, false);
  impl->varyingIn.assign(count, 0);
  impl->floats.assign(count, FloatValue{});

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
  std::vector<Step> &constantOrder = impl->constantOrder;
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
    Step step;
    step.op = inst.op;
    step.width = static_cast<uint8_t>(expr::intWidth(inst.type));
    step.operandWidth = static_cast<uint8_t>(inst.imm2);
    step.floatResult = expr::isFloat(inst.type);
    step.result = static_cast<int32_t>(n);
    const size_t operands = inst.operands.size();
    step.a = operands > 0 ? inst.operands[0] : -1;
    step.b = operands > 1 ? inst.operands[1] : -1;
    step.c = operands > 2 ? inst.operands[2] : -1;
    step.imm = inst.imm;
    step.padding = inst.hasPadding ? inst.paddingInt : 0;
    step.rank = static_cast<uint32_t>(operands);
    uint32_t arguments = argumentsOf[n];
    if (arguments == 0) {
      constantOrder.push_back(step);
      continue;
    }
    impl->dependentOrder.push_back(step);
    for (int v = 0; v < 4; ++v) {
      if (arguments & (1u << (v + maskOffset))) {
        // The varying argument itself is written by evaluateVarying.
        if (inst.op == Opcode::Argument)
          impl->varyingSlots[v].push_back(static_cast<int32_t>(n));
        else
          impl->varyingOrder[v].push_back(step);
        impl->varyingIn[n] |= static_cast<uint8_t>(1u << v);
      }
      else
        impl->fixedOrder[v].push_back(step);
    }
  }
  impl->collectAffineOrders();
  impl->run(constantOrder);
  result.evaluator.reset(new IntervalEvaluator(std::move(impl)));
  return result;
}

std::string IntervalEvaluator::rebind(const std::vector<expr::CaptureValue> &captures) {
  if (std::string problem = checkCaptureValues(impl->program, captures); !problem.empty())
    return problem;
  impl->captures = captures;
  for (size_t c = 0; c < impl->summaries.size(); ++c)
    if (impl->summaries[c])
      impl->summaries[c]->assign(captures[c]);
  impl->varyingArgument = -1;
  impl->breakpoints.clear();
  impl->run(impl->constantOrder);
  return {};
}

const expr::Program &IntervalEvaluator::program() const { return impl->program; }
const Dependencies &IntervalEvaluator::dependencies() const { return impl->deps; }

bool IntervalEvaluator::dependsOn(MaskArgument argument) const {
  size_t index = static_cast<size_t>(argument) + (impl->program.isScoreMod ? 1 : 0);
  return impl->deps.leading[index];
}

AbstractValue IntervalEvaluator::evaluate(const AbstractValue *leading) {
  for (unsigned k = 0; k < impl->program.numLeadingArguments(); ++k) {
    if (impl->program.isScoreMod && k == 0)
      impl->score = FloatValue{leading[k].f, leading[k].exact};
    else
      impl->leadingRanges[k] = Range{leading[k].lo, leading[k].hi};
  }
  impl->run(impl->dependentOrder);
  impl->varyingArgument = -1;
  return impl->result();
}

namespace {
/// Sets the mask arguments (after a score_mod's score, which is unknown).
void setMaskArguments(Range *leading, bool isScoreMod, const Box &box) {
  Range *args = leading + (isScoreMod ? 1 : 0);
  args[0] = Range{box.b.lo, box.b.hi};
  args[1] = Range{box.h.lo, box.h.hi};
  args[2] = Range{box.q.lo, box.q.hi};
  args[3] = Range{box.kv.lo, box.kv.hi};
}
} // namespace

Truth IntervalEvaluator::evaluateMask(const Box &box) {
  setMaskArguments(impl->leadingRanges, impl->program.isScoreMod, box);
  impl->score = FloatValue{};
  impl->run(impl->dependentOrder);
  impl->varyingArgument = -1;
  return impl->resultTruth();
}

void IntervalEvaluator::fix(const Box &box, MaskArgument varying) {
  setMaskArguments(impl->leadingRanges, impl->program.isScoreMod, box);
  impl->score = FloatValue{};
  impl->varyingArgument = static_cast<int>(varying);
  impl->run(impl->fixedOrder[impl->varyingArgument]);
  impl->findBreakpoints();
}

const std::vector<int64_t> &IntervalEvaluator::breakpoints() const { return impl->breakpoints; }

Truth IntervalEvaluator::evaluateVarying(IntRange range) {
  const int v = impl->varyingArgument;
  if (v < 0)
    return Truth::Both; // fix() was not called: nothing is known
  // Field by field: a 16-byte copy through the stack would stall store
  // forwarding when the first step reads it back.
  for (int32_t slot : impl->varyingSlots[v]) {
    impl->ranges[slot].lo = range.lo;
    impl->ranges[slot].hi = range.hi;
  }
  impl->run(impl->varyingOrder[v]);
  return impl->resultTruth();
}

} // namespace dflex::analysis
