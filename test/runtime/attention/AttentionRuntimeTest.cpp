// Kernel bundle loading, capture binding, tile lists and the CPU reference
// of the attention op, on bundles written here (no compiler needed): a
// document + sliding-window mask with a per-head bias score_mod.
#include "TestSupport.h"

#include "dflex/Codegen/Derivative.h"
#include "dflex/Codegen/Variant.h"
#include "dflex/Expr/ProgramJson.h"
#include "dflex/Expr/Semantics.h"
#include "dflex/Support/Json.h"
#include "dflex/Support/Sha256.h"
#include "dflex/runtime/attention/AttentionOp.h"
#include "dflex/Support/Error.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <set>
#include <thread>

using namespace dflex;
using namespace dflex::runtime;
namespace bundle = dflex::bundle;
using dflex::FormatError;
using dflex::IoError;
using dflex::runtime::test::expectError;
using dflex::runtime::test::TempDir;
using expr::Opcode;
using expr::ScalarType;

namespace {

class ProgramBuilder {
public:
  ProgramBuilder(std::string name, bool isScoreMod) {
    program_.name = std::move(name);
    program_.isScoreMod = isScoreMod;
  }
  void capture(std::string name, bool isTensor, ScalarType type, int rank) {
    program_.captures.push_back({std::move(name), isTensor, type, rank});
  }
  int32_t add(Opcode op, ScalarType type, std::vector<int32_t> operands = {}, int64_t imm = 0,
              int64_t imm2 = 0) {
    expr::Instruction inst{op, type, std::move(operands)};
    inst.imm = imm;
    inst.imm2 = imm2;
    program_.instructions.push_back(inst);
    return static_cast<int32_t>(program_.instructions.size() - 1);
  }
  int32_t constant(float value) {
    int32_t n = add(Opcode::Constant, ScalarType::F32);
    program_.instructions[n].fimm = value;
    return n;
  }
  int32_t read(ScalarType type, int64_t tensor, std::vector<int32_t> indices,
               std::optional<int64_t> padding) {
    int32_t n = add(Opcode::Read, type, std::move(indices), tensor);
    if (padding) {
      program_.instructions[n].hasPadding = true;
      program_.instructions[n].paddingInt = *padding;
    }
    return n;
  }
  expr::Program finish(int32_t result) {
    program_.result = result;
    return program_;
  }

private:
  expr::Program program_;
};

constexpr int64_t kCmpEq = 0, kCmpUlt = 6, kCmpUge = 9;

/// visible = docs[b, q] == docs[b, kv] (padding -1 / -2: never equal past
/// the end) and 0 <= q - kv < window.
expr::Program documentWindowMask() {
  ProgramBuilder p("document_window", false);
  p.capture("docs", true, ScalarType::I32, 2);
  p.capture("window", false, ScalarType::Index, 0);
  int32_t b = p.add(Opcode::Argument, ScalarType::Index, {}, 0);
  int32_t q = p.add(Opcode::Argument, ScalarType::Index, {}, 2);
  int32_t kv = p.add(Opcode::Argument, ScalarType::Index, {}, 3);
  int32_t window = p.add(Opcode::Capture, ScalarType::Index, {}, 1);
  int32_t qDoc = p.read(ScalarType::I32, 0, {b, q}, -1);
  int32_t kvDoc = p.read(ScalarType::I32, 0, {b, kv}, -2);
  int32_t same = p.add(Opcode::CmpI, ScalarType::I1, {qDoc, kvDoc}, kCmpEq, 32);
  int32_t causal = p.add(Opcode::CmpI, ScalarType::I1, {q, kv}, kCmpUge, 64);
  int32_t distance = p.add(Opcode::SubI, ScalarType::Index, {q, kv});
  int32_t near = p.add(Opcode::CmpI, ScalarType::I1, {distance, window}, kCmpUlt, 64);
  int32_t both = p.add(Opcode::AndI, ScalarType::I1, {same, causal});
  return p.finish(p.add(Opcode::AndI, ScalarType::I1, {both, near}));
}

/// logit = 2 tanh(score / 2) + bias[h], with its derivative.
expr::Program softcapBiasScoreMod() {
  ProgramBuilder p("softcap_bias", true);
  p.capture("bias", true, ScalarType::F32, 1);
  int32_t score = p.add(Opcode::Argument, ScalarType::F32, {}, 0);
  int32_t h = p.add(Opcode::Argument, ScalarType::Index, {}, 2);
  int32_t cap = p.constant(2.0f);
  int32_t scaled = p.add(Opcode::DivF, ScalarType::F32, {score, cap});
  int32_t squashed = p.add(Opcode::Tanh, ScalarType::F32, {scaled});
  int32_t capped = p.add(Opcode::MulF, ScalarType::F32, {squashed, cap});
  int32_t bias = p.read(ScalarType::F32, 0, {h}, std::nullopt);
  expr::Program scoreMod = p.finish(p.add(Opcode::AddF, ScalarType::F32, {capped, bias}));
  Status derivative = codegen::appendScoreDerivative(scoreMod);
  EXPECT_TRUE(derivative.ok()) << derivative.message();
  return scoreMod;
}

constexpr int kQHeads = 4, kKvHeads = 2, kHeadDim = 8;
constexpr float kScale = 0.35355339f;

/// What a test bundle holds: binaries per arch and which Hopper kernels
/// the sm_90a (and compute_90a) binaries list.
struct BundleContents {
  std::vector<std::string> archs{"sm_90"};
  bool hopperForward = false;
  bool hopperBackward = false;
};

/// The portable kernels' launch constants of a test binary: sm_120's
/// configs differ from the others' (as kernels/attention/config.cuh's do).
JsonValue portableLaunch(const std::string &arch) {
  const bool sm120 = arch == "sm_120";
  JsonValue launch = JsonValue::object();
  launch["dflex_forward_launch"]["threads"] = sm120 ? 64 : 128;
  launch["dflex_forward_launch"]["shared_bytes"] = sm120 ? 2048 : 4096;
  launch["dflex_forward_launch"]["block_m"] = sm120 ? 16 : 32;
  launch["dflex_forward_launch"]["block_n"] = 16;
  launch["dflex_backward_launch"]["threads"] = 128;
  launch["dflex_backward_launch"]["shared_bytes"] = sm120 ? 6144 : 8192;
  launch["dflex_backward_launch"]["block_m"] = 16;
  launch["dflex_backward_launch"]["block_n"] = sm120 ? 16 : 32;
  launch["dflex_backward_launch"]["row_kernel_threads"] = 256;
  launch["dflex_backward_launch"]["row_kernel_rows"] = 8;
  return launch;
}

const std::vector<const char *> kPortableRoles = {
    "attention_forward", "attention_backward_preprocess", "attention_backward",
    "attention_backward_grad_q"};
const std::vector<const char *> kHopperBackwardRoles = {
    "attention_backward_preprocess_sm90", "attention_backward_sm90",
    "attention_backward_grad_q_sm90"};

/// Writes a bundle with spec "windowed" and spec "windowed_softcap" whose
/// manifest `edit` may alter.
void writeBundle(const std::string &directory,
                 const std::function<void(JsonValue &)> &edit = {},
                 const BundleContents &contents = {}) {
  const expr::Program mask = documentWindowMask();
  const expr::Program scoreMod = softcapBiasScoreMod();
  JsonValue manifest = JsonValue::object();
  manifest["format_version"] = bundle::kBundleFormatVersion;
  manifest["template_version"] = bundle::kTemplateVersion;
  JsonValue modules = JsonValue::array();
  for (bool withScoreMod : {false, true}) {
    const std::string name = withScoreMod ? "windowed_softcap" : "windowed";
    JsonValue module = JsonValue::object();
    module["name"] = name;
    module["kind"] = "attention";
    JsonValue spec = JsonValue::object();
    spec["mask"] = mask.name;
    if (withScoreMod)
      spec["score_mod"] = scoreMod.name;
    spec["num_q_heads"] = kQHeads;
    spec["num_kv_heads"] = kKvHeads;
    spec["qk_head_dim"] = kHeadDim;
    spec["v_head_dim"] = kHeadDim;
    spec["element_type"] = "bf16";
    spec["scale"] = static_cast<double>(kScale);
    module["spec"] = spec;
    JsonValue programs = JsonValue::array();
    programs.push(expr::toJson(mask));
    if (withScoreMod)
      programs.push(expr::toJson(scoreMod));
    module["programs"] = programs;
    module["variant"] = codegen::toJson(
        codegen::layoutVariant(mask, withScoreMod ? &scoreMod : nullptr).value());
    JsonValue kernels = JsonValue::array();
    std::map<std::string, std::set<std::string>> parts; // arch -> parts of its binary
    auto addKernel = [&](const std::string &role, bool hopper) {
      JsonValue kernel = JsonValue::object();
      kernel["role"] = role;
      kernel["name_expression"] = "kernel<" + role + ">";
      if (hopper)
        kernel["required_target"] = "sm_90a";
      kernel["archs"] = JsonValue::object();
      for (const std::string &arch : contents.archs)
        if (!hopper || arch == "sm_90a" || arch == "compute_90a") {
          kernel["archs"][arch]["lowered_name"] = "_Z" + role + "_" + arch;
          parts[arch].insert(bundle::kernelRole(*bundle::kernelRoleNamed(role)).part);
        }
      kernels.push(kernel);
    };
    for (const char *role : kPortableRoles)
      addKernel(role, false);
    if (contents.hopperForward)
      addKernel("attention_forward_sm90", true);
    if (contents.hopperBackward)
      for (const char *role : kHopperBackwardRoles)
        addKernel(role, true);
    module["kernels"] = kernels;
    const std::string source = "// generated source of " + name + "\n";
    test::writeBytes(directory + "/" + name + ".cu", source);
    module["source_file"] = name + ".cu";
    module["source_sha256"] = Sha256::hexDigest(source);
    for (const std::string &arch : contents.archs) {
      // Each part's files (compute_XX: PTX only).
      for (const std::string &part : parts[arch]) {
        const std::string stem = name + "." + arch + "." + part;
        JsonValue &entry = module["binaries"][arch]["parts"][part];
        const std::string ptx = "// ptx of " + name + " for " + arch + ", " + part + "\n";
        test::writeBytes(directory + "/" + stem + ".ptx", ptx);
        entry["ptx"] = stem + ".ptx";
        entry["ptx_sha256"] = Sha256::hexDigest(ptx);
        if (arch.rfind("sm_", 0) != 0)
          continue;
        const std::string cubin = "cubin bytes of " + name + " for " + arch + ", " + part;
        test::writeBytes(directory + "/" + stem + ".cubin", cubin);
        entry["cubin"] = stem + ".cubin";
        entry["cubin_sha256"] = Sha256::hexDigest(cubin);
      }
      // Each binary's launch constants; the Hopper kernels' as dflex-compile
      // reads them for head_dim 128, in the binaries that have them.
      JsonValue launch = portableLaunch(arch);
      const bool hopper = arch == "sm_90a" || arch == "compute_90a";
      if (hopper && contents.hopperForward) {
        launch["dflex_forward_sm90_launch"]["threads"] = 384;
        launch["dflex_forward_sm90_launch"]["shared_bytes"] = 164936;
        launch["dflex_forward_sm90_launch"]["block_m"] = 128;
        launch["dflex_forward_sm90_launch"]["block_n"] = 128;
      }
      if (hopper && contents.hopperBackward) {
        launch["dflex_backward_sm90_launch"]["threads"] = 384;
        launch["dflex_backward_sm90_launch"]["shared_bytes"] = 231464;
        launch["dflex_backward_sm90_launch"]["block_m"] = 64;
        launch["dflex_backward_sm90_launch"]["block_n"] = 128;
        launch["dflex_backward_sm90_launch"]["row_kernel_threads"] = 256;
        launch["dflex_backward_sm90_launch"]["row_kernel_rows"] = 8;
      }
      module["binaries"][arch]["launch"] = launch;
    }
    modules.push(module);
  }
  manifest["modules"] = modules;
  if (edit)
    edit(manifest);
  test::writeBytes(directory + "/manifest.json", writeJson(manifest));
}

JsonValue &firstModule(JsonValue &manifest) { return manifest["modules"].asArray()[0]; }

// --- Bundles -----------------------------------------------------------------

TEST(KernelBundle, OpensAndDescribesItsSpecs) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = KernelBundle::open(dir.path().string());
  ASSERT_EQ(bundle->attentionSpecs().size(), 2u);
  const AttentionKernelSpec &spec = bundle->attention("windowed_softcap");
  EXPECT_EQ(spec.numQHeads, kQHeads);
  EXPECT_EQ(spec.numKvHeads, kKvHeads);
  EXPECT_EQ(spec.qkHeadDim, kHeadDim);
  EXPECT_EQ(spec.elementType, "bf16");
  EXPECT_FLOAT_EQ(spec.scale, kScale);
  EXPECT_EQ(spec.captureNames(), (std::vector<std::string>{"docs", "window", "bias"}));
  ASSERT_TRUE(spec.scoreMod.has_value());
  EXPECT_GE(spec.scoreMod->scoreDerivative, 0);
  ASSERT_EQ(spec.launches.size(), 1u);
  const AttentionLaunches &launches = spec.launches.at("sm_90");
  EXPECT_EQ(launches.forward.blockM, 32);
  EXPECT_EQ(launches.forward.sharedBytes, 4096);
  EXPECT_EQ(launches.backward.blockN, 32);
  EXPECT_EQ(launches.backward.rowKernelThreads, 256);
  EXPECT_EQ(launches.backward.rowKernelRows, 8);
  EXPECT_EQ(spec.kernel(bundle::KernelRole::AttentionBackward).loweredNames.at("sm_90"),
            "_Zattention_backward_sm_90");
  const BundleBinary &binary = spec.binaries.at("sm_90");
  EXPECT_EQ(binary.parts.size(), 2u); // forward, backward
  EXPECT_EQ(binary.parts.at("backward").cubinFile, "windowed_softcap.sm_90.backward.cubin");
  EXPECT_EQ(bundle->readVerified(binary.parts.at("backward").cubinFile,
                                 binary.parts.at("backward").cubinSha256),
            "cubin bytes of windowed_softcap for sm_90, backward");
  // Its image: one cubin per part, each holding the kernels of its part.
  const KernelImage image = bundle->kernelImage(spec, "sm_90");
  ASSERT_EQ(image.parts.size(), 2u);
  EXPECT_EQ(image.parts[0].image, "cubin bytes of windowed_softcap for sm_90, backward");
  EXPECT_EQ(image.parts[0].roles,
            (std::vector<bundle::KernelRole>{bundle::KernelRole::AttentionBackwardPreprocess,
                                             bundle::KernelRole::AttentionBackward,
                                             bundle::KernelRole::AttentionBackwardGradQ}));
  EXPECT_EQ(image.parts[1].image, "cubin bytes of windowed_softcap for sm_90, forward");
  EXPECT_EQ(image.parts[1].roles, std::vector<bundle::KernelRole>{bundle::KernelRole::AttentionForward});
  EXPECT_EQ(image.loweredNames.at(bundle::KernelRole::AttentionForward), "_Zattention_forward_sm_90");
  EXPECT_FALSE(launches.forwardSm90.has_value());
  EXPECT_FALSE(launches.backwardSm90.has_value());
  EXPECT_FALSE(spec.hasKernel(bundle::KernelRole::AttentionForwardSm90, "sm_90a"));
  // The constants travel with the binary: the same manifest entry as
  // attentionLaunches gives for the arch.
  EXPECT_EQ(bundle->attentionLaunches(spec, "sm_90"), launches);
}

