#include "TestSupport.h"

#include "dflex/Support/Json.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/checkpoint/ModelConfig.h"

#include <filesystem>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using namespace dflex::runtime::test;
using dflex::JsonValue;

namespace {

std::string fixture(const std::string &name) {
  return std::string(DFLEX_TEST_SOURCE_DIR) + "/configs/" + name;
}

/// transformers' reading of a config (see python/hf_config_reference.py).
JsonValue describeWithTransformers(const std::string &path) {
  CommandResult python = runPythonScript("hf_config_reference.py", "describe " + path);
  EXPECT_EQ(python.exitCode, 0) << python.output;
  // Warnings may precede the JSON line; it is the last line.
  std::string output = python.output;
  while (!output.empty() && output.back() == '\n')
    output.pop_back();
  std::string last = output.substr(output.rfind('\n') + 1);
  dflex::Result<JsonValue> parsed = dflex::parseJson(last);
  EXPECT_TRUE(parsed.ok()) << parsed.error() << "\n" << python.output;
  return parsed.ok() ? parsed.value() : JsonValue();
}

int64_t integer(const JsonValue &object, const char *key) {
  const JsonValue *value = object.find(key);
  EXPECT_TRUE(value && value->isInteger()) << key;
  return value && value->isInteger() ? value->asInteger() : -1;
}

double number(const JsonValue &object, const char *key) {
  const JsonValue *value = object.find(key);
  EXPECT_TRUE(value && value->isNumber()) << key;
  return value && value->isNumber() ? value->asNumber() : -1;
}

std::vector<int64_t> integers(const JsonValue &value) {
  std::vector<int64_t> out;
  for (const JsonValue &element : value.asArray())
    out.push_back(element.asInteger());
  return out;
}

/// Field-by-field agreement with transformers.
void expectSameAsTransformers(const TransformerConfig &config, const JsonValue &hf) {
  EXPECT_EQ(config.modelType, hf.find("model_type")->asString());
  EXPECT_EQ(config.vocabSize, integer(hf, "vocab_size"));
  EXPECT_EQ(config.hiddenSize, integer(hf, "hidden_size"));
  EXPECT_EQ(config.intermediateSize, integer(hf, "intermediate_size"));
  EXPECT_EQ(config.numHiddenLayers, integer(hf, "num_hidden_layers"));
  EXPECT_EQ(config.numAttentionHeads, integer(hf, "num_attention_heads"));
  EXPECT_EQ(config.numKeyValueHeads, integer(hf, "num_key_value_heads"));
  EXPECT_EQ(config.headDim, integer(hf, "head_dim"));
  EXPECT_EQ(config.maxPositionEmbeddings, integer(hf, "max_position_embeddings"));
  EXPECT_DOUBLE_EQ(config.rmsNormEps, number(hf, "rms_norm_eps"));
  EXPECT_EQ(config.hiddenAct, hf.find("hidden_act")->asString());
  EXPECT_EQ(config.attentionBias, hf.find("attention_bias")->asBool());
  EXPECT_EQ(config.tieWordEmbeddings, hf.find("tie_word_embeddings")->asBool());
  EXPECT_EQ(config.rope.type, hf.find("rope_type")->asString());
  EXPECT_DOUBLE_EQ(config.rope.theta, number(hf, "rope_theta"));
  EXPECT_DOUBLE_EQ(config.rope.partialRotaryFactor, number(hf, "partial_rotary_factor"));
  std::vector<std::string> kinds;
  for (LayerKind kind : config.layerKinds)
    kinds.push_back(toString(kind));
  std::vector<std::string> hfKinds;
  for (const JsonValue &kind : hf.find("layer_types")->asArray())
    hfKinds.push_back(kind.asString());
  EXPECT_EQ(kinds, hfKinds);
  const JsonValue *window = hf.find("sliding_window");
  if (config.numLayersOf(LayerKind::SlidingAttention) > 0) {
    ASSERT_TRUE(config.slidingWindow);
    EXPECT_EQ(*config.slidingWindow, window->asInteger());
  }
  EXPECT_EQ(config.eosTokenIds, integers(*hf.find("eos_token_ids")));
  const JsonValue *bos = hf.find("bos_token_id");
  EXPECT_EQ(config.bosTokenId.has_value(), !bos->isNull());
  if (config.bosTokenId)
    EXPECT_EQ(*config.bosTokenId, bos->asInteger());
  const JsonValue *linear = hf.find("linear");
  EXPECT_EQ(config.gatedDelta.has_value(), linear != nullptr);
  if (config.gatedDelta && linear) {
    const GatedDeltaConfig &g = *config.gatedDelta;
    EXPECT_EQ((std::vector<int64_t>{g.numKeyHeads, g.numValueHeads, g.keyHeadDim,
                                    g.valueHeadDim, g.convKernelDim}),
              integers(*linear));
  }
}

DrafterConfig exampleDrafter() { return loadDrafterConfig(fixture("qwen3-8b-dflash.json")); }

} // namespace

