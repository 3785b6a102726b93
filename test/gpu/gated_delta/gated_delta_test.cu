// Standalone GPU correctness and timing harness of the dflex chunked
// gated-delta-rule kernel templates (kernels/gated_delta). Modes (default:
// all three, in this order):
//   --self-test  CPU only: the float64 sequential reference's gradients against
//                finite differences, and the float64 chunked decomposition (the
//                kernels' algebra) against the sequential reference
//   --check      forward + backward on random inputs for a set of variants
//                (dims 64/128, grouped heads, varlen with lengths 1..1000, gate
//                kinds, delta rule on/off, in-kernel gate, states, strided rows)
//                against the float64 sequential reference
//   --time       the baseline shapes (d = 128, q/k L2-normalised): fwd and fwd+bwd medians and
//                per-kernel medians (FLA's side: bench/gdn_fla_bench.py, same machine and call)
//   --shape BxTxH  time this shape instead of the baseline ones (repeatable; implies --time)
//   --filter TEXT  only the checks whose name contains TEXT (implies --check)
// Error metric, per tensor: max |x - ref| / max |ref|; a check passes when it
// is <= 1e-2 for every tensor and no element is NaN (outputs, gradients and
// the workspace are poisoned with NaN before each run). Exception: dA_log and
// d dt_bias are per-head sums over all tokens whose terms cancel (a sum can be
// 15x smaller than the sum of its terms' sizes), so bf16 inputs alone move
// them by ~1% of their value; for these two the metric is
// max |x - ref| / max (sum over tokens of |term|), and the plain relative
// error is printed beside it.
// Exit status 0 only when every check passes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gated_delta/gated_delta.cuh"
#include "../common/cuda_util.h"
#include "reference.h"

namespace {

using namespace gated_delta_test;
using dflex::kernels::GateKind;
using dflex::kernels::GatedDeltaConfig;
using dflex::kernels::GatedDeltaParams;
using dflex::kernels::GatedDeltaWorkspace;
using dflex::kernels::GatedDeltaWorkspaceSizes;

constexpr double kTolerance = 1e-2;

using bf16 = __nv_bfloat16;

double round_bf16(double x) { return __bfloat162float(__float2bfloat16(static_cast<float>(x))); }
double round_float(double x) { return static_cast<float>(x); }

// ---------------------------------------------------------------------------
// Launching: the sequence of kernels a launcher runs for one configuration.

template <class Config>
struct Launcher {
  static constexpr int kThreads = Config::kThreads;

  static void configure() {
    static bool done = false;
    if (done) return;
    using namespace dflex::kernels;
    const auto set = [](const void* kernel, int bytes) {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    };
    set(reinterpret_cast<const void*>(gated_delta_forward_prepare_kernel<Config>), Config::ForwardPrepare::kBytes);
    set(reinterpret_cast<const void*>(gated_delta_forward_state_kernel<Config>), Config::ForwardState::kBytes);
    set(reinterpret_cast<const void*>(gated_delta_forward_output_kernel<Config>), Config::ForwardOutput::kBytes);
    set(reinterpret_cast<const void*>(gated_delta_backward_prepare_kernel<Config>), Config::BackwardPrepare::kBytes);
    set(reinterpret_cast<const void*>(gated_delta_backward_state_kernel<Config>), Config::BackwardState::kBytes);
    set(reinterpret_cast<const void*>(gated_delta_backward_chunk_kernel<Config>), Config::BackwardChunk::kBytes);
    done = true;
  }

  // Launches of the forward; `between` is called after each launch (timing).
  template <class Between>
  static void forward(const GatedDeltaParams& p, Between&& between) {
    using namespace dflex::kernels;
    configure();
    const int hv = p.value_heads;
    if constexpr (Config::kVarlen) {
      gated_delta_chunk_table_kernel<Config><<<1, kChunkTableThreads>>>(p);
      CUDA_CHECK(cudaGetLastError());
    }
    gated_delta_forward_prepare_kernel<Config>
        <<<dim3(p.max_chunks, hv), kThreads, Config::ForwardPrepare::kBytes>>>(p);
    CUDA_CHECK(cudaGetLastError());
    between("fwd prepare");
    gated_delta_forward_state_kernel<Config>
        <<<dim3(Config::kValueDim / Config::kValueBlock, hv, p.num_sequences), Config::kStateThreads,
           Config::ForwardState::kBytes>>>(p);
    CUDA_CHECK(cudaGetLastError());
    between("fwd state");
    gated_delta_forward_output_kernel<Config>
        <<<dim3(p.max_chunks, hv), kThreads, Config::ForwardOutput::kBytes>>>(p);
    CUDA_CHECK(cudaGetLastError());
    between("fwd output");
  }

