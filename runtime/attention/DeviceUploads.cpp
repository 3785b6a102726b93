#include "dflex/runtime/attention/DeviceUploads.h"

#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>
#include <functional>
#include <string_view>

namespace dflex::runtime {

namespace {

/// `bytes` on `device`, copied from pinned memory without blocking (the
/// host allocator keeps the staging buffer until the copy is done).
torch::Tensor copyToDevice(const torch::Device &device, const std::vector<uint8_t> &bytes) {
  torch::Tensor staging = torch::empty({static_cast<int64_t>(bytes.size())},
                                       torch::TensorOptions().dtype(torch::kByte).pinned_memory(true));
  std::memcpy(staging.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return staging.to(device, /*non_blocking=*/true);
}

} // namespace

DeviceUploads &DeviceUploads::instance() {
  // Never destroyed: its tensors and events must not be freed after
  // LibTorch's CUDA allocator and the driver are gone at exit.
  static DeviceUploads *uploads = new DeviceUploads;
  return *uploads;
}

torch::Tensor DeviceUploads::get(const torch::Device &device, const std::vector<uint8_t> &bytes) {
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &capture));
  if (capture != cudaStreamCaptureStatusNone || bytes.size() > kMaxEntryBytes)
    return copyToDevice(device, bytes);
  const size_t hash = std::hash<std::string_view>()(
      std::string_view(reinterpret_cast<const char *>(bytes.data()), bytes.size()));

  std::lock_guard<std::mutex> lock(mutex_);
  for (auto entry = entries_.begin(); entry != entries_.end(); ++entry) {
    if (entry->device != device.index() || entry->hash != hash || entry->bytes != bytes)
      continue;
    entries_.splice(entries_.begin(), entries_, entry);
    if (entry->stream != stream.id()) {
      entry->ready->block(stream);
      entry->tensor.record_stream(stream);
    }
    return entry->tensor;
  }

  Entry entry;
  entry.device = device.index();
  entry.hash = hash;
  entry.bytes = bytes;
  entry.tensor = copyToDevice(device, bytes);
  entry.stream = stream.id();
  entry.ready = std::make_shared<c10::cuda::CUDAEvent>();
  entry.ready->record(stream);
  bytes_ += entry.bytes.size();
  entries_.push_front(std::move(entry));
  while (entries_.size() > kMaxEntries || bytes_ > kMaxBytes) {
    bytes_ -= entries_.back().bytes.size();
    entries_.pop_back();
  }
  return entries_.front().tensor;
}

} // namespace dflex::runtime
