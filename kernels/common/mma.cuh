// Tensor-core building blocks for the portable (sm_80+, sm_90, sm_120) path:
// mma.sync m16n8k16 with fp32 accumulation on bf16 or fp16 operands, operand
// fragments loaded from swizzled shared-memory tiles by ldmatrix, and whole
// tiles moved between global and shared memory with 16-byte copies.
//
// Fragment layout of one m16n8k16 product (g = lane / 4, t = lane % 4):
//   A (16x16, 4 regs of 2 elements): a0 = A[g][2t..2t+1],   a1 = A[g+8][2t..],
//                                    a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..]
//   B (16x8,  2 regs):               b0 = B[2t..2t+1][g],   b1 = B[2t+8..2t+9][g]
//   C (16x8,  4 floats):             c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "device.cuh"

namespace dflex {
namespace kernels {

template <class Element>
struct ElementTraits;

template <>
struct ElementTraits<__nv_bfloat16> {
  // Packs two floats (lo in the low half) with round-to-nearest-even.
  __device__ __forceinline__ static unsigned pack(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
  }
  __device__ __forceinline__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct ElementTraits<__half> {
  __device__ __forceinline__ static unsigned pack(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
  }
  __device__ __forceinline__ static float to_float(__half x) { return __half2float(x); }
  __device__ __forceinline__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// A kRows x kCols tile of 16-bit elements in shared memory, row-major, with
// the 16-byte chunks of each row XOR-swizzled so that the eight row addresses
// of an ldmatrix (same chunk, eight consecutive rows) fall in distinct banks.
template <int kRows_, int kCols_>
struct SwizzledTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kChunksPerRow = kCols / 8;
  static constexpr int kBytes = kRows * kCols * 2;
  static_assert(kRows % 16 == 0, "tile rows must be a multiple of 16");
  static_assert(kChunksPerRow == 4 || kChunksPerRow % 8 == 0,
                "tile rows must be 32 or a multiple of 64 elements for the swizzle");

  // Element offset of (row, col); col's low three bits index inside a chunk.
  __device__ __forceinline__ static int offset(int row, int col) {
    // 128-byte rows or longer: eight rows cycle through eight chunks. 64-byte
    // rows: two rows share a 128-byte line, so pairs of rows cycle through four.
    const int swizzle = kChunksPerRow >= 8 ? (row & 7) : ((row >> 1) & 3);
    return row * kCols + ((((col >> 3) ^ swizzle)) << 3) + (col & 7);
  }
};

// The shared-window address of tile element (row, col). NVRTC keeps shared
// pointers 64 bits wide, so converting `tile + offset` adds each offset to a
// 64-bit address and truncates it; converting the tile and adding in 32 bits
// made its sm_120-config forwards 4-7% faster (docs/perf.md). Not for tiles of
// 256 columns, where it makes sm_120's head_dim 256 forward spill (52-84 B
// against 0-8), nor under nvcc, whose shared pointers are 32 bits and which
// hoists whole addresses out of loops in the pointer form (its forwards were
// 3-8% slower in the other).
template <class Tile, class Element>
__device__ __forceinline__ unsigned tile_address(const Element* tile, int row, int col) {
#if defined(__CUDACC_RTC__)
  if constexpr (Tile::kCols < 256)
    return shared_address(tile) + static_cast<unsigned>(Tile::offset(row, col) * static_cast<int>(sizeof(Element)));
#endif
  return shared_address(tile + Tile::offset(row, col));
}

// Operand fragments from swizzled tiles. "row0/k0" etc. are tile coordinates
// of the fragment's first element; all must be multiples of 8 (16 for k).

// A (16x16) = tile[row0 .. row0+15][k0 .. k0+15], tile row-major [M][K].
template <class Tile, class Element>
__device__ __forceinline__ void load_a(unsigned (&a)[4], const Element* tile, int row0, int k0, int lane) {
  const int row = row0 + (lane & 15);
  const int col = k0 + ((lane >> 4) << 3);
  ldmatrix_x4(a, tile_address<Tile>(tile, row, col));
}

// A (16x16) = transpose of tile[k0 .. k0+15][row0 .. row0+15], tile stored [K][M].
template <class Tile, class Element>
__device__ __forceinline__ void load_a_transposed(unsigned (&a)[4], const Element* tile, int row0, int k0,
                                                  int lane) {
  const int k = k0 + (lane & 7) + ((lane >> 4) << 3);
  const int m = row0 + (((lane >> 3) & 1) << 3);
  ldmatrix_x4_trans(a, tile_address<Tile>(tile, k, m));
}

// B fragments of two adjacent 8-column blocks n0..n0+7 and n0+8..n0+15 over
// k0..k0+15, from a tile stored [N][K] (B = tile^T): b[0], b[1] are the first
// block's b0, b1 and b[2], b[3] the second's.
template <class Tile, class Element>
__device__ __forceinline__ void load_b_pair(unsigned (&b)[4], const Element* tile, int n0, int k0, int lane) {
  const int n = n0 + (lane & 7) + ((lane >> 4) << 3);
  const int k = k0 + (((lane >> 3) & 1) << 3);
  ldmatrix_x4(b, tile_address<Tile>(tile, n, k));
}

// As load_b_pair, from a tile stored [K][N] (B = tile).
template <class Tile, class Element>
__device__ __forceinline__ void load_b_pair_transposed(unsigned (&b)[4], const Element* tile, int n0, int k0,
                                                       int lane) {
  const int k = k0 + (lane & 7) + (((lane >> 3) & 1) << 3);
  const int n = n0 + ((lane >> 4) << 3);
  ldmatrix_x4_trans(b, tile_address<Tile>(tile, k, n));
}

// One warp: acc (16*kMAtoms x 8*kBlocksN) += A (16*kMAtoms x 16*kSteps) * B (16*kSteps x 8*kBlocksN),
// with load_a(step, a) giving A's fragments of reduction step `step` (m-atom m
// in a[m]). B columns b_n0.., reduction rows b_k0.. of b_tile, stored [K][N]
// with kBTransposed and [N][K] otherwise. Each B fragment serves all kMAtoms
// row blocks, so more m-atoms per warp means fewer shared-memory reads per product.
template <class Element, int kMAtoms, int kBlocksN, int kSteps, bool kBTransposed, class BTile, class LoadA>
__device__ __forceinline__ void warp_mma_steps(float (&acc)[kMAtoms][kBlocksN][4], const LoadA& load_a_step,
                                               const Element* b_tile, int b_n0, int b_k0, int lane) {
  static_assert(kBlocksN % 2 == 0, "B fragments are loaded two 8-column blocks at a time");
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    unsigned a[kMAtoms][4];
    load_a_step(step, a);
#pragma unroll
    for (int pair = 0; pair < kBlocksN / 2; ++pair) {
      unsigned b[4];
      if constexpr (kBTransposed) {
        load_b_pair_transposed<BTile>(b, b_tile, b_n0 + pair * 16, b_k0 + step * 16, lane);
      } else {
        load_b_pair<BTile>(b, b_tile, b_n0 + pair * 16, b_k0 + step * 16, lane);
      }
#pragma unroll
      for (int m = 0; m < kMAtoms; ++m) {
        ElementTraits<Element>::mma(acc[m][2 * pair], a[m], b[0], b[1]);
        ElementTraits<Element>::mma(acc[m][2 * pair + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// warp_mma_steps with A read from a_tile: rows a_row0.. (m-atom m at
// a_row0 + 16m), columns a_k0..; kATransposed: A's tile is stored [K][M].
template <class Element, int kMAtoms, int kBlocksN, int kSteps, bool kATransposed, bool kBTransposed, class ATile,
          class BTile>
__device__ __forceinline__ void warp_mma_rows(float (&acc)[kMAtoms][kBlocksN][4], const Element* a_tile, int a_row0,
                                              int a_k0, const Element* b_tile, int b_n0, int b_k0, int lane) {
  const auto load_a_step = [&](int step, unsigned (&a)[kMAtoms][4]) {
#pragma unroll
    for (int m = 0; m < kMAtoms; ++m) {
      if constexpr (kATransposed) {
        load_a_transposed<ATile>(a[m], a_tile, a_row0 + 16 * m, a_k0 + step * 16, lane);
      } else {
        load_a<ATile>(a[m], a_tile, a_row0 + 16 * m, a_k0 + step * 16, lane);
      }
    }
  };
  warp_mma_steps<Element, kMAtoms, kBlocksN, kSteps, kBTransposed, BTile>(acc, load_a_step, b_tile, b_n0, b_k0, lane);
}

// The A fragments of rows row0.. (m-atom m at row0 + 16m) and all kSteps
// reduction steps of a tile stored [M][K], for a warp that keeps them in
// registers across products (warp_mma_rows_from_fragments).
template <class ATile, int kMAtoms, int kSteps, class Element>
__device__ __forceinline__ void load_a_fragments(unsigned (&a)[kMAtoms][kSteps][4], const Element* tile, int row0,
                                                 int lane) {
#pragma unroll
  for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
    for (int step = 0; step < kSteps; ++step) load_a<ATile>(a[m][step], tile, row0 + 16 * m, step * 16, lane);
  }
}

// warp_mma_steps with A from fragments held in registers (load_a_fragments).
template <class Element, int kMAtoms, int kBlocksN, int kSteps, bool kBTransposed, class BTile>
__device__ __forceinline__ void warp_mma_rows_from_fragments(float (&acc)[kMAtoms][kBlocksN][4],
                                                             const unsigned (&a_fragments)[kMAtoms][kSteps][4],
                                                             const Element* b_tile, int b_n0, int b_k0, int lane) {
  const auto load_a_step = [&](int step, unsigned (&a)[kMAtoms][4]) {
#pragma unroll
    for (int m = 0; m < kMAtoms; ++m) {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[m][i] = a_fragments[m][step][i];
    }
  };
  warp_mma_steps<Element, kMAtoms, kBlocksN, kSteps, kBTransposed, BTile>(acc, load_a_step, b_tile, b_n0, b_k0, lane);
}

// warp_mma_rows for one m-atom (16 rows).
template <class Element, int kBlocksN, int kSteps, bool kATransposed, bool kBTransposed, class ATile, class BTile>
__device__ __forceinline__ void warp_mma(float (&acc)[kBlocksN][4], const Element* a_tile, int a_row0, int a_k0,
                                         const Element* b_tile, int b_n0, int b_k0, int lane) {
  warp_mma_rows<Element, 1, kBlocksN, kSteps, kATransposed, kBTransposed, ATile, BTile>(
      reinterpret_cast<float(&)[1][kBlocksN][4]>(acc), a_tile, a_row0, a_k0, b_tile, b_n0, b_k0, lane);
}

// Two independent warp_mma products of one shape (A tiles [M][K], B tiles
// [N][K]) in one loop: each step loads both products' fragments, then issues
// both products' mma, so that twice the independent accumulators hide the
// latency of ldmatrix and of the mma chains.
template <class Element, int kBlocksN, int kSteps, class ATile, class BTile>
__device__ __forceinline__ void warp_mma_two(float (&acc0)[kBlocksN][4], const Element* a0_tile,
                                             const Element* b0_tile, float (&acc1)[kBlocksN][4],
                                             const Element* a1_tile, const Element* b1_tile, int a_row0, int b_n0,
                                             int lane) {
  static_assert(kBlocksN % 2 == 0, "B fragments are loaded two 8-column blocks at a time");
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    unsigned a0[4], a1[4];
    load_a<ATile>(a0, a0_tile, a_row0, step * 16, lane);
    load_a<ATile>(a1, a1_tile, a_row0, step * 16, lane);
#pragma unroll
    for (int pair = 0; pair < kBlocksN / 2; ++pair) {
      unsigned b0[4], b1[4];
      load_b_pair<BTile>(b0, b0_tile, b_n0 + pair * 16, step * 16, lane);
      load_b_pair<BTile>(b1, b1_tile, b_n0 + pair * 16, step * 16, lane);
      ElementTraits<Element>::mma(acc0[2 * pair], a0, b0[0], b0[1]);
      ElementTraits<Element>::mma(acc1[2 * pair], a1, b1[0], b1[1]);
      ElementTraits<Element>::mma(acc0[2 * pair + 1], a0, b0[2], b0[3]);
      ElementTraits<Element>::mma(acc1[2 * pair + 1], a1, b1[2], b1[3]);
    }
  }
}

// One warp: acc (16*kMAtoms x 8*kBlocksN) += A B, with A the warp's
// accumulators of a previous product (16*kMAtoms x 8*kBlocksK, in registers:
// the C fragments of column blocks 2s and 2s+1 are the A fragment of
// reduction step s, packed to Element) and B read from a tile stored [K][N].
template <class Element, class BTile, int kMAtoms, int kBlocksK, int kBlocksN>
__device__ __forceinline__ void warp_mma_from_accumulators(float (&acc)[kMAtoms][kBlocksN][4],
                                                           const float (&a_acc)[kMAtoms][kBlocksK][4],
                                                           const Element* b_tile, int lane) {
  static_assert(kBlocksK % 2 == 0 && kBlocksN % 2 == 0, "A and B come two 8-column blocks at a time");
#pragma unroll
  for (int step = 0; step < kBlocksK / 2; ++step) {
    unsigned a[kMAtoms][4];
#pragma unroll
    for (int m = 0; m < kMAtoms; ++m) {
      a[m][0] = ElementTraits<Element>::pack(a_acc[m][2 * step][0], a_acc[m][2 * step][1]);
      a[m][1] = ElementTraits<Element>::pack(a_acc[m][2 * step][2], a_acc[m][2 * step][3]);
      a[m][2] = ElementTraits<Element>::pack(a_acc[m][2 * step + 1][0], a_acc[m][2 * step + 1][1]);
      a[m][3] = ElementTraits<Element>::pack(a_acc[m][2 * step + 1][2], a_acc[m][2 * step + 1][3]);
    }
#pragma unroll
    for (int pair = 0; pair < kBlocksN / 2; ++pair) {
      unsigned b[4];
      load_b_pair_transposed<BTile>(b, b_tile, pair * 16, step * 16, lane);
#pragma unroll
      for (int m = 0; m < kMAtoms; ++m) {
        ElementTraits<Element>::mma(acc[m][2 * pair], a[m], b[0], b[1]);
        ElementTraits<Element>::mma(acc[m][2 * pair + 1], a[m], b[2], b[3]);
      }
    }
  }
}

template <int kBlocksN>
__device__ __forceinline__ void zero(float (&acc)[kBlocksN][4]) {
#pragma unroll
  for (int j = 0; j < kBlocksN; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
  }
}

template <int kMAtoms, int kBlocksN>
__device__ __forceinline__ void zero(float (&acc)[kMAtoms][kBlocksN][4]) {
#pragma unroll
  for (int m = 0; m < kMAtoms; ++m) zero(acc[m]);
}

// Starts copying rows [0, Tile::kRows) of a global matrix (rows of Tile::kCols
// contiguous elements, `row_stride` elements apart) into `tile`; rows at or
// past `valid_rows` are zero-filled and not read. All `kThreads` threads of
// the block call it. When the threads cover whole rows in each pass, and a
// pass spans a multiple of the swizzle's 8-row period, each thread keeps one
// chunk column and one swizzle row: its shared offset and global address
// advance by constants (a few instructions per copy instead of recomputing
// both, 64-bit multiply included).
template <class Tile, int kThreads, class Element>
__device__ __forceinline__ void async_load_tile(Element* tile, const Element* rows, long long row_stride,
                                                int valid_rows, int thread) {
  constexpr int kChunks = Tile::kRows * Tile::kChunksPerRow;
  constexpr int kRowsPerPass = kThreads / Tile::kChunksPerRow;
  if constexpr (kThreads % Tile::kChunksPerRow == 0 && kRowsPerPass % 8 == 0 && Tile::kRows % kRowsPerPass == 0) {
    const int row0 = thread / Tile::kChunksPerRow;
    const int col = (thread % Tile::kChunksPerRow) * 8;
    const unsigned destination = tile_address<Tile>(tile, row0, col);
    const Element* source = rows + row0 * row_stride + col;
    const long long pass_stride = kRowsPerPass * row_stride;
#pragma unroll
    for (int pass = 0; pass < Tile::kRows / kRowsPerPass; ++pass) {
      // A row past valid_rows is not read (zero source bytes): its address
      // may lie past the matrix.
      cp_async_16(destination + pass * kRowsPerPass * Tile::kCols * static_cast<int>(sizeof(Element)),
                  source + pass * pass_stride,
                  row0 + pass * kRowsPerPass < valid_rows);
    }
  } else {
#pragma unroll
    for (int chunk = thread; chunk < kChunks; chunk += kThreads) {
      const int row = chunk / Tile::kChunksPerRow;
      const int col = (chunk % Tile::kChunksPerRow) * 8;
      const bool valid = row < valid_rows;
      const Element* source = valid ? rows + row * row_stride + col : rows;
      cp_async_16(tile_address<Tile>(tile, row, col), source, valid);
    }
  }
}

// Copies rows [0, valid_rows) of `tile` to global memory with 16-byte stores.
template <class Tile, int kThreads, class Element>
__device__ __forceinline__ void store_tile(Element* rows, long long row_stride, const Element* tile, int valid_rows,
                                           int thread) {
  constexpr int kChunks = Tile::kRows * Tile::kChunksPerRow;
#pragma unroll
  for (int chunk = thread; chunk < kChunks; chunk += kThreads) {
    const int row = chunk / Tile::kChunksPerRow;
    const int col = (chunk % Tile::kChunksPerRow) * 8;
    if (row < valid_rows) {
      *reinterpret_cast<uint4*>(rows + row * row_stride + col) =
          *reinterpret_cast<const uint4*>(tile + Tile::offset(row, col));
    }
  }
}

// Writes a warp's 16 x 8*kBlocksN accumulator into `tile` at (row0, col0) as
// packed 16-bit pairs, rows row0 + lane/4 scaled by scale_upper and the rows
// 8 below by scale_lower.
template <class Tile, class Element, int kBlocksN>
__device__ __forceinline__ void store_accumulator(Element* tile, const float (&acc)[kBlocksN][4], float scale_upper,
                                                  float scale_lower, int row0, int col0, int lane) {
  const int row = row0 + (lane >> 2);
  const int col = col0 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < kBlocksN; ++j) {
    *reinterpret_cast<unsigned*>(tile + Tile::offset(row, col + 8 * j)) =
        ElementTraits<Element>::pack(acc[j][0] * scale_upper, acc[j][1] * scale_upper);
    *reinterpret_cast<unsigned*>(tile + Tile::offset(row + 8, col + 8 * j)) =
        ElementTraits<Element>::pack(acc[j][2] * scale_lower, acc[j][3] * scale_lower);
  }
}

}  // namespace kernels
}  // namespace dflex
