//===- DFlexToProgram.cpp - mask and score_mod bodies to programs --------===//

#include "dflex/Conversion/DFlexToProgram/DFlexToProgram.h"
#include "DFlex/Transforms/Inliner.h"

#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::dflex;
namespace expr = ::dflex::expr;
using expr::Opcode;

expr::ScalarType mlir::dflex::toScalarType(Type type) {
  if (type.isIndex())
    return expr::ScalarType::Index;
  if (type.isF32())
    return expr::ScalarType::F32;
  if (type.isF16())
    return expr::ScalarType::F16;
  if (type.isBF16())
    return expr::ScalarType::BF16;
  switch (type.getIntOrFloatBitWidth()) {
  case 1: return expr::ScalarType::I1;
  case 8: return expr::ScalarType::I8;
  case 16: return expr::ScalarType::I16;
  case 32: return expr::ScalarType::I32;
  default: return expr::ScalarType::I64;
  }
}

namespace {

/// Lowers one call-free body into one program.
class ProgramBuilder {
public:
  explicit ProgramBuilder(expr::Program &program) : program(program) {}

  /// Lowers `block` with its arguments bound to `scalarArgs` (instruction
  /// numbers, -1 for tensors) and `tensorArgs` (capture numbers, -1 for
  /// scalars). Returns the instruction the block yields.
  FailureOr<int32_t> lowerBlock(Block &block, ArrayRef<int32_t> scalarArgs,
                                ArrayRef<int32_t> tensorArgs) {
    llvm::DenseMap<Value, int32_t> scalars, tensors;
    for (auto [i, argument] : llvm::enumerate(block.getArguments())) {
      if (scalarArgs[i] >= 0)
        scalars[argument] = scalarArgs[i];
      if (tensorArgs[i] >= 0)
        tensors[argument] = tensorArgs[i];
    }
    for (Operation &op : block) {
      if (auto yield = dyn_cast<YieldOp>(op))
        return scalars.lookup(yield.getValue());
      FailureOr<int32_t> result = lowerOp(op, scalars, tensors);
      if (failed(result))
        return failure();
      scalars[op.getResult(0)] = *result;
    }
    return block.getParentOp()->emitOpError("body has no dflex.yield");
  }

private:
  int32_t append(expr::Instruction inst, Location loc) {
    if (auto fileLoc = dyn_cast<FileLineColLoc>(loc))
      inst.location = (fileLoc.getFilename().getValue() + ":" +
                       Twine(fileLoc.getLine()) + ":" + Twine(fileLoc.getColumn()))
                          .str();
    program.instructions.push_back(std::move(inst));
    return static_cast<int32_t>(program.instructions.size() - 1);
  }