TEST(KernelBundle, MissingDirectoryOrManifestNamesThePath) {
  TempDir dir;
  expectError<IoError>([&] { KernelBundle::open(dir.file("nowhere")); }, {dir.file("nowhere")});
  expectError<IoError>([&] { KernelBundle::openCached(dir.path().string()); },
                       {dir.file("manifest.json")});
}

TEST(KernelBundle, MissingFileIsNamed) {
  TempDir dir;
  writeBundle(dir.path().string());
  std::filesystem::remove(dir.file("windowed.sm_90.backward.cubin"));
  expectError<IoError>([&] { KernelBundle::open(dir.path().string()); },
                       {dir.file("windowed.sm_90.backward.cubin")});
}

TEST(KernelBundle, ShaMismatchIsNamed) {
  TempDir dir;
  writeBundle(dir.path().string());
  test::writeBytes(dir.file("windowed_softcap.sm_90.forward.ptx"), "// tampered\n");
  expectError<FormatError>([&] { KernelBundle::open(dir.path().string()); },
                           {dir.file("windowed_softcap.sm_90.forward.ptx"), "sha256", "does not match"});
}

TEST(KernelBundle, UnknownSpecListsTheKnownOnes) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = KernelBundle::open(dir.path().string());
  expectError<FormatError>([&] { bundle->attention("causal"); },
                           {"no attention spec 'causal'", "windowed, windowed_softcap",
                            dir.path().string()});
}

