//===- Variant.cpp - mask and score_mod functors as CUDA C++ --------------===//

#include "dflex/Codegen/Variant.h"

#include "dflex/Codegen/KeyIntervals.h"
#include "dflex/Codegen/SplitCongruences.h"
#include "dflex/Codegen/ValueFacts.h"
#include "dflex/Expr/Semantics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

namespace dflex::codegen {

using expr::Instruction;
using expr::Opcode;
using expr::Program;
using expr::ScalarType;

const CaptureSlot *VariantLayout::find(const std::string &name) const {
  for (const CaptureSlot &slot : captures)
    if (slot.name == name)
      return &slot;
  return nullptr;
}

std::string sanitizeIdentifier(const std::string &name) {
  std::string id;
  for (char c : name)
    id += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (id.empty() || std::isdigit(static_cast<unsigned char>(id.front())))
    id = "_" + id;
  return id;
}

namespace {

bool isUnsignedDivision(Opcode op) {
  return op == Opcode::DivUI || op == Opcode::RemUI || op == Opcode::CeilDivUI;
}
bool isSignedDivision(Opcode op) {
  return op == Opcode::DivSI || op == Opcode::RemSI || op == Opcode::FloorDivSI ||
         op == Opcode::CeilDivSI;
}

/// A division by a launch-invariant divisor and the kind of magic it takes.
struct InvariantDivision {
  int32_t instruction;
  bool wide;
};

/// The divisions, remainders, floor and ceiling divisions of `program` whose
/// divisor is launch-invariant but not a constant (NVRTC reduces those
/// itself): those whose numerator is proven within [0, 2^32) wherever the
/// division's value matters (guardsOf; or is an unsigned value of at most 32
/// bits) take a sem::UDivisor, other unsigned ones a sem::WideUDivisor;
/// other signed ones stay divisions.
std::vector<InvariantDivision> divisionsByInvariants(const Program &program) {
  const std::vector<bool> invariant = launchInvariant(program);
  const std::vector<bool> live = reachesResult(program);
  const auto range = integerRanges(program);
  const auto guards = guardsOf(program);
  std::vector<InvariantDivision> divisions;
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    const Instruction &inst = program.instructions[n];
    const bool isUnsigned = isUnsignedDivision(inst.op);
    if (!live[n] || (!isUnsigned && !isSignedDivision(inst.op)))
      continue;
    const int32_t numerator = inst.operands[0], divisor = inst.operands[1];
    if (!invariant[divisor] || program.instructions[divisor].op == Opcode::Constant)
      continue;
    const ValueRange bounded = rangeWhere(program, range, numerator, guards[n]);
    const bool narrow = (bounded.first >= 0 && bounded.second < (int64_t(1) << 32)) ||
                        (isUnsigned && expr::intWidth(inst.type) <= 32);
    if (narrow || isUnsigned)
      divisions.push_back({int32_t(n), !narrow});
  }
  return divisions;
}

/// The program the code generator emits for a body: a mask with its
/// congruences split (SplitCongruences.h), a score_mod as it is. Divisor
/// slots name the body's instructions (`origin`): packVariant evaluates
/// them on the body.
CongruenceSplit emittedForm(const Program &body) {
  if (!body.isScoreMod)
    return splitCongruences(body);
  CongruenceSplit same;
  same.program = body;
  for (size_t n = 0; n < body.instructions.size(); ++n)
    same.origin.push_back(int32_t(n));
  return same;
}

/// The divisor slot a division of `form` reads (no field or offset yet).
DivisorSlot divisorOf(const CongruenceSplit &form, InvariantDivision division, bool inScoreMod) {
  const Instruction &inst = form.program.instructions[division.instruction];
  DivisorSlot slot;
  slot.inScoreMod = inScoreMod;
  slot.instruction = form.origin[inst.operands[1]]; // launch-invariant: never an inserted remainder
  slot.width = expr::intWidth(inst.type);
  slot.isSigned = isSignedDivision(inst.op);
  slot.wide = division.wide;
  return slot;
}

/// The launch-invariant values of `form` the per-element code reads, in
/// program order: invariant instructions computed from a capture or a size
/// (of constants only, NVRTC folds them), other than captures and sizes
/// themselves (already members), that a result is, or that a varying
/// instruction reads other than as a divisor with a slot (that one reads its
/// magic). Each names a body instruction (`origin`) for packVariant.
std::vector<int32_t> hoistedInvariants(const CongruenceSplit &form) {
  const Program &program = form.program;
  const std::vector<bool> invariant = launchInvariant(program);
  const std::vector<bool> live = reachesResult(program);
  std::vector<bool> divisorUse(program.instructions.size(), false); // operand 1 read as a magic
  for (const InvariantDivision &division : divisionsByInvariants(program))
    divisorUse[division.instruction] = true;
  std::vector<bool> read(program.instructions.size(), false);
  for (int32_t result : {program.result, program.isScoreMod ? program.scoreDerivative : -1})
    if (result >= 0)
      read[result] = true;
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    if (!live[n] || invariant[n])
      continue;
    const std::vector<int32_t> &operands = program.instructions[n].operands;
    for (size_t k = 0; k < operands.size(); ++k)
      read[operands[k]] = read[operands[k]] || !(k == 1 && divisorUse[n]);
  }
  std::vector<bool> fromLaunch(program.instructions.size(), false); // reads a capture or a size
  std::vector<int32_t> hoisted;
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    const Instruction &inst = program.instructions[n];
    const bool member = inst.op == Opcode::Capture || inst.op == Opcode::Dim;
    fromLaunch[n] = member;
    for (int32_t operand : inst.operands)
      fromLaunch[n] = fromLaunch[n] || fromLaunch[operand];
    if (read[n] && invariant[n] && fromLaunch[n] && !member && form.origin[n] >= 0)
      hoisted.push_back(int32_t(n));
  }
  return hoisted;
}

} // namespace

