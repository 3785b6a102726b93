//===- Program.cpp - evaluation of portable body programs -----------------===//

#include "dflex/Expr/Program.h"
#include "dflex/Expr/Semantics.h"

#include <cstring>

namespace dflex::expr {

bool isFloat(ScalarType type) {
  return type == ScalarType::F16 || type == ScalarType::BF16 ||
         type == ScalarType::F32;
}

int intWidth(ScalarType type) {
  switch (type) {
  case ScalarType::I1: return 1;
  case ScalarType::I8: return 8;
  case ScalarType::I16: return 16;
  case ScalarType::I32: return 32;
  default: return 64;
  }
}

int floatKind(ScalarType type) {
  return type == ScalarType::BF16 ? sem::BF16
         : type == ScalarType::F16 ? sem::F16
                                   : sem::F32;
}

const char *toString(ScalarType type) {
  switch (type) {
  case ScalarType::I1: return "i1";
  case ScalarType::I8: return "i8";
  case ScalarType::I16: return "i16";
  case ScalarType::I32: return "i32";
  case ScalarType::I64: return "i64";
  case ScalarType::Index: return "index";
  case ScalarType::F16: return "f16";
  case ScalarType::BF16: return "bf16";
  case ScalarType::F32: return "f32";
  }
  return "?";
}

CaptureValue CaptureValue::ofTensor(const void *data, ScalarType elementType,
                                    std::vector<int64_t> sizes) {
  CaptureValue c;
  c.data = data;
  c.elementType = elementType;
  c.strides.assign(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;)
    c.strides[d - 1] = c.strides[d] * sizes[d];
  c.sizes = std::move(sizes);
  return c;
}

bool CaptureValue::isRowMajor() const {
  bool rowMajor = true;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1, expected = 1; d >= 0; expected *= sizes[d], --d)
    rowMajor = rowMajor && (sizes[d] == 1 || strides[d] == expected);
  return rowMajor;
}

std::string checkCaptures(const Program &program,
                          const std::vector<CaptureValue> &captures) {
  if (captures.size() != program.captures.size())
    return "'" + program.name + "' takes " +
           std::to_string(program.captures.size()) + " captures, got " +
           std::to_string(captures.size());
  for (size_t i = 0; i < captures.size(); ++i) {
    const CaptureDecl &decl = program.captures[i];
    const CaptureValue &value = captures[i];
    if (!decl.isTensor)
      continue;
    if (!value.data && !value.sizes.empty())
      return "capture '" + decl.name + "' has no data";
    if (static_cast<int>(value.sizes.size()) != decl.rank ||
        value.strides.size() != value.sizes.size())
      return "capture '" + decl.name + "' must have rank " +
             std::to_string(decl.rank) + ", got " +
             std::to_string(value.sizes.size());
    if (value.elementType != decl.elementType)
      return "capture '" + decl.name + "' must hold " +
             toString(decl.elementType) + ", got " +
             toString(value.elementType);
  }
  return "";
}

std::vector<bool> dependsOnArgument(const Program &program, int64_t argument) {
  std::vector<bool> depends(program.instructions.size(), false);
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    const Instruction &inst = program.instructions[n];
    if (inst.op == Opcode::Argument)
      depends[n] = inst.imm == argument;
    for (int32_t operand : inst.operands)
      depends[n] = depends[n] || depends[operand];
  }
  return depends;
}

namespace {

float loadBF16(const void *p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return sem::bitsFloat(static_cast<unsigned>(bits) << 16);
}

Value loadElement(const CaptureValue &tensor, int64_t offset) {
  const char *base = static_cast<const char *>(tensor.data);
  switch (tensor.elementType) {
  case ScalarType::I32: {
    int32_t v;
    std::memcpy(&v, base + offset * 4, 4);
    return Value::ofInt(v);
  }
  case ScalarType::I64: {
    int64_t v;
    std::memcpy(&v, base + offset * 8, 8);
    return Value::ofInt(v);
  }
  case ScalarType::F32: {
    float v;
    std::memcpy(&v, base + offset * 4, 4);
    return Value::ofFloat(v);
  }
  case ScalarType::BF16:
    return Value::ofFloat(loadBF16(base + offset * 2));
  default:
    return Value{};
  }
}

Value readTensor(const Instruction &inst, const std::vector<Value> &values,
                 const CaptureValue &tensor) {
  int64_t offset = 0;
  bool inRange = true;
  for (size_t d = 0; d < inst.operands.size(); ++d) {
    int64_t index = values[inst.operands[d]].i;
    if (index < 0 || index >= tensor.sizes[d]) {
      inRange = false;
      break;
    }
    offset += index * tensor.strides[d];
  }
  if (inRange)
    return loadElement(tensor, offset);
  if (isFloat(inst.type))
    return Value::ofFloat(inst.hasPadding ? inst.paddingFloat : 0.0f);
  return Value::ofInt(inst.hasPadding ? inst.paddingInt : 0);
}

} // namespace