/// Writes a bundle of `contents` that `edit` spoils and expects opening it
/// to fail with a message naming the manifest and holding `fragments`.
void expectBadManifest(const std::function<void(JsonValue &)> &edit,
                       const BundleContents &contents,
                       const std::vector<std::string> &fragments) {
  TempDir dir;
  writeBundle(dir.path().string(), edit, contents);
  try {
    KernelBundle::open(dir.path().string());
    ADD_FAILURE() << "accepted";
  } catch (const FormatError &error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(dir.file("manifest.json")), std::string::npos) << message;
    for (const std::string &fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

TEST(KernelBundle, BadManifestsAreNamedAndExplained) {
  struct Case {
    const char *what;
    std::function<void(JsonValue &)> edit;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"format", [](JsonValue &m) { m["format_version"] = 2; },
       {"format_version", "reads version 3, got 2", "rebuild"}},
      {"templates", [](JsonValue &m) { m["template_version"] = "dflex-templates-0"; },
       {"template_version", "dflex-templates-0", "rebuild"}},
      {"launch",
       [](JsonValue &m) {
         firstModule(m)["binaries"]["sm_90"]["launch"]["dflex_forward_launch"]["block_m"] = 0;
       },
       {"module 'windowed'", "binaries: sm_90: launch: dflex_forward_launch: block_m", "got 0"}},
      {"row kernel rows",
       [](JsonValue &m) {
         firstModule(m)["binaries"]["sm_90"]["launch"]["dflex_backward_launch"]["row_kernel_rows"] = 0;
       },
       {"binaries: sm_90: launch: dflex_backward_launch: row_kernel_rows", "got 0"}},
      {"row kernel rows missing",
       [](JsonValue &m) {
         firstModule(m)["binaries"]["sm_90"]["launch"]["dflex_backward_launch"].asObject().erase(
             "row_kernel_rows");
       },
       {"binaries: sm_90: launch: dflex_backward_launch: row_kernel_rows", "missing"}},
      {"launch missing",
       [](JsonValue &m) { firstModule(m)["binaries"]["sm_90"].asObject().erase("launch"); },
       {"module 'windowed'", "binaries: sm_90: launch: missing"}},
      {"pass missing",
       [](JsonValue &m) {
         firstModule(m)["binaries"]["sm_90"]["launch"].asObject().erase("dflex_backward_launch");
       },
       {"binaries: sm_90: launch: dflex_backward_launch: missing"}},
      {"missing kernel",
       [](JsonValue &m) { firstModule(m)["kernels"].asArray().pop_back(); },
       {"attention_backward_grad_q"}},
      {"part missing",
       [](JsonValue &m) {
         firstModule(m)["binaries"]["sm_90"]["parts"].asObject().erase("backward");
       },
       {"module 'windowed'", "binaries: sm_90: parts: backward",
        "missing: it holds kernel 'attention_backward_preprocess'"}},
      {"part without kernels",
       [](JsonValue &m) {
         JsonValue &parts = firstModule(m)["binaries"]["sm_90"]["parts"];
         parts["backward_sm90"] = parts["backward"];
       },
       {"binaries: sm_90: parts: backward_sm90", "holds no kernel of this module"}},
      {"no parts",
       [](JsonValue &m) { firstModule(m)["binaries"]["sm_90"].asObject().erase("parts"); },
       {"binaries: sm_90: parts: missing"}},
      {"layout",
       [](JsonValue &m) {
         firstModule(m)["variant"]["captures"].asArray()[1]["offset_bytes"] = 8;
       },
       {"capture 'window'", "layout"}},
      {"no program", [](JsonValue &m) { firstModule(m)["spec"]["mask"] = "other"; },
       {"no mask named 'other'"}},
      {"escape", [](JsonValue &m) { firstModule(m)["source_file"] = "../x.cu"; },
       {"'../x.cu' is not a file name inside the bundle"}},
      {"element", [](JsonValue &m) { firstModule(m)["spec"]["element_type"] = "f32"; },
       {"element_type", "f32"}},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    expectBadManifest(c.edit, {}, c.fragments);
  }
}

TEST(KernelBundle, HopperKernelsArePerArch) {
  TempDir dir;
  writeBundle(dir.path().string(), {}, {{"sm_90a", "sm_120"}, true, true});
  auto bundle = KernelBundle::open(dir.path().string());
  const AttentionKernelSpec &spec = bundle->attention("windowed");
  // Each binary has its own launch constants: the Hopper kernels' only
  // where they are.
  const AttentionLaunches &hopper = spec.launches.at("sm_90a");
  ASSERT_TRUE(hopper.forwardSm90.has_value());
  ASSERT_TRUE(hopper.backwardSm90.has_value());
  EXPECT_EQ(hopper.forwardSm90->threads, 384);
  EXPECT_EQ(hopper.forwardSm90->blockN, 128);
  EXPECT_EQ(hopper.backwardSm90->blockM, 64);
  EXPECT_EQ(hopper.backwardSm90->rowKernelThreads, 256);
  EXPECT_EQ(hopper.backwardSm90->rowKernelRows, 8);
  EXPECT_EQ(hopper.forward.blockM, 32);
  const AttentionLaunches &sm120 = spec.launches.at("sm_120");
  EXPECT_FALSE(sm120.forwardSm90 || sm120.backwardSm90);
  EXPECT_EQ(sm120.forward.blockM, 16);
  EXPECT_EQ(sm120.backward.blockN, 16);
  EXPECT_EQ(std::string(bundle::kernelRole(bundle::KernelRole::AttentionBackwardSm90).requiredTarget),
            "sm_90a");
  EXPECT_EQ(spec.kernel(bundle::KernelRole::AttentionBackwardSm90).loweredNames,
            (std::map<std::string, std::string>{{"sm_90a", "_Zattention_backward_sm90_sm_90a"}}));
  EXPECT_EQ(spec.kernel(bundle::KernelRole::AttentionBackward).loweredNames.size(), 2u);
  for (bundle::KernelRole role :
       {bundle::KernelRole::AttentionForwardSm90, bundle::KernelRole::AttentionBackwardGradQSm90}) {
    const std::string name = bundle::roleName(role);
    EXPECT_TRUE(spec.hasKernel(role, "sm_90a")) << name;
    EXPECT_TRUE(spec.hasKernel(role, "compute_90a")) << name;
    EXPECT_FALSE(spec.hasKernel(role, "sm_90")) << name;
    EXPECT_FALSE(spec.hasKernel(role, "sm_120")) << name;
  }
  EXPECT_TRUE(spec.hasKernel(bundle::KernelRole::AttentionForward, "sm_120"));
}

TEST(KernelBundle, BadHopperManifestsAreNamedAndExplained) {
  auto kernelOf = [](JsonValue &m, const std::string &role) -> JsonValue & {
    for (JsonValue &kernel : firstModule(m)["kernels"].asArray())
      if (kernel["role"].asString() == role)
        return kernel;
    throw std::logic_error("no kernel " + role);
  };
  auto removeKernel = [](JsonValue &m, const std::string &role) {
    auto &kernels = firstModule(m)["kernels"].asArray();
    for (auto it = kernels.begin(); it != kernels.end(); ++it)
      if ((*it)["role"].asString() == role) {
        kernels.erase(it);
        return;
      }
  };
  struct Case {
    const char *what;
    std::function<void(JsonValue &)> edit;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"hopper kernel in another arch's binary",
       [&](JsonValue &m) {
         kernelOf(m, "attention_forward_sm90")["archs"]["sm_120"]["lowered_name"] = "_Zx";
       },
       {"binaries: sm_120", "'attention_forward_sm90' needs sm_90a but has a lowered name for sm_120"}},
      {"hopper kernel missing from sm_90a",
       [&](JsonValue &m) {
         kernelOf(m, "attention_backward_sm90")["archs"] = JsonValue::object();
       },
       {"'attention_backward_sm90' has no lowered name for sm_90a"}},
      {"hopper kernel for every arch",
       [&](JsonValue &m) {
         kernelOf(m, "attention_forward_sm90")["required_target"] = "";
       },
       {"required_target", "'attention_forward_sm90' must require sm_90a"}},
      {"incomplete hopper backward",
       [&](JsonValue &m) { removeKernel(m, "attention_backward_grad_q_sm90"); },
       {"no kernel with role 'attention_backward_grad_q_sm90'"}},
      {"hopper backward without its forward",
       [&](JsonValue &m) { removeKernel(m, "attention_forward_sm90"); },
       {"no kernel with role 'attention_forward_sm90'"}},
      {"hopper launch constants missing",
       [&](JsonValue &m) {
         firstModule(m)["binaries"]["sm_90a"]["launch"].asObject().erase(
             "dflex_backward_sm90_launch");
       },
       {"binaries: sm_90a: launch: dflex_backward_sm90_launch: missing"}},
      {"hopper launch constants in another arch's binary",
       [&](JsonValue &m) {
         JsonValue &binaries = firstModule(m)["binaries"];
         binaries["sm_120"]["launch"]["dflex_forward_sm90_launch"] =
             binaries["sm_90a"]["launch"]["dflex_forward_sm90_launch"];
       },
       {"binaries: sm_120: launch: dflex_forward_sm90_launch",
        "the sm_120 binary has no kernel 'attention_forward_sm90'"}},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    expectBadManifest(c.edit, {{"sm_90a", "sm_120"}, true, true}, c.fragments);
  }
}