Result<VariantLayout> layoutVariant(const Program &mask, const Program *scoreMod) {
  VariantLayout layout;
  int offset = 0;
  auto addLaunchInvariants = [&](const Program &body, bool inScoreMod) {
    const CongruenceSplit form = emittedForm(body);
    for (const InvariantDivision &division : divisionsByInvariants(form.program)) {
      DivisorSlot slot = divisorOf(form, division, inScoreMod);
      bool known = false;
      for (const DivisorSlot &existing : layout.divisors)
        known = known || existing.sameDivisor(slot);
      if (known)
        continue;
      slot.field = std::string(inScoreMod ? "score_divisor" : "mask_divisor") +
                   std::to_string(slot.instruction) + (slot.isSigned ? "_s" : slot.wide ? "_w" : "_u") +
                   std::to_string(slot.width);
      slot.offsetBytes = offset;
      offset += slot.sizeBytes();
      layout.divisors.push_back(std::move(slot));
    }
    for (int32_t n : hoistedInvariants(form)) {
      InvariantSlot slot;
      slot.inScoreMod = inScoreMod;
      slot.instruction = form.origin[n];
      slot.isFloat = expr::isFloat(form.program.instructions[n].type);
      slot.field = std::string(inScoreMod ? "score_invariant" : "mask_invariant") +
                   std::to_string(slot.instruction);
      slot.offsetBytes = offset;
      offset += InvariantSlot::kSizeBytes;
      layout.invariants.push_back(std::move(slot));
    }
  };
  auto addAll = [&](const Program &program) -> Status {
    for (const expr::CaptureDecl &capture : program.captures) {
      if (const CaptureSlot *existing = layout.find(capture.name)) {
        if (existing->isTensor != capture.isTensor ||
            existing->elementType != capture.elementType || existing->rank != capture.rank)
          return Status::failure("capture '" + capture.name +
                                 "' has different types in '" + mask.name +
                                 "' and '" + program.name + "'");
        continue;
      }
      CaptureSlot slot;
      slot.name = capture.name;
      slot.field = "cap" + std::to_string(layout.captures.size()) + "_" +
                   sanitizeIdentifier(capture.name);
      slot.isTensor = capture.isTensor;
      slot.elementType = capture.elementType;
      slot.rank = capture.rank;
      slot.offsetBytes = offset;
      slot.sizeBytes = 8 * (capture.isTensor ? 1 + 2 * capture.rank : 1);
      offset += slot.sizeBytes;
      layout.captures.push_back(std::move(slot));
    }
    return Status::success();
  };
  if (Status status = addAll(mask); !status.ok())
    return status;
  addLaunchInvariants(mask, false);
  if (scoreMod) {
    if (Status status = addAll(*scoreMod); !status.ok())
      return status;
    addLaunchInvariants(*scoreMod, true);
  }
  layout.sizeBytes = offset == 0 ? 8 : offset;
  return layout;
}

namespace {

const char *cppElementType(ScalarType type) {
  switch (type) {
  case ScalarType::I32: return "int";
  case ScalarType::I64: return "long long";
  case ScalarType::F32: return "float";
  case ScalarType::BF16: return "::dflex::sem::bf16_bits";
  default: return "long long";
  }
}

std::string floatLiteral(float value) {
  // Bit patterns keep infinities and NaN exact; finite values print exactly
  // with 9 significant digits.
  if (!std::isfinite(value)) {
    char buffer[48];
    std::snprintf(buffer, sizeof buffer, "bitsFloat(0x%08xu)", sem::floatBits(value));
    return buffer;
  }
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "%.9ef", value);
  return buffer;
}

std::string intLiteral(int64_t value) {
  if (value == INT64_MIN)
    return "(-9223372036854775807LL - 1)";
  return std::to_string(value) + "LL";
}

/// A read's bounds check and offset term of index `dim`, worked out by the
/// part that has the index (a row's, a head's) when the read itself is per
/// pair: table[h, bucket(q - kv)] checks h and multiplies it by its stride
/// once per head, not per pair.
struct ReadTerm {
  int32_t read;
  int dim;
  bool operator<(const ReadTerm &other) const { return std::tie(read, dim) < std::tie(other.read, other.dim); }
};

/// What a part (a mask's row or column, a score_mod's head) hands to the
/// per-pair code: values, and read terms.
struct PartOutputs {
  std::vector<bool> values;
  std::set<ReadTerm> terms;
  explicit PartOutputs(size_t count) : values(count, false) {}
  /// Operand k (the value `operand`) of per-pair instruction n: a read's
  /// index as its term, any other operand as its value.
  void take(const Program &program, int32_t n, int k, int32_t operand) {
    if (program.instructions[n].op == Opcode::Read)
      terms.insert({n, k});
    else
      values[operand] = true;
  }
  /// The values computing the part needs: its values and its terms' indices.
  std::vector<bool> wanted(const Program &program) const {
    std::vector<bool> wanted = values;
    for (const ReadTerm &term : terms)
      wanted[program.instructions[term.read].operands[term.dim]] = true;
    return wanted;
  }
  void add(const PartOutputs &other) {
    for (size_t n = 0; n < values.size(); ++n)
      values[n] = values[n] || other.values[n];
    terms.insert(other.terms.begin(), other.terms.end());
  }
};

/// Emits a program's bodies: a score_mod as its head and pair parts, a mask
/// as its row, column and pair parts.
class BodyEmitter {
public:
  BodyEmitter(std::ostringstream &out, const CongruenceSplit &form, const VariantLayout &layout,
              bool isScoreMod)
      : out(out), program(form.program), layout(layout) {
    const auto range = integerRanges(program);
    narrow.resize(program.instructions.size());
    for (size_t n = 0; n < program.instructions.size(); ++n)
      narrow[n] = !expr::isFloat(program.instructions[n].type) && range[n].first >= INT32_MIN &&
                  range[n].second <= INT32_MAX;
    for (const InvariantDivision &division : divisionsByInvariants(program)) {
      const DivisorSlot wanted = divisorOf(form, division, isScoreMod);
      for (const DivisorSlot &slot : layout.divisors)
        if (slot.sameDivisor(wanted))
          divisorField[division.instruction] = {slot.field, slot.wide};
    }
    for (size_t n = 0; n < program.instructions.size(); ++n)
      for (const InvariantSlot &slot : layout.invariants)
        if (slot.inScoreMod == isScoreMod && form.origin[n] >= 0 && slot.instruction == form.origin[n])
          invariantField[int32_t(n)] = slot.field;
  }

