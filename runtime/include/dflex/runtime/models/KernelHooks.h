// The target models' hooks through the dflex ops: a layer's causal
// self-attention by the attention op, a Qwen3.5 layer's gated delta rule by
// the gated-delta op (TargetModelOptions, models/TargetModel.h). CUDA calls
// run the bundle's kernels, CPU calls the ops' float64 references (or the
// plain LibTorch recurrence).
#pragma once

#include "dflex/runtime/bundle/GatedDeltaBundle.h"
#include "dflex/runtime/bundle/KernelBundle.h"
#include "dflex/runtime/models/TargetModel.h"

#include <memory>
#include <string>

namespace dflex::runtime::models {

/// A TargetModelOptions::attention hook: a target model's causal
/// self-attention through this op, the bundle's kernels on CUDA tensors and
/// the float64 reference on CPU tensors. `fullSpec` serves full-attention
/// layers and `slidingSpec` (may be empty) sliding-window layers. Captures
/// are bound by name: "document_ids" (int32 [B, T], the sequence of each
/// token in the call's TokenLayout, so that packed rows stay apart) and
/// "window" (the layer's window; the sliding spec must take it, the full
/// spec must not). A spec without document_ids serves one sequence per row
/// only. Creating the hook checks, on a small probe, that each spec's mask
/// is the document-causal pattern (within the window for the sliding spec);
/// each call checks the layer's heads, head dim and scale against the spec.
/// Throws FormatError naming the bundle, the spec and the problem.
SelfAttentionFn attentionHook(const std::shared_ptr<const KernelBundle> &bundle,
                              const std::string &fullSpec, const std::string &slidingSpec = {});


/// A TargetModelOptions::gatedDelta hook: CUDA calls run the spec's kernels,
/// CPU calls gatedDeltaRule. The spec must match the model's layers:
/// gate scalar_log, delta rule, qk_l2norm, no in-kernel gate, scale
/// 1/sqrt(Dk), the layers' heads and dims (checked per call); packed rows
/// need a varlen spec. Throws FormatError when the spec cannot serve.
GatedDeltaFn gatedDeltaHook(const std::shared_ptr<const GatedDeltaBundle> &bundle,
                            const std::string &specName);


} // namespace dflex::runtime::models
