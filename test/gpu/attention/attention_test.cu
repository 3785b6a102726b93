// Standalone GPU correctness and timing harness of the dflex attention kernel
// templates (kernels/attention). Modes (default: all three, in this order):
//   --self-test  check the float64 reference's gradients by finite differences (CPU only)
//   --check      forward + backward on random inputs for a set of masks, score mods,
//                head dims, GQA groups, layouts and odd lengths, against the reference
//   --time       DFlash training shape and causal 8192 (d128, d256), each in both layouts, and
//                packed documents and a sliding window of 1000 at 8192: fwd and fwd+bwd medians
//   --sweep      candidate configs on the DFlash shape, portable backward ones also on causal
//                8192 at head_dim 128 and 256 (tuning)
//   --sm120-occupancy  pad each kernel's shared memory so that as many blocks share a
//                multiprocessor as on sm_120 (100 KB per SM): the proxy's occupancy; --time
//                then runs the portable kernels with sm_120's configs
//   --filter NAME_PART  only the check and timing cases whose name contains it (e.g.
//                "documents": with `make profile PROFILE_ARGS=...`, Nsight Compute on that shape)
//   --impl portable|sm90|all  which kernels --check/--time/--sweep run (default all):
//                the portable templates and, in builds for sm_90a (-DDFLEX_TEST_SM90,
//                see the Makefile) on an sm_90 device, the Hopper kernels (kernels/attention/sm90)
//   --row-kernel-candidates  every backward runs the candidate row kernels
//                (row_kernel_candidates.cuh) in place of the library's
// Exit status 0 only when every check passes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "attention/attention.cuh"
#ifdef DFLEX_TEST_SM90
#include "attention/sm90/attention_sm90.cuh"
#endif
#include "../common/cuda_util.h"
#include "reference.h"
#include "row_kernel_candidates.cuh"
#include "tile_lists.h"
#include "variants.cuh"

namespace {

using namespace attention_test;
using dflex::kernels::AttentionBackwardConfig;
using dflex::kernels::AttentionBackwardParams;
using dflex::kernels::AttentionForwardConfig;
using dflex::kernels::AttentionForwardParams;
using dflex::kernels::AttentionShape;
using dflex::kernels::DefaultAttentionConfigs;
using dflex::kernels::ForwardPipeline;
using dflex::kernels::kRowKernelThreads;
using dflex::kernels::TensorStrides;
using dflex::kernels::TileList;

constexpr double kTolerance = 1e-2;

int ceil_div(long long a, int b) { return static_cast<int>((a + b - 1) / b); }

// ---------------------------------------------------------------------------
// Elements and layouts

template <class Element>
Element to_element(float x);
template <>
__nv_bfloat16 to_element<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__half to_element<__half>(float x) { return __float2half(x); }
double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }
double to_double(__half x) { return __half2float(x); }
template <class Element>
const char* element_name();
template <>
const char* element_name<__nv_bfloat16>() { return "bf16"; }
template <>
const char* element_name<__half>() { return "fp16"; }

enum class Layout { kBTHD, kBHTD };

TensorStrides strides_for(Layout layout, int len, int heads, int head_dim) {
  const long long d = head_dim;
  if (layout == Layout::kBTHD) return {static_cast<long long>(len) * heads * d, heads * d, d};
  return {static_cast<long long>(heads) * len * d, d, len * d};
}

// Host tensors are [B, T, H, D]; the device copy follows `layout`.
template <class Element>
std::vector<Element> to_device_order(const std::vector<double>& x, int batch, int len, int heads, int d,
                                     Layout layout) {
  std::vector<Element> out(x.size());
  const TensorStrides s = strides_for(layout, len, heads, d);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < len; ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < d; ++i)
          out[b * s.batch + t * s.row + h * s.head + i] =
              to_element<Element>(static_cast<float>(x[((static_cast<size_t>(b) * len + t) * heads + h) * d + i]));
  return out;
}

template <class Element>
std::vector<double> from_device_order(const std::vector<Element>& x, int batch, int len, int heads, int d,
                                      Layout layout) {
  std::vector<double> out(x.size());
  const TensorStrides s = strides_for(layout, len, heads, d);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < len; ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < d; ++i)
          out[((static_cast<size_t>(b) * len + t) * heads + h) * d + i] =
              to_double(x[b * s.batch + t * s.row + h * s.head + i]);
  return out;
}

// Normal random values, already rounded to Element so the reference sees
// exactly what the kernel sees.
template <class Element>
std::vector<double> random_values(size_t count, double stddev, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.f, static_cast<float>(stddev));
  std::vector<double> out(count);
  for (auto& x : out) x = to_double(to_element<Element>(normal(rng)));
  return out;
}

// ---------------------------------------------------------------------------
// Launching

struct DeviceTileList {
  DeviceBuffer<int> row_offsets;
  DeviceBuffer<int> entries;
  TileList view;

  explicit DeviceTileList(const HostTileList& host)
      : row_offsets(host.row_offsets.size()), entries(std::max<size_t>(host.entries.size(), 1)) {
    row_offsets.upload(host.row_offsets);
    std::vector<int> padded = host.entries;
    if (padded.empty()) padded.push_back(0);
    entries.upload(padded);
    view = TileList{row_offsets.get(), entries.get(), host.batches, host.heads, host.row_tiles};
  }
};

// --sm120-occupancy: kernels run with as many blocks per multiprocessor as
// sm_120 would fit (its 100 KB of shared memory per SM, 1 KB of it reserved
// per block), so the sm_90 proxy does not hide latency with blocks an RTX
// PRO 6000 cannot hold.
bool g_sm120_occupancy = false;
int g_device_shared_per_sm = 0;  // bytes per SM of the device (set in main)

int proxy_shared_bytes(int shared_bytes) {
  if (!g_sm120_occupancy) return shared_bytes;
  return dflex::kernels::occupancy_proxy_shared_bytes(shared_bytes, g_device_shared_per_sm,
                                                      dflex::kernels::shared_bytes_per_sm(120));
}

// Launches kKernel with `shared_bytes` of dynamic shared memory (padded under
// --sm120-occupancy), raising the kernel's limit on its first launch.
template <auto kKernel, class... Args>
void launch(dim3 grid, int threads, int requested_shared_bytes, const Args&... args) {
  static bool configured = false;
  const int shared_bytes = proxy_shared_bytes(requested_shared_bytes);
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    configured = true;
  }
  kKernel<<<grid, threads, shared_bytes>>>(args...);
  CUDA_CHECK(cudaGetLastError());
}

// Forward grid: one block per query tile, query head and batch.
template <class Config>
dim3 forward_grid(const AttentionShape& shape) {
  return dim3(ceil_div(shape.q_len, Config::kBlockM), shape.q_heads, shape.batch);
}

// --row-kernel-candidates: the backwards run row_kernel_candidates' row kernels.
bool g_row_kernel_candidates = false;

// A row kernel (kLibrary, or kCandidate under --row-kernel-candidates) over
// every (batch, head, query) row.
template <auto kLibrary, auto kCandidate>
void launch_row_kernel(const AttentionBackwardParams& params) {
  const AttentionShape& shape = params.shape;
  const long long rows = static_cast<long long>(shape.batch) * shape.q_heads * shape.q_len;
  if (g_row_kernel_candidates) {
    launch<kCandidate>(ceil_div(rows, row_kernel_candidates::kRowsPerBlock), kRowKernelThreads, 0, params);
  } else {
    launch<kLibrary>(ceil_div(rows, dflex::kernels::kRowKernelRows), kRowKernelThreads, 0, params);
  }
}

// The backward preprocess: delta, and the zeroed dQ accumulator unless
// kZeroAccumulator is false.
template <class Config, bool kZeroAccumulator = true>
void launch_preprocess(const AttentionBackwardParams& params) {
  launch_row_kernel<dflex::kernels::attention_backward_preprocess_kernel<Config, kZeroAccumulator>,
                    row_kernel_candidates::preprocess_kernel<Config, kZeroAccumulator>>(params);
}