  /// The score_mod as the parts the kernels work out once per (batch, head),
  /// once per query row, once per key column and once per distinct distance
  /// q - kv of a thread's tile, and the rest, per pair (bodyVariance with
  /// distances): score_head returns the fixed values the others read (a
  /// captured slope per head, say), score_row, score_column and
  /// score_distance the values of a row (a scale read per query), of a
  /// column and of a distance (a relative-position bucket and its bias),
  /// score_pair and score_grad_pair compute the score_mod and its derivative
  /// from the four, and score_mod and score_mod_grad compose the parts.
  void emitSplitScoreMod(int32_t result, int32_t derivative) {
    const std::vector<Variance> variance = bodyVariance(program, /*distances=*/true);
    const size_t count = program.instructions.size();
    constexpr int kLevels = 5; // Fixed, Row, Column, Pair, Distance
    auto level = [&](int32_t n) { return static_cast<int>(variance[n]); };
    for (size_t n = 0; n < count; ++n)
      if (variance[n] == Variance::Distance && isPositionDistance(program, int32_t(n)))
        distanceLeaves.insert(int32_t(n));
    // What the instructions of `within` (one function's) take from the
    // other parts, by part.
    auto takenBy = [&](const std::vector<bool> &within, std::vector<PartOutputs> &from) {
      for (size_t n = 0; n < count; ++n)
        if (within[n]) {
          const std::vector<int32_t> read = operandsRead(int32_t(n));
          for (size_t k = 0; k < read.size(); ++k)
            if (variance[read[k]] != variance[n])
              from[level(read[k])].take(program, int32_t(n), int(k), read[k]);
        }
    };
    auto parts = [&] { return std::vector<PartOutputs>(kLevels, PartOutputs(count)); };
    // The two pair functions: their instructions and what they take.
    const int32_t returned[] = {result, derivative};
    std::vector<std::vector<bool>> inPair;
    std::vector<std::vector<PartOutputs>> pairTakes = {parts(), parts()};
    for (int f = 0; f < 2; ++f) {
      std::vector<bool> wanted(count, false);
      wanted[returned[f]] = true;
      const std::vector<bool> live = computing(wanted);
      std::vector<bool> pair(count, false);
      for (size_t n = 0; n < count; ++n)
        pair[n] = live[n] && variance[n] == Variance::Pair;
      if (variance[returned[f]] != Variance::Pair)
        pairTakes[f][level(returned[f])].values[returned[f]] = true;
      takenBy(pair, pairTakes[f]);
      inPair.push_back(std::move(pair));
    }
    // The row, column and distance parts: what the pair functions take from
    // them, and what computing that takes from the head.
    std::vector<PartOutputs> outputs = parts();
    for (int f = 0; f < 2; ++f)
      for (int part = 0; part < kLevels; ++part)
        outputs[part].add(pairTakes[f][part]);
    const Variance sides[] = {Variance::Row, Variance::Column, Variance::Distance};
    std::vector<std::vector<PartOutputs>> sideTakes(kLevels, parts());
    std::vector<std::vector<bool>> sideWithin(kLevels);
    for (Variance side : sides) {
      const std::vector<bool> live = computing(outputs[int(side)].wanted(program));
      std::vector<bool> &within = sideWithin[int(side)];
      within.assign(count, false);
      for (size_t n = 0; n < count; ++n)
        within[n] = live[n] && variance[n] == side;
      takenBy(within, sideTakes[int(side)]);
      outputs[int(Variance::Fixed)].add(sideTakes[int(side)][int(Variance::Fixed)]);
    }
    out << "\n  // The score_mod by what its values change with: score_head once per batch\n"
           "  // and head, score_row once per query row, score_column once per key column,\n"
           "  // score_distance once per distance q - kv, score_pair (score_grad_pair: its\n"
           "  // derivative) per pair from the four.\n";
    emitPart("ScoreHead", "score_head(long long b, long long h)", outputs[int(Variance::Fixed)]);
    const char *sideNames[][2] = {{"ScoreRow", "score_row(const ScoreHead &head, long long q_idx)"},
                                  {"ScoreColumn", "score_column(const ScoreHead &head, long long kv_idx)"},
                                  {"ScoreDistance", "score_distance(const ScoreHead &head, int distance)"}};
    for (int i = 0; i < 3; ++i)
      emitPart(sideNames[i][0], sideNames[i][1], outputs[int(sides[i])],
               {{"head", &sideTakes[int(sides[i])][int(Variance::Fixed)]}}, &sideWithin[int(sides[i])]);
    const char *pairSignature = "(const ScoreHead &head, const ScoreRow &row, const ScoreColumn &column, "
                                "const ScoreDistance &by_distance, float score) const {\n"
                                "    using namespace ::dflex::sem;\n";
    const char *names[] = {"score_pair", "score_grad_pair"};
    for (int f = 0; f < 2; ++f) {
      out << "\n  DFLEX_FUNCTOR float " << names[f] << pairSignature;
      declareFromPart("head", pairTakes[f][int(Variance::Fixed)]);
      declareFromPart("row", pairTakes[f][int(Variance::Row)]);
      declareFromPart("column", pairTakes[f][int(Variance::Column)]);
      declareFromPart("by_distance", pairTakes[f][int(Variance::Distance)]);
      for (size_t n = 0; n < count; ++n)
        if (inPair[f][n])
          emitInstruction(static_cast<int32_t>(n));
      termsInScope.clear();
      out << "    return " << value(returned[f]) << ";\n  }\n";
    }
    // The distance of two positions below 2^31 fits an int.
    const char *scoreSignature =
        "(float score, long long b, long long h, long long q_idx, long long kv_idx) const {\n";
    for (int f = 0; f < 2; ++f)
      out << "\n  DFLEX_FUNCTOR float " << (f ? "score_mod_grad" : "score_mod") << scoreSignature
          << "    const ScoreHead head = score_head(b, h);\n    return " << names[f]
          << "(head, score_row(head, q_idx), score_column(head, kv_idx), score_distance(head, (int)(q_idx - kv_idx)), "
             "score);\n  }\n";
    distanceLeaves.clear();
  }

