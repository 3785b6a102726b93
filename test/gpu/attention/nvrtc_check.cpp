// Compiles the attention templates through NVRTC the way generated code will
// use them (a variant functor + explicit instantiations by name expression):
// the portable kernels for sm_90 and sm_120, the Hopper kernels for sm_90a
// (there with ptxas's report, failing on spills or serialised wgmma), and
// reports the cubin sizes. Needs no GPU.
//   nvrtc_check <repo>/kernels
#include "../common/nvrtc_check.h"

#include <string>
#include <vector>

namespace {

// Appended to the include of the kernels under test.
const char* kVariantSource = R"(
struct GeneratedVariant {
  static constexpr bool kHasScoreMod = true;
  const int* anchors;
  int blocks;
  int context_len;
  float cap;
  __device__ bool mask(long long b, long long, long long q, long long kv) const {
    const long long block = q / 16;
    const int anchor = anchors[b * blocks + block];
    if (anchor < 0) return false;
    if (kv < context_len) return kv < anchor;
    return (kv - context_len) / 16 == block;
  }
  __device__ float score_mod(float s, long long, long long, long long, long long) const { return cap * tanhf(s / cap); }
  __device__ float score_mod_grad(float s, long long, long long, long long, long long) const {
    const float t = tanhf(s / cap);
    return 1.f - t * t;
  }
};
)";

// `names` from the header `include` plus the variant for `arch`.
bool compile(const std::string& kernels_dir, const char* arch, const std::string& label, const char* include,
             const std::vector<std::string>& names, bool report, int spill_budget = 0) {
  const std::string source = std::string("#include \"") + include + "\"\n" + kVariantSource;
  return nvrtc_check::compile(kernels_dir, arch, label, source, names, report, spill_budget);
}

// The portable kernels with the default configs of `arch` (sm_90 or sm_120).
bool compile_portable(const std::string& kernels_dir, const char* arch, int head_dim) {
  const std::string config = "dflex::kernels::DefaultAttentionConfigs<__nv_bfloat16, " + std::to_string(head_dim) +
                             ", " + (std::string(arch) == "sm_120" ? "120" : "90") + ">";
  const std::vector<std::string> names = {
      "dflex::kernels::attention_forward_kernel<" + config + "::Forward, GeneratedVariant>",
      "dflex::kernels::attention_backward_kernel<" + config + "::Backward, GeneratedVariant>",
      "dflex::kernels::attention_backward_preprocess_kernel<" + config + "::Backward>",
      "dflex::kernels::attention_backward_grad_q_kernel<" + config + "::Backward>",
  };
  return compile(kernels_dir, arch, "head_dim " + std::to_string(head_dim), "attention/attention.cuh", names, false);
}

// The Hopper kernels of one head dim: the forward, and the backward where it exists.
bool compile_sm90(const std::string& kernels_dir, int head_dim, bool backward) {
  const std::string config = "dflex::kernels::Sm90AttentionConfigs<__nv_bfloat16, " + std::to_string(head_dim) + ">";
  std::vector<std::string> names = {
      "dflex::kernels::attention_forward_sm90_kernel<" + config + "::Forward, GeneratedVariant>"};
  if (backward) {
    names.push_back("dflex::kernels::attention_backward_sm90_kernel<" + config + "::Backward, GeneratedVariant>");
    names.push_back("dflex::kernels::attention_backward_preprocess_kernel<" + config + "::Backward>");
    names.push_back("dflex::kernels::attention_backward_grad_q_sm90_kernel<" + config + "::Backward>");
  }
  // The spills this variant's tanh and mask cost them (docs/kernels.md), as a
  // ceiling: more fails the check.
  const int spill_budget = head_dim == 64 ? 32 : head_dim == 128 ? 8 : 28;
  return compile(kernels_dir, "sm_90a", "sm90 kernels, head_dim " + std::to_string(head_dim),
                 "attention/sm90/attention_sm90.cuh", names, true, spill_budget);
}

}  // namespace

int main(int argc, char** argv) {
  return nvrtc_check::run(argc, argv, [](const std::string& kernels_dir) {
    bool ok = true;
    for (const char* arch : {"sm_90", "sm_120"}) {
      for (int head_dim : {64, 128, 256}) ok = compile_portable(kernels_dir, arch, head_dim) && ok;
    }
    for (int head_dim : {64, 128}) ok = compile_sm90(kernels_dir, head_dim, /*backward=*/true) && ok;
    ok = compile_sm90(kernels_dir, 256, /*backward=*/false) && ok;
    return ok;
  });
}
