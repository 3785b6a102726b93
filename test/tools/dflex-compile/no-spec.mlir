// RUN: not dflex-compile %s -o %t 2>&1 | FileCheck %s
// CHECK: no-spec.mlir:1:1: error: no dflex.attention or dflex.gated_delta spec to compile

dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}
