// The gated-delta op's runtime side on bundles written here (no compiler
// needed): manifest parsing and its errors, the CPU float64 reference
// against two independent implementations (the token recurrence in LibTorch
// ops with autograd, written below, and the models' chunked LibTorch rule),
// autograd against the backward entry point, input errors, and the target
// model hook on the CPU.
#include "TestSupport.h"

#include "dflex/Support/Json.h"
#include "dflex/Support/Sha256.h"
#include "dflex/Support/Error.h"
#include "dflex/runtime/gated_delta/GatedDeltaOp.h"
#include "dflex/runtime/models/KernelHooks.h"
#include "dflex/runtime/models/GatedDeltaRule.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

using namespace dflex;
using namespace dflex::runtime;
namespace bundle = dflex::bundle;
using dflex::FormatError;
using dflex::IoError;
using dflex::runtime::test::expectError;
using dflex::runtime::test::TempDir;
using torch::Tensor;

namespace {

// --- Bundles -------------------------------------------------------------------

struct SpecOptions {
  std::string name;
  int64_t keyHeads = 1, valueHeads = 2, keyDim = 64, valueDim = 64;
  std::string gate = "scalar_log";
  bool deltaRule = true, qkL2Norm = true, initialState = false, finalState = false, varlen = false,
       inKernelGate = false;
  double scale = 0.125;
};

/// The specs of the test bundle.
std::vector<SpecOptions> bundleSpecs() {
  std::vector<SpecOptions> specs(5);
  specs[0].name = "grouped_varlen_states"; // Hk 1, Hv 2, g and beta, h0 and ht, varlen
  specs[0].initialState = specs[0].finalState = specs[0].varlen = true;
  specs[1].name = "in_kernel_gate"; // as Qwen3.5, small
  specs[1].initialState = specs[1].finalState = specs[1].varlen = specs[1].inKernelGate = true;
  specs[2].name = "plain"; // gate none, no L2 norm, Hk = Hv
  specs[2].keyHeads = 2;
  specs[2].gate = "none";
  specs[2].qkL2Norm = false;
  specs[3].name = "model"; // what the target model's hook takes
  specs[4].name = "model_varlen";
  specs[4].varlen = true;
  return specs;
}

std::vector<std::string> rolesOf(const SpecOptions &s) {
  std::vector<std::string> roles;
  if (s.varlen)
    roles.push_back("gated_delta_chunk_table");
  for (const char *role : {"forward_prepare", "forward_state", "forward_output", "backward_prepare",
                           "backward_state", "backward_chunk"})
    roles.push_back(std::string("gated_delta_") + role);
  if (s.valueHeads > s.keyHeads)
    roles.push_back("gated_delta_backward_finalize");
  if (s.inKernelGate)
    roles.push_back("gated_delta_backward_gate_params");
  return roles;
}

/// Writes a bundle of bundleSpecs() as dflex-compile lays it out (with
/// stand-in binaries); `edit` may alter the manifest first.
void writeBundle(const std::string &directory, const std::function<void(JsonValue &)> &edit = {}) {
  JsonValue manifest = JsonValue::object();
  manifest["format_version"] = bundle::kBundleFormatVersion;
  manifest["template_version"] = bundle::kTemplateVersion;
  JsonValue modules = JsonValue::array();
  for (const SpecOptions &s : bundleSpecs()) {
    JsonValue module = JsonValue::object();
    module["name"] = s.name;
    module["kind"] = "gated_delta";
    JsonValue spec = JsonValue::object();
    spec["num_key_heads"] = s.keyHeads;
    spec["num_value_heads"] = s.valueHeads;
    spec["key_dim"] = s.keyDim;
    spec["value_dim"] = s.valueDim;
    spec["gate"] = s.gate;
    spec["delta_rule"] = s.deltaRule;
    spec["qk_l2norm"] = s.qkL2Norm;
    spec["initial_state"] = s.initialState;
    spec["final_state"] = s.finalState;
    spec["varlen"] = s.varlen;
    spec["in_kernel_gate"] = s.inKernelGate;
    spec["element_type"] = "bf16";
    spec["scale"] = s.scale;
    module["spec"] = spec;
    // Each binary's launch constants (sm_120's state kernels take narrower
    // value blocks, to tell the two apart).
    JsonValue launch = JsonValue::object();
    const std::pair<const char *, int64_t> constants[] = {
        {"threads", 128},
        {"chunk_backward_threads", 256},
        {"state_threads", 256},
        {"chunk_table_threads", 1024},
        {"finalize_threads", 256},
        {"chunk", 64},
        {"value_block", 32},
        {"forward_prepare_shared_bytes", 61952},
        {"forward_state_shared_bytes", 86016},
        {"forward_output_shared_bytes", 90368},
        {"backward_prepare_shared_bytes", 73984},
        {"backward_state_shared_bytes", 81920},
        {"backward_chunk_shared_bytes", 84352}};
    for (const auto &[key, value] : constants)
      launch["dflex_gated_delta_launch"][key] = value;
    JsonValue kernels = JsonValue::array();
    for (const std::string &role : rolesOf(s)) {
      JsonValue kernel = JsonValue::object();
      kernel["role"] = role;
      kernel["name_expression"] = role + "<Config>";
      for (const char *arch : {"sm_90a", "sm_120"})
        kernel["archs"][arch]["lowered_name"] = "_Z" + role + "_" + arch;
      kernels.push(kernel);
    }
    module["kernels"] = kernels;
    const std::string source = "// generated source of " + s.name + "\n";
    test::writeBytes(directory + "/" + s.name + ".cu", source);
    module["source_file"] = s.name + ".cu";
    module["source_sha256"] = Sha256::hexDigest(source);
    for (const std::string arch : {"sm_90a", "sm_120"}) {
      JsonValue &binary = module["binaries"][arch];
      for (const std::string part : {"gated_delta_forward", "gated_delta_backward"}) {
        const std::string stem = s.name + "." + arch + "." + part;
        const std::string ptx = "// ptx of " + s.name + " for " + arch + ", " + part + "\n";
        const std::string cubin = "cubin bytes of " + s.name + " for " + arch + ", " + part;
        test::writeBytes(directory + "/" + stem + ".ptx", ptx);
        test::writeBytes(directory + "/" + stem + ".cubin", cubin);
        JsonValue &files = binary["parts"][part];
        files["ptx"] = stem + ".ptx";
        files["ptx_sha256"] = Sha256::hexDigest(ptx);
        files["cubin"] = stem + ".cubin";
        files["cubin_sha256"] = Sha256::hexDigest(cubin);
      }
      binary["launch"] = launch;
      if (arch == "sm_120")
        binary["launch"]["dflex_gated_delta_launch"]["value_block"] = 16;
    }
    modules.push(module);
  }
  manifest["modules"] = modules;
  if (edit)
    edit(manifest);
  test::writeBytes(directory + "/manifest.json", writeJson(manifest));
}

JsonValue &moduleNamed(JsonValue &manifest, const std::string &name) {
  for (JsonValue &module : manifest["modules"].asArray())
    if (module["name"].asString() == name)
      return module;
  throw std::runtime_error("no module " + name);
}

/// The gated-delta launch constants of `module`'s binary for `arch`.
JsonValue &binaryLaunch(JsonValue &manifest, const std::string &module, const std::string &arch) {
  return moduleNamed(manifest, module)["binaries"][arch]["launch"]["dflex_gated_delta_launch"];
}

TEST(GatedDeltaBundle, OpensAndDescribesItsSpecs) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = GatedDeltaBundle::openCached(dir.path().string());
  ASSERT_EQ(bundle->specs().size(), 5u);
  const GatedDeltaKernelSpec &spec = bundle->spec("in_kernel_gate");
  EXPECT_EQ(spec.numKeyHeads, 1);
  EXPECT_EQ(spec.numValueHeads, 2);
  EXPECT_EQ(spec.keyDim, 64);
  EXPECT_EQ(spec.gate, "scalar_log");
  EXPECT_TRUE(spec.deltaRule && spec.qkL2Norm && spec.initialState && spec.finalState && spec.varlen &&
              spec.inKernelGate);
  EXPECT_FLOAT_EQ(spec.scale, 0.125f);
  ASSERT_EQ(spec.launches.size(), 2u);
  const GatedDeltaLaunch &hopper = spec.launches.at("sm_90a");
  EXPECT_EQ(hopper.threads, 128);
  EXPECT_EQ(hopper.chunkBackwardThreads, 256);
  EXPECT_EQ(hopper.stateThreads, 256);
  EXPECT_EQ(hopper.valueBlock, 32);
  EXPECT_EQ(hopper.sharedBytes.at(bundle::KernelRole::GatedDeltaBackwardChunk), 84352);
  EXPECT_EQ(hopper.sharedBytes.size(), 6u);
  // Each binary's own constants.
  EXPECT_EQ(spec.launches.at("sm_120").valueBlock, 16);
  EXPECT_EQ(spec.kernel(bundle::KernelRole::GatedDeltaBackwardGateParams).loweredNames.at("sm_90a"),
            "_Zgated_delta_backward_gate_params_sm_90a");
  const GatedDeltaKernelSpec &plain = bundle->spec("plain");
  EXPECT_EQ(plain.gate, "none");
  EXPECT_FALSE(plain.qkL2Norm || plain.varlen || plain.inKernelGate);
  // The same object while the manifest is unchanged.
  EXPECT_EQ(GatedDeltaBundle::openCached(dir.path().string()).get(), bundle.get());
}

