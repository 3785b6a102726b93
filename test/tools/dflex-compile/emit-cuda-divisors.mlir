// RUN: dflex-compile %s --emit-cuda | FileCheck %s

// Divisions by launch-invariant values become multiplications by a magic the
// host computes: a 32-bit one where the numerator is proven below 2^32 (where
// the division's value matters), a
// 64-bit one for an unsigned numerator that may wrap; a constant divisor is
// left to NVRTC.
dflex.mask @dilated(%b: index, %h: index, %q: index, %kv: index) captures(%chunk: index, %dilation: index) {
  %qc = arith.divui %q, %chunk : index
  %kc = arith.divui %kv, %chunk : index
  %same = arith.cmpi eq, %qc, %kc : index
  %d = arith.subi %q, %kv : index
  %phase = arith.remui %d, %dilation : index
  %c0 = arith.constant 0 : index
  %c3 = arith.constant 3 : index
  %on = arith.cmpi eq, %phase, %c0 : index
  %third = arith.remui %q, %c3 : index
  %odd = arith.cmpi ne, %third, %c0 : index
  %r0 = arith.andi %same, %on : i1
  %r = arith.andi %r0, %odd : i1
  dflex.yield %r : i1
}

dflex.attention @layer mask @dilated heads(8, 2) head_dim(64, 64) : bf16

// CHECK-LABEL: struct Variant {
// CHECK:         // divisor: mask value v{{[0-9]+}}, unsigned at 64 bits, byte 16
// CHECK-NEXT:    ::dflex::sem::UDivisor [[CHUNK:mask_divisor[0-9]+_u64]];
// CHECK-NEXT:    // divisor: mask value v{{[0-9]+}}, unsigned, any numerator, at 64 bits, byte 32
// CHECK-NEXT:    ::dflex::sem::WideUDivisor [[DILATION:mask_divisor[0-9]+_w64]];
// Each division sits in the part of the mask its numerator belongs to: q's
// in the row part, kv's in the column part, (q - kv)'s in the pair part.
// CHECK-LABEL: MaskRow mask_row(
// CHECK:         = (int)(divuiBy(v{{[0-9]+}}, [[CHUNK]], 64));
// CHECK:         = (int)(remui(v{{[0-9]+}}, v{{[0-9]+}}, 64));
// CHECK-LABEL: MaskColumn mask_column(
// CHECK:         = (int)(divuiBy(v{{[0-9]+}}, [[CHUNK]], 64));
// CHECK-LABEL: bool mask_pair(
// CHECK-NOT:     divuiBy
// CHECK:         = remuiWideBy(v{{[0-9]+}}, [[DILATION]], 64);
// CHECK:         return

// Where the mask also requires q >= kv (an andi with it), q - kv lies in
// [0, 2^31) wherever its quotient decides the mask: a 32-bit magic divides
// it (elsewhere it may wrap, and the mask is false whatever the quotient).
// Joined by an ori the order does not hold where the quotient counts, so
// the division stays 64-bit. (A remainder compared with zero is split into
// the positions' remainders instead: split-congruences.mlir.)
dflex.mask @causal_strided(%b: index, %h: index, %q: index, %kv: index) captures(%stride: index) {
  %c4 = arith.constant 4 : index
  %causal = arith.cmpi uge, %q, %kv : index
  %d = arith.subi %q, %kv : index
  %steps = arith.divui %d, %stride : index
  %near = arith.cmpi ult, %steps, %c4 : index
  %r = arith.andi %causal, %near : i1
  dflex.yield %r : i1
}

dflex.mask @causal_or_strided(%b: index, %h: index, %q: index, %kv: index) captures(%stride: index) {
  %c4 = arith.constant 4 : index
  %causal = arith.cmpi uge, %q, %kv : index
  %d = arith.subi %q, %kv : index
  %steps = arith.divui %d, %stride : index
  %near = arith.cmpi ult, %steps, %c4 : index
  %r = arith.ori %causal, %near : i1
  dflex.yield %r : i1
}

dflex.attention @guarded mask @causal_strided heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @unguarded mask @causal_or_strided heads(8, 2) head_dim(64, 64) : bf16

// CHECK-LABEL: the attention kernels of @guarded.
// CHECK:         // divisor: mask value v{{[0-9]+}}, unsigned at 64 bits, byte 8
// CHECK-NEXT:    ::dflex::sem::UDivisor [[GUARDED:mask_divisor[0-9]+_u64]];
// CHECK-LABEL: bool mask_pair(
// CHECK:         = divuiBy(v{{[0-9]+}}, [[GUARDED]], 64);
// CHECK-LABEL: the attention kernels of @unguarded.
// CHECK:         // divisor: mask value v{{[0-9]+}}, unsigned, any numerator, at 64 bits, byte 8
// CHECK-NEXT:    ::dflex::sem::WideUDivisor [[UNGUARDED:mask_divisor[0-9]+_w64]];
// CHECK-LABEL: bool mask_pair(
// CHECK:         = divuiWideBy(v{{[0-9]+}}, [[UNGUARDED]], 64);
