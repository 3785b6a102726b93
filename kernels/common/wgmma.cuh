// Hopper (sm_90a) warpgroup matrix products: wgmma.mma_async with bf16/fp16
// operands and fp32 accumulators, shared-memory operands in the canonical
// 128-byte-swizzled layout, described by 64-bit matrix descriptors.
//
// A warpgroup (4 consecutive warps, the first one's index divisible by 4)
// computes D (64 x N) (+)= A (64 x 16) * B (16 x N) per instruction. Register
// layouts (warp w of the warpgroup owns rows 16w..16w+15; g = lane / 4,
// t = lane % 4) are those of mma.sync m16n8k16, stacked over the four warps:
//   D: d[j][0..1] = D[16w + g][8j + 2t, +1], d[j][2..3] = D[16w + g + 8][8j + 2t, +1]
//   A (registers, one k-step): a[0] = A[16w + g][2t, +1], a[1] = A[16w + g + 8][2t, +1],
//                              a[2] = A[16w + g][2t + 8, +9], a[3] = A[16w + g + 8][2t + 8, +9]
// so the accumulator blocks 2s, 2s + 1 of one product, packed to 16 bits,
// are the A operand of k-step s of the next.
//
// Shared-memory tiles (Sw128Tile): a kRows x kCols matrix of 16-bit elements,
// stored as column blocks of 64 elements (128 bytes per row, kRows * 128 bytes
// per block); inside a block, 8-row groups are 1024 bytes apart and the 16-byte
// chunk c of row r sits at chunk c ^ (r % 8) (the hardware's 128-byte swizzle
// of address bits [4:6] with [7:9], so tiles start 1024-byte aligned). The same
// tile serves as
//   a K-major operand: tile rows = M (or N) index, tile columns = K index;
//   an MN-major operand: tile rows = K index, tile columns = M (or N) index
//     (the transposed operands of wgmma, e.g. V in O += P V).
#pragma once

#include "mma.cuh"
#include "pipeline.cuh"

namespace dflex {
namespace kernels {

// Matrix descriptor, 128-byte swizzle, matrix base offset 0 (1024-byte aligned
// swizzle pattern). Offsets are in bytes.
__device__ __forceinline__ unsigned long long wgmma_descriptor(unsigned address, unsigned leading_byte_offset,
                                                               unsigned stride_byte_offset) {
  const unsigned long long start = (address & 0x3FFFFu) >> 4;
  const unsigned long long leading = (leading_byte_offset & 0x3FFFFu) >> 4;
  const unsigned long long stride = (stride_byte_offset & 0x3FFFFu) >> 4;
  return start | (leading << 16) | (stride << 32) | (1ull << 62);
}

template <int kRows_, int kCols_>
struct Sw128Tile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kBytes = kRows * kCols * 2;
  static constexpr int kBlockBytes = kRows * 128;  // one 64-column block
  static_assert(kRows % 8 == 0 && kCols % 64 == 0, "tiles are whole 8-row x 64-column swizzle atoms");

  // Byte offset of element (row, col); col % 8 indexes inside a 16-byte chunk.
  __device__ __forceinline__ static unsigned offset(int row, int col) {
    return (col >> 6) * kBlockBytes + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4) + ((col & 7) << 1);
  }

  // An operand `byte_offset` bytes into the tile: the tile's own descriptor
  // with its start-address field (address / 16, bits 0..13) moved. Operand
  // starts are multiples of 16 bytes and shared addresses stay below 2^18, so
  // the field never carries; the tile's descriptor is then computed once and
  // each k-step only adds a constant (fewer instructions than encoding every
  // operand's address anew).
  __device__ __forceinline__ static unsigned long long at(unsigned long long tile_descriptor, int byte_offset) {
    return tile_descriptor + (static_cast<unsigned>(byte_offset) >> 4);
  }

  // K-major operand: rows row0 .. (multiple of 8) x columns k0 .. k0 + 15 (k0 multiple of 16).
  // K never leaves a 128-byte row within one instruction, so the leading offset is unused.
  __device__ __forceinline__ static unsigned long long k_major(unsigned tile, int row0, int k0) {
    return at(wgmma_descriptor(tile, 16, 1024), (k0 >> 6) * kBlockBytes + row0 * 128 + ((k0 & 63) << 1));
  }

  // MN-major operand: K = rows k0 .. k0 + 15 (k0 multiple of 8), M/N = columns mn0 .. (mn0
  // multiple of 64). Leading offset: from one 64-column block to the next; stride: 8 rows.
  __device__ __forceinline__ static unsigned long long mn_major(unsigned tile, int k0, int mn0) {
    return at(wgmma_descriptor(tile, kBlockBytes, 1024), (mn0 >> 6) * kBlockBytes + k0 * 128);
  }
};