  /// The mask as the parts the kernels evaluate once per query row, once per
  /// key column and once per pair (bodyVariance): mask_row and mask_column
  /// return the values mask_pair reads, and mask() composes the three.
  void emitSplitMask(int32_t result) {
    const std::vector<Variance> variance = bodyVariance(program);
    const size_t count = program.instructions.size();
    // The pair part's instructions, and the row and column values it reads
    // (fixed values travel with the row).
    std::vector<bool> inPair(count, false);
    PartOutputs row(count), column(count);
    auto partOf = [&](int32_t n) -> PartOutputs & { return variance[n] == Variance::Column ? column : row; };
    if (variance[result] == Variance::Pair)
      inPair[result] = true;
    else
      partOf(result).values[result] = true;
    for (size_t n = count; n-- > 0;)
      if (inPair[n]) {
        const std::vector<int32_t> &operands = program.instructions[n].operands;
        for (size_t k = 0; k < operands.size(); ++k) {
          if (variance[operands[k]] == Variance::Pair)
            inPair[operands[k]] = true;
          else
            partOf(operands[k]).take(program, int32_t(n), int(k), operands[k]);
        }
      }
    out << "\n  // The mask by what its values change with: mask_row once per query row,\n"
           "  // mask_column once per key column, mask_pair per pair from their values.\n";
    emitPart("MaskRow", "mask_row(long long b, long long h, long long q_idx)", row);
    emitPart("MaskColumn", "mask_column(long long b, long long h, long long kv_idx)", column);
    out << "\n  DFLEX_FUNCTOR bool mask_pair(const MaskRow &row, const MaskColumn &column) const {\n"
           "    using namespace ::dflex::sem;\n";
    declareFromPart("row", row);
    declareFromPart("column", column);
    for (size_t n = 0; n < count; ++n)
      if (inPair[n])
        emitInstruction(static_cast<int32_t>(n));
    termsInScope.clear();
    out << "    return " << value(result) << " != 0;\n  }\n"
        << "\n  DFLEX_FUNCTOR bool mask(long long b, long long h, long long q_idx, long long kv_idx) const {\n"
           "    return mask_pair(mask_row(b, h, q_idx), mask_column(b, h, kv_idx));\n  }\n";
  }

  /// The keys a query row sees as intervals (KeyIntervals.h): the values
  /// `first` and `count` of each, worked out from the row.
  void emitKeyIntervals(const std::vector<int32_t> &first, const std::vector<int32_t> &count) {
    const std::string n = std::to_string(first.size());
    auto list = [&](const std::vector<int32_t> &values, const char *cast) {
      std::string text;
      for (int32_t v : values)
        text += (text.empty() ? "" : ", ") + std::string(cast) + value(v);
      return text;
    };
    out << "\n  // The keys a query row sees: kv_idx - first[i] <u count[i] for some i.\n"
        << "  static constexpr int kKeyIntervals = " << n << ";\n"
        << "  struct KeyIntervals { int first[" << n << "]; unsigned count[" << n << "]; };\n"
        << "  DFLEX_FUNCTOR KeyIntervals key_intervals(long long b, long long h, long long q_idx) const {\n"
           "    using namespace ::dflex::sem;\n";
    std::vector<bool> wanted(program.instructions.size(), false);
    for (const std::vector<int32_t> *values : {&first, &count})
      for (int32_t v : *values)
        wanted[v] = true;
    emitComputing(wanted);
    out << "    return KeyIntervals{{" << list(first, "") << "}, {" << list(count, "(unsigned)") << "}};\n  }\n";
  }

private:
  std::string value(int32_t n) const { return "v" + std::to_string(n); }
  const char *typeOf(int32_t n) const {
    return expr::isFloat(program.instructions[n].type) ? "float" : narrow[n] ? "int" : "::dflex::sem::i64";
  }

  /// The statements of the `wanted` values and of what they are computed
  /// from, in program order.
  /// The instructions that computing the `live` values runs.
  /// (A hoisted invariant is read from its member, and a divisor with a
  /// slot from its magic: what computes them is not run.)
  std::vector<bool> computing(std::vector<bool> live) const {
    for (size_t n = live.size(); n-- > 0;)
      if (live[n])
        for (int32_t operand : operandsRead(int32_t(n)))
          live[operand] = true;
    return live;
  }

  /// The operands instruction n's statement reads.
  std::vector<int32_t> operandsRead(int32_t n) const {
    if (invariantField.count(n) || distanceLeaves.count(n))
      return {};
    std::vector<int32_t> read = program.instructions[n].operands;
    if (divisorField.count(n))
      read.erase(read.begin() + 1);
    return read;
  }

  void emitComputing(const std::vector<bool> &values) {
    const std::vector<bool> live = computing(values);
    for (size_t n = 0; n < live.size(); ++n)
      if (live[n])
        emitInstruction(static_cast<int32_t>(n));
  }

