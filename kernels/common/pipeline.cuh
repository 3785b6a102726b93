// Hopper (sm_90) synchronisation and bulk-copy primitives for warp-specialised
// kernels: mbarriers fed by cp.async, proxy fences, named barriers, register
// reallocation between warpgroups and bulk reductions to global memory.
//
// All shared-memory operands are 32-bit shared-window addresses
// (shared_address()). Header-only, compiles under nvcc and NVRTC; the
// instructions need sm_90 (setmaxnreg: sm_90a), so callers guard their use.
#pragma once

#include "device.cuh"

namespace dflex {
namespace kernels {

// Per-block shared-memory limit of sm_90 (227 KB), for kernels that only run there.
constexpr int kMaxSharedMemoryPerBlockSm90 = 232448;

// ---- mbarriers ---------------------------------------------------------------------------
// A barrier completes a phase when `count` arrivals have been made on it; waiters
// name the phase by its parity (0 for the first phase, then 1, 0, ...).

__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}

// One arrival on `barrier` once every cp.async this thread issued so far has
// landed (.noinc: the barrier's count must include this arrival).
__device__ __forceinline__ void mbarrier_arrive_on_copies(unsigned barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
}

// Blocks until the phase with the given parity has completed. Waiting for
// parity 1 on a fresh barrier returns at once (the "previous" phase counts as
// complete), which is how producers start on empty buffers.
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  } while (done == 0);
}

// ---- copies ------------------------------------------------------------------------------

// Waits for all of this thread's cp.async copies (committed or not).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Orders this thread's generic-proxy shared-memory accesses (ordinary stores,
// cp.async results it has observed) with later async-proxy accesses (wgmma
// operand reads, bulk copies), and the other way round.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Adds `bytes` of fp32 from shared memory into global memory (one bulk
// reduction; element-wise atomic adds, relaxed, subnormals flushed). Both
// addresses 16-byte aligned, `bytes` a multiple of 16.
__device__ __forceinline__ void bulk_reduce_add_f32(float* destination, unsigned source, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(destination),
               "r"(source), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until the bulk groups of this thread, all but the newest kPending,
// have finished reading their shared-memory sources.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until the bulk groups of this thread, all but the newest kPending, are complete.
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- shared-memory accesses by address ---------------------------------------------------

__device__ __forceinline__ void store_shared_u32(unsigned address, unsigned value) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(value) : "memory");
}

__device__ __forceinline__ void store_shared_f32x2(unsigned address, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(x), "f"(y) : "memory");
}

__device__ __forceinline__ float2 load_shared_f32x2(unsigned address) {
  float2 value;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(value.x), "=f"(value.y) : "r"(address) : "memory");
  return value;
}

__device__ __forceinline__ uint4 load_shared_u32x4(unsigned address) {
  uint4 value;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)
               : "r"(address)
               : "memory");
  return value;
}

// ---- barriers and registers --------------------------------------------------------------

// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` without waiting (the waiting side uses named_barrier_sync
// with the same thread count).
__device__ __forceinline__ void named_barrier_arrive(unsigned id, unsigned threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register reallocation between the warpgroups of a block (sm_90a): every warp
// of a warpgroup executes the same call. The kernel needs a register cap at
// entry (__launch_bounds__(threads, 1)); the counts of all warpgroups must fit
// the block's allocation.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Index of the calling thread's warpgroup, known to the compiler to be uniform
// across the warp (so role branches compile to uniform branches).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

}  // namespace kernels
}  // namespace dflex