// Starts copying rows [0, Tile::kRows) of a global matrix (rows of Tile::kCols
// contiguous elements, `row_stride` elements apart) into the tile at shared
// address `tile`; rows at or past `valid_rows` are zero-filled and not read.
// Called by kThreads threads (thread = 0 .. kThreads - 1); consecutive threads
// copy consecutive 16-byte chunks of a row. A thread copies the same chunk
// column in every pass over the tile, kRowsPerPass rows further each time,
// so its shared offset (the swizzle repeats every 8 rows) and its global
// address advance by constants: a few instructions per copy, which matters
// because the producer warps share issue slots with the consumers. A row
// wider than the threads can cover eight rows at a time (256 columns for 128
// threads) is copied as column groups of whole 64-column blocks, each group
// by the same passes.
template <class Tile, int kThreads, class Element>
__device__ __forceinline__ void load_tile_async(unsigned tile, const Element* rows, long long row_stride,
                                                int valid_rows, int thread) {
  constexpr int kGroupChunks = Tile::kCols / 8 <= kThreads / 8 ? Tile::kCols / 8 : kThreads / 8;
  constexpr int kGroups = Tile::kCols / 8 / kGroupChunks;
  constexpr int kRowsPerPass = kThreads / kGroupChunks;
  static_assert(kThreads % kGroupChunks == 0 && kRowsPerPass % 8 == 0 && Tile::kRows % kRowsPerPass == 0,
                "each thread keeps one chunk column and one swizzle row in every pass");
  static_assert(kGroups == 1 || (kGroupChunks % 8 == 0 && Tile::kCols % (8 * kGroupChunks) == 0),
                "column groups are whole 64-column blocks");
  const int row0 = thread / kGroupChunks;
  const int col = (thread % kGroupChunks) * 8;
  const unsigned destination = tile + Tile::offset(row0, col);
  const Element* source = rows + row0 * row_stride + col;
  const long long pass_stride = kRowsPerPass * row_stride;
  // A group starts kGroupChunks / 8 blocks of 64 columns further. Rolled: the
  // producer warps that copy have few registers for unrolled addresses.
  constexpr int kGroupBytes = kGroupChunks / 8 * Tile::kBlockBytes;
#pragma unroll 1
  for (int group = 0; group < kGroups; ++group) {
#pragma unroll
    for (int pass = 0; pass < Tile::kRows / kRowsPerPass; ++pass) {
      // A row past valid_rows is not read (zero source bytes): its address may
      // lie past the matrix.
      cp_async_16(destination + group * kGroupBytes + pass * kRowsPerPass * 128,
                  source + group * 8 * kGroupChunks + pass * pass_stride, row0 + pass * kRowsPerPass < valid_rows);
    }
  }
}

// Copies rows [row0, row0 + kRows) of the tile at shared address `tile`, those
// below `valid_rows`, to global memory with 16-byte accesses; kThreads threads.
template <class Tile, int kRows, int kThreads, class Element>
__device__ __forceinline__ void store_tile_rows(Element* rows, long long row_stride, unsigned tile, int row0,
                                                int valid_rows, int thread) {
  constexpr int kChunksPerRow = Tile::kCols / 8;
#pragma unroll
  for (int chunk = thread; chunk < kRows * kChunksPerRow; chunk += kThreads) {
    const int row = row0 + chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    if (row < valid_rows) {
      *reinterpret_cast<uint4*>(rows + row * row_stride + col) = load_shared_u32x4(tile + Tile::offset(row, col));
    }
  }
}

// Writes this thread's part of a warpgroup accumulator into the tile as packed
// 16-bit pairs: d[j][0..1] to (row, col0 + 8j, +1), d[j][2..3] to row + 8
// (col0 includes the thread's 2 * (lane % 4)), the upper row scaled by
// scale_upper, the lower by scale_lower.
template <class Tile, class Element, int kBlocks>
__device__ __forceinline__ void store_accumulator_tile(unsigned tile, const float (&acc)[kBlocks][4], float scale_upper,
                                                       float scale_lower, int row, int col0) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
    store_shared_u32(tile + Tile::offset(row, col0 + 8 * j),
                     ElementTraits<Element>::pack(acc[j][0] * scale_upper, acc[j][1] * scale_upper));
    store_shared_u32(tile + Tile::offset(row + 8, col0 + 8 * j),
                     ElementTraits<Element>::pack(acc[j][2] * scale_lower, acc[j][3] * scale_lower));
  }
}

// Orders the warpgroup's earlier register accesses before the wgmma
// instructions that follow (needed whenever accumulator or A registers were
// touched by ordinary instructions since the last wgmma).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the group of wgmma instructions issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending of the warpgroup's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins the values of accumulator registers at this point of the program: the
// compiler may not move ordinary reads or writes of them across it (it does not
// know that a wgmma still writes them until the wait that precedes this).
template <int kBlocks>
__device__ __forceinline__ void register_fence(float (&d)[kBlocks][4]) {
#pragma unroll
  for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[j][i])::"memory");
  }
}