TEST(GatedDeltaBundle, KernelImageIsTheCubinOfTheArch) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = GatedDeltaBundle::openCached(dir.path().string());
  const GatedDeltaKernelSpec &spec = bundle->spec("model");
  // An sm_90 device takes the sm_90a cubin; the image says which arch, for
  // its launch constants.
  const KernelImage image = bundle->kernelImage(spec, "sm_90");
  ASSERT_EQ(image.parts.size(), 2u);
  EXPECT_EQ(image.parts[0].image, "cubin bytes of model for sm_90a, gated_delta_backward");
  EXPECT_EQ(image.parts[1].image, "cubin bytes of model for sm_90a, gated_delta_forward");
  const std::vector<bundle::KernelRole> &forward = image.parts[1].roles;
  EXPECT_NE(std::find(forward.begin(), forward.end(), bundle::KernelRole::GatedDeltaForwardPrepare), forward.end());
  EXPECT_EQ(std::find(forward.begin(), forward.end(), bundle::KernelRole::GatedDeltaBackwardState), forward.end());
  EXPECT_EQ(image.parts[0].roles.size() + forward.size(), spec.kernels.size());
  EXPECT_EQ(image.partOf(bundle::KernelRole::GatedDeltaForwardState), 1u);
  EXPECT_EQ(image.partOf(bundle::KernelRole::GatedDeltaBackwardChunk), 0u);
  expectError<FormatError>([&] { image.partOf(bundle::KernelRole::AttentionForward); },
                           {"no part holds kernel 'attention_forward'"});
  EXPECT_EQ(image.arch, "sm_90a");
  EXPECT_EQ(image.loweredNames.at(bundle::KernelRole::GatedDeltaForwardState), "_Zgated_delta_forward_state_sm_90a");
  EXPECT_EQ(bundle->kernelImage(spec, "sm_120").arch, "sm_120");
  expectError<FormatError>([&] { bundle->kernelImage(spec, "sm_100"); },
                           {"'model'", "no cubin for sm_100", "it has: sm_120, sm_90a", "--arch sm_100"});
}