  template <class Between>
  static void backward(const GatedDeltaParams& p, Between&& between) {
    using namespace dflex::kernels;
    configure();
    const int hv = p.value_heads;
    const bool grouped = p.value_heads != p.key_heads;
    if (grouped) {
      const size_t bytes = static_cast<size_t>(p.total_tokens) * p.key_heads * Config::kKeyDim * sizeof(float);
      CUDA_CHECK(cudaMemsetAsync(p.workspace.grad_q_accum, 0, bytes));
      CUDA_CHECK(cudaMemsetAsync(p.workspace.grad_k_accum, 0, bytes));
    }
    gated_delta_backward_prepare_kernel<Config>
        <<<dim3(p.max_chunks, hv), kThreads, Config::BackwardPrepare::kBytes>>>(p);
    CUDA_CHECK(cudaGetLastError());
    between("bwd prepare");
    gated_delta_backward_state_kernel<Config>
        <<<dim3(Config::kValueDim / Config::kValueBlock, hv, p.num_sequences), Config::kStateThreads,
           Config::BackwardState::kBytes>>>(p);
    CUDA_CHECK(cudaGetLastError());
    between("bwd state");
    gated_delta_backward_chunk_kernel<Config>
        <<<dim3(p.max_chunks, hv), Config::kChunkBackwardThreads, Config::BackwardChunk::kBytes>>>(p);
    CUDA_CHECK(cudaGetLastError());
    between("bwd chunk");
    if (grouped) {
      const long long rows = static_cast<long long>(p.total_tokens) * p.key_heads;
      const int warps = kFinalizeThreads / 32;
      gated_delta_backward_finalize_kernel<Config>
          <<<static_cast<unsigned>((rows + warps - 1) / warps), kFinalizeThreads>>>(p);
      CUDA_CHECK(cudaGetLastError());
    }
    if constexpr (Config::kInKernelGate) {
      gated_delta_backward_gate_params_kernel<Config><<<hv, kFinalizeThreads>>>(p);
      CUDA_CHECK(cudaGetLastError());
    }
    between("bwd finalize");
  }
};

struct NoTiming {
  void operator()(const char*) const {}
};

// One allocation carved into the workspace buffers (256-byte aligned).
template <class Config>
class DeviceWorkspace {
 public:
  DeviceWorkspace(int sequences, int tokens, int key_heads, int value_heads, int max_chunks) {
    const GatedDeltaWorkspaceSizes z =
        dflex::kernels::gated_delta_workspace_sizes<Config>(sequences, tokens, key_heads, value_heads, max_chunks);
    const long long s[kBuffers] = {z.chunk_offsets, z.chunk_sequence,    z.gate_cumsum,  z.beta,
                                   z.w,             z.u,                 z.key_decay,    z.delta,
                                   z.t_inverse,     z.chunk_states,      z.grad_delta,   z.chunk_state_grads,
                                   z.grad_q_accum,  z.grad_k_accum,      z.gate_param_partials};
    long long total = 0;
    for (int i = 0; i < kBuffers; ++i) total += align(s[i]);
    storage_.allocate(static_cast<size_t>(total));
    unsigned char* base = storage_.get();
    void** slots[kBuffers] = {
        reinterpret_cast<void**>(&view_.chunk_offsets),   reinterpret_cast<void**>(&view_.chunk_sequence),
        reinterpret_cast<void**>(&view_.gate_cumsum),     reinterpret_cast<void**>(&view_.beta),
        reinterpret_cast<void**>(&view_.w),               reinterpret_cast<void**>(&view_.u),
        reinterpret_cast<void**>(&view_.key_decay),       reinterpret_cast<void**>(&view_.delta),
        reinterpret_cast<void**>(&view_.t_inverse),       reinterpret_cast<void**>(&view_.chunk_states),
        reinterpret_cast<void**>(&view_.grad_delta),      reinterpret_cast<void**>(&view_.chunk_state_grads),
        reinterpret_cast<void**>(&view_.grad_q_accum),    reinterpret_cast<void**>(&view_.grad_k_accum),
        reinterpret_cast<void**>(&view_.gate_param_partials)};
    long long offset = 0;
    for (int i = 0; i < kBuffers; ++i) {
      *slots[i] = s[i] > 0 ? base + offset : nullptr;
      offset += align(s[i]);
    }
  }
  const GatedDeltaWorkspace& view() const { return view_; }
  void poison() { storage_.poison(); }
  long long bytes() const { return static_cast<long long>(storage_.size()); }

