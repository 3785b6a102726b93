// RUN: dflex-compile %s --emit-cuda | FileCheck %s

// A mask whose keys of a row are intervals with ends worked out from the row
// gets key_intervals (KeyIntervals.h): the row's first key and count per
// interval, which the kernels with fixed rows test per pair instead of
// mask_pair. mask_row, mask_column and mask_pair stay as they were.

// A sliding window with a captured width: q - window < kv <= q, one
// interval; the unsigned `near` holds for a negative window (far above
// every distance as unsigned), so the window reads as far when negative.
dflex.mask @window(%b: index, %h: index, %q: index, %kv: index) captures(%window: index) {
  %causal = arith.cmpi uge, %q, %kv : index
  %d = arith.subi %q, %kv : index
  %near = arith.cmpi ult, %d, %window : index
  %r = arith.andi %causal, %near : i1
  dflex.yield %r : i1
}

// Blocks of 16 keys after a captured offset, causal within the query's own
// block (the DFlash mask's shape): a quotient by a constant is two bounds;
// with a row condition and an ori, two intervals.
dflex.mask @blocks(%b: index, %h: index, %q: index, %kv: index) captures(%offset: index, %t: tensor<?xi32>) {
  %c16 = arith.constant 16 : index
  %c0 = arith.constant 0 : index
  %after = arith.cmpi uge, %kv, %offset : index
  %pos = arith.subi %kv, %offset : index
  %kv_block = arith.divui %pos, %c16 : index
  %q_block = arith.divui %q, %c16 : index
  %same = arith.cmpi eq, %kv_block, %q_block : index
  %causal = arith.cmpi ule, %pos, %q : index
  %same_causal = arith.andi %same, %causal : i1
  %own = arith.andi %after, %same_causal : i1
  %start32 = dflex.read %t[%q] : tensor<?xi32>
  %start = arith.index_cast %start32 : i32 to index
  %real = arith.cmpi sge, %start, %c0 : index
  %before = arith.cmpi slt, %kv, %start : index
  %context = arith.andi %real, %before : i1
  %r = arith.ori %own, %context : i1
  dflex.yield %r : i1
}

// Causal: the pair part is one comparison, no longer than the test.
dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}

// The key read from memory (a document id): not an interval of the row.
dflex.mask @document(%b: index, %h: index, %q: index, %kv: index) captures(%ids: tensor<?xi32>) {
  %a = dflex.read %ids[%q] : tensor<?xi32>
  %k = dflex.read %ids[%kv] : tensor<?xi32>
  %same = arith.cmpi eq, %a, %k : i32
  %causal = arith.cmpi uge, %q, %kv : index
  %r = arith.andi %same, %causal : i1
  dflex.yield %r : i1
}

// kv + n with n of any size may wrap: not rewritten.
dflex.mask @wraps(%b: index, %h: index, %q: index, %kv: index) captures(%n: index) {
  %s = arith.addi %kv, %n : index
  %below = arith.cmpi slt, %s, %q : index
  %d = arith.subi %q, %kv : index
  %c9 = arith.constant 9 : index
  %near = arith.cmpi slt, %d, %c9 : index
  %r = arith.andi %below, %near : i1
  dflex.yield %r : i1
}

dflex.attention @a_window mask @window heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @a_blocks mask @blocks heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @a_causal mask @causal heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @a_document mask @document heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @a_wraps mask @wraps heads(8, 2) head_dim(64, 64) : bf16

// CHECK-LABEL: the attention kernels of @a_window.
// CHECK:         bool mask_pair(
// CHECK:         static constexpr int kKeyIntervals = 1;
// CHECK-NEXT:    struct KeyIntervals { int first[1]; unsigned count[1]; };
// CHECK-NEXT:    KeyIntervals key_intervals(long long b, long long h, long long q_idx) const {
// CHECK-NOT:     kv_idx
// CHECK:         const ::dflex::sem::i64 [[FAR:v[0-9]+]] = 35184372088832LL;
// CHECK:         fromBool(cmpi(2, v{{[0-9]+}}, v{{[0-9]+}}, 64))
// CHECK:         return KeyIntervals{{[{][{]}}v{{[0-9]+}}{{[}]}}, {(unsigned)v{{[0-9]+}}{{[}][}]}};

// CHECK-LABEL: the attention kernels of @a_blocks.
// CHECK:         static constexpr int kKeyIntervals = 2;
// CHECK:         KeyIntervals key_intervals(
// CHECK:         muli(v{{[0-9]+}}, v{{[0-9]+}}, 64)
// CHECK:         return KeyIntervals{{[{][{]}}v{{[0-9]+}}, v{{[0-9]+}}{{[}]}}, {(unsigned)v{{[0-9]+}}, (unsigned)v{{[0-9]+}}{{[}][}]}};

// CHECK-LABEL: the attention kernels of @a_causal.
// CHECK-NOT:     kKeyIntervals
// CHECK-LABEL: the attention kernels of @a_document.
// CHECK-NOT:     kKeyIntervals
// CHECK-LABEL: the attention kernels of @a_wraps.
// CHECK-NOT:     kKeyIntervals
