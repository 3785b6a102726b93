// The gated-delta op: input checks, autograd, and the choice between the
// CPU reference (GatedDeltaReference.cpp) and the CUDA kernels
// (GatedDeltaCuda.cpp).
#include "GatedDeltaInternal.h"

#include "dflex/Support/Error.h"
#include "dflex/runtime/support/SavedObject.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cmath>
#include <limits>
#include <optional>

namespace dflex::runtime {

namespace detail {

namespace {

std::string shapeText(const torch::Tensor &t) { return c10::str(t.sizes()); }
std::string dtypeText(torch::ScalarType type) { return std::string(c10::toString(type)); }

} // namespace

std::string where(const GatedDeltaKernelSpec &spec) { return "dflex gated_delta '" + spec.name + "'"; }

GatedDeltaProblem checkInputs(const GatedDeltaKernelSpec &spec, const GatedDeltaInputs &in) {
  auto fail = [&](const std::string &problem) { throw FormatError(where(spec) + ": " + problem); };
  const torch::Tensor &q = in.q, &k = in.k, &v = in.v;
  if (!q.defined() || !k.defined() || !v.defined())
    fail("q, k and v must be tensors");
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    fail("q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv] must have 4 dimensions, got q " + shapeText(q) +
         ", k " + shapeText(k) + ", v " + shapeText(v));
  GatedDeltaProblem p;
  p.batch = q.size(0);
  p.length = q.size(1);
  p.tokens = p.batch * p.length;
  p.keyHeads = q.size(2);
  p.keyDim = q.size(3);
  p.valueHeads = v.size(2);
  p.valueDim = v.size(3);
  if (k.sizes() != q.sizes() || v.size(0) != p.batch || v.size(1) != p.length)
    fail("shapes do not agree: q " + shapeText(q) + ", k " + shapeText(k) + ", v " + shapeText(v) +
         " (expected q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv])");
  if (p.keyHeads != spec.numKeyHeads || p.valueHeads != spec.numValueHeads)
    fail("the spec has " + std::to_string(spec.numKeyHeads) + " key heads (q, k) and " +
         std::to_string(spec.numValueHeads) + " value heads (v), got " + std::to_string(p.keyHeads) +
         " and " + std::to_string(p.valueHeads));
  if (p.keyDim != spec.keyDim || p.valueDim != spec.valueDim)
    fail("the spec has key_dim " + std::to_string(spec.keyDim) + " (q, k) and value_dim " +
         std::to_string(spec.valueDim) + " (v), got " + std::to_string(p.keyDim) + " and " +
         std::to_string(p.valueDim));
  const torch::Device device = q.device();
  const bool cuda = q.is_cuda();
  if (!cuda && !q.is_cpu())
    fail("tensors must be on the CPU or a CUDA device, got " + device.str());

  // One tensor input: present exactly when the spec takes it, on q's device,
  // floating, of `shape`, and of `cudaType` on CUDA.
  auto check = [&](const torch::Tensor &t, const std::string &name, bool taken, const std::string &why,
                   const std::vector<int64_t> &shape, const char *shapeName, torch::ScalarType cudaType) {
    if (!taken) {
      if (t.defined())
        fail(name + " is not an input of this spec (" + why + ")");
      return;
    }
    if (!t.defined())
      fail(name + " is required (" + why + ")");
    if (t.device() != device)
      fail(name + " is on " + t.device().str() + ", q on " + device.str());
    if (!t.is_floating_point())
      fail(name + " must be a floating-point tensor, got " + dtypeText(t.scalar_type()));
    if (t.sizes() != torch::IntArrayRef(shape))
      fail(name + " must be " + shapeName + " " + c10::str(torch::IntArrayRef(shape)) + ", got " +
           shapeText(t));
    if (cuda && t.scalar_type() != cudaType)
      fail("the kernels take " + name + " as " + dtypeText(cudaType) + ", got " +
           dtypeText(t.scalar_type()));
  };
  const std::vector<int64_t> gateShape{p.batch, p.length, p.valueHeads};
  const std::vector<int64_t> headShape{p.valueHeads};
  check(q, "q", true, "", q.sizes().vec(), "[B, T, Hk, Dk]", torch::kBFloat16);
  check(k, "k", true, "", q.sizes().vec(), "[B, T, Hk, Dk]", torch::kBFloat16);
  check(v, "v", true, "", v.sizes().vec(), "[B, T, Hv, Dv]", torch::kBFloat16);
  const bool scalarGate = spec.gate == "scalar_log";
  const std::string inKernel = "in_kernel_gate: the kernels compute g = -exp(A_log) softplus(a + dt_bias)";
  check(in.g, "g", scalarGate && !spec.inKernelGate,
        spec.inKernelGate ? inKernel : scalarGate ? "the spec's gate is scalar_log" : "the spec's gate is none",
        gateShape, "[B, T, Hv]", torch::kFloat);
  check(in.beta, "beta", spec.deltaRule && !spec.inKernelGate,
        spec.inKernelGate ? "in_kernel_gate: the kernels compute beta = sigmoid(b)"
        : spec.deltaRule  ? "the spec has the delta rule"
                          : "the spec has no delta rule",
        gateShape, "[B, T, Hv]", torch::kBFloat16);
  const std::string noInKernel = "the spec has no in_kernel_gate";
  check(in.a, "a", spec.inKernelGate, spec.inKernelGate ? inKernel : noInKernel, gateShape, "[B, T, Hv]",
        torch::kBFloat16);
  check(in.b, "b", spec.inKernelGate && spec.deltaRule,
        !spec.inKernelGate ? noInKernel
        : spec.deltaRule   ? "in_kernel_gate with the delta rule: beta = sigmoid(b)"
                           : "the spec has no delta rule",
        gateShape, "[B, T, Hv]", torch::kBFloat16);
  check(in.aLog, "A_log", spec.inKernelGate, spec.inKernelGate ? inKernel : noInKernel, headShape, "[Hv]",
        torch::kFloat);
  check(in.dtBias, "dt_bias", spec.inKernelGate, spec.inKernelGate ? inKernel : noInKernel, headShape,
        "[Hv]", torch::kFloat);

  // Sequences: the rows, or cu_seqlens over the flattened rows.
  const torch::Tensor &cu = in.cuSeqlens;
  if (!spec.varlen) {
    if (cu.defined())
      fail("cu_seqlens is not an input of this spec (it has no varlen: every row is one sequence)");
    p.sequences = p.batch;
    for (int64_t n = 0; n <= p.batch; ++n)
      p.offsets.push_back(n * p.length);
  } else {
    if (!cu.defined())
      fail("cu_seqlens is required (the spec has varlen)");
    if (cu.scalar_type() != torch::kInt || cu.dim() != 1 || cu.numel() < 1)
      fail("cu_seqlens must be a 1-D int32 tensor [N + 1], got " + dtypeText(cu.scalar_type()) + " " +
           shapeText(cu));
    if (!cu.is_cpu() && cu.device() != device)
      fail("cu_seqlens is on " + cu.device().str() + "; it must be on the CPU or on q's device " +
           device.str());
    const torch::Tensor host = cu.cpu().to(torch::kLong).contiguous();
    const int64_t *values = host.data_ptr<int64_t>();
    p.offsets.assign(values, values + host.numel());
    p.sequences = host.numel() - 1;
    if (p.offsets.front() != 0)
      fail("cu_seqlens[0] must be 0, got " + std::to_string(p.offsets.front()));
    if (p.offsets.back() != p.tokens)
      fail("cu_seqlens[" + std::to_string(p.sequences) + "] must be B*T = " + std::to_string(p.tokens) +
           ", got " + std::to_string(p.offsets.back()));
    for (int64_t n = 1; n <= p.sequences; ++n)
      if (p.offsets[n] <= p.offsets[n - 1])
        fail("cu_seqlens must increase strictly (every sequence has a token): cu_seqlens[" +
             std::to_string(n) + "] = " + std::to_string(p.offsets[n]) + " after " +
             std::to_string(p.offsets[n - 1]));
  }
  check(in.initialState, "initial_state", spec.initialState && in.initialState.defined(),
        "the spec has no initial_state", {p.sequences, p.valueHeads, p.keyDim, p.valueDim},
        "[N, Hv, Dk, Dv]", torch::kFloat);

  if (cuda) {
    const int64_t kIntMax = std::numeric_limits<int32_t>::max();
    if (p.tokens > kIntMax || p.sequences > 65535 || p.valueHeads > 65535 ||
        (p.tokens * p.keyHeads + 7) / 8 > kIntMax)
      fail("sizes beyond the kernels' limits (B*T < 2^31, at most 65535 sequences and value heads)");
  }
  return p;
}

void checkOutputGrads(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &p,
                      const GatedDeltaInputs &in, const torch::Tensor &gradOut,
                      const torch::Tensor &gradFinalState) {
  auto fail = [&](const std::string &problem) {
    throw FormatError(where(spec) + " backward: " + problem);
  };
  const bool cuda = in.q.is_cuda();
  auto check = [&](const torch::Tensor &t, const char *name, const std::vector<int64_t> &shape,
                   const char *shapeName, torch::ScalarType cudaType) {
    if (!t.defined())
      return;
    if (t.sizes() != torch::IntArrayRef(shape))
      fail(std::string(name) + " must be " + shapeName + " " + c10::str(torch::IntArrayRef(shape)) +
           ", got " + shapeText(t));
    if (t.device() != in.q.device())
      fail(std::string(name) + " is on " + t.device().str() + ", q on " + in.q.device().str());
    if (!t.is_floating_point() || (cuda && t.scalar_type() != cudaType))
      fail(std::string(name) + " must be " + (cuda ? dtypeText(cudaType) : "floating-point") + ", got " +
           dtypeText(t.scalar_type()));
  };
  check(gradOut, "grad_o", {p.batch, p.length, p.valueHeads, p.valueDim}, "[B, T, Hv, Dv]",
        torch::kBFloat16);
  if (gradFinalState.defined() && !spec.finalState)
    fail("grad_final_state given, but the spec has no final_state");
  check(gradFinalState, "grad_final_state", {p.sequences, p.valueHeads, p.keyDim, p.valueDim},
        "[N, Hv, Dk, Dv]", torch::kFloat);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

/// The checked sizes travel to the backward in saved_data (so a device
/// cu_seqlens is not read again).
std::vector<int64_t> packProblem(const GatedDeltaProblem &p) {
  std::vector<int64_t> packed{p.batch,      p.length,     p.tokens, p.sequences,
                              p.keyHeads,   p.valueHeads, p.keyDim, p.valueDim};
  packed.insert(packed.end(), p.offsets.begin(), p.offsets.end());
  return packed;
}

GatedDeltaProblem unpackProblem(const std::vector<int64_t> &packed) {
  GatedDeltaProblem p;
  p.batch = packed[0];
  p.length = packed[1];
  p.tokens = packed[2];
  p.sequences = packed[3];
  p.keyHeads = packed[4];
  p.valueHeads = packed[5];
  p.keyDim = packed[6];
  p.valueDim = packed[7];
  p.offsets.assign(packed.begin() + 8, packed.end());
  return p;
}

/// Autograd node of the op. The opened bundle and the spec travel to the
/// backward in saved_data; on CUDA the forward's workspace and
/// device cu_seqlens are kept for the backward kernels. The inputs a spec
/// may not take are optional (a Function cannot take undefined tensors).
using OptionalTensor = std::optional<torch::Tensor>;

struct GatedDeltaFunction : public torch::autograd::Function<GatedDeltaFunction> {
  static tensor_list forward(AutogradContext *ctx, const std::shared_ptr<const GatedDeltaBundle> &bundle,
                             const GatedDeltaKernelSpec &spec, const torch::Tensor &q, const torch::Tensor &k,
                             const torch::Tensor &v, const OptionalTensor &g, const OptionalTensor &beta,
                             const OptionalTensor &a, const OptionalTensor &b, const OptionalTensor &aLog,
                             const OptionalTensor &dtBias, const OptionalTensor &initialState,
                             const OptionalTensor &cuSeqlens, bool needBackward) {
    auto get = [](const OptionalTensor &t) { return t.value_or(torch::Tensor()); };
    const GatedDeltaInputs in{q,       k,          v,       get(g),            get(beta),     get(a),
                              get(b),  get(aLog),  get(dtBias), get(initialState), get(cuSeqlens)};
    const GatedDeltaProblem problem = checkInputs(spec, in);
    GatedDeltaOutputs outputs;
    if (q.is_cuda()) {
      CudaForwardState state = cudaForward(*bundle, spec, problem, in);
      outputs = state.outputs;
      if (needBackward) {
        ctx->saved_data["workspace"] = state.workspace;
        ctx->saved_data["device_cu_seqlens"] = state.cuSeqlens;
      }
    } else {
      outputs = referenceForward(spec, problem, in);
    }
    ctx->save_for_backward(
        {in.q, in.k, in.v, in.g, in.beta, in.a, in.b, in.aLog, in.dtBias, in.initialState});
    ctx->saved_data["cu_seqlens"] = in.cuSeqlens;
    ctx->saved_data["bundle"] = saveObject(bundle);
    // Owned by the bundle: the aliasing pointer keeps the bundle alive.
    ctx->saved_data["spec"] = saveObject(std::shared_ptr<const GatedDeltaKernelSpec>(bundle, &spec));
    ctx->saved_data["problem"] = packProblem(problem);
    // Undefined output gradients stay undefined (zeros are not formed).
    ctx->set_materialize_grads(false);
    // A Function returns defined tensors only: without final_state, an
    // empty placeholder that gatedDelta drops.
    if (!outputs.finalState.defined()) {
      outputs.finalState = torch::empty({0}, q.options());
      ctx->mark_non_differentiable({outputs.finalState});
    }
    return {outputs.out, outputs.finalState};
  }

  static tensor_list backward(AutogradContext *ctx, tensor_list outputGrads) {
    const tensor_list saved = ctx->get_saved_variables();
    GatedDeltaInputs in{saved[0], saved[1], saved[2], saved[3], saved[4],
                        saved[5], saved[6], saved[7], saved[8], saved[9],
                        ctx->saved_data["cu_seqlens"].toTensor()};
    const auto bundle = savedObject<GatedDeltaBundle>(ctx->saved_data["bundle"]);
    const GatedDeltaKernelSpec &spec = *savedObject<GatedDeltaKernelSpec>(ctx->saved_data["spec"]);
    const torch::Tensor gradOut = outputGrads[0];
    const torch::Tensor gradFinalState = spec.finalState ? outputGrads[1] : torch::Tensor();
    if (!gradOut.defined() && !gradFinalState.defined())
      return tensor_list(14);
    const GatedDeltaProblem problem = unpackProblem(ctx->saved_data["problem"].toIntVector());
    checkOutputGrads(spec, problem, in, gradOut, gradFinalState);
    GatedDeltaGrads grads;
    if (in.q.is_cuda()) {
      CudaForwardState forward;
      forward.workspace = ctx->saved_data["workspace"].toTensor();
      forward.cuSeqlens = ctx->saved_data["device_cu_seqlens"].toTensor();
      grads = cudaBackward(*bundle, spec, problem, in, forward, gradOut, gradFinalState);
    } else {
      grads = referenceBackward(spec, problem, in, gradOut, gradFinalState);
    }
    // No gradient for an input that was not given (initial_state defaults to zeros).
    if (!in.initialState.defined())
      grads.initialState = torch::Tensor();
    return {torch::Tensor(), torch::Tensor(), grads.q,     grads.k,    grads.v,
            grads.g,         grads.beta,      grads.a,     grads.b,    grads.aLog,
            grads.dtBias,    grads.initialState, torch::Tensor(), torch::Tensor()};
  }
};

} // namespace

} // namespace detail

GatedDeltaOutputs gatedDeltaForward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                                    const GatedDeltaInputs &inputs) {
  using namespace detail;
  const GatedDeltaProblem problem = checkInputs(spec, inputs);
  if (!inputs.q.is_cuda())
    return referenceForward(spec, problem, inputs);
  return cudaForward(bundle, spec, problem, inputs).outputs;
}

