// Compiles the gated-delta templates through NVRTC the way generated code
// will (explicit instantiations by name expression) for sm_90 and sm_120, for
// the Qwen3.5 configuration and a small one, and reports the cubin sizes.
// Needs no GPU.
//   nvrtc_check <repo>/kernels
#include <nvrtc.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

bool check(nvrtcResult result, const char* what) {
  if (result == NVRTC_SUCCESS) return true;
  std::fprintf(stderr, "%s: %s\n", what, nvrtcGetErrorString(result));
  return false;
}

bool compile(const std::string& kernels_dir, const char* arch, const std::string& config) {
  const char* source = "#include \"gated_delta/gated_delta.cuh\"\n";
  nvrtcProgram program;
  if (!check(nvrtcCreateProgram(&program, source, "generated.cu", 0, nullptr, nullptr), "nvrtcCreateProgram")) {
    return false;
  }
  std::vector<std::string> names;
  for (const char* kernel :
       {"chunk_table", "forward_prepare", "forward_state", "forward_output", "backward_prepare", "backward_state",
        "backward_chunk", "backward_finalize", "backward_gate_params"}) {
    names.push_back(std::string("dflex::kernels::gated_delta_") + kernel + "_kernel<" + config + ">");
  }
  for (const auto& name : names) {
    if (!check(nvrtcAddNameExpression(program, name.c_str()), "nvrtcAddNameExpression")) return false;
  }
  const std::string include = "--include-path=" + kernels_dir;
  const std::string arch_option = std::string("--gpu-architecture=") + arch;
  const char* cuda_home = std::getenv("CUDA_HOME");
  const std::string cuda_include =
      std::string("--include-path=") + (cuda_home ? cuda_home : "/usr/local/cuda") + "/include";
  const char* options[] = {include.c_str(), cuda_include.c_str(), arch_option.c_str(), "--std=c++17"};
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
    for (const auto& name : names) {
      const char* lowered = nullptr;
      ok = check(nvrtcGetLoweredName(program, name.c_str(), &lowered), "nvrtcGetLoweredName") && ok;
    }
    std::printf("%s %s: cubin %zu bytes\n", arch, config.c_str(), cubin_size);
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
  const char* configs[] = {
      // Qwen3.5: dims 128, scalar gate, delta rule, L2 norm, in-kernel gate, states, varlen.
      "dflex::kernels::GatedDeltaConfig<128, 128, dflex::kernels::GateKind::kScalarLog, true, true, true, true, "
      "true, true>",
      "dflex::kernels::GatedDeltaConfig<64, 64, dflex::kernels::GateKind::kNone, false, false, false, false, false, "
      "false>"};
  bool ok = true;
  for (const char* arch : {"sm_90", "sm_120"}) {
    for (const char* config : configs) ok = compile(argv[1], arch, config) && ok;
  }
  std::printf(ok ? "NVRTC: all configs compiled\n" : "NVRTC: FAILED\n");
  return ok ? 0 : 1;
}