TEST(GatedDeltaBundle, UnknownSpecListsTheKnownOnes) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = GatedDeltaBundle::openCached(dir.path().string());
  expectError<FormatError>([&] { bundle->spec("nope"); },
                           {"no gated-delta spec 'nope'", "grouped_varlen_states, in_kernel_gate, plain"});
}

TEST(GatedDeltaBundle, BadManifestsAreNamedAndExplained) {
  struct Case {
    std::function<void(JsonValue &)> edit;
    std::vector<std::string> fragments;
  };
  const Case cases[] = {
      {[](JsonValue &m) { moduleNamed(m, "plain")["spec"]["key_dim"] = 96; },
       {"module 'plain'", "key_dim", "64 or 128, got 96"}},
      {[](JsonValue &m) { moduleNamed(m, "plain")["spec"]["gate"] = "channel_log"; },
       {"gate", "none and scalar_log, got 'channel_log'"}},
      {[](JsonValue &m) { moduleNamed(m, "plain")["spec"]["in_kernel_gate"] = true; },
       {"in_kernel_gate", "requires gate scalar_log"}},
      {[](JsonValue &m) { moduleNamed(m, "plain")["spec"]["num_value_heads"] = 3; },
       {"num_value_heads", "multiple of num_key_heads"}},
      {[](JsonValue &m) { moduleNamed(m, "plain")["spec"]["element_type"] = "f16"; },
       {"element_type", "bf16, got 'f16'"}},
      {[](JsonValue &m) { moduleNamed(m, "plain")["spec"].asObject().erase("varlen"); },
       {"varlen", "missing"}},
      {[](JsonValue &m) { moduleNamed(m, "plain")["spec"]["scale"] = 0.0; }, {"scale", "positive"}},
      {[](JsonValue &m) {
         binaryLaunch(m, "plain", "sm_120").asObject().erase("value_block");
       },
       {"binaries: sm_120: launch: dflex_gated_delta_launch", "value_block", "rebuild it"}},
      {[](JsonValue &m) { binaryLaunch(m, "plain", "sm_90a")["value_block"] = 48; },
       {"binaries: sm_90a: launch", "value_block", "does not divide value_dim 64"}},
      {[](JsonValue &m) { binaryLaunch(m, "plain", "sm_90a")["backward_chunk_shared_bytes"] = -1; },
       {"backward_chunk_shared_bytes", "positive launch constant"}},
      {[](JsonValue &m) { moduleNamed(m, "plain")["binaries"]["sm_120"].asObject().erase("launch"); },
       {"module 'plain'", "binaries: sm_120: launch", "missing"}},
      {[](JsonValue &m) {
         // A grouped spec needs the finalize kernel.
         JsonValue::Array &kernels = moduleNamed(m, "model")["kernels"].asArray();
         kernels.pop_back();
       },
       {"module 'model'", "no kernel with role 'gated_delta_backward_finalize'"}},
      {[](JsonValue &m) { moduleNamed(m, "model")["source_sha256"] = std::string(64, '0'); },
       {"model.cu", "does not match the manifest"}},
  };
  for (const Case &c : cases) {
    TempDir dir;
    writeBundle(dir.path().string(), c.edit);
    try {
      GatedDeltaBundle::openCached(dir.path().string());
      ADD_FAILURE() << "no error for " << c.fragments.front();
    } catch (const FormatError &error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(dir.file("")), std::string::npos) << message;
      for (const std::string &fragment : c.fragments)
        EXPECT_NE(message.find(fragment), std::string::npos) << "lacks \"" << fragment << "\": " << message;
    }
  }
}

// --- An independent float64 implementation ------------------------------------

