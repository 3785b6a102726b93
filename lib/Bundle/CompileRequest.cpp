//===- CompileRequest.cpp - Compiling a module for one arch ---------------===//

#include "dflex/Bundle/CompileRequest.h"

#include "dflex/Bundle/KernelTemplates.h"
#include "dflex/Compile/PtxConstants.h"

namespace dflex::bundle {

compile::CompileRequest compileRequest(const std::string &moduleName, const std::string &source,
                                       const std::vector<ModuleKernel> &kernels,
                                       const std::string &arch, const std::string &part) {
  compile::CompileRequest request;
  request.source = source;
  request.programName = moduleName + ".cu";
  request.archs = {arch};
  request.options = {"-std=c++17"};
  for (const EmbeddedHeader &header : kernelHeaders())
    request.headers.push_back({header.name, header.contents});
  for (const ModuleKernel &kernel : partKernels(kernels, arch, part))
    request.nameExpressions.push_back(kernel.nameExpression);
  return request;
}

Result<LaunchValues> readLaunchValues(const compile::ArchBinary &binary,
                                      const std::vector<ModuleKernel> &kernels) {
  LaunchValues launch;
  for (LaunchArray array : launchArraysOf(kernels, binary.arch)) {
    const LaunchArrayInfo &info = launchArray(array);
    Result<std::vector<int64_t>> values =
        compile::readPtxIntArray(binary.ptx, info.symbol, info.names.size());
    if (!values.ok())
      return values.status();
    for (size_t i = 0; i < info.names.size(); ++i)
      launch[info.symbol][info.names[i]] = values.value()[i];
  }
  return launch;
}

Status mergeLaunchValues(LaunchValues &binary, const LaunchValues &part) {
  for (const auto &[symbol, values] : part) {
    auto [entry, added] = binary.try_emplace(symbol, values);
    if (!added && entry->second != values)
      return Status::failure(std::string("parts of one binary differ in their ") + symbol);
  }
  return Status::success();
}

Status checkSharedMemory(compile::CompileRequest request, const std::vector<ModuleKernel> &kernels,
                         const LaunchValues &launch, compile::ArchBinary &binary) {
  for (const ModuleKernel &kernel : kernels) {
    const KernelRoleInfo &role = kernelRole(kernel.role);
    if (!buildsFor(kernel.role, binary.arch) || !role.sharedBytes)
      continue;
    auto array = launch.find(launchArray(role.launch).symbol);
    if (array == launch.end() || !array->second.count(role.sharedBytes))
      return Status::failure(std::string("no launch constant ") + launchArray(role.launch).symbol +
                             "." + role.sharedBytes + " for kernel '" + role.name + "'");
    request.dynamicSharedBytes[kernel.nameExpression] =
        static_cast<uint64_t>(array->second.at(role.sharedBytes));
  }
  return compile::checkSharedMemory(request, binary);
}

} // namespace dflex::bundle
