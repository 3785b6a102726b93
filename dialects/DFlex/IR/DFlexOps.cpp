//===- DFlexOps.cpp - dflex operations ------------------------------------===//

#include "DFlex/IR/DFlexOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/Matchers.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>

using namespace mlir;
using namespace mlir::dflex;

#include "DFlex/IR/DFlexInterfaces.cpp.inc"
#include "DFlex/IR/DFlexOpsEnums.cpp.inc"

#define GET_OP_CLASSES
#include "DFlex/IR/DFlexOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Supported body types and ops
//===----------------------------------------------------------------------===//

bool mlir::dflex::isSupportedBodyType(Type type) {
  if (type.isIndex() || type.isF32() || type.isF16() || type.isBF16())
    return true;
  if (auto intType = dyn_cast<IntegerType>(type))
    return intType.isSignless() &&
           llvm::is_contained({1u, 8u, 16u, 32u, 64u}, intType.getWidth());
  return false;
}

bool mlir::dflex::isSupportedBodyOp(Operation *op) {
  return isa<
      // arith
      arith::ConstantOp, arith::AddIOp, arith::SubIOp, arith::MulIOp,
      arith::DivSIOp, arith::DivUIOp, arith::CeilDivSIOp, arith::CeilDivUIOp,
      arith::FloorDivSIOp, arith::RemSIOp, arith::RemUIOp, arith::MaxSIOp,
      arith::MinSIOp, arith::MaxUIOp, arith::MinUIOp, arith::AndIOp,
      arith::OrIOp, arith::XOrIOp, arith::ShLIOp, arith::ShRSIOp,
      arith::ShRUIOp, arith::CmpIOp, arith::CmpFOp, arith::SelectOp,
      arith::IndexCastOp, arith::IndexCastUIOp, arith::ExtSIOp, arith::ExtUIOp,
      arith::TruncIOp, arith::SIToFPOp, arith::UIToFPOp, arith::FPToSIOp,
      arith::FPToUIOp, arith::ExtFOp, arith::TruncFOp, arith::AddFOp,
      arith::SubFOp, arith::MulFOp, arith::DivFOp, arith::RemFOp,
      arith::NegFOp, arith::MaximumFOp, arith::MinimumFOp, arith::MaxNumFOp,
      arith::MinNumFOp,
      // math
      math::AbsFOp, math::AbsIOp, math::ExpOp, math::Exp2Op, math::ExpM1Op,
      math::LogOp, math::Log2Op, math::Log1pOp, math::SqrtOp, math::RsqrtOp,
      math::TanhOp, math::SinOp, math::CosOp, math::ErfOp, math::PowFOp,
      math::FmaOp, math::FloorOp, math::CeilOp, math::TruncOp, math::RoundOp,
      math::CopySignOp,
      // dflex
      ReadOp, DimOp, CallOp, YieldOp>(op);
}

/// Captures are tensors with dynamic dimensions of i32/i64/f32/bf16, or
/// scalars of index/i1/i32/i64/f32.
static bool isValidCaptureType(Type type) {
  if (auto tensor = dyn_cast<RankedTensorType>(type)) {
    Type element = tensor.getElementType();
    return tensor.getRank() > 0 &&
           llvm::all_of(tensor.getShape(), ShapedType::isDynamic) &&
           (element.isInteger(32) || element.isInteger(64) || element.isF32() ||
            element.isBF16());
  }
  return type.isIndex() || type.isInteger(1) || type.isInteger(32) ||
         type.isInteger(64) || type.isF32();
}

//===----------------------------------------------------------------------===//
// Mask and score_mod: shared parsing, printing and verification
//===----------------------------------------------------------------------===//

static constexpr llvm::StringLiteral kLeadingArgumentNames[] = {
    "score", "b", "h", "q_idx", "kv_idx"};

/// The canonical name of leading argument `i` of a body op.
static StringRef leadingArgumentName(BodyOpInterface op, unsigned i) {
  return kLeadingArgumentNames[i + (op.hasScoreArgument() ? 0 : 1)];
}

