// A per-layer cache store: one row of `width` elements per cache cell, in an f32, f16, bf16, q8_0 or q4_0
// row type, optionally Hadamard-rotated before it is encoded (quantised caches; see RowRotation).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/page_arena.h"

namespace sparrow {

// An orthonormal block-diagonal rotation of rows: each row of width() elements is cut into consecutive
// blocks of power-of-two sizes, and each block x becomes H x / sqrt(n) (the Walsh-Hadamard transform, ops.h
// `hadamard`). H / sqrt(n) is symmetric and orthonormal, so apply() is its own inverse and dot products of
// two rows rotated alike are unchanged: a cache stores rotated keys, the model rotates its queries the same
// way, and q.k is what it was. Quantisation is why: a few large channels (outliers) make a 32-block's scale
// large and round its other elements to nothing; rotated, the outlier's energy is spread over the block.
//
// Blocks follow the row's structure (the caller adds one segment per part of the row that is used on its
// own, e.g. the MLA latent's c_kv and k_pe, or each head of a llama K row), so that the part that is also a
// value (c_kv) can be rotated back on its own. A segment whose length is not a power of two is cut into
// power-of-two blocks, largest first (96 -> 64 + 32, 48 -> 32 + 16).
class RowRotation {
  public:
    RowRotation() = default;  // the identity: no blocks
    // Appends `count` segments of n elements each (count heads of n).
    RowRotation &segment(int64_t n, int64_t count = 1);
    bool empty() const { return blocks_.empty(); }
    int64_t width() const { return width_; }  // elements per row: the sum of the blocks
    const std::vector<int64_t> &blocks() const { return blocks_; }
    // In place on n_rows rows of width() floats; the identity when empty().
    void apply(float *x, int64_t n_rows) const;

  private:
    std::vector<int64_t> blocks_;  // power-of-two block sizes, in row order
    int64_t width_ = 0;
};

// Quantises n_rows rows of d elements (row_type: a DType value, f32 / f16 / bf16) to int8 with one scale per
// row: out [n_rows, dp] (dp >= d, zero padding), scale and element sum per row. The fast indexer's key format
// (indexer_kernels.h, quantize_keys); RowStore only calls it.
using Int8RowQuantizer = void (*)(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, int64_t dp,
                                  int8_t *out, float *scale, int32_t *sum);

class RowStore {
  public:
    RowStore() = default;
    // Throws sparrow::Error when width is not a whole number of the type's blocks (q8_0 / q4_0: 32), or when
    // a non-empty rotation does not cover exactly `width` elements.
    RowStore(DType type, int64_t n_cells, int64_t width, RowRotation rotation = {});

    DType type() const { return type_; }
    int64_t width() const { return width_; }
    int64_t row_bytes() const { return row_bytes_; }
    int64_t n_bytes() const { return static_cast<int64_t>(data_.size()); }
    // The rotation stored rows carry (empty: none). Whoever reads rows directly (attention, the indexer)
    // must rotate its queries with it, and rotate back any value it sums from the rows.
    const RowRotation &rotation() const { return rotation_; }

    // Rotates `src` (width floats) when the store has a rotation, converts it to the row type and stores it
    // in `cell`. Uses the store's scratch row: one writer at a time per store.
    void write(int64_t cell, const float *src);
    // The inverse of write(): the row of `cell` as `width` floats (the values write() was given, up to the
    // row type's rounding, with the rotation undone). Cache operations that edit rows (position shifts) go
    // through read/write so that any encoding of the stored row (rounding, quantisation, rotation) is undone
    // and redone in one place.
    void read(int64_t cell, float *dst) const;
    // Copies the stored bytes of row `src` to row `dst` (defragmentation, sequence copies): exact.
    void copy_row(int64_t src, int64_t dst);
    // Stores row_bytes() encoded bytes (a row as row() returns it) into `cell` (state load).
    void write_raw(int64_t cell, const void *bytes);
    const void *row(int64_t cell) const { return data_.data() + cell * row_bytes_; }
    // Fills the rows of `cells` with pseudo-random values uniform in [-scale, scale] (benchmark filler).
    void fill_random(std::span<const int32_t> cells, uint64_t seed, float scale);