  FailureOr<int32_t> lowerOp(Operation &op,
                             const llvm::DenseMap<Value, int32_t> &scalars,
                             const llvm::DenseMap<Value, int32_t> &tensors) {
    expr::Instruction inst;
    inst.type = toScalarType(op.getResult(0).getType());
    auto operandWidth = [&](unsigned i) {
      return expr::intWidth(toScalarType(op.getOperand(i).getType()));
    };

    if (auto read = dyn_cast<ReadOp>(op)) {
      inst.op = Opcode::Read;
      inst.imm = tensors.lookup(read.getTensor());
      for (Value index : read.getIndices())
        inst.operands.push_back(scalars.lookup(index));
      if (auto padding = read.getPaddingAttr()) {
        inst.hasPadding = true;
        if (auto intPadding = dyn_cast<IntegerAttr>(padding))
          inst.paddingInt = intPadding.getValue().getSExtValue();
        else
          inst.paddingFloat = cast<FloatAttr>(padding).getValueAsDouble();
      }
      return append(std::move(inst), op.getLoc());
    }
    if (auto dim = dyn_cast<DimOp>(op)) {
      inst.op = Opcode::Dim;
      inst.imm = tensors.lookup(dim.getTensor());
      inst.imm2 = dim.getDimension().getSExtValue();
      return append(std::move(inst), op.getLoc());
    }
    if (auto constant = dyn_cast<arith::ConstantOp>(op)) {
      inst.op = Opcode::Constant;
      if (auto intValue = dyn_cast<IntegerAttr>(constant.getValue()))
        inst.imm = intValue.getValue().getSExtValue(); // i1 true is -1
      else if (auto floatValue = dyn_cast<FloatAttr>(constant.getValue()))
        inst.fimm = floatValue.getValueAsDouble();
      else
        return op.emitOpError("constant of this kind is not supported");
      return append(std::move(inst), op.getLoc());
    }

    for (Value operand : op.getOperands())
      inst.operands.push_back(scalars.lookup(operand));

    std::optional<Opcode> opcode =
        llvm::TypeSwitch<Operation *, std::optional<Opcode>>(&op)
            .Case([](arith::AddIOp) { return Opcode::AddI; })
            .Case([](arith::SubIOp) { return Opcode::SubI; })
            .Case([](arith::MulIOp) { return Opcode::MulI; })
            .Case([](arith::DivSIOp) { return Opcode::DivSI; })
            .Case([](arith::DivUIOp) { return Opcode::DivUI; })
            .Case([](arith::CeilDivSIOp) { return Opcode::CeilDivSI; })
            .Case([](arith::CeilDivUIOp) { return Opcode::CeilDivUI; })
            .Case([](arith::FloorDivSIOp) { return Opcode::FloorDivSI; })
            .Case([](arith::RemSIOp) { return Opcode::RemSI; })
            .Case([](arith::RemUIOp) { return Opcode::RemUI; })
            .Case([](arith::MaxSIOp) { return Opcode::MaxSI; })
            .Case([](arith::MinSIOp) { return Opcode::MinSI; })
            .Case([](arith::MaxUIOp) { return Opcode::MaxUI; })
            .Case([](arith::MinUIOp) { return Opcode::MinUI; })
            .Case([](arith::AndIOp) { return Opcode::AndI; })
            .Case([](arith::OrIOp) { return Opcode::OrI; })
            .Case([](arith::XOrIOp) { return Opcode::XOrI; })
            .Case([](arith::ShLIOp) { return Opcode::ShLI; })
            .Case([](arith::ShRSIOp) { return Opcode::ShRSI; })
            .Case([](arith::ShRUIOp) { return Opcode::ShRUI; })
            .Case([](math::AbsIOp) { return Opcode::AbsI; })
            .Case([&](arith::CmpIOp cmp) {
              inst.imm = static_cast<int64_t>(cmp.getPredicate());
              inst.imm2 = operandWidth(0);
              return Opcode::CmpI;
            })
            .Case([&](arith::CmpFOp cmp) {
              inst.imm = static_cast<int64_t>(cmp.getPredicate());
              return Opcode::CmpF;
            })
            .Case([](arith::SelectOp) { return Opcode::Select; })
            .Case([](arith::ExtSIOp) { return Opcode::ExtSI; })
            .Case([&](arith::ExtUIOp) {
              inst.imm2 = operandWidth(0);
              return Opcode::ExtUI;
            })
            .Case([](arith::TruncIOp) { return Opcode::TruncI; })
            .Case([](arith::IndexCastOp) { return Opcode::IndexCast; })
            .Case([&](arith::IndexCastUIOp) {
              inst.imm2 = operandWidth(0);
              return Opcode::IndexCastUI;
            })
            .Case([](arith::SIToFPOp) { return Opcode::SIToFP; })
            .Case([&](arith::UIToFPOp) {
              inst.imm2 = operandWidth(0);
              return Opcode::UIToFP;
            })
            .Case([](arith::FPToSIOp) { return Opcode::FPToSI; })
            .Case([](arith::FPToUIOp) { return Opcode::FPToUI; })
            .Case([](arith::ExtFOp) { return Opcode::ExtF; })
            .Case([](arith::TruncFOp) { return Opcode::TruncF; })
            .Case([](arith::AddFOp) { return Opcode::AddF; })
            .Case([](arith::SubFOp) { return Opcode::SubF; })
            .Case([](arith::MulFOp) { return Opcode::MulF; })
            .Case([](arith::DivFOp) { return Opcode::DivF; })
            .Case([](arith::RemFOp) { return Opcode::RemF; })
            .Case([](arith::NegFOp) { return Opcode::NegF; })
            .Case([](arith::MaximumFOp) { return Opcode::MaximumF; })
            .Case([](arith::MinimumFOp) { return Opcode::MinimumF; })
            .Case([](arith::MaxNumFOp) { return Opcode::MaxNumF; })
            .Case([](arith::MinNumFOp) { return Opcode::MinNumF; })
            .Case([](math::AbsFOp) { return Opcode::AbsF; })
            .Case([](math::ExpOp) { return Opcode::Exp; })
            .Case([](math::Exp2Op) { return Opcode::Exp2; })
            .Case([](math::ExpM1Op) { return Opcode::ExpM1; })
            .Case([](math::LogOp) { return Opcode::Log; })
            .Case([](math::Log2Op) { return Opcode::Log2; })
            .Case([](math::Log1pOp) { return Opcode::Log1p; })
            .Case([](math::SqrtOp) { return Opcode::Sqrt; })
            .Case([](math::RsqrtOp) { return Opcode::Rsqrt; })
            .Case([](math::TanhOp) { return Opcode::Tanh; })
            .Case([](math::SinOp) { return Opcode::Sin; })
            .Case([](math::CosOp) { return Opcode::Cos; })
            .Case([](math::ErfOp) { return Opcode::Erf; })
            .Case([](math::PowFOp) { return Opcode::PowF; })
            .Case([](math::FmaOp) { return Opcode::Fma; })
            .Case([](math::FloorOp) { return Opcode::Floor; })
            .Case([](math::CeilOp) { return Opcode::Ceil; })
            .Case([](math::TruncOp) { return Opcode::Trunc; })
            .Case([](math::RoundOp) { return Opcode::Round; })
            .Case([](math::CopySignOp) { return Opcode::CopySign; })
            .Default([](Operation *) { return std::nullopt; });
    if (!opcode)
      return op.emitOpError("has no portable form");
    inst.op = *opcode;
    return append(std::move(inst), op.getLoc());
  }