static ParseResult parseBodyOp(OpAsmParser &parser, OperationState &result,
                               StringRef opName, unsigned numLeading) {
  StringAttr symName;
  if (parser.parseSymbolName(symName, SymbolTable::getSymbolAttrName(),
                             result.attributes))
    return failure();

  SMLoc argsLoc = parser.getCurrentLocation();
  SmallVector<OpAsmParser::Argument> arguments;
  if (parser.parseArgumentList(arguments, OpAsmParser::Delimiter::Paren,
                               /*allowType=*/true))
    return failure();
  if (arguments.size() != numLeading)
    return parser.emitError(argsLoc)
           << "'" << opName << "' takes " << numLeading << " arguments ("
           << (numLeading == 5 ? "score, " : "") << "b, h, q_idx, kv_idx), got "
           << arguments.size();

  SmallVector<Attribute> captureNames;
  if (succeeded(parser.parseOptionalKeyword("captures"))) {
    SmallVector<OpAsmParser::Argument> captures;
    if (parser.parseArgumentList(captures, OpAsmParser::Delimiter::Paren,
                                 /*allowType=*/true))
      return failure();
    for (OpAsmParser::Argument &capture : captures) {
      StringRef name = capture.ssaName.name.drop_front(); // drop the '%'
      captureNames.push_back(parser.getBuilder().getStringAttr(name));
      arguments.push_back(capture);
    }
  }

  SMLoc attrLoc = parser.getCurrentLocation();
  if (parser.parseOptionalAttrDictWithKeyword(result.attributes))
    return failure();
  StringRef captureNamesAttr = "capture_names";
  if (result.attributes.get(captureNamesAttr))
    return parser.emitError(attrLoc)
           << "'capture_names' is derived from the captures list and cannot be "
              "given as an attribute";
  result.addAttribute(captureNamesAttr,
                      parser.getBuilder().getArrayAttr(captureNames));

  Region *body = result.addRegion();
  return parser.parseRegion(*body, arguments, /*enableNameShadowing=*/false);
}

static void printBodyOp(OpAsmPrinter &p, BodyOpInterface op) {
  p << ' ';
  p.printSymbolName(
      op->getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName()).getValue());
  Block &block = op.getBodyBlock();
  auto printArguments = [&](ArrayRef<BlockArgument> arguments) {
    p << '(';
    llvm::interleaveComma(arguments, p, [&](BlockArgument argument) {
      p.printRegionArgument(argument);
    });
    p << ')';
  };
  printArguments(block.getArguments().take_front(op.getNumLeadingArguments()));
  if (!op.getCaptureArguments().empty()) {
    p << " captures";
    printArguments(op.getCaptureArguments());
  }
  p.printOptionalAttrDictWithKeyword(
      op->getAttrs(), {SymbolTable::getSymbolAttrName(), "capture_names"});
  p << ' ';
  p.printRegion(op->getRegion(0), /*printEntryBlockArgs=*/false,
                /*printBlockTerminators=*/true);
}

static void nameBodyArguments(BodyOpInterface op, OpAsmSetValueNameFn setName) {
  Block &block = op.getBodyBlock();
  unsigned numLeading = op.getNumLeadingArguments();
  for (auto [i, argument] : llvm::enumerate(block.getArguments())) {
    if (i < numLeading)
      setName(argument, leadingArgumentName(op, i));
    else if (i - numLeading < op.getCaptureNamesAttr().size())
      setName(argument, op.getCaptureName(i - numLeading));
  }
}

