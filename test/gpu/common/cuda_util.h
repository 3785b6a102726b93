// Shared by the GPU harnesses: every CUDA runtime call's status is checked,
// and a failure names the call and where it was made; device buffers that
// can be poisoned before a run.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#define CUDA_CHECK(expr)                                                                                  \
  do {                                                                                                    \
    const cudaError_t status_ = (expr);                                                                   \
    if (status_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(status_)); \
      std::exit(2);                                                                                       \
    }                                                                                                     \
  } while (0)

// A device allocation of `count` elements, freed on destruction.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { allocate(count); }
  ~DeviceBuffer() {
    if (data_ == nullptr) return;
    const cudaError_t status = cudaFree(data_);
    if (status != cudaSuccess) std::fprintf(stderr, "cudaFree failed: %s\n", cudaGetErrorString(status));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void allocate(size_t count) {
    count_ = count;
    CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(T)));
  }
  T* get() const { return data_; }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    if (host.size() != count_) {
      std::fprintf(stderr, "upload of %zu elements into a buffer of %zu\n", host.size(), count_);
      std::exit(2);
    }
    CUDA_CHECK(cudaMemcpy(data_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    CUDA_CHECK(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bits set: NaN in bf16, fp16 and fp32, so an unwritten element fails the check.
  void poison() { CUDA_CHECK(cudaMemset(data_, 0xFF, std::max<size_t>(count_, 1) * sizeof(T))); }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};