/// The token recurrence in LibTorch ops (differentiable): q, k [B, T, Hk, Dk],
/// v [B, T, Hv, Dv], per-token gates g, beta [B, T, Hv] (already derived from
/// a, b for the in-kernel gate), h0 [N, Hv, Dk, Dv] or undefined, sequences
/// as offsets into the B*T tokens. Returns o [B, T, Hv, Dv] and the final
/// states [N, Hv, Dk, Dv].
std::pair<Tensor, Tensor> recurrence(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g,
                                     const Tensor &beta, const Tensor &h0, const std::vector<int64_t> &offsets,
                                     double scale, bool l2norm, bool deltaRule) {
  const int64_t batch = q.size(0), length = q.size(1), hk = q.size(2), dk = q.size(3);
  const int64_t hv = v.size(2), dv = v.size(3), tokens = batch * length;
  auto norm = [&](const Tensor &x) { return l2norm ? x * torch::rsqrt(x.square().sum(-1, true) + 1e-6) : x; };
  // Key head of value head h: h / (Hv / Hk).
  const Tensor qs = norm(q).reshape({tokens, hk, dk}).repeat_interleave(hv / hk, 1);
  const Tensor ks = norm(k).reshape({tokens, hk, dk}).repeat_interleave(hv / hk, 1);
  const Tensor vs = v.reshape({tokens, hv, dv});
  const Tensor gs = g.reshape({tokens, hv}), bs = beta.reshape({tokens, hv});
  std::vector<Tensor> outputs, finals;
  for (size_t n = 0; n + 1 < offsets.size(); ++n) {
    Tensor state = h0.defined() ? h0[n] : torch::zeros({hv, dk, dv}, q.options());
    for (int64_t t = offsets[n]; t < offsets[n + 1]; ++t) {
      state = state * gs[t].exp().view({hv, 1, 1});
      const Tensor kt = ks[t];
      const Tensor read = (state * kt.unsqueeze(-1)).sum(1); // S^T k [hv, dv]
      const Tensor delta = deltaRule ? bs[t].unsqueeze(-1) * (vs[t] - read) : vs[t];
      state = state + kt.unsqueeze(-1) * delta.unsqueeze(1);
      outputs.push_back(scale * (state * qs[t].unsqueeze(-1)).sum(1));
    }
    finals.push_back(state);
  }
  return {torch::stack(outputs).reshape({batch, length, hv, dv}), torch::stack(finals)};
}

double relativeError(const Tensor &got, const Tensor &want) {
  const Tensor a = got.to(torch::kDouble), b = want.to(torch::kDouble);
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-300);
}

std::vector<int64_t> offsetsOf(const std::vector<int64_t> &lengths) {
  std::vector<int64_t> offsets{0};
  for (int64_t length : lengths)
    offsets.push_back(offsets.back() + length);
  return offsets;
}

/// A spec with small dims for the reference (the CPU path never looks at
/// the bundle's binaries, so dims outside the kernels' 64/128 are fine).
GatedDeltaKernelSpec smallSpec(int64_t keyHeads, int64_t valueHeads, bool inKernelGate, bool states,
                               bool varlen, bool deltaRule = true, bool l2norm = true,
                               const std::string &gate = "scalar_log") {
  GatedDeltaKernelSpec spec;
  spec.name = "small";
  spec.numKeyHeads = keyHeads;
  spec.numValueHeads = valueHeads;
  spec.keyDim = 8;
  spec.valueDim = 6;
  spec.gate = gate;
  spec.deltaRule = deltaRule;
  spec.qkL2Norm = l2norm;
  spec.initialState = spec.finalState = states;
  spec.varlen = varlen;
  spec.inKernelGate = inKernelGate;
  spec.elementType = "bf16";
  spec.scale = 0.3f;
  return spec;
}

/// Random float64 inputs for `spec` (batch rows of `length`, or one row
/// holding `lengths` with varlen).
GatedDeltaInputs randomInputs(const GatedDeltaKernelSpec &spec, int64_t batch, int64_t length,
                              const std::vector<int64_t> &lengths, torch::Generator &generator) {
  const auto options = torch::TensorOptions(torch::kDouble);
  auto normal = [&](std::vector<int64_t> shape, double scale) {
    return torch::randn(shape, generator, options) * scale;
  };
  GatedDeltaInputs in;
  const int64_t hk = spec.numKeyHeads, hv = spec.numValueHeads;
  if (spec.varlen) {
    batch = 1;
    length = 0;
    for (int64_t l : lengths)
      length += l;
    std::vector<int32_t> cu{0};
    for (int64_t l : lengths)
      cu.push_back(cu.back() + static_cast<int32_t>(l));
    in.cuSeqlens = torch::tensor(cu, torch::kInt);
  }
  const int64_t sequences = spec.varlen ? static_cast<int64_t>(lengths.size()) : batch;
  // Unit-size keys without the L2 norm (|k|^2 ~ Dk would make the delta
  // rule's I - beta k k^T expand the state without bound).
  const double qkScale = spec.qkL2Norm ? 1.0 : 1.0 / std::sqrt(double(spec.keyDim));
  in.q = normal({batch, length, hk, spec.keyDim}, qkScale);
  in.k = normal({batch, length, hk, spec.keyDim}, qkScale);
  in.v = normal({batch, length, hv, spec.valueDim}, 1);
  const std::vector<int64_t> gates{batch, length, hv};
  if (spec.inKernelGate) {
    in.a = normal(gates, 1);
    if (spec.deltaRule)
      in.b = normal(gates, 1);
    in.aLog = torch::rand({hv}, generator, options) * 2 - 1;
    in.dtBias = normal({hv}, 0.5);
  } else {
    if (spec.gate == "scalar_log")
      in.g = torch::log_sigmoid(normal(gates, 1) + 2);
    if (spec.deltaRule)
      in.beta = 0.05 + 0.95 * torch::rand(gates, generator, options);
  }
  if (spec.initialState)
    in.initialState = normal({sequences, hv, spec.keyDim, spec.valueDim}, 0.5);
  return in;
}

