// The target models' attention hook (attentionHook in KernelHooks.h): a
// layer's causal self-attention over the sequences of a TokenLayout, run by
// the attention op with a document-causal spec.
#include "dflex/runtime/models/KernelHooks.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/attention/AttentionOp.h"

#include <cmath>
#include <optional>

namespace dflex::runtime::models {

namespace {

constexpr const char *kDocumentIds = "document_ids";
constexpr const char *kWindow = "window";

/// What the hook knows of one of its specs.
struct HookSpec {
  const AttentionKernelSpec *spec; // owned by the hook's bundle
  std::string where; // "target attention (bundle ..., spec '...')"
  bool documents = false; // captures document_ids
};

/// The captures of one call in the spec's order: `documentIds` for
/// document_ids, `window` for window.
std::vector<torch::Tensor> hookCaptures(const AttentionKernelSpec &spec, const std::string &where,
                                        const torch::Tensor &documentIds,
                                        std::optional<int64_t> window) {
  std::vector<torch::Tensor> captures;
  for (const std::string &name : spec.captureNames()) {
    if (name == kDocumentIds)
      captures.push_back(documentIds);
    else if (name == kWindow && window)
      captures.push_back(torch::tensor(*window, torch::kLong));
    else
      throw FormatError(where + ": capture '" + name +
                        "' is not one the target model provides (document_ids; window in "
                        "sliding-window layers)");
  }
  return captures;
}

/// int32 [B, T] on the CPU: for each token, the index of its sequence in
/// `layout` (rows, or the segments of packed rows).
torch::Tensor documentIds(const TokenLayout &layout) {
  torch::Tensor ids = torch::full({layout.batch(), layout.length()}, -1, torch::kInt);
  auto view = ids.accessor<int32_t, 2>();
  int32_t document = 0;
  for (const TokenLayout::Segment &segment : layout.segments()) {
    for (int64_t t = segment.begin; t < segment.end; ++t)
      view[segment.row][t] = document;
    ++document;
  }
  return ids;
}

/// Evaluates the spec's mask on a probe row of two sequences (5 and 7
/// tokens; one sequence of 12 for a spec without document_ids) with a
/// window of 3, and throws unless it is the pattern the model computes:
/// query q sees key kv when both are in one sequence, kv <= q, and in a
/// sliding-window layer q - kv < window.
void checkMaskPattern(const AttentionKernelSpec &spec, const HookSpec &hook, bool sliding) {
  constexpr int64_t kLength = 12, kSecondSequence = 5, kWindow = 3;
  const torch::Tensor positions = torch::arange(kLength, torch::kLong);
  const torch::Tensor ids = hook.documents
                                ? (positions >= kSecondSequence).to(torch::kInt).unsqueeze(0)
                                : torch::zeros({1, kLength}, torch::kInt);
  const std::optional<int64_t> window = sliding ? std::optional<int64_t>(kWindow) : std::nullopt;
  const torch::Tensor mask =
      attentionMask(spec, hookCaptures(spec, hook.where, ids, window), 1, kLength, kLength);
  const torch::Tensor query = positions.unsqueeze(1), key = positions.unsqueeze(0);
  torch::Tensor expected = (ids[0].unsqueeze(1) == ids[0].unsqueeze(0)) & (key <= query);
  if (sliding)
    expected = expected & (query - key < kWindow);
  const torch::Tensor wrong = (mask[0] != expected.unsqueeze(0)).nonzero();
  if (wrong.size(0) == 0)
    return;
  const int64_t head = wrong[0][0].item<int64_t>(), q = wrong[0][1].item<int64_t>(),
                kv = wrong[0][2].item<int64_t>();
  const std::string pattern =
      std::string(hook.documents ? "document-causal" : "causal") +
      (sliding ? " sliding-window (q - kv < window)" : "");
  throw FormatError(hook.where + ": the mask is not the " + pattern + " pattern the model needs: " +
                    "on a probe row of " +
                    (hook.documents ? "sequences [0, 5) and [5, 12)" : "12 tokens") +
                    (sliding ? " with window 3" : "") + ", query " + std::to_string(q) +
                    " of head " + std::to_string(head) +
                    (mask[0][head][q][kv].item<bool>() ? " sees" : " does not see") + " key " +
                    std::to_string(kv));
}

HookSpec describeSpec(const KernelBundle &bundle, const std::string &name, bool sliding) {
  HookSpec hook;
  hook.spec = &bundle.attention(name);
  hook.where = "target attention (bundle " + bundle.directory() + ", spec '" + name + "')";
  const AttentionKernelSpec &spec = *hook.spec;
  if (spec.scoreMod)
    throw FormatError(hook.where + ": the spec has a score_mod ('" + spec.scoreMod->name +
                      "'); the model's attention scores are the plain scaled dot products");
  bool windowed = false;
  for (const std::string &capture : spec.captureNames()) {
    hook.documents = hook.documents || capture == kDocumentIds;
    windowed = windowed || capture == kWindow;
  }
  if (sliding && !windowed)
    throw FormatError(hook.where + ": the spec for sliding-window layers must capture the window");
  if (!sliding && windowed)
    throw FormatError(hook.where + ": the spec for full-attention layers captures a window; "
                                   "give it as the sliding-window spec");
  checkMaskPattern(spec, hook, sliding);
  return hook;
}

} // namespace

SelfAttentionFn attentionHook(const std::shared_ptr<const KernelBundle> &bundle,
                              const std::string &fullSpec, const std::string &slidingSpec) {
  const HookSpec full = describeSpec(*bundle, fullSpec, /*sliding=*/false);
  std::optional<HookSpec> sliding;
  if (!slidingSpec.empty())
    sliding = describeSpec(*bundle, slidingSpec, /*sliding=*/true);
  return [bundle, full, sliding](const SelfAttentionCall &call) {
    if (call.window && !sliding)
      throw FormatError("target attention (bundle " + bundle->directory() +
                        "): a sliding-window layer (window " + std::to_string(*call.window) +
                        ") needs a spec for sliding-window layers; the hook has none");
    const HookSpec &hook = call.window ? *sliding : full;
    const AttentionKernelSpec &spec = *hook.spec;
    const torch::Tensor &q = call.q, &k = call.k, &v = call.v;
    if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || q.size(2) != spec.numQHeads ||
        k.size(2) != spec.numKvHeads || q.size(3) != spec.qkHeadDim ||
        v.size(3) != spec.vHeadDim)
      throw FormatError(hook.where + ": the spec has " + std::to_string(spec.numQHeads) +
                        " query and " + std::to_string(spec.numKvHeads) +
                        " key/value heads of head_dim " + std::to_string(spec.qkHeadDim) +
                        ", the layer q " + c10::str(q.sizes()) + ", k " + c10::str(k.sizes()) +
                        ", v " + c10::str(v.sizes()) + " ([B, T, heads, head_dim])");
    if (std::abs(double(spec.scale) - call.scale) > 1e-6 * call.scale)
      throw FormatError(hook.where + ": the spec's scale " + std::to_string(spec.scale) +
                        " differs from the layer's " + std::to_string(call.scale));
    if (call.layout.isPacked() && !hook.documents)
      throw FormatError(hook.where + ": packed rows need a spec whose mask captures " +
                        "document_ids (the sequence of each token)");
    const torch::Tensor ids = hook.documents ? documentIds(call.layout) : torch::Tensor();
    return attention(bundle, spec, q, k, v,
                     hookCaptures(spec, hook.where, ids, call.window))
        .out;
  };
}

} // namespace dflex::runtime::models