TEST(KernelBundle, CacheReopensARewrittenBundle) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto first = KernelBundle::openCached(dir.path().string());
  EXPECT_EQ(first, KernelBundle::openCached(dir.path().string() + "/"));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  writeBundle(dir.path().string(), [](JsonValue &m) { firstModule(m)["spec"]["scale"] = 0.5; });
  auto second = KernelBundle::openCached(dir.path().string());
  EXPECT_NE(first, second);
  EXPECT_FLOAT_EQ(second->attention("windowed").scale, 0.5f);
  // The other spelling sees the rewrite too, and shares the reopened bundle.
  EXPECT_EQ(second, KernelBundle::openCached(dir.path().string() + "/"));
  EXPECT_EQ(second, KernelBundle::openCached(dir.path().string() + "/."));
}

// --- Captures and tile lists ------------------------------------------------

struct Problem {
  int64_t batch, queryLength, keyLength;
  torch::Tensor docs;
  int64_t window;
  std::vector<torch::Tensor> captures(bool withBias) const {
    std::vector<torch::Tensor> list{docs, torch::tensor(window)};
    if (withBias)
      list.push_back(torch::tensor({0.5f, -1.0f, 0.25f, 2.0f}));
    return list;
  }
};

/// Documents of random lengths. With more than one batch, the last 5
/// positions have no document id (reads give the padding), so those queries
/// see nothing.
Problem makeProblem(int64_t batch, int64_t length, int64_t window, uint64_t seed) {
  torch::manual_seed(seed);
  Problem p{batch, length, length, torch::empty({batch, length}, torch::kInt), window};
  for (int64_t b = 0; b < batch; ++b) {
    int doc = 0;
    for (int64_t t = 0; t < length; ++t) {
      if (torch::rand({}).item<double>() < 0.08)
        ++doc;
      p.docs[b][t] = doc;
    }
  }
  if (batch > 1)
    p.docs = p.docs.narrow(1, 0, length - 5).contiguous();
  return p;
}