// The three backward launches in order: preprocess (delta, zeroed dQ
// accumulator), the main kernel kMain (one block per key tile), the dQ
// conversion kGradQ (kCandidateGradQ under --row-kernel-candidates).
template <class Config, auto kMain, auto kGradQ, auto kCandidateGradQ, class Variant>
void launch_backward_passes(const AttentionBackwardParams& params, const Variant& variant) {
  const AttentionShape& shape = params.shape;
  launch_preprocess<Config>(params);
  launch<kMain>(dim3(ceil_div(shape.kv_len, Config::kBlockN), shape.kv_heads, shape.batch), Config::kThreads,
                Config::kSharedBytes, params, variant);
  launch_row_kernel<kGradQ, kCandidateGradQ>(params);
}

template <class Config, class Variant>
void launch_forward(const AttentionForwardParams& params, const Variant& variant) {
  launch<dflex::kernels::attention_forward_kernel<Config, Variant>>(forward_grid<Config>(params.shape),
                                                                    Config::kThreads, Config::kSharedBytes, params,
                                                                    variant);
}

template <class Config, class Variant>
void launch_backward(const AttentionBackwardParams& params, const Variant& variant) {
  launch_backward_passes<Config, dflex::kernels::attention_backward_kernel<Config, Variant>,
                         dflex::kernels::attention_backward_grad_q_kernel<Config>,
                         row_kernel_candidates::grad_q_kernel<Config>>(params, variant);
}

std::string config_shape(int block_m, int block_n) { return std::to_string(block_m) + "x" + std::to_string(block_n); }

std::string pipeline_label(ForwardPipeline pipeline) {
  switch (pipeline) {
    case ForwardPipeline::kSharedQuery: return "";
    case ForwardPipeline::kSharedQueryEarlyKey: return " early K";
    case ForwardPipeline::kRegisterQuery: return " Q regs";
  }
  return " ?";
}

// The kernels that run a problem. A policy names the forward and backward
// configs (they fix the tile-list shapes) and launches the kernels.
template <class Forward_, class Backward_>
struct PortableKernels {
  using Forward = Forward_;
  using Backward = Backward_;
  static std::string name() { return "portable"; }
  static std::string forward_label() {
    return "fwd " + config_shape(Forward::kBlockM, Forward::kBlockN) + " w" + std::to_string(Forward::kWarps) +
           pipeline_label(Forward::kPipeline);
  }
  static std::string backward_label() {
    return "bwd " + config_shape(Backward::kBlockM, Backward::kBlockN) + " w" + std::to_string(Backward::kWarps) +
           " c" + std::to_string(Backward::kGradQChunk);
  }
  template <class Variant>
  static void forward(const AttentionForwardParams& params, const Variant& variant) {
    launch_forward<Forward>(params, variant);
  }
  template <class Variant>
  static void backward(const AttentionBackwardParams& params, const TileList&, const Variant& variant) {
    launch_backward<Backward>(params, variant);
  }
};

// The portable backward without the fp32 dQ accumulator: delta, the main
// kernel without dQ, then the dQ pass over the forward's tile list (so its
// tiles are the forward config's).
template <class Forward_, class Backward_>
struct PortableGradQPassKernels {
  using Forward = Forward_;
  using Backward = Backward_;
  static std::string name() { return "portable, dQ pass"; }
  static std::string forward_label() { return PortableKernels<Forward, Backward>::forward_label(); }
  static std::string backward_label() {
    return PortableKernels<Forward, Backward>::backward_label() + " + dQ pass";
  }
  template <class Variant>
  static void forward(const AttentionForwardParams& params, const Variant& variant) {
    launch_forward<Forward>(params, variant);
  }
  template <class Variant>
  static void backward(const AttentionBackwardParams& params, const TileList& forward_tiles, const Variant& variant) {
    const AttentionShape& shape = params.shape;
    launch_preprocess<Backward, false>(params);
    launch<dflex::kernels::attention_backward_kernel<Backward, Variant, false>>(
        dim3(ceil_div(shape.kv_len, Backward::kBlockN), shape.kv_heads, shape.batch), Backward::kThreads,
        Backward::kSharedBytes, params, variant);
    launch<dflex::kernels::attention_backward_grad_q_pass_kernel<Forward, Variant>>(
        forward_grid<Forward>(shape), Forward::kThreads, dflex::kernels::kGradQPassSharedBytes<Forward>, params,
        forward_tiles, variant);
  }
};

#ifdef DFLEX_TEST_SM90
using dflex::kernels::Sm90AttentionBackwardConfig;
using dflex::kernels::Sm90AttentionConfigs;
using dflex::kernels::Sm90AttentionForwardConfig;

template <class Config, class Variant>
void launch_forward_sm90(const AttentionForwardParams& params, const Variant& variant) {
  launch<dflex::kernels::attention_forward_sm90_kernel<Config, Variant>>(forward_grid<Config>(params.shape),
                                                                         Config::kThreads, Config::kSharedBytes,
                                                                         params, variant);
}

template <class Config, class Variant>
void launch_backward_sm90(const AttentionBackwardParams& params, const Variant& variant) {
  launch_backward_passes<Config, dflex::kernels::attention_backward_sm90_kernel<Config, Variant>,
                         dflex::kernels::attention_backward_grad_q_sm90_kernel<Config>,
                         row_kernel_candidates::grad_q_sm90_kernel<Config>>(params, variant);
}

template <class Config>
struct IsSm90Backward : std::false_type {};
template <class Element, int kHeadDim, int kStages>
struct IsSm90Backward<Sm90AttentionBackwardConfig<Element, kHeadDim, kStages>> : std::true_type {};

// The sm_90a forward, and the sm_90a backward where Backward is one (head
// dims without an sm_90a backward pair the sm_90a forward with a portable one).
template <class Forward_, class Backward_>
struct Sm90Kernels {
  using Forward = Forward_;
  using Backward = Backward_;
  static constexpr bool kSm90Backward = IsSm90Backward<Backward>::value;
  static std::string name() { return kSm90Backward ? "sm90" : "sm90 fwd"; }
  static std::string forward_label() {
    return "fwd sm90 " + config_shape(Forward::kBlockM, Forward::kBlockN) + " s" + std::to_string(Forward::kStages);
  }
  static std::string backward_label() {
    if constexpr (kSm90Backward) {
      return "bwd sm90 " + config_shape(Backward::kBlockM, Backward::kBlockN) + " s" +
             std::to_string(Backward::kStages);
    } else {
      return PortableKernels<Forward, Backward>::backward_label();
    }
  }
  template <class Variant>
  static void forward(const AttentionForwardParams& params, const Variant& variant) {
    launch_forward_sm90<Forward>(params, variant);
  }
  template <class Variant>
  static void backward(const AttentionBackwardParams& params, const TileList&, const Variant& variant) {
    if constexpr (kSm90Backward) {
      launch_backward_sm90<Backward>(params, variant);
    } else {
      launch_backward<Backward>(params, variant);
    }
  }
};

template <class Element, int kHeadDim, bool kHasBackward = Sm90AttentionConfigs<Element, kHeadDim>::kHasBackward>
struct DefaultSm90Backward {
  using Type = typename Sm90AttentionConfigs<Element, kHeadDim>::Backward;
};
template <class Element, int kHeadDim>
struct DefaultSm90Backward<Element, kHeadDim, false> {
  using Type = typename DefaultAttentionConfigs<Element, kHeadDim, 90>::Backward;
};

template <class Element, int kHeadDim>
using DefaultSm90Kernels = Sm90Kernels<typename Sm90AttentionConfigs<Element, kHeadDim>::Forward,
                                       typename DefaultSm90Backward<Element, kHeadDim>::Type>;

// Head dims with sm_90a kernels.
constexpr bool has_sm90_kernels(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }
#endif

// Which implementations --check, --time and --sweep run (--impl).
bool g_run_portable = true;
bool g_run_sm90 = true;  // also needs a sm_90a build and an sm_90 device

// Device state of one problem: inputs, outputs, workspace, tile lists, params.
template <class Kernels>
struct AttentionRun {
  using Forward = typename Kernels::Forward;
  using Backward = typename Kernels::Backward;
  using Element = typename Forward::Element;
  static constexpr int kHeadDim = Forward::kHeadDim;
  static_assert(std::is_same<Element, typename Backward::Element>::value && kHeadDim == Backward::kHeadDim,
                "forward and backward configs must agree on element type and head dim");