 private:
  static constexpr int kBuffers = 15;
  static long long align(long long bytes) { return (bytes + 255) / 256 * 256; }
  DeviceBuffer<unsigned char> storage_;
  GatedDeltaWorkspace view_{};
};

// ---------------------------------------------------------------------------
// Correctness checks

struct Case {
  std::string name;
  int key_heads, value_heads;
  std::vector<int> lengths;  // varlen: one per sequence; otherwise `batch` copies of one length
  bool fused_qkv;            // q, k, v as column slices of one [T, 2 Hk Dk + Hv Dv] buffer
};

Inputs random_inputs(const Problem& p, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  Inputs in;
  const double qk_scale = p.qk_l2norm ? 1.0 : 1.0 / std::sqrt(static_cast<double>(p.key_dim));
  auto fill = [&](std::vector<double>& x, size_t count, double stddev, bool bf16_values) {
    x.resize(count);
    for (auto& e : x) e = bf16_values ? round_bf16(normal(rng) * stddev) : round_float(normal(rng) * stddev);
  };
  fill(in.q, p.qk_elements(), qk_scale, true);
  fill(in.k, p.qk_elements(), qk_scale, true);
  fill(in.v, p.v_elements(), 1.0, true);
  in.g.resize(p.gate_elements());
  for (auto& e : in.g) e = round_float(-std::log1p(std::exp(-normal(rng))));  // logsigmoid
  in.beta.resize(p.gate_elements());
  for (auto& e : in.beta) e = round_bf16(0.05 + 0.95 * uniform(rng));
  fill(in.a, p.gate_elements(), 1.0, true);
  fill(in.b, p.gate_elements(), 1.0, true);
  in.a_log.resize(p.value_heads);
  for (auto& e : in.a_log) e = round_float(-1.0 + 2.0 * uniform(rng));
  fill(in.dt_bias, p.value_heads, 0.5, false);
  fill(in.initial_state, p.state_elements(), 0.5, false);
  fill(in.grad_o, p.v_elements(), 1.0, true);
  fill(in.grad_final_state, p.state_elements(), 0.5, false);
  return in;
}

std::vector<bf16> to_bf16(const std::vector<double>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __float2bfloat16(static_cast<float>(x[i]));
  return out;
}
std::vector<float> to_float(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }
std::vector<double> widen(const std::vector<bf16>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __bfloat162float(x[i]);
  return out;
}
std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

struct Comparison {
  double error = 0;
  long long bad = 0;        // non-finite where the reference is finite
  double plain_error = -1;  // for sums of cancelling terms: max |x - ref| / max |ref|
};

// max |x - ref| / max |ref| over all elements.
Comparison compare(const std::vector<double>& got, const std::vector<double>& want) {
  Comparison c;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++c.bad;
      continue;
    }
    max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    max_ref = std::max(max_ref, std::abs(want[i]));
  }
  c.error = max_ref > 0 ? max_diff / max_ref : max_diff;
  return c;
}

// For per-head sums over tokens: the error relative to the size of the
// summed terms (`term_sizes`), with the plain metric kept beside it.
Comparison compare_sum(const std::vector<double>& got, const std::vector<double>& want,
                       const std::vector<double>& term_sizes) {
  Comparison c = compare(got, want);
  c.plain_error = c.error;
  double max_diff = 0, max_terms = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isfinite(got[i])) max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    max_terms = std::max(max_terms, term_sizes[i]);
  }
  c.error = max_terms > 0 ? max_diff / max_terms : max_diff;
  return c;
}

template <class T>
std::vector<double> download_prefix(const T* device, size_t count) {
  std::vector<T> host(count);
  CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  return widen(host);
}

// After a failed check: the workspace against the float64 chunked
// decomposition, buffer by buffer, to point at the kernel that went wrong.
template <class Config>
void report_intermediates(const Problem& p, const Inputs& in, const GatedDeltaWorkspace& ws) {
  Intermediates want;
  reference_chunked(p, in, true, &want);
  const size_t chunks = want.t_inverse.size() / (static_cast<size_t>(p.value_heads) * kChunk * kChunk);
  std::string line = "      workspace vs chunked reference:";
  char cell[64];
  auto add = [&](const char* name, const std::vector<double>& got, const std::vector<double>& ref) {
    const Comparison c = compare(got, ref);
    if (c.bad > 0) {
      std::snprintf(cell, sizeof(cell), " %s=!%lld", name, c.bad);
    } else {
      std::snprintf(cell, sizeof(cell), " %s=%.1e", name, c.error);
    }
    line += cell;
  };
  add("gate_cumsum", download_prefix(ws.gate_cumsum, want.gate_cumsum.size()), want.gate_cumsum);
  add("key_decay", download_prefix(ws.key_decay, want.key_decay.size()), want.key_decay);
  if (Config::kDeltaRule) {
    add("T", download_prefix(ws.t_inverse, chunks * p.value_heads * kChunk * kChunk), want.t_inverse);
    add("W", download_prefix(ws.w, want.w.size()), want.w);
    add("U", download_prefix(ws.u, want.u.size()), want.u);
    add("delta", download_prefix(ws.delta, want.delta.size()), want.delta);
    add("ddelta", download_prefix(ws.grad_delta, want.grad_delta.size()), want.grad_delta);
  }
  add("states", download_prefix(ws.chunk_states, want.chunk_states.size()), want.chunk_states);
  add("dstates", download_prefix(ws.chunk_state_grads, want.chunk_state_grads.size()), want.chunk_state_grads);
  std::printf("%s\n", line.c_str());
}

