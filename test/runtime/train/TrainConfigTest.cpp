// The trainer's configuration: defaults, YAML files and --set overrides,
// round trips, resume comparisons, and errors that name the key and where
// it was written.
#include "TestSupport.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/train/TrainConfig.h"

#include <gtest/gtest.h>

#include <set>

using namespace dflex::runtime;
using dflex::FormatError;
using dflex::IoError;
using dflex::runtime::test::expectError;
using dflex::runtime::test::TempDir;

namespace {

std::string writeConfig(const TempDir &dir, const std::string &text) {
  const std::string path = dir.file("train.yaml");
  test::writeBytes(path, text);
  return path;
}

TEST(TrainConfig, DefaultsAreThePublishedRecipe) {
  const TrainConfig config = loadTrainConfig("");
  EXPECT_EQ(config.blockSize, 16);
  EXPECT_EQ(config.maxAnchors, 512);
  EXPECT_EQ(config.lossGamma, 7.0);
  EXPECT_EQ(config.learningRate, 6e-4);
  EXPECT_EQ(config.warmupRatio, 0.04);
  EXPECT_EQ(config.gradClip, 1.0);
  EXPECT_EQ(config.epochs, 6);
  EXPECT_EQ(config.drafterLayers, 5);
  EXPECT_TRUE(config.targetLayerIds.empty());
}

TEST(TrainConfig, ReadsNestedYamlAndDottedOverrides) {
  TempDir dir;
  const std::string path = writeConfig(dir, R"(
target:
  dir: /models/qwen3-8b
  dtype: bfloat16
drafter:
  num_layers: 3
  layer_types: [sliding_attention, sliding_attention, full_attention]
  target_layer_ids: [1, 17, 33]
  mask_token_id: 151669
optimizer:
  lr: 3.0e-4
  betas: [0.9, 0.95]
data:
  path: data/train
devices: [cuda:0, cuda:1]
)");
  const TrainConfig config =
      loadTrainConfig(path, {"optimizer.lr=1e-4", "data.token_budget=4096", "drafter.layer_types=[full_attention, full_attention, full_attention]"});
  EXPECT_EQ(config.targetDir, "/models/qwen3-8b");
  EXPECT_EQ(config.drafterLayers, 3);
  EXPECT_EQ(config.drafterLayerTypes,
            (std::vector<std::string>{"full_attention", "full_attention", "full_attention"}));
  EXPECT_EQ(config.targetLayerIds, (std::vector<int64_t>{1, 17, 33}));
  EXPECT_EQ(config.maskTokenId, 151669);
  EXPECT_EQ(config.learningRate, 1e-4); // the override wins
  EXPECT_EQ(config.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(config.tokenBudget, 4096);
  EXPECT_EQ(config.dataset, "data/train");
  EXPECT_EQ(config.devices, (std::vector<std::string>{"cuda:0", "cuda:1"}));
}

TEST(TrainConfig, WrittenConfigReadsBackEqual) {
  TempDir dir;
  TrainConfig config = loadTrainConfig("", {"optimizer.lr=6.1e-4", "train.seed=12345",
                                            "drafter.target_layer_ids=[2, 5]", "data.path=a b"});
  const std::string path = writeConfig(dir, toYaml(config));
  const TrainConfig again = loadTrainConfig(path);
  EXPECT_TRUE(again == config) << toYaml(config);
  EXPECT_TRUE(differingKeys(again, config, false).empty());
}

TEST(TrainConfig, ResumeComparisonSkipsTheKeysThatMayChange) {
  const TrainConfig a = loadTrainConfig("");
  const TrainConfig b = loadTrainConfig("", {"train.max_steps=100", "log.interval=5", "optimizer.lr=1e-3"});
  EXPECT_EQ(differingKeys(a, b, true), (std::vector<std::string>{"optimizer.lr"}));
  EXPECT_EQ(differingKeys(a, b, false),
            (std::vector<std::string>{"optimizer.lr", "train.max_steps", "log.interval"}));
}

TEST(TrainConfig, UnknownKeysNameTheClosestOne) {
  TempDir dir;
  const std::string path = writeConfig(dir, "optimizer:\n  learning_rate: 1e-4\n");
  expectError<FormatError>([&] { loadTrainConfig(path); },
                           {path + ":2:3", "unknown key 'optimizer.learning_rate'", "did you mean 'optimizer.lr'"});
  expectError<FormatError>([&] { loadTrainConfig("", {"drafter.block=8"}); },
                           {"--set drafter.block", "did you mean 'drafter.block_size'"});
  // A key in the wrong section.
  expectError<FormatError>([&] { loadTrainConfig("", {"train.lr=1"}); },
                           {"did you mean 'optimizer.lr'"});
}

TEST(TrainConfig, WrongTypesAndRangesNameTheKeyAndPlace) {
  TempDir dir;
  const std::string path = writeConfig(dir, "data:\n  max_anchors: many\n");
  expectError<FormatError>([&] { loadTrainConfig(path); },
                           {path + ":2:16", "data.max_anchors", "expected an integer", "many"});
  expectError<FormatError>([&] { loadTrainConfig("", {"drafter.block_size=1"}); },
                           {"--set drafter.block_size", "must be in [2, 256]", "got 1"});
  expectError<FormatError>([&] { loadTrainConfig("", {"optimizer.lr=-1"}); },
                           {"optimizer.lr", "must be in [0, 1]"});
  expectError<FormatError>([&] { loadTrainConfig("", {"data.token_budget=1.5"}); },
                           {"data.token_budget", "expected an integer"});
  expectError<FormatError>([&] { loadTrainConfig("", {"target.dtype=int8"}); },
                           {"target.dtype", "'int8' is not one of bfloat16, float16, float32"});
  expectError<FormatError>([&] { loadTrainConfig("", {"drafter.target_layer_ids=3"}); },
                           {"drafter.target_layer_ids", "expected a list"});
  expectError<FormatError>([&] { loadTrainConfig("", {"optimizer.lr="}); },
                           {"optimizer.lr", "has no value"});
  expectError<FormatError>([&] { loadTrainConfig("", {"optimizer.lr"}); }, {"expected key=value"});
}

TEST(TrainConfig, CrossKeyChecksNameTheKey) {
  expectError<FormatError>(
      [&] { loadTrainConfig("", {"drafter.num_layers=2", "drafter.layer_types=[full_attention]"}); },
      {"drafter.layer_types", "1 entries for drafter.num_layers = 2"});
  expectError<FormatError>([&] { loadTrainConfig("", {"optimizer.betas=[0.9]"}); },
                           {"optimizer.betas", "two values"});
  expectError<FormatError>([&] { loadTrainConfig("", {"devices=[tpu]"}); },
                           {"devices", "'tpu' is not cpu, cuda, pair or cuda:N"});
  expectError<FormatError>([&] {
    loadTrainConfig("", {"drafter.num_attention_heads=32", "drafter.num_key_value_heads=5"});
  }, {"drafter.num_key_value_heads", "must divide"});
}

TEST(TrainConfig, BadFilesAreNamed) {
  TempDir dir;
  expectError<IoError>([&] { loadTrainConfig(dir.file("missing.yaml")); }, {"missing.yaml"});
  const std::string broken = writeConfig(dir, "target: [unclosed\n");
  expectError<FormatError>([&] { loadTrainConfig(broken); }, {broken + ":"});
  const std::string list = writeConfig(dir, "- a\n- b\n");
  expectError<FormatError>([&] { loadTrainConfig(list); }, {"expected a map of keys"});
}

TEST(TrainConfig, DescriptionListsEveryKeyWithItsDefault) {
  const std::string text = describeTrainConfigKeys();
  std::set<std::string> names;
  for (const TrainConfigKey &key : trainConfigKeys()) {
    EXPECT_TRUE(names.insert(key.name).second) << "duplicate key " << key.name;
    EXPECT_NE(text.find(std::string("  ") + key.name + " ("), std::string::npos) << key.name;
  }
  EXPECT_NE(text.find("optimizer.lr (number, default 0.0006)"), std::string::npos) << text;
  EXPECT_NE(text.find("drafter.block_size (integer, default 16)"), std::string::npos) << text;
}

} // namespace

TEST(TrainConfig, EveryKeyIsDocumented) {
  const std::string doc =
      dflex::runtime::test::readBytes(std::string(DFLEX_TEST_SOURCE_DIR) + "/../../../docs/train.md");
  ASSERT_FALSE(doc.empty());
  for (const TrainConfigKey &key : trainConfigKeys())
    EXPECT_NE(doc.find("`" + std::string(key.name) + "`"), std::string::npos)
        << key.name << " is not in docs/train.md";
}
