// RUN: dflex-opt %s -dflex-inline-calls | FileCheck %s

dflex.mask @window(%b: index, %h: index, %q: index, %kv: index) captures(%w: index) {
  %d = arith.subi %q, %kv : index
  %r = arith.cmpi ult, %d, %w : index
  dflex.yield %r : i1
}

dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}

dflex.mask @both(%b: index, %h: index, %q: index, %kv: index) captures(%w: index) {
  %c = dflex.call @causal(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %n = dflex.call @window(%b, %h, %q, %kv, %w) : (index, index, index, index, index) -> i1
  %r = arith.andi %c, %n : i1
  dflex.yield %r : i1
}

// Calls of calls are inlined too.
dflex.mask @nested(%b: index, %h: index, %q: index, %kv: index) captures(%size: index) {
  %r = dflex.call @both(%b, %h, %q, %kv, %size) : (index, index, index, index, index) -> i1
  dflex.yield %r : i1
}

// CHECK-LABEL: dflex.mask @both
// CHECK-NOT:     dflex.call
// CHECK:         %[[C:.*]] = arith.cmpi uge, %q_idx, %kv_idx : index
// CHECK:         %[[D:.*]] = arith.subi %q_idx, %kv_idx : index
// CHECK:         %[[N:.*]] = arith.cmpi ult, %[[D]], %w : index
// CHECK:         %[[R:.*]] = arith.andi %[[C]], %[[N]] : i1
// CHECK:         dflex.yield %[[R]] : i1

// CHECK-LABEL: dflex.mask @nested
// CHECK-NOT:     dflex.call
// CHECK:         arith.cmpi ult, %{{.*}}, %size : index
// CHECK:         dflex.yield
