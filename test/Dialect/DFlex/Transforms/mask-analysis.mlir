// RUN: dflex-opt %s -dflex-mask-analysis | FileCheck %s
// RUN: dflex-opt %s -dflex-mask-analysis -dflex-mask-analysis | FileCheck %s
// RUN: dflex-opt %examples/dflash.mlir -dflex-mask-analysis | FileCheck %s --check-prefix=DFLASH

// CHECK-LABEL: dflex.mask @causal
// CHECK-SAME:    dflex.depends_on = ["q_idx", "kv_idx"]
// CHECK-SAME:    dflex.uses_captures = []
// CHECK-NOT:     dflex.float_arith
dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}

// A per-batch prefix: the lists differ per batch, not per head.
// CHECK-LABEL: dflex.mask @prefix
// CHECK-SAME:    dflex.depends_on = ["b", "q_idx", "kv_idx"]
// CHECK-SAME:    dflex.uses_captures = ["prefix_len"]
dflex.mask @prefix(%b: index, %h: index, %q: index, %kv: index)
    captures(%prefix_len: tensor<?xi32>) {
  %len32 = dflex.read %prefix_len[%b] : tensor<?xi32>
  %len = arith.index_cast %len32 : i32 to index
  %in_prefix = arith.cmpi slt, %kv, %len : index
  %causal = arith.cmpi uge, %q, %kv : index
  %r = arith.ori %in_prefix, %causal : i1
  dflex.yield %r : i1
}

// Values that never reach the result do not count: %unused and the read
// of %table are dead, and so is h.
// CHECK-LABEL: dflex.mask @dead_values
// CHECK-SAME:    dflex.depends_on = ["kv_idx"]
// CHECK-SAME:    dflex.uses_captures = ["limit"]
dflex.mask @dead_values(%b: index, %h: index, %q: index, %kv: index)
    captures(%table: tensor<?xi32>, %limit: index, %unused: index) {
  %dead = dflex.read %table[%h] : tensor<?xi32>
  %sum = arith.addi %unused, %q : index
  %r = arith.cmpi ult, %kv, %limit : index
  dflex.yield %r : i1
}

// Calls are followed into the callee, with its arguments bound.
// CHECK-LABEL: dflex.mask @per_head
// CHECK-SAME:    dflex.depends_on = ["h", "q_idx"]
// CHECK-SAME:    dflex.uses_captures = ["heads_on"]
dflex.mask @per_head(%b: index, %h: index, %q: index, %kv: index)
    captures(%heads_on: tensor<?xi32>) {
  %c0 = arith.constant 0 : index
  %on = dflex.call @first_query(%b, %c0, %h, %q, %heads_on) : (index, index, index, index, tensor<?xi32>) -> i1
  dflex.yield %on : i1
}

// CHECK-LABEL: dflex.mask @first_query
// CHECK-SAME:    dflex.depends_on = ["q_idx", "kv_idx"]
// CHECK-SAME:    dflex.uses_captures = ["flags"]
dflex.mask @first_query(%b: index, %h: index, %q: index, %kv: index)
    captures(%flags: tensor<?xi32>) {
  %flag = dflex.read %flags[%q] : tensor<?xi32>
  %c0 = arith.constant 0 : i32
  %on = arith.cmpi ne, %flag, %c0 : i32
  %c1 = arith.constant 1 : index
  %first = arith.cmpi ult, %kv, %c1 : index
  %r = arith.andi %on, %first : i1
  dflex.yield %r : i1
}

// Float arithmetic is flagged.
// CHECK-LABEL: dflex.mask @score_threshold
// CHECK-SAME:    dflex.depends_on = ["h", "q_idx", "kv_idx"]
// CHECK-SAME:    dflex.float_arith
// CHECK-SAME:    dflex.uses_captures = ["slopes"]
dflex.mask @score_threshold(%b: index, %h: index, %q: index, %kv: index)
    captures(%slopes: tensor<?xf32>) {
  %slope = dflex.read %slopes[%h] : tensor<?xf32>
  %d = arith.subi %q, %kv : index
  %d64 = arith.index_cast %d : index to i64
  %df = arith.sitofp %d64 : i64 to f32
  %bias = arith.mulf %slope, %df : f32
  %limit = arith.constant 8.0 : f32
  %r = arith.cmpf olt, %bias, %limit : f32
  dflex.yield %r : i1
}

// A constant mask depends on nothing.
// CHECK-LABEL: dflex.mask @everything
// CHECK-SAME:    dflex.depends_on = []
// CHECK-SAME:    dflex.uses_captures = []
dflex.mask @everything(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}

// Score mods are left alone.
// CHECK-LABEL: dflex.score_mod @identity
// CHECK-NOT:     dflex.depends_on
// CHECK:         dflex.yield
dflex.score_mod @identity(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
  dflex.yield %s : f32
}

// DFLASH-LABEL: dflex.mask @dflash
// DFLASH-SAME:    block_size = 16
// DFLASH-SAME:    dflex.depends_on = ["b", "q_idx", "kv_idx"]
// DFLASH-SAME:    dflex.uses_captures = ["anchors", "context_start", "ctx_len"]
// DFLASH-NOT:     dflex.float_arith
