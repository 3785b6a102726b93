// The CUDA path of the attention op: the bundle's kernels, loaded once per
// (bundle, spec, device) through the Driver API and launched on LibTorch's
// current stream with the parameter structs of kernels/attention/params.cuh.
#include "AttentionInternal.h"

#include "dflex/runtime/cuda/CudaDriver.h"
#include "dflex/Support/Error.h"

// params.cuh is shared with the device code; the CUDA headers supply the
// __host__ / __device__ qualifiers it uses.
#include <cuda_runtime_api.h>

#include "attention/params.cuh"

#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

namespace dflex::runtime::detail {

namespace {

namespace kernels = ::dflex::kernels;
using bundle::KernelRole;

/// The attention kernels of one spec in the binary of one device: the
/// portable ones and, in sm_90a binaries, the Hopper ones.
struct LoadedAttention {
  std::vector<std::unique_ptr<CudaModule>> modules; // one per part of the binary
  std::map<KernelRole, CudaKernel> kernels;

  const CudaKernel &kernel(KernelRole role) const {
    auto found = kernels.find(role);
    if (found == kernels.end())
      throw CudaError(std::string("dflex attention: the loaded binary has no kernel '") +
                      bundle::roleName(role) + "'");
    return found->second;
  }
};

/// A pass's kernel of `role` (a portable one) in the family the plan picked.
KernelRole familyRole(KernelRole role, const AttentionPassKernels &pass) {
  if (!pass.sm90)
    return role;
  switch (role) {
  case KernelRole::AttentionForward:
    return KernelRole::AttentionForwardSm90;
  case KernelRole::AttentionBackwardPreprocess:
    return KernelRole::AttentionBackwardPreprocessSm90;
  case KernelRole::AttentionBackward:
    return KernelRole::AttentionBackwardSm90;
  case KernelRole::AttentionBackwardGradQ:
    return KernelRole::AttentionBackwardGradQSm90;
  default:
    throw CudaError(std::string("dflex attention: no Hopper kernel for role '") +
                    bundle::roleName(role) + "'");
  }
}

std::unique_ptr<LoadedAttention> loadAttention(const KernelBundle &bundle,
                                               const AttentionKernelSpec &spec,
                                               const AttentionKernelPlan &plan, int ordinal) {
  const CudaDriver &driver = CudaDriver::instance();
  const CudaDriverApi &api = driver.api();
  const CudaDeviceInfo device = queryDevice(driver, ordinal);
  const KernelImage image = bundle.kernelImage(spec, plan.arch);
  const AttentionLaunches constants = bundle.attentionLaunches(spec, plan.arch);

  // Threads and dynamic shared memory of each role, from the binary's
  // launch constants.
  struct Launch {
    KernelRole role;
    const std::optional<AttentionLaunch> launch;
    bool rowKernel; // preprocess and dQ conversion: row_kernel_threads, no shared memory
  };
  const Launch launches[] = {
      {KernelRole::AttentionForward, constants.forward, false},
      {KernelRole::AttentionBackwardPreprocess, constants.backward, true},
      {KernelRole::AttentionBackward, constants.backward, false},
      {KernelRole::AttentionBackwardGradQ, constants.backward, true},
      {KernelRole::AttentionForwardSm90, constants.forwardSm90, false},
      {KernelRole::AttentionBackwardPreprocessSm90, constants.backwardSm90, true},
      {KernelRole::AttentionBackwardSm90, constants.backwardSm90, false},
      {KernelRole::AttentionBackwardGradQSm90, constants.backwardSm90, true},
  };
  for (const Launch &entry : launches)
    if (entry.launch && image.loweredNames.count(entry.role) && !entry.rowKernel &&
        entry.launch->sharedBytes > device.maxSharedMemoryPerBlockOptin)
      throw CudaError("dflex attention '" + spec.name + "': kernel " +
                      bundle::roleName(entry.role) + " needs " +
                      std::to_string(entry.launch->sharedBytes) +
                      " B of shared memory per block; " + device.name + " (" + plan.arch +
                      ") allows " + std::to_string(device.maxSharedMemoryPerBlockOptin));

  auto loaded = std::make_unique<LoadedAttention>();
  for (const KernelImage::Part &part : image.parts)
    loaded->modules.push_back(std::make_unique<CudaModule>(driver, ordinal, part.image, part.label));
  CudaPrimaryContextGuard context(driver, ordinal);
  for (const Launch &entry : launches) {
    auto lowered = image.loweredNames.find(entry.role);
    if (!entry.launch || lowered == image.loweredNames.end())
      continue;
    const CudaModule *module = loaded->modules[image.partOf(entry.role)].get();
    const CUfunction function = module->function(lowered->second);
    const int64_t threads = entry.rowKernel ? entry.launch->rowKernelThreads : entry.launch->threads;
    const int64_t sharedBytes = entry.rowKernel ? 0 : entry.launch->sharedBytes;
    int maxThreads = 0;
    driver.check(api.cuFuncGetAttribute(&maxThreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                        function),
                 "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)");
    if (maxThreads < threads)
      throw CudaError(image.label + ": kernel " + bundle::roleName(entry.role) + " takes at most " +
                      std::to_string(maxThreads) + " threads per block, its launch constants say " +
                      std::to_string(threads));
    if (sharedBytes > 0)
      driver.check(api.cuFuncSetAttribute(function,
                                          CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          static_cast<int>(sharedBytes)),
                   "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    loaded->kernels[entry.role] = {module, function};
  }
  return loaded;
}

/// Loaded kernels for the life of the process (modules are never unloaded:
/// the registry is deliberately leaked, so nothing calls the driver during
/// static destruction). Holds the bundles, so a key's address is never
/// reused. The plan's binary depends only on the spec and the device, so
/// one module per (spec, device) serves every kernel choice.
const LoadedAttention &loadedAttention(const KernelBundle &bundle,
                                       const AttentionKernelSpec &spec,
                                       const AttentionKernelPlan &plan, int ordinal) {
  struct Registry {
    std::mutex mutex;
    std::map<std::tuple<const AttentionKernelSpec *, int>, std::unique_ptr<LoadedAttention>>
        loaded;
    std::vector<std::shared_ptr<const KernelBundle>> bundles;
  };
  static Registry *registry = new Registry();
  std::lock_guard<std::mutex> lock(registry->mutex);
  std::unique_ptr<LoadedAttention> &slot = registry->loaded[{&spec, ordinal}];
  if (!slot) {
    slot = loadAttention(bundle, spec, plan, ordinal);
    registry->bundles.push_back(bundle.shared_from_this());
  }
  return *slot;
}

/// q, k, v, o, dO as the kernels read them: head_dim contiguous, strides
/// multiples of 8 elements, 16-byte aligned; otherwise a contiguous copy.
torch::Tensor kernelLayout(const torch::Tensor &t) {
  bool usable = t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int d = 0; d < 3; ++d)
    usable = usable && (t.size(d) == 1 || t.stride(d) % 8 == 0);
  return usable ? t : t.clone(at::MemoryFormat::Contiguous);
}

/// An uninitialised [B, T, H, lastDim] tensor whose dimensions are laid out
/// in the order of `like`'s (e.g. [B, H, T, D] storage read through a
/// [B, T, H, D] view), so that outputs and gradients come back in their
/// inputs' layout and autograd need not copy gradients into the leaves'.
torch::Tensor emptyInLayoutOf(const torch::Tensor &like, int64_t lastDim,
                              const torch::TensorOptions &options) {
  std::array<int64_t, 3> order{0, 1, 2};
  if (like.stride(3) == 1 && like.is_non_overlapping_and_dense())
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return like.stride(a) > like.stride(b);
    });
  std::array<int64_t, 4> inverse{}, sizes{};
  for (int64_t i = 0; i < 3; ++i) {
    sizes[i] = like.size(order[i]);
    inverse[order[i]] = i;
  }
  sizes[3] = lastDim;
  inverse[3] = 3;
  return torch::empty(sizes, options).permute(inverse);
}