/// Checks the signature, the captures, the terminator and every op of a body.
static LogicalResult verifyBodyOp(BodyOpInterface op) {
  Region &region = op->getRegion(0);
  if (region.empty())
    return op->emitOpError("requires a body");
  Block &block = region.front();
  unsigned numLeading = op.getNumLeadingArguments();
  ArrayAttr captureNames = op.getCaptureNamesAttr();
  if (block.getNumArguments() != numLeading + captureNames.size())
    return op->emitOpError("has ")
           << block.getNumArguments() << " block arguments but " << numLeading
           << " leading arguments and " << captureNames.size() << " captures";

  for (unsigned i = 0; i < numLeading; ++i) {
    BlockArgument argument = block.getArgument(i);
    bool isScore = op.hasScoreArgument() && i == 0;
    Type expected = isScore ? Type(Float32Type::get(op->getContext()))
                            : Type(IndexType::get(op->getContext()));
    if (argument.getType() != expected)
      return emitError(argument.getLoc())
             << "argument #" << i << " ('" << leadingArgumentName(op, i)
             << "') of '" << op->getName() << "' must be " << expected
             << ", got " << argument.getType();
  }

  llvm::SmallDenseSet<StringRef> seenNames;
  for (auto [i, capture] : llvm::enumerate(op.getCaptureArguments())) {
    StringRef name = op.getCaptureName(i);
    if (!seenNames.insert(name).second)
      return emitError(capture.getLoc()) << "duplicate capture '" << name << "'";
    if (llvm::is_contained(kLeadingArgumentNames, name))
      return emitError(capture.getLoc())
             << "capture name '" << name
             << "' is reserved for a leading argument (score, b, h, q_idx, "
                "kv_idx)";
    if (name.empty() || !(llvm::isAlpha(name.front()) || name.front() == '_'))
      return emitError(capture.getLoc())
             << "capture name '" << name
             << "' must start with a letter or '_': captures are bound by name";
    if (!isValidCaptureType(capture.getType()))
      return emitError(capture.getLoc())
             << "capture '" << name << "' has type " << capture.getType()
             << "; a capture must be a tensor with dynamic dimensions of i32, "
                "i64, f32 or bf16 (e.g. tensor<?x?xi32>), or a scalar of type "
                "index, i1, i32, i64 or f32";
    if (!isa<TensorType>(capture.getType()))
      continue;
    for (Operation *user : capture.getUsers())
      if (!isa<ReadOp, DimOp, CallOp>(user))
        return user->emitOpError("uses captured tensor '")
               << name
               << "'; a captured tensor can only be read with dflex.read, sized "
                  "with dflex.dim or passed to dflex.call";
  }

  if (block.empty() || !isa<YieldOp>(block.back()))
    return op->emitOpError("body must end with 'dflex.yield'");

  for (Operation &inner : block.without_terminator()) {
    if (!isMemoryEffectFree(&inner))
      return inner.emitOpError("has side effects; '")
             << op->getName() << "' bodies must be pure";
    StringRef dialect = inner.getName().getDialectNamespace();
    if (dialect != "arith" && dialect != "math" && dialect != "dflex")
      return inner.emitOpError("is not allowed in a '")
             << op->getName()
             << "' body: only arith, math and dflex ops may appear";
    if (!isSupportedBodyOp(&inner))
      return inner.emitOpError("is not supported in a '")
             << op->getName() << "' body";
    for (Type type : inner.getResultTypes())
      if (!isSupportedBodyType(type))
        return inner.emitOpError("produces a value of type ")
               << type
               << ", which dflex bodies do not support (index, i1, i8, i16, "
                  "i32, i64, f16, bf16 and f32 are supported)";
    for (Value operand : inner.getOperands())
      if (!isSupportedBodyType(operand.getType()) &&
          !isa<ReadOp, DimOp, CallOp>(inner))
        return inner.emitOpError("takes a value of type ")
               << operand.getType()
               << ", which dflex bodies do not support (index, i1, i8, i16, "
                  "i32, i64, f16, bf16 and f32 are supported)";
  }
  return success();
}

Type MaskOp::getBodyYieldType(MLIRContext *context) {
  return IntegerType::get(context, 1);
}
ParseResult MaskOp::parse(OpAsmParser &parser, OperationState &result) {
  return parseBodyOp(parser, result, getOperationName(), kNumLeadingArguments);
}
void MaskOp::print(OpAsmPrinter &p) { printBodyOp(p, *this); }
void MaskOp::getAsmBlockArgumentNames(Region &, OpAsmSetValueNameFn setName) {
  nameBodyArguments(*this, setName);
}
LogicalResult MaskOp::verifyRegions() { return verifyBodyOp(*this); }

Type ScoreModOp::getBodyYieldType(MLIRContext *context) {
  return Float32Type::get(context);
}
ParseResult ScoreModOp::parse(OpAsmParser &parser, OperationState &result) {
  return parseBodyOp(parser, result, getOperationName(), kNumLeadingArguments);
}
void ScoreModOp::print(OpAsmPrinter &p) { printBodyOp(p, *this); }
void ScoreModOp::getAsmBlockArgumentNames(Region &,
                                          OpAsmSetValueNameFn setName) {
  nameBodyArguments(*this, setName);
}
LogicalResult ScoreModOp::verifyRegions() { return verifyBodyOp(*this); }

//===----------------------------------------------------------------------===//
// YieldOp
//===----------------------------------------------------------------------===//

LogicalResult YieldOp::verify() {
  auto parent = cast<BodyOpInterface>((*this)->getParentOp());
  Type expected = parent.getYieldType();
  if (getValue().getType() != expected)
    return emitOpError("yields ")
           << getValue().getType() << " but '" << parent->getName()
           << "' must yield " << expected;
  return success();
}

