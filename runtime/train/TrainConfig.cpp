#include "dflex/runtime/train/TrainConfig.h"

#include "dflex/Support/Error.h"
#include "dflex/Support/File.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace dflex::runtime {

namespace {

using Key = TrainConfigKey;
using T = TrainConfig;

constexpr double kMaxInt = 9.0e15; // exactly representable, beyond any count here

/// The shortest decimal form that reads back as `value`.
std::string shortest(double value) {
  for (int precision = 1;; ++precision) {
    std::ostringstream text;
    text.precision(precision);
    text << value;
    if (precision >= 17 || std::stod(text.str()) == value)
      return text.str();
  }
}

/// "in [a, b]", or "at least a" for counts with no upper bound.
std::string rangeText(const TrainConfigKey &key) {
  std::ostringstream text;
  if (key.max && *key.max >= kMaxInt)
    text << "at least " << key.min.value_or(0);
  else
    text << "in [" << key.min.value_or(-INFINITY) << ", " << key.max.value_or(INFINITY) << "]";
  return text.str();
}

} // namespace

const std::vector<TrainConfigKey> &trainConfigKeys() {
  static const std::vector<Key> keys = {
      {"target.dir", &T::targetDir, "Hugging Face model directory of the target (config.json, safetensors)"},
      {"target.dtype", &T::targetDtype, "dtype the target runs in", {}, {}, {"bfloat16", "float16", "float32"}},
      {"drafter.num_layers", &T::drafterLayers, "decoder layers of the drafter", 1, 64},
      {"drafter.layer_types", &T::drafterLayerTypes,
       "per drafter layer; empty: all full_attention", {}, {},
       {"full_attention", "sliding_attention", "linear_attention"}},
      {"drafter.dtype", &T::drafterDtype, "dtype the drafter trains in (AdamW state is float32)", {}, {},
       {"bfloat16", "float32"}},
      {"drafter.sliding_window", &T::slidingWindow, "window of sliding_attention layers (keys, the query's own included)", 1, kMaxInt},
      {"drafter.hidden_size", &T::hiddenSize, "0: the target's", 0, 65536},
      {"drafter.intermediate_size", &T::intermediateSize, "0: the target's", 0, 262144},
      {"drafter.num_attention_heads", &T::numAttentionHeads, "0: the target's", 0, 1024},
      {"drafter.num_key_value_heads", &T::numKeyValueHeads, "0: the target's", 0, 1024},
      {"drafter.head_dim", &T::headDim, "0: the target's", 0, 1024},
      {"drafter.linear_num_key_heads", &T::linearNumKeyHeads,
       "key heads of linear_attention (gated delta) layers; 0: the target's, else derived from the hidden size", 0, 1024},
      {"drafter.linear_num_value_heads", &T::linearNumValueHeads,
       "their value heads, a multiple of the key heads; 0: the target's, else derived", 0, 1024},
      {"drafter.linear_key_head_dim", &T::linearKeyHeadDim, "their key head dim; 0: the target's, else derived", 0, 1024},
      {"drafter.linear_value_head_dim", &T::linearValueHeadDim, "their value head dim; 0: the target's, else derived", 0, 1024},
      {"drafter.linear_conv_kernel_dim", &T::linearConvKernelDim,
       "taps of their causal convolution; 0: the target's, else 4", 0, 64},
      {"drafter.target_layer_ids", &T::targetLayerIds,
       "target layers whose hidden states the drafter reads; empty: spread over 1 .. L-3", 0, 4096},
      {"drafter.block_size", &T::blockSize, "tokens per drafted block (anchor + block_size - 1 predictions)", 2, 256},
      {"drafter.mask_token_id", &T::maskTokenId, "token id of the block's masked positions (-1: not set)", -1, kMaxInt},
      {"kernels.drafter_bundle", &T::drafterBundle,
       "bundle directory (dflex-compile) of the drafter's attention; required on CUDA for attention layers"},
      {"kernels.drafter_full_spec", &T::drafterFullSpec, "its spec for full_attention layers"},
      {"kernels.drafter_sliding_spec", &T::drafterSlidingSpec, "its spec for sliding_attention layers"},
      {"kernels.drafter_sliding_bundle", &T::drafterSlidingBundle,
       "bundle of that spec (examples/dflash_sliding_window.mlir); empty: kernels.drafter_bundle"},
      {"kernels.drafter_gated_delta_bundle", &T::drafterGatedDeltaBundle,
       "bundle of the drafter's linear_attention (gated delta) layers on CUDA; empty: kernels.drafter_bundle"},
      {"kernels.drafter_gated_delta_spec", &T::drafterGatedDeltaSpec,
       "its gated-delta spec, heads(Hv, Hv) without qk_l2norm (docs/train.md); empty: plain LibTorch"},
      {"kernels.target_bundle", &T::targetBundle,
       "bundle of the target's document-causal attention on CUDA (empty: plain LibTorch)"},
      {"kernels.target_full_spec", &T::targetFullSpec, "its spec for full-attention layers"},
      {"kernels.target_sliding_spec", &T::targetSlidingSpec, "its spec for sliding-window layers"},
      {"kernels.target_gated_delta_bundle", &T::targetGatedDeltaBundle,
       "bundle of the target's gated-delta layers on CUDA (empty: plain LibTorch)"},
      {"kernels.target_gated_delta_spec", &T::targetGatedDeltaSpec, "its gated-delta spec"},
      {"data.path", &T::dataset, "binary dataset directory (dflex-data) or tokenized JSONL"},
      {"data.token_budget", &T::tokenBudget, "context tokens packed into one step", 1, kMaxInt},
      {"data.max_anchors", &T::maxAnchors, "anchors (blocks) per row at most", 1, 65536},
      {"loss.gamma", &T::lossGamma, "block position k weighs exp(-(k-1)/gamma)", 1e-6, 1e6},
      {"optimizer.lr", &T::learningRate, "AdamW peak learning rate", 0, 1, {}, false, "learning_rate"},
      {"optimizer.betas", &T::betas, "AdamW betas (two values)", 0, 1},
      {"optimizer.eps", &T::eps, "AdamW epsilon", 0, 1},
      {"optimizer.weight_decay", &T::weightDecay, "AdamW decoupled weight decay", 0, 1},
      {"optimizer.warmup_ratio", &T::warmupRatio, "share of the steps with a linear warmup, then cosine decay", 0, 1},
      {"optimizer.grad_clip", &T::gradClip, "gradient-norm clip (0: none)", 0, 1e9},
      {"optimizer.grad_accumulation", &T::gradAccumulation, "steps whose gradients make one update", 1, 65536},
      {"train.epochs", &T::epochs, "passes over the dataset", 1, 1e6, {}, false, "num_epochs"},
      {"train.max_steps", &T::maxSteps, "updates at most (0: the epochs decide)", 0, kMaxInt, {}, true},
      {"train.seed", &T::seed, "seed of parameter init, data order and anchors", 0, kMaxInt},
      {"train.max_bad_steps", &T::maxBadSteps, "consecutive NaN/Inf steps skipped before the run aborts", 1, 1e6},
      {"checkpoint.dir", &T::checkpointDir, "directory of the run's checkpoints"},
      {"checkpoint.interval", &T::checkpointInterval, "updates between checkpoints", 1, kMaxInt, {}, true},
      {"checkpoint.keep_last", &T::keepLast, "checkpoints kept (the one 'latest' names always is)", 1, 1e6, {}, true},
      {"log.dir", &T::logDir, "metrics.jsonl, plots and TensorBoard scalars (empty: checkpoint.dir)", {}, {}, {}, true},
      {"log.interval", &T::logInterval, "updates between log lines", 1, kMaxInt, {}, true},
      {"log.eval_interval", &T::evalInterval,
       "updates between speculative-decoding evaluations on log.eval_prompts (0: none)", 0, kMaxInt, {}, true},
      {"log.eval_prompts", &T::evalPrompts, "JSONL of held-out prompts (token ids or chat records, as dflex-eval reads them) for the evaluations", {}, {}, {}, true},
      {"log.eval_max_new_tokens", &T::evalMaxNewTokens, "tokens generated per evaluation prompt", 1, 1e6, {}, true},
      {"devices", &T::devices,
       "cpu; cuda (target and drafter on the local rank's GPU); pair (the local rank r's target on GPU 2r, "
       "drafter on 2r+1); cuda:N; or two devices: target's, drafter's", {}, {}, {}, true},
      {"distributed.timeout_s", &T::distributedTimeoutSeconds,
       "seconds a collective waits for the other ranks before the run stops naming it", 1, 86400, {}, true},
  };
  return keys;
}

