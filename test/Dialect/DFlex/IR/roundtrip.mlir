// RUN: dflex-opt %s | dflex-opt | FileCheck %s
// RUN: dflex-opt %s --mlir-print-op-generic | dflex-opt | FileCheck %s

// CHECK-LABEL: dflex.mask @renamed_arguments(%b: index, %h: index, %q_idx: index, %kv_idx: index) {
// CHECK-NEXT:    %[[C:.*]] = arith.cmpi ne, %b, %h : index
dflex.mask @renamed_arguments(%batch: index, %head: index, %query: index, %key: index) {
  %c = arith.cmpi ne, %batch, %head : index
  dflex.yield %c : i1
}

// CHECK-LABEL: dflex.mask @all_capture_kinds
// CHECK-SAME:    captures(%a: tensor<?xi32>, %_b: tensor<?x?xi64>, %c: tensor<?x?x?xf32>, %d: tensor<?xbf16>, %e: index, %f: i1, %g: i32, %h2: i64, %i: f32)
// CHECK:         dflex.read %a[%q_idx] padding -3 : tensor<?xi32>
// CHECK:         dflex.read %c[%b, %h, %q_idx] padding 2.500000e-01 : tensor<?x?x?xf32>
// CHECK:         dflex.read %d[%kv_idx] : tensor<?xbf16>
// CHECK:         dflex.dim %_b, 1 : tensor<?x?xi64>
dflex.mask @all_capture_kinds(%b: index, %h: index, %q: index, %kv: index)
    captures(%a: tensor<?xi32>, %_b: tensor<?x?xi64>, %c: tensor<?x?x?xf32>, %d: tensor<?xbf16>,
             %e: index, %f: i1, %g: i32, %h2: i64, %i: f32) {
  %0 = dflex.read %a[%q] padding -3 : tensor<?xi32>
  %1 = dflex.read %c[%b, %h, %q] padding 0.25 : tensor<?x?x?xf32>
  %2 = dflex.read %d[%kv] : tensor<?xbf16>
  %3 = dflex.dim %_b, 1 : tensor<?x?xi64>
  dflex.yield %f : i1
}

// CHECK-LABEL: dflex.score_mod @with_attributes
// CHECK-SAME:    attributes {note = "kept"}
dflex.score_mod @with_attributes(%s: f32, %b: index, %h: index, %q: index, %kv: index) attributes {note = "kept"} {
  dflex.yield %s : f32
}

// CHECK-LABEL: dflex.mask @calls
// CHECK:         dflex.call @renamed_arguments(%b, %h, %q_idx, %kv_idx) : (index, index, index, index) -> i1
dflex.mask @calls(%b: index, %h: index, %q: index, %kv: index) {
  %r = dflex.call @renamed_arguments(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  dflex.yield %r : i1
}

// CHECK: dflex.attention @spec mask @calls score_mod @with_attributes heads(8, 2) head_dim(64, 128) scale 1.250000e-01 : f16
dflex.attention @spec mask @calls score_mod @with_attributes heads(8, 2) head_dim(64, 128) scale 0.125 : f16

// CHECK: dflex.gated_delta @gla heads(4, 4) dims(64, 64) gate(scalar_log) initial_state final_state : bf16
dflex.gated_delta @gla heads(4, 4) dims(64, 64) gate(scalar_log) initial_state final_state : bf16

// CHECK: dflex.gated_delta @plain heads(2, 8) dims(128, 64) gate(none) delta_rule scale 5.000000e-01 : bf16
dflex.gated_delta @plain heads(2, 8) dims(128, 64) gate(none) delta_rule scale 0.5 : bf16
