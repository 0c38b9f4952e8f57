#include "cache/row_store.h"

#include <cstring>

#include "core/error.h"

namespace sparrow {

RowStore::RowStore(DType type, int64_t n_cells, int64_t width)
    : type_(type),
      width_(width),
      row_bytes_(dtype_row_size(type, width)),
      data_(static_cast<size_t>(n_cells * dtype_row_size(type, width))) {
    SPARROW_ASSERT(type == DType::F32 || type == DType::F16 || type == DType::BF16);
}

void RowStore::write(int64_t cell, const float *src) {
    quantize_row(type_, src, data_.data() + cell * row_bytes_, width_);
}

void RowStore::read(int64_t cell, float *dst) const { dequantize_row(type_, row(cell), dst, width_); }

void RowStore::copy_row(int64_t src, int64_t dst) {
    if (src != dst) std::memcpy(row(dst), row(src), static_cast<size_t>(row_bytes_));
}

void RowStore::fill_random(std::span<const int32_t> cells, uint64_t seed, float scale) {
    std::vector<float> row(static_cast<size_t>(width_));
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (const int32_t cell : cells) {
        for (auto &v : row) {  // xorshift64*: cheap and good enough for filler data
            state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
            const uint64_t r = state * 0x2545F4914F6CDD1Dull;
            v = scale * (static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f);
        }
        write(cell, row.data());
    }
}

}  // namespace sparrow
