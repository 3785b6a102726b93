// RUN: dflex-compile %s --emit-cuda | FileCheck %s

// The Hopper (sm_90a, wgmma) kernels are declared only under the sm_90a
// feature macro: a forward and a backward for head_dim 64 and 128, a forward
// only for 256 (its backward is the portable one). Their launch constants sit
// under the same guard.

dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}

dflex.attention @d64 mask @causal heads(8, 2) head_dim(64, 64) : bf16
dflex.attention @d128 mask @causal heads(8, 2) head_dim(128, 128) : f16
dflex.attention @d256 mask @causal heads(8, 2) head_dim(256, 256) : bf16

// CHECK-LABEL: the attention kernels of @d64.
// CHECK:       #include "analysis/tile_classify.cuh"
// CHECK-NEXT:  // The Hopper kernels (wgmma) exist only when compiling for sm_90a.
// CHECK-NEXT:  #if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// CHECK-NEXT:  #include "attention/sm90/attention_sm90.cuh"
// CHECK-NEXT:  #endif
// CHECK:       // The configs of the arch this binary is compiled for.
// CHECK-NEXT:  using Configs = ::dflex::kernels::DefaultAttentionConfigs<__nv_bfloat16, 64, ::dflex::kernels::kCompiledComputeCapability>;
// CHECK-NEXT:  #if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// CHECK-NEXT:  using Sm90Configs = ::dflex::kernels::Sm90AttentionConfigs<__nv_bfloat16, 64>;
// CHECK-NEXT:  #endif
// CHECK:       extern "C" __device__ const int dflex_forward_launch[4]
// CHECK:       extern "C" __device__ const int dflex_backward_launch[6]
// CHECK:       extern "C" __device__ const int dflex_tile_classify_launch[1]
// CHECK:       #if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// CHECK-NEXT:  extern "C" __device__ const int dflex_forward_sm90_launch[4] = {
// CHECK-NEXT:      dflex_generated::Sm90Configs::Forward::kThreads, dflex_generated::Sm90Configs::Forward::kSharedBytes,
// CHECK-NEXT:      dflex_generated::Sm90Configs::Forward::kBlockM, dflex_generated::Sm90Configs::Forward::kBlockN};
// CHECK-NEXT:  extern "C" __device__ const int dflex_backward_sm90_launch[6] = {
// CHECK-NEXT:      dflex_generated::Sm90Configs::Backward::kThreads, dflex_generated::Sm90Configs::Backward::kSharedBytes,
// CHECK-NEXT:      dflex_generated::Sm90Configs::Backward::kBlockM, dflex_generated::Sm90Configs::Backward::kBlockN,
// CHECK-NEXT:      ::dflex::kernels::kRowKernelThreads, ::dflex::kernels::kRowKernelRows};
// CHECK-NEXT:  #endif

// CHECK-LABEL: the attention kernels of @d128.
// CHECK:       #include "attention/sm90/attention_sm90.cuh"
// CHECK:       using Sm90Configs = ::dflex::kernels::Sm90AttentionConfigs<__half, 128>;
// CHECK:       #if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// CHECK-NEXT:  extern "C" __device__ const int dflex_forward_sm90_launch[4]
// CHECK:       extern "C" __device__ const int dflex_backward_sm90_launch[6] = {
// CHECK-NEXT:      dflex_generated::Sm90Configs::Backward::kThreads, dflex_generated::Sm90Configs::Backward::kSharedBytes,
// CHECK-NEXT:      dflex_generated::Sm90Configs::Backward::kBlockM, dflex_generated::Sm90Configs::Backward::kBlockN,
// CHECK-NEXT:      ::dflex::kernels::kRowKernelThreads, ::dflex::kernels::kRowKernelRows};
// CHECK-NEXT:  #endif

// CHECK-LABEL: the attention kernels of @d256.
// CHECK:       #include "attention/sm90/attention_sm90.cuh"
// CHECK:       using Sm90Configs = ::dflex::kernels::Sm90AttentionConfigs<__nv_bfloat16, 256>;
// CHECK:       extern "C" __device__ const int dflex_tile_classify_launch[1]
// CHECK:       #if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// CHECK-NEXT:  extern "C" __device__ const int dflex_forward_sm90_launch[4] = {
// CHECK-NEXT:      dflex_generated::Sm90Configs::Forward::kThreads, dflex_generated::Sm90Configs::Forward::kSharedBytes,
// CHECK-NEXT:      dflex_generated::Sm90Configs::Forward::kBlockM, dflex_generated::Sm90Configs::Forward::kBlockN};
// CHECK-NEXT:  #endif
// CHECK-NOT:   _sm90_launch