/// The reference (op) against the autograd recurrence: o, final state and
/// every gradient, to float64 rounding.
void compareWithRecurrence(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                           const GatedDeltaInputs &in) {
  // Effective gates, differentiable in the raw inputs.
  std::vector<Tensor *> leaves;
  GatedDeltaInputs leaf = in;
  for (Tensor *t : {&leaf.q, &leaf.k, &leaf.v, &leaf.g, &leaf.beta, &leaf.a, &leaf.b, &leaf.aLog,
                    &leaf.dtBias, &leaf.initialState})
    if (t->defined()) {
      *t = t->detach().clone().requires_grad_();
      leaves.push_back(t);
    }
  const auto options = torch::TensorOptions(torch::kDouble);
  const std::vector<int64_t> gateShape{leaf.v.size(0), leaf.v.size(1), leaf.v.size(2)};
  Tensor g = torch::zeros(gateShape, options), beta = torch::ones(gateShape, options);
  if (spec.inKernelGate) {
    g = -leaf.aLog.exp() * torch::softplus(leaf.a + leaf.dtBias);
    if (spec.deltaRule)
      beta = torch::sigmoid(leaf.b);
  } else {
    if (leaf.g.defined())
      g = leaf.g;
    if (leaf.beta.defined())
      beta = leaf.beta;
  }
  std::vector<int64_t> offsets;
  if (spec.varlen) {
    const Tensor cu = in.cuSeqlens.to(torch::kLong);
    offsets.assign(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
  } else {
    for (int64_t n = 0; n <= in.q.size(0); ++n)
      offsets.push_back(n * in.q.size(1));
  }
  auto [wantOut, wantFinal] = recurrence(leaf.q, leaf.k, leaf.v, g, beta, leaf.initialState, offsets, spec.scale,
                                         spec.qkL2Norm, spec.deltaRule);
  torch::Generator generator = at::detail::createCPUGenerator(99);
  const Tensor gradOut = torch::randn(wantOut.sizes(), generator, options);
  const Tensor gradFinal = spec.finalState ? torch::randn(wantFinal.sizes(), generator, options) : Tensor();
  Tensor loss = (wantOut * gradOut).sum();
  if (spec.finalState)
    loss = loss + (wantFinal * gradFinal).sum();
  std::vector<Tensor> inputs;
  for (Tensor *t : leaves)
    inputs.push_back(*t);
  const std::vector<Tensor> want = torch::autograd::grad({loss}, inputs);

  const GatedDeltaOutputs got = gatedDeltaForward(bundle, spec, in);
  EXPECT_LT(relativeError(got.out, wantOut), 1e-12);
  if (spec.finalState)
    EXPECT_LT(relativeError(got.finalState, wantFinal), 1e-12);
  else
    EXPECT_FALSE(got.finalState.defined());
  const GatedDeltaGrads grads = gatedDeltaBackward(bundle, spec, in, gradOut, gradFinal);
  size_t i = 0;
  for (const auto &[name, grad] : std::vector<std::pair<const char *, Tensor>>{
           {"q", grads.q},         {"k", grads.k},     {"v", grads.v},       {"g", grads.g},
           {"beta", grads.beta},   {"a", grads.a},     {"b", grads.b},       {"A_log", grads.aLog},
           {"dt_bias", grads.dtBias}, {"initial_state", grads.initialState}}) {
    if (!grad.defined())
      continue;
    ASSERT_LT(i, want.size()) << name;
    EXPECT_EQ(grad.sizes(), want[i].sizes()) << name;
    EXPECT_LT(relativeError(grad, want[i]), 1e-11) << name;
    ++i;
  }
  EXPECT_EQ(i, want.size()) << "a gradient is missing";
}

class GatedDeltaReference : public ::testing::Test {
protected:
  void SetUp() override {
    writeBundle(dir_.path().string());
    bundle_ = GatedDeltaBundle::openCached(dir_.path().string());
  }
  TempDir dir_;
  std::shared_ptr<const GatedDeltaBundle> bundle_;
  torch::Generator generator_ = at::detail::createCPUGenerator(7);
};

TEST_F(GatedDeltaReference, MatchesTheRecurrenceVarlenGroupedStates) {
  // Lengths 1..70, none a multiple of 64 but one: checkpoint blocks of 64 split some.
  const GatedDeltaKernelSpec spec = smallSpec(2, 4, false, true, true);
  compareWithRecurrence(*bundle_, spec, randomInputs(spec, 0, 0, {1, 17, 64, 65, 70, 3}, generator_));
}

TEST_F(GatedDeltaReference, MatchesTheRecurrenceInKernelGate) {
  const GatedDeltaKernelSpec spec = smallSpec(1, 2, true, true, true);
  compareWithRecurrence(*bundle_, spec, randomInputs(spec, 0, 0, {300, 1, 65, 17}, generator_));
}

TEST_F(GatedDeltaReference, MatchesTheRecurrenceFixedLengthVariants) {
  const GatedDeltaKernelSpec noDelta = smallSpec(2, 2, false, true, false, /*deltaRule=*/false);
  compareWithRecurrence(*bundle_, noDelta, randomInputs(noDelta, 3, 40, {}, generator_));
  const GatedDeltaKernelSpec noGate = smallSpec(1, 3, false, false, false, true, /*l2norm=*/false, "none");
  compareWithRecurrence(*bundle_, noGate, randomInputs(noGate, 2, 70, {}, generator_));
  const GatedDeltaKernelSpec inKernelNoDelta = smallSpec(2, 4, true, false, false, false);
  compareWithRecurrence(*bundle_, inKernelNoDelta, randomInputs(inKernelNoDelta, 2, 33, {}, generator_));
}

TEST_F(GatedDeltaReference, MatchesTheModelsChunkedRule) {
  // models::gatedDeltaRule: the chunked (UT-transform) algorithm in LibTorch,
  // zero initial state, scale 1/sqrt(Dk); differentiable in float64.
  const GatedDeltaKernelSpec &spec = bundle_->spec("model_varlen");
  const std::vector<int64_t> lengths{5, 64, 1, 70, 100};
  GatedDeltaInputs in = randomInputs(spec, 0, 0, lengths, generator_);
  const GatedDeltaOutputs got = gatedDeltaForward(*bundle_, spec, in);
  const int64_t length = in.q.size(1);
  const models::TokenLayout layout = models::TokenLayout::packed(in.cuSeqlens, 1, length, torch::kCPU);
  std::vector<Tensor> leaves{in.q.clone().requires_grad_(), in.k.clone().requires_grad_(),
                             in.v.clone().requires_grad_(), in.g.clone().requires_grad_(),
                             in.beta.clone().requires_grad_()};
  const Tensor want = models::gatedDeltaRule(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], layout);
  EXPECT_LT(relativeError(got.out, want), 1e-10);
  const Tensor gradOut = torch::randn(want.sizes(), generator_, want.options());
  const std::vector<Tensor> wantGrads = torch::autograd::grad({(want * gradOut).sum()}, leaves);
  const GatedDeltaGrads grads = gatedDeltaBackward(*bundle_, spec, in, gradOut, Tensor());
  const Tensor gotGrads[] = {grads.q, grads.k, grads.v, grads.g, grads.beta};
  for (size_t i = 0; i < 5; ++i)
    EXPECT_LT(relativeError(gotGrads[i], wantGrads[i]), 1e-9) << "gradient " << i;
}