kernels::TensorStrides stridesOf(const torch::Tensor &t) {
  // A dimension of size 1 is never stepped along: its stride is irrelevant.
  auto stride = [&](int d) { return t.size(d) == 1 ? 0LL : static_cast<long long>(t.stride(d)); };
  return {stride(0), stride(1), stride(2)};
}

kernels::AttentionShape shapeOf(const AttentionKernelSpec &spec, const AttentionProblem &p) {
  return {static_cast<int>(p.batch),       static_cast<int>(p.qHeads),
          static_cast<int>(p.kvHeads),     static_cast<int>(p.queryLength),
          static_cast<int>(p.keyLength),   spec.scale};
}

kernels::TileList tileView(const DeviceTileList &tiles) {
  const int32_t *data = tiles.storage.data_ptr<int32_t>();
  const int64_t rows = tiles.batches * tiles.heads * tiles.rowTiles;
  return {data, data + rows + 1, static_cast<int>(tiles.batches), static_cast<int>(tiles.heads),
          static_cast<int>(tiles.rowTiles)};
}

unsigned ceilDiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

CUstream currentStream(const torch::Tensor &t) {
  // cudaStream_t and CUstream are the same handle type.
  return reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

void checkTiles(const DeviceTileList &tiles, const AttentionProblem &p, int64_t rowTiles,
                const char *pass) {
  if (!tiles.storage.defined() || !tiles.storage.is_cuda() ||
      tiles.storage.scalar_type() != torch::kInt || tiles.rowTiles != rowTiles ||
      (tiles.batches != 1 && tiles.batches != p.batch) ||
      (tiles.heads != 1 && tiles.heads != p.qHeads) ||
      tiles.storage.numel() < tiles.batches * tiles.heads * tiles.rowTiles + 2)
    throw FormatError(std::string("dflex attention: the ") + pass +
                      " tile list does not fit the problem");
}

} // namespace