  Problem problem;
  Layout layout;
  DeviceBuffer<Element> q, k, v, grad_o, o, grad_q, grad_k, grad_v;
  DeviceBuffer<float> lse, grad_q_accum, delta;
  DeviceTileList forward_list, backward_list;
  AttentionForwardParams forward_params{};
  AttentionBackwardParams backward_params{};

  AttentionRun(const Problem& p, Layout layout_, const AttentionInputs& in, const HostTileList& forward_tiles,
               const HostTileList& backward_tiles)
      : problem(p),
        layout(layout_),
        q(p.q_elements()),
        k(p.kv_elements()),
        v(p.kv_elements()),
        grad_o(p.q_elements()),
        o(p.q_elements()),
        grad_q(p.q_elements()),
        grad_k(p.kv_elements()),
        grad_v(p.kv_elements()),
        lse(static_cast<size_t>(p.batch) * p.q_heads * p.q_len),
        grad_q_accum(p.q_elements()),
        delta(static_cast<size_t>(p.batch) * p.q_heads * p.q_len),
        forward_list(forward_tiles),
        backward_list(backward_tiles) {
    q.upload(to_device_order<Element>(in.q, p.batch, p.q_len, p.q_heads, kHeadDim, layout));
    k.upload(to_device_order<Element>(in.k, p.batch, p.kv_len, p.kv_heads, kHeadDim, layout));
    v.upload(to_device_order<Element>(in.v, p.batch, p.kv_len, p.kv_heads, kHeadDim, layout));
    grad_o.upload(to_device_order<Element>(in.grad_o, p.batch, p.q_len, p.q_heads, kHeadDim, layout));

    const TensorStrides qs = strides_for(layout, p.q_len, p.q_heads, kHeadDim);
    const TensorStrides ks = strides_for(layout, p.kv_len, p.kv_heads, kHeadDim);
    const AttentionShape shape{p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len, static_cast<float>(p.scale)};
    forward_params = AttentionForwardParams{q.get(), k.get(), v.get(), o.get(), lse.get(), qs, ks, ks, qs,
                                            shape, forward_list.view};
    backward_params.q = q.get();
    backward_params.k = k.get();
    backward_params.v = v.get();
    backward_params.o = o.get();
    backward_params.grad_o = grad_o.get();
    backward_params.lse = lse.get();
    backward_params.grad_q = grad_q.get();
    backward_params.grad_k = grad_k.get();
    backward_params.grad_v = grad_v.get();
    backward_params.grad_q_accum = grad_q_accum.get();
    backward_params.delta = delta.get();
    backward_params.q_strides = qs;
    backward_params.k_strides = ks;
    backward_params.v_strides = ks;
    backward_params.o_strides = qs;
    backward_params.grad_o_strides = qs;
    backward_params.grad_q_strides = qs;
    backward_params.grad_k_strides = ks;
    backward_params.grad_v_strides = ks;
    backward_params.shape = shape;
    backward_params.tiles = backward_list.view;
  }

  void poison_outputs() {
    o.poison();
    lse.poison();
    grad_q.poison();
    grad_k.poison();
    grad_v.poison();
    grad_q_accum.poison();
    delta.poison();
  }

  template <class Variant>
  void forward(const Variant& variant) {
    Kernels::forward(forward_params, variant);
  }
  template <class Variant>
  void backward(const Variant& variant) {
    Kernels::backward(backward_params, forward_list.view, variant);
  }

  AttentionOutputs download() const {
    const Problem& p = problem;
    AttentionOutputs out;
    out.o = from_device_order(o.download(), p.batch, p.q_len, p.q_heads, kHeadDim, layout);
    const std::vector<float> lse_host = lse.download();
    out.lse.assign(lse_host.begin(), lse_host.end());
    out.grad_q = from_device_order(grad_q.download(), p.batch, p.q_len, p.q_heads, kHeadDim, layout);
    out.grad_k = from_device_order(grad_k.download(), p.batch, p.kv_len, p.kv_heads, kHeadDim, layout);
    out.grad_v = from_device_order(grad_v.download(), p.batch, p.kv_len, p.kv_heads, kHeadDim, layout);
    return out;
  }
};

// ---------------------------------------------------------------------------
// Correctness

// max |x - ref| / max |ref| over the finite reference entries; any non-finite
// result where the reference is finite, or a finite one where it is -inf
// (LSE of a fully masked row), counts as a mismatch.
struct ErrorStat {
  double max_error = 0;
  double max_reference = 0;
  long long mismatches = 0;
  double relative() const { return max_reference > 0 ? max_error / max_reference : max_error; }
  bool ok() const { return mismatches == 0 && relative() <= kTolerance; }
};

ErrorStat compare(const std::vector<double>& got, const std::vector<double>& want) {
  ErrorStat stat;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want[i])) {
      if (got[i] != want[i]) ++stat.mismatches;
      continue;
    }
    if (!std::isfinite(got[i])) {
      ++stat.mismatches;
      continue;
    }
    stat.max_error = std::max(stat.max_error, std::abs(got[i] - want[i]));
    stat.max_reference = std::max(stat.max_reference, std::abs(want[i]));
  }
  return stat;
}

// Rows with reference LSE -inf must have O and dQ exactly zero.
long long masked_row_violations(const Problem& p, const AttentionOutputs& got, const AttentionOutputs& want) {
  long long violations = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.q_heads; ++h)
      for (int q = 0; q < p.q_len; ++q) {
        if (std::isfinite(want.lse[(static_cast<size_t>(b) * p.q_heads + h) * p.q_len + q])) continue;
        const size_t base = p.q_index(b, q, h);
        for (int i = 0; i < p.head_dim; ++i) {
          if (got.o[base + i] != 0.0 || got.grad_q[base + i] != 0.0) ++violations;
        }
      }
  return violations;
}

long long count_fully_masked_rows(const AttentionOutputs& ref) {
  long long n = 0;
  for (double x : ref.lse) n += std::isfinite(x) ? 0 : 1;
  return n;
}

bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

struct CaseSpec {
  std::string name;
  Problem problem;
  Layout layout = Layout::kBTHD;
  int list_batches = 1;  // 1: one list shared by all batches
  int list_heads = 1;    // 1: one list shared by all heads
  double input_stddev = 1.0;
  unsigned long long seed = 1;
};

int g_failures = 0;
std::string g_filter;  // run only the cases whose name contains it

#ifdef DFLEX_TEST_SM90
bool g_sm90_device = false;  // the device is sm_90 (set in main)
#endif

