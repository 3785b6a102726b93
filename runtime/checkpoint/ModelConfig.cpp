#include "dflex/runtime/checkpoint/ModelConfig.h"

#include "dflex/Support/JsonObject.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/support/FileIo.h"

#include <cmath>
#include <filesystem>
#include <set>

namespace dflex::runtime {



const char *toString(LayerKind kind) {
  switch (kind) {
  case LayerKind::FullAttention:
    return "full_attention";
  case LayerKind::SlidingAttention:
    return "sliding_attention";
  case LayerKind::LinearAttention:
    return "linear_attention";
  }
  return "unknown";
}

int64_t TransformerConfig::rotaryDim() const {
  return int64_t(double(headDim) * rope.partialRotaryFactor);
}

int64_t TransformerConfig::numLayersOf(LayerKind kind) const {
  int64_t count = 0;
  for (LayerKind layer : layerKinds)
    count += layer == kind;
  return count;
}

namespace {

bool isQwen35(const std::string &modelType) {
  return modelType == "qwen3_5_text";
}

int64_t positive(const JsonObject &object, const char *key) {
  int64_t value = object.integer(key);
  if (value <= 0)
    object.fail(key, "must be positive, got " + std::to_string(value));
  return value;
}

int64_t positiveOr(const JsonObject &object, const char *key, int64_t absent) {
  return object.hasValue(key) ? positive(object, key) : absent;
}

RopeConfig parseRope(const JsonObject &text, bool qwen35) {
  RopeConfig rope;
  // transformers 5 defaults Qwen3.5 to a quarter of the head rotated.
  rope.partialRotaryFactor = text.optionalNumber("partial_rotary_factor")
                                 .value_or(qwen35 ? 0.25 : 1.0);
  std::optional<JsonObject> parameters = text.optionalObject("rope_parameters");
  if (!parameters)
    parameters = text.optionalObject("rope_scaling"); // transformers 4
  if (std::optional<double> theta = text.optionalNumber("rope_theta"))
    rope.theta = *theta;
  if (parameters) {
    if (std::optional<std::string> type = parameters->optionalString("rope_type"))
      rope.type = *type;
    else if (std::optional<std::string> legacy = parameters->optionalString("type"))
      rope.type = *legacy;
    rope.theta = parameters->optionalNumber("rope_theta").value_or(rope.theta);
    rope.partialRotaryFactor = parameters->optionalNumber("partial_rotary_factor")
                                   .value_or(rope.partialRotaryFactor);
    rope.factor = parameters->optionalNumber("factor").value_or(1.0);
    rope.originalMaxPositionEmbeddings =
        parameters->optionalInteger("original_max_position_embeddings");
    if (parameters->hasValue("mrope_section"))
      rope.mropeSection = parameters->integers("mrope_section");
    rope.mropeInterleaved = parameters->boolean("mrope_interleaved", false);
  }
  if (!(rope.theta > 0))
    text.fail("rope_theta", "must be positive");
  if (!(rope.partialRotaryFactor > 0 && rope.partialRotaryFactor <= 1))
    text.fail("partial_rotary_factor", "must be in (0, 1]");
  return rope;
}

std::vector<LayerKind> parseLayerKinds(const JsonObject &text,
                                       const TransformerConfig &config) {
  std::vector<LayerKind> kinds;
  if (text.hasValue("layer_types")) {
    for (const std::string &name : text.strings("layer_types")) {
      if (name == "full_attention")
        kinds.push_back(LayerKind::FullAttention);
      else if (name == "sliding_attention")
        kinds.push_back(LayerKind::SlidingAttention);
      else if (name == "linear_attention")
        kinds.push_back(LayerKind::LinearAttention);
      else
        text.fail("layer_types", "unknown layer type '" + name + "'");
    }
    if (int64_t(kinds.size()) != config.numHiddenLayers)
      text.fail("layer_types", "has " + std::to_string(kinds.size()) +
                                   " entries but num_hidden_layers is " +
                                   std::to_string(config.numHiddenLayers));
    return kinds;
  }
  // Without layer_types, transformers derives the pattern as follows.
  if (isQwen35(config.modelType)) {
    int64_t interval = positiveOr(text, "full_attention_interval", 4);
    for (int64_t i = 0; i < config.numHiddenLayers; ++i)
      kinds.push_back((i + 1) % interval ? LayerKind::LinearAttention
                                         : LayerKind::FullAttention);
    return kinds;
  }
  bool sliding = text.boolean("use_sliding_window", false) &&
                 text.hasValue("sliding_window");
  int64_t firstSliding = text.optionalInteger("max_window_layers").value_or(28);
  for (int64_t i = 0; i < config.numHiddenLayers; ++i)
    kinds.push_back(sliding && i >= firstSliding ? LayerKind::SlidingAttention
                                                 : LayerKind::FullAttention);
  return kinds;
}

std::optional<int64_t> optionalTokenId(const JsonObject &object, const char *key) {
  std::optional<int64_t> id = object.optionalInteger(key);
  if (id && *id < 0)
    object.fail(key, "must not be negative");
  return id;
}

TransformerConfig parseText(const JsonObject &text, const JsonObject &top) {
  TransformerConfig config;
  std::optional<std::string> type = text.optionalString("model_type");
  std::optional<std::string> outer = top.optionalString("model_type");
  if (!type && &text != &top && outer == "qwen3_5")
    type = "qwen3_5_text";
  if (type == "qwen3_5" && &text == &top)
    type = "qwen3_5_text"; // a text-only export under the wrapper's name
  if (!type)
    text.fail("model_type", "missing");
  if (*type != "qwen3" && *type != "qwen3_5_text")
    text.fail("model_type", "unsupported model type '" + *type +
                                "' (expected qwen3, qwen3_5 or qwen3_5_text)");
  config.modelType = *type;
  bool qwen35 = isQwen35(config.modelType);

  config.vocabSize = positive(text, "vocab_size");
  config.hiddenSize = positive(text, "hidden_size");
  config.intermediateSize = positive(text, "intermediate_size");
  config.numHiddenLayers = positive(text, "num_hidden_layers");
  config.numAttentionHeads = positive(text, "num_attention_heads");
  config.numKeyValueHeads =
      positiveOr(text, "num_key_value_heads", config.numAttentionHeads);
  if (config.numAttentionHeads % config.numKeyValueHeads != 0)
    text.fail("num_key_value_heads",
              std::to_string(config.numKeyValueHeads) +
                  " does not divide num_attention_heads " +
                  std::to_string(config.numAttentionHeads));
  // The transformers defaults of each model class.
  config.headDim = positiveOr(text, "head_dim", qwen35 ? 256 : 128);
  config.maxPositionEmbeddings =
      positiveOr(text, "max_position_embeddings", 32768);
  config.rmsNormEps = text.optionalNumber("rms_norm_eps").value_or(1e-6);
  if (!(config.rmsNormEps > 0))
    text.fail("rms_norm_eps", "must be positive");
  config.hiddenAct = text.optionalString("hidden_act").value_or("silu");
  config.attentionBias = text.boolean("attention_bias", false);
  config.attentionOutputGate = text.boolean("attn_output_gate", qwen35);
  config.tieWordEmbeddings = text.boolean(
      "tie_word_embeddings", top.boolean("tie_word_embeddings", false));
  config.rope = parseRope(text, qwen35);
  config.layerKinds = parseLayerKinds(text, config);

  if (config.numLayersOf(LayerKind::SlidingAttention) > 0) {
    if (!text.hasValue("sliding_window"))
      text.fail("sliding_window",
                "missing, but layer_types has sliding_attention layers");
    config.slidingWindow = positive(text, "sliding_window");
  }
  if (config.numLayersOf(LayerKind::LinearAttention) > 0) {
    // Qwen3.5 has transformers defaults; other configs must spell them out.
    GatedDeltaConfig gdn;
    auto field = [&](const char *key, int64_t qwen35Default) {
      return qwen35 ? positiveOr(text, key, qwen35Default) : positive(text, key);
    };
    gdn.numKeyHeads = field("linear_num_key_heads", 16);
    gdn.numValueHeads = field("linear_num_value_heads", 32);
    gdn.keyHeadDim = field("linear_key_head_dim", 128);
    gdn.valueHeadDim = field("linear_value_head_dim", 128);
    gdn.convKernelDim = field("linear_conv_kernel_dim", 4);
    if (gdn.numValueHeads % gdn.numKeyHeads != 0)
      text.fail("linear_num_value_heads",
                std::to_string(gdn.numValueHeads) +
                    " is not a multiple of linear_num_key_heads " +
                    std::to_string(gdn.numKeyHeads));
    config.gatedDelta = gdn;
  }

  config.bosTokenId = optionalTokenId(text, "bos_token_id");
  config.padTokenId = optionalTokenId(text, "pad_token_id");
  if (text.hasValue("eos_token_id")) {
    if (text.members().at("eos_token_id").isArray())
      config.eosTokenIds = text.integers("eos_token_id");
    else
      config.eosTokenIds = {text.integer("eos_token_id")};
    for (int64_t id : config.eosTokenIds)
      if (id < 0)
        text.fail("eos_token_id", "must not be negative");
  }
  for (const JsonObject *object : {&text, &top})
    for (const char *key : {"dtype", "torch_dtype"})
      if (config.dtype.empty() && object->hasValue(key))
        config.dtype = object->string(key);
  return config;
}

TransformerConfig parseTransformer(const JsonObject &top) {
  if (std::optional<JsonObject> text = top.optionalObject("text_config"))
    return parseText(*text, top);
  return parseText(top, top);
}

std::string configPath(const std::string &path) {
  if (std::filesystem::is_directory(path))
    return (std::filesystem::path(path) / "config.json").string();
  return path;
}

} // namespace

TransformerConfig parseTransformerConfig(const std::string &jsonText,
                                         const std::string &source) {
  JsonValue root = parseJsonText(jsonText, source);
  return parseTransformer(JsonObject(root, source));
}

TransformerConfig loadTransformerConfig(const std::string &path) {
  std::string file = configPath(path);
  JsonValue root = readJsonFile(file);
  return parseTransformer(JsonObject(root, file));
}

std::vector<int64_t> defaultTargetLayerIds(int64_t numTargetLayers,
                                           int64_t count) {
  if (count <= 0 || numTargetLayers < 4)
    throw FormatError("cannot spread " + std::to_string(count) +
                      " target layers over a " +
                      std::to_string(numTargetLayers) + "-layer target");
  if (count == 1)
    return {numTargetLayers / 2};
  const double first = 1, last = double(numTargetLayers - 3);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < count; ++i)
    ids.push_back(int64_t(std::nearbyint(first + double(i) * (last - first) /
                                                     double(count - 1))));
  return ids;
}

