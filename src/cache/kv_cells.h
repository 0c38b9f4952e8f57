// The cell array of a KV cache: which position of which sequences each cell holds. The per-layer stores
// (K/V rows, latents, indexer keys) are indexed by cell, so every store stays in step with this one table.
// Nothing assumes that a sequence occupies contiguous cells: visibility is derived from (pos, seq) alone.
//
// A cell may belong to several sequences (a prompt shared by several conversations is decoded once, or
// seq_cp shares cells). A token that belongs to a set S of sequences sees the cells whose sequence set
// contains all of S (and whose position is at most its own): when the sequences of S hold the same history,
// as they do after a shared prompt, that is exactly each sequence's own history.
#pragma once

#include <bitset>
#include <cstdint>
#include <span>
#include <vector>

namespace sparrow {

constexpr int kMaxSequences = 256;
using SeqSet = std::bitset<kMaxSequences>;

class KvCells {
  public:
    explicit KvCells(int64_t n_cells);

    int64_t size() const { return static_cast<int64_t>(pos_.size()); }
    bool is_empty(int64_t cell) const { return pos_[cell] < 0; }
    int32_t pos(int64_t cell) const { return pos_[cell]; }
    const SeqSet &seqs(int64_t cell) const { return seqs_[cell]; }
    bool has_seq(int64_t cell, int32_t seq) const { return seqs_[cell].test(static_cast<size_t>(seq)); }
    int64_t n_used() const { return n_used_; }
    // One past the highest occupied cell: attention scans [0, extent()).
    int64_t extent() const { return extent_; }

    // Finds a free cell for each of n tokens (lowest free cells first) without changing anything; throws
    // sparrow::Error (ErrorCode::context_full) when fewer than n are free.
    std::vector<int32_t> find_free(int64_t n) const;
    void assign(int32_t cell, int32_t pos, int32_t seq);
    void assign(int32_t cell, int32_t pos, const SeqSet &seqs);  // seqs must not be empty
    void release(int32_t cell);                                  // frees the cell whatever it holds
    void set_pos(int32_t cell, int32_t pos);                     // an occupied cell's new position
    // Takes seq out of the cell's set; frees the cell when no sequence is left.
    void remove_seq(int32_t cell, int32_t seq);
    void add_seq(int32_t cell, int32_t seq);  // the cell must be occupied
    // Moves the metadata of occupied cell src to free cell dst (defragmentation; rows move separately).
    void move(int32_t src, int32_t dst);
    // Removes seq's cells with pos in [p0, p1) (p1 < 0: no upper bound); seq < 0 matches every sequence.
    void seq_rm(int32_t seq, int32_t p0, int32_t p1);
    // Makes dst share src's cells with pos in [p0, p1) (dst's own cells in that range are removed first).
    void seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1);
    // Removes every sequence but seq from every cell (cells without seq are freed).
    void seq_keep(int32_t seq);
    void clear();
    int32_t seq_pos_max(int32_t seq) const;  // -1 when the sequence holds no cell
    int32_t seq_pos_min(int32_t seq) const;  // -1 when the sequence holds no cell

    // The cells of `seq`, ordered by position (then by cell index).
    std::vector<int32_t> seq_cells_by_pos(int32_t seq) const;
    // The cells whose sequence set contains every sequence of `seqs`, ordered by position (then by cell).
    std::vector<int32_t> cells_by_pos(const SeqSet &seqs) const;
    // The same into `out` (replaced; its capacity is reused: this runs once per ubatch and sequence set).
    void cells_by_pos(const SeqSet &seqs, std::vector<int32_t> &out) const;
    // The cells of `seq` with pos in [p0, p1) (p1 < 0: no upper bound), in cell order.
    std::vector<int32_t> seq_cells_in(int32_t seq, int32_t p0, int32_t p1) const;

  private:
    void update_extent();

    std::vector<int32_t> pos_;  // -1 for a free cell
    std::vector<SeqSet> seqs_;  // sequences sharing the cell (empty for a free cell)
    int64_t n_used_ = 0;
    int64_t extent_ = 0;
};

}  // namespace sparrow