TEST_F(GatedDeltaReference, AutogradMatchesTheBackwardEntryPoint) {
  for (const char *name : {"in_kernel_gate", "grouped_varlen_states", "plain"}) {
    const GatedDeltaKernelSpec &spec = bundle_->spec(name);
    const GatedDeltaInputs in = randomInputs(spec, 2, 20, {20, 3, 9}, generator_);
    GatedDeltaInputs leaf = in;
    std::vector<Tensor> leaves;
    for (Tensor *t : {&leaf.q, &leaf.k, &leaf.v, &leaf.g, &leaf.beta, &leaf.a, &leaf.b, &leaf.aLog,
                      &leaf.dtBias, &leaf.initialState})
      if (t->defined()) {
        *t = t->clone().requires_grad_();
        leaves.push_back(*t);
      }
    const GatedDeltaOutputs out = gatedDelta(bundle_, bundle_->spec(name), leaf);
    EXPECT_EQ(out.finalState.defined(), spec.finalState) << name;
    const Tensor gradOut = torch::randn(out.out.sizes(), generator_, out.out.options());
    Tensor loss = (out.out * gradOut).sum();
    Tensor gradFinal;
    if (spec.finalState) {
      gradFinal = torch::randn(out.finalState.sizes(), generator_, out.finalState.options());
      loss = loss + (out.finalState * gradFinal).sum();
    }
    const std::vector<Tensor> viaAutograd = torch::autograd::grad({loss}, leaves);
    const GatedDeltaGrads direct = gatedDeltaBackward(*bundle_, spec, in, gradOut, gradFinal);
    std::vector<Tensor> directList;
    for (const Tensor &t : {direct.q, direct.k, direct.v, direct.g, direct.beta, direct.a, direct.b,
                            direct.aLog, direct.dtBias, direct.initialState})
      if (t.defined())
        directList.push_back(t);
    ASSERT_EQ(directList.size(), viaAutograd.size()) << name;
    for (size_t i = 0; i < directList.size(); ++i)
      EXPECT_TRUE(torch::allclose(directList[i], viaAutograd[i], 1e-12, 1e-12)) << name << " gradient " << i;
  }
}

TEST_F(GatedDeltaReference, OnlyTheFinalStateInTheLoss) {
  const GatedDeltaKernelSpec &spec = bundle_->spec("grouped_varlen_states");
  GatedDeltaInputs in = randomInputs(spec, 0, 0, {10, 4}, generator_);
  in.v = in.v.clone().requires_grad_();
  const GatedDeltaOutputs out = gatedDelta(bundle_, spec, in);
  const Tensor gradV = torch::autograd::grad({out.finalState.sum()}, {in.v})[0];
  const GatedDeltaGrads direct =
      gatedDeltaBackward(*bundle_, spec, in, Tensor(), torch::ones_like(out.finalState));
  EXPECT_TRUE(torch::allclose(gradV, direct.v, 1e-12, 1e-12));
  EXPECT_GT(gradV.abs().max().item<double>(), 0);
}

