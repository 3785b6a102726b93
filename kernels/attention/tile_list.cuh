// Block-sparse structure of an attention mask, as the kernels consume it.
//
// A tile list is a CSR matrix over tiles. Each row is one (batch, head, row
// tile) and lists the column tiles that hold at least one visible pair:
//   forward list:  row tile = query tile (kBlockM queries), columns = key tiles (kBlockN keys)
//   backward list: row tile = key tile (kBlockN keys),     columns = query tiles (kBlockM queries)
// with kBlockM/kBlockN taken from the kernel's config (forward and backward
// configs differ, so each pass has its own list). Tiles with no visible pair
// are absent. Each entry is (column tile << 1) | partial:
//   partial = 0 (full): every pair (q, kv) of the tile with q < q_len and
//             kv < kv_len is visible; the kernel never calls the mask for it.
//   partial = 1: the kernel evaluates the variant's mask per pair.
// Out-of-range pairs (q >= q_len or kv >= kv_len) are excluded by the kernel
// itself whatever the flag says. Entries within a row may come in any order.
//
// Row index: ((b' * heads) + h') * row_tiles + tile, where b' = 0 when the
// list is shared by all batches (batches == 1) and b otherwise, and h' = 0 when
// it is shared by all query heads (heads == 1) and the query head otherwise.
// The backward list is indexed by query head too (not key/value head): a
// key tile's block walks the rows of every query head of its group.
#pragma once

namespace dflex {
namespace kernels {

struct TileList {
  const int* row_offsets;  // [rows + 1], row_offsets[0] == 0
  const int* entries;      // [row_offsets[rows]]
  int batches;             // 1 (shared) or the batch size
  int heads;               // 1 (shared) or the number of query heads
  int row_tiles;           // tiles along the row dimension (ceil(len / tile))

  __device__ __forceinline__ int row(int batch, int head, int tile) const {
    return ((batches == 1 ? 0 : batch) * heads + (heads == 1 ? 0 : head)) * row_tiles + tile;
  }
};

__host__ __device__ __forceinline__ int make_tile_entry(int tile, bool partial) { return (tile << 1) | (partial ? 1 : 0); }
__host__ __device__ __forceinline__ int tile_entry_index(int entry) { return entry >> 1; }
__host__ __device__ __forceinline__ bool tile_entry_partial(int entry) { return (entry & 1) != 0; }

}  // namespace kernels
}  // namespace dflex
