#include "cache/visible_rows.h"

#include <algorithm>

namespace sparrow {

void VisibleRows::build(const KvCells &cells, std::span<const int32_t> pos, std::span<const SeqSet> seqs) {
    const size_t n = pos.size();
    sets_.clear();
    std::vector<size_t> set_of(n);
    for (size_t t = 0; t < n; ++t) {
        // A ubatch holds few distinct sets (one per sequence, plus shared prompts): a linear search will do.
        const auto it = std::find(sets_.begin(), sets_.end(), seqs[t]);
        set_of[t] = static_cast<size_t>(it - sets_.begin());
        if (it != sets_.end()) continue;
        sets_.push_back(seqs[t]);
        if (set_cells_.size() < sets_.size()) set_cells_.emplace_back();
        cells.cells_by_pos(seqs[t], set_cells_[sets_.size() - 1]);
    }
    rows_.assign(n, {});
    max_rows_ = 0;
    for (size_t t = 0; t < n; ++t) {
        const auto &list = set_cells_[set_of[t]];
        // The list is sorted by position: the visible cells are the prefix with pos <= pos[t].
        const auto end = std::upper_bound(list.begin(), list.end(), pos[t],
                                          [&](int32_t p, int32_t cell) { return p < cells.pos(cell); });
        rows_[t] = std::span<const int32_t>(list.data(), static_cast<size_t>(end - list.begin()));
        max_rows_ = std::max<int64_t>(max_rows_, static_cast<int64_t>(rows_[t].size()));
    }
}

}  // namespace sparrow