TEST_F(GatedDeltaReference, LowPrecisionAndStridedInputs) {
  // CPU: any floating dtypes, computed in float64, o in the dtype of q.
  const GatedDeltaKernelSpec &spec = bundle_->spec("model");
  const GatedDeltaInputs in = randomInputs(spec, 2, 30, {}, generator_);
  const GatedDeltaOutputs wide = gatedDeltaForward(*bundle_, spec, in);
  GatedDeltaInputs narrow = in;
  // q, k, v as column slices of one fused row, as the model's projection gives them.
  const Tensor fused = torch::cat({in.q.flatten(2), in.k.flatten(2), in.v.flatten(2)}, 2).to(torch::kBFloat16);
  narrow.q = fused.narrow(2, 0, 64).view({2, 30, 1, 64});
  narrow.k = fused.narrow(2, 64, 64).view({2, 30, 1, 64});
  narrow.v = fused.narrow(2, 128, 128).view({2, 30, 2, 64});
  narrow.g = in.g.to(torch::kFloat);
  narrow.beta = in.beta.to(torch::kBFloat16);
  const GatedDeltaOutputs low = gatedDeltaForward(*bundle_, spec, narrow);
  EXPECT_EQ(low.out.scalar_type(), torch::kBFloat16);
  EXPECT_LT(relativeError(low.out, wide.out), 3e-2);
  GatedDeltaInputs contiguous = narrow;
  contiguous.q = narrow.q.contiguous();
  contiguous.k = narrow.k.contiguous();
  contiguous.v = narrow.v.contiguous();
  EXPECT_TRUE(torch::equal(gatedDeltaForward(*bundle_, spec, contiguous).out, low.out));
}

// --- Input errors -----------------------------------------------------------------

TEST_F(GatedDeltaReference, BadInputsAreNamed) {
  const GatedDeltaKernelSpec &varlen = bundle_->spec("grouped_varlen_states");
  const GatedDeltaKernelSpec &inKernel = bundle_->spec("in_kernel_gate");
  const GatedDeltaKernelSpec &plain = bundle_->spec("plain");
  const GatedDeltaInputs good = randomInputs(varlen, 0, 0, {5, 7}, generator_);
  const GatedDeltaInputs goodInKernel = randomInputs(inKernel, 0, 0, {5, 7}, generator_);
  const GatedDeltaInputs goodPlain = randomInputs(plain, 2, 6, {}, generator_);
  struct Case {
    const GatedDeltaKernelSpec &spec;
    GatedDeltaInputs inputs;
    std::function<void(GatedDeltaInputs &)> edit;
    std::vector<std::string> fragments;
  };
  const Case cases[] = {
      {varlen, good, [](GatedDeltaInputs &in) { in.q = in.q[0]; }, {"4 dimensions", "got q [12, 1, 64]"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.q = torch::cat({in.q, in.q}, 2); in.k = in.q; },
       {"1 key heads", "got 2 and 2"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.v = in.v.narrow(3, 0, 32); },
       {"value_dim 64", "got 64 and 32"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.k = in.k.narrow(1, 0, 3); }, {"shapes do not agree"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.g = Tensor(); }, {"g is required", "scalar_log"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.beta = in.beta.narrow(2, 0, 1); },
       {"beta must be [B, T, Hv] [1, 12, 2]", "got [1, 12, 1]"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.a = in.g; }, {"a is not an input", "no in_kernel_gate"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.g = in.g.to(torch::kInt); }, {"g must be a floating-point"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.cuSeqlens = Tensor(); }, {"cu_seqlens is required"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.cuSeqlens = in.cuSeqlens.to(torch::kLong); },
       {"cu_seqlens must be a 1-D int32 tensor", "Long"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.cuSeqlens = torch::tensor({0, 5, 5, 12}, torch::kInt); },
       {"increase strictly", "cu_seqlens[2] = 5 after 5"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.cuSeqlens = torch::tensor({0, 5, 11}, torch::kInt); },
       {"cu_seqlens[2] must be B*T = 12, got 11"}},
      {varlen, good, [](GatedDeltaInputs &in) { in.cuSeqlens = torch::tensor({1, 5, 12}, torch::kInt); },
       {"cu_seqlens[0] must be 0"}},
      {varlen, good,
       [](GatedDeltaInputs &in) { in.initialState = in.initialState.narrow(0, 0, 1); },
       {"initial_state must be [N, Hv, Dk, Dv] [2, 2, 64, 64]"}},
      {plain, goodPlain, [](GatedDeltaInputs &in) { in.cuSeqlens = torch::tensor({0, 12}, torch::kInt); },
       {"cu_seqlens is not an input", "no varlen"}},
      {plain, goodPlain, [](GatedDeltaInputs &in) { in.g = torch::zeros({2, 6, 2}, torch::kDouble); },
       {"g is not an input", "gate is none"}},
      {plain, goodPlain,
       [](GatedDeltaInputs &in) { in.initialState = torch::zeros({2, 2, 64, 64}, torch::kDouble); },
       {"initial_state is not an input", "no initial_state"}},
      {inKernel, goodInKernel, [](GatedDeltaInputs &in) { in.beta = torch::sigmoid(in.b); },
       {"beta is not an input", "beta = sigmoid(b)"}},
      {inKernel, goodInKernel, [](GatedDeltaInputs &in) { in.dtBias = Tensor(); },
       {"dt_bias is required", "softplus(a + dt_bias)"}},
      {inKernel, goodInKernel, [](GatedDeltaInputs &in) { in.aLog = in.aLog.unsqueeze(0); },
       {"A_log must be [Hv] [2]", "got [1, 2]"}},
  };
  for (const Case &c : cases) {
    GatedDeltaInputs in = c.inputs;
    c.edit(in);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back("dflex gated_delta '" + c.spec.name + "'");
    try {
      gatedDeltaForward(*bundle_, c.spec, in);
      ADD_FAILURE() << "no error for " << fragments.front();
    } catch (const FormatError &error) {
      const std::string message = error.what();
      for (const std::string &fragment : fragments)
        EXPECT_NE(message.find(fragment), std::string::npos) << "lacks \"" << fragment << "\": " << message;
    }
  }
  // The backward's output gradients.
  expectError<FormatError>(
      [&] { gatedDeltaBackward(*bundle_, plain, goodPlain, torch::zeros({2, 6, 2, 32}, torch::kDouble), Tensor()); },
      {"backward", "grad_o must be [B, T, Hv, Dv] [2, 6, 2, 64]"});
  expectError<FormatError>(
      [&] {
        gatedDeltaBackward(*bundle_, plain, goodPlain, Tensor(), torch::zeros({2, 2, 64, 64}, torch::kDouble));
      },
      {"grad_final_state given", "no final_state"});
}

