// Candidates for the backward's row kernels (preprocess, both dQ conversions),
// timed and checked against the library's with --row-kernel-candidates. The library's
// take one (batch, head, query) row per warp: at 32 heads x 8192 queries that is
// 32,768 blocks of 8 rows, each warp with a single round trip to memory in
// flight, and they ran at about two thirds of the H200's bandwidth. These take
// kRowsPerWarp consecutive rows per warp and issue every load before using any:
// O and dO as 16-byte vectors, the accumulator as float4 quads. If they are
// faster, they replace the library's (kRowKernelRowsPerWarp = 4 in
// kernels/attention/config.cuh; the runtime reads the rows per block from the
// bundle's row_kernel_rows).
#pragma once

#include "attention/backward.cuh"
#ifdef DFLEX_TEST_SM90
#include "attention/sm90/backward_wgmma.cuh"
#endif

namespace row_kernel_candidates {

using dflex::kernels::AttentionBackwardParams;
using dflex::kernels::AttentionShape;
using dflex::kernels::ElementTraits;
using dflex::kernels::kRowKernelThreads;
using dflex::kernels::QueryRow;
using dflex::kernels::tensor_row;

constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kRowKernelThreads / 32 * kRowsPerWarp;

// The rows of one warp: kRowsPerWarp consecutive rows from `first`, of which
// those below `end` exist.
struct RowKernelWarp {
  long long first;
  long long end;

