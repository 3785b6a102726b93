#include "dflex/runtime/train/TrainingPlan.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/bundle/GatedDeltaBundle.h"
#include "dflex/runtime/bundle/KernelBundle.h"
#include "dflex/runtime/checkpoint/SafeTensors.h"
#include "dflex/runtime/models/Drafter.h"
#include "dflex/runtime/models/KernelHooks.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace dflex::runtime {

namespace {

[[noreturn]] void fail(const std::string &key, const std::string &problem) {
  throw FormatError("config: " + key + ": " + problem);
}

/// Whether the drafter's linear_attention layers run through the dflex
/// gated-delta op (drafterGatedDeltaKernels).
bool gatedDeltaThroughOp(const TrainConfig &c, torch::Device drafterDevice) {
  return drafterDevice.is_cuda() && !c.drafterGatedDeltaSpec.empty();
}

torch::ScalarType dtypeOf(const std::string &name) {
  if (name == "bfloat16")
    return torch::kBFloat16;
  if (name == "float16")
    return torch::kHalf;
  return torch::kFloat;
}

/// A size the config may leave at 0 for the target's.
int64_t orTarget(int64_t configured, int64_t target) { return configured > 0 ? configured : target; }

/// The shapes of the drafter's gated-delta layers: the config's, else a
/// Qwen3.5 target's, else Qwen3.5's proportions for the hidden size H: head
/// dims min(128, H), value heads filling H, half as many key heads (as many
/// when odd), 4 taps (H = 4096: Qwen3.5-9B's 16 key and 32 value heads of
/// 128).
GatedDeltaConfig resolveGatedDelta(const TrainConfig &c, const TransformerConfig &target) {
  GatedDeltaConfig fallback;
  if (target.gatedDelta) {
    fallback = *target.gatedDelta;
  } else {
    fallback.keyHeadDim = fallback.valueHeadDim = std::min<int64_t>(128, target.hiddenSize);
    fallback.numValueHeads = std::max<int64_t>(1, target.hiddenSize / fallback.valueHeadDim);
    fallback.numKeyHeads = fallback.numValueHeads % 2 ? fallback.numValueHeads : fallback.numValueHeads / 2;
    fallback.convKernelDim = 4;
  }
  using G = GatedDeltaConfig;
  const std::pair<int64_t TrainConfig::*, int64_t G::*> shapes[] = {
      {&TrainConfig::linearNumKeyHeads, &G::numKeyHeads},
      {&TrainConfig::linearNumValueHeads, &G::numValueHeads},
      {&TrainConfig::linearKeyHeadDim, &G::keyHeadDim},
      {&TrainConfig::linearValueHeadDim, &G::valueHeadDim},
      {&TrainConfig::linearConvKernelDim, &G::convKernelDim}};
  G g;
  for (const auto &[configured, shape] : shapes)
    g.*shape = orTarget(c.*configured, fallback.*shape);
  if (g.numValueHeads % g.numKeyHeads)
    fail("drafter.linear_num_value_heads", std::to_string(g.numValueHeads) +
                                               " is not a multiple of the " +
                                               std::to_string(g.numKeyHeads) +
                                               " key heads (drafter.linear_num_key_heads)");
  return g;
}

DrafterConfig resolveDrafter(const TrainConfig &c, const TransformerConfig &target) {
  if (c.hiddenSize > 0 && c.hiddenSize != target.hiddenSize)
    fail("drafter.hidden_size", std::to_string(c.hiddenSize) +
                                    " differs from the target's hidden size " +
                                    std::to_string(target.hiddenSize) +
                                    " (the drafter reads the target's embedding and LM head)");
  DrafterConfig d;
  TransformerConfig &m = d.model;
  m.modelType = "qwen3";
  m.vocabSize = target.vocabSize;
  m.hiddenSize = target.hiddenSize;
  m.intermediateSize = orTarget(c.intermediateSize, target.intermediateSize);
  m.numHiddenLayers = c.drafterLayers;
  m.numAttentionHeads = orTarget(c.numAttentionHeads, target.numAttentionHeads);
  m.numKeyValueHeads = orTarget(c.numKeyValueHeads, target.numKeyValueHeads);
  m.headDim = orTarget(c.headDim, target.headDim);
  if (m.numAttentionHeads % m.numKeyValueHeads)
    fail("drafter.num_key_value_heads", std::to_string(m.numKeyValueHeads) +
                                            " does not divide the " +
                                            std::to_string(m.numAttentionHeads) + " query heads");
  m.maxPositionEmbeddings = target.maxPositionEmbeddings;
  m.rmsNormEps = target.rmsNormEps;
  m.hiddenAct = "silu";
  m.rope = target.rope;
  m.bosTokenId = target.bosTokenId;
  m.padTokenId = target.padTokenId;
  m.eosTokenIds = target.eosTokenIds;
  m.dtype = "bfloat16";
  for (int64_t i = 0; i < c.drafterLayers; ++i) {
    const std::string type = c.drafterLayerTypes.empty() ? "full_attention" : c.drafterLayerTypes[i];
    m.layerKinds.push_back(type == "sliding_attention"  ? LayerKind::SlidingAttention
                           : type == "linear_attention" ? LayerKind::LinearAttention
                                                        : LayerKind::FullAttention);
  }
  if (m.numLayersOf(LayerKind::SlidingAttention))
    m.slidingWindow = c.slidingWindow;
  if (m.numLayersOf(LayerKind::LinearAttention))
    m.gatedDelta = resolveGatedDelta(c, target);

  DFlashConfig &f = d.dflash;
  f.numTargetLayers = target.numHiddenLayers;
  f.targetLayerIds = c.targetLayerIds.empty()
                         ? defaultTargetLayerIds(target.numHiddenLayers, c.drafterLayers)
                         : c.targetLayerIds;
  for (int64_t id : f.targetLayerIds)
    if (id >= target.numHiddenLayers)
      fail("drafter.target_layer_ids", "layer " + std::to_string(id) + " is not below the target's " +
                                           std::to_string(target.numHiddenLayers) + " layers");
  f.blockSize = c.blockSize;
  if (c.maskTokenId < 0)
    fail("drafter.mask_token_id", "is not set: give the token id of the block's masked positions "
                                  "(e.g. the tokenizer's added mask token)");
  if (c.maskTokenId >= target.vocabSize)
    fail("drafter.mask_token_id", std::to_string(c.maskTokenId) + " is outside the target's vocabulary of " +
                                      std::to_string(target.vocabSize));
  f.maskTokenId = c.maskTokenId;
  return d;
}

uint64_t elementCount(const std::vector<int64_t> &shape) {
  uint64_t elements = 1;
  for (int64_t size : shape)
    elements *= uint64_t(size);
  return elements;
}

/// Parameters of the target as its checkpoint holds them (text model only).
uint64_t targetParameterCount(const std::string &directory) {
  const SafeTensorsCheckpoint checkpoint = SafeTensorsCheckpoint::open(directory);
  uint64_t count = 0;
  for (const std::string &name : checkpoint.names())
    if (name.find("visual") == std::string::npos && name.find("mtp.") == std::string::npos)
      count += elementCount(checkpoint.info(name).shape);
  return count;
}

void checkAttentionSpec(const KernelBundle &bundle, const std::string &key, const std::string &name,
                        int64_t heads, int64_t kvHeads, int64_t headDim) {
  if (name.empty())
    fail(key, "is empty but the bundle " + bundle.directory() + " is to serve these layers");
  const auto &specs = bundle.attentionSpecs();
  auto spec = std::find_if(specs.begin(), specs.end(), [&](const auto &s) { return s.name == name; });
  if (spec == specs.end()) {
    std::string names;
    for (const auto &s : specs)
      names += (names.empty() ? "" : ", ") + s.name;
    fail(key, "bundle " + bundle.directory() + " has no attention spec '" + name + "' (it has: " + names + ")");
  }
  if (spec->numQHeads != heads || spec->numKvHeads != kvHeads || spec->qkHeadDim != headDim ||
      spec->vHeadDim != headDim)
    fail(key, "spec '" + name + "' of " + bundle.directory() + " is heads(" +
                  std::to_string(spec->numQHeads) + ", " + std::to_string(spec->numKvHeads) +
                  ") head_dim(" + std::to_string(spec->qkHeadDim) + ") but the layers need heads(" +
                  std::to_string(heads) + ", " + std::to_string(kvHeads) + ") head_dim(" +
                  std::to_string(headDim) + ")");
}

void checkBundles(const TrainingPlan &plan) {
  const TrainConfig &c = plan.config;
  const TransformerConfig &d = plan.drafter.model;
  drafterGatedDeltaKernels(plan);
  if (plan.drafterDevice.is_cuda() && d.numLayersOf(LayerKind::LinearAttention) < d.numHiddenLayers) {
    if (c.drafterBundle.empty())
      fail("kernels.drafter_bundle", "is required on CUDA: compile the drafter's attention "
                                     "(examples/dflash.mlir with the drafter's heads) with dflex-compile");
    if (plan.drafterDtype != torch::kBFloat16)
      fail("drafter.dtype", "the drafter's CUDA kernels run in bfloat16");
    const auto bundle = KernelBundle::openCached(c.drafterBundle);
    checkAttentionSpec(*bundle, "kernels.drafter_full_spec", c.drafterFullSpec, d.numAttentionHeads,
                       d.numKeyValueHeads, d.headDim);
    const auto slidingBundle = drafterSlidingBundle(c);
    if (d.slidingWindow)
      checkAttentionSpec(*slidingBundle, "kernels.drafter_sliding_spec", c.drafterSlidingSpec,
                         d.numAttentionHeads, d.numKeyValueHeads, d.headDim);
    const models::BundleDrafterAttention attention(bundle, c.drafterFullSpec,
                                                   d.slidingWindow ? c.drafterSlidingSpec : "", slidingBundle);
    try {
      attention.checkMask(plan.drafter.dflash.blockSize);
    } catch (const FormatError &error) {
      fail("kernels.drafter_full_spec", error.what());
    }
    try {
      if (d.slidingWindow)
        attention.checkMask(plan.drafter.dflash.blockSize, d.slidingWindow);
    } catch (const FormatError &error) {
      fail("kernels.drafter_sliding_spec", error.what());
    }
  }
  const TransformerConfig &t = plan.target;
  if (plan.targetDevice.is_cuda() && !c.targetBundle.empty()) {
    const auto bundle = KernelBundle::openCached(c.targetBundle);
    checkAttentionSpec(*bundle, "kernels.target_full_spec", c.targetFullSpec, t.numAttentionHeads,
                       t.numKeyValueHeads, t.headDim);
    if (t.numLayersOf(LayerKind::SlidingAttention))
      checkAttentionSpec(*bundle, "kernels.target_sliding_spec", c.targetSlidingSpec,
                         t.numAttentionHeads, t.numKeyValueHeads, t.headDim);
  }
  if (plan.targetDevice.is_cuda() && !c.targetGatedDeltaBundle.empty())
    GatedDeltaBundle::openCached(c.targetGatedDeltaBundle)->spec(c.targetGatedDeltaSpec);
}

std::vector<DeviceMemoryPlan> memoryPlan(const TrainingPlan &p) {
  const TrainConfig &c = p.config;
  const TransformerConfig &t = p.target;
  const TransformerConfig &d = p.drafter.model;
  const uint64_t T = uint64_t(c.tokenBudget);
  const uint64_t Q = uint64_t(c.maxAnchors * c.blockSize); // block positions
  const uint64_t ts = c10::elementSize(p.targetDtype), ds = c10::elementSize(p.drafterDtype);
  const uint64_t n = p.drafter.dflash.targetLayerIds.size();

  DeviceMemoryPlan target{p.targetDevice.str(), {}};
  target.parts.push_back({"target weights", p.targetParameters * ts});
  const uint64_t attentionWidth = uint64_t((t.numAttentionHeads * 2 + 2 * t.numKeyValueHeads) * t.headDim);
  target.parts.push_back(
      {"target activations (one layer)", T * (4 * uint64_t(t.hiddenSize) + attentionWidth + 3 * uint64_t(t.intermediateSize)) * ts});
  if (c.targetBundle.empty())
    target.parts.push_back({"target attention scores (plain LibTorch)", T * T * uint64_t(t.numAttentionHeads) * 4});
  target.parts.push_back({"captured hidden states", n * T * uint64_t(t.hiddenSize) * ts});

  DeviceMemoryPlan drafter{p.drafterDevice.str(), {}};
  const uint64_t P = p.drafterParameters, H = uint64_t(d.hiddenSize);
  drafter.parts.push_back({"drafter weights", P * ds});
  drafter.parts.push_back({"drafter gradients", P * ds});
  drafter.parts.push_back({"AdamW master weights, moments, accumulated gradients (float32)", P * 16});
  const bool sharesWeights = p.targetDevice == p.drafterDevice && p.targetDtype == p.drafterDtype;
  if (!sharesWeights)
    drafter.parts.push_back({"frozen embedding and LM head", (t.tieWordEmbeddings ? 1 : 2) * uint64_t(t.vocabSize) * H * ds});
  if (p.targetDevice != p.drafterDevice)
    drafter.parts.push_back({"context features", n * T * H * ds});
  const uint64_t kvWidth = uint64_t(2 * d.numKeyValueHeads * d.headDim);
  const uint64_t qWidth = uint64_t(d.numAttentionHeads * d.headDim);
  const uint64_t I = uint64_t(d.intermediateSize);
  const uint64_t attentionLayers = uint64_t(d.numHiddenLayers - d.numLayersOf(LayerKind::LinearAttention));
  const uint64_t attentionLayer = (Q * (8 * H + 3 * qWidth + 3 * I) + (T + Q) * 3 * kvWidth + T * H) * ds;
  uint64_t activations = attentionLayer * attentionLayers + (T * n * H + 2 * T * H) * ds;
  if (d.gatedDelta) {
    // Per gated-delta layer: the projections, convolution and gated norm of
    // the context and the blocks, then the rule's part.
    const GatedDeltaConfig &g = *d.gatedDelta;
    const uint64_t Hv = uint64_t(g.numValueHeads), Dk = uint64_t(g.keyHeadDim), Dv = uint64_t(g.valueHeadDim);
    const uint64_t C = 2 * uint64_t(g.numKeyHeads) * Dk + Hv * Dv, chunk = 64;
    const uint64_t layers = uint64_t(d.numLayersOf(LayerKind::LinearAttention));
    const uint64_t N = uint64_t(c.maxAnchors);
    activations += layers * (Q * (8 * H + 3 * I + 3 * C + 3 * Hv * Dv) + T * 3 * C) * ds;
    if (gatedDeltaThroughOp(c, p.drafterDevice)) {
      // The op's call over the runs and 2 K tokens per block (probes and
      // the block): its bf16 inputs, float32 gates and betas, its
      // per-token workspace (w, u, delta and their gradient, decays) and per
      // chunk (a run's 64 tokens or a block) the inverse and the bf16 state
      // and its gradient.
      const uint64_t tokens = T + 2 * Q, chunks = (T + Q) / chunk + 2 * N;
      drafter.parts.push_back({"gated-delta op inputs and workspace",
                               layers * (tokens * Hv * (2 * (2 * Dk + Dv) + 8 + 12 + 2 * Dk + 6 * Dv) +
                                         chunks * Hv * (chunk * chunk * 2 + 4 * Dk * Dv))});
    } else {
      // The chunked LibTorch rule's per-token tensors and 64 x 64 decays
      // (float32); a state per chunk of the context; and per block its
      // state at the anchor, the copy gathered for the blocks' run and the
      // chunk's weighted keys [Dk, 64] per value head behind it.
      activations += layers * ((T + Q) * Hv * (4 * Dk + 3 * Dv + 3 * chunk) * 4 +
                               (T / chunk + 1) * Hv * Dk * Dv * 4);
      drafter.parts.push_back({"gated-delta states at the anchors (float32)",
                               layers * N * Hv * Dk * (2 * Dv + chunk) * 4});
    }
  }
  drafter.parts.push_back({"drafter activations kept for backward", activations});
  if (!p.drafterDevice.is_cuda())
    drafter.parts.push_back({"dense attention scores (CPU)", attentionLayers * 2 *
                                                                 uint64_t(d.numAttentionHeads) * Q * (T + Q) * 4});
  drafter.parts.push_back({"loss chunk logits", 2 * (uint64_t(256) << 20)});

  if (target.device == drafter.device) {
    target.parts.insert(target.parts.end(), drafter.parts.begin(), drafter.parts.end());
    return {target};
  }
  return {target, drafter};
}

} // namespace

