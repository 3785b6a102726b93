// The CUDA path of the gated-delta op: the bundle's kernels, loaded once per
// (bundle, spec, device) through the Driver API and launched on LibTorch's
// current stream with GatedDeltaParams (kernels/gated_delta/params.cuh), in
// the order of docs/gated-delta.md (the order the kernel harness
// test/gpu/gated_delta/gated_delta_test.cu runs and checks).
#include "GatedDeltaInternal.h"

#include "dflex/runtime/cuda/CudaDriver.h"
#include "dflex/Support/Error.h"

// params.cuh is shared with the device code; the CUDA headers supply the
// __host__ / __device__ qualifiers it uses.
#include <cuda_runtime_api.h>

#include "gated_delta/params.cuh"

#include <c10/cuda/CUDAStream.h>

#include <array>
#include <map>
#include <mutex>
#include <tuple>

namespace dflex::runtime::detail {

namespace {

namespace kernels = ::dflex::kernels;

using bundle::KernelRole;
constexpr KernelRole kChunkTable = KernelRole::GatedDeltaChunkTable;
constexpr KernelRole kForwardPrepare = KernelRole::GatedDeltaForwardPrepare;
constexpr KernelRole kForwardState = KernelRole::GatedDeltaForwardState;
constexpr KernelRole kForwardOutput = KernelRole::GatedDeltaForwardOutput;
constexpr KernelRole kBackwardPrepare = KernelRole::GatedDeltaBackwardPrepare;
constexpr KernelRole kBackwardState = KernelRole::GatedDeltaBackwardState;
constexpr KernelRole kBackwardChunk = KernelRole::GatedDeltaBackwardChunk;
constexpr KernelRole kBackwardFinalize = KernelRole::GatedDeltaBackwardFinalize;
constexpr KernelRole kBackwardGateParams = KernelRole::GatedDeltaBackwardGateParams;

/// The kernels of one spec, loaded on one device, by role, with the launch
/// constants of the binary they come from.
struct LoadedGatedDelta {
  std::vector<std::unique_ptr<CudaModule>> modules; // one per part of the binary
  std::map<KernelRole, CudaKernel> kernels;
  GatedDeltaLaunch launch;