GatedDeltaGrads gatedDeltaBackward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                                   const GatedDeltaInputs &inputs, const torch::Tensor &gradOut,
                                   const torch::Tensor &gradFinalState) {
  using namespace detail;
  const GatedDeltaProblem problem = checkInputs(spec, inputs);
  checkOutputGrads(spec, problem, inputs, gradOut, gradFinalState);
  GatedDeltaGrads grads;
  if (!inputs.q.is_cuda()) {
    grads = referenceBackward(spec, problem, inputs, gradOut, gradFinalState);
  } else {
    const CudaForwardState forward = cudaForward(bundle, spec, problem, inputs);
    grads = cudaBackward(bundle, spec, problem, inputs, forward, gradOut, gradFinalState);
  }
  if (!inputs.initialState.defined())
    grads.initialState = torch::Tensor();
  return grads;
}

GatedDeltaOutputs gatedDelta(const std::shared_ptr<const GatedDeltaBundle> &bundle,
                             const GatedDeltaKernelSpec &spec, const GatedDeltaInputs &in) {
  bool needBackward = false;
  if (torch::GradMode::is_enabled())
    for (const torch::Tensor *t : {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.a, &in.b, &in.aLog,
                                   &in.dtBias, &in.initialState})
      needBackward = needBackward || (t->defined() && t->requires_grad());
  auto optional = [](const torch::Tensor &t) -> detail::OptionalTensor {
    return t.defined() ? detail::OptionalTensor(t) : std::nullopt;
  };
  const torch::autograd::tensor_list outputs = detail::GatedDeltaFunction::apply(
      bundle, spec, in.q, in.k, in.v, optional(in.g), optional(in.beta), optional(in.a),
      optional(in.b), optional(in.aLog), optional(in.dtBias), optional(in.initialState),
      optional(in.cuSeqlens), needBackward);
  return {outputs[0], spec.finalState ? outputs[1] : torch::Tensor()};
}


} // namespace dflex::runtime