std::shared_ptr<const KernelBundle> drafterSlidingBundle(const TrainConfig &c) {
  return KernelBundle::openCached(c.drafterSlidingBundle.empty() ? c.drafterBundle : c.drafterSlidingBundle);
}

models::DrafterGatedDeltaFn drafterGatedDeltaKernels(const TrainingPlan &plan) {
  const TrainConfig &c = plan.config;
  const TransformerConfig &d = plan.drafter.model;
  if (!d.numLayersOf(LayerKind::LinearAttention) || !gatedDeltaThroughOp(c, plan.drafterDevice))
    return {};
  const std::string &bundle = c.drafterGatedDeltaBundle.empty() ? c.drafterBundle : c.drafterGatedDeltaBundle;
  if (bundle.empty())
    fail("kernels.drafter_gated_delta_bundle",
         "is required on CUDA for linear_attention layers (or kernels.drafter_bundle): compile the "
         "drafter's gated-delta spec (examples/dflash.mlir's drafter_gated_delta, with the layers' "
         "heads) with dflex-compile, or set kernels.drafter_gated_delta_spec to \"\" for plain LibTorch");
  if (plan.drafterDtype != torch::kBFloat16)
    fail("drafter.dtype", "the drafter's CUDA kernels run in bfloat16");
  try {
    return models::drafterGatedDeltaHook(GatedDeltaBundle::openCached(bundle), c.drafterGatedDeltaSpec,
                                         *d.gatedDelta);
  } catch (const FormatError &error) {
    fail("kernels.drafter_gated_delta_spec", error.what());
  }
}

