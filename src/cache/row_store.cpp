#include "cache/row_store.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace sparrow {

RowRotation &RowRotation::segment(int64_t n, int64_t count) {
    if (n <= 0 || count < 0) {
        throw_error("a rotation segment needs a positive length and count (got %lld x %lld)", (long long)n,
                    (long long)count);
    }
    for (int64_t c = 0; c < count; ++c) {
        for (int64_t left = n; left > 0;) {
            int64_t block = 1;
            while (block * 2 <= left) block *= 2;
            blocks_.push_back(block);
            left -= block;
        }
        width_ += n;
    }
    return *this;
}

void RowRotation::apply(float *x, int64_t n_rows) const {
    for (int64_t r = 0; r < n_rows; ++r) {
        float *row = x + r * width_;
        for (const int64_t block : blocks_) {
            if (block > 1) hadamard(row, 1, block);
            row += block;
        }
    }
}

namespace {

int64_t checked_row_bytes(DType type, int64_t width) {
    if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && type != DType::Q8_0 && type != DType::Q4_0) {
        throw_error("cache rows cannot be stored as %s (f32, f16, bf16, q8_0 or q4_0)",
                    std::string(dtype_name(type)).c_str());
    }
    const int64_t block = dtype_info(type).block_size;
    if (width < 0 || width % block != 0) {
        throw_error("cache rows of %lld elements cannot be stored as %s: the width must be a multiple of %lld",
                    (long long)width, std::string(dtype_name(type)).c_str(), (long long)block);
    }
    return dtype_row_size(type, width);
}

}  // namespace

RowStore::RowStore(DType type, int64_t n_cells, int64_t width, RowRotation rotation)
    : type_(type),
      width_(width),
      row_bytes_(checked_row_bytes(type, width)),
      rotation_(std::move(rotation)),
      data_(static_cast<size_t>(n_cells * row_bytes_)),
      data_commit_(data_.size()) {
    if (!rotation_.empty() && rotation_.width() != width) {
        throw_error("cache rotation covers %lld elements of %lld-element rows", (long long)rotation_.width(),
                    (long long)width);
    }
    if (rotation_.empty() && type_ != DType::Q8_0 && width > 0) int8_rotation_.segment(width);
    // One of the two rotations at most: write() rotates with rotation_, refresh_int8() with int8_rotation_.
    if (!rotation_.empty() || !int8_rotation_.empty()) scratch_.resize(static_cast<size_t>(width));
}

void RowStore::write(int64_t cell, const float *src) {
    if (!rotation_.empty()) {
        std::memcpy(scratch_.data(), src, static_cast<size_t>(width_) * sizeof(float));
        rotation_.apply(scratch_.data(), 1);
        src = scratch_.data();
    }
    // F16 (the default cache type) through the table's conversion: decode writes every layer's row of every
    // token on one thread, and F16C converts 8 floats per instruction where the portable conversion branches per
    // element (a 4-sequence decode profile: 65 samples in it against 38 in F16C's, over the same 300 steps).
    if (type_ == DType::F16) {
        cpu::kernels().from_f32_f16(src, row_mut(cell), width_);
    } else {
        quantize_row(type_, src, row_mut(cell), width_);
    }
    written_ = true;
    refresh_int8(cell);
}

void RowStore::read(int64_t cell, float *dst) const {
    dequantize_row(type_, row(cell), dst, width_);
    rotation_.apply(dst, 1);  // the rotation is its own inverse
}

void RowStore::copy_row(int64_t src, int64_t dst) {
    if (src == dst) return;
    std::memcpy(row_mut(dst), row(src), static_cast<size_t>(row_bytes_));
    written_ = true;
    if (quantize_) {
        commit_int8(dst);
        std::memcpy(int8_.data() + dst * int8_width_, int8_row(src), static_cast<size_t>(int8_width_));
        int8_scale_[static_cast<size_t>(dst)] = int8_scale(src);
        int8_sum_[static_cast<size_t>(dst)] = int8_sum(src);
    }
}

void RowStore::write_raw(int64_t cell, const void *bytes) {
    std::memcpy(row_mut(cell), bytes, static_cast<size_t>(row_bytes_));
    written_ = true;
    refresh_int8(cell);
}

void RowStore::keep_int8_copy(Int8RowQuantizer quantize, int64_t dp) {
    if (!int8_copy_supported(type_)) {
        throw_error("an int8 copy of cache rows needs f32, f16 or bf16 rows, not %s",
                    std::string(dtype_name(type_)).c_str());
    }
    if (!quantize || dp < width_)
        throw_error("an int8 copy needs a quantiser and at least %lld columns", (long long)width_);
    const int64_t n_cells = row_bytes_ > 0 ? n_bytes() / row_bytes_ : 0;
    quantize_ = quantize;
    int8_width_ = dp;
    // Fresh zeroed vectors (sized at construction: no pass over them; see ZeroedAllocator).
    int8_ = ZeroedVector<int8_t>(static_cast<size_t>(n_cells * dp));
    int8_scale_ = ZeroedVector<float>(static_cast<size_t>(n_cells));
    int8_sum_ = ZeroedVector<int32_t>(static_cast<size_t>(n_cells));
    int8_commit_ = CommitAhead(int8_.size());
    int8_scale_commit_ = CommitAhead(int8_scale_.size() * sizeof(float));
    int8_sum_commit_ = CommitAhead(int8_sum_.size() * sizeof(int32_t));
    // A row of zero bytes quantises to what the vectors above hold (zeros, scale 0, sum 0): only the others are
    // quantised, and a store never written is not even read (reading its rows would make them resident).
    for (int64_t c = 0; c < n_cells && written_; ++c) {
        const auto *bytes = static_cast<const uint8_t *>(row(c));
        if (std::any_of(bytes, bytes + row_bytes_, [](uint8_t b) { return b != 0; })) refresh_int8(c);
    }
}

void RowStore::commit_int8(int64_t cell) {
    const auto c = static_cast<size_t>(cell);
    int8_commit_.before_write(int8_.data(), c * static_cast<size_t>(int8_width_), static_cast<size_t>(int8_width_));
    int8_scale_commit_.before_write(int8_scale_.data(), c * sizeof(float), sizeof(float));
    int8_sum_commit_.before_write(int8_sum_.data(), c * sizeof(int32_t), sizeof(int32_t));
}

void RowStore::refresh_int8(int64_t cell) {
    if (!quantize_) return;
    commit_int8(cell);
    const void *rows[1] = {row(cell)};
    uint32_t row_type = static_cast<uint32_t>(type_);
    if (!int8_rotation_.empty()) {  // the row as stored, widened and rotated (int8_rotation)
        dequantize_row(type_, row(cell), scratch_.data(), width_);
        int8_rotation_.apply(scratch_.data(), 1);
        rows[0] = scratch_.data();
        row_type = static_cast<uint32_t>(DType::F32);
    }
    quantize_(row_type, rows, 1, width_, int8_width_, int8_.data() + cell * int8_width_,
              &int8_scale_[static_cast<size_t>(cell)], &int8_sum_[static_cast<size_t>(cell)]);
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
