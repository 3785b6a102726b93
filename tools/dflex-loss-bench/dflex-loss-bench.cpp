// dflex-loss-bench: time and peak memory of the block cross-entropy, chunked
// (blockCrossEntropy) or dense (full logits, torch autograd), on the CPU or a
// GPU, one mode per process so that each peak is measured from a clean start.
#include "dflex/runtime/loss/BlockLoss.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>

using namespace dflex::runtime;

namespace {

uint64_t statusKib(const char *field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field, 0) == 0)
      return std::stoull(line.substr(std::string(field).size()));
  return 0;
}

// Sets the peak resident size (VmHWM) back to the current one.
void resetPeak() { std::ofstream("/proc/self/clear_refs") << "5"; }

// Bytes LibTorch's CUDA allocator has handed out: now, or at most since the
// last resetPeak.
uint64_t cudaAllocated(bool peak) {
  c10::CachingDeviceAllocator::DeviceStats stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const c10::CachingDeviceAllocator::Stat &bytes = stats.allocated_bytes[0];
  return uint64_t(peak ? bytes.peak : bytes.current);
}

[[noreturn]] void usage() {
  std::cerr << "usage: dflex-loss-bench --mode chunked|dense [--rows M] [--vocab V]\n"
               "         [--hidden H] [--chunk-rows R] [--dtype float|bfloat16]\n"
               "         [--device cpu|cuda]\n";
  std::exit(2);
}

} // namespace

int main(int argc, char **argv) {
  // Buffers of 1 MiB and more are mapped and unmapped directly, so that the
  // resident peak counts live tensors, not memory glibc keeps after a free.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  std::string mode, dtypeName = "float", deviceName = "cpu";
  int64_t rows = 1024, vocab = 248320, hidden = 1024, chunkRows = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc)
      usage();
    std::string value = argv[++i];
    if (arg == "--mode")
      mode = value;
    else if (arg == "--rows")
      rows = std::stoll(value);
    else if (arg == "--vocab")
      vocab = std::stoll(value);
    else if (arg == "--hidden")
      hidden = std::stoll(value);
    else if (arg == "--chunk-rows")
      chunkRows = std::stoll(value);
    else if (arg == "--dtype")
      dtypeName = value;
    else if (arg == "--device")
      deviceName = value;
    else
      usage();
  }
  if ((mode != "chunked" && mode != "dense") || (deviceName != "cpu" && deviceName != "cuda"))
    usage();
  const bool cuda = deviceName == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::cerr << "dflex-loss-bench: no CUDA device\n";
    return 1;
  }
  torch::Device device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  torch::ScalarType dtype = dtypeName == "bfloat16" ? torch::kBFloat16 : torch::kFloat;

  torch::manual_seed(0);
  torch::Tensor head = (torch::randn({vocab, hidden}) * 0.05).to(device, dtype);
  torch::Tensor input = torch::randn({rows, hidden}).to(device, dtype).requires_grad_();
  torch::Tensor labels = torch::randint(vocab, {rows}, torch::kLong).to(device);
  torch::Tensor weights = torch::rand({rows}).to(device);
  auto step = [&] {
    torch::Tensor loss;
    if (mode == "chunked") {
      BlockLossOptions options;
      options.chunkRows = chunkRows;
      loss = blockCrossEntropy(input, head, labels, weights, options).loss;
    } else {
      torch::Tensor logits = torch::mm(input, head.t()).to(torch::kFloat);
      torch::Tensor perRow =
          logits.logsumexp(1) - logits.gather(1, labels.unsqueeze(1)).squeeze(1);
      loss = (weights * perRow).sum() / weights.sum();
    }
    loss.backward();
    return loss;
  };

  uint64_t baseline;
  if (cuda) {
    // One untimed step first: cuBLAS and the allocator warm up.
    step();
    input.mutable_grad().reset();
    torch::cuda::synchronize();
    baseline = cudaAllocated(false);
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  } else {
    baseline = statusKib("VmRSS:") * 1024;
    resetPeak();
  }
  auto start = std::chrono::steady_clock::now();
  torch::Tensor loss = step();
  if (cuda)
    torch::cuda::synchronize();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t peak = cuda ? cudaAllocated(true) : statusKib("VmHWM:") * 1024;
  std::printf("{\"mode\": \"%s\", \"device\": \"%s\", \"rows\": %lld, \"vocab\": %lld, "
              "\"hidden\": %lld, \"dtype\": \"%s\", \"peak_extra_mib\": %.1f, "
              "\"seconds\": %.3f, \"loss\": %.6f, \"grad_norm\": %.6f}\n",
              mode.c_str(), deviceName.c_str(), (long long)rows, (long long)vocab,
              (long long)hidden, dtypeName.c_str(), double(peak - baseline) / (1 << 20), seconds,
              loss.item<double>(), input.grad().to(torch::kFloat).norm().item<double>());
  return 0;
}
