// Exact tile classification: evaluates a variant's mask on every pair of
// candidate tiles (those the host-side interval analysis could only call
// partial) and tells empty, partial and full tiles apart, so the attention
// kernels skip empty tiles and run full ones without the mask.
#pragma once

namespace dflex {
namespace kernels {

enum TileClass : unsigned char { kTileEmpty = 0, kTilePartial = 1, kTileFull = 2 };

struct TileCandidate {
  int batch;
  int head;     // query head
  int q_tile;
  int kv_tile;
};

struct TileClassifyParams {
  const TileCandidate* candidates;
  int count;
  int q_len;
  int kv_len;
  int tile_m;   // queries per tile
  int tile_n;   // keys per tile
  unsigned char* classes;  // [count], one TileClass per candidate
};

// The class of one tile from the number of visible pairs among its
// in-range pairs (pairs past q_len / kv_len do not exist).
__host__ __device__ __forceinline__ TileClass tile_class(long long visible, long long pairs) {
  return visible == 0 ? kTileEmpty : visible == pairs ? kTileFull : kTilePartial;
}

// Serial classification of one tile: the reference for the kernel below
// and what a host without a GPU uses.
template <class Variant>
__host__ __device__ TileClass classify_tile_serial(const Variant& variant, const TileCandidate& tile,
                                                   int q_len, int kv_len, int tile_m, int tile_n) {
  const long long q0 = (long long)tile.q_tile * tile_m, kv0 = (long long)tile.kv_tile * tile_n;
  const long long q1 = q0 + tile_m < q_len ? q0 + tile_m : q_len;
  const long long kv1 = kv0 + tile_n < kv_len ? kv0 + tile_n : kv_len;
  long long visible = 0, pairs = 0;
  for (long long q = q0; q < q1; ++q)
    for (long long kv = kv0; kv < kv1; ++kv) {
      visible += variant.mask(tile.batch, tile.head, q, kv) ? 1 : 0;
      ++pairs;
    }
  return tile_class(visible, pairs);
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

constexpr int kTileClassifyThreads = 256;

// Grid: (count); kTileClassifyThreads threads; no shared memory beyond two
// counters. One block per candidate tile.
template <class Variant>
__global__ void __launch_bounds__(kTileClassifyThreads)
    tile_classify_kernel(const TileClassifyParams params, const Variant variant) {
  __shared__ unsigned long long visible_pairs;
  const int index = blockIdx.x;
  if (index >= params.count) return;
  if (threadIdx.x == 0) visible_pairs = 0;
  __syncthreads();

  const TileCandidate tile = params.candidates[index];
  const long long q0 = (long long)tile.q_tile * params.tile_m;
  const long long kv0 = (long long)tile.kv_tile * params.tile_n;
  const int rows = (int)(q0 + params.tile_m < params.q_len ? params.tile_m : params.q_len - q0);
  const int cols = (int)(kv0 + params.tile_n < params.kv_len ? params.tile_n : params.kv_len - kv0);
  const int pairs = rows > 0 && cols > 0 ? rows * cols : 0;
  unsigned long long mine = 0;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x)
    mine += variant.mask(tile.batch, tile.head, q0 + i / cols, kv0 + i % cols) ? 1 : 0;
  if (mine) atomicAdd(&visible_pairs, mine);
  __syncthreads();
  if (threadIdx.x == 0) params.classes[index] = tile_class((long long)visible_pairs, pairs);
}

#endif

}  // namespace kernels
}  // namespace dflex
