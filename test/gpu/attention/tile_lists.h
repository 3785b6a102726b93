// Brute-force host builder of the kernels' tile lists (format: see
// kernels/attention/tile_list.cuh and docs/kernels.md): evaluates the variant's
// mask on every in-range pair of every tile. The reference the mask analysis
// is checked against; affordable up to the DFlash training shape.
#pragma once

#include <algorithm>
#include <thread>
#include <vector>

namespace attention_test {

struct HostTileList {
  std::vector<int> row_offsets;  // [rows + 1]
  std::vector<int> entries;      // (column tile << 1) | partial
  int batches = 0;
  int heads = 0;
  int row_tiles = 0;
  long long full_tiles = 0;
  long long partial_tiles = 0;
  long long all_tiles = 0;  // rows * column tiles, empty ones included
};

enum class TileRows { kQuery, kKey };  // forward lists: query rows; backward lists: key rows

// Lists for `batches` x `heads` rows of row tiles (batches/heads == 1: shared;
// the mask is then evaluated with b = 0 / h = 0).
template <class Variant>
HostTileList build_tile_list(const Variant& variant, TileRows rows, int batches, int heads, int q_len, int kv_len,
                             int block_q, int block_kv) {
  const int q_tiles = (q_len + block_q - 1) / block_q;
  const int kv_tiles = (kv_len + block_kv - 1) / block_kv;
  HostTileList list;
  list.batches = batches;
  list.heads = heads;
  list.row_tiles = rows == TileRows::kQuery ? q_tiles : kv_tiles;
  const int column_tiles = rows == TileRows::kQuery ? kv_tiles : q_tiles;
  const long long row_count = static_cast<long long>(batches) * heads * list.row_tiles;

  // 0: empty, 1: full, 2: partial, per (row, column tile).
  std::vector<unsigned char> kind(static_cast<size_t>(row_count) * column_tiles);
  auto classify_rows = [&](long long first, long long step) {
    for (long long row = first; row < row_count; row += step) {
      const int row_tile = static_cast<int>(row % list.row_tiles);
      const int head = static_cast<int>((row / list.row_tiles) % heads);
      const int batch = static_cast<int>(row / (static_cast<long long>(list.row_tiles) * heads));
      for (int column = 0; column < column_tiles; ++column) {
        const int q_tile = rows == TileRows::kQuery ? row_tile : column;
        const int kv_tile = rows == TileRows::kQuery ? column : row_tile;
        const int q_end = std::min(q_len, (q_tile + 1) * block_q);
        const int kv_end = std::min(kv_len, (kv_tile + 1) * block_kv);
        bool any_visible = false;
        bool any_hidden = false;
        for (int q = q_tile * block_q; q < q_end && !(any_visible && any_hidden); ++q) {
          for (int kv = kv_tile * block_kv; kv < kv_end; ++kv) {
            if (variant.mask(batch, head, q, kv)) {
              any_visible = true;
            } else {
              any_hidden = true;
            }
            if (any_visible && any_hidden) break;
          }
        }
        kind[static_cast<size_t>(row) * column_tiles + column] = any_visible ? (any_hidden ? 2 : 1) : 0;
      }
    }
  };
  const unsigned workers = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) threads.emplace_back(classify_rows, w, workers);
  for (auto& t : threads) t.join();

  list.row_offsets.reserve(static_cast<size_t>(row_count) + 1);
  list.row_offsets.push_back(0);
  for (long long row = 0; row < row_count; ++row) {
    for (int column = 0; column < column_tiles; ++column) {
      const unsigned char k = kind[static_cast<size_t>(row) * column_tiles + column];
      if (k == 0) continue;
      list.entries.push_back((column << 1) | (k == 2 ? 1 : 0));
      (k == 2 ? list.partial_tiles : list.full_tiles) += 1;
    }
    list.row_offsets.push_back(static_cast<int>(list.entries.size()));
  }
  list.all_tiles = row_count * column_tiles;
  return list;
}

}  // namespace attention_test