uint64_t DeviceMemoryPlan::total() const {
  uint64_t sum = 0;
  for (const auto &part : parts)
    sum += part.second;
  return sum;
}

uint64_t drafterParameterCount(const DrafterConfig &config, int64_t targetHidden) {
  const TransformerConfig &m = config.model;
  const uint64_t H = uint64_t(m.hiddenSize), D = uint64_t(m.headDim);
  const uint64_t q = uint64_t(m.numAttentionHeads) * D, kv = uint64_t(m.numKeyValueHeads) * D;
  const uint64_t mlpAndNorms = 3 * H * uint64_t(m.intermediateSize) + 2 * H;
  const uint64_t attention = H * q + 2 * H * kv + q * H + 2 * D;
  uint64_t gatedDelta = 0;
  if (m.gatedDelta)
    for (const models::GatedDeltaTensor &t : models::gatedDeltaTensors(*m.gatedDelta, m.hiddenSize))
      gatedDelta += elementCount(t.shape);
  const uint64_t linearLayers = uint64_t(m.numLayersOf(LayerKind::LinearAttention));
  const uint64_t context = uint64_t(targetHidden) * config.dflash.targetLayerIds.size();
  return context * H + 2 * H + uint64_t(m.numHiddenLayers) * mlpAndNorms +
         (uint64_t(m.numHiddenLayers) - linearLayers) * attention + linearLayers * gatedDelta;
}

