// CUDA sources shared by the compile tests.
#ifndef DFLEX_TEST_UNIT_COMPILE_TESTKERNELS_H
#define DFLEX_TEST_UNIT_COMPILE_TESTKERNELS_H

namespace dflex::test {

// One warp multiplies a 16x16 by a 16x8 bf16 tile with mma.sync (fp32
// accumulation); the template parameter sizes a static shared buffer.
inline constexpr const char *kMmaKernelSource = R"(
#include <cuda_bf16.h>

template <int kStaged>
__global__ void mma_tile(const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                         float *c) {
  __shared__ float staged[kStaged];
  const unsigned lane = threadIdx.x % 32;
  const unsigned *a32 = reinterpret_cast<const unsigned *>(a);
  const unsigned *b32 = reinterpret_cast<const unsigned *>(b);
  unsigned fragA[4] = {a32[lane], a32[lane + 32], a32[lane + 64],
                       a32[lane + 96]};
  unsigned fragB[2] = {b32[lane], b32[lane + 32]};
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(fragA[0]), "r"(fragA[1]), "r"(fragA[2]), "r"(fragA[3]),
        "r"(fragB[0]), "r"(fragB[1]));
  staged[lane % kStaged] = acc[0] + __bfloat162float(a[lane]);
  __syncthreads();
  for (int i = 0; i < 4; ++i)
    c[lane * 4 + i] = acc[i] + staged[(lane + 1) % kStaged];
}

extern "C" __global__ void scale(float *x, float factor) {
  x[threadIdx.x] *= factor;
}
)";

} // namespace dflex::test

#endif
