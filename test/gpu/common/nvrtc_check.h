// Shared by the harnesses' NVRTC checks (nvrtc_check.cpp): compiles kernel
// templates through NVRTC the way generated code does (explicit
// instantiations by name expression) and reports the cubin sizes. Needs no
// GPU.
#pragma once

#include <nvrtc.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace nvrtc_check {

inline bool check(nvrtcResult result, const char* what) {
  if (result == NVRTC_SUCCESS) return true;
  std::fprintf(stderr, "%s: %s\n", what, nvrtcGetErrorString(result));
  return false;
}

// Compiles `source` for `arch`, the templates of `kernels_dir` and the CUDA
// headers on the include path, and instantiates `names` (kernel name
// expressions); prints "<arch> <label>: cubin N bytes". NVRTC's log goes to
// stderr; with `report`, ptxas's resource report is printed instead, and a
// kernel spilling more than `spill_budget` bytes or a serialised wgmma
// pipeline fails the compile.
inline bool compile(const std::string& kernels_dir, const char* arch, const std::string& label,
                    const std::string& source, const std::vector<std::string>& names, bool report,
                    int spill_budget = 0) {
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
    // ptxas: "N bytes spill stores" with N > spill_budget, or C7510-C7519 (wgmma serialised / fences injected).
    for (size_t at = log.find("bytes spill stores"); at != std::string::npos; at = log.find("bytes spill stores", at + 1)) {
      const size_t start = log.rfind(',', at);
      const int spilled = start != std::string::npos ? std::atoi(log.c_str() + start + 1) : 0;
      if (spilled > spill_budget) {
        std::fprintf(stderr, "%s %s: %d bytes of register spills, above the %d B budget\n", arch, label.c_str(),
                     spilled, spill_budget);
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

// A check's main: `nvrtc_check <repo>/kernels`; `compile_all(kernels_dir)`
// compiles every configuration and says whether all did.
template <class CompileAll>
int run(int argc, char** argv, CompileAll&& compile_all) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <repo>/kernels\n", argv[0]);
    return 2;
  }
  const bool ok = compile_all(std::string(argv[1]));
  std::printf(ok ? "NVRTC: all configs compiled\n" : "NVRTC: FAILED\n");
  return ok ? 0 : 1;
}

}  // namespace nvrtc_check
