// What a drafter step reads of a training batch: the data layer's
// TrainingBatch turned into the drafter model's inputs.
#pragma once

#include "dflex/runtime/data/Batching.h"
#include "dflex/runtime/models/Drafter.h"

#include <torch/types.h>

namespace dflex::runtime {

/// The drafter inputs of a training batch, on `device`; contextFeatures as
/// given (already on the device, [B, T, n * Ht]).
models::DrafterInputs drafterInputs(const TrainingBatch &batch,
                                    const torch::Tensor &contextFeatures, torch::Device device);

} // namespace dflex::runtime