std::string formatBytes(uint64_t bytes) {
  char text[32];
  if (bytes >= (uint64_t(1) << 30))
    std::snprintf(text, sizeof text, "%.2f GiB", double(bytes) / double(uint64_t(1) << 30));
  else if (bytes >= (uint64_t(1) << 20))
    std::snprintf(text, sizeof text, "%.1f MiB", double(bytes) / double(uint64_t(1) << 20));
  else
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  return text;
}

TrainingPlan planTraining(const TrainConfig &config, const RankEnvironment &ranks) {
  checkTrainConfig(config);
  TrainingPlan plan;
  plan.config = config;
  plan.ranks = ranks;
  if (config.targetDir.empty())
    fail("target.dir", "is not set: give the target's Hugging Face model directory");
  try {
    plan.target = loadTransformerConfig(config.targetDir);
    plan.targetParameters = targetParameterCount(config.targetDir);
  } catch (const FormatError &error) {
    fail("target.dir", error.what());
  } catch (const IoError &error) {
    fail("target.dir", error.what());
  }
  plan.drafter = resolveDrafter(config, plan.target);
  plan.drafterParameters = drafterParameterCount(plan.drafter, plan.target.hiddenSize);
  auto device = [&](const std::string &name) {
    return name == "cuda" ? torch::Device(torch::kCUDA, int8_t(ranks.localRank)) : torch::Device(name);
  };
  if (config.devices.front() == "pair") {
    plan.targetDevice = torch::Device(torch::kCUDA, int8_t(2 * ranks.localRank));
    plan.drafterDevice = torch::Device(torch::kCUDA, int8_t(2 * ranks.localRank + 1));
  } else {
    plan.targetDevice = device(config.devices.front());
    plan.drafterDevice = device(config.devices.back());
  }
  plan.targetDtype = dtypeOf(config.targetDtype);
  plan.drafterDtype = dtypeOf(config.drafterDtype);
  if (config.dataset.empty())
    fail("data.path", "is not set: give a dataset directory (dflex-data) or a tokenized JSONL file");
  checkBundles(plan);
  plan.memory = memoryPlan(plan);
  return plan;
}