//===----------------------------------------------------------------------===//
// ReadOp
//===----------------------------------------------------------------------===//

TypedAttr ReadOp::getPaddingOrZero() {
  if (auto padding = getPaddingAttr())
    return padding;
  return cast<TypedAttr>(Builder(getContext()).getZeroAttr(getType()));
}

// dflex.read %tensor[%i, ...] (padding LITERAL)? attr-dict : tensor-type
ParseResult ReadOp::parse(OpAsmParser &parser, OperationState &result) {
  OpAsmParser::UnresolvedOperand tensor;
  SmallVector<OpAsmParser::UnresolvedOperand> indices;
  if (parser.parseOperand(tensor) ||
      parser.parseOperandList(indices, OpAsmParser::Delimiter::Square))
    return failure();

  // The literal is read before its type is known; it is typed below.
  std::optional<APInt> intPadding;
  std::optional<double> floatPadding;
  SMLoc paddingLoc;
  if (succeeded(parser.parseOptionalKeyword("padding"))) {
    paddingLoc = parser.getCurrentLocation();
    APInt value;
    OptionalParseResult isInt = parser.parseOptionalInteger(value);
    if (isInt.has_value()) {
      if (failed(*isInt))
        return failure();
      intPadding = value;
    } else {
      double value;
      if (parser.parseFloat(value))
        return failure();
      floatPadding = value;
    }
  }

  RankedTensorType tensorType;
  if (parser.parseOptionalAttrDict(result.attributes) || parser.parseColon() ||
      parser.parseType(tensorType))
    return failure();
  Type elementType = tensorType.getElementType();
  Builder &builder = parser.getBuilder();
  if (intPadding) {
    if (!elementType.isIntOrIndex())
      return parser.emitError(paddingLoc, "padding for a tensor of ")
             << elementType << " must be a float literal";
    unsigned width = elementType.getIntOrFloatBitWidth();
    if (intPadding->getSignificantBits() > width)
      return parser.emitError(paddingLoc, "padding ")
             << intPadding->getSExtValue() << " does not fit in " << elementType;
    result.addAttribute(getPaddingAttrName(result.name),
                        builder.getIntegerAttr(elementType,
                                               intPadding->sextOrTrunc(width)));
  } else if (floatPadding) {
    if (!isa<FloatType>(elementType))
      return parser.emitError(paddingLoc, "padding for a tensor of ")
             << elementType << " must be an integer literal";
    result.addAttribute(getPaddingAttrName(result.name),
                        builder.getFloatAttr(elementType, *floatPadding));
  }

  result.addTypes(elementType);
  return failure(
      parser.resolveOperand(tensor, tensorType, result.operands) ||
      parser.resolveOperands(indices, builder.getIndexType(), result.operands));
}

void ReadOp::print(OpAsmPrinter &p) {
  p << ' ' << getTensor() << '[' << getIndices() << ']';
  if (auto padding = getPaddingAttr()) {
    p << " padding ";
    if (auto intPadding = dyn_cast<IntegerAttr>(padding))
      p << intPadding.getValue().getSExtValue();
    else
      p.printFloat(cast<FloatAttr>(padding).getValue());
  }
  p.printOptionalAttrDict((*this)->getAttrs(), {getPaddingAttrName()});
  p << " : " << getTensor().getType();
}

LogicalResult ReadOp::verify() {
  auto tensorType = cast<RankedTensorType>(getTensor().getType());
  if (static_cast<int64_t>(getIndices().size()) != tensorType.getRank())
    return emitOpError("reads a rank-")
           << tensorType.getRank() << " tensor with " << getIndices().size()
           << (getIndices().size() == 1 ? " index" : " indices");
  if (auto padding = getPaddingAttr()) {
    if (padding.getType() != tensorType.getElementType())
      return emitOpError("padding has type ")
             << padding.getType() << " but the tensor holds "
             << tensorType.getElementType();
    if (!isa<IntegerAttr, FloatAttr>(padding))
      return emitOpError("padding must be an integer or float constant");
  }
  return success();
}

OpFoldResult ReadOp::fold(FoldAdaptor adaptor) {
  // A constant negative index is out of range for every tensor.
  for (Attribute index : adaptor.getIndices())
    if (auto constant = dyn_cast_or_null<IntegerAttr>(index))
      if (constant.getValue().isNegative())
        return getPaddingOrZero();
  return {};
}

//===----------------------------------------------------------------------===//
// DimOp
//===----------------------------------------------------------------------===//

