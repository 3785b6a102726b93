// Compiles the gated-delta templates through NVRTC the way generated code
// will (explicit instantiations by name expression) for sm_90 and sm_120, for
// the Qwen3.5 configuration and a small one, and reports the cubin sizes.
// Needs no GPU.
//   nvrtc_check <repo>/kernels
#include "../common/nvrtc_check.h"

#include <string>
#include <vector>

namespace {

bool compile(const std::string& kernels_dir, const char* arch, const std::string& config) {
  std::vector<std::string> names;
  for (const char* kernel :
       {"chunk_table", "forward_prepare", "forward_state", "forward_output", "backward_prepare", "backward_state",
        "backward_chunk", "backward_finalize", "backward_gate_params"}) {
    names.push_back(std::string("dflex::kernels::gated_delta_") + kernel + "_kernel<" + config + ">");
  }
  return nvrtc_check::compile(kernels_dir, arch, config, "#include \"gated_delta/gated_delta.cuh\"\n", names, false);
}

}  // namespace

int main(int argc, char** argv) {
  return nvrtc_check::run(argc, argv, [](const std::string& kernels_dir) {
    const char* configs[] = {
        // Qwen3.5: dims 128, scalar gate, delta rule, L2 norm, in-kernel gate, states, varlen.
        "dflex::kernels::GatedDeltaConfig<128, 128, dflex::kernels::GateKind::kScalarLog, true, true, true, true, "
        "true, true>",
        "dflex::kernels::GatedDeltaConfig<64, 64, dflex::kernels::GateKind::kNone, false, false, false, false, false, "
        "false>"};
    bool ok = true;
    for (const char* arch : {"sm_90", "sm_120"}) {
      for (const char* config : configs) ok = compile(kernels_dir, arch, config) && ok;
    }
    return ok;
  });
}