  /// A struct of the `part`'s values and read terms and the function
  /// `signature` that computes them; the struct says when computing them
  /// reads a capture (kReadsMemory, which the kernels' staging reads:
  /// variant.cuh). With `within`, the function computes those instructions
  /// alone and takes the others' values from the parts `from` (their struct
  /// arguments' names).
  void emitPart(const char *structName, const char *signature, const PartOutputs &part,
                const std::vector<std::pair<const char *, const PartOutputs *>> &from = {},
                const std::vector<bool> *within = nullptr) {
    std::vector<bool> live = computing(part.wanted(program));
    if (within)
      for (size_t n = 0; n < live.size(); ++n)
        live[n] = live[n] && (*within)[n];
    std::string members;
    out << "  struct " << structName << " {";
    for (size_t n = 0; n < part.values.size(); ++n)
      if (part.values[n]) {
        out << " " << typeOf(int32_t(n)) << " " << value(int32_t(n)) << ";";
        members += (members.empty() ? "" : ", ") + value(int32_t(n));
      }
    for (const ReadTerm &term : part.terms) {
      out << " bool " << termInRange(term) << "; ::dflex::sem::i64 " << termOffset(term) << ";";
      members += (members.empty() ? "" : ", ") + termInRange(term) + ", " + termOffset(term);
    }
    for (size_t n = 0; n < live.size(); ++n)
      if (live[n] && program.instructions[n].op == Opcode::Read) {
        out << " static constexpr bool kReadsMemory = true;";
        break;
      }
    out << " };\n  DFLEX_FUNCTOR " << structName << " " << signature << " const {\n"
        << "    using namespace ::dflex::sem;\n";
    for (const auto &[name, taken] : from)
      declareFromPart(name, *taken);
    for (size_t n = 0; n < live.size(); ++n)
      if (live[n])
        emitInstruction(static_cast<int32_t>(n));
    termsInScope.clear();
    for (const ReadTerm &term : part.terms) {
      const Instruction &read = program.instructions[term.read];
      const std::string field = capture(read).field, index = operand(read, term.dim), dim = std::to_string(term.dim);
      out << "    const bool " << termInRange(term) << " = inRange(" << index << ", " << field << ".sizes[" << dim
          << "]);\n    const ::dflex::sem::i64 " << termOffset(term) << " = " << index << " * " << field
          << ".strides[" << dim << "];\n";
    }
    out << "    return " << structName << "{" << members << "};\n  }\n";
  }

  /// Declarations, in a per-pair function, of what it takes from the part
  /// `from` (its struct argument's name); the read terms among them are then
  /// in scope for emitInstruction.
  void declareFromPart(const char *from, const PartOutputs &part) {
    for (size_t n = 0; n < part.values.size(); ++n)
      if (part.values[n])
        out << "    const " << typeOf(int32_t(n)) << " " << value(int32_t(n)) << " = " << from << "."
            << value(int32_t(n)) << ";\n";
    for (const ReadTerm &term : part.terms) {
      out << "    const bool " << termInRange(term) << " = " << from << "." << termInRange(term)
          << ";\n    const ::dflex::sem::i64 " << termOffset(term) << " = " << from << "." << termOffset(term)
          << ";\n";
      termsInScope.insert(term);
    }
  }

  std::string termInRange(const ReadTerm &term) const {
    return value(term.read) + "_in" + std::to_string(term.dim);
  }
  std::string termOffset(const ReadTerm &term) const {
    return value(term.read) + "_at" + std::to_string(term.dim);
  }

  /// Whether integer instruction n (add, sub or mul) can run in 32 bits:
  /// both operands are held in 32, and its result wraps at 32 bits or is
  /// known to fit them without wrapping at its own width.
  bool in32Bits(int32_t n) const {
    const Instruction &inst = program.instructions[n];
    const int width = expr::intWidth(inst.type);
    return narrow[inst.operands[0]] && narrow[inst.operands[1]] && (width == 32 || (width == 64 && narrow[n]));
  }

  std::string operand(const Instruction &inst, int k) const {
    return value(inst.operands[k]);
  }
  const CaptureSlot &capture(const Instruction &inst) const {
    return *layout.find(program.captures[inst.imm].name);
  }

  /// fn(a, b, w), or its multiplication by the launch's divisor member
  /// (fnBy, fnWideBy) when instruction n divides by one.
  std::string byDivisor(int32_t n, const std::string &fn, const std::string &a, const std::string &b,
                        const std::string &w) const {
    const auto found = divisorField.find(n);
    if (found == divisorField.end())
      return fn + "(" + a + ", " + b + ", " + w + ")";
    const auto &[field, wide] = found->second;
    return fn + (wide ? "WideBy(" : "By(") + a + ", " + field + ", " + w + ")";
  }

