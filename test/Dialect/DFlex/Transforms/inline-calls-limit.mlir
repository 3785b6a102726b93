// RUN: not dflex-opt %s -dflex-inline-calls 2>&1 | FileCheck %s

// Each level calls the one below twice: 2^30 copies of @l0 once inlined.
// The pass stops at its size limit with a located error instead of hanging.
// CHECK: inline-calls-limit.mlir:{{[0-9]+}}:{{[0-9]+}}: error: 'dflex.call' op makes the body larger than 1048576 operations once calls are inlined

dflex.mask @l0(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}
dflex.mask @l1(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l0(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l0(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l2(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l1(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l1(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l3(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l2(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l2(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l4(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l3(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l3(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l5(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l4(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l4(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l6(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l5(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l5(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l7(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l6(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l6(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l8(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l7(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l7(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l9(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l8(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l8(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l10(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l9(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l9(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l11(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l10(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l10(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l12(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l11(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l11(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l13(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l12(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l12(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l14(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l13(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l13(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l15(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l14(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l14(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l16(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l15(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l15(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l17(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l16(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l16(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l18(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l17(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l17(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l19(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l18(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l18(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l20(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l19(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l19(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l21(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l20(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l20(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l22(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l21(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l21(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l23(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l22(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l22(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l24(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l23(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l23(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l25(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l24(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l24(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l26(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l25(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l25(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l27(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l26(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l26(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l28(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l27(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l27(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l29(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l28(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l28(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}

dflex.mask @l30(%b: index, %h: index, %q: index, %kv: index) {
  %x = dflex.call @l29(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %y = dflex.call @l29(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  %r = arith.andi %x, %y : i1
  dflex.yield %r : i1
}