namespace {

const Key *findKey(const std::string &name) {
  for (const Key &key : trainConfigKeys())
    if (name == key.name)
      return &key;
  return nullptr;
}

size_t editDistance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string unknownKey(const std::string &name) {
  const Key *closest = nullptr;
  size_t best = std::numeric_limits<size_t>::max();
  for (const Key &key : trainConfigKeys()) {
    const std::string candidate = key.name;
    // The last component alone catches a key put in the wrong section.
    const std::string leaf = candidate.substr(candidate.rfind('.') + 1);
    const std::string nameLeaf = name.substr(name.rfind('.') + 1);
    size_t distance = std::min(editDistance(name, candidate), editDistance(nameLeaf, leaf) + 1);
    if (candidate.rfind(name, 0) == 0 || (key.otherName && nameLeaf == key.otherName))
      distance = std::min<size_t>(distance, 1); // a key cut short, or another trainer's name

    if (distance < best) {
      best = distance;
      closest = &key;
    }
  }
  return "unknown key '" + name + "' (did you mean '" + closest->name + "'?)";
}

std::string typeName(const Key::Field &field) {
  switch (field.index()) {
  case 0:
    return "integer";
  case 1:
    return "number";
  case 2:
    return "string";
  case 3:
    return "list of integers";
  case 4:
    return "list of numbers";
  default:
    return "list of strings";
  }
}

/// Where a YAML node was written: "file:line:col" or the --set it came from.
std::string located(const std::string &source, const YAML::Node &node) {
  const YAML::Mark mark = node.Mark();
  if (mark.line < 0)
    return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

class KeyReader {
public:
  KeyReader(const Key &key, std::string where) : key_(key), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string &problem) const {
    throw FormatError(where_ + ": " + key_.name + ": " + problem);
  }

  double number(const YAML::Node &node, bool integral) const {
    if (!node.IsScalar())
      fail("expected " + std::string(integral ? "an integer" : "a number"));
    double value = 0;
    try {
      if (integral) {
        value = static_cast<double>(node.as<int64_t>());
      } else {
        value = node.as<double>();
      }
    } catch (const YAML::Exception &) {
      fail("expected " + std::string(integral ? "an integer" : "a number") + ", got '" +
           node.Scalar() + "'");
    }
    if (!std::isfinite(value))
      fail("must be finite, got '" + node.Scalar() + "'");
    if ((key_.min && value < *key_.min) || (key_.max && value > *key_.max))
      fail("must be " + rangeText(key_) + ", got " + node.Scalar());
    return value;
  }

  std::string string(const YAML::Node &node) const {
    if (!node.IsScalar())
      fail("expected a string");
    const std::string &value = node.Scalar();
    if (!key_.choices.empty() &&
        std::find(key_.choices.begin(), key_.choices.end(), value) == key_.choices.end()) {
      std::string choices;
      for (const std::string &choice : key_.choices)
        choices += (choices.empty() ? "" : ", ") + choice;
      fail("'" + value + "' is not one of " + choices);
    }
    return value;
  }

  template <typename Element, typename Read>
  std::vector<Element> list(const YAML::Node &node, Read read) const {
    if (!node.IsSequence())
      fail("expected a list ([a, b, ...])");
    std::vector<Element> values;
    for (const YAML::Node &element : node)
      values.push_back(read(element));
    return values;
  }

  void assign(TrainConfig &config, const YAML::Node &node) const {
    std::visit(
        [&](auto member) {
          using Value = std::remove_reference_t<decltype(config.*member)>;
          if constexpr (std::is_same_v<Value, int64_t>)
            config.*member = static_cast<int64_t>(number(node, true));
          else if constexpr (std::is_same_v<Value, double>)
            config.*member = number(node, false);
          else if constexpr (std::is_same_v<Value, std::string>)
            config.*member = string(node);
          else if constexpr (std::is_same_v<Value, std::vector<int64_t>>)
            config.*member = list<int64_t>(
                node, [&](const YAML::Node &e) { return static_cast<int64_t>(number(e, true)); });
          else if constexpr (std::is_same_v<Value, std::vector<double>>)
            config.*member = list<double>(node, [&](const YAML::Node &e) { return number(e, false); });
          else
            config.*member = list<std::string>(node, [&](const YAML::Node &e) { return string(e); });
        },
        key_.field);
  }

private:
  const Key &key_;
  std::string where_;
};

/// Applies every leaf of the map `node` (keys nested under `prefix`).
void applyMap(TrainConfig &config, const YAML::Node &node, const std::string &prefix,
              const std::string &source) {
  for (const auto &entry : node) {
    const std::string name = prefix + entry.first.as<std::string>();
    const YAML::Node &value = entry.second;
    const Key *key = findKey(name);
    if (!key && value.IsMap()) {
      applyMap(config, value, name + ".", source);
      continue;
    }
    if (!key)
      throw FormatError(located(source, entry.first) + ": " + unknownKey(name));
    if (value.IsNull())
      throw FormatError(located(source, entry.first) + ": " + name + ": has no value");
    KeyReader(*key, located(source, value)).assign(config, value);
  }
}

YAML::Node parseYaml(const std::string &text, const std::string &source) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception &error) {
    throw FormatError(source + ":" + std::to_string(error.mark.line + 1) + ":" +
                      std::to_string(error.mark.column + 1) + ": " + error.msg);
  }
}