Value evaluate(const Program &program, const Value *leading,
               const std::vector<CaptureValue> &captures,
               std::vector<Value> &values) {
  values.resize(program.instructions.size());
  for (size_t n = 0; n < program.instructions.size(); ++n) {
    const Instruction &inst = program.instructions[n];
    auto I = [&](int k) { return values[inst.operands[k]].i; };
    auto F = [&](int k) { return values[inst.operands[k]].f; };
    int w = intWidth(inst.type);
    int kind = floatKind(inst.type);
    Value &out = values[n];
    switch (inst.op) {
    case Opcode::Argument: out = leading[inst.imm]; break;
    case Opcode::Capture: out = captures[inst.imm].scalar; break;
    case Opcode::Constant: out = Value{inst.imm, inst.fimm}; break;
    case Opcode::Read: out = readTensor(inst, values, captures[inst.imm]); break;
    case Opcode::Dim: out = Value::ofInt(captures[inst.imm].sizes[inst.imm2]); break;
    case Opcode::AddI: out = Value::ofInt(sem::addi(I(0), I(1), w)); break;
    case Opcode::SubI: out = Value::ofInt(sem::subi(I(0), I(1), w)); break;
    case Opcode::MulI: out = Value::ofInt(sem::muli(I(0), I(1), w)); break;
    case Opcode::DivSI: out = Value::ofInt(sem::divsi(I(0), I(1), w)); break;
    case Opcode::DivUI: out = Value::ofInt(sem::divui(I(0), I(1), w)); break;
    case Opcode::CeilDivSI: out = Value::ofInt(sem::ceildivsi(I(0), I(1), w)); break;
    case Opcode::CeilDivUI: out = Value::ofInt(sem::ceildivui(I(0), I(1), w)); break;
    case Opcode::FloorDivSI: out = Value::ofInt(sem::floordivsi(I(0), I(1), w)); break;
    case Opcode::RemSI: out = Value::ofInt(sem::remsi(I(0), I(1), w)); break;
    case Opcode::RemUI: out = Value::ofInt(sem::remui(I(0), I(1), w)); break;
    case Opcode::MaxSI: out = Value::ofInt(sem::maxsi(I(0), I(1))); break;
    case Opcode::MinSI: out = Value::ofInt(sem::minsi(I(0), I(1))); break;
    case Opcode::MaxUI: out = Value::ofInt(sem::maxui(I(0), I(1), w)); break;
    case Opcode::MinUI: out = Value::ofInt(sem::minui(I(0), I(1), w)); break;
    case Opcode::AndI: out = Value::ofInt(sem::andi(I(0), I(1), w)); break;
    case Opcode::OrI: out = Value::ofInt(sem::ori(I(0), I(1), w)); break;
    case Opcode::XOrI: out = Value::ofInt(sem::xori(I(0), I(1), w)); break;
    case Opcode::ShLI: out = Value::ofInt(sem::shli(I(0), I(1), w)); break;
    case Opcode::ShRSI: out = Value::ofInt(sem::shrsi(I(0), I(1), w)); break;
    case Opcode::ShRUI: out = Value::ofInt(sem::shrui(I(0), I(1), w)); break;
    case Opcode::AbsI: out = Value::ofInt(sem::absi(I(0), w)); break;
    case Opcode::CmpI:
      out = Value::ofInt(sem::fromBool(
          sem::cmpi(static_cast<int>(inst.imm), I(0), I(1), static_cast<int>(inst.imm2))));
      break;
    case Opcode::CmpF:
      out = Value::ofInt(sem::fromBool(sem::cmpf(static_cast<int>(inst.imm), F(0), F(1))));
      break;
    case Opcode::Select: out = I(0) ? values[inst.operands[1]] : values[inst.operands[2]]; break;
    case Opcode::ExtSI:
    case Opcode::IndexCast:
      // Sources are stored sign-extended already; narrowing wraps.
      out = Value::ofInt(sem::wrap(static_cast<uint64_t>(I(0)), w));
      break;
    case Opcode::ExtUI:
    case Opcode::IndexCastUI:
      out = Value::ofInt(sem::wrap(sem::asUnsigned(I(0), static_cast<int>(inst.imm2)), w));
      break;
    case Opcode::TruncI: out = Value::ofInt(sem::wrap(static_cast<uint64_t>(I(0)), w)); break;
    case Opcode::SIToFP: out = Value::ofFloat(sem::sitofp(I(0), kind)); break;
    case Opcode::UIToFP:
      out = Value::ofFloat(sem::uitofp(I(0), static_cast<int>(inst.imm2), kind));
      break;
    case Opcode::FPToSI: out = Value::ofInt(sem::fptosi(F(0), w)); break;
    case Opcode::FPToUI: out = Value::ofInt(sem::fptoui(F(0), w)); break;
    case Opcode::ExtF: out = Value::ofFloat(F(0)); break;
    case Opcode::TruncF: out = Value::ofFloat(sem::roundTo(F(0), kind)); break;
    case Opcode::AddF: out = Value::ofFloat(sem::addf(F(0), F(1), kind)); break;
    case Opcode::SubF: out = Value::ofFloat(sem::subf(F(0), F(1), kind)); break;
    case Opcode::MulF: out = Value::ofFloat(sem::mulf(F(0), F(1), kind)); break;
    case Opcode::DivF: out = Value::ofFloat(sem::divf(F(0), F(1), kind)); break;
    case Opcode::RemF: out = Value::ofFloat(sem::remf(F(0), F(1), kind)); break;
    case Opcode::NegF: out = Value::ofFloat(sem::negf(F(0))); break;
    case Opcode::MaximumF: out = Value::ofFloat(sem::maximumf(F(0), F(1))); break;
    case Opcode::MinimumF: out = Value::ofFloat(sem::minimumf(F(0), F(1))); break;
    case Opcode::MaxNumF: out = Value::ofFloat(sem::maxnumf(F(0), F(1))); break;
    case Opcode::MinNumF: out = Value::ofFloat(sem::minnumf(F(0), F(1))); break;
    case Opcode::AbsF: out = Value::ofFloat(sem::fabsf_(F(0), kind)); break;
    case Opcode::Exp: out = Value::ofFloat(sem::expf_(F(0), kind)); break;
    case Opcode::Exp2: out = Value::ofFloat(sem::exp2f_(F(0), kind)); break;
    case Opcode::ExpM1: out = Value::ofFloat(sem::expm1f_(F(0), kind)); break;
    case Opcode::Log: out = Value::ofFloat(sem::logf_(F(0), kind)); break;
    case Opcode::Log2: out = Value::ofFloat(sem::log2f_(F(0), kind)); break;
    case Opcode::Log1p: out = Value::ofFloat(sem::log1pf_(F(0), kind)); break;
    case Opcode::Sqrt: out = Value::ofFloat(sem::sqrtf_(F(0), kind)); break;
    case Opcode::Rsqrt: out = Value::ofFloat(sem::rsqrtf_(F(0), kind)); break;
    case Opcode::Tanh: out = Value::ofFloat(sem::tanhf_(F(0), kind)); break;
    case Opcode::Sin: out = Value::ofFloat(sem::sinf_(F(0), kind)); break;
    case Opcode::Cos: out = Value::ofFloat(sem::cosf_(F(0), kind)); break;
    case Opcode::Erf: out = Value::ofFloat(sem::erff_(F(0), kind)); break;
    case Opcode::PowF: out = Value::ofFloat(sem::powf_(F(0), F(1), kind)); break;
    case Opcode::Fma: out = Value::ofFloat(sem::fmaf_(F(0), F(1), F(2), kind)); break;
    case Opcode::Floor: out = Value::ofFloat(sem::floorf_(F(0), kind)); break;
    case Opcode::Ceil: out = Value::ofFloat(sem::ceilf_(F(0), kind)); break;
    case Opcode::Trunc: out = Value::ofFloat(sem::truncf_(F(0), kind)); break;
    case Opcode::Round: out = Value::ofFloat(sem::roundf_(F(0), kind)); break;
    case Opcode::CopySign: out = Value::ofFloat(sem::copysignf_(F(0), F(1))); break;
    }
  }
  return values[program.result];
}