// Runs one implementation on a prepared case (inputs and float64 reference)
// and prints its row.
template <class Kernels, class Variant>
void check_kernels(const CaseSpec& spec, const AttentionInputs& in, const AttentionOutputs& ref,
                   const Variant& host_variant, const Variant& device_variant) {
  using Run = AttentionRun<Kernels>;
  using Element = typename Run::Element;
  const Problem& p = spec.problem;
  const HostTileList forward_tiles =
      build_tile_list(host_variant, TileRows::kQuery, spec.list_batches, spec.list_heads, p.q_len, p.kv_len,
                      Run::Forward::kBlockM, Run::Forward::kBlockN);
  const HostTileList backward_tiles =
      build_tile_list(host_variant, TileRows::kKey, spec.list_batches, spec.list_heads, p.q_len, p.kv_len,
                      Run::Backward::kBlockM, Run::Backward::kBlockN);
  Run run(p, spec.layout, in, forward_tiles, backward_tiles);

  AttentionOutputs results[2];
  for (auto& result : results) {
    run.poison_outputs();
    run.forward(device_variant);
    run.backward(device_variant);
    CUDA_CHECK(cudaDeviceSynchronize());
    result = run.download();
  }

  const ErrorStat o = compare(results[0].o, ref.o);
  const ErrorStat lse = compare(results[0].lse, ref.lse);
  ErrorStat grad_q = compare(results[0].grad_q, ref.grad_q);
  const ErrorStat grad_q_again = compare(results[1].grad_q, ref.grad_q);
  if (grad_q_again.relative() > grad_q.relative() || grad_q_again.mismatches > grad_q.mismatches) grad_q = grad_q_again;
  const ErrorStat grad_k = compare(results[0].grad_k, ref.grad_k);
  const ErrorStat grad_v = compare(results[0].grad_v, ref.grad_v);
  const long long masked_rows = count_fully_masked_rows(ref);
  const long long violations = masked_row_violations(p, results[0], ref) + masked_row_violations(p, results[1], ref);
  // dQ sums fp32 atomics in any order; everything else must repeat bit for bit.
  const bool repeatable = bitwise_equal(results[0].o, results[1].o) && bitwise_equal(results[0].lse, results[1].lse) &&
                          bitwise_equal(results[0].grad_k, results[1].grad_k) &&
                          bitwise_equal(results[0].grad_v, results[1].grad_v);
  const bool pass = o.ok() && lse.ok() && grad_q.ok() && grad_k.ok() && grad_v.ok() && violations == 0 && repeatable;
  if (!pass) ++g_failures;

  auto cell = [](const ErrorStat& s) {
    static char text[8][32];
    static int slot = 0;
    char* t = text[slot++ % 8];
    if (s.mismatches > 0) {
      std::snprintf(t, 32, "%.1e!%lld", s.relative(), s.mismatches);
    } else {
      std::snprintf(t, 32, "%.2e", s.relative());
    }
    return t;
  };
  std::printf("%-28s %-8s %-4s %4d %2d %3d/%-2d %5d %5d %-4s %6lld/%-6lld %6lld | %-9s %-9s %-9s %-9s %-9s | %-3s %s\n",
              spec.name.c_str(), Kernels::name().c_str(), element_name<Element>(), Run::kHeadDim, p.batch, p.q_heads,
              p.kv_heads, p.q_len, p.kv_len, spec.layout == Layout::kBTHD ? "bthd" : "bhtd", forward_tiles.full_tiles,
              forward_tiles.partial_tiles, masked_rows, cell(o), cell(lse), cell(grad_q), cell(grad_k), cell(grad_v),
              repeatable ? "yes" : "NO", pass ? "PASS" : (violations ? "FAIL (masked rows not zero)" : "FAIL"));
  std::fflush(stdout);
}

// The portable kernels a check runs: Configs::Kernels where it names them,
// else PortableKernels of its two configs.
template <class Configs, class = void>
struct PortablePolicy {
  using Type = PortableKernels<typename Configs::Forward, typename Configs::Backward>;
};
template <class Configs>
struct PortablePolicy<Configs, std::void_t<typename Configs::Kernels>> {
  using Type = typename Configs::Kernels;
};

// One case, every selected implementation against the same float64 reference:
// the portable kernels with Configs (by default those of compute capability
// kTarget; they run on whatever device is present) and, for kTarget 90, the
// sm_90a kernels where the build, the device and the head dim allow.
template <class Element, int kHeadDim, int kTarget = 90,
          class Configs = DefaultAttentionConfigs<Element, kHeadDim, kTarget>, class Variant>
void check_case(const CaseSpec& spec, const Variant& host_variant, const Variant& device_variant) {
  if (spec.name.find(g_filter) == std::string::npos) return;
  const Problem& p = spec.problem;
  std::mt19937_64 rng(spec.seed);
  AttentionInputs in;
  in.q = random_values<Element>(p.q_elements(), spec.input_stddev, rng);
  in.k = random_values<Element>(p.kv_elements(), spec.input_stddev, rng);
  in.v = random_values<Element>(p.kv_elements(), 1.0, rng);
  in.grad_o = random_values<Element>(p.q_elements(), 1.0, rng);
  const AttentionOutputs ref = reference_attention(p, host_variant, in);

  if (g_run_portable) {
    check_kernels<typename PortablePolicy<Configs>::Type>(spec, in, ref, host_variant, device_variant);
  }
#ifdef DFLEX_TEST_SM90
  if constexpr (kTarget == 90 && has_sm90_kernels(kHeadDim)) {
    if (g_run_sm90 && g_sm90_device) {
      check_kernels<DefaultSm90Kernels<Element, kHeadDim>>(spec, in, ref, host_variant, device_variant);
    }
  }
#endif
}

// DFlash anchors: per batch, `blocks` sorted distinct positions drawn from
// [first_position, context_len); the last `padded` blocks of the last batch
// are padding (-1).
std::vector<int> make_anchors(int batch, int blocks, int first_position, int context_len, int padded,
                              std::mt19937_64& rng) {
  std::vector<int> anchors(static_cast<size_t>(batch) * blocks);
  std::vector<int> positions;
  for (int i = first_position; i < context_len; ++i) positions.push_back(i);
  for (int b = 0; b < batch; ++b) {
    std::shuffle(positions.begin(), positions.end(), rng);
    std::sort(positions.begin(), positions.begin() + blocks);
    std::copy(positions.begin(), positions.begin() + blocks, anchors.begin() + static_cast<size_t>(b) * blocks);
  }
  for (int i = 0; i < padded; ++i) anchors[static_cast<size_t>(batch) * blocks - 1 - i] = -1;
  return anchors;
}

template <class Element, int kHeadDim, int kTarget = 90,
          class Configs = DefaultAttentionConfigs<Element, kHeadDim, kTarget>>
void check_dflash(const std::string& name, int batch, int q_heads, int kv_heads, int blocks, int context_len,
                  int padded, unsigned long long seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> anchors = make_anchors(batch, blocks, 0, context_len, padded, rng);
  anchors[0] = 0;  // a block that sees no context key, only its own block
  DeviceBuffer<int> device_anchors(anchors.size());
  device_anchors.upload(anchors);
  DFlashVariant host_variant;
  host_variant.anchors = anchors.data();
  host_variant.blocks = blocks;
  host_variant.context_len = context_len;
  DFlashVariant device_variant = host_variant;
  device_variant.anchors = device_anchors.get();
  CaseSpec spec;
  spec.name = name;
  spec.problem = Problem{batch, q_heads, kv_heads, blocks * 16, context_len + blocks * 16, kHeadDim,
                         1.0 / std::sqrt(static_cast<double>(kHeadDim))};
  spec.list_batches = batch;
  spec.seed = seed;
  check_case<Element, kHeadDim, kTarget, Configs>(spec, host_variant, device_variant);
}

Problem square_problem(int batch, int q_heads, int kv_heads, int q_len, int kv_len, int head_dim) {
  return Problem{batch, q_heads, kv_heads, q_len, kv_len, head_dim, 1.0 / std::sqrt(static_cast<double>(head_dim))};
}

// Document ids of one row of `length` tokens: documents of shortest to
// longest tokens (uniform), numbered from 0, the last cut at the row's end.
void pack_documents(int* row, int length, int shortest, int longest, std::mt19937_64& rng) {
  for (int t = 0, doc = 0; t < length; ++doc) {
    const int end = std::min(length, t + shortest + static_cast<int>(rng() % (longest - shortest + 1)));
    for (; t < end; ++t) row[t] = doc;
  }
}

// Documents of 20 to 150 tokens packed into `length`, two layouts per batch
// (DocumentVariant), per-head tile lists.
template <class Element, int kHeadDim, int kTarget = 90,
          class Configs = DefaultAttentionConfigs<Element, kHeadDim, kTarget>>
void check_documents(const std::string& name, int batch, int q_heads, int kv_heads, int length,
                     unsigned long long seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> ids(static_cast<size_t>(batch) * 2 * length);
  for (size_t row = 0; row < ids.size() / length; ++row) pack_documents(ids.data() + row * length, length, 20, 150, rng);
  DeviceBuffer<int> device_ids(ids.size());
  device_ids.upload(ids);
  CaseSpec spec{name, square_problem(batch, q_heads, kv_heads, length, length, kHeadDim)};
  spec.list_batches = batch;
  spec.list_heads = q_heads;
  spec.seed = seed;
  check_case<Element, kHeadDim, kTarget, Configs>(spec, DocumentVariant{IdentityScore{}, ids.data(), length},
                                                  DocumentVariant{IdentityScore{}, device_ids.get(), length});
}

