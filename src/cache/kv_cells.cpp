#include "cache/kv_cells.h"

#include <algorithm>

#include "core/error.h"

namespace sparrow {

namespace {
bool in_range(int32_t pos, int32_t p0, int32_t p1) { return pos >= p0 && (p1 < 0 || pos < p1); }
}  // namespace

KvCells::KvCells(int64_t n_cells) : pos_(static_cast<size_t>(n_cells), -1), seqs_(static_cast<size_t>(n_cells)) {}

std::vector<int32_t> KvCells::find_free(int64_t n) const {
    if (n < 0) throw_error("%lld cache cells asked for (a count must not be negative)", (long long)n);
    std::vector<int32_t> cells;
    cells.reserve(static_cast<size_t>(std::min(n, size())));  // n may exceed the cache: refused below
    for (int64_t c = 0; c < size() && static_cast<int64_t>(cells.size()) < n; ++c) {
        if (pos_[c] < 0) cells.push_back(static_cast<int32_t>(c));
    }
    if (static_cast<int64_t>(cells.size()) < n) {
        throw_error_code(ErrorCode::context_full,
                         "the context is full: %lld tokens need cache cells but only %zu of %lld are free (raise -c)",
                         (long long)n, cells.size(), (long long)size());
    }
    return cells;
}

void KvCells::assign(int32_t cell, int32_t pos, int32_t seq) {
    SPARROW_ASSERT(seq >= 0 && seq < kMaxSequences);
    SeqSet s;
    s.set(static_cast<size_t>(seq));
    assign(cell, pos, s);
}

void KvCells::assign(int32_t cell, int32_t pos, const SeqSet &seqs) {
    SPARROW_ASSERT(cell >= 0 && cell < size() && pos >= 0 && seqs.any());
    if (pos_[cell] < 0) ++n_used_;
    pos_[cell] = pos;
    seqs_[cell] = seqs;
    extent_ = std::max<int64_t>(extent_, cell + 1);
}

void KvCells::release(int32_t cell) {
    if (pos_[cell] < 0) return;
    pos_[cell] = -1;
    seqs_[cell].reset();
    --n_used_;
    update_extent();
}

void KvCells::set_pos(int32_t cell, int32_t pos) {
    SPARROW_ASSERT(pos_[cell] >= 0 && pos >= 0);
    pos_[cell] = pos;
}

void KvCells::remove_seq(int32_t cell, int32_t seq) {
    if (pos_[cell] < 0) return;
    seqs_[cell].reset(static_cast<size_t>(seq));
    if (seqs_[cell].none()) release(cell);
}

void KvCells::add_seq(int32_t cell, int32_t seq) {
    SPARROW_ASSERT(pos_[cell] >= 0);
    seqs_[cell].set(static_cast<size_t>(seq));
}

void KvCells::move(int32_t src, int32_t dst) {
    SPARROW_ASSERT(pos_[src] >= 0 && pos_[dst] < 0);
    pos_[dst] = pos_[src];
    seqs_[dst] = seqs_[src];
    pos_[src] = -1;
    seqs_[src].reset();
    extent_ = std::max<int64_t>(extent_, dst + 1);
    update_extent();
}

void KvCells::seq_rm(int32_t seq, int32_t p0, int32_t p1) {
    for (int64_t c = 0; c < size(); ++c) {
        if (pos_[c] < 0 || !in_range(pos_[c], p0, p1)) continue;
        if (seq >= 0) {
            if (!seqs_[c].test(static_cast<size_t>(seq))) continue;
            seqs_[c].reset(static_cast<size_t>(seq));
        } else {
            seqs_[c].reset();
        }
        if (seqs_[c].none()) {
            pos_[c] = -1;
            --n_used_;
        }
    }
    update_extent();
}

void KvCells::seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    if (src == dst) return;
    seq_rm(dst, p0, p1);
    for (int64_t c = 0; c < extent_; ++c) {
        if (pos_[c] >= 0 && in_range(pos_[c], p0, p1) && seqs_[c].test(static_cast<size_t>(src))) {
            seqs_[c].set(static_cast<size_t>(dst));
        }
    }
}

void KvCells::seq_keep(int32_t seq) {
    for (int64_t c = 0; c < extent_; ++c) {
        if (pos_[c] < 0) continue;
        if (seqs_[c].test(static_cast<size_t>(seq))) {
            seqs_[c].reset();
            seqs_[c].set(static_cast<size_t>(seq));
        } else {
            pos_[c] = -1;
            seqs_[c].reset();
            --n_used_;
        }
    }
    update_extent();
}

void KvCells::clear() {
    std::fill(pos_.begin(), pos_.end(), -1);
    for (auto &s : seqs_) s.reset();
    n_used_ = 0;
    extent_ = 0;
}

int32_t KvCells::seq_pos_max(int32_t seq) const {
    int32_t best = -1;
    for (int64_t c = 0; c < extent_; ++c) {
        if (pos_[c] >= 0 && seqs_[c].test(static_cast<size_t>(seq))) best = std::max(best, pos_[c]);
    }
    return best;
}

int32_t KvCells::seq_pos_min(int32_t seq) const {
    int32_t best = -1;
    for (int64_t c = 0; c < extent_; ++c) {
        if (pos_[c] >= 0 && seqs_[c].test(static_cast<size_t>(seq)) && (best < 0 || pos_[c] < best)) best = pos_[c];
    }
    return best;
}

std::vector<int32_t> KvCells::seq_cells_by_pos(int32_t seq) const {
    SeqSet s;
    s.set(static_cast<size_t>(seq));
    return cells_by_pos(s);
}

std::vector<int32_t> KvCells::cells_by_pos(const SeqSet &seqs) const {
    std::vector<int32_t> cells;
    cells_by_pos(seqs, cells);
    return cells;
}

void KvCells::cells_by_pos(const SeqSet &seqs, std::vector<int32_t> &cells) const {
    cells.clear();
    for (int64_t c = 0; c < extent_; ++c) {
        if (pos_[c] >= 0 && (seqs_[c] & seqs) == seqs) cells.push_back(static_cast<int32_t>(c));
    }
    // Cells are usually taken in position order, so the list is already sorted; this runs every ubatch.
    const auto by_pos = [&](int32_t a, int32_t b) { return pos_[a] < pos_[b]; };
    if (!std::is_sorted(cells.begin(), cells.end(), by_pos)) std::stable_sort(cells.begin(), cells.end(), by_pos);
}

std::vector<int32_t> KvCells::seq_cells_in(int32_t seq, int32_t p0, int32_t p1) const {
    std::vector<int32_t> cells;
    for (int64_t c = 0; c < extent_; ++c) {
        if (pos_[c] >= 0 && in_range(pos_[c], p0, p1) && seqs_[c].test(static_cast<size_t>(seq))) {
            cells.push_back(static_cast<int32_t>(c));
        }
    }
    return cells;
}

void KvCells::update_extent() {
    while (extent_ > 0 && pos_[extent_ - 1] < 0) --extent_;
}

}  // namespace sparrow