bool evaluateMask(const Program &program, int64_t b, int64_t h, int64_t q,
                  int64_t kv, const std::vector<CaptureValue> &captures,
                  std::vector<Value> &scratch) {
  Value leading[4] = {Value::ofInt(b), Value::ofInt(h), Value::ofInt(q),
                      Value::ofInt(kv)};
  return evaluate(program, leading, captures, scratch).i != 0;
}

float evaluateScoreMod(const Program &program, float score, int64_t b,
                       int64_t h, int64_t q, int64_t kv,
                       const std::vector<CaptureValue> &captures,
                       std::vector<Value> &scratch) {
  Value leading[5] = {Value::ofFloat(score), Value::ofInt(b), Value::ofInt(h),
                      Value::ofInt(q), Value::ofInt(kv)};
  return evaluate(program, leading, captures, scratch).f;
}

const char *toString(Opcode op) {
  switch (op) {
#define DFLEX_OPCODE_NAME(name) case Opcode::name: return #name;
    DFLEX_OPCODE_NAME(Argument) DFLEX_OPCODE_NAME(Capture) DFLEX_OPCODE_NAME(Constant)
    DFLEX_OPCODE_NAME(Read) DFLEX_OPCODE_NAME(Dim) DFLEX_OPCODE_NAME(AddI)
    DFLEX_OPCODE_NAME(SubI) DFLEX_OPCODE_NAME(MulI) DFLEX_OPCODE_NAME(DivSI)
    DFLEX_OPCODE_NAME(DivUI) DFLEX_OPCODE_NAME(CeilDivSI) DFLEX_OPCODE_NAME(CeilDivUI)
    DFLEX_OPCODE_NAME(FloorDivSI) DFLEX_OPCODE_NAME(RemSI) DFLEX_OPCODE_NAME(RemUI)
    DFLEX_OPCODE_NAME(MaxSI) DFLEX_OPCODE_NAME(MinSI) DFLEX_OPCODE_NAME(MaxUI)
    DFLEX_OPCODE_NAME(MinUI) DFLEX_OPCODE_NAME(AndI) DFLEX_OPCODE_NAME(OrI)
    DFLEX_OPCODE_NAME(XOrI) DFLEX_OPCODE_NAME(ShLI) DFLEX_OPCODE_NAME(ShRSI)
    DFLEX_OPCODE_NAME(ShRUI) DFLEX_OPCODE_NAME(AbsI) DFLEX_OPCODE_NAME(CmpI)
    DFLEX_OPCODE_NAME(CmpF) DFLEX_OPCODE_NAME(Select) DFLEX_OPCODE_NAME(ExtSI)
    DFLEX_OPCODE_NAME(ExtUI) DFLEX_OPCODE_NAME(TruncI) DFLEX_OPCODE_NAME(IndexCast)
    DFLEX_OPCODE_NAME(IndexCastUI) DFLEX_OPCODE_NAME(SIToFP) DFLEX_OPCODE_NAME(UIToFP)
    DFLEX_OPCODE_NAME(FPToSI) DFLEX_OPCODE_NAME(FPToUI) DFLEX_OPCODE_NAME(ExtF)
    DFLEX_OPCODE_NAME(TruncF) DFLEX_OPCODE_NAME(AddF) DFLEX_OPCODE_NAME(SubF)
    DFLEX_OPCODE_NAME(MulF) DFLEX_OPCODE_NAME(DivF) DFLEX_OPCODE_NAME(RemF)
    DFLEX_OPCODE_NAME(NegF) DFLEX_OPCODE_NAME(MaximumF) DFLEX_OPCODE_NAME(MinimumF)
    DFLEX_OPCODE_NAME(MaxNumF) DFLEX_OPCODE_NAME(MinNumF) DFLEX_OPCODE_NAME(AbsF)
    DFLEX_OPCODE_NAME(Exp) DFLEX_OPCODE_NAME(Exp2) DFLEX_OPCODE_NAME(ExpM1)
    DFLEX_OPCODE_NAME(Log) DFLEX_OPCODE_NAME(Log2) DFLEX_OPCODE_NAME(Log1p)
    DFLEX_OPCODE_NAME(Sqrt) DFLEX_OPCODE_NAME(Rsqrt) DFLEX_OPCODE_NAME(Tanh)
    DFLEX_OPCODE_NAME(Sin) DFLEX_OPCODE_NAME(Cos) DFLEX_OPCODE_NAME(Erf)
    DFLEX_OPCODE_NAME(PowF) DFLEX_OPCODE_NAME(Fma) DFLEX_OPCODE_NAME(Floor)
    DFLEX_OPCODE_NAME(Ceil) DFLEX_OPCODE_NAME(Trunc) DFLEX_OPCODE_NAME(Round)
    DFLEX_OPCODE_NAME(CopySign)
#undef DFLEX_OPCODE_NAME
  }
  return "?";
}

} // namespace dflex::expr