  void emitInstruction(int32_t n) {
    const Instruction &inst = program.instructions[n];
    const bool isFloat = expr::isFloat(inst.type);
    const int w = expr::intWidth(inst.type);
    const int kind = expr::floatKind(inst.type);
    const std::string W = std::to_string(w), K = std::to_string(kind);
    auto a = [&] { return operand(inst, 0); };
    auto b = [&] { return operand(inst, 1); };
    auto c = [&] { return operand(inst, 2); };
    auto call = [&](const char *fn, std::initializer_list<std::string> args) {
      std::string text = std::string(fn) + "(";
      bool first = true;
      for (const std::string &arg : args) {
        text += (first ? "" : ", ") + arg;
        first = false;
      }
      return text + ")";
    };
    auto srcWidth = [&] { return std::to_string(inst.imm2); };

    std::string expression;
    if (distanceLeaves.count(n))
      expression = "distance"; // score_distance's argument: this q_idx - kv_idx, exactly
    else if (const auto hoisted = invariantField.find(n); hoisted != invariantField.end())
      expression = isFloat ? "slotFloat(" + hoisted->second + ")" : hoisted->second; // packVariant's
    else switch (inst.op) {
    case Opcode::Argument: {
      static const char *names[] = {"score", "b", "h", "q_idx", "kv_idx"};
      expression = names[inst.imm + (program.isScoreMod ? 0 : 1)];
      break;
    }
    case Opcode::Capture: {
      const CaptureSlot &slot = capture(inst);
      expression = isFloat ? "slotFloat(" + slot.field + ")" : slot.field;
      break;
    }
    case Opcode::Constant:
      expression = isFloat ? floatLiteral(inst.fimm) : intLiteral(inst.imm);
      break;
    case Opcode::Dim:
      expression = capture(inst).field + ".sizes[" + std::to_string(inst.imm2) + "]";
      break;
    case Opcode::Read: {
      const CaptureSlot &slot = capture(inst);
      std::string padding = isFloat ? floatLiteral(inst.hasPadding ? inst.paddingFloat : 0.0f)
                                    : intLiteral(inst.hasPadding ? inst.paddingInt : 0);
      std::string inRange, offset;
      for (size_t d = 0; d < inst.operands.size(); ++d) {
        std::string dim = std::to_string(d);
        const ReadTerm term{n, int(d)};
        const bool worked = termsInScope.count(term) > 0; // by the part that has the index
        inRange += (d ? " && " : "") + (worked ? termInRange(term)
                                               : "inRange(" + operand(inst, d) + ", " + slot.field + ".sizes[" +
                                                     dim + "])");
        offset += (d ? " + " : "") +
                  (worked ? termOffset(term) : operand(inst, d) + " * " + slot.field + ".strides[" + dim + "]");
      }
      expression = "readOr(" + slot.field + ".data, " + inRange + ", " + offset + ", " +
                   (isFloat ? "(float)" : "(i64)") + padding + ")";
      break;
    }
    case Opcode::AddI: expression = in32Bits(n) ? call("addi32", {a(), b()}) : call("addi", {a(), b(), W}); break;
    case Opcode::SubI: expression = in32Bits(n) ? call("subi32", {a(), b()}) : call("subi", {a(), b(), W}); break;
    case Opcode::MulI: expression = in32Bits(n) ? call("muli32", {a(), b()}) : call("muli", {a(), b(), W}); break;
    case Opcode::DivSI: expression = byDivisor(n, "divsi", a(), b(), W); break;
    case Opcode::DivUI: expression = byDivisor(n, "divui", a(), b(), W); break;
    case Opcode::CeilDivSI: expression = byDivisor(n, "ceildivsi", a(), b(), W); break;
    case Opcode::CeilDivUI: expression = byDivisor(n, "ceildivui", a(), b(), W); break;
    case Opcode::FloorDivSI: expression = byDivisor(n, "floordivsi", a(), b(), W); break;
    case Opcode::RemSI: expression = byDivisor(n, "remsi", a(), b(), W); break;
    case Opcode::RemUI: expression = byDivisor(n, "remui", a(), b(), W); break;
    case Opcode::MaxSI: expression = call("maxsi", {a(), b()}); break;
    case Opcode::MinSI: expression = call("minsi", {a(), b()}); break;
    case Opcode::MaxUI: expression = call("maxui", {a(), b(), W}); break;
    case Opcode::MinUI: expression = call("minui", {a(), b(), W}); break;
    case Opcode::AndI: expression = call("andi", {a(), b(), W}); break;
    case Opcode::OrI: expression = call("ori", {a(), b(), W}); break;
    case Opcode::XOrI: expression = call("xori", {a(), b(), W}); break;
    case Opcode::ShLI: expression = call("shli", {a(), b(), W}); break;
    case Opcode::ShRSI: expression = call("shrsi", {a(), b(), W}); break;
    case Opcode::ShRUI: expression = call("shrui", {a(), b(), W}); break;
    case Opcode::AbsI: expression = call("absi", {a(), W}); break;
    case Opcode::CmpI:
      expression = "fromBool(" + call("cmpi", {std::to_string(inst.imm), a(), b(), srcWidth()}) + ")";
      break;
    case Opcode::CmpF:
      expression = "fromBool(" + call("cmpf", {std::to_string(inst.imm), a(), b()}) + ")";
      break;
    case Opcode::Select: expression = "(" + a() + " != 0) ? " + b() + " : " + c(); break;
    case Opcode::ExtSI:
    case Opcode::IndexCast:
    case Opcode::TruncI: expression = call("wrap", {"(u64)" + a(), W}); break;
    case Opcode::ExtUI:
    case Opcode::IndexCastUI:
      expression = call("wrap", {call("asUnsigned", {a(), srcWidth()}), W});
      break;
    case Opcode::SIToFP: expression = call("sitofp", {a(), K}); break;
    case Opcode::UIToFP: expression = call("uitofp", {a(), srcWidth(), K}); break;
    case Opcode::FPToSI: expression = call("fptosi", {a(), W}); break;
    case Opcode::FPToUI: expression = call("fptoui", {a(), W}); break;
    case Opcode::ExtF: expression = a(); break;
    case Opcode::TruncF: expression = call("roundTo", {a(), K}); break;
    case Opcode::AddF: expression = call("addf", {a(), b(), K}); break;
    case Opcode::SubF: expression = call("subf", {a(), b(), K}); break;
    case Opcode::MulF: expression = call("mulf", {a(), b(), K}); break;
    case Opcode::DivF: expression = call("divf", {a(), b(), K}); break;
    case Opcode::RemF: expression = call("remf", {a(), b(), K}); break;
    case Opcode::NegF: expression = call("negf", {a()}); break;
    case Opcode::MaximumF: expression = call("maximumf", {a(), b()}); break;
    case Opcode::MinimumF: expression = call("minimumf", {a(), b()}); break;
    case Opcode::MaxNumF: expression = call("maxnumf", {a(), b()}); break;
    case Opcode::MinNumF: expression = call("minnumf", {a(), b()}); break;
    case Opcode::AbsF: expression = call("fabsf_", {a(), K}); break;
    case Opcode::Exp: expression = call("expf_", {a(), K}); break;
    case Opcode::Exp2: expression = call("exp2f_", {a(), K}); break;
    case Opcode::ExpM1: expression = call("expm1f_", {a(), K}); break;
    case Opcode::Log: expression = call("logf_", {a(), K}); break;
    case Opcode::Log2: expression = call("log2f_", {a(), K}); break;
    case Opcode::Log1p: expression = call("log1pf_", {a(), K}); break;
    case Opcode::Sqrt: expression = call("sqrtf_", {a(), K}); break;
    case Opcode::Rsqrt: expression = call("rsqrtf_", {a(), K}); break;
    case Opcode::Tanh: expression = call("tanhf_", {a(), K}); break;
    case Opcode::Sin: expression = call("sinf_", {a(), K}); break;
    case Opcode::Cos: expression = call("cosf_", {a(), K}); break;
    case Opcode::Erf: expression = call("erff_", {a(), K}); break;
    case Opcode::PowF: expression = call("powf_", {a(), b(), K}); break;
    case Opcode::Fma: expression = call("fmaf_", {a(), b(), c(), K}); break;
    case Opcode::Floor: expression = call("floorf_", {a(), K}); break;
    case Opcode::Ceil: expression = call("ceilf_", {a(), K}); break;
    case Opcode::Trunc: expression = call("truncf_", {a(), K}); break;
    case Opcode::Round: expression = call("roundf_", {a(), K}); break;
    case Opcode::CopySign: expression = call("copysignf_", {a(), b()}); break;
    }
    if (!inst.location.empty())
      out << "    // " << inst.location << "\n";
    // A value proven within 32 bits is held as an int (its expression
    // computed as before, then narrowed exactly): the GPU then computes it,
    // and what is computed from it, in 32-bit instructions.
    out << "    const " << typeOf(n) << " " << value(n) << " = "
        << (narrow[n] ? "(int)(" + expression + ")" : expression) << ";\n";
  }

