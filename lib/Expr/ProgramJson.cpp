//===- ProgramJson.cpp - programs in bundle manifests ---------------------===//

#include "dflex/Expr/ProgramJson.h"
#include "dflex/Expr/Semantics.h"

#include <optional>

namespace dflex::expr {

namespace {

constexpr int kNumOpcodes = static_cast<int>(Opcode::CopySign) + 1;
constexpr ScalarType kScalarTypes[] = {
    ScalarType::I1,    ScalarType::I8,  ScalarType::I16,
    ScalarType::I32,   ScalarType::I64, ScalarType::Index,
    ScalarType::F16,   ScalarType::BF16, ScalarType::F32};

std::optional<Opcode> opcodeNamed(const std::string &name) {
  for (int i = 0; i < kNumOpcodes; ++i)
    if (name == toString(static_cast<Opcode>(i)))
      return static_cast<Opcode>(i);
  return std::nullopt;
}

std::optional<ScalarType> typeNamed(const std::string &name) {
  for (ScalarType type : kScalarTypes)
    if (name == toString(type))
      return type;
  return std::nullopt;
}

int64_t floatBitsOf(float f) { return static_cast<int64_t>(sem::floatBits(f)); }
float floatOfBits(int64_t bits) { return sem::bitsFloat(static_cast<unsigned>(bits)); }

/// Field accessors that report what is missing or mistyped.
struct Reader {
  const JsonValue &object;
  std::string where;

