//===- DFlexInterfaces.td - dflex op interfaces ------------*- tablegen -*-===//

#ifndef DFLEX_INTERFACES_TD
#define DFLEX_INTERFACES_TD

include "mlir/IR/OpBase.td"

def DFlex_BodyOpInterface : OpInterface<"BodyOpInterface"> {
  let cppNamespace = "::mlir::dflex";
  let description = [{
    A function-like op whose single block computes one value from the leading
    index arguments (b, h, q_idx, kv_idx; a score_mod also takes the score
    first) and the captured values that follow them. Analyses, the
    interpreter and codegen see masks and score mods through this interface.
  }];
  let methods = [
    InterfaceMethod<"Number of arguments before the captures.",
      "unsigned", "getNumLeadingArguments", (ins), [{}], [{
        return ConcreteOp::kNumLeadingArguments;
      }]>,
    InterfaceMethod<"Whether the first argument is the score (f32).",
      "bool", "hasScoreArgument", (ins), [{}], [{
        return ConcreteOp::kNumLeadingArguments == 5;
      }]>,
    InterfaceMethod<"The type the body yields.",
      "::mlir::Type", "getYieldType", (ins), [{}], [{
        return ConcreteOp::getBodyYieldType($_op.getContext());
      }]>,
    InterfaceMethod<"The body's only block.",
      "::mlir::Block &", "getBodyBlock", (ins), [{}], [{
        return $_op.getBody().front();
      }]>,
    InterfaceMethod<"The names of the captures, in argument order.",
      "::mlir::ArrayAttr", "getCaptureNamesAttr", (ins), [{}], [{
        return $_op.getCaptureNamesAttr();
      }]>,
  ];
  let extraClassDeclaration = [{
    /// The block arguments that hold captured values.
    ::llvm::ArrayRef<::mlir::BlockArgument> getCaptureArguments() {
      return getBodyBlock().getArguments().drop_front(getNumLeadingArguments());
    }
    /// The index arguments (b, h, q_idx, kv_idx).
    ::llvm::ArrayRef<::mlir::BlockArgument> getIndexArguments() {
      return getBodyBlock().getArguments()
          .drop_front(getNumLeadingArguments() - 4).take_front(4);
    }
    ::llvm::StringRef getCaptureName(unsigned i) {
      return ::llvm::cast<::mlir::StringAttr>(getCaptureNamesAttr()[i]).getValue();
    }
  }];
}

#endif // DFLEX_INTERFACES_TD
