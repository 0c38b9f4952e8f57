// The cell array of a KV cache: which position of which sequences each cell holds. The per-layer stores
// (K/V rows, latents, indexer keys) are indexed by cell, so every store stays in step with this one table.
// Nothing assumes that a sequence occupies contiguous cells: visibility is derived from (pos, seq) alone.
#pragma once

#include <bitset>
#include <cstdint>
#include <span>
#include <vector>

namespace sparrow {

constexpr int kMaxSequences = 256;

class KvCells {
  public:
    explicit KvCells(int64_t n_cells);

    int64_t size() const { return static_cast<int64_t>(pos_.size()); }
    bool is_empty(int64_t cell) const { return pos_[cell] < 0; }
    int32_t pos(int64_t cell) const { return pos_[cell]; }
    bool has_seq(int64_t cell, int32_t seq) const { return seqs_[cell].test(static_cast<size_t>(seq)); }
    int64_t n_used() const { return n_used_; }
    // One past the highest occupied cell: attention scans [0, extent()).
    int64_t extent() const { return extent_; }

    // Finds a free cell for each of n tokens (lowest free cells first) without changing anything; throws
    // sparrow::Error when fewer than n are free.
    std::vector<int32_t> find_free(int64_t n) const;
    void assign(int32_t cell, int32_t pos, int32_t seq);
    void release(int32_t cell);  // frees the cell whatever it holds
    // Removes seq's cells with pos in [p0, p1) (p1 < 0: no upper bound); seq < 0 matches every sequence.
    void seq_rm(int32_t seq, int32_t p0, int32_t p1);
    void clear();
    int32_t seq_pos_max(int32_t seq) const;

    // The cells of `seq`, ordered by position (then by cell index).
    std::vector<int32_t> seq_cells_by_pos(int32_t seq) const;

  private:
    void update_extent();

    std::vector<int32_t> pos_;                      // -1 for a free cell
    std::vector<std::bitset<kMaxSequences>> seqs_;  // sequences sharing the cell
    int64_t n_used_ = 0;
    int64_t extent_ = 0;
};

}  // namespace sparrow