void applyOverride(TrainConfig &config, const std::string &assignment) {
  const size_t equals = assignment.find('=');
  if (equals == std::string::npos || equals == 0)
    throw FormatError("--set " + assignment + ": expected key=value");
  const std::string name = assignment.substr(0, equals);
  const std::string where = "--set " + assignment;
  const Key *key = findKey(name);
  if (!key)
    throw FormatError(where + ": " + unknownKey(name));
  const YAML::Node value = parseYaml(assignment.substr(equals + 1), where);
  if (!value.IsDefined() || value.IsNull())
    throw FormatError(where + ": " + name + ": has no value");
  KeyReader(*key, where).assign(config, value);
}

void emitValue(YAML::Emitter &out, const TrainConfig &config, const Key::Field &field) {
  std::visit(
      [&](auto member) {
        const auto &value = config.*member;
        using Value = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<Value, double>) {
          out << YAML::Value << shortest(value);
        } else if constexpr (std::is_same_v<Value, std::vector<double>>) {
          out << YAML::Value << YAML::Flow << YAML::BeginSeq;
          for (double element : value)
            out << shortest(element);
          out << YAML::EndSeq;
        } else if constexpr (std::is_same_v<Value, int64_t> || std::is_same_v<Value, std::string>) {
          out << YAML::Value << value;
        } else {
          out << YAML::Value << YAML::Flow << value;
        }
      },
      field);
}