void checkDevicesExist(const TrainingPlan &plan, int64_t visibleGpus) {
  const int64_t highest = std::max(plan.targetDevice.is_cuda() ? plan.targetDevice.index() : -1,
                                   plan.drafterDevice.is_cuda() ? plan.drafterDevice.index() : -1);
  if (highest < visibleGpus)
    return;
  const RankEnvironment &r = plan.ranks;
  const std::string &first = plan.config.devices.front();
  const int64_t perRank = first == "pair" ? 2 : 1;
  const std::string needed = first == "pair" || first == "cuda"
                                 ? std::to_string(perRank * r.localWorldSize) + " GPUs are needed for " +
                                       std::to_string(r.localWorldSize) + " local rank(s) of '" + first +
                                       "', "
                                 : "";
  fail("devices", "local rank " + std::to_string(r.localRank) + " would use cuda:" + std::to_string(highest) +
                      ": " + needed + std::to_string(visibleGpus) + " GPU(s) are visible");
}

std::string TrainingPlan::describe() const {
  std::ostringstream out;
  const TransformerConfig &d = drafter.model;
  out << "target: " << config.targetDir << " (" << target.modelType << ", " << target.numHiddenLayers
      << " layers, hidden " << target.hiddenSize << ", vocab " << target.vocabSize << ", "
      << targetParameters << " parameters) on " << targetDevice << " in " << config.targetDtype << "\n";
  out << "drafter: " << d.numHiddenLayers << " layers [";
  for (size_t i = 0; i < d.layerKinds.size(); ++i)
    out << (i ? ", " : "") << toString(d.layerKinds[i]);
  out << "], heads " << d.numAttentionHeads << "/" << d.numKeyValueHeads << " x " << d.headDim;
  if (d.gatedDelta)
    out << ", gated-delta heads " << d.gatedDelta->numKeyHeads << " x " << d.gatedDelta->keyHeadDim
        << " / " << d.gatedDelta->numValueHeads << " x " << d.gatedDelta->valueHeadDim << ", conv "
        << d.gatedDelta->convKernelDim
        << (gatedDeltaThroughOp(config, drafterDevice)
                ? " (gated-delta op, spec " + config.drafterGatedDeltaSpec + ")"
                : " (LibTorch rule)");
  out << ", intermediate " << d.intermediateSize << ", block " << drafter.dflash.blockSize
      << ", target layers [";
  for (size_t i = 0; i < drafter.dflash.targetLayerIds.size(); ++i)
    out << (i ? ", " : "") << drafter.dflash.targetLayerIds[i];
  out << "], " << drafterParameters << " parameters on " << drafterDevice << " in " << config.drafterDtype
      << "\n";
  out << "step: " << config.tokenBudget << " context tokens, up to " << config.maxAnchors
      << " blocks, " << config.gradAccumulation << " micro-step(s) per update\n";
  for (const DeviceMemoryPlan &device : memory) {
    out << "memory on " << device.device << " (estimate): " << formatBytes(device.total()) << "\n";
    for (const auto &[what, bytes] : device.parts)
      out << "  " << formatBytes(bytes) << "  " << what << "\n";
  }
  return out.str();
}

} // namespace dflex::runtime