template <class Config>
bool run_check(const Case& c, std::mt19937_64& rng, const std::string& filter) {
  if (c.name.find(filter) == std::string::npos) return true;
  Problem p;
  p.key_dim = Config::kKeyDim;
  p.value_dim = Config::kValueDim;
  p.key_heads = c.key_heads;
  p.value_heads = c.value_heads;
  p.lengths = c.lengths;
  p.gate = Config::kHasGate;
  p.delta_rule = Config::kDeltaRule;
  p.qk_l2norm = Config::kQkL2Norm;
  p.in_kernel_gate = Config::kInKernelGate;
  p.initial_state = Config::kInitialState;
  p.final_state = Config::kFinalState;
  p.scale = 1.0 / std::sqrt(static_cast<double>(p.key_dim));
  if (!Config::kVarlen) {
    for (int length : p.lengths)
      if (length != p.lengths[0]) {
        std::fprintf(stderr, "%s: fixed-length case with unequal lengths\n", c.name.c_str());
        std::exit(2);
      }
  }
  const Inputs in = random_inputs(p, rng);
  const Outputs ref = reference_sequential(p, in, true);

  const int tokens = p.tokens(), sequences = p.sequences(), dk = p.key_dim, dv = p.value_dim;
  const int hk = p.key_heads, hv = p.value_heads;
  const int max_chunks =
      dflex::kernels::gated_delta_max_chunks(Config::kVarlen, sequences, p.lengths[0], tokens);

  // q, k, v: separate [T, H, D] buffers, or column slices of one fused buffer.
  const long long qk_width = static_cast<long long>(hk) * dk, v_width = static_cast<long long>(hv) * dv;
  const long long fused_stride = 2 * qk_width + v_width;
  DeviceBuffer<bf16> q_buffer, k_buffer, v_buffer, fused;
  const bf16 *q_ptr, *k_ptr, *v_ptr;
  long long q_stride = qk_width, k_stride = qk_width, v_stride = v_width;
  if (c.fused_qkv) {
    std::vector<double> packed(static_cast<size_t>(tokens) * fused_stride);
    for (int t = 0; t < tokens; ++t) {
      for (long long i = 0; i < qk_width; ++i) {
        packed[t * fused_stride + i] = in.q[t * qk_width + i];
        packed[t * fused_stride + qk_width + i] = in.k[t * qk_width + i];
      }
      for (long long i = 0; i < v_width; ++i) packed[t * fused_stride + 2 * qk_width + i] = in.v[t * v_width + i];
    }
    fused.allocate(packed.size());
    fused.upload(to_bf16(packed));
    q_ptr = fused.get();
    k_ptr = fused.get() + qk_width;
    v_ptr = fused.get() + 2 * qk_width;
    q_stride = k_stride = v_stride = fused_stride;
  } else {
    q_buffer.allocate(in.q.size());
    k_buffer.allocate(in.k.size());
    v_buffer.allocate(in.v.size());
    q_buffer.upload(to_bf16(in.q));
    k_buffer.upload(to_bf16(in.k));
    v_buffer.upload(to_bf16(in.v));
    q_ptr = q_buffer.get();
    k_ptr = k_buffer.get();
    v_ptr = v_buffer.get();
  }
  DeviceBuffer<float> g(in.g.size()), a_log(hv), dt_bias(hv), initial(in.initial_state.size()),
      grad_final(in.grad_final_state.size());
  DeviceBuffer<bf16> beta(in.beta.size()), a(in.a.size()), b(in.b.size()), grad_o(in.grad_o.size());
  g.upload(to_float(in.g));
  a_log.upload(to_float(in.a_log));
  dt_bias.upload(to_float(in.dt_bias));
  initial.upload(to_float(in.initial_state));
  grad_final.upload(to_float(in.grad_final_state));
  beta.upload(to_bf16(in.beta));
  a.upload(to_bf16(in.a));
  b.upload(to_bf16(in.b));
  grad_o.upload(to_bf16(in.grad_o));
  std::vector<int> offsets(sequences + 1, 0);
  for (int n = 0; n < sequences; ++n) offsets[n + 1] = offsets[n] + p.lengths[n];
  DeviceBuffer<int> cu_seqlens(offsets.size());
  cu_seqlens.upload(offsets);

  DeviceBuffer<bf16> o(p.v_elements()), grad_q(p.qk_elements()), grad_k(p.qk_elements()), grad_v(p.v_elements());
  DeviceBuffer<float> final_state(p.state_elements()), grad_initial(p.state_elements());
  DeviceBuffer<float> grad_g(p.gate_elements()), grad_beta(p.gate_elements()), grad_a(p.gate_elements()),
      grad_b(p.gate_elements()), grad_a_log(hv), grad_dt_bias(hv);
  DeviceWorkspace<Config> workspace(sequences, tokens, hk, hv, max_chunks);
  for (auto* buffer : {&o, &grad_q, &grad_k, &grad_v}) buffer->poison();
  for (auto* buffer : {&final_state, &grad_initial, &grad_g, &grad_beta, &grad_a, &grad_b, &grad_a_log, &grad_dt_bias})
    buffer->poison();
  workspace.poison();

  GatedDeltaParams params{};
  params.num_sequences = sequences;
  params.sequence_length = p.lengths[0];
  params.total_tokens = tokens;
  params.key_heads = hk;
  params.value_heads = hv;
  params.max_chunks = max_chunks;
  params.scale = static_cast<float>(p.scale);
  params.cu_seqlens = Config::kVarlen ? cu_seqlens.get() : nullptr;
  params.q = q_ptr;
  params.k = k_ptr;
  params.v = v_ptr;
  params.q_row_stride = q_stride;
  params.k_row_stride = k_stride;
  params.v_row_stride = v_stride;
  params.g = g.get();
  params.g_row_stride = hv;
  params.beta = beta.get();
  params.beta_row_stride = hv;
  params.a = a.get();
  params.b = b.get();
  params.a_row_stride = hv;
  params.b_row_stride = hv;
  params.a_log = a_log.get();
  params.dt_bias = dt_bias.get();
  params.initial_state = initial.get();
  params.o = o.get();
  params.o_row_stride = v_width;
  params.final_state = final_state.get();
  params.grad_o = grad_o.get();
  params.grad_o_row_stride = v_width;
  params.grad_final_state = grad_final.get();
  params.grad_q = grad_q.get();
  params.grad_k = grad_k.get();
  params.grad_v = grad_v.get();
  params.grad_q_row_stride = qk_width;
  params.grad_k_row_stride = qk_width;
  params.grad_v_row_stride = v_width;
  params.grad_g = grad_g.get();
  params.grad_beta = grad_beta.get();
  params.grad_a = grad_a.get();
  params.grad_b = grad_b.get();
  params.grad_a_log = grad_a_log.get();
  params.grad_dt_bias = grad_dt_bias.get();
  params.grad_initial_state = grad_initial.get();
  params.workspace = workspace.view();

  Launcher<Config>::forward(params, NoTiming{});
  Launcher<Config>::backward(params, NoTiming{});
  CUDA_CHECK(cudaDeviceSynchronize());

  struct Row {
    const char* name;
    Comparison c;
  };
  std::vector<Row> rows;
  rows.push_back({"o", compare(widen(o.download()), ref.o)});
  if (Config::kFinalState) rows.push_back({"ht", compare(widen(final_state.download()), ref.final_state)});
  rows.push_back({"dq", compare(widen(grad_q.download()), ref.grad_q)});
  rows.push_back({"dk", compare(widen(grad_k.download()), ref.grad_k)});
  rows.push_back({"dv", compare(widen(grad_v.download()), ref.grad_v)});
  if (Config::kInKernelGate) {
    rows.push_back({"da", compare(widen(grad_a.download()), ref.grad_a)});
    if (Config::kDeltaRule) rows.push_back({"db", compare(widen(grad_b.download()), ref.grad_b)});
    rows.push_back({"dA_log", compare_sum(widen(grad_a_log.download()), ref.grad_a_log, ref.grad_a_log_terms)});
    rows.push_back(
        {"ddt_bias", compare_sum(widen(grad_dt_bias.download()), ref.grad_dt_bias, ref.grad_dt_bias_terms)});
  } else {
    if (Config::kHasGate) rows.push_back({"dg", compare(widen(grad_g.download()), ref.grad_g)});
    if (Config::kDeltaRule) rows.push_back({"dbeta", compare(widen(grad_beta.download()), ref.grad_beta)});
  }
  if (Config::kInitialState) rows.push_back({"dh0", compare(widen(grad_initial.download()), ref.grad_initial_state)});

  bool pass = true;
  std::string line;
  char cell[64];
  for (const Row& r : rows) {
    const bool ok = r.c.bad == 0 && r.c.error <= kTolerance;
    pass = pass && ok;
    if (r.c.bad > 0) {
      std::snprintf(cell, sizeof(cell), " %s=!%lld", r.name, r.c.bad);
    } else if (r.c.plain_error >= 0) {
      std::snprintf(cell, sizeof(cell), " %s=%.1e%s(plain %.1e)", r.name, r.c.error, ok ? "" : "*", r.c.plain_error);
    } else {
      std::snprintf(cell, sizeof(cell), " %s=%.1e%s", r.name, r.c.error, ok ? "" : "*");
    }
    line += cell;
  }
  std::printf("%-5s %-58s %s\n", pass ? "PASS" : "FAIL", c.name.c_str(), line.c_str());
  if (!pass) report_intermediates<Config>(p, in, params.workspace);
  std::fflush(stdout);
  return pass;
}

