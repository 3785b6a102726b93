// What a training configuration resolves to, checked before anything heavy
// is loaded: the target's config, the drafter's (sizes the config leaves at 0
// taken from the target, target_layer_ids spread over 1 .. L-3), the
// devices and dtypes, the kernel bundles' specs against the drafter's and
// the target's shapes, and a memory plan per device. `dflex-train --dry-run`
// prints it; the trainer builds from it. Problems are FormatErrors that name
// the config key.
#pragma once

#include "dflex/runtime/bundle/KernelBundle.h"
#include "dflex/runtime/checkpoint/ModelConfig.h"
#include "dflex/runtime/distributed/DataParallel.h"
#include "dflex/runtime/models/Drafter.h"
#include "dflex/runtime/train/TrainConfig.h"

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dflex::runtime {

/// Bytes by what holds them, on one device.
struct DeviceMemoryPlan {
  std::string device;
  std::vector<std::pair<std::string, uint64_t>> parts;
  uint64_t total() const;
};

struct TrainingPlan {
  TrainConfig config;
  /// This process among the data-parallel ranks (torchrun's environment).
  RankEnvironment ranks;
  TransformerConfig target;
  DrafterConfig drafter;
  torch::Device targetDevice = torch::kCPU, drafterDevice = torch::kCPU;
  torch::ScalarType targetDtype = torch::kBFloat16, drafterDtype = torch::kBFloat16;
  uint64_t targetParameters = 0, drafterParameters = 0;
  /// The target device's first (one entry when target and drafter share it).
  std::vector<DeviceMemoryPlan> memory;

  /// Devices, shapes, parameter counts and the memory plan, for people.
  std::string describe() const;
};

/// Resolves and checks `config` for the process `ranks` describes: the
/// target's config.json and safetensors (tensor shapes only, nothing is
/// loaded), the drafter's shapes, target layer ids against the target, the
/// bundles' specs (on CUDA devices). A device "cuda" is the local rank's GPU.
TrainingPlan planTraining(const TrainConfig &config, const RankEnvironment &ranks = {});

/// Throws FormatError (naming the key, the GPUs needed and those visible)
/// when the plan's devices are not among the `visibleGpus` GPUs.
void checkDevicesExist(const TrainingPlan &plan, int64_t visibleGpus);

/// The bundle of the drafter's sliding-window spec: kernels.drafter_sliding_bundle,
/// else kernels.drafter_bundle.
std::shared_ptr<const KernelBundle> drafterSlidingBundle(const TrainConfig &config);

/// The rule of the drafter's linear_attention layers through the dflex
/// gated-delta op (models::drafterGatedDeltaHook) when they run on CUDA and
/// kernels.drafter_gated_delta_spec is set, else empty (plain LibTorch).
/// Throws FormatError naming the key when the bundle or spec cannot serve.
models::DrafterGatedDeltaFn drafterGatedDeltaKernels(const TrainingPlan &plan);

/// Parameters of a drafter of `config` (fc, norms, layers), whose context
/// features are `numTargetLayers` states of width `targetHidden`.
uint64_t drafterParameterCount(const DrafterConfig &config, int64_t targetHidden);

/// "1.23 GiB", "456.0 MiB", "12 B".
std::string formatBytes(uint64_t bytes);

} // namespace dflex::runtime