namespace {

DrafterConfig parseDrafter(const JsonObject &top) {
  DrafterConfig config;
  config.model = parseTransformer(top);
  JsonObject dflash = top.object("dflash_config");
  DFlashConfig &d = config.dflash;
  d.numTargetLayers = top.optionalInteger("num_target_layers");
  if (d.numTargetLayers && *d.numTargetLayers <= 0)
    top.fail("num_target_layers", "must be positive");

  std::optional<int64_t> inner = dflash.optionalInteger("block_size");
  std::optional<int64_t> outer = top.optionalInteger("block_size");
  if (inner && outer && *inner != *outer)
    dflash.fail("block_size", std::to_string(*inner) +
                                  " disagrees with the top-level block_size " +
                                  std::to_string(*outer));
  if (!inner && !outer)
    dflash.fail("block_size", "missing (here or at the top level)");
  d.blockSize = inner ? *inner : *outer;
  if (d.blockSize < 2)
    dflash.fail("block_size", "must be at least 2, got " + std::to_string(d.blockSize));

  d.maskTokenId = dflash.integer("mask_token_id");
  if (d.maskTokenId < 0 || d.maskTokenId >= config.model.vocabSize)
    dflash.fail("mask_token_id", std::to_string(d.maskTokenId) +
                                     " is outside the vocabulary [0, " +
                                     std::to_string(config.model.vocabSize) + ")");

  if (dflash.hasValue("target_layer_ids")) {
    d.targetLayerIds = dflash.integers("target_layer_ids");
  } else {
    if (!d.numTargetLayers)
      dflash.fail("target_layer_ids", "missing, and num_target_layers is not "
                                      "given to derive them");
    d.targetLayerIds =
        defaultTargetLayerIds(*d.numTargetLayers, config.model.numHiddenLayers);
  }
  if (d.targetLayerIds.empty())
    dflash.fail("target_layer_ids", "is empty");
  std::set<int64_t> seen;
  for (int64_t id : d.targetLayerIds) {
    if (id < 0 || (d.numTargetLayers && id >= *d.numTargetLayers))
      dflash.fail("target_layer_ids",
                  "layer " + std::to_string(id) + " is outside the target's " +
                      (d.numTargetLayers ? std::to_string(*d.numTargetLayers)
                                         : std::string("non-negative")) +
                      " layers");
    if (!seen.insert(id).second)
      dflash.fail("target_layer_ids", "layer " + std::to_string(id) + " repeats");
  }
  return config;
}

} // namespace