// A forward pipeline (ForwardPipeline) at sm_120's tiles of a head_dim
// (kBlockM queries over kWarps warps, kBlockN keys): the DFlash mask,
// documents (partial tiles) and causal with spread logits (rows whose key
// tiles alternate between both K buffers and end in either).
template <int kHeadDim, int kBlockN, ForwardPipeline kPipeline, int kBlockM = 64, int kWarps = 4>
void check_forward_pipeline(const std::string& label) {
  struct Configs {
    using Forward = AttentionForwardConfig<__nv_bfloat16, kHeadDim, kBlockM, kBlockN, kWarps, kPipeline>;
    using Backward = typename DefaultAttentionConfigs<__nv_bfloat16, kHeadDim, 120>::Backward;
  };
  check_dflash<__nv_bfloat16, kHeadDim, 120, Configs>(label + ": dflash", 1, 8, 2, 40, 600, 4, 15);
  check_documents<__nv_bfloat16, kHeadDim, 120, Configs>(label + ": documents", 1, 4, 2, 555, 19);
  CaseSpec spec{label + ": causal wide", square_problem(1, 4, 2, 900, 900, kHeadDim)};
  spec.input_stddev = 1.8;
  spec.seed = 3;
  check_case<__nv_bfloat16, kHeadDim, 120, Configs>(spec, CausalVariant{}, CausalVariant{});
}

void run_checks() {
  std::printf("Correctness: error = max|x - ref| / max|ref| against a float64 CPU reference; pass <= %.0e.\n"
              "tiles = forward list full/partial; masked = rows that see no key; '!n' = n non-finite or\n"
              "misplaced -inf values; det = O, LSE, dK, dV bitwise equal over two runs; impl = portable\n"
              "(default configs), sm90 (sm_90a forward and backward) or sm90 fwd (sm_90a forward, portable\n"
              "backward: head dims without an sm_90a backward).\n",
              kTolerance);
  std::printf("%-28s %-8s %-4s %4s %2s %6s %5s %5s %-4s %13s %6s | %-9s %-9s %-9s %-9s %-9s | %-3s %s\n", "case",
              "impl", "type", "D", "B", "Hq/Hkv", "Tq", "Tk", "lay", "tiles f/p", "masked", "O", "LSE", "dQ", "dK", "dV",
              "det", "result");
  {
    CaseSpec spec{"causal", square_problem(2, 4, 4, 1000, 1000, 64)};
    check_case<__nv_bfloat16, 64>(spec, CausalVariant{}, CausalVariant{});
  }
  {
    CaseSpec spec{"causal odd gqa4", square_problem(1, 8, 2, 777, 777, 128)};
    spec.seed = 2;
    check_case<__nv_bfloat16, 128>(spec, CausalVariant{}, CausalVariant{});
  }
  {
    // Logits spread wide (a standard deviation of about 4.7 in log2 units):
    // the forwards' exponent bases move in later key tiles too, not only in
    // a row's first.
    CaseSpec spec{"causal wide logits", square_problem(1, 4, 2, 900, 900, 128)};
    spec.input_stddev = 1.8;
    spec.seed = 21;
    check_case<__nv_bfloat16, 128>(spec, CausalVariant{}, CausalVariant{});
    spec.name = "sm120 cfg: causal wide logits";
    check_case<__nv_bfloat16, 128, 120>(spec, CausalVariant{}, CausalVariant{});
  }
  {
    CaseSpec spec{"dense q!=kv gqa4", square_problem(1, 4, 1, 333, 1001, 128)};
    spec.seed = 3;
    check_case<__nv_bfloat16, 128>(spec, DenseVariant{}, DenseVariant{});
  }
  check_dflash<__nv_bfloat16, 128>("dflash gqa4 padded", 2, 8, 2, 48, 700, 5, 4);
  check_dflash<__nv_bfloat16, 256>("dflash gqa8", 1, 8, 1, 20, 300, 0, 5);
  check_dflash<__nv_bfloat16, 64>("dflash gqa1", 2, 2, 2, 30, 517, 3, 6);
  {
    CaseSpec spec{"softcap causal gqa8", square_problem(1, 8, 1, 600, 600, 128)};
    spec.problem.scale = 0.5;  // large scores so that the cap bites
    spec.seed = 7;
    check_case<__nv_bfloat16, 128>(spec, SoftcapCausalVariant{20.f}, SoftcapCausalVariant{20.f});
  }
  {
    CaseSpec spec{"softcap causal d256", square_problem(1, 2, 2, 300, 300, 256)};
    spec.problem.scale = 0.25;
    spec.seed = 8;
    check_case<__nv_bfloat16, 256>(spec, SoftcapCausalVariant{15.f}, SoftcapCausalVariant{15.f});
  }
  {
    CaseSpec spec{"window(h) per-head list", square_problem(1, 4, 2, 1000, 1000, 256)};
    spec.list_heads = 4;
    spec.seed = 9;
    const HeadWindowVariant variant{IdentityScore{}, 100, 90};
    check_case<__nv_bfloat16, 256>(spec, variant, variant);
  }
  {
    CaseSpec spec{"window(h) d64 per-head", square_problem(2, 4, 1, 1000, 1000, 64)};
    spec.list_heads = 4;
    spec.seed = 10;
    const HeadWindowVariant variant{IdentityScore{}, 64, 150};
    check_case<__nv_bfloat16, 64>(spec, variant, variant);
  }
  {
    CaseSpec spec{"holes (masked rows) gqa4", square_problem(1, 8, 2, 333, 517, 64)};
    spec.seed = 11;
    check_case<__nv_bfloat16, 64>(spec, HolesVariant{}, HolesVariant{});
  }
  {
    const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    DeviceBuffer<float> device_slopes(slopes.size());
    device_slopes.upload(slopes);
    CaseSpec spec{"alibi causal bhtd", square_problem(2, 4, 4, 500, 500, 128)};
    spec.layout = Layout::kBHTD;
    spec.seed = 12;
    check_case<__half, 128>(spec, AlibiCausalVariant{slopes.data()}, AlibiCausalVariant{device_slopes.get()});
  }
  {
    CaseSpec spec{"causal fp16 bhtd gqa2", square_problem(1, 4, 2, 640, 640, 256)};
    spec.layout = Layout::kBHTD;
    spec.seed = 13;
    check_case<__half, 256>(spec, CausalVariant{}, CausalVariant{});
  }
  // The mask's column parts staged in shared memory (the 64 KB forward and the
  // backward have room: portable_stage_bytes), then worked out per element
  // (the 32 KB head_dim 64 forward and 48.5 KB backward have none).
  check_documents<__nv_bfloat16, 128>("documents staged gqa4", 2, 8, 2, 1000, 17);
  check_documents<__nv_bfloat16, 64>("documents unstaged d64", 1, 4, 2, 777, 18);
  // The sm_120 default configs (their forwards differ), run here on this device.
  {
    CaseSpec spec{"sm120 cfg: causal odd", square_problem(1, 4, 2, 999, 999, 64)};
    spec.seed = 14;
    check_case<__nv_bfloat16, 64, 120>(spec, CausalVariant{}, CausalVariant{});
  }
  check_dflash<__nv_bfloat16, 128, 120>("sm120 cfg: dflash gqa4", 1, 8, 2, 40, 600, 4, 15);
  {
    CaseSpec spec{"sm120 cfg: softcap causal", square_problem(1, 4, 2, 555, 555, 256)};
    spec.problem.scale = 0.25;
    spec.seed = 16;
    check_case<__nv_bfloat16, 256, 120>(spec, SoftcapCausalVariant{15.f}, SoftcapCausalVariant{15.f});
  }
  check_documents<__nv_bfloat16, 128, 120>("sm120 cfg: documents", 1, 4, 2, 555, 19);
  // The sweep's candidates for sm_120 that are not defaults: the forwards with
  // 32-key tiles (three and two blocks per SM), the 32 x 32 backward (two).
  struct Sm120Candidates {
    using Forward = AttentionForwardConfig<__nv_bfloat16, 128, 64, 32, 4>;
    using Backward = AttentionBackwardConfig<__nv_bfloat16, 128, 32, 32, 4, 32>;
  };
  struct Sm120WideCandidates {
    using Forward = AttentionForwardConfig<__nv_bfloat16, 128, 128, 32, 8>;
    using Backward = AttentionBackwardConfig<__nv_bfloat16, 128, 32, 32, 4, 32>;
  };
  check_dflash<__nv_bfloat16, 128, 120, Sm120Candidates>("candidates: dflash gqa4", 1, 8, 2, 40, 600, 4, 15);
  check_documents<__nv_bfloat16, 128, 120, Sm120Candidates>("candidates: documents", 1, 4, 2, 555, 19);
  check_dflash<__nv_bfloat16, 128, 120, Sm120WideCandidates>("candidates 128x32: dflash", 1, 8, 2, 40, 600, 4, 15);
  // The forward pipelines that are not defaults, at sm_120's tiles.
  check_forward_pipeline<128, 64, ForwardPipeline::kRegisterQuery>("candidates Q regs");
  check_forward_pipeline<64, 64, ForwardPipeline::kSharedQueryEarlyKey>("candidates d64 early K");
  check_forward_pipeline<64, 128, ForwardPipeline::kSharedQueryEarlyKey>("candidates d64 128 keys early K");
  // 128 x 64 over 8 warps, one block per sm_120 SM (the sweep's).
  check_forward_pipeline<128, 64, ForwardPipeline::kSharedQuery, 128, 8>("candidates 128x64 w8");
  check_forward_pipeline<128, 64, ForwardPipeline::kSharedQueryEarlyKey, 128, 8>("candidates 128x64 w8 early K");
  // 128 x 32 over 4 warps (32 rows a warp), two blocks per sm_120 SM (the sweep's).
  check_forward_pipeline<128, 32, ForwardPipeline::kSharedQuery, 128, 4>("candidates 128x32 w4");
  check_forward_pipeline<128, 32, ForwardPipeline::kSharedQueryEarlyKey, 128, 4>("candidates 128x32 w4 early K");
  // sm_120's head_dim 256 and 64 forwards on more masks than the sm120 cfg cases above.
  check_forward_pipeline<256, 32, ForwardPipeline::kRegisterQuery>("sm120 cfg d256");
  check_forward_pipeline<64, 128, ForwardPipeline::kRegisterQuery>("sm120 cfg d64");
  // dQ without the fp32 accumulator (attention_backward_grad_q_pass_kernel).
  struct Sm120GradQPass {
    using Forward = AttentionForwardConfig<__nv_bfloat16, 128, 64, 64, 4>;
    using Backward = AttentionBackwardConfig<__nv_bfloat16, 128, 64, 64, 8, 32>;
    using Kernels = PortableGradQPassKernels<Forward, Backward>;
  };
  check_dflash<__nv_bfloat16, 128, 120, Sm120GradQPass>("dQ pass: dflash gqa4", 1, 8, 2, 40, 600, 4, 15);
  check_documents<__nv_bfloat16, 128, 120, Sm120GradQPass>("dQ pass: documents", 1, 4, 2, 555, 19);
  {
    CaseSpec spec{"candidates: causal odd", square_problem(1, 8, 2, 777, 777, 128)};
    spec.seed = 2;
    check_case<__nv_bfloat16, 128, 120, Sm120Candidates>(spec, CausalVariant{}, CausalVariant{});
    spec.name = "candidates 128x32: causal odd";
    check_case<__nv_bfloat16, 128, 120, Sm120WideCandidates>(spec, CausalVariant{}, CausalVariant{});
    spec.name = "dQ pass: causal odd";
    check_case<__nv_bfloat16, 128, 120, Sm120GradQPass>(spec, CausalVariant{}, CausalVariant{});
    spec.name = "dQ pass: softcap odd";
    spec.problem = square_problem(1, 4, 2, 555, 555, 128);
    check_case<__nv_bfloat16, 128, 120, Sm120GradQPass>(spec, SoftcapCausalVariant{15.f}, SoftcapCausalVariant{15.f});
  }
}