TEST(AttentionCaptures, MismatchesAreExplained) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = KernelBundle::open(dir.path().string());
  const AttentionKernelSpec &spec = bundle->attention("windowed_softcap");
  torch::Tensor q = torch::randn({1, 5, kQHeads, kHeadDim});
  torch::Tensor k = torch::randn({1, 5, kKvHeads, kHeadDim});
  torch::Tensor docs = torch::zeros({1, 5}, torch::kInt);
  torch::Tensor bias = torch::zeros({kQHeads});
  auto run = [&](std::vector<torch::Tensor> captures) {
    attentionForward(*bundle, spec, q, k, k, captures);
  };
  expectError<FormatError>([&] { run({docs, torch::tensor(3)}); },
                           {"takes 3 captures (docs, window, bias), got 2"});
  expectError<FormatError>([&] { run({docs.to(torch::kLong), torch::tensor(3), bias}); },
                           {"capture 0 'docs'", "rank-2 Int tensor", "Long"});
  expectError<FormatError>([&] { run({docs[0], torch::tensor(3), bias}); },
                           {"capture 0 'docs'", "rank-2"});
  expectError<FormatError>([&] { run({docs, torch::tensor(2.5), bias}); },
                           {"capture 1 'window'", "integer tensor"});
  expectError<FormatError>([&] { run({docs, torch::tensor({1, 2}), bias}); },
                           {"capture 1 'window'", "0-dim"});
  expectError<FormatError>([&] { run({docs, torch::tensor(3), torch::Tensor()}); },
                           {"capture 2 'bias'", "missing"});
  expectError<FormatError>(
      [&] { attentionForward(*bundle, spec, q, torch::randn({1, 5, 3, kHeadDim}),
                             torch::randn({1, 5, 3, kHeadDim}), {docs, torch::tensor(3), bias}); },
      {"windowed_softcap", "2 key/value heads", "got 4 and 3"});
}

/// Checks a tile list against the mask evaluated at every pair: a listed
/// full tile is visible everywhere, an unlisted tile nowhere; tiles of
/// `launch`'s sizes.
void checkTileList(const AttentionLaunch &launch, const analysis::TileList &list,
                   const torch::Tensor &mask, bool forward) {
  const int64_t batch = mask.size(0), heads = mask.size(1);
  const int64_t queryLength = mask.size(2), keyLength = mask.size(3);
  const int64_t queryTile = launch.blockM, keyTile = launch.blockN;
  ASSERT_EQ(list.queryTile, queryTile);
  ASSERT_EQ(list.keyTile, keyTile);
  const int64_t queryTiles = (queryLength + queryTile - 1) / queryTile;
  const int64_t keyTiles = (keyLength + keyTile - 1) / keyTile;
  ASSERT_EQ(list.rowTiles, forward ? queryTiles : keyTiles);
  ASSERT_TRUE(list.batches == 1 || list.batches == batch);
  ASSERT_TRUE(list.heads == 1 || list.heads == heads);
  auto accessor = mask.accessor<bool, 4>();
  int64_t listedFull = 0, listedPartial = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t row = 0; row < list.rowTiles; ++row) {
        const int64_t index =
            ((list.batches == 1 ? 0 : b) * list.heads + (list.heads == 1 ? 0 : h)) * list.rowTiles +
            row;
        std::vector<int> state(forward ? keyTiles : queryTiles, 0); // 0 absent, 1 full, 2 partial
        for (int32_t e = list.rowOffsets[index]; e < list.rowOffsets[index + 1]; ++e) {
          ASSERT_EQ(state.at(list.entries[e] >> 1), 0) << "a tile listed twice";
          state[list.entries[e] >> 1] = (list.entries[e] & 1) ? 2 : 1;
          ((list.entries[e] & 1) ? listedPartial : listedFull) += 1;
        }
        for (int64_t column = 0; column < static_cast<int64_t>(state.size()); ++column) {
          const int64_t qTile = forward ? row : column, kTile = forward ? column : row;
          bool anyVisible = false, anyHidden = false;
          for (int64_t q = qTile * queryTile; q < std::min(queryLength, (qTile + 1) * queryTile); ++q)
            for (int64_t kv = kTile * keyTile; kv < std::min(keyLength, (kTile + 1) * keyTile); ++kv)
              (accessor[b][h][q][kv] ? anyVisible : anyHidden) = true;
          if (anyVisible)
            EXPECT_NE(state[column], 0) << "b " << b << " h " << h << " tile " << qTile << "," << kTile;
          if (state[column] == 1)
            EXPECT_FALSE(anyHidden) << "full tile with a hidden pair at b " << b << " tile " << qTile
                                    << "," << kTile;
        }
      }
  EXPECT_GT(listedFull + listedPartial, 0);
}

