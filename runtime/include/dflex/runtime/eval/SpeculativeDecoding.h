// Greedy speculative decoding with a DFlash drafter, as serving engines run
// it: the drafter proposes block_size - 1 tokens from [last token, mask x
// (block_size - 1)] and the target's hidden states of the tokens before it;
// the target verifies the block in one forward, and the longest prefix it
// agrees with plus the target's own next token (the bonus) is kept. The
// generated tokens are the target's greedy decoding, token for token.
//
// The target decodes with a cache (TargetCache: attention keys and values,
// gated-delta and convolution states), rolled back to the accepted prefix
// after each verification; the target-alone baseline uses the same cache.
#pragma once

#include "dflex/runtime/models/Drafter.h"
#include "dflex/runtime/models/TargetModel.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dflex::runtime::eval {

struct GenerationOptions {
  int64_t maxNewTokens = 256;
  /// Generation ends after any of these (it is kept).
  std::vector<int64_t> stopTokens;
};

struct Generation {
  std::vector<int64_t> tokens;        ///< after the prompt
  std::vector<int64_t> acceptedDrafts; ///< per verification: draft tokens the target kept
  /// Accepted drafts + 1 (the bonus), averaged over the verifications.
  double acceptanceLength() const;
};

/// The target alone, greedy: the reference speculative decoding must equal.
std::vector<int64_t> greedyDecode(const models::TargetModel &target, const std::vector<int64_t> &prompt,
                                  const GenerationOptions &options);

/// Greedy speculative decoding of `prompt` (the drafter's target weights
/// set, on the target's device).
Generation speculativeDecode(const models::TargetModel &target, models::DFlashDrafterImpl &drafter,
                             const std::vector<int64_t> &prompt, const GenerationOptions &options);

/// Over many responses: tau as the DFlash authors report it (each
/// response's acceptance length, then their mean), and per block position
/// k = 1 .. K-1 the share of verifications that accepted at least k drafts.
struct AcceptanceSummary {
  double tau = 0;
  std::vector<double> acceptedAtLeast;
  int64_t responses = 0, verifications = 0, tokens = 0;
};
AcceptanceSummary summarize(const std::vector<Generation> &generations, int64_t blockSize);

} // namespace dflex::runtime::eval