LogicalResult DimOp::verify() {
  auto tensorType = cast<RankedTensorType>(getTensor().getType());
  if (getDimension().getSExtValue() < 0 ||
      getDimension().getSExtValue() >= tensorType.getRank())
    return emitOpError("dimension ")
           << getDimension().getSExtValue() << " is out of range for a rank-"
           << tensorType.getRank() << " tensor";
  return success();
}

//===----------------------------------------------------------------------===//
// CallOp
//===----------------------------------------------------------------------===//

/// Searches, breadth first, for a chain of calls from `from` back to
/// `target`; returns the callee names along the shortest one (ending with
/// `target`'s), or nothing. Iterative: long call chains cannot overflow the
/// stack.
static std::optional<SmallVector<StringRef>>
findCallChain(BodyOpInterface from, Operation *target,
              SymbolTableCollection &symbolTable) {
  // For each reached body: the body it was called from and the callee name.
  llvm::DenseMap<Operation *, std::pair<Operation *, StringRef>> reachedFrom;
  reachedFrom[from] = {nullptr, StringRef()};
  SmallVector<Operation *> queue{from};
  for (size_t next = 0; next < queue.size(); ++next) {
    Operation *current = queue[next];
    Operation *found = nullptr;
    current->walk([&](CallOp call) {
      auto callee = symbolTable.lookupNearestSymbolFrom<BodyOpInterface>(
          call, call.getCalleeAttr());
      if (!callee || reachedFrom.count(callee))
        return WalkResult::advance();
      reachedFrom[callee] = {current, call.getCallee()};
      if (callee.getOperation() == target) {
        found = callee;
        return WalkResult::interrupt();
      }
      queue.push_back(callee);
      return WalkResult::advance();
    });
    if (!found)
      continue;
    SmallVector<StringRef> chain;
    for (Operation *op = found; op != from; op = reachedFrom[op].first)
      chain.push_back(reachedFrom[op].second);
    std::reverse(chain.begin(), chain.end());
    return chain;
  }
  return std::nullopt;
}

LogicalResult CallOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  Operation *target =
      symbolTable.lookupNearestSymbolFrom(*this, getCalleeAttr());
  if (!target)
    return emitOpError("'@") << getCallee() << "' does not name a symbol";
  auto callee = dyn_cast<BodyOpInterface>(target);
  if (!callee)
    return emitOpError("'@") << getCallee() << "' is a '" << target->getName()
                             << "', expected a dflex.mask or dflex.score_mod";

  Block &calleeBlock = callee.getBodyBlock();
  if (getOperands().size() != calleeBlock.getNumArguments())
    return emitOpError("passes ")
           << getOperands().size() << " arguments but '@" << getCallee()
           << "' takes " << calleeBlock.getNumArguments() << " ("
           << callee.getNumLeadingArguments() << " leading arguments and "
           << callee.getCaptureArguments().size() << " captures)";
  for (auto [i, operand, parameter] :
       llvm::enumerate(getOperands(), calleeBlock.getArguments()))
    if (operand.getType() != parameter.getType())
      return emitOpError("argument #")
             << i << " has type " << operand.getType() << " but '@"
             << getCallee() << "' expects " << parameter.getType();
  if (getType() != callee.getYieldType())
    return emitOpError("result type ")
           << getType() << " does not match '@" << getCallee() << "', which yields "
           << callee.getYieldType();

  auto caller = (*this)->getParentOfType<BodyOpInterface>();
  std::optional<SmallVector<StringRef>> cycle;
  if (callee.getOperation() == caller.getOperation())
    cycle.emplace();
  else
    cycle = findCallChain(callee, caller, symbolTable);
  if (!cycle)
    return success();
  InFlightDiagnostic diag = emitOpError("makes a recursive call: @")
                            << SymbolTable::getSymbolName(caller).getValue()
                            << " -> @" << getCallee();
  for (StringRef name : *cycle)
    diag << " -> @" << name;
  return diag;
}

//===----------------------------------------------------------------------===//
// Kernel specs
//===----------------------------------------------------------------------===//

static LogicalResult verifyScale(Operation *op, FloatAttr scale) {
  if (scale && !(std::isfinite(scale.getValueAsDouble()) &&
                 scale.getValueAsDouble() > 0))
    return op->emitOpError("scale must be positive and finite, got ")
           << scale.getValueAsDouble();
  return success();
}

