//===- AttentionModule.cpp - Attention kernels of a dflex.attention spec ---===//

#include "dflex/Codegen/AttentionModule.h"

#include <algorithm>
#include <sstream>

namespace dflex::codegen {

using bundle::KernelRole;
using bundle::LaunchArray;
using bundle::moduleKernel;

namespace {

/// The macro NVRTC (and nvcc) define when compiling for sm_90a or
/// compute_90a: the Hopper kernels are declared only under it.
constexpr const char *kSm90Guard = "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n";

/// ForwardPipeline's enumerators, in the order of forwardPipelineNames().
constexpr const char *kForwardPipelineEnumerators[] = {"kSharedQuery", "kSharedQueryEarlyKey",
                                                       "kRegisterQuery"};

/// The positive integers of a comma-separated list, and what is left after
/// `count` of them (empty, or the text after the last comma used).
Result<std::vector<int>> parseCounts(const std::string &text, size_t count, const char *form,
                                     std::string *rest) {
  std::vector<int> values;
  size_t at = 0;
  while (values.size() < count) {
    const size_t comma = text.find(',', at);
    const std::string field = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const bool digits = !field.empty() && field.size() <= 4 &&
                        field.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(field) == 0)
      return Result<std::vector<int>>::failure("'" + text + "': expected " + form + ", with positive integers");
    values.push_back(std::stoi(field));
    if (comma == std::string::npos) {
      at = text.size();
      break;
    }
    at = comma + 1;
  }
  if (values.size() < count)
    return Result<std::vector<int>>::failure("'" + text + "': expected " + form);
  *rest = at < text.size() ? text.substr(at) : "";
  return values;
}

} // namespace

const std::vector<std::string> &forwardPipelineNames() {
  static const std::vector<std::string> names = {"shared_query", "early_key", "register_query"};
  return names;
}

Result<PortableForwardConfig> parsePortableForwardConfig(const std::string &text) {
  const char *form = "M,N,WARPS[,PIPELINE]";
  std::string rest;
  Result<std::vector<int>> counts = parseCounts(text, 3, form, &rest);
  if (!counts.ok())
    return counts.status();
  PortableForwardConfig config{counts.value()[0], counts.value()[1], counts.value()[2],
                               forwardPipelineNames().front()};
  if (!rest.empty()) {
    const auto &names = forwardPipelineNames();
    if (std::find(names.begin(), names.end(), rest) == names.end()) {
      std::string known;
      for (const std::string &name : names)
        known += (known.empty() ? "" : ", ") + name;
      return Status::failure("'" + text + "': unknown pipeline '" + rest + "' (expected one of " + known + ")");
    }
    config.pipeline = rest;
  }
  return config;
}

Result<PortableBackwardConfig> parsePortableBackwardConfig(const std::string &text) {
  std::string rest;
  Result<std::vector<int>> counts = parseCounts(text, 4, "M,N,WARPS,DQ_CHUNK", &rest);
  if (!counts.ok())
    return counts.status();
  if (!rest.empty())
    return Status::failure("'" + text + "': expected M,N,WARPS,DQ_CHUNK");
  return PortableBackwardConfig{counts.value()[0], counts.value()[1], counts.value()[2], counts.value()[3]};
}

bool hasSm90Forward(int64_t headDim) { return headDim == 64 || headDim == 128 || headDim == 256; }
bool hasSm90Backward(int64_t headDim) { return headDim == 64 || headDim == 128; }
bool hasOwnPortableConfigs(int computeCapability) {
  return computeCapability == 90 || computeCapability == 120;
}