bool equalField(const TrainConfig &a, const TrainConfig &b, const Key::Field &field) {
  return std::visit([&](auto member) { return a.*member == b.*member; }, field);
}

} // namespace

TrainConfig loadTrainConfig(const std::string &path, const std::vector<std::string> &overrides) {
  TrainConfig config;
  if (!path.empty()) {
    Result<std::string> text = readFile(path);
    if (!text.ok())
      throw IoError(text.error());
    const YAML::Node root = parseYaml(text.value(), path);
    if (root.IsDefined() && !root.IsNull()) {
      if (!root.IsMap())
        throw FormatError(located(path, root) + ": expected a map of keys");
      applyMap(config, root, "", path);
    }
  }
  for (const std::string &assignment : overrides)
    applyOverride(config, assignment);
  checkTrainConfig(config);
  return config;
}

void checkTrainConfig(const TrainConfig &c) {
  auto fail = [](const std::string &key, const std::string &problem) {
    throw FormatError("config: " + key + ": " + problem);
  };
  if (!c.drafterLayerTypes.empty() && int64_t(c.drafterLayerTypes.size()) != c.drafterLayers)
    fail("drafter.layer_types", "has " + std::to_string(c.drafterLayerTypes.size()) +
                                    " entries for drafter.num_layers = " +
                                    std::to_string(c.drafterLayers));
  if (c.evalInterval > 0 && c.evalPrompts.empty())
    fail("log.eval_prompts", "is needed for log.eval_interval = " + std::to_string(c.evalInterval));
  if (c.betas.size() != 2)
    fail("optimizer.betas", "needs two values, got " + std::to_string(c.betas.size()));
  if (c.devices.empty() || c.devices.size() > 2)
    fail("devices", "needs one device (target and drafter) or two (target, drafter), got " +
                        std::to_string(c.devices.size()));
  for (const std::string &device : c.devices)
    if (device != "cpu" && device != "cuda" && device != "pair" && device.rfind("cuda:", 0) != 0)
      fail("devices", "'" + device + "' is not cpu, cuda, pair or cuda:N");
  if (c.devices.front() == "pair" && c.devices.size() != 1)
    fail("devices", "pair names both devices of a rank; give it alone");
  if (c.numKeyValueHeads > 0 && c.numAttentionHeads > 0 && c.numAttentionHeads % c.numKeyValueHeads)
    fail("drafter.num_key_value_heads", "must divide drafter.num_attention_heads (" +
                                            std::to_string(c.numAttentionHeads) + ")");
}

