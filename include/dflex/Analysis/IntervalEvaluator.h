//===- IntervalEvaluator.h - abstract evaluation of body programs -*- C++ -*-===//
//
// Evaluates a mask program over a box of leading arguments (b, h, q_idx and
// kv_idx each an integer range) with concrete captures, and tells whether the
// mask is false everywhere in the box, true everywhere, or may be both. The
// answer is sound with respect to dflex/Expr/Semantics.h: "false" and "true"
// are proofs, "both" only means the evaluation could not decide.
//
// Integers are ranges [lo, hi] of their sign-extended values; every rule
// widens to the type's full range when it cannot bound a result (a range that
// wraps, a division by a range holding 0 in awkward places, ...). i1 values
// are {0} (false), {-1} (true) or [-1, 0] (either). Floats are exact when
// every operand is exact and the operation is correctly rounded (so CPU and
// GPU agree); otherwise any float, NaN included. Reads of captured integer
// tensors bound the value over the whole index box from per-row summaries
// built once per evaluator (so once per set of captures).
//
// No MLIR here: the runtime builds tile lists with it every training step.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_ANALYSIS_INTERVALEVALUATOR_H
#define DFLEX_ANALYSIS_INTERVALEVALUATOR_H

#include "dflex/Expr/Program.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dflex::analysis {

/// An inclusive integer range.
struct IntRange {
  int64_t lo = 0;
  int64_t hi = 0;
  static IntRange point(int64_t v) { return {v, v}; }
  bool isPoint() const { return lo == hi; }
};

/// What an i1 value can be over a box.
enum class Truth : uint8_t { False, True, Both };
const char *toString(Truth truth);

/// An abstract value: an integer range, or a float that is exact or unknown.
struct AbstractValue {
  int64_t lo = 0, hi = 0; // integers and i1, sign-extended
  float f = 0.0f;         // floats: the value when `exact`
  bool exact = false;     // floats only: false means any float, NaN included

  static AbstractValue ofRange(int64_t lo, int64_t hi) { return {lo, hi, 0.0f, false}; }
  static AbstractValue ofFloat(float v) { return {0, 0, v, true}; }
  static AbstractValue anyFloat() { return {}; }
  /// An i1 (or any integer used as a condition): nonzero is true.
  Truth truth() const {
    if (lo > 0 || hi < 0)
      return Truth::True;
    return lo == 0 && hi == 0 ? Truth::False : Truth::Both;
  }
};

/// The leading arguments of a mask, as ranges.
struct Box {
  IntRange b, h, q, kv;
};

/// Leading arguments of a mask, in argument order.
enum class MaskArgument : uint8_t { Batch = 0, Head = 1, Query = 2, Key = 3 };

/// What a program's result depends on (through any chain of operands).
struct Dependencies {
  std::vector<bool> leading;  // per leading argument of the program
  std::vector<bool> captures; // per capture, in declaration order
  bool floatArithmetic = false; // some live instruction computes a float
};

/// Which leading arguments and captures `program`'s result depends on.
Dependencies computeDependencies(const expr::Program &program);

class IntervalEvaluator;

/// An evaluator, or the reason there is none.
struct EvaluatorResult {
  std::unique_ptr<IntervalEvaluator> evaluator;
  std::string error;
  bool ok() const { return evaluator != nullptr; }
};

/// Abstract evaluation of one program with one set of captures. Creating it
/// summarises the captured integer tensors (their values are read then:
/// later changes are not seen); evaluations then cost about one step per
/// live instruction. Not thread-safe: it keeps scratch state (use one
/// evaluator per thread). Captured float tensors are read during
/// evaluation, so their memory must outlive the evaluator.
class IntervalEvaluator {
public:
  /// Fails, with a message, when the captures do not fit the program or the
  /// program is malformed (an operand that is not an earlier instruction, a
  /// capture number out of range, ...).
  static EvaluatorResult create(const expr::Program &program,
                                const std::vector<expr::CaptureValue> &captures);
  /// Takes new captures for the same program, as if created with them: the
  /// program's analysis is kept, the captured tensors are summarised again.
  /// Returns what is wrong with them (as create would), empty on success;
  /// on failure the evaluator keeps its previous captures.
  std::string rebind(const std::vector<expr::CaptureValue> &captures);
  ~IntervalEvaluator();
  IntervalEvaluator(const IntervalEvaluator &) = delete;
  IntervalEvaluator &operator=(const IntervalEvaluator &) = delete;

  const expr::Program &program() const;
  const Dependencies &dependencies() const;
  /// Whether a mask's result depends on `argument`.
  bool dependsOn(MaskArgument argument) const;

  /// The result over `leading` (one abstract value per leading argument).
  AbstractValue evaluate(const AbstractValue *leading);
  /// A mask's result over `box` (Both for a program yielding a float).
  Truth evaluateMask(const Box &box);

  /// Two-step evaluation for scanning many boxes that differ in one mask
  /// argument: `fix` evaluates every instruction that does not depend on
  /// `varying` (its range in `box` is ignored), then `evaluateVarying`
  /// evaluates the rest for one range of `varying`.
  void fix(const Box &box, MaskArgument varying);
  Truth evaluateVarying(IntRange range);
  /// After fix(): sorted points p of the varying argument where some
  /// comparison of it (plus fixed offsets) with a fixed value changes outcome
  /// between p - 1 and p. Ranges split there evaluate more precisely (the
  /// analysis does not relate values, so `kv < n` and `kv - n` over a range
  /// across n are judged independently).
  const std::vector<int64_t> &breakpoints() const;

private:
  struct Impl;
  explicit IntervalEvaluator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl;
};

} // namespace dflex::analysis

#endif // DFLEX_ANALYSIS_INTERVALEVALUATOR_H
