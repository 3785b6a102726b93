// Small device primitives shared by the dflex kernel templates: shared-memory
// addresses, asynchronous copies, ldmatrix, fast exp2 and warp reductions.
//
// Everything here is header-only and compiles under nvcc and NVRTC alike: no
// host standard headers, only CUDA built-ins and inline PTX (sm_80 or newer).
#pragma once

namespace dflex {
namespace kernels {

// Shared memory a single block may use on every target: sm_120 (RTX PRO 6000
// Blackwell, RTX 5090) allows 99 KB per block, less than sm_90's 227 KB.
constexpr int kMaxSharedMemoryPerBlock = 101376;

// Shared memory per multiprocessor by compute capability (the CUDA
// programming guide's table; 0 where it has none), of which the driver
// reserves 1 KB per resident block.
__host__ __device__ constexpr int shared_bytes_per_sm(int compute_capability) {
  switch (compute_capability) {
    case 75: return 65536;
    case 80: case 87: return 167936;
    case 86: case 89: case 120: case 121: return 102400;
    case 90: case 100: case 103: case 110: return 233472;
    default: return 0;
  }
}
constexpr int kSharedBytesReservedPerBlock = 1024;

// The static shared memory a block with `dynamic_bytes` of dynamic shared
// memory may add without an SM of `per_sm` bytes holding fewer of its blocks.
__host__ __device__ constexpr int occupancy_free_shared_bytes(int dynamic_bytes, int per_sm) {
  const int per_block = dynamic_bytes + kSharedBytesReservedPerBlock;
  const int blocks = per_sm / per_block;
  return blocks > 0 ? per_sm / blocks - per_block : 0;
}

// The dynamic shared memory with which a kernel that needs `shared_bytes`
// runs as many blocks per multiprocessor on a GPU with `device_per_sm` bytes
// per SM as it would on one with `proxy_per_sm`: an sm_90 GPU padded this way
// does not hide latency with blocks an sm_120 card cannot hold. The padding
// is the least (in 128-byte steps) that keeps one more block out, so a few
// KB of static shared memory on top leave the count as it is. Unpadded where
// either size is unknown or the two are the same.
__host__ __device__ constexpr int occupancy_proxy_shared_bytes(int shared_bytes, int device_per_sm,
                                                               int proxy_per_sm) {
  if (shared_bytes == 0 || device_per_sm == 0 || proxy_per_sm == 0 || device_per_sm == proxy_per_sm)
    return shared_bytes;
  const int per_block = shared_bytes + kSharedBytesReservedPerBlock;
  const int blocks = proxy_per_sm / per_block > 0 ? proxy_per_sm / per_block : 1;
  const int padded = (device_per_sm / (blocks + 1) - kSharedBytesReservedPerBlock + 128) / 128 * 128;
  return padded > shared_bytes ? padded : shared_bytes;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float positive_infinity() { return __int_as_float(0x7f800000); }

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// Pins a pointer's value in a register at this point of the program: the
// compiler can no longer recompute it from its inputs where it is used (say,
// once in each branch that uses it).
template <class T>
__device__ __forceinline__ void keep_in_register(T*& pointer) {
  asm volatile("" : "+l"(pointer));
}

// 16-byte global -> shared copy that bypasses L1. When `valid` is false the
// 16 destination bytes are zero-filled and nothing is read from `source`.
__device__ __forceinline__ void cp_async_16(unsigned destination, const void* source, bool valid) {
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(source),
               "r"(source_bytes)
               : "memory");
}

// 4-byte global -> shared copy; zero-fills the destination when `valid` is false.
__device__ __forceinline__ void cp_async_4(unsigned destination, const void* source, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(destination), "l"(source),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the row addresses
// of matrix i, register i receives matrix i in the mma fragment layout.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// As ldmatrix_x4, each 8x8 matrix transposed on the way.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// 2^x with the hardware approximation (relative error ~2^-22); exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Reductions over the four lanes that share a row of an mma accumulator.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Adds (a, b) to two consecutive floats in global memory without returning
// the old values (one vector reduction on sm_90 and newer).
__device__ __forceinline__ void global_add_pair(float* address, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(address, a);
  atomicAdd(address + 1, b);
#endif
}

// Adds (a, b, c, d) to four consecutive, 16-byte aligned floats in global
// memory without returning the old values (one vector reduction on sm_90 and
// newer: half the instructions of two pairs, and the memory pipe's queue of
// reductions is what they wait on).
__device__ __forceinline__ void global_add_quad(float* address, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(address, a);
  atomicAdd(address + 1, b);
  atomicAdd(address + 2, c);
  atomicAdd(address + 3, d);
#endif
}

}  // namespace kernels
}  // namespace dflex
