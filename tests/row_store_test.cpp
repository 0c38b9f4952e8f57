// RowStore: write/read round trips per row type, exact row copies, the int8 copy kept in step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <vector>

#include "attention/indexer_kernels.h"
#include "cache/row_store.h"
#include "core/error.h"
#include "kernels/ops.h"

namespace sparrow {
namespace {

TEST(RowStore, ReadReturnsWhatWasWrittenUpToRowTypeRounding) {
    struct Case {
        DType type;
        float tol;  // relative to the value
    };
    for (const Case c : {Case{DType::F32, 0.0f}, Case{DType::F16, 1e-3f}, Case{DType::BF16, 8e-3f}}) {
        const int64_t width = 37;
        RowStore store(c.type, 5, width);
        std::vector<float> src(width), back(width);
        for (int64_t i = 0; i < width; ++i) src[i] = std::sin(0.7f * float(i)) * 3.0f;
        store.write(3, src.data());
        store.read(3, back.data());
        for (int64_t i = 0; i < width; ++i) EXPECT_NEAR(back[i], src[i], c.tol * std::fabs(src[i]) + 1e-7f) << i;
    }
}

TEST(RowStore, CopyRowIsExact) {
    const int64_t width = 19;
    RowStore store(DType::F16, 4, width);
    std::vector<float> src(width), a(width), b(width);
    for (int64_t i = 0; i < width; ++i) src[i] = 0.1f * float(i) - 0.9f;
    store.write(0, src.data());
    store.copy_row(0, 2);
    store.read(0, a.data());
    store.read(2, b.data());
    EXPECT_EQ(a, b);
    store.copy_row(2, 2);  // a no-op, not an overlapping memcpy
    store.read(2, b.data());
    EXPECT_EQ(a, b);
}

// The int8 copy equals quantising the stored row afresh, widened and rotated by the store's int8 rotation, after
// every kind of change: write, copy_row, write_raw (state load) and fill_random; rows written before the copy was
// asked for are covered too. A store without a rotation of its own gives its int8 copy the Hadamard blocks of
// the width; a rotated store's rows are quantised as stored.
TEST(RowStore, Int8CopyFollowsEveryWrite) {
    for (const bool rotated_store : {false, true}) {
        for (const DType type : {DType::F32, DType::F16, DType::BF16}) {
            const int64_t width = 37, dp = 40, n_cells = 6;
            RowStore store(type, n_cells, width, rotated_store ? RowRotation().segment(width) : RowRotation());
            ASSERT_EQ(store.int8_rotation().empty(), rotated_store);
            if (!rotated_store) {
                ASSERT_EQ(store.int8_rotation().blocks(), (std::vector<int64_t>{32, 4, 1}));
            }
            std::vector<float> src(width);
            auto fill = [&](float phase) {
                for (int64_t i = 0; i < width; ++i)
                    src[static_cast<size_t>(i)] = std::sin(phase + 0.7f * float(i)) * 3.0f;
            };
            fill(0.0f);
            store.write(1, src.data());
            store.keep_int8_copy(indexer::scalar::quantize_keys, dp);
            auto expect_fresh = [&](int64_t cell, const char *after) {
                std::vector<float> row(width);
                dequantize_row(type, store.row(cell), row.data(), width);
                store.int8_rotation().apply(row.data(), 1);
                const void *rows[1] = {row.data()};
                std::vector<int8_t> q(dp, 99);
                float scale = 0;
                int32_t sum = 0;
                indexer::scalar::quantize_keys(static_cast<uint32_t>(DType::F32), rows, 1, width, dp, q.data(), &scale,
                                               &sum);
                EXPECT_EQ(std::vector<int8_t>(store.int8_row(cell), store.int8_row(cell) + dp), q)
                    << dtype_name(type) << " cell " << cell << " after " << after;
                EXPECT_EQ(store.int8_scale(cell), scale) << after;
                EXPECT_EQ(store.int8_sum(cell), sum) << after;
            };
            expect_fresh(1, "keep_int8_copy");
            expect_fresh(0, "keep_int8_copy (an empty row)");
            fill(1.0f);
            store.write(2, src.data());
            expect_fresh(2, "write");
            store.copy_row(2, 4);
            expect_fresh(4, "copy_row");
            std::vector<uint8_t> raw(static_cast<const uint8_t *>(store.row(1)),
                                     static_cast<const uint8_t *>(store.row(1)) + store.row_bytes());
            store.write_raw(5, raw.data());
            expect_fresh(5, "write_raw");
            const int32_t cells[] = {0, 3};
            store.fill_random(cells, 7, 2.0f);
            expect_fresh(0, "fill_random");
            expect_fresh(3, "fill_random");
            EXPECT_EQ(store.int8_copy_bytes(), n_cells * (dp + 8));
        }
    }
    EXPECT_TRUE(RowStore(DType::Q8_0, 2, 32).int8_rotation().empty());  // fast mode reads Q8_0 rows in place
    RowStore q8(DType::Q8_0, 2, 32);
    EXPECT_THROW(q8.keep_int8_copy(indexer::scalar::quantize_keys, 32), Error);
    RowStore narrow(DType::F16, 2, 32);
    EXPECT_THROW(narrow.keep_int8_copy(indexer::scalar::quantize_keys, 28), Error);
}

// This process's resident bytes (/proc/self/statm's second field, in pages).
size_t resident_bytes() {
    std::ifstream statm("/proc/self/statm");
    size_t total = 0, resident = 0;
    statm >> total >> resident;
    return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// A cache for a long context is reserved, not made resident: a fresh store, its int8 copy included, reads as
// zero and takes memory only for the rows written (here 256 MiB of f16 rows, 132 MiB of int8 copy, two rows
// written), and the copy of a row written after keep_int8_copy follows it.
TEST(RowStore, FreshStoresAreNotResident) {
    const int64_t n_cells = int64_t(1) << 20, width = 128;
    const size_t before = resident_bytes();
    RowStore store(DType::F16, n_cells, width);
    store.keep_int8_copy(indexer::scalar::quantize_keys, width);
    EXPECT_EQ(store.n_bytes(), n_cells * width * 2);
    std::vector<float> src(width, 1.5f), back(width, -1.0f);
    store.read(n_cells / 2, back.data());
    EXPECT_EQ(back, std::vector<float>(width, 0.0f));
    EXPECT_EQ(store.int8_scale(n_cells / 2), 0.0f);
    store.write(7, src.data());
    store.write(n_cells - 1, src.data());
    store.read(n_cells - 1, back.data());
    EXPECT_EQ(back, src);
    EXPECT_GT(store.int8_scale(7), 0.0f);
    EXPECT_EQ(store.int8_sum(7), store.int8_sum(n_cells - 1));
    EXPECT_LT(resident_bytes(), before + (size_t(64) << 20));
}

}  // namespace
}  // namespace sparrow
