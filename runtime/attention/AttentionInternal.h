// Pieces of the attention op shared by its CPU reference and CUDA paths.
#pragma once

#include "dflex/Analysis/TileList.h"
#include "dflex/Codegen/Variant.h"
#include "dflex/runtime/attention/AttentionOp.h"
#include "dflex/runtime/bundle/KernelBundle.h"

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dflex::runtime::detail {

/// Sizes of one attention call, checked against its spec.
struct AttentionProblem {
  int64_t batch = 0;
  int64_t queryLength = 0;
  int64_t keyLength = 0;
  int64_t qHeads = 0;
  int64_t kvHeads = 0;
  int64_t qkHeadDim = 0;
  int64_t vHeadDim = 0;
};

/// Checks q, k, v against `spec` (ranks, heads, head dims, one dtype and
/// device); throws FormatError naming the spec and the tensor.
AttentionProblem checkInputs(const AttentionKernelSpec &spec, const torch::Tensor &q,
                             const torch::Tensor &k, const torch::Tensor &v);

/// Capture values bound to a spec's variant layout, on the host (to evaluate
/// the programs) and/or on the device (for the kernels).
struct BoundCaptures {
  std::vector<expr::CaptureValue> host;   // layout order; empty unless asked for
  std::vector<expr::CaptureValue> device; // layout order; empty unless asked for
  std::vector<torch::Tensor> keepAlive;   // tensors the values point into

  /// The host values of `program`'s captures, in its declaration order.
  std::vector<expr::CaptureValue> forProgram(const expr::Program &program,
                                             const codegen::VariantLayout &layout) const;
  /// The variant bytes of the device values.
  std::vector<uint8_t> packDevice(const AttentionKernelSpec &spec) const;
};

/// Binds `captures` (the op's list, in layout order) to `spec`. With a
/// `device`, tensor captures are made available there; with `needHost`, in
/// host memory. Throws FormatError naming the capture and what it expects.
BoundCaptures bindCaptures(const AttentionKernelSpec &spec,
                           const std::vector<torch::Tensor> &captures,
                           const std::optional<torch::Device> &device, bool needHost);

/// The tile lists of one call through the interval analysis of the mask, at
/// the tile sizes of the kernels `plan` runs, each pass's by its own scan.
/// One evaluator of the mask over the call's host captures, made on first
/// use, serves both passes: the backward's list, built while the forward
/// kernel runs, analyses neither the program nor the captures again. The
/// arguments must outlive it.
class CallTileLists {
public:
  CallTileLists(const AttentionKernelSpec &spec, const BoundCaptures &captures,
                const AttentionProblem &problem, const AttentionKernelPlan &plan);
  ~CallTileLists();

  /// Throws FormatError naming the spec (and the mask) on failure. The list
  /// is shared with the spec's TileListCache (not copied on a repeat).
  std::shared_ptr<const analysis::TileList> build(analysis::TileListKind pass);

private:
  const AttentionKernelSpec &spec_;
  const BoundCaptures &captures_;
  const AttentionProblem &problem_;
  const AttentionKernelPlan &plan_;
  std::unique_ptr<analysis::IntervalEvaluator> evaluator_;
};

// CPU reference, float64 math (AttentionReference.cpp).
AttentionOutputs referenceForward(const AttentionKernelSpec &spec, const AttentionProblem &problem,
                                  const torch::Tensor &q, const torch::Tensor &k,
                                  const torch::Tensor &v, const BoundCaptures &captures);
AttentionGrads referenceBackward(const AttentionKernelSpec &spec, const AttentionProblem &problem,
                                 const torch::Tensor &q, const torch::Tensor &k,
                                 const torch::Tensor &v, const torch::Tensor &out,
                                 const torch::Tensor &logSumExp, const torch::Tensor &gradOut,
                                 const BoundCaptures &captures);

/// A tile list in device memory: row offsets, then entries, in an int32
/// tensor (undefined for a list not built).
struct DeviceTileList {
  torch::Tensor storage;
  int64_t batches = 0;
  int64_t heads = 0;
  int64_t rowTiles = 0;
};

/// Copies one list `CallTileLists` built to `device`, without blocking.
DeviceTileList uploadTileList(const analysis::TileList &list, const torch::Device &device);

// CUDA path (AttentionCuda.cpp).

/// The compute capability (major * 10 + minor) of a CUDA device.
int deviceComputeCapability(int ordinal);

/// Launches the kernels `plan` picks; `tiles` is the pass's list, built at
/// their tile sizes.
AttentionOutputs cudaForward(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                             const AttentionKernelPlan &plan, const AttentionProblem &problem,
                             const torch::Tensor &q, const torch::Tensor &k,
                             const torch::Tensor &v, const BoundCaptures &captures,
                             const DeviceTileList &tiles);
AttentionGrads cudaBackward(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                            const AttentionKernelPlan &plan, const AttentionProblem &problem,
                            const torch::Tensor &q, const torch::Tensor &k,
                            const torch::Tensor &v, const torch::Tensor &out,
                            const torch::Tensor &logSumExp, const torch::Tensor &gradOut,
                            const BoundCaptures &captures, const DeviceTileList &tiles);

} // namespace dflex::runtime::detail