int deviceComputeCapability(int ordinal) {
  static std::mutex mutex;
  static std::map<int, int> *known = new std::map<int, int>();
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known->find(ordinal);
  if (found == known->end()) {
    const CudaDeviceInfo device = queryDevice(CudaDriver::instance(), ordinal);
    found = known->emplace(ordinal, device.computeMajor * 10 + device.computeMinor).first;
  }
  return found->second;
}

AttentionOutputs cudaForward(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                             const AttentionKernelPlan &plan, const AttentionProblem &p,
                             const torch::Tensor &q, const torch::Tensor &k,
                             const torch::Tensor &v, const BoundCaptures &captures,
                             const DeviceTileList &tiles) {
  AttentionOutputs outputs;
  outputs.out = emptyInLayoutOf(q, p.vHeadDim, q.options());
  outputs.logSumExp =
      torch::empty({p.batch, p.qHeads, p.queryLength}, q.options().dtype(torch::kFloat));
  if (p.batch == 0 || p.queryLength == 0)
    return outputs;
  if (p.keyLength == 0) {
    outputs.out.zero_();
    outputs.logSumExp.fill_(-std::numeric_limits<float>::infinity());
    return outputs;
  }
  const AttentionLaunch &launch = plan.forward.launch;
  checkTiles(tiles, p, ceilDiv(p.queryLength, launch.blockM), "forward");
  const LoadedAttention &loaded = loadedAttention(bundle, spec, plan, q.device().index());
  const torch::Tensor qv = kernelLayout(q), kv = kernelLayout(k), vv = kernelLayout(v);

  kernels::AttentionForwardParams params{};
  params.q = qv.data_ptr();
  params.k = kv.data_ptr();
  params.v = vv.data_ptr();
  params.o = outputs.out.data_ptr();
  params.lse = outputs.logSumExp.data_ptr<float>();
  params.q_strides = stridesOf(qv);
  params.k_strides = stridesOf(kv);
  params.v_strides = stridesOf(vv);
  params.o_strides = stridesOf(outputs.out);
  params.shape = shapeOf(spec, p);
  params.tiles = tileView(tiles);
  std::vector<uint8_t> variant = captures.packDevice(spec);
  void *arguments[] = {&params, variant.data()};
  loaded.kernel(familyRole(KernelRole::AttentionForward, plan.forward))
      .launch({ceilDiv(p.queryLength, launch.blockM), static_cast<unsigned>(p.qHeads),
               static_cast<unsigned>(p.batch)},
              {static_cast<unsigned>(launch.threads), 1, 1},
              static_cast<unsigned>(launch.sharedBytes), currentStream(q), arguments);
  return outputs;
}

