// RUN: dflex-compile %s --emit-cuda | FileCheck %s

// `(a - b) % n == 0` with a varying with the query and b with the key is
// emitted as `a % n == b % n`: each remainder goes to the part of the mask
// its position belongs to, and the pair part only compares. Unsigned
// remainders need a >= b wherever the comparison decides the mask; signed
// ones only non-negative a and b (docs/language.md, SplitCongruences.h).

// Guarded by q >= kv: split.
dflex.mask @guarded(%b: index, %h: index, %q: index, %kv: index) captures(%n: index) {
  %c0 = arith.constant 0 : index
  %causal = arith.cmpi uge, %q, %kv : index
  %d = arith.subi %q, %kv : index
  %phase = arith.remui %d, %n : index
  %on = arith.cmpi eq, %phase, %c0 : index
  %r = arith.andi %causal, %on : i1
  dflex.yield %r : i1
}

// Joined by an ori, q - kv may wrap where the remainder decides: kept.
dflex.mask @unguarded(%b: index, %h: index, %q: index, %kv: index) captures(%n: index) {
  %c0 = arith.constant 0 : index
  %causal = arith.cmpi uge, %q, %kv : index
  %d = arith.subi %q, %kv : index
  %phase = arith.remui %d, %n : index
  %on = arith.cmpi eq, %phase, %c0 : index
  %r = arith.ori %causal, %on : i1
  dflex.yield %r : i1
}

// Signed, no guard, zero on the left, `!=`, positions shifted by constants
// (still non-negative), and a constant divisor: split.
dflex.mask @signed(%b: index, %h: index, %q: index, %kv: index) {
  %c0 = arith.constant 0 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %k = arith.addi %kv, %c3 : index
  %d = arith.subi %k, %q : index
  %phase = arith.remsi %d, %c5 : index
  %off = arith.cmpi ne, %c0, %phase : index
  dflex.yield %off : i1
}

// A minuend that varies with both positions, or a divisor that varies with
// one: nothing to gain, kept.
dflex.mask @mixed(%b: index, %h: index, %q: index, %kv: index) captures(%n: index) {
  %c0 = arith.constant 0 : index
  %qk = arith.muli %q, %kv : index
  %d = arith.subi %qk, %kv : index
  %phase = arith.remsi %d, %n : index
  %on = arith.cmpi eq, %phase, %c0 : index
  %d2 = arith.subi %q, %kv : index
  %phase2 = arith.remsi %d2, %q : index
  %on2 = arith.cmpi eq, %phase2, %c0 : index
  %r = arith.andi %on, %on2 : i1
  dflex.yield %r : i1
}

dflex.attention @a_guarded mask @guarded heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @a_unguarded mask @unguarded heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @a_signed mask @signed heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @a_mixed mask @mixed heads(8, 2) head_dim(64, 64) : bf16

// CHECK-LABEL: the attention kernels of @a_guarded.
// CHECK:         ::dflex::sem::UDivisor [[N:mask_divisor[0-9]+_u64]];
// CHECK-LABEL: MaskRow mask_row(
// CHECK:         const int [[QR:v[0-9]+]] = (int)(remuiBy(v{{[0-9]+}}, [[N]], 64));
// CHECK-LABEL: MaskColumn mask_column(
// CHECK:         const int [[KR:v[0-9]+]] = (int)(remuiBy(v{{[0-9]+}}, [[N]], 64));
// CHECK-LABEL: bool mask_pair(
// CHECK-NOT:     rem
// CHECK:         fromBool(cmpi(0, [[QR]], [[KR]], 64))
// CHECK-NOT:     rem
// CHECK:         return

// CHECK-LABEL: the attention kernels of @a_unguarded.
// CHECK:         ::dflex::sem::WideUDivisor [[W:mask_divisor[0-9]+_w64]];
// CHECK-LABEL: MaskRow mask_row(
// CHECK-NOT:     rem
// CHECK-LABEL: bool mask_pair(
// CHECK:         = remuiWideBy(v{{[0-9]+}}, [[W]], 64);

// CHECK-LABEL: the attention kernels of @a_signed.
// CHECK-LABEL: MaskRow mask_row(
// CHECK:         const int [[QS:v[0-9]+]] = (int)(remsi(v{{[0-9]+}}, v{{[0-9]+}}, 64));
// CHECK-LABEL: MaskColumn mask_column(
// CHECK:         const int [[KS:v[0-9]+]] = (int)(remsi(v{{[0-9]+}}, v{{[0-9]+}}, 64));
// CHECK-LABEL: bool mask_pair(
// CHECK-NOT:     rem
// CHECK:         fromBool(cmpi(1, [[KS]], [[QS]], 64))

// CHECK-LABEL: the attention kernels of @a_mixed.
// CHECK-LABEL: MaskRow mask_row(
// CHECK-NOT:     rem
// CHECK-LABEL: bool mask_pair(
// CHECK:         remsi
// CHECK:         remsi