// --- The target model's hook ------------------------------------------------------

TEST_F(GatedDeltaReference, ModelHookOnTheCpuIsTheModelsRule) {
  const models::GatedDeltaFn hook = models::gatedDeltaHook(bundle_, "model_varlen");
  const GatedDeltaInputs in = randomInputs(bundle_->spec("model"), 2, 50, {}, generator_);
  const Tensor cu = torch::tensor({0, 20, 50, 51, 100}, torch::kInt);
  const models::TokenLayout layout = models::TokenLayout::packed(cu, 2, 50, torch::kCPU);
  const models::GatedDeltaCall call{in.q, in.k, in.v, in.g, in.beta, layout};
  EXPECT_TRUE(torch::equal(hook(call), models::gatedDeltaRule(in.q, in.k, in.v, in.g, in.beta, layout)));
  // On the CPU the hook is the model's rule, and the op agrees with it.
  GatedDeltaInputs packed = in;
  packed.cuSeqlens = cu;
  EXPECT_LT(relativeError(gatedDeltaForward(*bundle_, bundle_->spec("model_varlen"), packed).out, hook(call)),
            1e-10);
}

TEST_F(GatedDeltaReference, ModelHookRejectsSpecsThatCannotServe) {
  expectError<FormatError>([&] { models::gatedDeltaHook(bundle_, "in_kernel_gate"); },
                           {"'in_kernel_gate'", "target model", "without in_kernel_gate"});
  expectError<FormatError>([&] { models::gatedDeltaHook(bundle_, "plain"); }, {"gate scalar_log"});
  TempDir other;
  writeBundle(other.path().string(), [](JsonValue &m) { moduleNamed(m, "model")["spec"]["scale"] = 0.5; });
  expectError<FormatError>([&] { models::gatedDeltaHook(GatedDeltaBundle::openCached(other.path().string()), "model"); },
                           {"1/sqrt(key_dim) = 0.125", "the spec by 0.5"});
}

// --- On a GPU ---------------------------------------------------------------------
// Skipped without a CUDA device or without DFLEX_GATED_DELTA_BUNDLES, a folder
// holding gated_delta_specs/ compiled for the device (test/gpu/runtime/gated_delta.sh).

TEST(GatedDeltaCuda, ModelHookMatchesTheModelsRule) {
  const char *bundles = std::getenv("DFLEX_GATED_DELTA_BUNDLES");
  if (!torch::cuda::is_available() || bundles == nullptr)
    GTEST_SKIP() << "needs a CUDA device and DFLEX_GATED_DELTA_BUNDLES";
  // gdn_grouped_varlen serves a layer of 2 key heads, 4 value heads, dims 64.
  const models::GatedDeltaFn hook = models::gatedDeltaHook(GatedDeltaBundle::openCached(std::string(bundles) + "/gated_delta_specs"), "gdn_grouped_varlen");
  torch::manual_seed(3);
  const int64_t batch = 2, length = 150, keyWidth = 2 * 64;
  const auto cuda = torch::TensorOptions(torch::kCUDA);
  // q, k, v as the model slices them from one convolved projection.
  const Tensor mixed = torch::randn({batch, length, 2 * keyWidth + 4 * 64}, cuda).to(torch::kBFloat16);
  const Tensor q = mixed.narrow(-1, 0, keyWidth).view({batch, length, 2, 64});
  const Tensor k = mixed.narrow(-1, keyWidth, keyWidth).view({batch, length, 2, 64});
  const Tensor v = mixed.narrow(-1, 2 * keyWidth, 4 * 64).view({batch, length, 4, 64});
  const Tensor g = torch::log_sigmoid(torch::randn({batch, length, 4}, cuda) + 2);
  const Tensor beta = torch::sigmoid(torch::randn({batch, length, 4}, cuda)).to(torch::kBFloat16);
  const Tensor cu = torch::tensor({0, 40, 150, 151, 300}, torch::kInt);
  auto wide = [](const Tensor &t) { return t.cpu().to(torch::kDouble); };
  for (bool packed : {false, true}) {
    auto layoutOn = [&](torch::Device device) {
      return packed ? models::TokenLayout::packed(cu, batch, length, device)
                    : models::TokenLayout::rows(batch, length, device);
    };
    const models::TokenLayout layout = layoutOn(torch::kCUDA);
    const Tensor got = hook({q, k, v, g, beta, layout});
    EXPECT_TRUE(got.is_cuda());
    EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
    // The model's own rule in float64 on the CPU, on the same values.
    const Tensor want = models::gatedDeltaRule(wide(q), wide(k), wide(v), wide(g), wide(beta), layoutOn(torch::kCPU));
    EXPECT_LT(relativeError(got.cpu(), want), 1e-2) << (packed ? "packed rows" : "one sequence per row");
  }
}

} // namespace