std::string toYaml(const TrainConfig &config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const Key &key : trainConfigKeys()) {
    const std::string name = key.name;
    const size_t dot = name.find('.');
    const std::string keySection = dot == std::string::npos ? "" : name.substr(0, dot);
    if (keySection != section) {
      if (!section.empty())
        out << YAML::EndMap;
      if (!keySection.empty())
        out << YAML::Key << keySection << YAML::Value << YAML::BeginMap;
      section = keySection;
    }
    out << YAML::Key << (dot == std::string::npos ? name : name.substr(dot + 1));
    emitValue(out, config, key.field);
  }
  if (!section.empty())
    out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::vector<std::string> differingKeys(const TrainConfig &a, const TrainConfig &b,
                                       bool ignoreResumable) {
  std::vector<std::string> keys;
  for (const Key &key : trainConfigKeys())
    if (!(ignoreResumable && key.changesOnResume) && !equalField(a, b, key.field))
      keys.push_back(key.name);
  return keys;
}

bool operator==(const TrainConfig &a, const TrainConfig &b) {
  return differingKeys(a, b, false).empty();
}

std::string describeTrainConfigKeys() {
  const TrainConfig defaults;
  std::ostringstream text;
  for (const Key &key : trainConfigKeys()) {
    YAML::Emitter value;
    value << YAML::BeginMap << YAML::Key << "v";
    emitValue(value, defaults, key.field);
    value << YAML::EndMap;
    std::string shown = value.c_str();
    shown = shown.substr(shown.find(':') + 1);
    shown.erase(0, shown.find_first_not_of(' '));
    text << "  " << key.name << " (" << typeName(key.field) << ", default "
         << (shown.empty() ? "\"\"" : shown) << ")";
    if (key.min || key.max)
      text << " " << rangeText(key);
    if (!key.choices.empty()) {
      text << " one of";
      for (const std::string &choice : key.choices)
        text << " " << choice;
    }
    if (key.changesOnResume)
      text << " [may change on resume]";
    text << "\n      " << key.help << "\n";
  }
  return text.str();
}

} // namespace dflex::runtime