    // An int8 copy of every row (one scale and element sum per row, `dp` elements with zero padding), kept in
    // step by every call above that changes a row, so a reader that wants int8 rows (the fast indexer) reads
    // them instead of quantising each row it visits. Only f32 / f16 / bf16 stores (a q8_0 store is int8
    // already); throws otherwise or when dp < width(). Costs dp + 8 bytes per cell.
    void keep_int8_copy(Int8RowQuantizer quantize, int64_t dp);
    static bool int8_copy_supported(DType type) {
        return type == DType::F32 || type == DType::F16 || type == DType::BF16;
    }
    bool has_int8_copy() const { return quantize_ != nullptr; }
    // The rotation fast mode's int8 keys carry on top of the stored rows (the int8 copy, and keys quantised per
    // use, are of rows rotated by it; queries are rotated alike before they are quantised): none when the store
    // rotates its rows already or holds Q8_0 rows (fast mode reads those in place), else the Hadamard blocks of
    // the width. Rotated, a few outlier channels no longer set each row's int8 scale (on the e2e models with
    // outlier channels, fast mode's mean Jaccard with exact mode went from 0.97-0.98 to 1.0 with 8-bit queries),
    // while the stored f16 rows, and with them exact mode's scores, stay as they were.
    const RowRotation &int8_rotation() const { return int8_rotation_; }
    int64_t int8_width() const { return int8_width_; }
    const int8_t *int8_row(int64_t cell) const { return int8_.data() + cell * int8_width_; }
    float int8_scale(int64_t cell) const { return int8_scale_[static_cast<size_t>(cell)]; }
    int32_t int8_sum(int64_t cell) const { return int8_sum_[static_cast<size_t>(cell)]; }
    // The scales and sums of cells cell, cell + 1, ... (contiguous, as the rows).
    const float *int8_scales(int64_t cell) const { return int8_scale_.data() + cell; }
    const int32_t *int8_sums(int64_t cell) const { return int8_sum_.data() + cell; }
    int64_t int8_copy_bytes() const {
        return static_cast<int64_t>(int8_.size() + int8_scale_.size() * sizeof(float) +
                                    int8_sum_.size() * sizeof(int32_t));
    }

  private:
    DType type_ = DType::F32;
    int64_t width_ = 0;
    int64_t row_bytes_ = 0;
    RowRotation rotation_;
    std::vector<float> scratch_;  // [width] the row being rotated by write() or, for its int8 copy, refresh_int8()
    // The rows, zero until written, in memory that is committed as it is written (core/page_arena.h): a cache
    // sized for a long context costs neither a zeroing pass nor its full size in resident memory up front.
    ZeroedVector<uint8_t> data_;
    CommitAhead data_commit_;  // commits data_'s pages ahead of the rows written (page_arena.h)
    bool written_ = false;     // whether any row was ever stored (write, write_raw, copy_row): else all are zero
    // The int8 copy (keep_int8_copy): [n_cells, int8_width_] values, [n_cells] scales and sums.
    Int8RowQuantizer quantize_ = nullptr;
    int64_t int8_width_ = 0;
    ZeroedVector<int8_t> int8_;
    ZeroedVector<float> int8_scale_;
    ZeroedVector<int32_t> int8_sum_;
    RowRotation int8_rotation_;
    CommitAhead int8_commit_, int8_scale_commit_, int8_sum_commit_;

    // Row `cell` to be written: its pages committed first.
    void *row_mut(int64_t cell) {
        data_commit_.before_write(data_.data(), static_cast<size_t>(cell * row_bytes_),
                                  static_cast<size_t>(row_bytes_));
        return data_.data() + cell * row_bytes_;
    }
    // The same for the int8 copy's row, scale and sum of `cell`.
    void commit_int8(int64_t cell);
    void refresh_int8(int64_t cell);  // re-quantises the copy of `cell` from its stored row
};

}  // namespace sparrow
