#include "dflex/runtime/train/DrafterInputs.h"

namespace dflex::runtime {

models::DrafterInputs drafterInputs(const TrainingBatch &batch,
                                    const torch::Tensor &contextFeatures, torch::Device device) {
  models::DrafterInputs in;
  in.contextFeatures = contextFeatures;
  in.contextPositions = batch.positionIds.to(device, torch::kLong);
  in.blockTokens = batch.blockTokens.to(device, torch::kLong);
  in.blockPositions = batch.blockPositionIds.to(device, torch::kLong);
  in.blocks.anchors = batch.anchors.to(device, torch::kLong);
  in.blocks.blockValid = batch.blockValid.to(device, torch::kBool);
  in.blocks.contextStart = batch.contextStart.to(device, torch::kLong);
  in.blocks.blockSize = batch.blockTokens.size(2);
  in.blocks.contextLength = batch.tokens.size(1);
  return in;
}

} // namespace dflex::runtime