// ---------------------------------------------------------------------------
// Reference self-test: analytic gradients of L = sum(O * dO) against central
// differences of the reference forward.

template <class Variant>
double reference_gradient_error(const Problem& p, const Variant& variant, unsigned long long seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  AttentionInputs in;
  for (auto* x : {&in.q, &in.grad_o}) {
    x->resize(p.q_elements());
    for (auto& e : *x) e = normal(rng);
  }
  for (auto* x : {&in.k, &in.v}) {
    x->resize(p.kv_elements());
    for (auto& e : *x) e = normal(rng);
  }
  const AttentionOutputs analytic = reference_attention(p, variant, in);
  auto loss = [&](const AttentionInputs& x) {
    const AttentionOutputs out = reference_attention(p, variant, x, false);
    double l = 0;
    for (size_t i = 0; i < out.o.size(); ++i) l += out.o[i] * x.grad_o[i];
    return l;
  };
  double worst = 0;
  const double step = 1e-3;
  struct Target {
    std::vector<double> AttentionInputs::*input;
    const std::vector<double>* gradient;
  };
  const Target targets[] = {{&AttentionInputs::q, &analytic.grad_q},
                            {&AttentionInputs::k, &analytic.grad_k},
                            {&AttentionInputs::v, &analytic.grad_v}};
  for (const Target& target : targets) {
    const std::vector<double>& gradient = *target.gradient;
    double scale = 0;
    for (double g : gradient) scale = std::max(scale, std::abs(g));
    for (size_t i = 0; i < gradient.size(); i += 7) {
      AttentionInputs plus = in, minus = in;
      (plus.*target.input)[i] += step;
      (minus.*target.input)[i] -= step;
      const double numeric = (loss(plus) - loss(minus)) / (2 * step);
      worst = std::max(worst, std::abs(numeric - gradient[i]) / scale);
    }
  }
  return worst;
}

void run_self_test() {
  const Problem p{1, 4, 2, 23, 29, 8, 0.7};
  const double softcap = reference_gradient_error(p, SoftcapCausalVariant{2.f}, 21);
  const double holes = reference_gradient_error(p, HolesVariant{}, 22);
  // The score_mod runs in float: ~1e-7 relative noise over a 1e-3 step. A wrong
  // formula shows up as errors of order 1e-1 and more.
  const double bound = 2e-3;
  const bool pass = softcap <= bound && holes <= bound;
  std::printf("Reference self-test (central differences, max error / max |grad|): softcap %.2e, holes %.2e: %s\n",
              softcap, holes, pass ? "PASS" : "FAIL");
  if (!pass) ++g_failures;
}

// ---------------------------------------------------------------------------
// Timing

template <class Variant>
long long count_visible_pairs(const Variant& variant, int batches, int heads, int q_len, int kv_len) {
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<long long> partial(workers, 0);
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (long long row = w; row < static_cast<long long>(batches) * heads * q_len; row += workers) {
        const int q = static_cast<int>(row % q_len);
        const int h = static_cast<int>((row / q_len) % heads);
        const int b = static_cast<int>(row / (static_cast<long long>(q_len) * heads));
        for (int kv = 0; kv < kv_len; ++kv) partial[w] += variant.mask(b, h, q, kv) ? 1 : 0;
      }
    });
  }
  for (auto& t : threads) t.join();
  long long total = 0;
  for (long long x : partial) total += x;
  return total;
}

float median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// A timing problem: shape, shared inputs and the visible pair count.
template <class Variant>
struct TimingProblem {
  std::string name;
  Problem problem;
  int list_batches;
  Variant host_variant;
  Variant device_variant;
  AttentionInputs inputs;
  long long visible_pairs;
};

template <class Variant>
TimingProblem<Variant> make_timing_problem(const std::string& name, const Problem& p, int list_batches,
                                           const Variant& host_variant, const Variant& device_variant) {
  TimingProblem<Variant> t{name, p, list_batches, host_variant, device_variant, {}, 0};
  std::mt19937_64 rng(99);
  t.inputs.q = random_values<__nv_bfloat16>(p.q_elements(), 1.0, rng);
  t.inputs.k = random_values<__nv_bfloat16>(p.kv_elements(), 1.0, rng);
  t.inputs.v = random_values<__nv_bfloat16>(p.kv_elements(), 1.0, rng);
  t.inputs.grad_o = random_values<__nv_bfloat16>(p.q_elements(), 1.0, rng);
  t.visible_pairs = count_visible_pairs(host_variant, list_batches, 1, p.q_len, p.kv_len) *
                    (p.batch / list_batches) * p.q_heads;
  const double visible_fraction =
      static_cast<double>(t.visible_pairs) / (static_cast<double>(p.batch) * p.q_heads * p.q_len * p.kv_len);
  std::printf("%s: B=%d Hq/Hkv=%d/%d Tq=%d Tk=%d D=%d, %.1f%% of pairs visible\n", name.c_str(), p.batch, p.q_heads,
              p.kv_heads, p.q_len, p.kv_len, p.head_dim, 100 * visible_fraction);
  return t;
}