template <int Dk, int Dv, GateKind Gate, bool Delta, bool Norm, bool InKernelGate, bool Initial, bool Final, bool Varlen>
using Config = GatedDeltaConfig<Dk, Dv, Gate, Delta, Norm, InKernelGate, Initial, Final, Varlen>;
constexpr GateKind kScalar = GateKind::kScalarLog;
constexpr GateKind kNoGate = GateKind::kNone;

bool run_checks(const std::string& filter) {
  std::mt19937_64 rng(20261130);
  std::printf("metric per tensor: max|x-ref| / max|ref| vs a float64 sequential reference, tolerance %.0e "
              "(dA_log, ddt_bias: max|x-ref| / max sum|terms|, plain metric in brackets); "
              "'!n' = n NaN/inf elements; '*' = over tolerance\n", kTolerance);
  bool pass = true;
  pass &= run_check<Config<128, 128, kScalar, true, true, false, true, true, true>>(
      {"d128 varlen {1,17,64,200,1000} Hk=Hv=2 g beta h0 ht", 2, 2, {1, 17, 64, 200, 1000}, false}, rng, filter);
  pass &= run_check<Config<128, 128, kScalar, true, true, true, true, true, true>>(
      {"d128 varlen Hk=1 Hv=2 in-kernel gate h0 ht (Qwen3.5)", 1, 2, {300, 1, 65, 128, 17}, false}, rng, filter);
  pass &= run_check<Config<64, 64, kScalar, true, true, false, false, true, false>>(
      {"d64 B=2 T=200 Hk=2 Hv=4 g beta ht", 2, 4, {200, 200}, false}, rng, filter);
  pass &= run_check<Config<64, 64, kNoGate, true, false, false, true, false, true>>(
      {"d64 varlen gate=none no-l2norm h0", 2, 2, {100, 1, 64, 129}, false}, rng, filter);
  pass &= run_check<Config<128, 64, kScalar, false, true, false, true, true, false>>(
      {"dk128 dv64 B=3 T=150 no delta rule h0 ht", 2, 2, {150, 150, 150}, false}, rng, filter);
  pass &= run_check<Config<64, 128, kScalar, true, true, true, false, false, false>>(
      {"dk64 dv128 B=1 T=333 in-kernel gate fused qkv rows", 2, 2, {333}, true}, rng, filter);
  pass &= run_check<Config<128, 128, kScalar, false, false, false, false, true, true>>(
      {"d128 varlen Hk=1 Hv=2 no delta no-l2norm ht", 1, 2, {1, 70, 300}, false}, rng, filter);
  return pass;
}

