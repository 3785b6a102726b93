// Compiles the attention templates through NVRTC the way generated code will
// use them (a variant functor + explicit instantiations by name expression):
// the portable kernels for sm_90 and sm_120, the Hopper kernels for sm_90a
// (there with ptxas's report, failing on spills or serialised wgmma), and
// reports the cubin sizes. Needs no GPU.
//   nvrtc_check <repo>/kernels
#include <nvrtc.h>

#include <cstdio>
#include <cstdlib>
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

bool check(nvrtcResult result, const char* what) {
  if (result == NVRTC_SUCCESS) return true;
  std::fprintf(stderr, "%s: %s\n", what, nvrtcGetErrorString(result));
  return false;
}

// Compiles `names` (kernel name expressions) from the header `include` plus
// the variant for `arch`. With `report`, ptxas's resource report is printed
// and a spill or a serialised wgmma pipeline fails the compile.
bool compile(const std::string& kernels_dir, const char* arch, const std::string& label, const char* include,
             const std::vector<std::string>& names, bool report) {
  const std::string source = std::string("#include \"") + include + "\"\n" + kVariantSource;
  nvrtcProgram program;
  if (!check(nvrtcCreateProgram(&program, source.c_str(), "generated.cu", 0, nullptr, nullptr),
             "nvrtcCreateProgram")) {
    return false;
  }
  for (const auto& name : names) {
    if (!check(nvrtcAddNameExpression(program, name.c_str()), "nvrtcAddNameExpression")) return false;
  }
  const std::string include_path = "--include-path=" + kernels_dir;
  const std::string arch_option = std::string("--gpu-architecture=") + arch;
  const char* cuda_home = std::getenv("CUDA_HOME");
  const std::string cuda_include = std::string("--include-path=") + (cuda_home ? cuda_home : "/usr/local/cuda") + "/include";
  std::vector<const char*> options = {include_path.c_str(), cuda_include.c_str(), arch_option.c_str(), "--std=c++17"};
  if (report) options.push_back("--ptxas-options=-v");
  const nvrtcResult compiled = nvrtcCompileProgram(program, static_cast<int>(options.size()), options.data());
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  std::string log;
  if (log_size > 1) {
    log.assign(log_size, '\0');
    nvrtcGetProgramLog(program, &log[0]);
  }
  bool ok = check(compiled, "nvrtcCompileProgram");
  if (report) {
    std::printf("%s", log.c_str());
    // ptxas: "N bytes spill stores" with N > 0, or C7510-C7519 (wgmma serialised / fences injected).
    for (size_t at = log.find("bytes spill stores"); at != std::string::npos; at = log.find("bytes spill stores", at + 1)) {
      const size_t start = log.rfind(',', at);
      if (start != std::string::npos && std::atoi(log.c_str() + start + 1) != 0) {
        std::fprintf(stderr, "%s %s: register spills\n", arch, label.c_str());
        ok = false;
      }
    }
    if (log.find("(C751") != std::string::npos) {
      std::fprintf(stderr, "%s %s: ptxas serialised or fenced wgmma (see C751x above)\n", arch, label.c_str());
      ok = false;
    }
  } else if (!log.empty()) {
    std::fprintf(stderr, "%s", log.c_str());
  }
  size_t cubin_size = 0;
  if (ok) ok = check(nvrtcGetCUBINSize(program, &cubin_size), "nvrtcGetCUBINSize") && cubin_size > 0;
  if (ok) {
    std::printf("%s %s: cubin %zu bytes\n", arch, label.c_str(), cubin_size);
    for (const auto& name : names) {
      const char* lowered = nullptr;
      if (!check(nvrtcGetLoweredName(program, name.c_str(), &lowered), "nvrtcGetLoweredName")) ok = false;
    }
  }
  nvrtcDestroyProgram(&program);
  return ok;
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

// The Hopper kernels of one head dim (the backward only where it exists).
bool compile_sm90(const std::string& kernels_dir, int head_dim, bool with_backward) {
  const std::string config = "dflex::kernels::Sm90AttentionConfigs<__nv_bfloat16, " + std::to_string(head_dim) + ">";
  std::vector<std::string> names = {"dflex::kernels::attention_forward_sm90_kernel<" + config +
                                    "::Forward, GeneratedVariant>"};
  if (with_backward) {
    names.push_back("dflex::kernels::attention_backward_sm90_kernel<" + config + "::Backward, GeneratedVariant>");
    names.push_back("dflex::kernels::attention_backward_preprocess_kernel<" + config + "::Backward>");
    names.push_back("dflex::kernels::attention_backward_grad_q_sm90_kernel<" + config + "::Backward>");
  }
  return compile(kernels_dir, "sm_90a", "sm90 kernels, head_dim " + std::to_string(head_dim),
                 "attention/sm90/attention_sm90.cuh", names, true);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <repo>/kernels\n", argv[0]);
    return 2;
  }
  bool ok = true;
  for (const char* arch : {"sm_90", "sm_120"}) {
    for (int head_dim : {64, 128, 256}) ok = compile_portable(argv[1], arch, head_dim) && ok;
  }
  ok = compile_sm90(argv[1], 64, false) && ok;
  ok = compile_sm90(argv[1], 128, true) && ok;
  std::printf(ok ? "NVRTC: all configs compiled\n" : "NVRTC: FAILED\n");
  return ok ? 0 : 1;
}
