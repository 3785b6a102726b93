// RUN: dflex-opt %s -canonicalize -split-input-file | FileCheck %s

// Constant arithmetic in a body folds; the body stays a dflex.mask.
// CHECK-LABEL: dflex.mask @folds_constants
// CHECK-NEXT:    %[[C:.*]] = arith.constant 48 : index
// CHECK-NEXT:    %[[R:.*]] = arith.cmpi ult, %q_idx, %[[C]] : index
// CHECK-NEXT:    dflex.yield %[[R]] : i1
dflex.mask @folds_constants(%b: index, %h: index, %q: index, %kv: index) {
  %c16 = arith.constant 16 : index
  %c3 = arith.constant 3 : index
  %limit = arith.muli %c16, %c3 : index
  %r = arith.cmpi ult, %q, %limit : index
  dflex.yield %r : i1
}

// -----

// Unused reads are dropped: reads are pure.
// CHECK-LABEL: dflex.mask @drops_dead_reads
// CHECK-NOT:     dflex.read
// CHECK:         dflex.yield
dflex.mask @drops_dead_reads(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xi32>) {
  %unused = dflex.read %t[%q] : tensor<?xi32>
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}

// -----

// A read at a constant negative index is out of range for any tensor: it
// folds to the padding value.
// CHECK-LABEL: dflex.mask @folds_negative_read
// CHECK-NOT:     dflex.read
// CHECK:         %[[P:.*]] = arith.constant -7 : i32
// CHECK:         arith.cmpi eq, %{{.*}}, %[[P]] : i32
dflex.mask @folds_negative_read(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xi32>) {
  %minus_one = arith.constant -1 : index
  %v = dflex.read %t[%minus_one] padding -7 : tensor<?xi32>
  %w = dflex.read %t[%q] : tensor<?xi32>
  %r = arith.cmpi eq, %w, %v : i32
  dflex.yield %r : i1
}

// -----

// Without a padding value, an out-of-range read yields zero.
// CHECK-LABEL: dflex.score_mod @folds_negative_read_to_zero
// CHECK:         %[[Z:.*]] = arith.constant 0.000000e+00 : f32
// CHECK:         arith.addf %score, %[[Z]]
dflex.score_mod @folds_negative_read_to_zero(%s: f32, %b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xf32>) {
  %minus_two = arith.constant -2 : index
  %v = dflex.read %t[%minus_two] : tensor<?xf32>
  %r = arith.addf %s, %v : f32
  dflex.yield %r : f32
}

// -----

// A non-constant index is left alone: it may be in range at run time.
// CHECK-LABEL: dflex.mask @keeps_dynamic_read
// CHECK:         dflex.read %t[%q_idx] padding 5
dflex.mask @keeps_dynamic_read(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xi32>) {
  %v = dflex.read %t[%q] padding 5 : tensor<?xi32>
  %z = arith.constant 0 : i32
  %r = arith.cmpi sgt, %v, %z : i32
  dflex.yield %r : i1
}