  std::ostringstream &out;
  const Program &program;
  const VariantLayout &layout;
  /// The divisions by a launch-invariant divisor: their divisor's member,
  /// and whether it is a wide one.
  std::map<int32_t, std::pair<std::string, bool>> divisorField;
  /// The read terms the function being emitted has from its parts.
  std::set<ReadTerm> termsInScope;
  /// The instructions that are q_idx - kv_idx itself, while a score_mod's
  /// split is emitted: score_distance's argument.
  std::set<int32_t> distanceLeaves;
  /// The hoisted launch-invariant values: their member.
  std::map<int32_t, std::string> invariantField;
  /// The integer values integerRanges proves within 32 bits.
  std::vector<bool> narrow;
};

} // namespace

std::string emitVariant(const std::string &structName,
                        const VariantLayout &layout, const Program &mask,
                        const Program *scoreMod) {
  std::ostringstream out;
  out << "// Variant of mask @" << mask.name;
  if (scoreMod)
    out << " and score_mod @" << scoreMod->name;
  out << ": " << layout.sizeBytes << " bytes of captures.\n";
  out << "struct " << structName << " {\n";
  out << "  static constexpr bool kHasScoreMod = " << (scoreMod ? "true" : "false") << ";\n";
  if (layout.captures.empty())
    out << "  long long unused_capture_slot;\n";
  const CongruenceSplit maskForm = emittedForm(mask);
  std::optional<CongruenceSplit> scoreModForm;
  if (scoreMod)
    scoreModForm = emittedForm(*scoreMod);
  // The emitted value a slot holds or reads (slots name the bodies' values).
  auto emittedValue = [&](bool inScoreMod, int32_t instruction) {
    const std::vector<int32_t> &origin = (inScoreMod ? *scoreModForm : maskForm).origin;
    return std::find(origin.begin(), origin.end(), instruction) - origin.begin();
  };
  // The members in the layout's byte order (the mask's captures, divisors
  // and invariants before the score_mod's), so the struct is the layout.
  std::map<int, std::string> members;
  for (const CaptureSlot &slot : layout.captures)
    members[slot.offsetBytes] =
        "  // capture '" + slot.name + "' at byte " + std::to_string(slot.offsetBytes) + "\n" +
        (slot.isTensor ? "  ::dflex::sem::Tensor<" + std::string(cppElementType(slot.elementType)) + ", " +
                             std::to_string(slot.rank) + "> "
                       : std::string("  long long ")) +
        slot.field + ";\n";
  for (const DivisorSlot &slot : layout.divisors)
    members[slot.offsetBytes] =
        std::string("  // divisor: ") + (slot.inScoreMod ? "score_mod" : "mask") + " value v" +
        std::to_string(emittedValue(slot.inScoreMod, slot.instruction)) + ", " +
        (slot.isSigned ? "signed" : slot.wide ? "unsigned, any numerator," : "unsigned") + " at " +
        std::to_string(slot.width) + " bits, byte " + std::to_string(slot.offsetBytes) + "\n  ::dflex::sem::" +
        (slot.wide ? "WideUDivisor " : "UDivisor ") + slot.field + ";\n";
  for (const InvariantSlot &slot : layout.invariants)
    members[slot.offsetBytes] = std::string("  // launch-invariant ") + (slot.inScoreMod ? "score_mod" : "mask") +
                                " value v" + std::to_string(emittedValue(slot.inScoreMod, slot.instruction)) +
                                ", computed at launch, byte " + std::to_string(slot.offsetBytes) +
                                "\n  long long " + slot.field + ";\n";
  for (const auto &[offset, member] : members)
    out << member;
  BodyEmitter(out, maskForm, layout, false).emitSplitMask(maskForm.program.result);
  if (KeyIntervalForm intervals = keyIntervals(maskForm.program); !intervals.first.empty()) {
    CongruenceSplit intervalForm;
    intervalForm.origin = maskForm.origin;
    intervalForm.origin.resize(intervals.program.instructions.size(), -1);
    intervalForm.program = std::move(intervals.program);
    BodyEmitter(out, intervalForm, layout, false).emitKeyIntervals(intervals.first, intervals.count);
  }

  if (scoreMod) {
    BodyEmitter(out, *scoreModForm, layout, true)
        .emitSplitScoreMod(scoreModForm->program.result, scoreModForm->program.scoreDerivative);
  } else {
    const char *scoreSignature =
        "(float score, long long b, long long h, long long q_idx, long long kv_idx) const {\n";
    out << "\n  DFLEX_FUNCTOR float score_mod" << scoreSignature << "    return score;\n  }\n"
        << "\n  DFLEX_FUNCTOR float score_mod_grad" << scoreSignature << "    return 1.0f;\n  }\n";
  }
  out << "};\n";
  return out.str();
}