TEST(AttentionTileList, CoversTheMaskExactlyAtTheTilesOfEitherKernelsAndArch) {
  using Choice = AttentionKernelChoice;
  TempDir dir;
  writeBundle(dir.path().string(), {}, {{"sm_90a", "sm_120"}, true, true});
  auto bundle = KernelBundle::open(dir.path().string());
  const AttentionKernelSpec &spec = bundle->attention("windowed");
  // The Hopper tiles, sm_90a's portable tiles and sm_120's own.
  for (auto [computeCapability, choice] : {std::pair<int, Choice>{90, Choice::Portable},
                                           {90, Choice::Sm90}, {120, Choice::Auto}}) {
    const AttentionKernelPlan plan = planAttentionKernels(*bundle, spec, computeCapability, choice);
    ASSERT_EQ(plan.forward.sm90, choice == Choice::Sm90);
    for (auto [length, window] : {std::pair<int64_t, int64_t>{77, 20}, {130, 1000}, {45, 1},
                                  {300, 150}, {520, 40}}) {
      SCOPED_TRACE(plan.arch + " sm90 " + std::to_string(plan.forward.sm90) + " length " +
                   std::to_string(length) + " window " + std::to_string(window));
      Problem p = makeProblem(2, length, window, 7 + length);
      const std::vector<torch::Tensor> captures = p.captures(false);
      torch::Tensor mask = attentionMask(spec, captures, p.batch, p.queryLength, p.keyLength);
      const analysis::AttentionTileLists lists =
          attentionTileLists(spec, plan, captures, p.batch, p.queryLength, p.keyLength);
      ASSERT_TRUE(lists.ok()) << lists.error;
      checkTileList(plan.forward.launch, lists.forward, mask, true);
      checkTileList(plan.backward.launch, lists.backward, mask, false);
    }
  }
}

TEST(AttentionTileList, RepeatedCapturesReuseTheListsAndChangedOnesDoNot) {
  TempDir dir;
  writeBundle(dir.path().string(), {}, {{"sm_90a", "sm_120"}, true, true});
  auto bundle = KernelBundle::open(dir.path().string());
  const AttentionKernelSpec &spec = bundle->attention("windowed");
  const AttentionKernelPlan plan = planAttentionKernels(*bundle, spec, 90, AttentionKernelChoice::Sm90);
  Problem p = makeProblem(2, 300, 40, 11);
  auto lists = [&](const std::vector<torch::Tensor> &captures) {
    analysis::AttentionTileLists built =
        attentionTileLists(spec, plan, captures, p.batch, p.queryLength, p.keyLength);
    EXPECT_TRUE(built.ok()) << built.error;
    return built;
  };
  auto expectCovers = [&](const analysis::AttentionTileLists &built, const std::vector<torch::Tensor> &captures) {
    torch::Tensor mask = attentionMask(spec, captures, p.batch, p.queryLength, p.keyLength);
    checkTileList(plan.forward.launch, built.forward, mask, true);
    checkTileList(plan.backward.launch, built.backward, mask, false);
  };
  const int64_t hits = spec.tileLists->hits();
  const analysis::AttentionTileLists first = lists(p.captures(false));
  EXPECT_EQ(spec.tileLists->hits(), hits);
  // The same values in other tensors (another layer of the same step).
  const analysis::AttentionTileLists again = lists({p.docs.clone(), torch::tensor(p.window)});
  EXPECT_EQ(spec.tileLists->hits(), hits + 2);
  EXPECT_EQ(again.forward.entries, first.forward.entries);
  EXPECT_EQ(again.backward.entries, first.backward.entries);
  EXPECT_EQ(again.forward.rowOffsets, first.forward.rowOffsets);
  // The ids changed in place (each token its own document from 100 on),
  // then another window: new lists, each exact for its captures.
  p.docs[1].narrow(0, 100, p.docs.size(1) - 100).copy_(torch::arange(100, p.docs.size(1), torch::kInt) + 1000);
  const analysis::AttentionTileLists changed = lists(p.captures(false));
  EXPECT_EQ(spec.tileLists->hits(), hits + 2);
  EXPECT_NE(changed.forward.entries, first.forward.entries);
  expectCovers(changed, p.captures(false));
  p.window = 7;
  const analysis::AttentionTileLists narrower = lists(p.captures(false));
  EXPECT_EQ(spec.tileLists->hits(), hits + 2);
  expectCovers(narrower, p.captures(false));
}

// --- Kernel choice --------------------------------------------------------------

TEST(AttentionKernelChoice, ReadsTheEnvironment) {
  struct Restore {
    ~Restore() { unsetenv("DFLEX_ATTENTION_KERNELS"); }
  } restore;
  unsetenv("DFLEX_ATTENTION_KERNELS");
  EXPECT_EQ(attentionKernelChoice(), AttentionKernelChoice::Auto);
  const std::vector<std::pair<const char *, AttentionKernelChoice>> values = {
      {"", AttentionKernelChoice::Auto},
      {"auto", AttentionKernelChoice::Auto},
      {"portable", AttentionKernelChoice::Portable},
      {"sm90", AttentionKernelChoice::Sm90}};
  for (const auto &[value, choice] : values) {
    ASSERT_EQ(setenv("DFLEX_ATTENTION_KERNELS", value, 1), 0);
    EXPECT_EQ(attentionKernelChoice(), choice) << value;
  }
  ASSERT_EQ(setenv("DFLEX_ATTENTION_KERNELS", "Hopper", 1), 0);
  expectError<FormatError>([] { attentionKernelChoice(); },
                           {"DFLEX_ATTENTION_KERNELS='Hopper'", "auto, portable or sm90"});
}

/// planAttentionKernels for `spec` on `computeCapability` with `choice`,
/// checked against the expected binary, the kernels of each pass and the
/// launch constants of that binary, which the manifest has for `arch`.
void expectPlan(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                int computeCapability, AttentionKernelChoice choice, const std::string &arch,
                bool compiled, bool sm90Forward, bool sm90Backward) {
  const AttentionKernelPlan plan = planAttentionKernels(bundle, spec, computeCapability, choice);
  EXPECT_EQ(plan.arch, arch);
  EXPECT_EQ(plan.compiled, compiled);
  EXPECT_EQ(plan.forward.sm90, sm90Forward);
  EXPECT_EQ(plan.backward.sm90, sm90Backward);
  // The constants of the kernels that run (their tiles make the tile lists).
  const AttentionLaunches &launches = spec.launches.at(arch);
  EXPECT_EQ(plan.forward.launch, sm90Forward ? *launches.forwardSm90 : launches.forward);
  EXPECT_EQ(plan.backward.launch, sm90Backward ? *launches.backwardSm90 : launches.backward);
}

