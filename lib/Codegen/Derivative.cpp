//===- Derivative.cpp - d(score_mod)/d(score) by differentiation ----------===//

#include "dflex/Codegen/Derivative.h"

#include <cmath>
#include <map>

namespace dflex::codegen {

using expr::Instruction;
using expr::Opcode;
using expr::ScalarType;

namespace {

/// The DSL op behind an opcode without a derivative, for the message.
const char *nonDifferentiableOpName(Opcode op) {
  switch (op) {
  case Opcode::RemF: return "arith.remf";
  case Opcode::Floor: return "math.floor";
  case Opcode::Ceil: return "math.ceil";
  case Opcode::Trunc: return "math.trunc";
  case Opcode::Round: return "math.round";
  case Opcode::CopySign: return "math.copysign";
  case Opcode::FPToSI: return "arith.fptosi";
  case Opcode::FPToUI: return "arith.fptoui";
  default: return nullptr;
  }
}

/// Appends f32 instructions to a program; -1 stands for a zero derivative.
class DerivativeBuilder {
public:
  explicit DerivativeBuilder(expr::Program &program) : program(program) {}

  int32_t constant(float value) {
    auto it = constants.find(value);
    if (it != constants.end())
      return it->second;
    Instruction inst;
    inst.op = Opcode::Constant;
    inst.type = ScalarType::F32;
    inst.fimm = value;
    return constants[value] = append(std::move(inst));
  }
  int32_t op(Opcode opcode, std::vector<int32_t> operands, int64_t imm = 0,
             ScalarType type = ScalarType::F32) {
    Instruction inst;
    inst.op = opcode;
    inst.type = type;
    inst.operands = std::move(operands);
    inst.imm = imm;
    return append(std::move(inst));
  }
  int32_t orZero(int32_t d) { return d < 0 ? constant(0.0f) : d; }
  /// a * b; a factor that is the builder's 1.0 drops out (x * 1 is x
  /// exactly), so d(score)/d(score) = 1 costs nothing downstream.
  int32_t mul(int32_t a, int32_t b) {
    if (isOne(a))
      return b;
    if (isOne(b))
      return a;
    return op(Opcode::MulF, {a, b});
  }
  int32_t add(int32_t a, int32_t b) {
    if (a < 0)
      return b;
    if (b < 0)
      return a;
    return op(Opcode::AddF, {a, b});
  }
  /// factor * d, or zero when d is zero.
  int32_t scale(int32_t factor, int32_t d) { return d < 0 ? -1 : mul(factor, d); }

private:
  bool isOne(int32_t value) const {
    auto it = constants.find(1.0f);
    return it != constants.end() && it->second == value;
  }
  int32_t append(Instruction inst) {
    program.instructions.push_back(std::move(inst));
    return static_cast<int32_t>(program.instructions.size() - 1);
  }

