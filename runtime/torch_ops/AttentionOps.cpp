// The dflex attention operators (docs/runtime-attention.md):
//   o, lse = torch.ops.dflex.attention(bundle_dir, spec, q, k, v, captures)
//   dq, dk, dv = torch.ops.dflex.attention_backward(bundle_dir, spec, q, k, v,
//                                                   o, lse, grad_o, captures)
//   torch.ops.dflex.attention_specs(bundle_dir) -> names of the attention specs
//   torch.ops.dflex.attention_captures(bundle_dir, spec) -> capture names, in order
//   torch.ops.dflex.attention_mask(bundle_dir, spec, captures, batch, q_len, kv_len)
//       -> the mask, dense [B, Hq, Tq, Tkv] bool
//   torch.ops.dflex.attention_kernels(bundle_dir, spec, compute_capability)
//       -> [arch, "bundle" | "compiled", forward kernels, backward kernels]:
//          what the CUDA path runs on such a device under DFLEX_ATTENTION_KERNELS
//          (kernels "sm90" or "portable")
#include "dflex/runtime/attention/AttentionOp.h"

#include <torch/library.h>

namespace {

using dflex::runtime::KernelBundle;

std::tuple<at::Tensor, at::Tensor> attentionOp(const std::string &bundle,
                                               const std::string &spec, const at::Tensor &q,
                                               const at::Tensor &k, const at::Tensor &v,
                                               const std::vector<at::Tensor> &captures) {
  std::shared_ptr<const KernelBundle> opened = KernelBundle::openCached(bundle);
  dflex::runtime::AttentionOutputs outputs =
      dflex::runtime::attention(opened, opened->attention(spec), q, k, v, captures);
  return {outputs.out, outputs.logSumExp};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor>
attentionBackwardOp(const std::string &bundle, const std::string &spec, const at::Tensor &q,
                    const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                    const at::Tensor &lse, const at::Tensor &gradOut,
                    const std::vector<at::Tensor> &captures) {
  std::shared_ptr<const KernelBundle> opened = KernelBundle::openCached(bundle);
  dflex::runtime::AttentionGrads grads = dflex::runtime::attentionBackward(
      *opened, opened->attention(spec), q, k, v, out, lse, gradOut, captures);
  return {grads.q, grads.k, grads.v};
}

at::Tensor attentionMaskOp(const std::string &bundle, const std::string &spec,
                           const std::vector<at::Tensor> &captures, int64_t batch,
                           int64_t queryLength, int64_t keyLength) {
  std::shared_ptr<const KernelBundle> opened = KernelBundle::openCached(bundle);
  return dflex::runtime::attentionMask(opened->attention(spec), captures, batch, queryLength,
                                       keyLength);
}

std::vector<std::string> attentionKernelsOp(const std::string &bundle, const std::string &spec,
                                            int64_t computeCapability) {
  using namespace dflex::runtime;
  std::shared_ptr<const KernelBundle> opened = KernelBundle::openCached(bundle);
  const AttentionKernelPlan plan =
      planAttentionKernels(*opened, opened->attention(spec), static_cast<int>(computeCapability),
                           attentionKernelChoice());
  auto family = [](const AttentionPassKernels &pass) { return pass.sm90 ? "sm90" : "portable"; };
  return {plan.arch, plan.compiled ? "compiled" : "bundle", family(plan.forward),
          family(plan.backward)};
}

std::vector<std::string> attentionSpecsOp(const std::string &bundle) {
  std::vector<std::string> names;
  for (const dflex::runtime::AttentionKernelSpec &spec :
       KernelBundle::openCached(bundle)->attentionSpecs())
    names.push_back(spec.name);
  return names;
}

std::vector<std::string> attentionCapturesOp(const std::string &bundle, const std::string &spec) {
  return KernelBundle::openCached(bundle)->attention(spec).captureNames();
}

} // namespace

TORCH_LIBRARY_FRAGMENT(dflex, m) {
  m.def("attention(str bundle, str spec, Tensor q, Tensor k, Tensor v, "
        "Tensor[] captures) -> (Tensor, Tensor)");
  m.def("attention_backward(str bundle, str spec, Tensor q, Tensor k, Tensor v, Tensor out, "
        "Tensor lse, Tensor grad_out, Tensor[] captures) -> (Tensor, Tensor, Tensor)");
  m.def("attention_mask(str bundle, str spec, Tensor[] captures, int batch, int q_len, "
        "int kv_len) -> Tensor");
  m.def("attention_specs(str bundle) -> str[]", &attentionSpecsOp);
  m.def("attention_captures(str bundle, str spec) -> str[]", &attentionCapturesOp);
  m.def("attention_kernels(str bundle, str spec, int compute_capability) -> str[]",
        &attentionKernelsOp);
}

// Composite: the kernels run above autograd; attention records its own
// backward node (an autograd Function).
TORCH_LIBRARY_IMPL(dflex, CompositeImplicitAutograd, m) {
  m.impl("attention", &attentionOp);
  m.impl("attention_backward", &attentionBackwardOp);
  m.impl("attention_mask", &attentionMaskOp);
}
