// DeviceUploads on a CUDA device: one copy per distinct bytes and device,
// usable from another stream, and the bytes it holds are the bytes given.
#include "dflex/runtime/attention/DeviceUploads.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>
#include <vector>

namespace dflex::runtime {
namespace {

std::vector<uint8_t> randomBytes(size_t size, unsigned seed) {
  std::mt19937 generator(seed);
  std::vector<uint8_t> bytes(size);
  for (uint8_t &byte : bytes)
    byte = static_cast<uint8_t>(generator());
  return bytes;
}

std::vector<uint8_t> onHost(const torch::Tensor &tensor) {
  const torch::Tensor host = tensor.cpu();
  return std::vector<uint8_t>(host.data_ptr<uint8_t>(), host.data_ptr<uint8_t>() + host.numel());
}

TEST(DeviceUploads, RepeatedBytesShareOneCopyOnEveryStream) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "needs a CUDA device";
  const torch::Device device(torch::kCUDA, 0);
  DeviceUploads &uploads = DeviceUploads::instance();
  const std::vector<uint8_t> first = randomBytes(1000, 1);
  std::vector<uint8_t> second = first;
  second[999] ^= 1; // one bit apart

  const torch::Tensor a = uploads.get(device, first);
  EXPECT_TRUE(a.is_cuda());
  EXPECT_EQ(onHost(a), first);
  EXPECT_EQ(uploads.get(device, first).data_ptr(), a.data_ptr()) << "the same bytes, a second copy";
  const torch::Tensor b = uploads.get(device, second);
  EXPECT_NE(b.data_ptr(), a.data_ptr());
  EXPECT_EQ(onHost(b), second);

  // On a side stream: the same copy, ready there.
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  {
    const c10::cuda::CUDAStreamGuard guard(side);
    const torch::Tensor again = uploads.get(device, first);
    EXPECT_EQ(again.data_ptr(), a.data_ptr());
    EXPECT_EQ(onHost(again.clone()), first);
  }

  // More distinct uploads than the cache keeps: each still holds its bytes,
  // and the evicted first one comes back with its bytes.
  for (unsigned i = 0; i < DeviceUploads::kMaxEntries + 4; ++i) {
    const std::vector<uint8_t> other = randomBytes(64 + i, 100 + i);
    EXPECT_EQ(onHost(uploads.get(device, other)), other);
  }
  EXPECT_EQ(onHost(uploads.get(device, first)), first);
}

} // namespace
} // namespace dflex::runtime