Result<GeneratedModule> generateAttention(const bundle::AttentionSpec &spec,
                                          const expr::Program &mask,
                                          const expr::Program *scoreMod,
                                          const std::string &sourceName,
                                          const PortableConfigs &portable) {
  const int portableConfigsOf = portable.of;
  if (spec.qkHeadDim != spec.vHeadDim)
    return Status::failure("@" + spec.name + ": the attention kernels need "
                           "qk_head_dim == v_head_dim, got " +
                           std::to_string(spec.qkHeadDim) + " and " +
                           std::to_string(spec.vHeadDim));
  if (scoreMod && scoreMod->scoreDerivative < 0)
    return Status::failure("@" + spec.name + ": score_mod @" + scoreMod->name +
                           " has no derivative");
  if (portableConfigsOf && !hasOwnPortableConfigs(portableConfigsOf))
    return Status::failure("@" + spec.name + ": no portable configs of compute capability " +
                           std::to_string(portableConfigsOf));
  Result<VariantLayout> layout = layoutVariant(mask, scoreMod);
  if (!layout.ok())
    return Status::failure("@" + spec.name + ": " + layout.error());

  const std::string element = spec.elementType == "f16" ? "__half" : "__nv_bfloat16";
  const std::string headDim = std::to_string(spec.qkHeadDim);
  const bool sm90 = hasSm90Forward(spec.qkHeadDim);
  const bool sm90Backward = hasSm90Backward(spec.qkHeadDim);
  std::ostringstream source;
  source << "// Generated by dflex from " << sourceName << ": the attention kernels of @"
         << spec.name << ".\n"
         << "// " << spec.numQHeads << " query heads, " << spec.numKvHeads
         << " key/value heads, head_dim " << spec.qkHeadDim << ", " << spec.elementType
         << ".\n"
         << "#include \"dflex/Expr/Semantics.h\"\n"
         << "#include \"attention/attention.cuh\"\n"
         << "#include \"analysis/tile_classify.cuh\"\n";
  if (sm90)
    source << "// The Hopper kernels (wgmma) exist only when compiling for sm_90a.\n"
           << kSm90Guard << "#include \"attention/sm90/attention_sm90.cuh\"\n#endif\n";
  const std::string configsOf = portableConfigsOf ? std::to_string(portableConfigsOf)
                                                  : "::dflex::kernels::kCompiledComputeCapability";
  const std::string defaults = "::dflex::kernels::DefaultAttentionConfigs<" + element + ", " + headDim +
                               ", " + configsOf + ">";
  source << "\nnamespace dflex_generated {\n\n"
         << emitVariant("Variant", layout.value(), mask, scoreMod) << "\n"
         << (portableConfigsOf ? "// The configs of compute capability " + configsOf + ", in every binary"
                               : "// The configs of the arch this binary is compiled for")
         << (portable.forward || portable.backward ? ", but for those chosen at compile time.\n" : ".\n");
  if (!portable.forward && !portable.backward) {
    source << "using Configs = " << defaults << ";\n";
  } else {
    source << "struct Configs {\n";
    if (const auto &forward = portable.forward) {
      const size_t pipeline =
          std::find(forwardPipelineNames().begin(), forwardPipelineNames().end(), forward->pipeline) -
          forwardPipelineNames().begin();
      if (pipeline == forwardPipelineNames().size())
        return Status::failure("@" + spec.name + ": unknown forward pipeline '" + forward->pipeline + "'");
      source << "  using Forward = ::dflex::kernels::AttentionForwardConfig<" << element << ", " << headDim << ", "
             << forward->blockM << ", " << forward->blockN << ", " << forward->warps
             << ", ::dflex::kernels::ForwardPipeline::" << kForwardPipelineEnumerators[pipeline] << ">;\n";
    } else {
      source << "  using Forward = " << defaults << "::Forward;\n";
    }
    if (const auto &backward = portable.backward) {
      source << "  using Backward = ::dflex::kernels::AttentionBackwardConfig<" << element << ", " << headDim
             << ", " << backward->blockM << ", " << backward->blockN << ", " << backward->warps << ", "
             << backward->gradQChunk << ">;\n";
    } else {
      source << "  using Backward = " << defaults << "::Backward;\n";
    }
    source << "};\n";
  }
  if (sm90)
    source << kSm90Guard << "using Sm90Configs = ::dflex::kernels::Sm90AttentionConfigs<"
           << element << ", " << headDim << ">;\n#endif\n";
  source << "\n} // namespace dflex_generated\n\n";

  // Launch constants of one pass's main kernel, in the order of its
  // launch array's names (bundle::launchArray). Portable kernels with
  // another arch's configs also run at that arch's occupancy: their shared
  // memory is padded so that a multiprocessor of this binary's arch holds as
  // many of their blocks as one of that arch would.
  auto launchArray = [&](LaunchArray array, const std::string &config, bool backward,
                         bool portable) {
    const bundle::LaunchArrayInfo &info = bundle::launchArray(array);
    const std::string sharedBytes = config + "::kSharedBytes";
    const std::string launchSharedBytes =
        portable && portableConfigsOf
            ? "::dflex::kernels::occupancy_proxy_shared_bytes(" + sharedBytes +
                  ", ::dflex::kernels::shared_bytes_per_sm("
                  "::dflex::kernels::kCompiledComputeCapability), "
                  "::dflex::kernels::shared_bytes_per_sm(" + configsOf + "))"
            : sharedBytes;
    source << "extern \"C\" __device__ const int " << info.symbol << "[" << info.names.size()
           << "] = {\n"
           << "    " << config << "::kThreads, " << launchSharedBytes << ",\n"
           << "    " << config << "::kBlockM, " << config << "::kBlockN"
           << (backward ? ",\n    ::dflex::kernels::kRowKernelThreads, ::dflex::kernels::kRowKernelRows};\n"
                        : "};\n");
  };
  source << "// Launch constants, read back from each arch's compiled module:\n"
         << "// threads per block, dynamic shared bytes, query tile, key tile\n"
         << "// (backward: and threads and rows per block of the row kernels).\n";
  launchArray(LaunchArray::Forward, "dflex_generated::Configs::Forward", false, true);
  launchArray(LaunchArray::Backward, "dflex_generated::Configs::Backward", true, true);
  source << "extern \"C\" __device__ const int "
         << bundle::launchArray(LaunchArray::TileClassify).symbol << "[1] = {\n"
         << "    ::dflex::kernels::kTileClassifyThreads};\n";
  if (sm90) {
    source << kSm90Guard;
    launchArray(LaunchArray::ForwardSm90, "dflex_generated::Sm90Configs::Forward", false, false);
    if (sm90Backward)
      launchArray(LaunchArray::BackwardSm90, "dflex_generated::Sm90Configs::Backward", true, false);
    source << "#endif\n";
  }

  GeneratedModule module;
  module.name = spec.name;
  module.kind = "attention";
  module.source = source.str();
  module.layout = layout.value();
  const std::string variant = "dflex_generated::Variant";
  const std::string forward = "dflex_generated::Configs::Forward";
  const std::string backward = "dflex_generated::Configs::Backward";
  module.kernels = {
      moduleKernel(KernelRole::AttentionForward, forward + ", " + variant),
      moduleKernel(KernelRole::AttentionBackwardPreprocess, backward),
      moduleKernel(KernelRole::AttentionBackward, backward + ", " + variant),
      moduleKernel(KernelRole::AttentionBackwardGradQ, backward),
      moduleKernel(KernelRole::TileClassify, variant),
  };
  if (sm90)
    module.kernels.push_back(moduleKernel(KernelRole::AttentionForwardSm90,
                                          "dflex_generated::Sm90Configs::Forward, " + variant));
  if (sm90Backward) {
    const std::string config = "dflex_generated::Sm90Configs::Backward";
    module.kernels.push_back(moduleKernel(KernelRole::AttentionBackwardPreprocessSm90, config));
    module.kernels.push_back(moduleKernel(KernelRole::AttentionBackwardSm90, config + ", " + variant));
    module.kernels.push_back(moduleKernel(KernelRole::AttentionBackwardGradQSm90, config));
  }
  return module;
}

} // namespace dflex::codegen