// ---------------------------------------------------------------------------
// Self-test of the references (CPU only)

double loss_of(const Problem& p, const Inputs& in) {
  const Outputs out = reference_sequential(p, in, false);
  double loss = 0;
  for (size_t i = 0; i < out.o.size(); ++i) loss += out.o[i] * in.grad_o[i];
  if (p.final_state)
    for (size_t i = 0; i < out.final_state.size(); ++i) loss += out.final_state[i] * in.grad_final_state[i];
  return loss;
}

bool run_self_test() {
  std::mt19937_64 rng(7);
  bool pass = true;
  // 1. Sequential reference gradients against central differences.
  for (int variant = 0; variant < 4; ++variant) {
    Problem p;
    p.key_dim = 8;
    p.value_dim = 6;
    p.key_heads = 1;
    p.value_heads = 2;
    p.lengths = {5, 3};
    p.initial_state = p.final_state = true;
    p.scale = 0.3;
    p.in_kernel_gate = variant == 1;
    p.delta_rule = variant != 2;
    p.qk_l2norm = variant != 3;
    Inputs in = random_inputs(p, rng);
    const Outputs ref = reference_sequential(p, in, true);
    double worst = 0;
    auto probe = [&](std::vector<double>& x, const std::vector<double>& grad) {
      for (size_t i = 0; i < x.size(); i += std::max<size_t>(1, x.size() / 7)) {
        const double h = 1e-6, saved = x[i];
        x[i] = saved + h;
        const double up = loss_of(p, in);
        x[i] = saved - h;
        const double down = loss_of(p, in);
        x[i] = saved;
        const double numeric = (up - down) / (2 * h);
        worst = std::max(worst, std::abs(numeric - grad[i]) / (1e-6 + std::abs(numeric)));
      }
    };
    probe(in.q, ref.grad_q);
    probe(in.k, ref.grad_k);
    probe(in.v, ref.grad_v);
    if (p.in_kernel_gate) {
      probe(in.a, ref.grad_a);
      probe(in.b, ref.grad_b);
      probe(in.a_log, ref.grad_a_log);
      probe(in.dt_bias, ref.grad_dt_bias);
    } else {
      probe(in.g, ref.grad_g);
      if (p.delta_rule) probe(in.beta, ref.grad_beta);
    }
    probe(in.initial_state, ref.grad_initial_state);
    const bool ok = worst < 1e-5;
    pass = pass && ok;
    std::printf("%-5s self-test finite differences, variant %d: worst relative error %.1e\n", ok ? "PASS" : "FAIL",
                variant, worst);
  }
  // 2. The chunked decomposition against the sequential recurrence.
  for (int variant = 0; variant < 5; ++variant) {
    Problem p;
    p.key_dim = 16;
    p.value_dim = 12;
    p.key_heads = 2;
    p.value_heads = 4;
    p.lengths = {1, 17, 64, 200, 130};
    p.initial_state = variant != 2;
    p.final_state = true;
    p.scale = 0.25;
    p.in_kernel_gate = variant == 1;
    p.delta_rule = variant != 2;
    p.qk_l2norm = variant != 3;
    p.gate = variant != 4;
    const Inputs in = random_inputs(p, rng);
    const Outputs a = reference_sequential(p, in, true), b = reference_chunked(p, in, true);
    double worst = 0;
    const std::vector<double>* pairs[][2] = {
        {&b.o, &a.o},         {&b.final_state, &a.final_state}, {&b.grad_q, &a.grad_q},
        {&b.grad_k, &a.grad_k}, {&b.grad_v, &a.grad_v},           {&b.grad_g, &a.grad_g},
        {&b.grad_beta, &a.grad_beta}, {&b.grad_a, &a.grad_a},     {&b.grad_b, &a.grad_b},
        {&b.grad_a_log, &a.grad_a_log}, {&b.grad_dt_bias, &a.grad_dt_bias},
        {&b.grad_initial_state, &a.grad_initial_state}};
    for (auto& pair : pairs) {
      if (pair[0]->size() != pair[1]->size()) {
        worst = 1;
        continue;
      }
      if (!pair[1]->empty()) worst = std::max(worst, compare(*pair[0], *pair[1]).error);
    }
    const bool ok = worst < 1e-12;
    pass = pass && ok;
    std::printf("%-5s self-test chunked vs sequential (float64), variant %d: worst %.1e\n", ok ? "PASS" : "FAIL",
                variant, worst);
  }
  return pass;
}

