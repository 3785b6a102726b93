//===- TensorSummary.h - range minimum/maximum over tensor rows -*- C++ -*-===//
//
// The minimum and maximum of a captured integer tensor over a range of its
// last dimension, for one index of the leading dimensions (a "row"), in
// O(1)-ish time. Built once per set of captures.
//
// A row made of a few monotone runs (sorted positions, document ids, anchors
// followed by -1 padding) answers from the run endpoints; any other row
// answers from a sparse table over blocks of 16 elements plus a scan of the
// two partial blocks at the ends.
//
//===----------------------------------------------------------------------===//

#ifndef DFLEX_LIB_ANALYSIS_TENSORSUMMARY_H
#define DFLEX_LIB_ANALYSIS_TENSORSUMMARY_H

#include "dflex/Expr/Program.h"

#include <cstdint>
#include <vector>

namespace dflex::analysis {

class TensorSummary {
public:
  /// `tensor` holds i32 or i64 elements; rank 0 counts as one row of one.
  explicit TensorSummary(const expr::CaptureValue &tensor);
  /// The summary of another tensor, reusing this one's buffers.
  void assign(const expr::CaptureValue &tensor);

  int64_t rowLength() const { return length; }
  int64_t numRows() const { return rows; }
  /// Extremes over the whole tensor (meaningless when it has no element).
  int64_t globalMin() const { return minAll; }
  int64_t globalMax() const { return maxAll; }

  /// Minimum and maximum of row `row` over columns [first, last], both in
  /// range and first <= last.
  void rowRange(int64_t row, int64_t first, int64_t last, int64_t &min,
                int64_t &max) const;

private:
  static constexpr int64_t kMaxRuns = 8;
  static constexpr int64_t kBlock = 16;

  struct RowIndex {
    int64_t runBegin = 0, runCount = 0; // into runStarts, when runCount > 0
    int64_t tableBegin = 0;             // into tableMin/tableMax otherwise
    int64_t blocks = 0;
  };

  void indexRow(int64_t row);
  void scan(const int64_t *values, int64_t first, int64_t last, int64_t &min,
            int64_t &max) const;

  int64_t rows = 0, length = 0;
  int64_t minAll = 0, maxAll = 0;
  std::vector<int64_t> values; // rows x length, row-major
  std::vector<RowIndex> index;
  std::vector<int64_t> runStarts;
  // Per row: level k holds, for each block i, the extremes over blocks
  // [i, i + 2^k); levels are stored one after the other.
  std::vector<int64_t> tableMin, tableMax;
};

} // namespace dflex::analysis

#endif // DFLEX_LIB_ANALYSIS_TENSORSUMMARY_H
