// RUN: not dflex-compile %s --emit-cuda 2>&1 | FileCheck %s
// CHECK: head-dims.mlir:[[@LINE+6]]:1: error: @layer: the attention kernels need qk_head_dim == v_head_dim, got 128 and 64

dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}
dflex.attention @layer mask @causal heads(8, 8) head_dim(128, 64) : bf16