  __device__ __forceinline__ static RowKernelWarp of_thread(const AttentionShape& shape) {
    RowKernelWarp warp;
    warp.first = (static_cast<long long>(blockIdx.x) * (kRowKernelThreads / 32) + (threadIdx.x >> 5)) * kRowsPerWarp;
    warp.end = static_cast<long long>(shape.batch) * shape.q_heads * shape.q_len;
    return warp;
  }
  __device__ __forceinline__ bool empty() const { return first >= end; }
  __device__ __forceinline__ bool holds(int row) const { return first + row < end; }
};

// sum(a * b) over the 8 elements of two 16-byte vectors.
template <class Element>
__device__ __forceinline__ float dot_vector(const uint4& a, const uint4& b) {
  const Element* x = reinterpret_cast<const Element*>(&a);
  const Element* y = reinterpret_cast<const Element*>(&b);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum += ElementTraits<Element>::to_float(x[i]) * ElementTraits<Element>::to_float(y[i]);
  return sum;
}

// Grid: ceil(batch * q_heads * q_len / kRowsPerBlock); kRowKernelThreads threads.
// Lane l reads 16-byte vectors l, l + 32, ... of the warp's rows of O and dO
// laid end to end, so a row's vectors sit on min(32, head_dim / 8) consecutive
// lanes, which sum them. kZeroAccumulator = false leaves the accumulator alone.
template <class Config, bool kZeroAccumulator = true>
__global__ void __launch_bounds__(kRowKernelThreads) preprocess_kernel(const AttentionBackwardParams params) {
  using Element = typename Config::Element;
  constexpr int kHeadDim = Config::kHeadDim;
  constexpr int kRowVectors = kHeadDim / 8;
  constexpr int kLanesPerRow = kRowVectors < 32 ? kRowVectors : 32;
  constexpr int kVectorsPerLane = kRowsPerWarp * kRowVectors / 32;
  static_assert(kRowsPerWarp * kRowVectors % 32 == 0, "a warp's rows must be whole 16-byte vectors per lane");
  const AttentionShape& shape = params.shape;
  const RowKernelWarp warp = RowKernelWarp::of_thread(shape);
  if (warp.empty()) return;
  const int lane = threadIdx.x & 31;

  uint4 o[kVectorsPerLane], grad_o[kVectorsPerLane];
#pragma unroll
  for (int k = 0; k < kVectorsPerLane; ++k) {
    const int vector = lane + 32 * k;
    const int row_in_warp = vector / kRowVectors;
    o[k] = grad_o[k] = make_uint4(0, 0, 0, 0);
    if (!warp.holds(row_in_warp)) continue;
    const QueryRow row = QueryRow::at(warp.first + row_in_warp, shape);
    const int col = 8 * (vector % kRowVectors);
    o[k] = *reinterpret_cast<const uint4*>(
        tensor_row<Element>(params.o, params.o_strides, row.batch, row.head, row.q) + col);
    grad_o[k] = *reinterpret_cast<const uint4*>(
        tensor_row<Element>(params.grad_o, params.grad_o_strides, row.batch, row.head, row.q) + col);
  }
  if constexpr (kZeroAccumulator) {
    // The warp's rows of the accumulator are consecutive.
    constexpr int kRowQuads = kHeadDim / 4;
    float4* accum = reinterpret_cast<float4*>(params.grad_q_accum + warp.first * kHeadDim);
#pragma unroll
    for (int quad = lane; quad < kRowsPerWarp * kRowQuads; quad += 32) {
      if (warp.holds(quad / kRowQuads)) accum[quad] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int k = 0; k < kVectorsPerLane; ++k) {
    float sum = dot_vector<Element>(o[k], grad_o[k]);
#pragma unroll
    for (int offset = kLanesPerRow / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const int row_in_warp = (lane + 32 * k) / kRowVectors;
    if (lane % kLanesPerRow == 0 && warp.holds(row_in_warp)) params.delta[warp.first + row_in_warp] = sum;
  }
}

// Converts a warp's rows of the fp32 dQ accumulator to dQ. Lane l reads float4
// quads l, l + 32, ... of the rows laid end to end, all before it stores any,
// then calls store(row, position, quad) for each: `position` is the quad's
// first column in the accumulator's row, whose layout the family's main kernel
// chose.
template <int kHeadDim, class Store>
__device__ __forceinline__ void convert_grad_q_rows(const AttentionBackwardParams& params, Store store) {
  constexpr int kRowQuads = kHeadDim / 4;
  constexpr int kQuadsPerLane = kRowsPerWarp * kRowQuads / 32;
  static_assert(kRowsPerWarp * kRowQuads % 32 == 0, "a warp's rows must be whole quads per lane");
  const RowKernelWarp warp = RowKernelWarp::of_thread(params.shape);
  if (warp.empty()) return;
  const int lane = threadIdx.x & 31;

  const float4* accum = reinterpret_cast<const float4*>(params.grad_q_accum + warp.first * kHeadDim);
  float4 quads[kQuadsPerLane];
#pragma unroll
  for (int k = 0; k < kQuadsPerLane; ++k) {
    const int quad = lane + 32 * k;
    quads[k] = warp.holds(quad / kRowQuads) ? accum[quad] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int k = 0; k < kQuadsPerLane; ++k) {
    const int quad = lane + 32 * k;
    if (!warp.holds(quad / kRowQuads)) continue;
    store(QueryRow::at(warp.first + quad / kRowQuads, params.shape), 4 * (quad % kRowQuads), quads[k]);
  }
}

// The portable accumulator's layout (dflex::kernels::portable_grad_q_column).
template <class Config>
__global__ void __launch_bounds__(kRowKernelThreads) grad_q_kernel(const AttentionBackwardParams params) {
  using Element = typename Config::Element;
  convert_grad_q_rows<Config::kHeadDim>(params, [&](const QueryRow& row, int position, const float4& value) {
    Element* grad_q = tensor_row<Element>(params.grad_q, params.grad_q_strides, row.batch, row.head, row.q);
    const int col = dflex::kernels::portable_grad_q_column(position);
    *reinterpret_cast<unsigned*>(grad_q + col) = ElementTraits<Element>::pack(value.x, value.y);
    *reinterpret_cast<unsigned*>(grad_q + col + 8) = ElementTraits<Element>::pack(value.z, value.w);
  });
}

#ifdef DFLEX_TEST_SM90
// The sm90 accumulator's layout (dflex::kernels::sm90_grad_q_column): the
// permutation is its own inverse and keeps a chunk's four columns together, so
// each quad is one 8-byte store.
template <class Config>
__global__ void __launch_bounds__(kRowKernelThreads) grad_q_sm90_kernel(const AttentionBackwardParams params) {
  using Element = typename Config::Element;
  convert_grad_q_rows<Config::kHeadDim>(params, [&](const QueryRow& row, int position, const float4& value) {
    Element* grad_q = tensor_row<Element>(params.grad_q, params.grad_q_strides, row.batch, row.head, row.q);
    *reinterpret_cast<uint2*>(grad_q + dflex::kernels::sm90_grad_q_column(row.q, position)) =
        make_uint2(ElementTraits<Element>::pack(value.x, value.y), ElementTraits<Element>::pack(value.z, value.w));
  });
}
#endif

}  // namespace row_kernel_candidates
