//===- Nvrtc.cpp - NVRTC driver ----------------------------------------------===//
#include "dflex/Compile/Nvrtc.h"

#include "dflex/Compile/GpuArch.h"
#include "dflex/Support/ByteIO.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <nvrtc.h>
#include <sys/stat.h>

namespace dflex::compile {

namespace {

constexpr std::string_view kBinaryMagic = "DFLXARCH";
constexpr uint32_t kBinaryFormatVersion = 1;

std::string nvrtcError(const char *call, nvrtcResult result) {
  return std::string(call) + " failed: " + nvrtcGetErrorString(result);
}

/// Owns an nvrtcProgram.
class Program {
public:
  ~Program() {
    if (program_)
      nvrtcDestroyProgram(&program_);
  }
  nvrtcProgram *address() { return &program_; }
  nvrtcProgram get() const { return program_; }

private:
  nvrtcProgram program_ = nullptr;
};

/// Fetches a program output whose size comes from `getSize`.
template <typename SizeFn, typename GetFn>
Result<std::string> programOutput(nvrtcProgram program, SizeFn getSize,
                                  GetFn get, const char *what) {
  size_t size = 0;
  if (nvrtcResult result = getSize(program, &size); result != NVRTC_SUCCESS)
    return Result<std::string>::failure(nvrtcError(what, result));
  std::string bytes(size, '\0');
  if (size > 0)
    if (nvrtcResult result = get(program, bytes.data());
        result != NVRTC_SUCCESS)
      return Result<std::string>::failure(nvrtcError(what, result));
  return bytes;
}

// The log and the PTX come back NUL-terminated.
void dropTrailingNul(std::string &text) {
  if (!text.empty() && text.back() == '\0')
    text.pop_back();
}

bool fileExists(const std::string &path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

/// The unsigned integer right before `suffix` in `line`, or nullopt.
std::optional<uint64_t> numberBefore(std::string_view line,
                                     std::string_view suffix) {
  size_t at = line.find(suffix);
  if (at == std::string_view::npos)
    return std::nullopt;
  size_t end = at;
  while (end > 0 && line[end - 1] == ' ')
    --end;
  size_t begin = end;
  while (begin > 0 && line[begin - 1] >= '0' && line[begin - 1] <= '9')
    --begin;
  if (begin == end)
    return std::nullopt;
  return std::stoull(std::string(line.substr(begin, end - begin)));
}

/// The text between the first pair of single quotes after `marker`.
std::optional<std::string> quotedAfter(std::string_view line,
                                       std::string_view marker) {
  size_t at = line.find(marker);
  if (at == std::string_view::npos)
    return std::nullopt;
  size_t open = line.find('\'', at + marker.size());
  if (open == std::string_view::npos)
    return std::nullopt;
  size_t close = line.find('\'', open + 1);
  if (close == std::string_view::npos)
    return std::nullopt;
  return std::string(line.substr(open + 1, close - open - 1));
}

/// "kernel 'expr' (mangled)" when a name expression maps to it.
std::string describeKernel(const ArchBinary &binary, const std::string &name) {
  for (const LoweredName &lowered : binary.loweredNames)
    if (lowered.loweredName == name)
      return "kernel '" + lowered.expression + "' (" + name + ")";
  return "kernel '" + name + "'";
}

bool isArchOption(std::string_view option) {
  for (std::string_view prefix : {"--gpu-architecture", "-arch", "-gpu-name"})
    if (option.rfind(prefix, 0) == 0)
      return true;
  return false;
}

Status checkSupported(const GpuArch &arch) {
  Result<std::vector<std::string>> supported = nvrtcSupportedArchs();
  if (!supported.ok())
    return supported.status();
  std::string list;
  for (const std::string &name : supported.value()) {
    if (name == "sm_" + std::to_string(arch.computeCapability))
      return Status::success();
    list += (list.empty() ? "" : " ") + name;
  }
  Result<std::string> version = nvrtcVersion();
  return Status::failure(arch.name + " is not supported by NVRTC " +
                         (version.ok() ? version.value() : "") +
                         " (supported: " + list + ")");
}

} // namespace

bool KernelResources::operator==(const KernelResources &other) const {
  return name == other.name && registers == other.registers &&
         barriers == other.barriers &&
         staticSharedBytes == other.staticSharedBytes &&
         stackFrameBytes == other.stackFrameBytes &&
         spillStoreBytes == other.spillStoreBytes &&
         spillLoadBytes == other.spillLoadBytes;
}

const KernelResources *ArchBinary::findKernel(std::string_view name) const {
  for (const KernelResources &kernel : kernels)
    if (kernel.name == name)
      return &kernel;
  return nullptr;
}

std::string ArchBinary::loweredName(std::string_view expression) const {
  for (const LoweredName &lowered : loweredNames)
    if (lowered.expression == expression)
      return lowered.loweredName;
  return {};
}

std::vector<KernelResources> parsePtxasLog(std::string_view log) {
  // ptxas -v reports, per entry function:
  //   Compiling entry function 'NAME' for 'sm_90'
  //   Function properties for NAME
  //       N bytes stack frame, N bytes spill stores, N bytes spill loads
  //   Used N registers, used N barriers, N bytes smem, ...
  // "Function properties" also appears for non-inlined device functions;
  // those lines are skipped.
  std::vector<KernelResources> kernels;
  bool propertiesOfCurrent = false;
  size_t begin = 0;
  while (begin < log.size()) {
    size_t end = log.find('\n', begin);
    if (end == std::string_view::npos)
      end = log.size();
    std::string_view line = log.substr(begin, end - begin);
    begin = end + 1;

    if (auto name = quotedAfter(line, "Compiling entry function")) {
      kernels.push_back(KernelResources{*name});
      propertiesOfCurrent = false;
      continue;
    }
    if (kernels.empty())
      continue;
    KernelResources &current = kernels.back();
    if (size_t at = line.find("Function properties for ");
        at != std::string_view::npos) {
      std::string_view subject = line.substr(at + 24);
      while (!subject.empty() && (subject.back() == ' ' || subject.back() == '\r'))
        subject.remove_suffix(1);
      propertiesOfCurrent = subject == current.name;
      continue;
    }
    if (propertiesOfCurrent && line.find("bytes stack frame") !=
                                   std::string_view::npos) {
      current.stackFrameBytes =
          numberBefore(line, "bytes stack frame").value_or(0);
      current.spillStoreBytes =
          numberBefore(line, "bytes spill stores").value_or(0);
      current.spillLoadBytes =
          numberBefore(line, "bytes spill loads").value_or(0);
      continue;
    }
    if (auto registers = numberBefore(line, "registers");
        registers && line.find("Used ") != std::string_view::npos) {
      current.registers = *registers;
      current.barriers = numberBefore(line, "barriers").value_or(0);
      current.staticSharedBytes = numberBefore(line, "bytes smem").value_or(0);
    }
  }
  return kernels;
}

Result<std::string> nvrtcVersion() {
  int major = 0, minor = 0;
  if (nvrtcResult result = ::nvrtcVersion(&major, &minor);
      result != NVRTC_SUCCESS)
    return Result<std::string>::failure(nvrtcError("nvrtcVersion", result));
  return std::to_string(major) + "." + std::to_string(minor);
}

Result<std::vector<std::string>> nvrtcSupportedArchs() {
  int count = 0;
  if (nvrtcResult result = nvrtcGetNumSupportedArchs(&count);
      result != NVRTC_SUCCESS)
    return Result<std::vector<std::string>>::failure(
        nvrtcError("nvrtcGetNumSupportedArchs", result));
  std::vector<int> archs(size_t(std::max(count, 0)));
  if (nvrtcResult result = nvrtcGetSupportedArchs(archs.data());
      result != NVRTC_SUCCESS)
    return Result<std::vector<std::string>>::failure(
        nvrtcError("nvrtcGetSupportedArchs", result));
  std::vector<std::string> names;
  for (int arch : archs)
    names.push_back("sm_" + std::to_string(arch));
  return names;
}

Result<std::string> cudaIncludeDirectory() {
  auto hasHeaders = [](const std::string &dir) {
    return fileExists(dir + "/cuda_bf16.h");
  };
  if (const char *override = std::getenv("DFLEX_CUDA_INCLUDE");
      override && *override) {
    if (hasHeaders(override))
      return std::string(override);
    return Result<std::string>::failure(
        std::string("DFLEX_CUDA_INCLUDE='") + override +
        "' does not contain cuda_bf16.h; point it at the CUDA include "
        "directory");
  }
  std::string checked;
  for (const char *variable : {"CUDA_HOME", "CUDA_PATH"}) {
    const char *root = std::getenv(variable);
    if (!root || !*root)
      continue;
    std::string dir = std::string(root) + "/include";
    if (hasHeaders(dir))
      return dir;
    checked += " " + dir + " (from " + variable + ")";
  }
  std::string builtIn = DFLEX_CUDA_TOOLKIT_INCLUDE_DIR;
  if (hasHeaders(builtIn))
    return builtIn;
  checked += " " + builtIn + " (toolkit found at build time)";
  return Result<std::string>::failure(
      "cannot find the CUDA headers (cuda_bf16.h); checked:" + checked +
      "; set DFLEX_CUDA_INCLUDE to the CUDA include directory");
}

Status checkSharedMemory(const CompileRequest &request, ArchBinary &binary) {
  Result<GpuArch> arch = parseGpuArch(binary.arch);
  if (!arch.ok())
    return arch.status();
  std::optional<uint64_t> limit =
      maxSharedBytesPerBlock(arch.value().computeCapability);

  // Resolve each dynamic-shared-memory request to a mangled kernel name.
  std::map<std::string, uint64_t> dynamicByKernel;
  for (const auto &[requested, bytes] : request.dynamicSharedBytes) {
    std::string name = binary.loweredName(requested);
    if (name.empty())
      name = requested;
    if (arch.value().producesCubin && !binary.findKernel(name)) {
      std::vector<std::string> names;
      for (const KernelResources &kernel : binary.kernels)
        names.push_back(kernel.name);
      std::sort(names.begin(), names.end());
      std::string known;
      for (const std::string &kernelName : names)
        known += (known.empty() ? "" : ", ") + kernelName;
      return Status::failure("dynamic shared memory is given for kernel '" +
                             requested + "', which is not among the kernels "
                             "compiled for " + binary.arch + " (" + known +
                             ")");
    }
    dynamicByKernel[name] = bytes;
  }

  auto check = [&](const std::string &name, uint64_t staticBytes,
                   uint64_t dynamicBytes) -> Status {
    if (limit && staticBytes + dynamicBytes > *limit)
      return Status::failure(
          describeKernel(binary, name) + " needs " +
          std::to_string(staticBytes) + " bytes of static + " +
          std::to_string(dynamicBytes) + " bytes of dynamic shared memory = " +
          std::to_string(staticBytes + dynamicBytes) + " bytes on " +
          binary.arch + ", above the limit of " + std::to_string(*limit) +
          " bytes per block");
    return Status::success();
  };

  if (arch.value().producesCubin) {
    for (const KernelResources &kernel : binary.kernels) {
      auto dynamic = dynamicByKernel.find(kernel.name);
      Status status =
          check(kernel.name, kernel.staticSharedBytes,
                dynamic == dynamicByKernel.end() ? 0 : dynamic->second);
      if (!status.ok())
        return status;
    }
  } else {
    // PTX only: ptxas has not run, so only the dynamic part is known.
    for (const auto &[name, bytes] : dynamicByKernel)
      if (Status status = check(name, 0, bytes); !status.ok())
        return status;
  }
  if (!limit)
    binary.notes.push_back("no shared-memory limit is known for " +
                           binary.arch + "; only the " +
                           std::to_string(kMaxStaticSharedBytes) +
                           "-byte static limit was checked");
  return Status::success();
}

Result<ArchBinary> compileForArch(const CompileRequest &request,
                                  std::string_view archName) {
  Result<GpuArch> parsed = parseGpuArch(archName);
  if (!parsed.ok())
    return parsed.status();
  const GpuArch &arch = parsed.value();
  if (Status supported = checkSupported(arch); !supported.ok())
    return supported;
  for (const std::string &option : request.options)
    if (isArchOption(option))
      return Result<ArchBinary>::failure(
          "option '" + option + "' sets the architecture; list "
          "architectures in the request's archs instead");
  Result<std::string> includeDir = cudaIncludeDirectory();
  if (!includeDir.ok())
    return includeDir.status();

  // No --split-compile: NVVM's parallel partitions make the PTX differ from
  // one run to the next, and a content-addressed bundle must not.
  std::vector<std::string> options = {"--gpu-architecture=" + arch.name,
                                      "--include-path=" + includeDir.value()};
  if (arch.producesCubin) {
    options.push_back("--ptxas-options=-v");
    // NVRTC 12.9 and later keep their own cache of compiled programs; a hit
    // skips ptxas and with it the resource lines this module parses (dflex
    // has its own content-addressed cache).
    int major = 0, minor = 0;
    if (::nvrtcVersion(&major, &minor) == NVRTC_SUCCESS &&
        (major > 12 || (major == 12 && minor >= 9)))
      options.push_back("--no-cache");
  }
  options.insert(options.end(), request.options.begin(),
                 request.options.end());
  std::vector<const char *> optionPointers;
  for (const std::string &option : options)
    optionPointers.push_back(option.c_str());
  std::vector<const char *> headerContents, headerNames;
  for (const HeaderFile &header : request.headers) {
    headerContents.push_back(header.contents.c_str());
    headerNames.push_back(header.name.c_str());
  }

  Program program;
  if (nvrtcResult result = nvrtcCreateProgram(
          program.address(), request.source.c_str(),
          request.programName.c_str(), int(request.headers.size()),
          headerContents.data(), headerNames.data());
      result != NVRTC_SUCCESS)
    return Result<ArchBinary>::failure(
        nvrtcError("nvrtcCreateProgram", result));
  for (const std::string &expression : request.nameExpressions)
    if (nvrtcResult result =
            nvrtcAddNameExpression(program.get(), expression.c_str());
        result != NVRTC_SUCCESS)
      return Result<ArchBinary>::failure(
          nvrtcError("nvrtcAddNameExpression", result) + " for '" +
          expression + "'");

  auto start = std::chrono::steady_clock::now();
  nvrtcResult compiled = nvrtcCompileProgram(
      program.get(), int(optionPointers.size()), optionPointers.data());
  auto stop = std::chrono::steady_clock::now();

  ArchBinary binary;
  binary.arch = arch.name;
  binary.compileMilliseconds =
      std::chrono::duration<double, std::milli>(stop - start).count();
  Result<std::string> log = programOutput(program.get(), nvrtcGetProgramLogSize,
                                          nvrtcGetProgramLog, "nvrtcGetProgramLog");
  if (!log.ok())
    return log.status();
  binary.log = std::move(log.value());
  dropTrailingNul(binary.log);
  binary.kernels = parsePtxasLog(binary.log);

  if (compiled != NVRTC_SUCCESS) {
    std::string message = "NVRTC failed to compile '" + request.programName +
                          "' for " + arch.name + " (" +
                          nvrtcGetErrorString(compiled) + ")";
    // ptxas rejects too much static shared memory without saying why.
    for (const KernelResources &kernel : binary.kernels)
      if (kernel.staticSharedBytes > kMaxStaticSharedBytes)
        message += ": " + describeKernel(binary, kernel.name) + " uses " +
                   std::to_string(kernel.staticSharedBytes) +
                   " bytes of static shared memory; static shared memory is "
                   "limited to " + std::to_string(kMaxStaticSharedBytes) +
                   " bytes per block (use dynamic shared memory beyond that)";
    return Result<ArchBinary>::failure(message + "\n" + binary.log);
  }

  Result<std::string> ptx =
      programOutput(program.get(), nvrtcGetPTXSize, nvrtcGetPTX, "nvrtcGetPTX");
  if (!ptx.ok())
    return ptx.status();
  binary.ptx = std::move(ptx.value());
  dropTrailingNul(binary.ptx);
  if (arch.producesCubin) {
    Result<std::string> cubin = programOutput(program.get(), nvrtcGetCUBINSize,
                                              nvrtcGetCUBIN, "nvrtcGetCUBIN");
    if (!cubin.ok())
      return cubin.status();
    if (cubin.value().empty())
      return Result<ArchBinary>::failure("NVRTC produced no cubin for " +
                                         arch.name);
    binary.cubin = std::move(cubin.value());
  }
  for (const std::string &expression : request.nameExpressions) {
    const char *lowered = nullptr;
    if (nvrtcResult result =
            nvrtcGetLoweredName(program.get(), expression.c_str(), &lowered);
        result != NVRTC_SUCCESS)
      return Result<ArchBinary>::failure(
          nvrtcError("nvrtcGetLoweredName", result) + " for '" + expression +
          "'");
    binary.loweredNames.push_back(LoweredName{expression, lowered});
  }

  if (Status status = checkSharedMemory(request, binary); !status.ok())
    return status;
  return binary;
}

Result<std::vector<ArchBinary>> compileAllArchs(const CompileRequest &request) {
  if (request.archs.empty())
    return Result<std::vector<ArchBinary>>::failure(
        "no architecture requested");
  std::vector<ArchBinary> binaries;
  for (const std::string &arch : request.archs) {
    Result<ArchBinary> binary = compileForArch(request, arch);
    if (!binary.ok())
      return binary.status();
    binaries.push_back(std::move(binary.value()));
  }
  return binaries;
}

std::string serializeArchBinary(const ArchBinary &binary) {
  ByteWriter writer;
  writer.raw(kBinaryMagic);
  writer.u32(kBinaryFormatVersion);
  writer.string(binary.arch);
  writer.string(binary.ptx);
  writer.string(binary.cubin);
  writer.string(binary.log);
  writer.u64(uint64_t(binary.compileMilliseconds * 1000));
  writer.u64(binary.loweredNames.size());
  for (const LoweredName &lowered : binary.loweredNames) {
    writer.string(lowered.expression);
    writer.string(lowered.loweredName);
  }
  writer.u64(binary.kernels.size());
  for (const KernelResources &kernel : binary.kernels) {
    writer.string(kernel.name);
    for (uint64_t value :
         {kernel.registers, kernel.barriers, kernel.staticSharedBytes,
          kernel.stackFrameBytes, kernel.spillStoreBytes,
          kernel.spillLoadBytes})
      writer.u64(value);
  }
  return writer.take();
}

Result<ArchBinary> deserializeArchBinary(std::string_view bytes) {
  auto fail = [](const std::string &why) {
    return Result<ArchBinary>::failure("invalid compiled binary: " + why);
  };
  ByteReader reader(bytes);
  std::string_view magic;
  uint32_t version = 0;
  if (!reader.raw(kBinaryMagic.size(), magic, "magic") ||
      magic != kBinaryMagic)
    return fail("bad magic");
  if (!reader.u32(version, "format version") ||
      version != kBinaryFormatVersion)
    return fail("unsupported format version " + std::to_string(version));

  ArchBinary binary;
  uint64_t microseconds = 0, count = 0;
  reader.string(binary.arch, "arch");
  reader.string(binary.ptx, "ptx");
  reader.string(binary.cubin, "cubin");
  reader.string(binary.log, "log");
  reader.u64(microseconds, "compile time");
  binary.compileMilliseconds = double(microseconds) / 1000;
  reader.u64(count, "lowered name count");
  for (uint64_t i = 0; i < count && !reader.failed(); ++i) {
    LoweredName lowered;
    reader.string(lowered.expression, "name expression");
    reader.string(lowered.loweredName, "lowered name");
    binary.loweredNames.push_back(std::move(lowered));
  }
  reader.u64(count, "kernel count");
  for (uint64_t i = 0; i < count && !reader.failed(); ++i) {
    KernelResources kernel;
    reader.string(kernel.name, "kernel name");
    for (uint64_t *field :
         {&kernel.registers, &kernel.barriers, &kernel.staticSharedBytes,
          &kernel.stackFrameBytes, &kernel.spillStoreBytes,
          &kernel.spillLoadBytes})
      reader.u64(*field, "kernel resources");
    binary.kernels.push_back(std::move(kernel));
  }
  if (reader.failed())
    return fail(reader.error());
  if (reader.remaining() != 0)
    return fail(std::to_string(reader.remaining()) + " trailing bytes");
  return binary;
}

} // namespace dflex::compile
