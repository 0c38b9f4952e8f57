#include "cache/visible_rows.h"

#include <algorithm>

namespace sparrow {

void VisibleRows::build(const KvCells &cells, std::span<const int32_t> pos, std::span<const int32_t> seq) {
    const size_t n = pos.size();
    std::vector<int32_t> seq_index(kMaxSequences, -1);
    size_t n_seqs = 0;
    for (size_t t = 0; t < n; ++t) {
        if (seq_index[static_cast<size_t>(seq[t])] >= 0) continue;
        seq_index[static_cast<size_t>(seq[t])] = static_cast<int32_t>(n_seqs);
        if (seq_cells_.size() <= n_seqs) seq_cells_.emplace_back();
        seq_cells_[n_seqs++] = cells.seq_cells_by_pos(seq[t]);
    }
    rows_.assign(n, {});
    max_rows_ = 0;
    for (size_t t = 0; t < n; ++t) {
        const auto &list = seq_cells_[static_cast<size_t>(seq_index[static_cast<size_t>(seq[t])])];
        // The list is sorted by position: the visible cells are the prefix with pos <= pos[t].
        const auto end = std::upper_bound(list.begin(), list.end(), pos[t],
                                          [&](int32_t p, int32_t cell) { return p < cells.pos(cell); });
        rows_[t] = std::span<const int32_t>(list.data(), static_cast<size_t>(end - list.begin()));
        max_rows_ = std::max<int64_t>(max_rows_, static_cast<int64_t>(rows_[t].size()));
    }
}

}  // namespace sparrow