template <class Kernels, class Variant>
void time_kernels(const TimingProblem<Variant>& t, Layout layout = Layout::kBTHD) {
  using Run = AttentionRun<Kernels>;
  using Forward = typename Kernels::Forward;
  using Backward = typename Kernels::Backward;
  if (t.name.find(g_filter) == std::string::npos) return;
  const Problem& p = t.problem;
  const auto build_start = std::chrono::steady_clock::now();
  const HostTileList forward_tiles = build_tile_list(t.host_variant, TileRows::kQuery, t.list_batches, 1, p.q_len,
                                                     p.kv_len, Forward::kBlockM, Forward::kBlockN);
  const HostTileList backward_tiles = build_tile_list(t.host_variant, TileRows::kKey, t.list_batches, 1, p.q_len,
                                                      p.kv_len, Backward::kBlockM, Backward::kBlockN);
  const double build_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - build_start).count();
  Run run(p, layout, t.inputs, forward_tiles, backward_tiles);

  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  auto time_ms = [&](auto&& body) {
    CUDA_CHECK(cudaEventRecord(start));
    body();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  };
  for (int i = 0; i < 5; ++i) {
    run.forward(t.device_variant);
    run.backward(t.device_variant);
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  const int kRepeats = 20;
  std::vector<float> forward_ms, backward_ms, total_ms;
  for (int i = 0; i < kRepeats; ++i) forward_ms.push_back(time_ms([&] { run.forward(t.device_variant); }));
  for (int i = 0; i < kRepeats; ++i) backward_ms.push_back(time_ms([&] { run.backward(t.device_variant); }));
  for (int i = 0; i < kRepeats; ++i) {
    total_ms.push_back(time_ms([&] {
      run.forward(t.device_variant);
      run.backward(t.device_variant);
    }));
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));

  const double fwd = median(forward_ms), bwd = median(backward_ms), total = median(total_ms);
  const double flop_fwd = 4.0 * p.head_dim * static_cast<double>(t.visible_pairs);
  const double empty_fraction =
      1.0 - static_cast<double>(forward_tiles.full_tiles + forward_tiles.partial_tiles) / forward_tiles.all_tiles;
  std::printf("  %-22s %-22s fwd %6.3f ms (%3.0f TFLOP/s) | bwd %6.3f ms | fwd+bwd %6.3f ms (%3.0f TFLOP/s) | "
              "fwd tiles %.1f%% empty, lists %.0f ms%s\n",
              Kernels::forward_label().c_str(), Kernels::backward_label().c_str(), fwd, flop_fwd / fwd * 1e-9, bwd,
              total, 3.5 * flop_fwd / total * 1e-9, 100 * empty_fraction, build_ms,
              layout == Layout::kBHTD ? ", bhtd" : "");
  std::fflush(stdout);
}

// DFlash training shape: 512 anchors x 16 queries over a context of 8192.
template <class Body>
void with_dflash_timing_problem(Body&& body) {
  const int blocks = 512, context_len = 8192;
  std::mt19937_64 rng(2024);
  const std::vector<int> anchors = make_anchors(1, blocks, 1, context_len, 0, rng);
  DeviceBuffer<int> device_anchors(anchors.size());
  device_anchors.upload(anchors);
  DFlashVariant host_variant;
  host_variant.anchors = anchors.data();
  host_variant.blocks = blocks;
  host_variant.context_len = context_len;
  DFlashVariant device_variant = host_variant;
  device_variant.anchors = device_anchors.get();
  const Problem p{1, 32, 8, blocks * 16, context_len + blocks * 16, 128, 1.0 / std::sqrt(128.0)};
  body(make_timing_problem("dflash 512 anchors x 16, context 8192", p, 1, host_variant, device_variant));
}

// Documents of 40 to 800 tokens packed into 8192 (bench/attention_bench.py's
// document mask), the same in every head: most query tiles see one to three
// key tiles, most of them partial.
template <class Body>
void with_document_timing_problem(Body&& body) {
  const int length = 8192;
  std::mt19937_64 rng(2025);
  std::vector<int> ids(2 * length);  // DocumentVariant's two layouts, equal here
  pack_documents(ids.data(), length, 40, 800, rng);
  std::copy(ids.begin(), ids.begin() + length, ids.begin() + length);
  DeviceBuffer<int> device_ids(ids.size());
  device_ids.upload(ids);
  body(make_timing_problem("documents of 40-800 tokens, 8192", square_problem(1, 32, 8, length, length, 128), 1,
                           DocumentVariant{IdentityScore{}, ids.data(), length},
                           DocumentVariant{IdentityScore{}, device_ids.get(), length}));
}

// Causal attention over 8192 tokens, batch 1.
TimingProblem<CausalVariant> causal_timing_problem(const std::string& name, int q_heads, int kv_heads, int head_dim) {
  return make_timing_problem(name, square_problem(1, q_heads, kv_heads, 8192, 8192, head_dim), 1, CausalVariant{},
                             CausalVariant{});
}

void print_timing_header() {
  std::printf("Timing: medians of 20 runs after 5 warm-ups (CUDA events); TFLOP/s count visible pairs only\n"
              "(4*D per pair and head forward, 3.5x that forward+backward).\n");
}

#ifdef DFLEX_TEST_SM90
bool sm90_selected() { return g_run_sm90 && g_sm90_device; }
#endif

// The default kernels of every selected implementation on one timing problem;
// under --sm120-occupancy the portable kernels with sm_120's configs.
template <int kHeadDim, class Variant>
void time_defaults(const TimingProblem<Variant>& t, Layout layout = Layout::kBTHD) {
  using Defaults = DefaultAttentionConfigs<__nv_bfloat16, kHeadDim>;
  using Sm120Defaults = DefaultAttentionConfigs<__nv_bfloat16, kHeadDim, 120>;
  if (g_run_portable && g_sm120_occupancy) {
    time_kernels<PortableKernels<typename Sm120Defaults::Forward, typename Sm120Defaults::Backward>>(t, layout);
  } else if (g_run_portable) {
    time_kernels<PortableKernels<typename Defaults::Forward, typename Defaults::Backward>>(t, layout);
  }
#ifdef DFLEX_TEST_SM90
  if (sm90_selected()) time_kernels<DefaultSm90Kernels<__nv_bfloat16, kHeadDim>>(t, layout);
#endif
}

void run_timing() {
  print_timing_header();
  // Each shape with [B, T, H, D] tensors and with [B, H, T, D] ones (the bench's).
  with_dflash_timing_problem([](const auto& t) {
    time_defaults<128>(t);
    time_defaults<128>(t, Layout::kBHTD);
  });
  const auto causal = causal_timing_problem("causal 8192", 32, 8, 128);
  time_defaults<128>(causal);
  time_defaults<128>(causal, Layout::kBHTD);
  const auto wide = causal_timing_problem("causal 8192 d256", 16, 4, 256);
  time_defaults<256>(wide);
  time_defaults<256>(wide, Layout::kBHTD);
  with_document_timing_problem([](const auto& t) { time_defaults<128>(t); });
  time_defaults<128>(make_timing_problem("sliding window 1000, 8192", square_problem(1, 32, 8, 8192, 8192, 128), 1,
                                         HeadWindowVariant{{}, 1000, 0}, HeadWindowVariant{{}, 1000, 0}));
}

