//===- Program.h - portable form of mask and score_mod bodies ---*- C++ -*-===//
//
// A mask or score_mod body as a flat list of instructions in SSA order, with
// calls inlined. It needs no MLIR: the runtime's CPU reference path evaluates
// it, and bundles can carry it. Operation semantics are those of
// dflex/Expr/Semantics.h.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_EXPR_PROGRAM_H
#define DFLEX_EXPR_PROGRAM_H

#include <cstdint>
#include <string>
#include <vector>

namespace dflex::expr {

/// The scalar types a body computes with.
enum class ScalarType : uint8_t { I1, I8, I16, I32, I64, Index, F16, BF16, F32 };

bool isFloat(ScalarType type);
/// Bit width of an integer type (index is 64).
int intWidth(ScalarType type);
/// The float kind of Semantics.h (F32, F16, BF16) of a float type.
int floatKind(ScalarType type);
const char *toString(ScalarType type);

enum class Opcode : uint8_t {
  // Leaves.
  Argument,     // leading argument `imm` (score, b, h, q_idx, kv_idx order)
  Capture,      // scalar capture number `imm`
  Constant,     // integer constant `imm` or float constant `fimm`
  Read,         // element of tensor capture `imm` at operands, or operand of `padding`
  Dim,          // size of tensor capture `imm` in dimension `imm2`
  // Integer arithmetic (width from `type`).
  AddI, SubI, MulI, DivSI, DivUI, CeilDivSI, CeilDivUI, FloorDivSI, RemSI,
  RemUI, MaxSI, MinSI, MaxUI, MinUI, AndI, OrI, XOrI, ShLI, ShRSI, ShRUI, AbsI,
  CmpI,         // predicate `imm` (arith.cmpi numbering), operand width `imm2`
  CmpF,         // predicate `imm` (arith.cmpf numbering)
  Select,
  // Conversions; `imm2` is the source width for integer sources.
  ExtSI, ExtUI, TruncI, IndexCast, IndexCastUI, SIToFP, UIToFP, FPToSI,
  FPToUI, ExtF, TruncF,
  // Float arithmetic (rounding from `type`).
  AddF, SubF, MulF, DivF, RemF, NegF, MaximumF, MinimumF, MaxNumF, MinNumF,
  AbsF, Exp, Exp2, ExpM1, Log, Log2, Log1p, Sqrt, Rsqrt, Tanh, Sin, Cos, Erf,
  PowF, Fma, Floor, Ceil, Trunc, Round, CopySign,
};

const char *toString(Opcode op);

struct Instruction {
  Opcode op;
  ScalarType type;               // the result type
  std::vector<int32_t> operands; // earlier instructions
  int64_t imm = 0;
  int64_t imm2 = 0;
  float fimm = 0.0f;
  bool hasPadding = false;       // Read: out-of-range reads yield paddingInt/paddingFloat
  int64_t paddingInt = 0;
  float paddingFloat = 0.0f;
  std::string location;          // "file:line:col" of the DSL op, for diagnostics
};

struct CaptureDecl {
  std::string name;
  bool isTensor = false;
  ScalarType elementType = ScalarType::I32; // element type, or the scalar's type
  int rank = 0;
};

struct Program {
  std::string name;
  bool isScoreMod = false;
  std::vector<CaptureDecl> captures;
  std::vector<Instruction> instructions;
  int32_t result = -1; // the instruction whose value the body yields
  /// For a score_mod with a derivative: the instruction holding
  /// d(result)/d(score), or -1.
  int32_t scoreDerivative = -1;

  unsigned numLeadingArguments() const { return isScoreMod ? 5 : 4; }
};

/// A value during evaluation: integers sign-extended from their width, floats
/// already rounded to their type.
struct Value {
  int64_t i = 0;
  float f = 0.0f;
  static Value ofInt(int64_t v) { return Value{v, 0.0f}; }
  static Value ofFloat(float v) { return Value{0, v}; }
};

/// A capture's value: a scalar, or a strided view of host memory.
struct CaptureValue {
  Value scalar;
  const void *data = nullptr;
  ScalarType elementType = ScalarType::I32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides; // in elements

  static CaptureValue ofScalar(Value v) {
    CaptureValue c;
    c.scalar = v;
    return c;
  }
  /// A contiguous row-major tensor.
  static CaptureValue ofTensor(const void *data, ScalarType elementType,
                               std::vector<int64_t> sizes);
  /// Whether the strides are those of a contiguous row-major tensor (sizes
  /// of 1 aside), so its elements in logical order are its memory.
  bool isRowMajor() const;
  /// Calls visit(offset) with the memory offset, in elements, of each
  /// element in logical row-major order, whatever the strides.
  template <class Visit> void forEachOffset(Visit &&visit) const {
    int64_t count = 1;
    for (int64_t size : sizes)
      count *= size;
    std::vector<int64_t> position(sizes.size(), 0);
    for (int64_t n = 0; n < count; ++n) {
      int64_t offset = 0;
      for (size_t d = 0; d < sizes.size(); ++d)
        offset += position[d] * strides[d];
      visit(offset);
      for (size_t d = sizes.size(); d-- > 0;) {
        if (++position[d] < sizes[d])
          break;
        position[d] = 0;
      }
    }
  }
};

/// Whether instruction `index` of `program` depends on leading argument
/// `argument` (directly or through its operands).
std::vector<bool> dependsOnArgument(const Program &program, int64_t argument);

/// Evaluates `program`. `leading` holds (score,) b, h, q_idx, kv_idx; the
/// score is used as a float, the indices as integers. `captures` are in
/// declaration order and must match `program.captures` (checked by
/// `checkCaptures`). `scratch` is reused across calls to avoid allocation.
Value evaluate(const Program &program, const Value *leading,
               const std::vector<CaptureValue> &captures,
               std::vector<Value> &scratch);

/// Convenience wrappers for masks and score mods.
bool evaluateMask(const Program &program, int64_t b, int64_t h, int64_t q,
                  int64_t kv, const std::vector<CaptureValue> &captures,
                  std::vector<Value> &scratch);
float evaluateScoreMod(const Program &program, float score, int64_t b,
                       int64_t h, int64_t q, int64_t kv,
                       const std::vector<CaptureValue> &captures,
                       std::vector<Value> &scratch);

/// Returns an empty string when `captures` fit `program`'s declarations,
/// else a message naming the first mismatching capture.
std::string checkCaptures(const Program &program,
                          const std::vector<CaptureValue> &captures);

} // namespace dflex::expr

#endif // DFLEX_EXPR_PROGRAM_H