  const CudaKernel &operator[](KernelRole role) const { return kernels.at(role); }
};

/// Threads per block of each role.
int64_t threadsOf(const GatedDeltaLaunch &launch, KernelRole role) {
  if (role == kChunkTable)
    return launch.chunkTableThreads;
  if (role == kBackwardChunk)
    return launch.chunkBackwardThreads;
  if (role == kForwardState || role == kBackwardState)
    return launch.stateThreads;
  if (role == kBackwardFinalize || role == kBackwardGateParams)
    return launch.finalizeThreads;
  return launch.threads;
}

std::unique_ptr<LoadedGatedDelta> loadGatedDelta(const GatedDeltaBundle &bundle,
                                                 const GatedDeltaKernelSpec &spec, int ordinal) {
  const CudaDriver &driver = CudaDriver::instance();
  const CudaDriverApi &api = driver.api();
  const CudaDeviceInfo device = queryDevice(driver, ordinal);
  const std::string arch = "sm_" + std::to_string(device.computeMajor * 10 + device.computeMinor);
  const KernelImage image = bundle.kernelImage(spec, arch);
  auto loaded = std::make_unique<LoadedGatedDelta>();
  loaded->launch = spec.launches.at(image.arch);
  const GatedDeltaLaunch &launch = loaded->launch;
  // max_chunks and the workspace sizes come from this runtime's params.cuh.
  if (launch.chunk != kernels::kGatedDeltaChunk)
    throw FormatError(where(spec) + ": the bundle's " + image.arch + " kernels use chunks of " +
                      std::to_string(launch.chunk) + " tokens, this runtime " +
                      std::to_string(kernels::kGatedDeltaChunk) +
                      "; rebuild the bundle with this version's dflex-compile");
  int64_t shared = 0;
  for (const auto &[role, bytes] : launch.sharedBytes)
    shared = std::max(shared, bytes);
  if (shared > device.maxSharedMemoryPerBlockOptin)
    throw CudaError(where(spec) + " needs " + std::to_string(shared) + " B of shared memory per block; " +
                    device.name + " (" + arch + ") allows " +
                    std::to_string(device.maxSharedMemoryPerBlockOptin));

  for (const KernelImage::Part &part : image.parts)
    loaded->modules.push_back(std::make_unique<CudaModule>(driver, ordinal, part.image, part.label));
  CudaPrimaryContextGuard context(driver, ordinal);
  for (const BundleKernel &kernel : spec.kernels) {
    const CudaModule *module = loaded->modules[image.partOf(kernel.role)].get();
    const CUfunction function = module->function(image.loweredNames.at(kernel.role));
    int maxThreads = 0;
    driver.check(api.cuFuncGetAttribute(&maxThreads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
                 "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)");
    const int64_t threads = threadsOf(launch, kernel.role);
    if (maxThreads < threads)
      throw CudaError(image.label + ": kernel " + bundle::roleName(kernel.role) + " takes at most " +
                      std::to_string(maxThreads) + " threads per block, its launch constants say " +
                      std::to_string(threads));
    // Set once per kernel, as the harness's Launcher::configure does.
    if (auto bytes = launch.sharedBytes.find(kernel.role); bytes != launch.sharedBytes.end())
      driver.check(api.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          static_cast<int>(bytes->second)),
                   "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    loaded->kernels[kernel.role] = {module, function};
  }
  return loaded;
}

/// Loaded kernels for the life of the process (never unloaded, so nothing
/// calls the driver during static destruction). Holds the bundles, so a
/// key's address is never reused.
const LoadedGatedDelta &loadedGatedDelta(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                                         int ordinal) {
  struct Registry {
    std::mutex mutex;
    std::map<std::tuple<const GatedDeltaKernelSpec *, int>, std::unique_ptr<LoadedGatedDelta>> loaded;
    std::vector<std::shared_ptr<const GatedDeltaBundle>> bundles;
  };
  static Registry *registry = new Registry();
  std::lock_guard<std::mutex> lock(registry->mutex);
  std::unique_ptr<LoadedGatedDelta> &slot = registry->loaded[{&spec, ordinal}];
  if (!slot) {
    slot = loadGatedDelta(bundle, spec, ordinal);
    registry->bundles.push_back(bundle.shared_from_this());
  }
  return *slot;
}

CUstream currentStream(const torch::Tensor &t) {
  // cudaStream_t and CUstream are the same handle type.
  return reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
}

unsigned ceilDiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

/// A [B, T, ...] tensor as the kernels read it: B*T token rows, evenly
/// spaced (`rowStride` elements apart), each row's trailing dims contiguous.
/// `vectorised` (q, k, v, dO: 16-byte copies) also needs a stride that is a
/// multiple of 8 and a 16-byte aligned start. Otherwise a contiguous copy.
torch::Tensor tokenRows(const torch::Tensor &t, bool vectorised, long long &rowStride) {
  int64_t inner = 1;
  bool packed = true; // trailing dims contiguous
  for (int64_t d = t.dim() - 1; d >= 2; --d) {
    packed = packed && (t.size(d) == 1 || t.stride(d) == inner);
    inner *= t.size(d);
  }
  const int64_t batch = t.size(0), length = t.size(1);
  int64_t stride = inner;
  if (length > 1)
    stride = t.stride(1);
  else if (batch > 1)
    stride = t.stride(0);
  const bool even = batch <= 1 || length <= 1 || t.stride(0) == length * stride;
  bool usable = packed && even && stride >= inner;
  if (vectorised)
    usable = usable && stride % 8 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  if (usable) {
    rowStride = stride;
    return t;
  }
  rowStride = inner;
  return t.clone(at::MemoryFormat::Contiguous);
}

/// Contiguous with an 8-byte aligned start (states are read as float2).
torch::Tensor packedState(const torch::Tensor &t) {
  if (t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 8 == 0)
    return t;
  return t.clone(at::MemoryFormat::Contiguous);
}

int maxChunks(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &p) {
  return kernels::gated_delta_max_chunks(spec.varlen, static_cast<int>(p.sequences),
                                         static_cast<int>(p.length), static_cast<int>(p.tokens));
}

/// The workspace carved out of one byte tensor, 256-byte aligned buffers in
/// GatedDeltaWorkspace's order (null where the configuration has none).
struct WorkspaceLayout {
  static constexpr int kBuffers = 15;
  std::array<int64_t, kBuffers> offsets{}, sizes{};
  int64_t bytes = 0;

  WorkspaceLayout(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &p) {
    const kernels::GatedDeltaWorkspaceSizes z = kernels::gated_delta_workspace_sizes(
        static_cast<int>(spec.keyDim), static_cast<int>(spec.valueDim), spec.deltaRule, spec.inKernelGate,
        spec.varlen, static_cast<int>(p.sequences), static_cast<int>(p.tokens), static_cast<int>(p.keyHeads),
        static_cast<int>(p.valueHeads), maxChunks(spec, p));
    sizes = {z.chunk_offsets, z.chunk_sequence, z.gate_cumsum, z.beta,
             z.w,             z.u,              z.key_decay,   z.delta,
             z.t_inverse,     z.chunk_states,   z.grad_delta,  z.chunk_state_grads,
             z.grad_q_accum,  z.grad_k_accum,   z.gate_param_partials};
    for (int i = 0; i < kBuffers; ++i) {
      offsets[i] = bytes;
      bytes += (sizes[i] + 255) / 256 * 256;
    }
  }

  kernels::GatedDeltaWorkspace view(const torch::Tensor &storage) const {
    unsigned char *base = storage.data_ptr<uint8_t>();
    auto at = [&](int i) -> void * { return sizes[i] > 0 ? base + offsets[i] : nullptr; };
    kernels::GatedDeltaWorkspace w{};
    w.chunk_offsets = static_cast<int *>(at(0));
    w.chunk_sequence = static_cast<int *>(at(1));
    w.gate_cumsum = static_cast<float *>(at(2));
    w.beta = static_cast<float *>(at(3));
    w.w = static_cast<__nv_bfloat16 *>(at(4));
    w.u = static_cast<__nv_bfloat16 *>(at(5));
    w.key_decay = static_cast<float *>(at(6));
    w.delta = static_cast<__nv_bfloat16 *>(at(7));
    w.t_inverse = static_cast<__nv_bfloat16 *>(at(8));
    w.chunk_states = static_cast<__nv_bfloat16 *>(at(9));
    w.grad_delta = static_cast<__nv_bfloat16 *>(at(10));
    w.chunk_state_grads = static_cast<__nv_bfloat16 *>(at(11));
    w.grad_q_accum = static_cast<float *>(at(12));
    w.grad_k_accum = static_cast<float *>(at(13));
    w.gate_param_partials = static_cast<float *>(at(14));
    return w;
  }

  /// The grouped-head dq / dk accumulators (zeroed before each backward).
  torch::Tensor gradAccumulator(const torch::Tensor &storage, int which) const {
    return storage.narrow(0, offsets[12 + which], sizes[12 + which]);
  }
};

template <typename T>
T *pointer(const torch::Tensor &t) {
  return t.defined() ? static_cast<T *>(t.data_ptr()) : nullptr;
}

/// The forward inputs in the kernels' layouts, kept alive with the
/// parameters that point at them.
struct KernelInputs {
  std::vector<torch::Tensor> keepAlive;
  kernels::GatedDeltaParams params{};
};

KernelInputs kernelInputs(const GatedDeltaKernelSpec &spec, const GatedDeltaProblem &p,
                          const GatedDeltaInputs &in, const torch::Tensor &cuSeqlens,
                          const torch::Tensor &workspace) {
  KernelInputs k;
  kernels::GatedDeltaParams &params = k.params;
  params.num_sequences = static_cast<int>(p.sequences);
  params.sequence_length = spec.varlen ? 0 : static_cast<int>(p.length); // read without varlen only
  params.total_tokens = static_cast<int>(p.tokens);
  params.key_heads = static_cast<int>(p.keyHeads);
  params.value_heads = static_cast<int>(p.valueHeads);
  params.max_chunks = maxChunks(spec, p);
  params.scale = spec.scale;
  params.cu_seqlens = pointer<const int>(cuSeqlens);
  auto rows = [&](const torch::Tensor &t, bool vectorised, long long &stride) -> torch::Tensor {
    if (!t.defined()) {
      stride = 0;
      return t;
    }
    torch::Tensor laid = tokenRows(t, vectorised, stride);
    k.keepAlive.push_back(laid);
    return laid;
  };
  params.q = pointer<const __nv_bfloat16>(rows(in.q, true, params.q_row_stride));
  params.k = pointer<const __nv_bfloat16>(rows(in.k, true, params.k_row_stride));
  params.v = pointer<const __nv_bfloat16>(rows(in.v, true, params.v_row_stride));
  params.g = pointer<const float>(rows(in.g, false, params.g_row_stride));
  params.beta = pointer<const __nv_bfloat16>(rows(in.beta, false, params.beta_row_stride));
  params.a = pointer<const __nv_bfloat16>(rows(in.a, false, params.a_row_stride));
  params.b = pointer<const __nv_bfloat16>(rows(in.b, false, params.b_row_stride));
  auto contiguous = [&](const torch::Tensor &t) -> torch::Tensor {
    if (!t.defined())
      return t;
    k.keepAlive.push_back(t.contiguous());
    return k.keepAlive.back();
  };
  params.a_log = pointer<const float>(contiguous(in.aLog));
  params.dt_bias = pointer<const float>(contiguous(in.dtBias));
  if (spec.initialState) {
    // Without a given initial state the kernels start from zeros.
    torch::Tensor state = in.initialState.defined()
                              ? packedState(in.initialState)
                              : torch::zeros({p.sequences, p.valueHeads, p.keyDim, p.valueDim},
                                             in.q.options().dtype(torch::kFloat));
    k.keepAlive.push_back(state);
    params.initial_state = state.data_ptr<float>();
  }
  params.workspace = WorkspaceLayout(spec, p).view(workspace);
  return k;
}

/// The launches of one pass on one stream: every kernel takes the same
/// parameters; the per-chunk kernels run on (max_chunks, Hv), the
/// sequential state kernels on (Dv / value_block, Hv, N).
class Launches {
public:
  Launches(const LoadedGatedDelta &loaded, const GatedDeltaKernelSpec &spec,
           const kernels::GatedDeltaParams &params, CUstream stream)
      : loaded_(loaded), launch_(loaded.launch), params_(params), stream_(stream),
        perChunk_{static_cast<unsigned>(params.max_chunks), static_cast<unsigned>(params.value_heads), 1},
        perValueBlock_{static_cast<unsigned>(spec.valueDim / loaded.launch.valueBlock),
                       static_cast<unsigned>(params.value_heads), static_cast<unsigned>(params.num_sequences)} {}

  const LaunchExtent &perChunk() const { return perChunk_; }
  const LaunchExtent &perValueBlock() const { return perValueBlock_; }

  /// Launches `role` with its dynamic shared memory (none for the kernels
  /// that have static shared memory only).
  void operator()(KernelRole role, LaunchExtent grid, int64_t threads) {
    auto shared = launch_.sharedBytes.find(role);
    void *arguments[] = {&params_};
    loaded_[role].launch(grid, {static_cast<unsigned>(threads), 1, 1},
                         shared == launch_.sharedBytes.end() ? 0 : static_cast<unsigned>(shared->second),
                         stream_, arguments);
  }

private:
  const LoadedGatedDelta &loaded_;
  const GatedDeltaLaunch &launch_;
  kernels::GatedDeltaParams params_;
  CUstream stream_;
  LaunchExtent perChunk_, perValueBlock_;
};

/// The forward launches (docs/gated-delta.md, Forward).
void launchForward(const LoadedGatedDelta &loaded, const GatedDeltaKernelSpec &spec,
                   const kernels::GatedDeltaParams &params, CUstream stream) {
  Launches launch(loaded, spec, params, stream);
  const int64_t threads = loaded.launch.threads;
  if (spec.varlen)
    launch(kChunkTable, {1, 1, 1}, loaded.launch.chunkTableThreads);
  launch(kForwardPrepare, launch.perChunk(), threads);
  launch(kForwardState, launch.perValueBlock(), loaded.launch.stateThreads);
  launch(kForwardOutput, launch.perChunk(), threads);
}

/// The backward launches (docs/gated-delta.md, Backward); the grouped-head
/// accumulators must be zero.
void launchBackward(const LoadedGatedDelta &loaded, const GatedDeltaKernelSpec &spec,
                    const kernels::GatedDeltaParams &params, CUstream stream) {
  Launches launch(loaded, spec, params, stream);
  const int64_t threads = loaded.launch.threads, finalizeThreads = loaded.launch.finalizeThreads;
  launch(kBackwardPrepare, launch.perChunk(), threads);
  launch(kBackwardState, launch.perValueBlock(), loaded.launch.stateThreads);
  launch(kBackwardChunk, launch.perChunk(), loaded.launch.chunkBackwardThreads);
  if (params.value_heads != params.key_heads) {
    // One warp per (token, key head) row.
    const int64_t rows = static_cast<int64_t>(params.total_tokens) * params.key_heads;
    launch(kBackwardFinalize, {ceilDiv(rows, finalizeThreads / 32), 1, 1}, finalizeThreads);
  }
  if (spec.inKernelGate)
    launch(kBackwardGateParams, {static_cast<unsigned>(params.value_heads), 1, 1}, finalizeThreads);
}

/// cu_seqlens as the kernels read it: int32, contiguous, on q's device.
torch::Tensor deviceCuSeqlens(const GatedDeltaInputs &in) {
  if (!in.cuSeqlens.defined())
    return {};
  const torch::Tensor contiguous = in.cuSeqlens.contiguous();
  return contiguous.is_cuda() ? contiguous : contiguous.to(in.q.device(), /*non_blocking=*/true);
}

} // namespace

CudaForwardState cudaForward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                             const GatedDeltaProblem &p, const GatedDeltaInputs &in) {
  CudaForwardState state;
  const auto floats = in.q.options().dtype(torch::kFloat);
  state.outputs.out = torch::empty({p.batch, p.length, p.valueHeads, p.valueDim}, in.q.options());
  if (spec.finalState)
    state.outputs.finalState = torch::empty({p.sequences, p.valueHeads, p.keyDim, p.valueDim}, floats);
  if (p.tokens == 0) {
    // No token: the final state is the initial one.
    if (spec.finalState)
      state.outputs.finalState.copy_(in.initialState.defined() ? in.initialState
                                                                : torch::zeros_like(state.outputs.finalState));
    return state;
  }
  state.cuSeqlens = deviceCuSeqlens(in);
  state.workspace = torch::empty({WorkspaceLayout(spec, p).bytes}, in.q.options().dtype(torch::kByte));
  KernelInputs inputs = kernelInputs(spec, p, in, state.cuSeqlens, state.workspace);
  inputs.params.o = pointer<__nv_bfloat16>(state.outputs.out);
  inputs.params.o_row_stride = p.valueHeads * p.valueDim;
  inputs.params.final_state = pointer<float>(state.outputs.finalState);
  const LoadedGatedDelta &loaded = loadedGatedDelta(bundle, spec, in.q.device().index());
  launchForward(loaded, spec, inputs.params, currentStream(in.q));
  return state;
}

GatedDeltaGrads cudaBackward(const GatedDeltaBundle &bundle, const GatedDeltaKernelSpec &spec,
                             const GatedDeltaProblem &p, const GatedDeltaInputs &in,
                             const CudaForwardState &forward, const torch::Tensor &gradOut,
                             const torch::Tensor &gradFinalState) {
  const auto floats = in.q.options().dtype(torch::kFloat);
  GatedDeltaGrads grads;
  grads.q = torch::empty(in.q.sizes(), in.q.options());
  grads.k = torch::empty(in.k.sizes(), in.k.options());
  grads.v = torch::empty(in.v.sizes(), in.v.options());
  const std::vector<int64_t> gates{p.batch, p.length, p.valueHeads};
  if (in.g.defined())
    grads.g = torch::empty(gates, floats);
  if (in.beta.defined())
    grads.beta = torch::empty(gates, floats);
  if (spec.inKernelGate) {
    grads.a = torch::empty(gates, floats);
    if (spec.deltaRule)
      grads.b = torch::empty(gates, floats);
    grads.aLog = torch::empty({p.valueHeads}, floats);
    grads.dtBias = torch::empty({p.valueHeads}, floats);
  }
  if (spec.initialState)
    grads.initialState = torch::empty({p.sequences, p.valueHeads, p.keyDim, p.valueDim}, floats);
  if (p.tokens == 0) {
    // Nothing but the state passes through.
    for (torch::Tensor *t : {&grads.aLog, &grads.dtBias})
      if (t->defined())
        t->zero_();
    if (grads.initialState.defined())
      grads.initialState.copy_(gradFinalState.defined() ? gradFinalState
                                                        : torch::zeros_like(grads.initialState));
    return grads;
  }
  if (!forward.workspace.defined())
    throw FormatError(where(spec) + " backward: no forward workspace (the forward ran without gradients)");

  KernelInputs inputs = kernelInputs(spec, p, in, forward.cuSeqlens, forward.workspace);
  kernels::GatedDeltaParams &params = inputs.params;
  const torch::Tensor gradOutRows =
      gradOut.defined() ? tokenRows(gradOut, true, params.grad_o_row_stride)
                        : torch::zeros({p.batch, p.length, p.valueHeads, p.valueDim}, in.q.options());
  if (!gradOut.defined())
    params.grad_o_row_stride = p.valueHeads * p.valueDim;
  params.grad_o = pointer<const __nv_bfloat16>(gradOutRows);
  torch::Tensor gradFinal;
  if (spec.finalState) {
    // The loss may ignore the final state: its gradient is zero then.
    gradFinal = gradFinalState.defined()
                    ? packedState(gradFinalState)
                    : torch::zeros({p.sequences, p.valueHeads, p.keyDim, p.valueDim}, floats);
    params.grad_final_state = gradFinal.data_ptr<float>();
  }
  params.grad_q = pointer<__nv_bfloat16>(grads.q);
  params.grad_k = pointer<__nv_bfloat16>(grads.k);
  params.grad_v = pointer<__nv_bfloat16>(grads.v);
  params.grad_q_row_stride = p.keyHeads * p.keyDim;
  params.grad_k_row_stride = p.keyHeads * p.keyDim;
  params.grad_v_row_stride = p.valueHeads * p.valueDim;
  params.grad_g = pointer<float>(grads.g);
  params.grad_beta = pointer<float>(grads.beta);
  params.grad_a = pointer<float>(grads.a);
  params.grad_b = pointer<float>(grads.b);
  params.grad_a_log = pointer<float>(grads.aLog);
  params.grad_dt_bias = pointer<float>(grads.dtBias);
  params.grad_initial_state = pointer<float>(grads.initialState);

  if (p.valueHeads != p.keyHeads) {
    const WorkspaceLayout layout(spec, p);
    layout.gradAccumulator(forward.workspace, 0).zero_();
    layout.gradAccumulator(forward.workspace, 1).zero_();
  }
  const LoadedGatedDelta &loaded = loadedGatedDelta(bundle, spec, in.q.device().index());
  launchBackward(loaded, spec, params, currentStream(in.q));
  return grads;
}

} // namespace dflex::runtime::detail