  Result<const JsonValue *> field(const char *name) const {
    const JsonValue *value = object.isObject() ? object.find(name) : nullptr;
    if (!value)
      return Status::failure(where + ": missing '" + name + "'");
    return value;
  }
  Result<int64_t> integer(const char *name) const {
    auto value = field(name);
    if (!value.ok())
      return value.status();
    if (!value.value()->isInteger())
      return Status::failure(where + ": '" + name + "' must be an integer");
    return value.value()->asInteger();
  }
  Result<std::string> string(const char *name) const {
    auto value = field(name);
    if (!value.ok())
      return value.status();
    if (!value.value()->isString())
      return Status::failure(where + ": '" + name + "' must be a string");
    return value.value()->asString();
  }
  int64_t integerOr(const char *name, int64_t fallback) const {
    const JsonValue *value = object.find(name);
    return value && value->isInteger() ? value->asInteger() : fallback;
  }
};

} // namespace

int operandCount(Opcode op, int readRank) {
  switch (op) {
  case Opcode::Argument:
  case Opcode::Capture:
  case Opcode::Constant:
  case Opcode::Dim:
    return 0;
  case Opcode::Read:
    return readRank;
  case Opcode::Select:
  case Opcode::Fma:
    return 3;
  case Opcode::AbsI: case Opcode::ExtSI: case Opcode::ExtUI: case Opcode::TruncI:
  case Opcode::IndexCast: case Opcode::IndexCastUI: case Opcode::SIToFP:
  case Opcode::UIToFP: case Opcode::FPToSI: case Opcode::FPToUI: case Opcode::ExtF:
  case Opcode::TruncF: case Opcode::NegF: case Opcode::AbsF: case Opcode::Exp:
  case Opcode::Exp2: case Opcode::ExpM1: case Opcode::Log: case Opcode::Log2:
  case Opcode::Log1p: case Opcode::Sqrt: case Opcode::Rsqrt: case Opcode::Tanh:
  case Opcode::Sin: case Opcode::Cos: case Opcode::Erf: case Opcode::Floor:
  case Opcode::Ceil: case Opcode::Trunc: case Opcode::Round:
    return 1;
  default:
    return 2;
  }
}

JsonValue toJson(const Program &program) {
  JsonValue json = JsonValue::object();
  json["name"] = program.name;
  json["kind"] = program.isScoreMod ? "score_mod" : "mask";
  JsonValue captures = JsonValue::array();
  for (const CaptureDecl &capture : program.captures) {
    JsonValue c = JsonValue::object();
    c["name"] = capture.name;
    c["tensor"] = capture.isTensor;
    c["type"] = toString(capture.elementType);
    c["rank"] = capture.rank;
    captures.push(std::move(c));
  }
  json["captures"] = std::move(captures);
  JsonValue instructions = JsonValue::array();
  for (const Instruction &inst : program.instructions) {
    JsonValue i = JsonValue::object();
    i["op"] = toString(inst.op);
    i["type"] = toString(inst.type);
    if (!inst.operands.empty()) {
      JsonValue operands = JsonValue::array();
      for (int32_t operand : inst.operands)
        operands.push(static_cast<int64_t>(operand));
      i["operands"] = std::move(operands);
    }
    if (inst.imm)
      i["imm"] = inst.imm;
    if (inst.imm2)
      i["imm2"] = inst.imm2;
    if (inst.fimm != 0.0f)
      i["float_bits"] = floatBitsOf(inst.fimm);
    if (inst.hasPadding) {
      i["padding"] = inst.paddingInt;
      i["padding_float_bits"] = floatBitsOf(inst.paddingFloat);
    }
    if (!inst.location.empty())
      i["loc"] = inst.location;
    instructions.push(std::move(i));
  }
  json["instructions"] = std::move(instructions);
  json["result"] = static_cast<int64_t>(program.result);
  json["score_derivative"] = static_cast<int64_t>(program.scoreDerivative);
  return json;
}

Result<Program> programFromJson(const JsonValue &json) {
  Program program;
  Reader top{json, "program"};
  auto name = top.string("name");
  if (!name.ok())
    return name.status();
  program.name = name.value();
  top.where = "program '" + program.name + "'";
  auto kind = top.string("kind");
  if (!kind.ok())
    return kind.status();
  if (kind.value() != "mask" && kind.value() != "score_mod")
    return Status::failure(top.where + ": kind must be 'mask' or 'score_mod'");
  program.isScoreMod = kind.value() == "score_mod";

  auto captures = top.field("captures");
  if (!captures.ok())
    return captures.status();
  if (!captures.value()->isArray())
    return Status::failure(top.where + ": 'captures' must be an array");
  for (const JsonValue &c : captures.value()->asArray()) {
    Reader reader{c, top.where + " capture"};
    CaptureDecl decl;
    auto captureName = reader.string("name");
    auto type = reader.string("type");
    auto rank = reader.integer("rank");
    auto tensor = reader.field("tensor");
    if (!captureName.ok() || !type.ok() || !rank.ok() || !tensor.ok() ||
        !tensor.value()->isBool())
      return Status::failure(reader.where + ": needs name, tensor, type and rank");
    decl.name = captureName.value();
    decl.isTensor = tensor.value()->asBool();
    std::optional<ScalarType> elementType = typeNamed(type.value());
    if (!elementType || rank.value() < 0 || rank.value() > 8 ||
        (decl.isTensor && rank.value() == 0))
      return Status::failure(reader.where + " '" + decl.name +
                             "': bad type or rank");
    decl.elementType = *elementType;
    decl.rank = static_cast<int>(rank.value());
    program.captures.push_back(std::move(decl));
  }

  auto instructions = top.field("instructions");
  if (!instructions.ok())
    return instructions.status();
  if (!instructions.value()->isArray())
    return Status::failure(top.where + ": 'instructions' must be an array");
  for (const JsonValue &i : instructions.value()->asArray()) {
    const size_t n = program.instructions.size();
    Reader reader{i, top.where + " instruction " + std::to_string(n)};
    auto opName = reader.string("op");
    auto typeName = reader.string("type");
    if (!opName.ok())
      return opName.status();
    if (!typeName.ok())
      return typeName.status();
    std::optional<Opcode> op = opcodeNamed(opName.value());
    std::optional<ScalarType> type = typeNamed(typeName.value());
    if (!op)
      return Status::failure(reader.where + ": unknown op '" + opName.value() + "'");
    if (!type)
      return Status::failure(reader.where + ": unknown type '" + typeName.value() + "'");
    Instruction inst;
    inst.op = *op;
    inst.type = *type;
    inst.imm = reader.integerOr("imm", 0);
    inst.imm2 = reader.integerOr("imm2", 0);
    inst.fimm = floatOfBits(reader.integerOr("float_bits", 0));
    if (i.find("padding")) {
      inst.hasPadding = true;
      inst.paddingInt = reader.integerOr("padding", 0);
      inst.paddingFloat = floatOfBits(reader.integerOr("padding_float_bits", 0));
    }
    if (const JsonValue *loc = i.find("loc"); loc && loc->isString())
      inst.location = loc->asString();
    if (const JsonValue *operands = i.find("operands")) {
      if (!operands->isArray())
        return Status::failure(reader.where + ": 'operands' must be an array");
      for (const JsonValue &operand : operands->asArray()) {
        if (!operand.isInteger() || operand.asInteger() < 0 ||
            static_cast<size_t>(operand.asInteger()) >= n)
          return Status::failure(reader.where +
                                 ": operands must name earlier instructions");
        inst.operands.push_back(static_cast<int32_t>(operand.asInteger()));
      }
    }
    // Leaves refer to arguments and captures: check them.
    int readRank = 0;
    switch (inst.op) {
    case Opcode::Argument:
      if (inst.imm < 0 || inst.imm >= program.numLeadingArguments())
        return Status::failure(reader.where + ": no such argument");
      break;
    case Opcode::Capture:
      if (inst.imm < 0 || static_cast<size_t>(inst.imm) >= program.captures.size() ||
          program.captures[inst.imm].isTensor)
        return Status::failure(reader.where + ": not a scalar capture");
      break;
    case Opcode::Read:
    case Opcode::Dim:
      if (inst.imm < 0 || static_cast<size_t>(inst.imm) >= program.captures.size() ||
          !program.captures[inst.imm].isTensor)
        return Status::failure(reader.where + ": not a tensor capture");
      readRank = program.captures[inst.imm].rank;
      if (inst.op == Opcode::Dim && (inst.imm2 < 0 || inst.imm2 >= readRank))
        return Status::failure(reader.where + ": dimension out of range");
      break;
    case Opcode::CmpI:
      if (inst.imm < 0 || inst.imm > 9)
        return Status::failure(reader.where + ": bad cmpi predicate");
      break;
    case Opcode::CmpF:
      if (inst.imm < 0 || inst.imm > 15)
        return Status::failure(reader.where + ": bad cmpf predicate");
      break;
    default:
      break;
    }
    if (static_cast<int>(inst.operands.size()) != operandCount(inst.op, readRank))
      return Status::failure(reader.where + ": '" + opName.value() + "' takes " +
                             std::to_string(operandCount(inst.op, readRank)) +
                             " operands");
    program.instructions.push_back(std::move(inst));
  }

  auto result = top.integer("result");
  if (!result.ok())
    return result.status();
  auto inRange = [&](int64_t index) {
    return index >= 0 && static_cast<size_t>(index) < program.instructions.size();
  };
  if (!inRange(result.value()))
    return Status::failure(top.where + ": result out of range");
  program.result = static_cast<int32_t>(result.value());
  int64_t derivative = top.integerOr("score_derivative", -1);
  if (derivative != -1 && !inRange(derivative))
    return Status::failure(top.where + ": score_derivative out of range");
  program.scoreDerivative = static_cast<int32_t>(derivative);
  return program;
}

} // namespace dflex::expr
