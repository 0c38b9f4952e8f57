// A per-layer cache store: one row of `width` elements per cache cell, in an f32, f16 or bf16 row type.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"

namespace sparrow {

class RowStore {
  public:
    RowStore() = default;
    RowStore(DType type, int64_t n_cells, int64_t width);

    DType type() const { return type_; }
    int64_t width() const { return width_; }
    int64_t row_bytes() const { return row_bytes_; }
    int64_t n_bytes() const { return static_cast<int64_t>(data_.size()); }

    // Converts `src` (width floats) to the row type and stores it in `cell`.
    void write(int64_t cell, const float *src);
    // The inverse of write(): the row of `cell` as `width` floats (the values write() was given, up to the
    // row type's rounding). Cache operations that edit rows (position shifts) go through read/write so that
    // any encoding of the stored row (rounding, quantisation, rotation) is undone and redone in one place.
    void read(int64_t cell, float *dst) const;
    // Copies the stored bytes of row `src` to row `dst` (defragmentation, sequence copies): exact.
    void copy_row(int64_t src, int64_t dst);
    const void *row(int64_t cell) const { return data_.data() + cell * row_bytes_; }
    void *row(int64_t cell) { return data_.data() + cell * row_bytes_; }
    // Fills the rows of `cells` with pseudo-random values uniform in [-scale, scale] (benchmark filler).
    void fill_random(std::span<const int32_t> cells, uint64_t seed, float scale);

  private:
    DType type_ = DType::F32;
    int64_t width_ = 0;
    int64_t row_bytes_ = 0;
    std::vector<uint8_t> data_;
};

}  // namespace sparrow