// Keeps A-operand registers alive up to this point, so that the compiler does
// not reuse them for new values while a wgmma reading them may still run (put
// it after the wait that completes that wgmma).
template <int kSteps>
__device__ __forceinline__ void register_keep(const unsigned (&a)[kSteps][4]) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" ::"r"(a[s][i]) : "memory");
  }
}

// Accumulator operand lists (generated: N / 2 registers, d[j][i] in order).
#define DFLEX_WGMMA_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define DFLEX_WGMMA_D64_OPERANDS \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])

#define DFLEX_WGMMA_D128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define DFLEX_WGMMA_D128_OPERANDS \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
  "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
  "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
  "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
  "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])


template <class Element>
struct WgmmaElement;
template <>
struct WgmmaElement<__nv_bfloat16> {
  static constexpr bool kHalf = false;
};
template <>
struct WgmmaElement<__half> {
  static constexpr bool kHalf = true;
};

// The operand numbers after the N / 2 accumulators: A (descriptor or four
// registers), the B descriptor, the accumulate flag, the transpose immediates.
#define DFLEX_WGMMA_SS_ASM(N, TYPE, A, B, SCALE, TRANS_A, TRANS_B)                                      \
  asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %" #SCALE ", 0;\n"                    \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " DFLEX_WGMMA_D##N      \
               ", %" #A ", %" #B ", accumulate, 1, 1, %" #TRANS_A ", %" #TRANS_B ";\n}\n"                 \
               : DFLEX_WGMMA_D##N##_OPERANDS                                                              \
               : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB)          \
               : "memory")

#define DFLEX_WGMMA_RS_ASM(N, TYPE, A0, A1, A2, A3, B, SCALE, TRANS_B)                                  \
  asm volatile("{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %" #SCALE ", 0;\n"                    \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " DFLEX_WGMMA_D##N      \
               ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", accumulate, 1, 1, %" #TRANS_B       \
               ";\n}\n"                                                                                   \
               : DFLEX_WGMMA_D##N##_OPERANDS                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),  \
                 "n"(kTransB)                                                                             \
               : "memory")

// D (64 x kN) = A * B, plus D when `accumulate`; one k-step of 16.
//   ss: A and B in shared memory (descriptors); kTransA / kTransB = 1 selects MN-major.
//   rs: A in registers (layout above), B in shared memory.
template <class Element, int kN>
struct Wgmma;

// One shape: N, then the operand numbers of the ss form (A, B, flag, two
// transposes) and of the rs form (four A registers, B, flag, transpose).
#define DFLEX_WGMMA_SHAPE(N, SS_A, SS_B, SS_SCALE, SS_TA, SS_TB, RS_A0, RS_A1, RS_A2, RS_A3, RS_B, RS_SCALE, RS_TB) \
  template <class Element>                                                                                       \
  struct Wgmma<Element, N> {                                                                                     \
    template <int kTransA, int kTransB>                                                                          \
    __device__ __forceinline__ static void ss(float (&d)[N / 8][4], unsigned long long a, unsigned long long b,  \
                                              bool accumulate) {                                                 \
      if constexpr (WgmmaElement<Element>::kHalf) {                                                              \
        DFLEX_WGMMA_SS_ASM(N, "f16", SS_A, SS_B, SS_SCALE, SS_TA, SS_TB);                                        \
      } else {                                                                                                   \
        DFLEX_WGMMA_SS_ASM(N, "bf16", SS_A, SS_B, SS_SCALE, SS_TA, SS_TB);                                       \
      }                                                                                                          \
    }                                                                                                            \
    template <int kTransB>                                                                                       \
    __device__ __forceinline__ static void rs(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b, \
                                              bool accumulate) {                                                 \
      if constexpr (WgmmaElement<Element>::kHalf) {                                                              \
        DFLEX_WGMMA_RS_ASM(N, "f16", RS_A0, RS_A1, RS_A2, RS_A3, RS_B, RS_SCALE, RS_TB);                         \
      } else {                                                                                                   \
        DFLEX_WGMMA_RS_ASM(N, "bf16", RS_A0, RS_A1, RS_A2, RS_A3, RS_B, RS_SCALE, RS_TB);                        \
      }                                                                                                          \
    }                                                                                                            \
  };

DFLEX_WGMMA_SHAPE(64, 32, 33, 34, 35, 36, 32, 33, 34, 35, 36, 37, 38)
DFLEX_WGMMA_SHAPE(128, 64, 65, 66, 67, 68, 64, 65, 66, 67, 68, 69, 70)

#undef DFLEX_WGMMA_SHAPE
#undef DFLEX_WGMMA_SS_ASM
#undef DFLEX_WGMMA_RS_ASM
#undef DFLEX_WGMMA_D64
#undef DFLEX_WGMMA_D64_OPERANDS
#undef DFLEX_WGMMA_D128
#undef DFLEX_WGMMA_D128_OPERANDS

}  // namespace kernels
}  // namespace dflex
