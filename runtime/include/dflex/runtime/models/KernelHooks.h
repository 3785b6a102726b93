// The models' hooks through the dflex ops: a target layer's causal
// self-attention by the attention op, a Qwen3.5 target layer's gated delta
// rule by the gated-delta op (TargetModelOptions, models/TargetModel.h), a
// drafter's gated-delta layers by the gated-delta op (DFlashDrafter's
// setGatedDelta). CUDA calls run the bundle's kernels, CPU calls the ops'
// float64 references (or the plain LibTorch recurrence).
#pragma once

#include "dflex/runtime/bundle/GatedDeltaBundle.h"
#include "dflex/runtime/bundle/KernelBundle.h"
#include "dflex/runtime/models/Drafter.h"
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

/// A DFlashDrafter::setGatedDelta rule through the gated-delta op, on CUDA
/// tensors by the spec's kernels and on CPU tensors by its float64
/// reference: one varlen call over the context runs and the blocks. A block
/// reads the state after its anchor through its initial-state queries
/// (initialStateQueries): they run as K probe tokens inserted into the
/// context run after the anchor (k, v, beta and g zero there, so the state
/// passes them unchanged), and the block's tokens run as a sequence of their
/// own from a zero state; the block's output is the sum of the two. The spec
/// must have gate scalar_log, delta_rule and varlen, no qk_l2norm (the hook
/// normalises q and k: the probes' queries are not unit vectors), no
/// in_kernel_gate, scale 1/sqrt(Dk), and heads(Hv, Hv) with the layers' dims
/// (the probes' queries are per value head, so the hook repeats the key
/// heads). Throws FormatError naming the bundle and the spec when it cannot
/// serve `layers`.
DrafterGatedDeltaFn drafterGatedDeltaHook(const std::shared_ptr<const GatedDeltaBundle> &bundle,
                                          const std::string &specName,
                                          const GatedDeltaConfig &layers);

} // namespace dflex::runtime::models