  expr::Program &program;
  std::map<float, int32_t> constants;
};

} // namespace

Status appendScoreDerivative(expr::Program &program) {
  if (!program.isScoreMod)
    return Status::failure("'" + program.name + "' is not a score_mod");
  const size_t originalCount = program.instructions.size();
  std::vector<int32_t> d(originalCount, -1);
  DerivativeBuilder b(program);
  constexpr float kLn2 = 0.693147180559945309f;
  constexpr float kTwoOverSqrtPi = 1.128379167095512574f;

  for (size_t n = 0; n < originalCount; ++n) {
    // Copy: appending may reallocate the instruction vector.
    const Instruction inst = program.instructions[n];
    const int32_t r = static_cast<int32_t>(n);
    auto x = [&](int k) { return inst.operands[k]; };
    auto dx = [&](int k) { return d[inst.operands[k]]; };
    bool dependent = false;
    for (int32_t operand : inst.operands)
      dependent = dependent || d[operand] >= 0;
    if (inst.op == Opcode::Argument && inst.imm == 0) {
      d[n] = b.constant(1.0f);
      continue;
    }
    if (!dependent)
      continue;
    if (const char *name = nonDifferentiableOpName(inst.op))
      return Status::failure(
          (inst.location.empty() ? program.name : inst.location) + ": error: '" +
          name + "' is not differentiable with respect to the score; the "
          "backward kernel needs d(score_mod)/d(score) of '" + program.name + "'");
    if (!expr::isFloat(inst.type) && inst.op != Opcode::CmpF)
      return Status::failure(
          (inst.location.empty() ? program.name : inst.location) +
          ": error: an integer value computed from the score is not "
          "differentiable; the backward kernel needs d(score_mod)/d(score) of '" +
          program.name + "'");

    switch (inst.op) {
    case Opcode::CmpF: // piecewise constant: no derivative flows
      break;
    case Opcode::AddF: d[n] = b.add(dx(0), dx(1)); break;
    case Opcode::SubF:
      d[n] = b.add(dx(0), dx(1) < 0 ? -1 : b.op(Opcode::NegF, {dx(1)}));
      break;
    case Opcode::MulF: d[n] = b.add(b.scale(x(1), dx(0)), b.scale(x(0), dx(1))); break;
    case Opcode::DivF: {
      // d(a/b) = (da - r db) / b
      int32_t numerator = b.add(dx(0), dx(1) < 0 ? -1
                                                 : b.op(Opcode::NegF, {b.mul(r, dx(1))}));
      d[n] = b.op(Opcode::DivF, {numerator, x(1)});
      break;
    }
    case Opcode::NegF: d[n] = b.op(Opcode::NegF, {dx(0)}); break;
    case Opcode::ExtF:
    case Opcode::TruncF: d[n] = dx(0); break;
    case Opcode::Select:
      d[n] = b.op(Opcode::Select, {x(0), b.orZero(dx(1)), b.orZero(dx(2))});
      break;
    case Opcode::MaximumF:
    case Opcode::MaxNumF:
    case Opcode::MinimumF:
    case Opcode::MinNumF: {
      bool isMax = inst.op == Opcode::MaximumF || inst.op == Opcode::MaxNumF;
      int32_t firstWins = b.op(Opcode::CmpF, {x(0), x(1)}, isMax ? 3 /*oge*/ : 5 /*ole*/,
                               ScalarType::I1);
      d[n] = b.op(Opcode::Select, {firstWins, b.orZero(dx(0)), b.orZero(dx(1))});
      break;
    }
    case Opcode::AbsF: {
      int32_t negative = b.op(Opcode::CmpF, {x(0), b.constant(0.0f)}, 4 /*olt*/, ScalarType::I1);
      d[n] = b.op(Opcode::Select, {negative, b.op(Opcode::NegF, {dx(0)}), dx(0)});
      break;
    }
    case Opcode::Exp: d[n] = b.mul(r, dx(0)); break;
    case Opcode::Exp2: d[n] = b.mul(b.mul(r, b.constant(kLn2)), dx(0)); break;
    case Opcode::ExpM1: d[n] = b.mul(b.op(Opcode::AddF, {r, b.constant(1.0f)}), dx(0)); break;
    case Opcode::Log: d[n] = b.op(Opcode::DivF, {dx(0), x(0)}); break;
    case Opcode::Log2:
      d[n] = b.op(Opcode::DivF, {dx(0), b.mul(x(0), b.constant(kLn2))});
      break;
    case Opcode::Log1p:
      d[n] = b.op(Opcode::DivF, {dx(0), b.op(Opcode::AddF, {x(0), b.constant(1.0f)})});
      break;
    case Opcode::Sqrt:
      d[n] = b.op(Opcode::DivF, {dx(0), b.mul(b.constant(2.0f), r)});
      break;
    case Opcode::Rsqrt: // -r^3 / 2
      d[n] = b.mul(b.mul(b.constant(-0.5f), b.mul(r, b.mul(r, r))), dx(0));
      break;
    case Opcode::Tanh:
      d[n] = b.mul(b.op(Opcode::SubF, {b.constant(1.0f), b.mul(r, r)}), dx(0));
      break;
    case Opcode::Sin: d[n] = b.mul(b.op(Opcode::Cos, {x(0)}), dx(0)); break;
    case Opcode::Cos:
      d[n] = b.mul(b.op(Opcode::NegF, {b.op(Opcode::Sin, {x(0)})}), dx(0));
      break;
    case Opcode::Erf: {
      int32_t square = b.mul(x(0), x(0));
      int32_t gaussian = b.op(Opcode::Exp, {b.op(Opcode::NegF, {square})});
      d[n] = b.mul(b.mul(b.constant(kTwoOverSqrtPi), gaussian), dx(0));
      break;
    }
    case Opcode::PowF: {
      // d(a^e) = e a^(e-1) da + a^e ln(a) de
      int32_t viaBase = -1, viaExponent = -1;
      if (dx(0) >= 0) {
        int32_t lowered = b.op(Opcode::PowF, {x(0), b.op(Opcode::SubF, {x(1), b.constant(1.0f)})});
        viaBase = b.mul(b.mul(x(1), lowered), dx(0));
      }
      if (dx(1) >= 0)
        viaExponent = b.mul(b.mul(r, b.op(Opcode::Log, {x(0)})), dx(1));
      d[n] = b.add(viaBase, viaExponent);
      break;
    }
    case Opcode::Fma:
      d[n] = b.add(b.add(b.scale(x(1), dx(0)), b.scale(x(0), dx(1))), dx(2));
      break;
    default:
      return Status::failure(
          (inst.location.empty() ? program.name : inst.location) +
          ": error: no derivative rule for '" + expr::toString(inst.op) + "'");
    }
  }
  program.scoreDerivative = b.orZero(d[program.result]);
  return Status::success();
}

} // namespace dflex::codegen