// ---------------------------------------------------------------------------
// Timing on the baseline shapes

__global__ void fill_normal_bf16(bf16* x, long long count, unsigned seed, float stddev) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    const float u1 = ((h & 0xffff) + 0.5f) / 65536.f, u2 = ((h >> 16) + 0.5f) / 65536.f;
    x[i] = __float2bfloat16(stddev * sqrtf(-2.f * logf(u1)) * cosf(6.2831853f * u2));
  }
}

__global__ void fill_gates(float* g, bf16* beta, long long count, unsigned seed) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2246822519u ^ seed;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    const float u1 = ((h & 0xffff) + 0.5f) / 65536.f, u2 = ((h >> 16) + 0.5f) / 65536.f;
    const float x = 4.f * u1 - 2.f;
    g[i] = -log1pf(expf(-x));  // logsigmoid of a value in (-2, 2)
    beta[i] = __float2bfloat16(0.5f + 0.23f * u2);
  }
}

float median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

struct TimingShape {
  int batch, length, heads;
};

void run_timing(std::vector<TimingShape> shapes) {
  using TimingConfig = Config<128, 128, kScalar, true, true, false, false, false, false>;
  if (shapes.empty()) shapes = {{1, 16384, 16}, {1, 32768, 32}, {8, 2048, 16}};
  std::printf("\ntiming (H200 here; d=128, Hk=Hv=H, scalar gate, delta rule, q/k L2 norm, no states; CUDA events, "
              "median of 20 after 3 warm-ups)\n");
  std::printf("%-16s %9s %11s | %s\n", "shape B,T,H", "fwd ms", "fwd+bwd ms",
              "per kernel ms (fwd prepare, state, output; bwd prepare, state, chunk)");
  for (const TimingShape& s : shapes) {
    const int tokens = s.batch * s.length, d = 128, h = s.heads;
    const long long elements = static_cast<long long>(tokens) * h * d;
    DeviceBuffer<bf16> q(elements), k(elements), v(elements), o(elements), grad_o(elements), grad_q(elements),
        grad_k(elements), grad_v(elements);
    DeviceBuffer<float> g(static_cast<size_t>(tokens) * h), grad_g(static_cast<size_t>(tokens) * h),
        grad_beta(static_cast<size_t>(tokens) * h);
    DeviceBuffer<bf16> beta(static_cast<size_t>(tokens) * h);
    fill_normal_bf16<<<1024, 256>>>(q.get(), elements, 1u, 1.f);
    fill_normal_bf16<<<1024, 256>>>(k.get(), elements, 2u, 1.f);
    fill_normal_bf16<<<1024, 256>>>(v.get(), elements, 3u, 1.f);
    fill_normal_bf16<<<1024, 256>>>(grad_o.get(), elements, 4u, 1.f);
    fill_gates<<<1024, 256>>>(g.get(), beta.get(), static_cast<long long>(tokens) * h, 5u);
    CUDA_CHECK(cudaGetLastError());
    const int max_chunks = dflex::kernels::gated_delta_max_chunks(false, s.batch, s.length, tokens);
    DeviceWorkspace<TimingConfig> workspace(s.batch, tokens, h, h, max_chunks);
    GatedDeltaParams p{};
    p.num_sequences = s.batch;
    p.sequence_length = s.length;
    p.total_tokens = tokens;
    p.key_heads = p.value_heads = h;
    p.max_chunks = max_chunks;
    p.scale = 1.f / std::sqrt(static_cast<float>(d));
    p.q = q.get();
    p.k = k.get();
    p.v = v.get();
    p.q_row_stride = p.k_row_stride = p.v_row_stride = static_cast<long long>(h) * d;
    p.g = g.get();
    p.g_row_stride = h;
    p.beta = beta.get();
    p.beta_row_stride = h;
    p.o = o.get();
    p.o_row_stride = static_cast<long long>(h) * d;
    p.grad_o = grad_o.get();
    p.grad_o_row_stride = static_cast<long long>(h) * d;
    p.grad_q = grad_q.get();
    p.grad_k = grad_k.get();
    p.grad_v = grad_v.get();
    p.grad_q_row_stride = p.grad_k_row_stride = p.grad_v_row_stride = static_cast<long long>(h) * d;
    p.grad_g = grad_g.get();
    p.grad_beta = grad_beta.get();
    p.workspace = workspace.view();

    cudaEvent_t begin, end;
    CUDA_CHECK(cudaEventCreate(&begin));
    CUDA_CHECK(cudaEventCreate(&end));
    auto time = [&](auto&& body) {
      for (int i = 0; i < 3; ++i) body();
      std::vector<float> samples;
      for (int i = 0; i < 20; ++i) {
        CUDA_CHECK(cudaEventRecord(begin));
        body();
        CUDA_CHECK(cudaEventRecord(end));
        CUDA_CHECK(cudaEventSynchronize(end));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
        samples.push_back(ms);
      }
      return median(samples);
    };
    const float fwd = time([&] { Launcher<TimingConfig>::forward(p, NoTiming{}); });
    const float fwd_bwd = time([&] {
      Launcher<TimingConfig>::forward(p, NoTiming{});
      Launcher<TimingConfig>::backward(p, NoTiming{});
    });
    // Per-kernel medians: events after every launch.
    std::vector<cudaEvent_t> marks(8);
    for (auto& e : marks) CUDA_CHECK(cudaEventCreate(&e));
    std::vector<std::vector<float>> per_kernel(7);
    for (int i = 0; i < 10; ++i) {
      int mark = 0;
      CUDA_CHECK(cudaEventRecord(marks[mark++]));
      auto record = [&](const char*) { CUDA_CHECK(cudaEventRecord(marks[mark++])); };
      Launcher<TimingConfig>::forward(p, record);
      Launcher<TimingConfig>::backward(p, record);
      CUDA_CHECK(cudaEventSynchronize(marks[mark - 1]));
      for (int k = 0; k + 1 < mark; ++k) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, marks[k], marks[k + 1]));
        per_kernel[k].push_back(ms);
      }
    }
    char kernels[128];
    std::snprintf(kernels, sizeof(kernels), "%.3f %.3f %.3f; %.3f %.3f %.3f", median(per_kernel[0]),
                  median(per_kernel[1]), median(per_kernel[2]), median(per_kernel[3]), median(per_kernel[4]),
                  median(per_kernel[5]));
    char shape[32];
    std::snprintf(shape, sizeof(shape), "%d,%d,%d", s.batch, s.length, s.heads);
    std::printf("%-16s %9.3f %11.3f | %s\n", shape, fwd, fwd_bwd, kernels);
    std::fflush(stdout);
    for (auto& e : marks) CUDA_CHECK(cudaEventDestroy(e));
    CUDA_CHECK(cudaEventDestroy(begin));
    CUDA_CHECK(cudaEventDestroy(end));
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool self_test = false, check = false, timing = false;
  std::vector<TimingShape> shapes;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--filter" && i + 1 < argc) {
      filter = argv[++i];
      check = true;
      continue;
    }
    TimingShape shape{};
    if (arg == "--shape" && i + 1 < argc &&
        std::sscanf(argv[i + 1], "%dx%dx%d", &shape.batch, &shape.length, &shape.heads) == 3 && shape.batch > 0 &&
        shape.length > 0 && shape.heads > 0) {
      shapes.push_back(shape);
      timing = true;
      ++i;
      continue;
    }
    if (arg == "--self-test") {
      self_test = true;
    } else if (arg == "--check") {
      check = true;
    } else if (arg == "--time") {
      timing = true;
    } else {
      std::fprintf(stderr, "usage: %s [--self-test] [--check] [--time] [--shape BxTxH ...] [--filter NAME_PART]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!self_test && !check && !timing) self_test = check = timing = true;
  bool pass = true;
  if (self_test) pass &= run_self_test();
  if (check || timing) {
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  }
  if (check) pass &= run_checks(filter);
  if (timing) run_timing(shapes);
  std::printf("%s\n", pass ? "ALL PASS" : "SOME CHECKS FAILED");
  return pass ? 0 : 1;
}