  expr::Program &program;
};

} // namespace

FailureOr<expr::Program> mlir::dflex::lowerToProgram(BodyOpInterface op) {
  // Calls are inlined into a copy of the body, its callees looked up from
  // the original: the module is left as it was.
  OwningOpRef<Operation *> copy = op->clone();
  auto inlined = cast<BodyOpInterface>(*copy);
  if (failed(inlineCalls(inlined, op)))
    return failure();

  expr::Program program;
  program.name = SymbolTable::getSymbolName(op).str();
  program.isScoreMod = op.hasScoreArgument();

  Block &block = inlined.getBodyBlock();
  SmallVector<int32_t> scalarArgs(block.getNumArguments(), -1);
  SmallVector<int32_t> tensorArgs(block.getNumArguments(), -1);
  for (unsigned i = 0; i < op.getNumLeadingArguments(); ++i) {
    expr::Instruction argument;
    argument.op = Opcode::Argument;
    argument.type = toScalarType(block.getArgument(i).getType());
    argument.imm = i;
    program.instructions.push_back(argument);
    scalarArgs[i] = static_cast<int32_t>(program.instructions.size() - 1);
  }
  for (auto [i, capture] : llvm::enumerate(op.getCaptureArguments())) {
    expr::CaptureDecl decl;
    decl.name = op.getCaptureName(i).str();
    unsigned argIndex = op.getNumLeadingArguments() + i;
    if (auto tensor = dyn_cast<RankedTensorType>(capture.getType())) {
      decl.isTensor = true;
      decl.elementType = toScalarType(tensor.getElementType());
      decl.rank = tensor.getRank();
      tensorArgs[argIndex] = i;
    } else {
      decl.elementType = toScalarType(capture.getType());
      expr::Instruction load;
      load.op = Opcode::Capture;
      load.type = decl.elementType;
      load.imm = i;
      program.instructions.push_back(load);
      scalarArgs[argIndex] = static_cast<int32_t>(program.instructions.size() - 1);
    }
    program.captures.push_back(std::move(decl));
  }

  FailureOr<int32_t> result =
      ProgramBuilder(program).lowerBlock(block, scalarArgs, tensorArgs);
  if (failed(result))
    return failure();
  program.result = *result;
  return program;
}
