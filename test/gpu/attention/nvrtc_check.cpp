// Compiles the attention templates through NVRTC the way generated code will
// use them (a variant functor + explicit instantiations by name expression),
// for sm_90 and sm_120, and reports the cubin sizes. Needs no GPU.
//   nvrtc_check <repo>/kernels
#include <nvrtc.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

const char* kSource = R"(
#include "attention/attention.cuh"
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

bool compile(const std::string& kernels_dir, const char* arch, int head_dim) {
  nvrtcProgram program;
  if (!check(nvrtcCreateProgram(&program, kSource, "generated.cu", 0, nullptr, nullptr), "nvrtcCreateProgram")) {
    return false;
  }
  const std::string config = "dflex::kernels::DefaultAttentionConfigs<__nv_bfloat16, " + std::to_string(head_dim) +
                             ", " + (std::string(arch) == "sm_120" ? "120" : "90") + ">";
  const std::vector<std::string> names = {
      "dflex::kernels::attention_forward_kernel<" + config + "::Forward, GeneratedVariant>",
      "dflex::kernels::attention_backward_kernel<" + config + "::Backward, GeneratedVariant>",
      "dflex::kernels::attention_backward_preprocess_kernel<" + config + "::Backward>",
      "dflex::kernels::attention_backward_grad_q_kernel<" + config + "::Backward>",
  };
  for (const auto& name : names) {
    if (!check(nvrtcAddNameExpression(program, name.c_str()), "nvrtcAddNameExpression")) return false;
  }
  const std::string include = "--include-path=" + kernels_dir;
  const std::string arch_option = std::string("--gpu-architecture=") + arch;
  const char* cuda_home = std::getenv("CUDA_HOME");
  const std::string cuda_include = std::string("--include-path=") + (cuda_home ? cuda_home : "/usr/local/cuda") + "/include";
  const char* options[] = {include.c_str(), cuda_include.c_str(), arch_option.c_str(),
                           "--std=c++17"};
  const nvrtcResult compiled = nvrtcCompileProgram(program, 4, options);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  if (log_size > 1) {
    std::string log(log_size, '\0');
    nvrtcGetProgramLog(program, &log[0]);
    std::fprintf(stderr, "%s", log.c_str());
  }
  bool ok = check(compiled, "nvrtcCompileProgram");
  size_t cubin_size = 0;
  if (ok) ok = check(nvrtcGetCUBINSize(program, &cubin_size), "nvrtcGetCUBINSize") && cubin_size > 0;
  if (ok) {
    std::printf("%s head_dim %d: cubin %zu bytes\n", arch, head_dim, cubin_size);
    for (const auto& name : names) {
      const char* lowered = nullptr;
      if (!check(nvrtcGetLoweredName(program, name.c_str(), &lowered), "nvrtcGetLoweredName")) ok = false;
    }
  }
  nvrtcDestroyProgram(&program);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <repo>/kernels\n", argv[0]);
    return 2;
  }
  bool ok = true;
  for (const char* arch : {"sm_90", "sm_120"}) {
    for (int head_dim : {64, 128, 256}) ok = compile(argv[1], arch, head_dim) && ok;
  }
  std::printf(ok ? "NVRTC: all configs compiled\n" : "NVRTC: FAILED\n");
  return ok ? 0 : 1;
}
