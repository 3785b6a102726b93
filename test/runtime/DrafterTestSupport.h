// Tiny drafters and packed rows for the drafter's and the trainer's tests.
#pragma once

#include "dflex/runtime/checkpoint/ModelConfig.h"
#include "dflex/runtime/data/Batching.h"
#include "dflex/runtime/support/Random.h"

#include <algorithm>
#include <string>
#include <vector>

namespace dflex::runtime::test {

constexpr int64_t kVocab = 300, kHidden = 48, kBlockSize = 4;

/// Three layers (full, sliding window, full), grouped heads, blocks of 4.
/// Gated-delta (linear_attention) layers: 2 key heads of 8, 4 value heads
/// of 6, a convolution of 3 taps.
inline DrafterConfig tinyDrafterConfig(const std::string &layerTypes = R"("full_attention", "sliding_attention", "full_attention")",
                                int64_t heads = 4, int64_t kvHeads = 2, int64_t headDim = 16) {
  const std::string json = R"({
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
    "vocab_size": 300, "hidden_size": 48, "intermediate_size": 80,
    "num_hidden_layers": )" + std::to_string(std::count(layerTypes.begin(), layerTypes.end(), ',') + 1) +
                           R"(, "num_attention_heads": )" + std::to_string(heads) +
                           R"(, "num_key_value_heads": )" + std::to_string(kvHeads) +
                           R"(, "head_dim": )" + std::to_string(headDim) + R"(,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "rope_theta": 10000.0, "rope_scaling": null, "tie_word_embeddings": false,
    "layer_types": [)" + layerTypes + R"(],
    "use_sliding_window": true, "sliding_window": 6,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
    "linear_value_head_dim": 6, "linear_conv_kernel_dim": 3,
    "block_size": 4, "num_target_layers": 6,
    "dflash_config": {"target_layer_ids": [1, 3], "block_size": 4, "mask_token_id": 299}
  })";
  return parseDrafterConfig(json, "tiny drafter config");
}

/// A row of `documents` (lengths) followed by padding up to `budget`;
/// every token in the loss mask.
inline PackedRow packedRow(const std::vector<int32_t> &documents, int32_t budget, uint64_t seed) {
  SplitMix64 random(seed);
  PackedRow row;
  row.documentStarts.push_back(0);
  int32_t document = 0;
  for (int32_t length : documents) {
    for (int32_t t = 0; t < length; ++t) {
      row.tokens.push_back(int32_t(random.below(kVocab - 1)));
      row.lossMask.push_back(1);
      row.positionIds.push_back(t);
      row.documentIds.push_back(document);
    }
    row.numTokens += length;
    row.documentStarts.push_back(row.numTokens);
    row.sampleIndices.push_back(uint64_t(document++));
  }
  while (int32_t(row.tokens.size()) < budget) {
    row.tokens.push_back(0);
    row.lossMask.push_back(0);
    row.positionIds.push_back(0);
    row.documentIds.push_back(-1);
  }
  return row;
}

} // namespace dflex::runtime::test