TEST(ModelConfig, Qwen3LegacyConfigMatchesTransformers) {
  TransformerConfig config = loadTransformerConfig(fixture("qwen3-8b.json"));
  expectSameAsTransformers(config, describeWithTransformers(fixture("qwen3-8b.json")));
  EXPECT_EQ(config.numLayersOf(LayerKind::FullAttention), 36);
  EXPECT_EQ(config.dtype, "bfloat16");
  EXPECT_EQ(config.rotaryDim(), 128);
  EXPECT_FALSE(config.attentionOutputGate);
}

TEST(ModelConfig, Qwen3SavedByTransformersMatches) {
  TempDir dir;
  ASSERT_EQ(runPythonScript("hf_config_reference.py", "make-qwen3 " + dir.path().string())
                .exitCode,
            0);
  TransformerConfig config = loadTransformerConfig(dir.path().string());
  expectSameAsTransformers(config, describeWithTransformers(dir.path().string()));
  EXPECT_EQ(config.numLayersOf(LayerKind::SlidingAttention), 2);
  EXPECT_EQ(config.slidingWindow, 256);
  EXPECT_TRUE(config.tieWordEmbeddings);
}

TEST(ModelConfig, Qwen35NestedTextConfigMatchesTransformers) {
  TransformerConfig config = loadTransformerConfig(fixture("qwen3.5-27b.json"));
  expectSameAsTransformers(config, describeWithTransformers(fixture("qwen3.5-27b.json")));
  EXPECT_EQ(config.numLayersOf(LayerKind::LinearAttention), 48);
  EXPECT_EQ(config.numLayersOf(LayerKind::FullAttention), 16);
  EXPECT_EQ(config.rotaryDim(), 64);
  EXPECT_TRUE(config.attentionOutputGate);
  EXPECT_EQ(config.rope.mropeSection, (std::vector<int64_t>{11, 11, 10}));
  EXPECT_TRUE(config.rope.mropeInterleaved);
}

TEST(ModelConfig, Qwen35SavedByTransformersMatches) {
  TempDir dir;
  ASSERT_EQ(runPythonScript("hf_config_reference.py", "make-qwen3_5 " + dir.path().string())
                .exitCode,
            0);
  TransformerConfig config = loadTransformerConfig(dir.path().string());
  expectSameAsTransformers(config, describeWithTransformers(dir.path().string()));
}

TEST(ModelConfig, Qwen35TopLevelTextConfigAndDerivedLayerPattern) {
  // A text-only export: no wrapper, no layer_types (derived from the interval).
  std::string text = R"({"model_type": "qwen3_5_text", "vocab_size": 100,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "full_attention_interval": 3})";
  TransformerConfig config = parseTransformerConfig(text, "inline");
  std::vector<LayerKind> expected = {
      LayerKind::LinearAttention, LayerKind::LinearAttention, LayerKind::FullAttention,
      LayerKind::LinearAttention, LayerKind::LinearAttention, LayerKind::FullAttention};
  EXPECT_EQ(config.layerKinds, expected);
  ASSERT_TRUE(config.gatedDelta);
  EXPECT_EQ(config.gatedDelta->numValueHeads, 32); // transformers' default
  EXPECT_DOUBLE_EQ(config.rope.partialRotaryFactor, 0.25);
}

TEST(ModelConfig, DrafterConfigMatchesTransformers) {
  DrafterConfig drafter = exampleDrafter();
  JsonValue hf = describeWithTransformers(fixture("qwen3-8b-dflash.json"));
  expectSameAsTransformers(drafter.model, hf);
  EXPECT_EQ(drafter.dflash.targetLayerIds, (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(drafter.dflash.blockSize, 16);
  EXPECT_EQ(drafter.dflash.maskTokenId, 151669);
  EXPECT_EQ(drafter.dflash.numTargetLayers, 36);
}

TEST(ModelConfig, DrafterConfigRoundTripsAndTransformersReadsIt) {
  DrafterConfig drafter = exampleDrafter();
  drafter.model.numHiddenLayers = 3;
  drafter.model.layerKinds = {LayerKind::SlidingAttention, LayerKind::FullAttention,
                              LayerKind::SlidingAttention};
  drafter.model.slidingWindow = 2048;
  drafter.dflash.targetLayerIds = {2, 17, 31};
  TempDir dir;
  saveDrafterConfig(dir.path().string(), drafter);

  DrafterConfig again = loadDrafterConfig(dir.path().string());
  EXPECT_EQ(writeDrafterConfig(again), writeDrafterConfig(drafter));
  EXPECT_EQ(again.dflash.targetLayerIds, drafter.dflash.targetLayerIds);
  EXPECT_EQ(again.model.layerKinds, drafter.model.layerKinds);

  JsonValue hf = describeWithTransformers(dir.path().string());
  expectSameAsTransformers(again.model, hf);
  const JsonValue *dflash = hf.find("dflash_config");
  ASSERT_TRUE(dflash);
  EXPECT_EQ(integers(*dflash->find("target_layer_ids")), drafter.dflash.targetLayerIds);
  EXPECT_EQ(dflash->find("mask_token_id")->asInteger(), drafter.dflash.maskTokenId);
  EXPECT_EQ(integer(hf, "block_size"), 16);
  EXPECT_EQ(integer(hf, "num_target_layers"), 36);
}

TEST(ModelConfig, DefaultTargetLayersSpreadOverTheTarget) {
  EXPECT_EQ(defaultTargetLayerIds(36, 5), (std::vector<int64_t>{1, 9, 17, 25, 33}));
  EXPECT_EQ(defaultTargetLayerIds(64, 5), (std::vector<int64_t>{1, 16, 31, 46, 61}));
  EXPECT_EQ(defaultTargetLayerIds(7, 3), (std::vector<int64_t>{1, 2, 4})); // 2.5 -> 2
  EXPECT_EQ(defaultTargetLayerIds(40, 1), (std::vector<int64_t>{20}));
  EXPECT_THROW(defaultTargetLayerIds(3, 2), FormatError);

  std::string text = R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4,
    "num_target_layers": 36, "block_size": 16, "dflash_config": {"mask_token_id": 99}})";
  EXPECT_EQ(parseDrafterConfig(text, "inline").dflash.targetLayerIds,
            (std::vector<int64_t>{1, 9, 17, 25, 33}));
}

