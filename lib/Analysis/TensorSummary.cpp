//===- TensorSummary.cpp - range minimum/maximum over tensor rows ---------===//

#include "TensorSummary.h"

#include <algorithm>
#include <cstring>

namespace dflex::analysis {

namespace {

int64_t loadInteger(const expr::CaptureValue &tensor, int64_t offset) {
  const char *base = static_cast<const char *>(tensor.data);
  if (tensor.elementType == expr::ScalarType::I64) {
    int64_t v;
    std::memcpy(&v, base + offset * 8, 8);
    return v;
  }
  int32_t v;
  std::memcpy(&v, base + offset * 4, 4);
  return v;
}

int floorLog2(uint64_t v) { return 63 - __builtin_clzll(v); }

/// Copies `count` contiguous elements of type T from `base`, widened, in a
/// loop the compiler can vectorise (the bounds come from the row indexes).
template <class T>
void copyWidened(const char *base, int64_t count, int64_t *out) {
  for (int64_t n = 0; n < count; ++n) {
    T v;
    std::memcpy(&v, base + n * static_cast<int64_t>(sizeof(T)), sizeof(T));
    out[n] = v;
  }
}

} // namespace

TensorSummary::TensorSummary(const expr::CaptureValue &tensor) { assign(tensor); }

void TensorSummary::assign(const expr::CaptureValue &tensor) {
  // Cleared, not freed: a rebound evaluator refills the same buffers.
  values.clear();
  index.clear();
  runStarts.clear();
  tableMin.clear();
  tableMax.clear();
  minAll = maxAll = 0;
  const size_t rank = tensor.sizes.size();
  length = rank == 0 ? 1 : tensor.sizes.back();
  rows = 1;
  for (size_t d = 0; d + 1 < rank; ++d)
    rows *= tensor.sizes[d];
  if (rows == 0 || length == 0) {
    rows = 0;
    return;
  }
  // Copy the elements in logical row-major order, whatever the strides
  // (contiguous tensors, the usual case, in one pass).
  const int64_t count = rows * length;
  values.resize(static_cast<size_t>(count));
  if (tensor.isRowMajor()) {
    const char *base = static_cast<const char *>(tensor.data);
    if (tensor.elementType == expr::ScalarType::I64)
      copyWidened<int64_t>(base, count, values.data());
    else
      copyWidened<int32_t>(base, count, values.data());
  } else {
    int64_t n = 0;
    tensor.forEachOffset([&](int64_t offset) { values[n++] = loadInteger(tensor, offset); });
  }
  minAll = INT64_MAX;
  maxAll = INT64_MIN;
  index.resize(static_cast<size_t>(rows));
  for (int64_t row = 0; row < rows; ++row)
    indexRow(row);
}

void TensorSummary::indexRow(int64_t row) {
  const int64_t *v = values.data() + row * length;
  RowIndex &entry = index[row];
  // Greedy maximal monotone runs (non-decreasing or non-increasing).
  std::vector<int64_t> starts{0};
  int direction = 0;
  for (int64_t i = 1; i < length && static_cast<int64_t>(starts.size()) <= kMaxRuns; ++i) {
    int step = v[i] > v[i - 1] ? 1 : v[i] < v[i - 1] ? -1 : 0;
    if (step == 0 || step == direction)
      continue;
    if (direction == 0) {
      direction = step;
      continue;
    }
    starts.push_back(i);
    direction = 0;
  }
  if (static_cast<int64_t>(starts.size()) <= kMaxRuns) {
    entry.runBegin = static_cast<int64_t>(runStarts.size());
    entry.runCount = static_cast<int64_t>(starts.size());
    runStarts.insert(runStarts.end(), starts.begin(), starts.end());
    // A monotone run's extremes are its ends.
    for (size_t run = 0; run < starts.size(); ++run) {
      const int64_t end = run + 1 < starts.size() ? starts[run + 1] - 1 : length - 1;
      minAll = std::min({minAll, v[starts[run]], v[end]});
      maxAll = std::max({maxAll, v[starts[run]], v[end]});
    }
    return;
  }
  // Sparse table over blocks.
  const int64_t blocks = (length + kBlock - 1) / kBlock;
  const int levels = floorLog2(static_cast<uint64_t>(blocks)) + 1;
  entry.blocks = blocks;
  entry.tableBegin = static_cast<int64_t>(tableMin.size());
  tableMin.resize(tableMin.size() + static_cast<size_t>(levels * blocks));
  tableMax.resize(tableMax.size() + static_cast<size_t>(levels * blocks));
  int64_t *mins = tableMin.data() + entry.tableBegin;
  int64_t *maxs = tableMax.data() + entry.tableBegin;
  for (int64_t b = 0; b < blocks; ++b) {
    scan(v, b * kBlock, std::min(length, (b + 1) * kBlock) - 1, mins[b], maxs[b]);
    minAll = std::min(minAll, mins[b]);
    maxAll = std::max(maxAll, maxs[b]);
  }
  for (int level = 1; level < levels; ++level) {
    int64_t half = int64_t{1} << (level - 1);
    int64_t *prevMin = mins + (level - 1) * blocks, *prevMax = maxs + (level - 1) * blocks;
    int64_t *curMin = mins + level * blocks, *curMax = maxs + level * blocks;
    for (int64_t b = 0; b + 2 * half <= blocks; ++b) {
      curMin[b] = std::min(prevMin[b], prevMin[b + half]);
      curMax[b] = std::max(prevMax[b], prevMax[b + half]);
    }
  }
}

void TensorSummary::scan(const int64_t *v, int64_t first, int64_t last,
                         int64_t &min, int64_t &max) const {
  min = max = v[first];
  for (int64_t i = first + 1; i <= last; ++i) {
    min = std::min(min, v[i]);
    max = std::max(max, v[i]);
  }
}

void TensorSummary::rowRange(int64_t row, int64_t first, int64_t last,
                             int64_t &min, int64_t &max) const {
  const int64_t *v = values.data() + row * length;
  const RowIndex &entry = index[row];
  if (entry.runCount > 0) {
    const int64_t *starts = runStarts.data() + entry.runBegin;
    int64_t run = entry.runCount - 1;
    while (starts[run] > first)
      --run;
    min = max = v[first];
    for (; run < entry.runCount && starts[run] <= last; ++run) {
      int64_t end = run + 1 < entry.runCount ? starts[run + 1] - 1 : length - 1;
      // A monotone run's extremes over a subrange are at the subrange's ends.
      int64_t a = v[std::max(first, starts[run])], b = v[std::min(last, end)];
      min = std::min({min, a, b});
      max = std::max({max, a, b});
    }
    return;
  }
  int64_t firstBlock = first / kBlock, lastBlock = last / kBlock;
  if (lastBlock - firstBlock < 2) {
    scan(v, first, last, min, max);
    return;
  }
  int64_t headMin, headMax, tailMin, tailMax;
  scan(v, first, (firstBlock + 1) * kBlock - 1, headMin, headMax);
  scan(v, lastBlock * kBlock, last, tailMin, tailMax);
  int64_t from = firstBlock + 1, count = lastBlock - from;
  int level = floorLog2(static_cast<uint64_t>(count));
  const int64_t *mins = tableMin.data() + entry.tableBegin + level * entry.blocks;
  const int64_t *maxs = tableMax.data() + entry.tableBegin + level * entry.blocks;
  int64_t second = lastBlock - (int64_t{1} << level);
  min = std::min({headMin, tailMin, mins[from], mins[second]});
  max = std::max({headMax, tailMax, maxs[from], maxs[second]});
}

} // namespace dflex::analysis
