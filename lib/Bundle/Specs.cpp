//===- Specs.cpp - What a kernel spec fixes, and its JSON -----------------===//

#include "dflex/Bundle/Specs.h"

#include "dflex/Support/Error.h"
#include "dflex/Support/JsonObject.h"

#include <cmath>

namespace dflex::bundle {

namespace {

// The keys of the manifest's "spec" objects.
constexpr const char *kMask = "mask";
constexpr const char *kScoreMod = "score_mod";
constexpr const char *kNumQHeads = "num_q_heads";
constexpr const char *kNumKvHeads = "num_kv_heads";
constexpr const char *kQkHeadDim = "qk_head_dim";
constexpr const char *kVHeadDim = "v_head_dim";
constexpr const char *kNumKeyHeads = "num_key_heads";
constexpr const char *kNumValueHeads = "num_value_heads";
constexpr const char *kKeyDim = "key_dim";
constexpr const char *kValueDim = "value_dim";
constexpr const char *kGate = "gate";
constexpr const char *kDeltaRule = "delta_rule";
constexpr const char *kQkL2Norm = "qk_l2norm";
constexpr const char *kInitialState = "initial_state";
constexpr const char *kFinalState = "final_state";
constexpr const char *kVarlen = "varlen";
constexpr const char *kInKernelGate = "in_kernel_gate";
constexpr const char *kElementType = "element_type";
constexpr const char *kScale = "scale";

/// Runs `read` (which reads with JsonObject and throws FormatError) and
/// returns its spec or its error.
template <typename Spec, typename Read> Result<Spec> readSpec(Read read) {
  try {
    return read();
  } catch (const FormatError &error) {
    return Result<Spec>::failure(error.what());
  }
}

} // namespace

JsonValue toJson(const AttentionSpec &spec) {
  JsonValue json = JsonValue::object();
  json[kMask] = spec.maskName;
  if (!spec.scoreModName.empty())
    json[kScoreMod] = spec.scoreModName;
  json[kNumQHeads] = spec.numQHeads;
  json[kNumKvHeads] = spec.numKvHeads;
  json[kQkHeadDim] = spec.qkHeadDim;
  json[kVHeadDim] = spec.vHeadDim;
  json[kElementType] = spec.elementType;
  json[kScale] = static_cast<double>(spec.scale);
  return json;
}

JsonValue toJson(const GatedDeltaSpec &spec) {
  JsonValue json = JsonValue::object();
  json[kNumKeyHeads] = spec.numKeyHeads;
  json[kNumValueHeads] = spec.numValueHeads;
  json[kKeyDim] = spec.keyDim;
  json[kValueDim] = spec.valueDim;
  json[kGate] = spec.gate;
  json[kDeltaRule] = spec.deltaRule;
  json[kQkL2Norm] = spec.qkL2Norm;
  json[kInitialState] = spec.initialState;
  json[kFinalState] = spec.finalState;
  json[kVarlen] = spec.varlen;
  json[kInKernelGate] = spec.inKernelGate;
  json[kElementType] = spec.elementType;
  json[kScale] = static_cast<double>(spec.scale);
  return json;
}

Result<AttentionSpec> attentionSpecFromJson(const std::string &name, const JsonValue &json,
                                            const std::string &where) {
  return readSpec<AttentionSpec>([&] {
    const JsonObject attributes(json, where);
    AttentionSpec spec;
    spec.name = name;
    spec.maskName = attributes.string(kMask);
    spec.scoreModName = attributes.optionalString(kScoreMod).value_or("");
    spec.numQHeads = attributes.integer(kNumQHeads);
    spec.numKvHeads = attributes.integer(kNumKvHeads);
    spec.qkHeadDim = attributes.integer(kQkHeadDim);
    spec.vHeadDim = attributes.integer(kVHeadDim);
    spec.elementType = attributes.string(kElementType);
    spec.scale = static_cast<float>(attributes.number(kScale));
    if (spec.numQHeads <= 0 || spec.numKvHeads <= 0 || spec.numQHeads % spec.numKvHeads != 0)
      attributes.fail(kNumKvHeads, "must divide num_q_heads");
    if (spec.qkHeadDim <= 0 || spec.vHeadDim <= 0)
      attributes.fail(kQkHeadDim, "head dims must be positive");
    if (spec.elementType != "bf16" && spec.elementType != "f16")
      attributes.fail(kElementType, "expected bf16 or f16, got '" + spec.elementType + "'");
    return spec;
  });
}

Result<GatedDeltaSpec> gatedDeltaSpecFromJson(const std::string &name, const JsonValue &json,
                                              const std::string &where) {
  return readSpec<GatedDeltaSpec>([&] {
    const JsonObject attributes(json, where);
    GatedDeltaSpec spec;
    spec.name = name;
    spec.numKeyHeads = attributes.integer(kNumKeyHeads);
    spec.numValueHeads = attributes.integer(kNumValueHeads);
    spec.keyDim = attributes.integer(kKeyDim);
    spec.valueDim = attributes.integer(kValueDim);
    spec.gate = attributes.string(kGate);
    spec.elementType = attributes.string(kElementType);
    const double scale = attributes.number(kScale);
    spec.scale = static_cast<float>(scale);
    auto flag = [&](const char *key) {
      if (!attributes.hasValue(key))
        attributes.fail(key, "missing");
      return attributes.boolean(key, false);
    };
    spec.deltaRule = flag(kDeltaRule);
    spec.qkL2Norm = flag(kQkL2Norm);
    spec.initialState = flag(kInitialState);
    spec.finalState = flag(kFinalState);
    spec.varlen = flag(kVarlen);
    spec.inKernelGate = flag(kInKernelGate);
    if (spec.numKeyHeads <= 0 || spec.numValueHeads <= 0 ||
        spec.numValueHeads % spec.numKeyHeads != 0)
      attributes.fail(kNumValueHeads, "must be a positive multiple of num_key_heads");
    for (const char *key : {kKeyDim, kValueDim})
      if (const int64_t dim = attributes.integer(key); dim != 64 && dim != 128)
        attributes.fail(key, "the kernels take 64 or 128, got " + std::to_string(dim));
    if (spec.gate != "none" && spec.gate != "scalar_log")
      attributes.fail(kGate, "the kernels implement none and scalar_log, got '" + spec.gate + "'");
    if (spec.inKernelGate && spec.gate != "scalar_log")
      attributes.fail(kInKernelGate, "requires gate scalar_log");
    if (spec.elementType != "bf16")
      attributes.fail(kElementType, "the kernels take bf16, got '" + spec.elementType + "'");
    if (!(scale > 0) || !std::isfinite(scale))
      attributes.fail(kScale, "must be positive and finite");
    return spec;
  });
}

} // namespace dflex::bundle
