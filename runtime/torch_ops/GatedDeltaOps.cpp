// The dflex gated-delta operators (docs/runtime-gated-delta.md):
//   o, final_state = torch.ops.dflex.gated_delta(bundle_dir, spec, q, k, v, g=None, beta=None,
//       a=None, b=None, A_log=None, dt_bias=None, initial_state=None, cu_seqlens=None)
//   dq, dk, dv, dg, dbeta, da, db, dA_log, ddt_bias, dh0 =
//       torch.ops.dflex.gated_delta_backward(bundle_dir, spec, q, k, v, g, beta, a, b, A_log,
//                                            dt_bias, initial_state, cu_seqlens, grad_o,
//                                            grad_final_state)
//   torch.ops.dflex.gated_delta_specs(bundle_dir) -> names of the gated-delta specs
// Inputs a spec does not take are None; so are the outputs it has not (an
// undefined tensor reaches Python as None).
#include "dflex/runtime/gated_delta/GatedDeltaOp.h"

#include <torch/library.h>

namespace {

using dflex::runtime::GatedDeltaBundle;
using dflex::runtime::GatedDeltaInputs;
using OptionalTensor = std::optional<at::Tensor>;

GatedDeltaInputs inputsOf(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                          const OptionalTensor &g, const OptionalTensor &beta, const OptionalTensor &a,
                          const OptionalTensor &b, const OptionalTensor &aLog, const OptionalTensor &dtBias,
                          const OptionalTensor &initialState, const OptionalTensor &cuSeqlens) {
  auto get = [](const OptionalTensor &t) { return t.value_or(at::Tensor()); };
  return {q,         k,         v,          get(g),            get(beta),     get(a),
          get(b),    get(aLog), get(dtBias), get(initialState), get(cuSeqlens)};
}

std::tuple<at::Tensor, at::Tensor>
gatedDeltaOp(const std::string &bundle, const std::string &spec, const at::Tensor &q, const at::Tensor &k,
             const at::Tensor &v, const OptionalTensor &g, const OptionalTensor &beta, const OptionalTensor &a,
             const OptionalTensor &b, const OptionalTensor &aLog, const OptionalTensor &dtBias,
             const OptionalTensor &initialState, const OptionalTensor &cuSeqlens) {
  std::shared_ptr<const GatedDeltaBundle> opened = GatedDeltaBundle::openCached(bundle);
  dflex::runtime::GatedDeltaOutputs outputs = dflex::runtime::gatedDelta(
      opened, opened->spec(spec), inputsOf(q, k, v, g, beta, a, b, aLog, dtBias, initialState, cuSeqlens));
  return {outputs.out, outputs.finalState};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor>
gatedDeltaBackwardOp(const std::string &bundle, const std::string &spec, const at::Tensor &q,
                     const at::Tensor &k, const at::Tensor &v, const OptionalTensor &g,
                     const OptionalTensor &beta, const OptionalTensor &a, const OptionalTensor &b,
                     const OptionalTensor &aLog, const OptionalTensor &dtBias, const OptionalTensor &initialState,
                     const OptionalTensor &cuSeqlens, const at::Tensor &gradOut,
                     const OptionalTensor &gradFinalState) {
  std::shared_ptr<const GatedDeltaBundle> opened = GatedDeltaBundle::openCached(bundle);
  dflex::runtime::GatedDeltaGrads grads = dflex::runtime::gatedDeltaBackward(
      *opened, opened->spec(spec), inputsOf(q, k, v, g, beta, a, b, aLog, dtBias, initialState, cuSeqlens),
      gradOut, gradFinalState.value_or(at::Tensor()));
  return {grads.q, grads.k, grads.v, grads.g, grads.beta, grads.a, grads.b, grads.aLog, grads.dtBias,
          grads.initialState};
}

std::vector<std::string> gatedDeltaSpecsOp(const std::string &bundle) {
  std::vector<std::string> names;
  for (const dflex::runtime::GatedDeltaKernelSpec &spec : GatedDeltaBundle::openCached(bundle)->specs())
    names.push_back(spec.name);
  return names;
}

} // namespace

TORCH_LIBRARY_FRAGMENT(dflex, m) {
  m.def("gated_delta(str bundle, str spec, Tensor q, Tensor k, Tensor v, Tensor? g=None, "
        "Tensor? beta=None, Tensor? a=None, Tensor? b=None, Tensor? A_log=None, Tensor? dt_bias=None, "
        "Tensor? initial_state=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor)");
  m.def("gated_delta_backward(str bundle, str spec, Tensor q, Tensor k, Tensor v, Tensor? g, "
        "Tensor? beta, Tensor? a, Tensor? b, Tensor? A_log, Tensor? dt_bias, Tensor? initial_state, "
        "Tensor? cu_seqlens, Tensor grad_o, Tensor? grad_final_state=None) -> (Tensor, Tensor, Tensor, "
        "Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("gated_delta_specs(str bundle) -> str[]", &gatedDeltaSpecsOp);
}

// Composite: the kernels run above autograd; gated_delta records its own
// backward node (an autograd Function).
TORCH_LIBRARY_IMPL(dflex, CompositeImplicitAutograd, m) {
  m.impl("gated_delta", &gatedDeltaOp);
  m.impl("gated_delta_backward", &gatedDeltaBackwardOp);
}
