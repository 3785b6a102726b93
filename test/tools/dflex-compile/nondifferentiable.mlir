// RUN: not dflex-compile %s --emit-cuda 2>&1 | FileCheck %s

dflex.mask @all(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}

dflex.score_mod @quantized(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
  %c = arith.constant 4.0 : f32
  %x = arith.mulf %s, %c : f32
  // CHECK: nondifferentiable.mlir:[[@LINE+1]]:8: error: 'math.floor' is not differentiable with respect to the score; the backward kernel needs d(score_mod)/d(score) of 'quantized'
  %f = math.floor %x : f32
  dflex.yield %f : f32
}

dflex.attention @layer mask @all score_mod @quantized heads(8, 8) head_dim(64, 64) : bf16