/// planAttentionKernels for an arch the manifest has no constants for: it
/// compiles the source for `arch` to read them, which the test bundles'
/// stand-in source fails.
void expectCompiledFor(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                       int computeCapability, const std::string &arch) {
  expectError<FormatError>(
      [&] { planAttentionKernels(bundle, spec, computeCapability, AttentionKernelChoice::Auto); },
      {"spec 'windowed' has no binary for " + arch, "compiling its source windowed.cu failed"});
}

TEST(AttentionKernelPlan, HopperKernelsOnSm90DevicesFromSm90aBinaries) {
  using Choice = AttentionKernelChoice;
  TempDir dir;
  writeBundle(dir.path().string(), {}, {{"sm_90a", "sm_120"}, true, true});
  auto bundle = KernelBundle::open(dir.path().string());
  AttentionKernelSpec spec = bundle->attention("windowed");
  {
    SCOPED_TRACE("sm_90 device");
    expectPlan(*bundle, spec, 90, Choice::Auto, "sm_90a", false, true, true);
    expectPlan(*bundle, spec, 90, Choice::Sm90, "sm_90a", false, true, true);
    expectPlan(*bundle, spec, 90, Choice::Portable, "sm_90a", false, false, false);
    const AttentionKernelPlan plan = planAttentionKernels(*bundle, spec, 90, Choice::Auto);
    EXPECT_EQ(plan.forward.launch.blockM, 128);
    EXPECT_EQ(plan.forward.launch.blockN, 128);
    EXPECT_EQ(plan.backward.launch.blockM, 64);
    EXPECT_EQ(plan.backward.launch.blockN, 128);
    EXPECT_EQ(planAttentionKernels(*bundle, spec, 90, Choice::Portable).forward.launch.blockM, 32);
  }
  {
    SCOPED_TRACE("sm_120 device: its own binary's constants");
    expectPlan(*bundle, spec, 120, Choice::Auto, "sm_120", false, false, false);
    const AttentionKernelPlan plan = planAttentionKernels(*bundle, spec, 120, Choice::Auto);
    EXPECT_EQ(plan.forward.launch.blockM, 16);
    EXPECT_EQ(plan.forward.launch.sharedBytes, 2048);
    EXPECT_EQ(plan.backward.launch.blockN, 16);
    expectError<FormatError>([&] { planAttentionKernels(*bundle, spec, 120, Choice::Sm90); },
                             {"DFLEX_ATTENTION_KERNELS=sm90", "'windowed'",
                              "sm_90 devices", "this one is sm_120"});
  }
  {
    SCOPED_TRACE("a device the bundle has no binary for");
    expectCompiledFor(*bundle, spec, 80, "sm_80");
  }
  {
    SCOPED_TRACE("sm_90a cubin missing: compiled for sm_90a at run time");
    AttentionKernelSpec withoutBinary = spec;
    withoutBinary.binaries.erase("sm_90a");
    // The manifest's constants for sm_90a, where it still has them ...
    expectPlan(*bundle, withoutBinary, 90, Choice::Auto, "sm_90a", true, true, true);
    expectPlan(*bundle, withoutBinary, 90, Choice::Portable, "sm_90a", true, false, false);
    // ... else the compile's.
    withoutBinary.launches.erase("sm_90a");
    expectCompiledFor(*bundle, withoutBinary, 90, "sm_90a");
  }
}

TEST(AttentionKernelPlan, PortableKernelsWhereNoHopperOnesAre) {
  using Choice = AttentionKernelChoice;
  {
    SCOPED_TRACE("bundle without sm_90a");
    TempDir dir;
    writeBundle(dir.path().string(), {}, {{"sm_90", "sm_120"}, false, false});
    auto bundle = KernelBundle::open(dir.path().string());
    AttentionKernelSpec spec = bundle->attention("windowed");
    expectPlan(*bundle, spec, 90, Choice::Auto, "sm_90", false, false, false);
    expectError<FormatError>([&] { planAttentionKernels(*bundle, spec, 90, Choice::Sm90); },
                             {"has no sm_90a kernels here", "head_dim 8 has none"});
    spec.qkHeadDim = spec.vHeadDim = 128;
    expectError<FormatError>([&] { planAttentionKernels(*bundle, spec, 90, Choice::Sm90); },
                             {"compiled without them", "--arch sm_90a"});
    spec.binaries.clear();
    expectPlan(*bundle, spec, 90, Choice::Auto, "sm_90", true, false, false);
  }
  {
    SCOPED_TRACE("a Hopper forward only (head_dim 64)");
    TempDir dir;
    writeBundle(dir.path().string(), {}, {{"sm_90a"}, true, false});
    auto bundle = KernelBundle::open(dir.path().string());
    const AttentionKernelSpec &spec = bundle->attention("windowed");
    expectPlan(*bundle, spec, 90, Choice::Auto, "sm_90a", false, true, false);
    expectPlan(*bundle, spec, 90, Choice::Sm90, "sm_90a", false, true, false);
  }
  {
    SCOPED_TRACE("sm_90 and sm_90a binaries");
    TempDir dir;
    writeBundle(dir.path().string(), {}, {{"sm_90", "sm_90a"}, true, true});
    auto bundle = KernelBundle::open(dir.path().string());
    AttentionKernelSpec spec = bundle->attention("windowed");
    expectPlan(*bundle, spec, 90, Choice::Auto, "sm_90a", false, true, true);
    spec.qkHeadDim = spec.vHeadDim = 128;
    spec.binaries.erase("sm_90a");
    expectPlan(*bundle, spec, 90, Choice::Auto, "sm_90", false, false, false);
    expectError<FormatError>([&] { planAttentionKernels(*bundle, spec, 90, Choice::Sm90); },
                             {"the bundle's sm_90 binary does not have them"});
  }
  {
    SCOPED_TRACE("compute_90a: PTX only, compiled at run time for sm_90a");
    TempDir dir;
    writeBundle(dir.path().string(), {}, {{"compute_90a"}, true, true});
    auto bundle = KernelBundle::open(dir.path().string());
    const AttentionKernelSpec &spec = bundle->attention("windowed");
    EXPECT_TRUE(spec.launches.at("compute_90a").backwardSm90.has_value());
    expectCompiledFor(*bundle, spec, 90, "sm_90a");
  }
}

// --- CPU reference ------------------------------------------------------------

