// RUN: not dflex-compile %s --arch sm_9000x -o %t 2>&1 | FileCheck %s
// CHECK: dflex-compile: error: unknown --arch 'sm_9000x'

dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}
dflex.attention @layer mask @causal heads(8, 8) head_dim(64, 64) : bf16
