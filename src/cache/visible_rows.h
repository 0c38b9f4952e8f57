// For each token of a ubatch, the cache cells it may attend to: the cells whose sequence set contains all of
// the token's sequences and whose position is at most its own, in increasing position order (KvCells
// documents the rule for tokens of several sequences). Derived from the cell metadata alone, so sequences
// need not be contiguous and holes left by removals are handled.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/kv_cells.h"

namespace sparrow {

class VisibleRows {
  public:
    // Recomputes the lists for tokens with the given positions and sequence sets (cells must already hold
    // the ubatch's own tokens, so that each token sees itself).
    void build(const KvCells &cells, std::span<const int32_t> pos, std::span<const SeqSet> seqs);

    // rows()[t]: the visible cells of token t, by position. Valid until the next build().
    std::span<const std::span<const int32_t>> rows() const { return rows_; }
    int64_t max_rows() const { return max_rows_; }  // the longest list

  private:
    std::vector<SeqSet> sets_;                     // the distinct sequence sets of the ubatch
    std::vector<std::vector<int32_t>> set_cells_;  // per distinct set: its visible cells by position
    std::vector<std::span<const int32_t>> rows_;
    int64_t max_rows_ = 0;
};

}  // namespace sparrow