/// Dense float64 attention with autograd, from the evaluator's mask and the
/// score_mod written out in torch.
torch::Tensor denseAttention(const torch::Tensor &q, const torch::Tensor &k,
                             const torch::Tensor &v, const torch::Tensor &mask,
                             const std::optional<torch::Tensor> &bias, torch::Tensor *lse) {
  const int64_t group = q.size(2) / k.size(2);
  torch::Tensor kk = k.repeat_interleave(group, 2), vv = v.repeat_interleave(group, 2);
  torch::Tensor s = torch::einsum("bqhd,bkhd->bhqk", {q, kk}) * static_cast<double>(kScale);
  if (bias)
    s = 2 * torch::tanh(s / 2) + bias->to(torch::kDouble).view({1, -1, 1, 1});
  s = s.masked_fill(~mask, -INFINITY);
  torch::Tensor l = torch::logsumexp(s, -1);
  torch::Tensor safe = torch::where(torch::isinf(l), torch::zeros_like(l), l);
  *lse = l;
  return torch::einsum("bhqk,bkhd->bqhd", {torch::exp(s - safe.unsqueeze(-1)), vv});
}

void compareReference(const std::string &specName, bool withBias) {
  TempDir dir;
  writeBundle(dir.path().string());
  const std::string bundleDir = dir.path().string();
  auto bundle = KernelBundle::open(bundleDir);
  const AttentionKernelSpec &spec = bundle->attention(specName);
  Problem p = makeProblem(2, 53, 17, 3);
  const auto options = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor q = torch::randn({2, 53, kQHeads, kHeadDim}, options).requires_grad_();
  torch::Tensor k = torch::randn({2, 53, kKvHeads, kHeadDim}, options).requires_grad_();
  torch::Tensor v = torch::randn({2, 53, kKvHeads, kHeadDim}, options).requires_grad_();
  const std::vector<torch::Tensor> captures = p.captures(withBias);

  AttentionOutputs outputs = attention(bundle, spec, q, k, v, captures);
  torch::Tensor mask = attentionMask(spec, captures, 2, 53, 53);
  torch::Tensor lse;
  std::optional<torch::Tensor> bias;
  if (withBias)
    bias = captures[2];
  torch::Tensor dense = denseAttention(q, k, v, mask, bias, &lse);

  // Queries of batch 1 past the document ids see nothing.
  EXPECT_TRUE(torch::all(torch::isinf(outputs.logSumExp[1].narrow(1, 48, 5))).item<bool>());
  EXPECT_TRUE(torch::equal(outputs.out[1].narrow(0, 48, 5), torch::zeros({5, kQHeads, kHeadDim}, options)));
  EXPECT_TRUE(torch::equal(torch::isinf(outputs.logSumExp), torch::isinf(lse)));
  // The score_mod runs in f32, as on the GPU.
  const double tolerance = withBias ? 1e-5 : 1e-12;
  EXPECT_LT((outputs.out - dense).abs().max().item<double>(), tolerance);
  torch::Tensor finite = torch::isfinite(lse);
  EXPECT_LT((outputs.logSumExp - lse).masked_select(finite).abs().max().item<double>(), tolerance);

  torch::Tensor gradOut = torch::randn_like(dense);
  auto mine = torch::autograd::grad({outputs.out}, {q, k, v}, {gradOut});
  auto expected = torch::autograd::grad({dense}, {q, k, v}, {gradOut});
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::all(torch::isfinite(mine[i])).item<bool>());
    EXPECT_LT((mine[i] - expected[i]).abs().max().item<double>(), 10 * tolerance) << "input " << i;
  }
  EXPECT_TRUE(torch::equal(mine[0][1].narrow(0, 48, 5), torch::zeros({5, kQHeads, kHeadDim}, options)));
}

TEST(AttentionReference, MatchesDenseAttention) { compareReference("windowed", false); }
TEST(AttentionReference, MatchesDenseAttentionWithScoreMod) {
  compareReference("windowed_softcap", true);
}

TEST(AttentionReference, BackwardOpMatchesAutograd) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = KernelBundle::open(dir.path().string());
  const AttentionKernelSpec &spec = bundle->attention("windowed");
  Problem p = makeProblem(1, 40, 9, 11);
  const auto options = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor q = torch::randn({1, 40, kQHeads, kHeadDim}, options).requires_grad_();
  torch::Tensor k = torch::randn({1, 40, kKvHeads, kHeadDim}, options).requires_grad_();
  torch::Tensor v = torch::randn({1, 40, kKvHeads, kHeadDim}, options).requires_grad_();
  AttentionOutputs outputs = attention(bundle, bundle->attention("windowed"), q, k, v, p.captures(false));
  torch::Tensor gradOut = torch::randn_like(outputs.out);
  auto viaAutograd = torch::autograd::grad({outputs.out}, {q, k, v}, {gradOut});
  AttentionGrads direct = attentionBackward(*bundle, spec, q.detach(), k.detach(), v.detach(),
                                            outputs.out.detach(), outputs.logSumExp, gradOut,
                                            p.captures(false));
  EXPECT_TRUE(torch::equal(direct.q, viaAutograd[0]));
  EXPECT_TRUE(torch::equal(direct.k, viaAutograd[1]));
  EXPECT_TRUE(torch::equal(direct.v, viaAutograd[2]));
}

TEST(AttentionReference, LowPrecisionAndStridedInputs) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = KernelBundle::open(dir.path().string());
  const AttentionKernelSpec &spec = bundle->attention("windowed");
  Problem p = makeProblem(1, 30, 30, 5);
  // [B, H, T, D] storage viewed as [B, T, H, D].
  torch::Tensor q = torch::randn({1, kQHeads, 30, kHeadDim}).to(torch::kBFloat16).transpose(1, 2);
  torch::Tensor k = torch::randn({1, kKvHeads, 30, kHeadDim}).to(torch::kBFloat16).transpose(1, 2);
  AttentionOutputs low = attentionForward(*bundle, spec, q, k, k, p.captures(false));
  EXPECT_EQ(low.out.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(low.logSumExp.scalar_type(), torch::kFloat);
  AttentionOutputs high = attentionForward(*bundle, spec, q.to(torch::kDouble), k.to(torch::kDouble),
                                           k.to(torch::kDouble), p.captures(false));
  EXPECT_TRUE(torch::equal(low.out, high.out.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::allclose(low.logSumExp.to(torch::kDouble), high.logSumExp, 1e-6, 1e-6));
}

TEST(AttentionReference, EmptyLengths) {
  TempDir dir;
  writeBundle(dir.path().string());
  auto bundle = KernelBundle::open(dir.path().string());
  const AttentionKernelSpec &spec = bundle->attention("windowed");
  torch::Tensor q = torch::randn({1, 4, kQHeads, kHeadDim});
  torch::Tensor noKeys = torch::randn({1, 0, kKvHeads, kHeadDim});
  AttentionOutputs outputs = attentionForward(*bundle, spec, q, noKeys, noKeys,
                                              {torch::zeros({1, 4}, torch::kInt), torch::tensor(3)});
  EXPECT_TRUE(torch::equal(outputs.out, torch::zeros_like(q)));
  EXPECT_TRUE(torch::all(torch::isinf(outputs.logSumExp)).item<bool>());
}

} // namespace
