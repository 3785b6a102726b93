// Device copies of the bytes the attention kernels read besides q, k and v.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

namespace c10::cuda {
struct CUDAEvent;
} // namespace c10::cuda

namespace dflex::runtime {

/// The read-only bytes a call uploads (its tile lists, its host tensor
/// captures), kept on the device for the calls that repeat them: every
/// attention layer after the first of a step, and every step whose mask
/// inputs do not change. A call that finds its bytes here launches without
/// a pinned staging buffer or a host-to-device copy. Entries are found by
/// their bytes (a hash, then a full comparison), per device; the cache keeps
/// the most recently used, within a count and a byte budget. Thread-safe.
///
/// Streams: an entry is copied on the stream current at its upload and
/// becomes ready there; a call on another stream waits for that copy (an
/// event, on the device) and marks the tensor as used by its stream, so
/// that the allocator does not reuse the memory under it after eviction.
/// While the current stream captures a CUDA graph, nothing is kept or
/// reused: the copy is captured as the graph's own.
class DeviceUploads {
public:
  static constexpr size_t kMaxEntries = 32;
  static constexpr size_t kMaxBytes = size_t(64) << 20;     // all entries together
  static constexpr size_t kMaxEntryBytes = size_t(8) << 20; // larger uploads are not kept

  /// The process's cache.
  static DeviceUploads &instance();

  /// A uint8 tensor on `device` (a CUDA device) holding `bytes`, ready for
  /// work enqueued on the device's current stream. Kernels must only read it.
  torch::Tensor get(const torch::Device &device, const std::vector<uint8_t> &bytes);

private:
  struct Entry {
    int device = 0;
    size_t hash = 0;
    std::vector<uint8_t> bytes;
    torch::Tensor tensor;
    int64_t stream = 0; // c10::cuda::CUDAStream::id() of the upload
    std::shared_ptr<c10::cuda::CUDAEvent> ready;
  };

  std::mutex mutex_;
  std::list<Entry> entries_; // most recently used first
  size_t bytes_ = 0;
};

} // namespace dflex::runtime
