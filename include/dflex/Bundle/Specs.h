//===- Specs.h - What a kernel spec fixes, and its JSON -----------*- C++ -*-===//
//
// The compile-time attributes of dflex.attention and dflex.gated_delta specs,
// as the code generator takes them and a bundle manifest carries them
// ("spec" of each module): one definition of every field, written by
// dflex-compile and read back by the runtime.
//
//===----------------------------------------------------------------------===//
#ifndef DFLEX_BUNDLE_SPECS_H
#define DFLEX_BUNDLE_SPECS_H

#include "dflex/Support/Json.h"
#include "dflex/Support/Status.h"

#include <cstdint>
#include <string>

namespace dflex::bundle {

/// Template version folded into every cache key: bump when the code
/// generator changes what it emits for the same input.
inline constexpr const char *kTemplateVersion = "dflex-templates-7";

/// The layout of a bundle's manifest.json (docs/bundle.md), which
/// dflex-compile writes and the runtime reads: bump when it changes.
/// Version 2: each binary carries its own launch constants. Version 3: a
/// binary is several parts (KernelRoleInfo::part), each its own PTX and cubin.
inline constexpr int kBundleFormatVersion = 3;

/// The largest batch and query-head count, and the longest query or key
/// sequence, an attention call takes. Generated mask and score_mod code
/// relies on them: b and h fit 16 bits, and q_idx and kv_idx fit 31 bits
/// (a kernel evaluates a score_mod up to a tile, under 2^16 rows, past a
/// sequence's end), so values bounded by them compute in 32-bit integers.
inline constexpr int64_t kMaxAttentionBatchOrHeads = 65535;
inline constexpr int64_t kMaxAttentionLength = (int64_t(1) << 31) - (int64_t(1) << 16);

/// What a dflex.attention op fixes at compile time.
struct AttentionSpec {
  std::string name;
  std::string maskName;     // the dflex.mask body
  std::string scoreModName; // the dflex.score_mod body, empty for none
  int64_t numQHeads = 0;
  int64_t numKvHeads = 0;
  int64_t qkHeadDim = 0;
  int64_t vHeadDim = 0;
  std::string elementType; // "bf16" or "f16"
  float scale = 0.0f;
};

/// What a dflex.gated_delta op fixes at compile time.
struct GatedDeltaSpec {
  std::string name;
  int64_t numKeyHeads = 0;
  int64_t numValueHeads = 0;
  int64_t keyDim = 0;
  int64_t valueDim = 0;
  std::string gate; // "none", "scalar_log" or "channel_log"
  bool deltaRule = false;
  bool qkL2Norm = false;
  bool initialState = false;
  bool finalState = false;
  bool varlen = false;
  bool inKernelGate = false;
  std::string elementType; // "bf16"
  float scale = 0.0f;
};

/// The manifest's "spec" object of a module (the name is the module's).
JsonValue toJson(const AttentionSpec &spec);
JsonValue toJson(const GatedDeltaSpec &spec);

/// A spec from a module's name and "spec" object, checked as the kernels
/// need it; errors read "<where>: <key>: <problem>".
Result<AttentionSpec> attentionSpecFromJson(const std::string &name, const JsonValue &json,
                                            const std::string &where);
Result<GatedDeltaSpec> gatedDeltaSpecFromJson(const std::string &name, const JsonValue &json,
                                              const std::string &where);

} // namespace dflex::bundle

#endif // DFLEX_BUNDLE_SPECS_H