// Candidate configs on the DFlash shape, the defaults first; portable backward
// dQ chunks also on causal 8192 at head_dim 128 and 256; sm_120's head_dim 64 forward pipelines.
void run_sweep() {
  using Element = __nv_bfloat16;
  constexpr ForwardPipeline EarlyKey = ForwardPipeline::kSharedQueryEarlyKey;
  constexpr ForwardPipeline RegisterQuery = ForwardPipeline::kRegisterQuery;
  using Defaults = DefaultAttentionConfigs<Element, 128>;
  print_timing_header();
  with_dflash_timing_problem([](const auto& t) {
    if (g_run_portable) {
      time_kernels<PortableKernels<Defaults::Forward, Defaults::Backward>>(t);
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 64, 64, 4>, Defaults::Backward>>(t);
      // The other forward pipelines (ForwardPipeline).
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 64, 64, 4, EarlyKey>, Defaults::Backward>>(t);
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 64, 4, EarlyKey>, Defaults::Backward>>(t);
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 64, 64, 4, RegisterQuery>, Defaults::Backward>>(t);
      // 128 query rows over 8 warps (16 rows each, as sm_120's 64 x 64): one block per sm_120 SM
      // that loads each key tile once for 128 rows, the shape mma.sync flex's autotuning picks.
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 64, 8>, Defaults::Backward>>(t);
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 64, 8, EarlyKey>, Defaults::Backward>>(t);
      // 32-key tiles: 32 KB of shared memory, three blocks per SM on sm_120 where registers allow.
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 64, 32, 4>, Defaults::Backward>>(t);
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 32, 8>, Defaults::Backward>>(t);
      // 128 x 32 over 4 warps (32 rows each), 48 KB: two blocks per sm_120 SM, each key
      // fragment read from shared memory serving twice the rows of the 64 x 64 default.
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 32, 4>, Defaults::Backward>>(t);
      time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 32, 4, EarlyKey>, Defaults::Backward>>(t);
      time_kernels<PortableKernels<Defaults::Forward, AttentionBackwardConfig<Element, 128, 64, 64, 8, 16>>>(t);
      time_kernels<PortableKernels<Defaults::Forward, AttentionBackwardConfig<Element, 128, 64, 64, 4, 16>>>(t);
      time_kernels<PortableKernels<Defaults::Forward, AttentionBackwardConfig<Element, 128, 64, 64, 4, 32>>>(t);
      // No dQ accumulator: the main kernel without dQ, then the dQ pass (forward tiles).
      time_kernels<PortableGradQPassKernels<AttentionForwardConfig<Element, 128, 64, 64, 4>, Defaults::Backward>>(t);
      time_kernels<PortableGradQPassKernels<AttentionForwardConfig<Element, 128, 64, 32, 4>, Defaults::Backward>>(t);
      // 36 KB of shared memory: two blocks per SM on sm_120.
      time_kernels<PortableKernels<Defaults::Forward, AttentionBackwardConfig<Element, 128, 32, 32, 4, 32>>>(t);
    }
#ifdef DFLEX_TEST_SM90
    if (sm90_selected()) {
      using Sm90 = Sm90AttentionConfigs<Element, 128>;
      time_kernels<Sm90Kernels<Sm90::Forward, Sm90::Backward>>(t);
      time_kernels<Sm90Kernels<Sm90AttentionForwardConfig<Element, 128, 128, 3>, Sm90::Backward>>(t);
      time_kernels<Sm90Kernels<Sm90AttentionForwardConfig<Element, 128, 64, 2>, Sm90::Backward>>(t);
      // sm90 forward with the portable backward: isolates the two passes.
      time_kernels<Sm90Kernels<Sm90::Forward, Defaults::Backward>>(t);
    }
#endif
  });
  if (!g_run_portable) return;
  const auto causal_problem = causal_timing_problem("causal 8192", 32, 8, 128);
  time_kernels<PortableKernels<Defaults::Forward, Defaults::Backward>>(causal_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 64, 64, 4>, Defaults::Backward>>(causal_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 64, 64, 4, EarlyKey>, Defaults::Backward>>(
      causal_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 64, 64, 4, RegisterQuery>, Defaults::Backward>>(
      causal_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 64, 8>, Defaults::Backward>>(causal_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 64, 8, EarlyKey>, Defaults::Backward>>(
      causal_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 32, 4>, Defaults::Backward>>(causal_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 128, 128, 32, 4, EarlyKey>, Defaults::Backward>>(
      causal_problem);
  time_kernels<PortableKernels<Defaults::Forward, AttentionBackwardConfig<Element, 128, 64, 64, 8, 16>>>(
      causal_problem);
  time_kernels<PortableGradQPassKernels<AttentionForwardConfig<Element, 128, 64, 64, 4>, Defaults::Backward>>(
      causal_problem);
  using Wide = DefaultAttentionConfigs<Element, 256>;
  const auto wide_problem = causal_timing_problem("causal 8192 d256", 16, 4, 256);
  time_kernels<PortableKernels<Wide::Forward, Wide::Backward>>(wide_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 256, 64, 32, 4>, Wide::Backward>>(wide_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 256, 64, 32, 4, RegisterQuery>, Wide::Backward>>(
      wide_problem);
  time_kernels<PortableKernels<Wide::Forward, AttentionBackwardConfig<Element, 256, 32, 32, 4, 32>>>(wide_problem);
  // head_dim 64 (prefix_lm's): sm_120's forward (64 x 128, Q in registers) against
  // early K with 64 and 128 keys.
  using Narrow = DefaultAttentionConfigs<Element, 64, 120>;
  const auto narrow_problem = causal_timing_problem("causal 8192 d64", 16, 16, 64);
  time_kernels<PortableKernels<Narrow::Forward, Narrow::Backward>>(narrow_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 64, 64, 64, 4, EarlyKey>, Narrow::Backward>>(
      narrow_problem);
  time_kernels<PortableKernels<AttentionForwardConfig<Element, 64, 64, 128, 4, EarlyKey>, Narrow::Backward>>(
      narrow_problem);
}

}  // namespace

int main(int argc, char** argv) {
  bool self_test = false, check = false, timing = false, sweep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--self-test") {
      self_test = true;
    } else if (arg == "--check") {
      check = true;
    } else if (arg == "--time") {
      timing = true;
    } else if (arg == "--sweep") {
      sweep = true;
    } else if (arg == "--sm120-occupancy") {
      g_sm120_occupancy = true;
    } else if (arg == "--row-kernel-candidates") {
      g_row_kernel_candidates = true;
    } else if (arg == "--filter" && i + 1 < argc) {
      g_filter = argv[++i];
    } else if (arg == "--impl" && i + 1 < argc) {
      const std::string impl = argv[++i];
      if (impl != "portable" && impl != "sm90" && impl != "all") {
        std::fprintf(stderr, "--impl: expected portable, sm90 or all, got '%s'\n", impl.c_str());
        return 2;
      }
      g_run_portable = impl != "sm90";
      g_run_sm90 = impl != "portable";
    } else {
      std::fprintf(stderr,
                   "usage: %s [--self-test] [--check] [--time] [--sweep] [--filter NAME_PART]\n"
                   "          [--impl portable|sm90|all] [--sm120-occupancy] [--row-kernel-candidates]\n"
                   "  (no mode: self-test, check and time; --impl: default all)\n",
                   argv[0]);
      return 2;
    }
  }
  if (!self_test && !check && !timing && !sweep) self_test = check = timing = true;
  if (self_test) run_self_test();
  if (check || timing || sweep) {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp properties{};
    CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    std::printf("Device: %s, sm_%d%d, %d SMs\n", properties.name, properties.major, properties.minor,
                properties.multiProcessorCount);
    g_device_shared_per_sm = static_cast<int>(properties.sharedMemPerMultiprocessor);
    if (g_sm120_occupancy) std::printf("Blocks per SM as on sm_120 (shared memory padded)\n");
    if (g_row_kernel_candidates) {
      std::printf("Row kernels: the candidates, %d rows a warp\n", row_kernel_candidates::kRowsPerWarp);
    }
#ifdef DFLEX_TEST_SM90
    g_sm90_device = properties.major == 9 && properties.minor == 0;
    if (g_run_sm90 && !g_sm90_device) {
      if (!g_run_portable) {
        std::fprintf(stderr, "--impl sm90: the device is not sm_90\n");
        return 2;
      }
      std::printf("sm90 kernels: skipped (not an sm_90 device)\n");
    }
#else
    if (g_run_sm90 && !g_run_portable) {
      std::fprintf(stderr, "--impl sm90: this build has no sm_90a code (build with ARCH=sm_90a)\n");
      return 2;
    }
#endif
  }
  if (check) run_checks();
  if (timing) run_timing();
  if (sweep) run_sweep();
  if (g_failures > 0) {
    std::printf("%d check(s) FAILED\n", g_failures);
    return 1;
  }
  std::printf("all checks passed\n");
  return 0;
}