DrafterConfig parseDrafterConfig(const std::string &jsonText,
                                 const std::string &source) {
  JsonValue root = parseJsonText(jsonText, source);
  return parseDrafter(JsonObject(root, source));
}

DrafterConfig loadDrafterConfig(const std::string &path) {
  std::string file = configPath(path);
  JsonValue root = readJsonFile(file);
  return parseDrafter(JsonObject(root, file));
}

std::string writeDrafterConfig(const DrafterConfig &config) {
  const TransformerConfig &m = config.model;
  const DFlashConfig &d = config.dflash;
  JsonValue out = JsonValue::object();
  out["architectures"].push("DFlashDraftModel");
  out["model_type"] = "qwen3";
  out["vocab_size"] = m.vocabSize;
  out["hidden_size"] = m.hiddenSize;
  out["intermediate_size"] = m.intermediateSize;
  out["num_hidden_layers"] = m.numHiddenLayers;
  out["num_attention_heads"] = m.numAttentionHeads;
  out["num_key_value_heads"] = m.numKeyValueHeads;
  out["head_dim"] = m.headDim;
  out["max_position_embeddings"] = m.maxPositionEmbeddings;
  out["rms_norm_eps"] = m.rmsNormEps;
  out["hidden_act"] = m.hiddenAct;
  out["attention_bias"] = m.attentionBias;
  out["attention_dropout"] = 0.0;
  out["tie_word_embeddings"] = m.tieWordEmbeddings;
  // The transformers 4 spelling of RoPE, which transformers 5 also reads.
  out["rope_theta"] = m.rope.theta;
  if (m.rope.type == "default") {
    out["rope_scaling"] = nullptr;
  } else {
    JsonValue &scaling = out["rope_scaling"];
    scaling["rope_type"] = m.rope.type;
    scaling["factor"] = m.rope.factor;
    if (m.rope.originalMaxPositionEmbeddings)
      scaling["original_max_position_embeddings"] =
          *m.rope.originalMaxPositionEmbeddings;
  }
  if (m.rope.partialRotaryFactor != 1.0)
    out["partial_rotary_factor"] = m.rope.partialRotaryFactor;
  for (LayerKind kind : m.layerKinds)
    out["layer_types"].push(toString(kind));
  if (m.slidingWindow) {
    out["use_sliding_window"] = true;
    out["sliding_window"] = *m.slidingWindow;
  } else {
    out["use_sliding_window"] = false;
    out["sliding_window"] = nullptr;
  }
  out["max_window_layers"] = m.numHiddenLayers;
  if (m.gatedDelta) {
    out["linear_num_key_heads"] = m.gatedDelta->numKeyHeads;
    out["linear_num_value_heads"] = m.gatedDelta->numValueHeads;
    out["linear_key_head_dim"] = m.gatedDelta->keyHeadDim;
    out["linear_value_head_dim"] = m.gatedDelta->valueHeadDim;
    out["linear_conv_kernel_dim"] = m.gatedDelta->convKernelDim;
  }
  if (m.bosTokenId)
    out["bos_token_id"] = *m.bosTokenId;
  if (m.padTokenId)
    out["pad_token_id"] = *m.padTokenId;
  if (m.eosTokenIds.size() == 1)
    out["eos_token_id"] = m.eosTokenIds.front();
  else
    for (int64_t id : m.eosTokenIds)
      out["eos_token_id"].push(id);
  if (!m.dtype.empty()) {
    out["dtype"] = m.dtype;
    out["torch_dtype"] = m.dtype; // transformers before 4.56
  }
  out["block_size"] = d.blockSize;
  if (d.numTargetLayers)
    out["num_target_layers"] = *d.numTargetLayers;
  JsonValue &dflash = out["dflash_config"];
  dflash["block_size"] = d.blockSize;
  dflash["mask_token_id"] = d.maskTokenId;
  for (int64_t id : d.targetLayerIds)
    dflash["target_layer_ids"].push(id);
  return writeJson(out, 2);
}

void saveDrafterConfig(const std::string &directory, const DrafterConfig &config) {
  AtomicFileWriter out((std::filesystem::path(directory) / "config.json").string());
  out.write(writeDrafterConfig(config));
  out.commit();
}

} // namespace dflex::runtime
