//===- Variant.h - mask and score_mod functors as CUDA C++ -------*- C++ -*-===//
//
// A kernel variant is a struct holding a kernel's captures with the functors
// the kernel templates call (kernels/attention/variant.cuh):
//   mask(b, h, q_idx, kv_idx), score_mod(s, ...), score_mod_grad(s, ...).
// It is passed to kernels by value; its layout is a row of 8-byte slots, one
// per scalar capture and 1 + 2 * rank per tensor capture (data, sizes,
// strides), in the order of `VariantLayout::captures`, then two or three per
// launch-invariant divisor (`VariantLayout::divisors`): a division or
// remainder by a value computed from captures and tensor sizes only runs as
// a multiplication by a magic number the host computes at launch instead of
// a division per element: sem::UDivisor (two slots) where the numerator is
// proven below 2^32 (signed or unsigned), sem::WideUDivisor (three slots) for
// other unsigned numerators; then one per hoisted launch-invariant value
// (`VariantLayout::invariants`): a value computed from captures and tensor
// sizes only that per-element code reads (a log of a captured scalar, a
// product of two captures) is computed once on the host at launch, so the
// kernels neither recompute it per element nor carry its code. The mask's
// slots (captures, divisors, invariants) come first, so a mask-only layout
// is a prefix of the full one.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_CODEGEN_VARIANT_H
#define DFLEX_CODEGEN_VARIANT_H

#include "dflex/Expr/Program.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Status.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflex::codegen {

struct CaptureSlot {
  std::string name;   // the DSL name the runtime binds by
  std::string field;  // the C++ member holding it
  bool isTensor = false;
  expr::ScalarType elementType = expr::ScalarType::I32;
  int rank = 0;
  int offsetBytes = 0;
  int sizeBytes = 0;
};

/// A launch-invariant divisor: the value of instruction `instruction` of the
/// mask (or of the score_mod) at `width` bits, as a sem::UDivisor member
/// (sem::makeSDivisor's for signed divisions).
struct DivisorSlot {
  bool inScoreMod = false;
  int32_t instruction = 0;
  int width = 64;
  bool isSigned = false;
  /// A sem::WideUDivisor (unsigned divisions whose numerator is not proven
  /// below 2^32) rather than a sem::UDivisor.
  bool wide = false;
  std::string field;
  int offsetBytes = 0;
  int sizeBytes() const { return wide ? 24 : 16; }
  bool sameDivisor(const DivisorSlot &other) const {
    return inScoreMod == other.inScoreMod && instruction == other.instruction &&
           width == other.width && isSigned == other.isSigned && wide == other.wide;
  }
};

/// A hoisted launch-invariant value: instruction `instruction` of the mask
/// (or of the score_mod), as its 8-byte pattern (an integer sign-extended,
/// a float's bits).
struct InvariantSlot {
  bool inScoreMod = false;
  int32_t instruction = 0;
  bool isFloat = false;
  std::string field;
  int offsetBytes = 0;
  static constexpr int kSizeBytes = 8;
};

struct VariantLayout {
  std::vector<CaptureSlot> captures;
  std::vector<DivisorSlot> divisors;
  std::vector<InvariantSlot> invariants;
  int sizeBytes = 8; // never empty: a variant without captures holds one unused slot
  const CaptureSlot *find(const std::string &name) const;
};

/// The captures of a mask and an optional score_mod, merged by name (the
/// mask's first). Fails when one name has two types.
Result<VariantLayout> layoutVariant(const expr::Program &mask,
                                    const expr::Program *scoreMod);

/// The C++ struct `structName`: capture members, then mask(), score_mod()
/// and score_mod_grad() (the score_mod program must carry its derivative).
/// Needs only dflex/Expr/Semantics.h; __host__ __device__ under CUDA, plain
/// inline functions otherwise, so tests can compile it on the host.
std::string emitVariant(const std::string &structName,
                        const VariantLayout &layout, const expr::Program &mask,
                        const expr::Program *scoreMod);

/// A capture value bound to its DSL name. Tensor data may be device memory:
/// packing copies the pointer, never the elements.
struct BoundCapture {
  std::string name;
  expr::CaptureValue value;
};

/// The bytes of a variant struct of `layout` holding `captures` (each
/// capture of the layout exactly once, with its declared rank and element
/// type; scalars as their sign-extended value, f32 as its bit pattern) and
/// its divisors and hoisted invariants, evaluated from the scalar captures
/// and tensor sizes of the programs the layout was made from (never reading
/// tensor data).
Result<std::vector<uint8_t>> packVariant(const VariantLayout &layout,
                                         const std::vector<BoundCapture> &captures,
                                         const expr::Program &mask,
                                         const expr::Program *scoreMod);

/// A C++ identifier made from a DSL symbol name.
std::string sanitizeIdentifier(const std::string &name);

JsonValue toJson(const VariantLayout &layout);

} // namespace dflex::codegen

#endif // DFLEX_CODEGEN_VARIANT_H
