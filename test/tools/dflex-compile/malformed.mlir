// RUN: not dflex-compile %s -o %t 2>&1 | FileCheck %s
// CHECK: malformed.mlir:[[@LINE+3]]:{{[0-9]+}}: error: 'dflex.attention' op query heads (32) must be a multiple of key/value heads (5)

dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) { %r = arith.cmpi uge, %q, %kv : index dflex.yield %r : i1 }
dflex.attention @layer mask @causal heads(32, 5) head_dim(128, 128) : bf16