AttentionGrads cudaBackward(const KernelBundle &bundle, const AttentionKernelSpec &spec,
                            const AttentionKernelPlan &plan, const AttentionProblem &p,
                            const torch::Tensor &q, const torch::Tensor &k,
                            const torch::Tensor &v, const torch::Tensor &out,
                            const torch::Tensor &logSumExp, const torch::Tensor &gradOut,
                            const BoundCaptures &captures, const DeviceTileList &tiles) {
  AttentionGrads grads;
  grads.q = emptyInLayoutOf(q, p.qkHeadDim, q.options());
  grads.k = emptyInLayoutOf(k, p.qkHeadDim, k.options());
  grads.v = emptyInLayoutOf(v, p.vHeadDim, v.options());
  if (p.batch == 0)
    return grads;
  if (p.queryLength == 0 || p.keyLength == 0) {
    grads.q.zero_();
    grads.k.zero_();
    grads.v.zero_();
    return grads;
  }
  const AttentionLaunch &launch = plan.backward.launch;
  checkTiles(tiles, p, ceilDiv(p.keyLength, launch.blockN), "backward");
  const LoadedAttention &loaded = loadedAttention(bundle, spec, plan, q.device().index());
  const torch::Tensor qv = kernelLayout(q), kv = kernelLayout(k), vv = kernelLayout(v);
  const torch::Tensor ov = kernelLayout(out), dov = kernelLayout(gradOut);
  const torch::Tensor lse = logSumExp.contiguous();
  // The dQ accumulator: zeroed by the preprocess, filled by the main kernel
  // and read by the dQ conversion, all three of one family (the Hopper one
  // permutes the columns of each row).
  torch::Tensor gradQAccum = torch::empty({p.batch, p.qHeads, p.queryLength, p.qkHeadDim},
                                          q.options().dtype(torch::kFloat));
  torch::Tensor delta =
      torch::empty({p.batch, p.qHeads, p.queryLength}, q.options().dtype(torch::kFloat));

  kernels::AttentionBackwardParams params{};
  params.q = qv.data_ptr();
  params.k = kv.data_ptr();
  params.v = vv.data_ptr();
  params.o = ov.data_ptr();
  params.grad_o = dov.data_ptr();
  params.lse = lse.data_ptr<float>();
  params.grad_q = grads.q.data_ptr();
  params.grad_k = grads.k.data_ptr();
  params.grad_v = grads.v.data_ptr();
  params.grad_q_accum = gradQAccum.data_ptr<float>();
  params.delta = delta.data_ptr<float>();
  params.q_strides = stridesOf(qv);
  params.k_strides = stridesOf(kv);
  params.v_strides = stridesOf(vv);
  params.o_strides = stridesOf(ov);
  params.grad_o_strides = stridesOf(dov);
  params.grad_q_strides = stridesOf(grads.q);
  params.grad_k_strides = stridesOf(grads.k);
  params.grad_v_strides = stridesOf(grads.v);
  params.shape = shapeOf(spec, p);
  params.tiles = tileView(tiles);
  std::vector<uint8_t> variant = captures.packDevice(spec);

  const CUstream stream = currentStream(q);
  if (p.batch * p.qHeads * p.queryLength / launch.rowKernelRows >= std::numeric_limits<int32_t>::max())
    throw FormatError("dflex attention '" + spec.name + "': batch x heads x queries " +
                      "exceeds the backward row kernels' grid");
  const LaunchExtent rowGrid{ceilDiv(p.batch * p.qHeads * p.queryLength, launch.rowKernelRows), 1, 1};
  const LaunchExtent rowBlock{static_cast<unsigned>(launch.rowKernelThreads), 1, 1};
  void *rowArguments[] = {&params};
  void *arguments[] = {&params, variant.data()};
  const CudaKernel &preprocess =
      loaded.kernel(familyRole(KernelRole::AttentionBackwardPreprocess, plan.backward));
  const CudaKernel &main = loaded.kernel(familyRole(KernelRole::AttentionBackward, plan.backward));
  const CudaKernel &gradQ = loaded.kernel(familyRole(KernelRole::AttentionBackwardGradQ, plan.backward));
  preprocess.launch(rowGrid, rowBlock, 0, stream, rowArguments);
  main.launch({ceilDiv(p.keyLength, launch.blockN), static_cast<unsigned>(p.kvHeads),
               static_cast<unsigned>(p.batch)},
              {static_cast<unsigned>(launch.threads), 1, 1},
              static_cast<unsigned>(launch.sharedBytes), stream, arguments);
  gradQ.launch(rowGrid, rowBlock, 0, stream, rowArguments);
  return grads;
}

} // namespace dflex::runtime::detail
