// RUN: dflex-compile %s --emit-cuda | FileCheck %s

// Casts keep what the code generator proves of a value's range: an i32
// read sign-extended to an index is still an i32 value (an int in the
// generated code, compared with a position in 32 bits), whatever its sign;
// zero-extended, a value that may be negative spans [0, 2^32) and stays
// 64-bit.
dflex.mask @anchored(%b: index, %h: index, %q: index, %kv: index) captures(%anchors: tensor<?xi32>) {
  %a = dflex.read %anchors[%q] padding -1 : tensor<?xi32>
  %signed = arith.extsi %a : i32 to i64
  %signedIndex = arith.index_cast %signed : i64 to index
  %before = arith.cmpi slt, %kv, %signedIndex : index
  %unsigned = arith.extui %a : i32 to i64
  %unsignedIndex = arith.index_castui %unsigned : i64 to index
  %within = arith.cmpi ult, %kv, %unsignedIndex : index
  %r = arith.andi %before, %within : i1
  dflex.yield %r : i1
}

dflex.attention @layer mask @anchored heads(8, 2) head_dim(64, 64) : bf16

// CHECK:       struct MaskRow { int [[SIGNED:v[0-9]+]]; ::dflex::sem::i64 [[UNSIGNED:v[0-9]+]];
// CHECK-LABEL: MaskRow mask_row(
// CHECK:         const int [[READ:v[0-9]+]] = (int)(readOr(
// CHECK:         const int {{v[0-9]+}} = (int)(wrap((u64)[[READ]], 64));
// CHECK:         = wrap(asUnsigned([[READ]], 32), 64);
// CHECK-LABEL: bool mask_pair(
// CHECK:         = (int)(fromBool(cmpi(2, {{v[0-9]+}}, [[SIGNED]], 64)));
// CHECK:         = (int)(fromBool(cmpi(6, {{v[0-9]+}}, [[UNSIGNED]], 64)));