static LogicalResult verifyDim(Operation *op, StringRef name, int64_t dim,
                               ArrayRef<int64_t> supported) {
  if (llvm::is_contained(supported, dim))
    return success();
  InFlightDiagnostic diag = op->emitOpError()
                            << name << " " << dim << " is not supported: use ";
  llvm::interleave(
      supported, [&](int64_t d) { diag << d; }, [&] { diag << ", "; });
  return diag;
}

float AttentionOp::getSoftmaxScale() {
  if (auto scale = getScaleAttr())
    return scale.getValueAsDouble();
  return 1.0f / std::sqrt(static_cast<float>(getQkHeadDim()));
}

LogicalResult AttentionOp::verify() {
  if (getNumQHeads() % getNumKvHeads() != 0)
    return emitOpError("query heads (")
           << getNumQHeads() << ") must be a multiple of key/value heads ("
           << getNumKvHeads() << ")";
  if (failed(verifyDim(*this, "qk_head_dim", getQkHeadDim(), {64, 128, 256})) ||
      failed(verifyDim(*this, "v_head_dim", getVHeadDim(), {64, 128, 256})))
    return failure();
  return verifyScale(*this, getScaleAttr());
}

/// Looks up `symbol` and checks it names an op of kind `OpTy`.
template <typename OpTy>
static FailureOr<OpTy> lookupSpecOperand(Operation *spec, StringRef role,
                                         FlatSymbolRefAttr symbol,
                                         SymbolTableCollection &symbolTable) {
  Operation *target = symbolTable.lookupNearestSymbolFrom(spec, symbol);
  if (!target)
    return spec->emitOpError()
           << role << " '" << symbol << "' does not name a symbol";
  auto typed = dyn_cast<OpTy>(target);
  if (!typed)
    return spec->emitOpError()
           << role << " '" << symbol << "' is a '" << target->getName()
           << "', expected a '" << OpTy::getOperationName() << "'";
  return typed;
}

LogicalResult
AttentionOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  FailureOr<MaskOp> mask =
      lookupSpecOperand<MaskOp>(*this, "mask", getMaskAttr(), symbolTable);
  if (failed(mask))
    return failure();
  if (!getScoreModAttr())
    return success();
  FailureOr<ScoreModOp> scoreMod = lookupSpecOperand<ScoreModOp>(
      *this, "score_mod", getScoreModAttr(), symbolTable);
  if (failed(scoreMod))
    return failure();

  // The kernel binds captures by name: a name shared by the mask and the
  // score_mod is one value and must have one type.
  auto maskBody = cast<BodyOpInterface>(mask->getOperation());
  auto modBody = cast<BodyOpInterface>(scoreMod->getOperation());
  for (auto [i, maskCapture] : llvm::enumerate(maskBody.getCaptureArguments()))
    for (auto [j, modCapture] : llvm::enumerate(modBody.getCaptureArguments()))
      if (maskBody.getCaptureName(i) == modBody.getCaptureName(j) &&
          maskCapture.getType() != modCapture.getType())
        return emitOpError("capture '")
               << maskBody.getCaptureName(i) << "' is " << maskCapture.getType()
               << " in mask '" << getMaskAttr() << "' but "
               << modCapture.getType() << " in score_mod '"
               << getScoreModAttr() << "'";
  return success();
}

float GatedDeltaOp::getOutputScale() {
  if (auto scale = getScaleAttr())
    return scale.getValueAsDouble();
  return 1.0f / std::sqrt(static_cast<float>(getKeyDim()));
}

LogicalResult GatedDeltaOp::verify() {
  if (getNumValueHeads() % getNumKeyHeads() != 0)
    return emitOpError("value heads (")
           << getNumValueHeads() << ") must be a multiple of key heads ("
           << getNumKeyHeads() << ")";
  if (failed(verifyDim(*this, "key_dim", getKeyDim(), {64, 128})) ||
      failed(verifyDim(*this, "value_dim", getValueDim(), {64, 128})))
    return failure();
  if (getGate() == GateKind::ChannelLog)
    return emitOpError("gate(channel_log) is not supported: the chunked kernels "
                       "implement gate(scalar_log) and gate(none)");
  if (getInKernelGate() && getGate() != GateKind::ScalarLog)
    return emitOpError("in_kernel_gate computes a scalar log-space gate and "
                       "requires gate(scalar_log), got gate(")
           << stringifyGateKind(getGate()) << ")";
  return verifyScale(*this, getScaleAttr());
}