Result<std::vector<uint8_t>> packVariant(const VariantLayout &layout,
                                         const std::vector<BoundCapture> &captures,
                                         const Program &mask, const Program *scoreMod) {
  std::vector<uint8_t> bytes(layout.sizeBytes, 0);
  auto put = [&](int offset, int64_t word) { std::memcpy(&bytes[offset], &word, 8); };
  for (const BoundCapture &bound : captures)
    if (!layout.find(bound.name))
      return Status::failure("no capture named '" + bound.name + "'");
  for (const CaptureSlot &slot : layout.captures) {
    const BoundCapture *bound = nullptr;
    for (const BoundCapture &candidate : captures)
      if (candidate.name == slot.name) {
        if (bound)
          return Status::failure("capture '" + slot.name + "' is given twice");
        bound = &candidate;
      }
    if (!bound)
      return Status::failure("capture '" + slot.name + "' is missing");
    const expr::CaptureValue &value = bound->value;
    if (!slot.isTensor) {
      put(slot.offsetBytes, expr::isFloat(slot.elementType)
                                ? static_cast<int64_t>(sem::floatBits(value.scalar.f))
                                : value.scalar.i);
      continue;
    }
    if (static_cast<int>(value.sizes.size()) != slot.rank ||
        value.strides.size() != value.sizes.size())
      return Status::failure("capture '" + slot.name + "' must have rank " +
                             std::to_string(slot.rank) + ", got " +
                             std::to_string(value.sizes.size()));
    if (value.elementType != slot.elementType)
      return Status::failure("capture '" + slot.name + "' must hold " +
                             expr::toString(slot.elementType) + ", got " +
                             expr::toString(value.elementType));
    put(slot.offsetBytes, static_cast<int64_t>(reinterpret_cast<uintptr_t>(value.data)));
    for (int d = 0; d < slot.rank; ++d) {
      put(slot.offsetBytes + 8 * (1 + d), value.sizes[d]);
      put(slot.offsetBytes + 8 * (1 + slot.rank + d), value.strides[d]);
    }
  }
  // The divisors and hoisted invariants: each program's launch-invariant
  // values, from its scalar captures and tensor sizes (every other
  // instruction stands in as 0, so no element is read).
  for (const bool inScoreMod : {false, true}) {
    const Program *program = inScoreMod ? scoreMod : &mask;
    bool wanted = false;
    for (const DivisorSlot &slot : layout.divisors)
      wanted = wanted || slot.inScoreMod == inScoreMod;
    for (const InvariantSlot &slot : layout.invariants)
      wanted = wanted || slot.inScoreMod == inScoreMod;
    if (!wanted)
      continue;
    if (!program)
      return Status::failure("the layout has score_mod launch invariants but no score_mod was given");
    Program invariants = *program;
    const std::vector<bool> invariant = launchInvariant(*program);
    for (size_t n = 0; n < invariants.instructions.size(); ++n)
      if (!invariant[n]) {
        Instruction &inst = invariants.instructions[n];
        inst.op = Opcode::Constant;
        inst.operands.clear();
        inst.imm = 0;
        inst.fimm = 0.0f;
      }
    std::vector<expr::CaptureValue> values;
    for (const expr::CaptureDecl &decl : program->captures)
      for (const BoundCapture &bound : captures)
        if (bound.name == decl.name)
          values.push_back(bound.value);
    const std::vector<expr::Value> leading(program->numLeadingArguments(), expr::Value::ofInt(0));
    std::vector<expr::Value> results;
    expr::evaluate(invariants, leading.data(), values, results);
    for (const DivisorSlot &slot : layout.divisors)
      if (slot.inScoreMod == inScoreMod) {
        const int64_t value = results.at(size_t(slot.instruction)).i;
        if (slot.wide) {
          const sem::WideUDivisor divisor = sem::makeWideUDivisor(value, slot.width);
          put(slot.offsetBytes, static_cast<int64_t>(divisor.divisor));
          put(slot.offsetBytes + 8, static_cast<int64_t>(divisor.magic));
          put(slot.offsetBytes + 16, static_cast<int64_t>(divisor.shifts));
          continue;
        }
        const sem::UDivisor divisor =
            slot.isSigned ? sem::makeSDivisor(value, slot.width) : sem::makeUDivisor(value, slot.width);
        put(slot.offsetBytes, static_cast<int64_t>(divisor.divisor));
        put(slot.offsetBytes + 8, static_cast<int64_t>(divisor.packed));
      }
    for (const InvariantSlot &slot : layout.invariants)
      if (slot.inScoreMod == inScoreMod) {
        const expr::Value &value = results.at(size_t(slot.instruction));
        put(slot.offsetBytes, slot.isFloat ? static_cast<int64_t>(sem::floatBits(value.f)) : value.i);
      }
  }
  return bytes;
}

JsonValue toJson(const VariantLayout &layout) {
  JsonValue json = JsonValue::object();
  json["size_bytes"] = layout.sizeBytes;
  JsonValue captures = JsonValue::array();
  for (const CaptureSlot &slot : layout.captures) {
    JsonValue c = JsonValue::object();
    c["name"] = slot.name;
    c["tensor"] = slot.isTensor;
    c["type"] = expr::toString(slot.elementType);
    c["rank"] = slot.rank;
    c["offset_bytes"] = slot.offsetBytes;
    c["size_bytes"] = slot.sizeBytes;
    captures.push(std::move(c));
  }
  json["captures"] = std::move(captures);
  // A value the host computes at launch: which program's instruction, where.
  auto launchValue = [](bool inScoreMod, int32_t instruction, int offsetBytes) {
    JsonValue value = JsonValue::object();
    value["program"] = inScoreMod ? "score_mod" : "mask";
    value["instruction"] = instruction;
    value["offset_bytes"] = offsetBytes;
    return value;
  };
  JsonValue divisors = JsonValue::array();
  for (const DivisorSlot &slot : layout.divisors) {
    JsonValue d = launchValue(slot.inScoreMod, slot.instruction, slot.offsetBytes);
    d["width"] = slot.width;
    d["signed"] = slot.isSigned;
    d["wide"] = slot.wide;
    divisors.push(std::move(d));
  }
  json["divisors"] = std::move(divisors);
  JsonValue invariants = JsonValue::array();
  for (const InvariantSlot &slot : layout.invariants) {
    JsonValue v = launchValue(slot.inScoreMod, slot.instruction, slot.offsetBytes);
    v["float"] = slot.isFloat;
    invariants.push(std::move(v));
  }
  json["invariants"] = std::move(invariants);
  return json;
}

} // namespace dflex::codegen
