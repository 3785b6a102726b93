// Registers the dflex operators with the PyTorch dispatcher, for Python:
//   torch.ops.load_library(".../libdflex_torch_ops.so")
//   torch.ops.dflex.version()
//   loss, correct = torch.ops.dflex.block_cross_entropy(hidden, lm_head, labels, weights)
#include "dflex/runtime/loss/BlockLoss.h"
#include "dflex/runtime/support/Version.h"

#include <torch/library.h>

namespace {

std::tuple<at::Tensor, at::Tensor>
blockCrossEntropyOp(const at::Tensor &hidden, const at::Tensor &lmHead,
                    const at::Tensor &labels, const at::Tensor &weights,
                    int64_t chunkRows, double normalizer) {
  dflex::runtime::BlockLossOptions options;
  options.chunkRows = chunkRows;
  options.normalizer = normalizer;
  dflex::runtime::BlockLossResult result =
      dflex::runtime::blockCrossEntropy(hidden, lmHead, labels, weights, options);
  return {result.loss, result.correct};
}

} // namespace

TORCH_LIBRARY(dflex, m) {
  m.def("version() -> str", [] { return dflex::runtime::versionString(); });
  m.def("block_cross_entropy(Tensor hidden, Tensor lm_head, Tensor labels, "
        "Tensor weights, int chunk_rows=0, float normalizer=0.) -> (Tensor, Tensor)");
}

// Composite: the kernel runs above autograd and records its own backward node.
TORCH_LIBRARY_IMPL(dflex, CompositeImplicitAutograd, m) {
  m.impl("block_cross_entropy", &blockCrossEntropyOp);
}
