//===- Semantics.h - exact semantics of dflex body operations ---*- C++ -*-===//
//
// One definition of every arith/math operation a mask or score_mod body may
// use, shared by the CPU interpreter and by the CUDA code that codegen emits
// (this header is handed to NVRTC as is). Nothing here is undefined:
//  - integers of width W (1, 8, 16, 32, 64; index is 64) wrap modulo 2^W and
//    are stored sign-extended in a long long;
//  - x / 0 == 0 and x % 0 == 0 for every division and remainder;
//  - shifts by W or more give 0 (shli, shrui) or the sign (shrsi);
//  - float -> integer conversions saturate, NaN converts to 0;
//  - f16 and bf16 operations compute in f32 and round to nearest even.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_EXPR_SEMANTICS_H
#define DFLEX_EXPR_SEMANTICS_H

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DFLEX_SEM_FN __host__ __device__ __forceinline__
#else
#define DFLEX_SEM_FN inline
#include <cmath>
#include <cstring>
#endif

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DFLEX_FUNCTOR __host__ __device__ __forceinline__
#else
#define DFLEX_FUNCTOR inline
#endif

namespace dflex {
namespace sem {

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

/// A captured tensor as kernels see it: element pointer, then sizes and
/// strides (in elements). Every field is 8 bytes, so the layout is the same
/// on the host and the device. bf16 elements are their raw 16-bit pattern.
template <class T, int Rank> struct Tensor {
  const T *data;
  i64 sizes[Rank];
  i64 strides[Rank];
};
typedef unsigned short bf16_bits;

DFLEX_SEM_FN bool inRange(i64 index, i64 size) { return index >= 0 && index < size; }

//===--- Integers ----------------------------------------------------------===//

DFLEX_SEM_FN u64 lowMask(int width) {
  return width >= 64 ? ~0ull : ((1ull << width) - 1ull);
}
/// The value of the low `width` bits of `v`, sign-extended.
DFLEX_SEM_FN i64 wrap(u64 v, int width) {
  if (width >= 64)
    return (i64)v;
  u64 low = v & lowMask(width);
  u64 sign = 1ull << (width - 1);
  return (i64)((low ^ sign) - sign);
}
DFLEX_SEM_FN u64 asUnsigned(i64 v, int width) { return (u64)v & lowMask(width); }
DFLEX_SEM_FN i64 minSigned(int width) { return wrap(1ull << (width - 1), width); }

DFLEX_SEM_FN i64 addi(i64 a, i64 b, int w) { return wrap((u64)a + (u64)b, w); }
DFLEX_SEM_FN i64 subi(i64 a, i64 b, int w) { return wrap((u64)a - (u64)b, w); }
DFLEX_SEM_FN i64 muli(i64 a, i64 b, int w) { return wrap((u64)a * (u64)b, w); }
/// addi, subi and muli of values held in 32 bits whose result wraps at 32
/// bits or is known to fit them (the code generator's ranges): the same
/// value, in 32-bit instructions.
DFLEX_SEM_FN int addi32(int a, int b) { return (int)((u32)a + (u32)b); }
DFLEX_SEM_FN int subi32(int a, int b) { return (int)((u32)a - (u32)b); }
DFLEX_SEM_FN int muli32(int a, int b) { return (int)((u32)a * (u32)b); }
DFLEX_SEM_FN i64 andi(i64 a, i64 b, int w) { return wrap((u64)a & (u64)b, w); }
DFLEX_SEM_FN i64 ori(i64 a, i64 b, int w) { return wrap((u64)a | (u64)b, w); }
DFLEX_SEM_FN i64 xori(i64 a, i64 b, int w) { return wrap((u64)a ^ (u64)b, w); }

DFLEX_SEM_FN i64 divsi(i64 a, i64 b, int w) {
  if (b == 0)
    return 0;
  if (b == -1)
    return subi(0, a, w); // wraps for the minimum value
  return wrap((u64)(a / b), w);
}
DFLEX_SEM_FN i64 remsi(i64 a, i64 b, int w) {
  if (b == 0 || b == -1)
    return 0;
  return wrap((u64)(a % b), w);
}
DFLEX_SEM_FN i64 divui(i64 a, i64 b, int w) {
  u64 ub = asUnsigned(b, w);
  return ub == 0 ? 0 : wrap(asUnsigned(a, w) / ub, w);
}
DFLEX_SEM_FN i64 remui(i64 a, i64 b, int w) {
  u64 ub = asUnsigned(b, w);
  return ub == 0 ? 0 : wrap(asUnsigned(a, w) % ub, w);
}
DFLEX_SEM_FN i64 floordivsi(i64 a, i64 b, int w) {
  i64 q = divsi(a, b, w);
  if (b != 0 && b != -1 && (a % b) != 0 && ((a < 0) != (b < 0)))
    q = subi(q, 1, w);
  return q;
}
DFLEX_SEM_FN i64 ceildivsi(i64 a, i64 b, int w) {
  i64 q = divsi(a, b, w);
  if (b != 0 && b != -1 && (a % b) != 0 && ((a < 0) == (b < 0)))
    q = addi(q, 1, w);
  return q;
}
DFLEX_SEM_FN i64 ceildivui(i64 a, i64 b, int w) {
  u64 ua = asUnsigned(a, w), ub = asUnsigned(b, w);
  if (ub == 0)
    return 0;
  return wrap(ua / ub + (ua % ub != 0 ? 1 : 0), w);
}
/// A divisor fixed for a whole kernel launch (computed from captures and
/// tensor sizes only), prepared on the host by makeUDivisor for exact
/// unsigned division of numerators below 2^32 by a multiplication
/// (Granlund and Montgomery's round-up method, "Division by invariant
/// integers using multiplication", 1994): with l = ceil(log2 d) and
/// magic = floor(2^32 (2^l - d) / d) + 1 < 2^32, for every n < 2^32
///   n / d == (t + ((n - t) >> min(l, 1))) >> max(l - 1, 0),  t = mulhi(magic, n).
/// A divisor of 0 keeps x / 0 == x % 0 == 0; one of 2^32 or more exceeds
/// every such numerator. Signed divisions of such (non-negative) numerators
/// divide by the magnitude and apply the divisor's sign. Two 8-byte words,
/// the same on host and device.
struct UDivisor {
  u64 divisor; ///< asUnsigned(b, w)
  u64 packed;  ///< magic (bits 0-31), the two shifts (32-39, 40-47), kind (48-55)
};
enum UDivisorKind { kDivideByZero = 0, kDivideByMagic = 1, kDivideByLarge = 2 };

/// The divisor of magnitude d (bit 56 of packed set for a negative signed
/// divisor, by makeSDivisor).
DFLEX_SEM_FN UDivisor makeUDivisorOf(u64 d) {
  UDivisor result;
  result.divisor = d;
  if (d == 0) {
    result.packed = (u64)kDivideByZero << 48;
  } else if (d >> 32) {
    result.packed = (u64)kDivideByLarge << 48;
  } else {
    int l = 0;
    while ((1ull << l) < d)
      ++l;
    const u64 magic = ((((1ull << l) - d) << 32) / d) + 1;
    const u64 shift1 = l < 1 ? l : 1, shift2 = l > 1 ? l - 1 : 0;
    result.packed = magic | (shift1 << 32) | (shift2 << 40) | ((u64)kDivideByMagic << 48);
  }
  return result;
}
DFLEX_SEM_FN UDivisor makeUDivisor(i64 b, int w) { return makeUDivisorOf(asUnsigned(b, w)); }
/// A signed divisor (b sign-extended from w bits): its magnitude, and its
/// sign in bit 56.
DFLEX_SEM_FN UDivisor makeSDivisor(i64 b, int w) {
  const i64 d = wrap((u64)b, w);
  UDivisor result = makeUDivisorOf(d < 0 ? 0ull - (u64)d : (u64)d);
  if (d < 0)
    result.packed |= 1ull << 56;
  return result;
}
DFLEX_SEM_FN int udivisorKind(UDivisor d) { return (int)((d.packed >> 48) & 0xff); }
/// All ones for a magic divisor, zero for a large or a zero one; all ones
/// unless the divisor is zero. Masks rather than branches on the kind: a
/// compiler hoists them out of a kernel's loops, where a branch would sit
/// at every element.
DFLEX_SEM_FN u32 magicMask(UDivisor d) { return udivisorKind(d) == kDivideByMagic ? ~0u : 0u; }
DFLEX_SEM_FN u32 nonZeroMask(UDivisor d) { return udivisorKind(d) == kDivideByZero ? 0u : ~0u; }
/// n / d, exact for n < 2^32 (which codegen proves wherever the quotient
/// matters): 0 for a large or a zero divisor (whose packed magic and shifts
/// are 0). In 32-bit arithmetic, so a kernel multiplies 32-bit values; a
/// larger n gives some quotient of its low bits.
DFLEX_SEM_FN u32 magicQuotient(u64 n, UDivisor d) {
  const u32 low = (u32)n;
  const u32 t = (u32)(((u64)(u32)d.packed * low) >> 32);
  return ((t + ((low - t) >> ((d.packed >> 32) & 0xff))) >> ((d.packed >> 40) & 0xff)) & magicMask(d);
}
/// n - (n / d) * d under the same condition: n for a large or a zero divisor.
DFLEX_SEM_FN u32 magicRemainder(u64 n, UDivisor d) { return (u32)n - magicQuotient(n, d) * (u32)d.divisor; }
/// The same, 0 for a zero divisor (x % 0 == 0).
DFLEX_SEM_FN u32 remainderBy(u64 n, UDivisor d) { return magicRemainder(n, d) & nonZeroMask(d); }
/// divui(a, d.divisor, w) when asUnsigned(a, w) < 2^32 (which codegen proves).
DFLEX_SEM_FN i64 divuiBy(i64 a, UDivisor d, int w) { return wrap(magicQuotient(asUnsigned(a, w), d), w); }
/// remui(a, d.divisor, w) under the same condition (x % 0 == 0).
DFLEX_SEM_FN i64 remuiBy(i64 a, UDivisor d, int w) {
  return wrap(remainderBy(asUnsigned(a, w), d), w);
}
/// ceildivui(a, d.divisor, w) under the same condition.
DFLEX_SEM_FN i64 ceildivuiBy(i64 a, UDivisor d, int w) {
  const u64 n = asUnsigned(a, w);
  const u32 remainder = remainderBy(n, d);
  return wrap((u64)magicQuotient(n, d) + (remainder != 0 ? 1 : 0), w);
}
DFLEX_SEM_FN bool negativeDivisor(UDivisor d) { return (d.packed >> 56) & 1; }
/// divsi, remsi, floordivsi and ceildivsi by a makeSDivisor divisor, for
/// numerators a with 0 <= a < 2^32 (which codegen proves); x / 0 == 0. The
/// quotient and remainder of the magnitude, then the divisor's sign.
DFLEX_SEM_FN i64 divsiBy(i64 a, UDivisor d, int w) {
  const u64 q = magicQuotient((u64)a, d);
  return wrap(negativeDivisor(d) ? 0ull - q : q, w);
}
DFLEX_SEM_FN i64 remsiBy(i64 a, UDivisor d, int w) {
  return wrap(remainderBy((u64)a, d), w);
}
DFLEX_SEM_FN i64 floordivsiBy(i64 a, UDivisor d, int w) {
  const u64 q = magicQuotient((u64)a, d);
  if (!negativeDivisor(d))
    return wrap(q, w);
  const bool exact = magicRemainder((u64)a, d) == 0;
  return wrap(0ull - q - (exact || d.divisor == 1 ? 0 : 1), w);
}
DFLEX_SEM_FN i64 ceildivsiBy(i64 a, UDivisor d, int w) {
  const u64 q = magicQuotient((u64)a, d);
  const u32 remainder = remainderBy((u64)a, d);
  return wrap(negativeDivisor(d) ? 0ull - q : q + (remainder != 0 ? 1 : 0), w);
}

/// A launch-invariant divisor for unsigned numerators of any width up to 64
/// bits (where codegen cannot bound them below 2^32, e.g. a difference that
/// may wrap): the same round-up method at N = 64, with
/// magic = floor(2^64 (2^l - d) / d) + 1 < 2^64 and t = mulhi64(magic, n).
/// Exact for every 64-bit n and every d >= 1; d == 0 keeps x / 0 == 0.
/// Three 8-byte words, the same on host and device.
struct WideUDivisor {
  u64 divisor; ///< asUnsigned(b, w)
  u64 magic;
  u64 shifts; ///< shift1 (bits 0-7), shift2 (8-15); 0 for a zero divisor
};
DFLEX_SEM_FN u64 mulhi64(u64 a, u64 b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return (u64)(((unsigned __int128)a * b) >> 64);
#endif
}
#if !defined(__CUDACC_RTC__)
/// Host only: the kernels receive the packed divisor.
inline WideUDivisor makeWideUDivisor(i64 b, int w) {
  WideUDivisor result{asUnsigned(b, w), 0, 0};
  const u64 d = result.divisor;
  if (d == 0)
    return result;
  int l = 0;
  while (l < 64 && (1ull << l) < d)
    ++l;
  const unsigned __int128 above = ((unsigned __int128)1 << l) - d; // 2^l - d < d
  result.magic = (u64)((above << 64) / d) + 1;
  result.shifts = (u64)(l < 1 ? l : 1) | ((u64)(l > 1 ? l - 1 : 0) << 8);
  return result;
}
#endif
/// asUnsigned(n) / d for a non-zero wide divisor.
DFLEX_SEM_FN u64 wideQuotient(u64 n, WideUDivisor d) {
  const u64 t = mulhi64(d.magic, n);
  return (t + ((n - t) >> (d.shifts & 0xff))) >> ((d.shifts >> 8) & 0xff);
}
/// divui, remui and ceildivui by a wide divisor, for every numerator.
DFLEX_SEM_FN i64 divuiWideBy(i64 a, WideUDivisor d, int w) {
  return d.divisor == 0 ? 0 : wrap(wideQuotient(asUnsigned(a, w), d), w);
}
DFLEX_SEM_FN i64 remuiWideBy(i64 a, WideUDivisor d, int w) {
  const u64 n = asUnsigned(a, w);
  return d.divisor == 0 ? 0 : wrap(n - wideQuotient(n, d) * d.divisor, w);
}
DFLEX_SEM_FN i64 ceildivuiWideBy(i64 a, WideUDivisor d, int w) {
  const u64 n = asUnsigned(a, w);
  if (d.divisor == 0)
    return 0;
  const u64 q = wideQuotient(n, d);
  return wrap(q + (n - q * d.divisor != 0 ? 1 : 0), w);
}

DFLEX_SEM_FN i64 maxsi(i64 a, i64 b) { return a > b ? a : b; }
DFLEX_SEM_FN i64 minsi(i64 a, i64 b) { return a < b ? a : b; }
DFLEX_SEM_FN i64 maxui(i64 a, i64 b, int w) {
  return asUnsigned(a, w) > asUnsigned(b, w) ? a : b;
}
DFLEX_SEM_FN i64 minui(i64 a, i64 b, int w) {
  return asUnsigned(a, w) < asUnsigned(b, w) ? a : b;
}
DFLEX_SEM_FN i64 shli(i64 a, i64 b, int w) {
  u64 shift = asUnsigned(b, w);
  return shift >= (u64)w ? 0 : wrap((u64)a << shift, w);
}
DFLEX_SEM_FN i64 shrui(i64 a, i64 b, int w) {
  u64 shift = asUnsigned(b, w);
  return shift >= (u64)w ? 0 : wrap(asUnsigned(a, w) >> shift, w);
}
DFLEX_SEM_FN i64 shrsi(i64 a, i64 b, int w) {
  u64 shift = asUnsigned(b, w);
  if (shift >= (u64)w)
    return a < 0 ? -1 : 0;
  return a >> shift; // arithmetic on the sign-extended value
}
DFLEX_SEM_FN i64 absi(i64 a, int w) { return a < 0 ? subi(0, a, w) : a; }

/// Predicates numbered as arith.cmpi's.
enum CmpIPredicate { EQ = 0, NE, SLT, SLE, SGT, SGE, ULT, ULE, UGT, UGE };
DFLEX_SEM_FN bool cmpi(int predicate, i64 a, i64 b, int w) {
  u64 ua = asUnsigned(a, w), ub = asUnsigned(b, w);
  switch (predicate) {
  case EQ: return a == b;
  case NE: return a != b;
  case SLT: return a < b;
  case SLE: return a <= b;
  case SGT: return a > b;
  case SGE: return a >= b;
  case ULT: return ua < ub;
  case ULE: return ua <= ub;
  case UGT: return ua > ub;
  default: return ua >= ub;
  }
}
/// i1 values are 0 (false) or -1 (true), as any sign-extended i1.
DFLEX_SEM_FN i64 fromBool(bool b) { return b ? -1 : 0; }

//===--- Floats ------------------------------------------------------------===//

DFLEX_SEM_FN unsigned floatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
DFLEX_SEM_FN float bitsFloat(unsigned u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
DFLEX_SEM_FN bool isNaN(float f) { return (floatBits(f) & 0x7fffffffu) > 0x7f800000u; }

/// Rounds to the nearest bf16 value (ties to even), as a float.
DFLEX_SEM_FN float roundBF16(float f) {
  unsigned u = floatBits(f);
  if (isNaN(f))
    return bitsFloat((u | 0x00400000u) & 0xffff0000u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bitsFloat(u & 0xffff0000u);
}

/// Rounds to the nearest f16 value (ties to even, overflow to infinity), as a float.
DFLEX_SEM_FN float roundF16(float f) {
  if (isNaN(f))
    return f;
  unsigned u = floatBits(f);
  unsigned sign = u & 0x80000000u;
  unsigned magnitude = u & 0x7fffffffu;
  if (magnitude >= 0x477ff000u) // rounds to >= 65520: infinity
    return bitsFloat(sign | 0x7f800000u);
  if (magnitude < 0x38800000u) { // below 2^-14: f16 subnormal, step 2^-24
    float scaled = bitsFloat(magnitude) * 16777216.0f; // exact
    // Round to an integer, ties to even, with the 2^23 trick.
    float rounded = (scaled + 8388608.0f) - 8388608.0f;
    return bitsFloat(sign | floatBits(rounded / 16777216.0f));
  }
  // Normal: keep 10 of the 23 mantissa bits.
  magnitude += 0xfffu + ((magnitude >> 13) & 1u);
  return bitsFloat(sign | (magnitude & 0xffffe000u));
}

DFLEX_SEM_FN float bf16BitsToFloat(bf16_bits bits) {
  return bitsFloat(static_cast<unsigned>(bits) << 16);
}
/// A tensor capture's element as the program reads it: `offset`'s element
/// when `inBounds`, else `padding`. The load itself is unconditional (element
/// 0 stands in for an out-of-bounds index), so that the compiler can share
/// it among mask calls that read the same element, e.g. the elements of a
/// row; a capture's data therefore points at one readable element at least,
/// also when the tensor is empty.
template <class Result, class Element>
DFLEX_SEM_FN Result readOr(const Element *data, bool inBounds, i64 offset, Result padding) {
  const Element element = data[inBounds ? offset : 0];
  return inBounds ? static_cast<Result>(element) : padding;
}
DFLEX_SEM_FN float readOr(const bf16_bits *data, bool inBounds, i64 offset, float padding) {
  const bf16_bits element = data[inBounds ? offset : 0];
  return inBounds ? bf16BitsToFloat(element) : padding;
}

/// A scalar f32 capture travels in an 8-byte slot holding its bit pattern.
DFLEX_SEM_FN float slotFloat(i64 slot) { return bitsFloat(static_cast<unsigned>(slot)); }

/// Float kinds: the type a float value is rounded to.
enum FloatKind { F32 = 0, F16 = 1, BF16 = 2 };
DFLEX_SEM_FN float roundTo(float f, int kind) {
  return kind == BF16 ? roundBF16(f) : kind == F16 ? roundF16(f) : f;
}

/// Predicates numbered as arith.cmpf's.
enum CmpFPredicate { AlwaysFalse = 0, OEQ, OGT, OGE, OLT, OLE, ONE, ORD, UEQ, UGT_F, UGE_F, ULT_F, ULE_F, UNE, UNO, AlwaysTrue };
DFLEX_SEM_FN bool cmpf(int predicate, float a, float b) {
  bool unordered = isNaN(a) || isNaN(b);
  switch (predicate) {
  case AlwaysFalse: return false;
  case OEQ: return !unordered && a == b;
  case OGT: return !unordered && a > b;
  case OGE: return !unordered && a >= b;
  case OLT: return !unordered && a < b;
  case OLE: return !unordered && a <= b;
  case ONE: return !unordered && a != b;
  case ORD: return !unordered;
  case UEQ: return unordered || a == b;
  case UGT_F: return unordered || a > b;
  case UGE_F: return unordered || a >= b;
  case ULT_F: return unordered || a < b;
  case ULE_F: return unordered || a <= b;
  case UNE: return unordered || a != b;
  case UNO: return unordered;
  default: return true;
  }
}

DFLEX_SEM_FN float maximumf(float a, float b) {
  if (isNaN(a) || isNaN(b))
    return isNaN(a) ? a : b;
  if (a == 0.0f && b == 0.0f) // +0 > -0
    return (floatBits(a) & 0x80000000u) ? b : a;
  return a > b ? a : b;
}
DFLEX_SEM_FN float minimumf(float a, float b) {
  if (isNaN(a) || isNaN(b))
    return isNaN(a) ? a : b;
  if (a == 0.0f && b == 0.0f)
    return (floatBits(a) & 0x80000000u) ? a : b;
  return a < b ? a : b;
}
DFLEX_SEM_FN float maxnumf(float a, float b) {
  if (isNaN(a))
    return b;
  if (isNaN(b))
    return a;
  return maximumf(a, b);
}
DFLEX_SEM_FN float minnumf(float a, float b) {
  if (isNaN(a))
    return b;
  if (isNaN(b))
    return a;
  return minimumf(a, b);
}

/// Saturating float -> signed integer of width w (NaN -> 0, truncation).
DFLEX_SEM_FN i64 fptosi(float f, int w) {
  if (isNaN(f))
    return 0;
  double d = (double)f;
  double hi = w >= 64 ? 9223372036854775807.0 : (double)((1ull << (w - 1)) - 1ull);
  double lo = w >= 64 ? -9223372036854775808.0 : -(double)(1ull << (w - 1));
  if (d >= hi)
    return w >= 64 ? (i64)0x7fffffffffffffffull : (i64)((1ull << (w - 1)) - 1ull);
  if (d <= lo)
    return minSigned(w);
  return (i64)d;
}
/// Saturating float -> unsigned integer of width w (NaN and negatives -> 0).
DFLEX_SEM_FN i64 fptoui(float f, int w) {
  if (isNaN(f) || f <= 0.0f)
    return 0;
  double d = (double)f;
  double hi = w >= 64 ? 18446744073709551615.0 : (double)lowMask(w);
  if (d >= hi)
    return wrap(lowMask(w), w);
  return wrap((u64)d, w);
}
DFLEX_SEM_FN float sitofp(i64 v, int kind) { return roundTo((float)v, kind); }
DFLEX_SEM_FN float uitofp(i64 v, int w, int kind) {
  return roundTo((float)asUnsigned(v, w), kind);
}

#ifdef __CUDA_ARCH__
#define DFLEX_SEM_MATH(name, device, host)                                     \
  DFLEX_SEM_FN float name(float x, int kind) { return roundTo(device(x), kind); }
#else
#define DFLEX_SEM_MATH(name, device, host)                                     \
  DFLEX_SEM_FN float name(float x, int kind) { return roundTo(host(x), kind); }
#endif
DFLEX_SEM_MATH(expf_, expf, std::exp)
DFLEX_SEM_MATH(exp2f_, exp2f, std::exp2)
DFLEX_SEM_MATH(expm1f_, expm1f, std::expm1)
DFLEX_SEM_MATH(logf_, logf, std::log)
DFLEX_SEM_MATH(log2f_, log2f, std::log2)
DFLEX_SEM_MATH(log1pf_, log1pf, std::log1p)
DFLEX_SEM_MATH(sqrtf_, sqrtf, std::sqrt)
DFLEX_SEM_MATH(tanhf_, tanhf, std::tanh)
DFLEX_SEM_MATH(sinf_, sinf, std::sin)
DFLEX_SEM_MATH(cosf_, cosf, std::cos)
DFLEX_SEM_MATH(erff_, erff, std::erf)
DFLEX_SEM_MATH(floorf_, floorf, std::floor)
DFLEX_SEM_MATH(ceilf_, ceilf, std::ceil)
DFLEX_SEM_MATH(truncf_, truncf, std::trunc)
DFLEX_SEM_MATH(roundf_, roundf, std::round)
DFLEX_SEM_MATH(fabsf_, fabsf, std::fabs)
#undef DFLEX_SEM_MATH

DFLEX_SEM_FN float rsqrtf_(float x, int kind) { return roundTo(1.0f / sqrtf_(x, F32), kind); }
DFLEX_SEM_FN float addf(float a, float b, int kind) { return roundTo(a + b, kind); }
DFLEX_SEM_FN float subf(float a, float b, int kind) { return roundTo(a - b, kind); }
DFLEX_SEM_FN float mulf(float a, float b, int kind) { return roundTo(a * b, kind); }
DFLEX_SEM_FN float divf(float a, float b, int kind) { return roundTo(a / b, kind); }
DFLEX_SEM_FN float negf(float a) { return -a; }
DFLEX_SEM_FN float remf(float a, float b, int kind) {
#ifdef __CUDA_ARCH__
  return roundTo(fmodf(a, b), kind);
#else
  return roundTo(std::fmod(a, b), kind);
#endif
}
DFLEX_SEM_FN float powf_(float a, float b, int kind) {
#ifdef __CUDA_ARCH__
  return roundTo(powf(a, b), kind);
#else
  return roundTo(std::pow(a, b), kind);
#endif
}
DFLEX_SEM_FN float fmaf_(float a, float b, float c, int kind) {
#ifdef __CUDA_ARCH__
  return roundTo(fmaf(a, b, c), kind);
#else
  return roundTo(std::fma(a, b, c), kind);
#endif
}
DFLEX_SEM_FN float copysignf_(float a, float b) {
  return bitsFloat((floatBits(a) & 0x7fffffffu) | (floatBits(b) & 0x80000000u));
}

} // namespace sem
} // namespace dflex

#endif // DFLEX_EXPR_SEMANTICS_H