TEST(ModelConfig, BadConfigsNameFileAndKey) {
  const std::string base = R"("vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4)";
  auto transformer = [&](const std::string &extra) {
    return [=] { parseTransformerConfig("{" + base + extra + "}", "cfg.json"); };
  };
  expectError<FormatError>(transformer(R"(, "model_type": "llama")"),
                           {"cfg.json", "model_type", "unsupported model type 'llama'"});
  expectError<FormatError>(transformer(R"(, "model_type": "qwen3", "num_key_value_heads": 3)"),
                           {"cfg.json", "num_key_value_heads", "does not divide"});
  expectError<FormatError>(
      transformer(R"(, "model_type": "qwen3", "layer_types": ["full_attention"])"),
      {"cfg.json", "layer_types", "has 1 entries but num_hidden_layers is 2"});
  expectError<FormatError>(
      transformer(R"(, "model_type": "qwen3", "layer_types": ["full_attention", "mamba"])"),
      {"layer_types", "unknown layer type 'mamba'"});
  expectError<FormatError>(
      transformer(R"(, "model_type": "qwen3",
                  "layer_types": ["full_attention", "sliding_attention"])"),
      {"sliding_window", "missing"});
  expectError<FormatError>(transformer(R"(, "model_type": "qwen3", "hidden_size": "big")"),
                           {"cfg.json"});
  expectError<FormatError>(
      [] { parseTransformerConfig(R"({"model_type": "qwen3", "vocab_size": 10})", "c.json"); },
      {"c.json", "hidden_size", "missing"});
  expectError<FormatError>(
      [] {
        parseTransformerConfig(R"({"model_type": "qwen3_5", "text_config": {"vocab_size": -1}})",
                               "w.json");
      },
      {"w.json: text_config", "vocab_size", "must be positive"});
  expectError<FormatError>([] { parseTransformerConfig("{", "broken.json"); },
                           {"broken.json:1:"});

  auto drafter = [&](const std::string &extra) {
    return [=] {
      parseDrafterConfig("{" + base + R"(, "model_type": "qwen3")" + extra + "}", "d.json");
    };
  };
  expectError<FormatError>(drafter(""), {"d.json", "dflash_config", "missing"});
  expectError<FormatError>(
      drafter(R"(, "block_size": 16, "dflash_config": {"mask_token_id": 100, "target_layer_ids": [1]})"),
      {"mask_token_id", "100 is outside the vocabulary [0, 100)"});
  expectError<FormatError>(
      drafter(R"(, "block_size": 8, "dflash_config": {"block_size": 16, "mask_token_id": 5, "target_layer_ids": [1]})"),
      {"block_size", "16 disagrees with the top-level block_size 8"});
  expectError<FormatError>(
      drafter(R"(, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]})"),
      {"block_size", "missing"});
  expectError<FormatError>(
      drafter(R"(, "block_size": 16, "num_target_layers": 8, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 8]})"),
      {"target_layer_ids", "layer 8 is outside the target's 8 layers"});
  expectError<FormatError>(
      drafter(R"(, "block_size": 16, "dflash_config": {"mask_token_id": 5, "target_layer_ids": [3, 3]})"),
      {"target_layer_ids", "layer 3 repeats"});
  expectError<FormatError>(
      drafter(R"(, "block_size": 16, "dflash_config": {"mask_token_id": 5})"),
      {"target_layer_ids", "num_target_layers"});
}
