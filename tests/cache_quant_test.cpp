// Quantised caches below the model: the Q8_0 / Q4_0 row-to-f32 kernels of every ISA level against
// dequantize_row (exact), the Hadamard RowRotation (blocks, inverse, dot products kept), and RowStore with
// q8_0 / q4_0 rows, with and without rotation (read() undoes write(), errors on bad widths, outliers).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/indexer_internal.h"
#include "cache/row_store.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace sparrow {
namespace {

// Quantised rows of n elements: whole blocks, odd block counts, long rows (the MLA latent's 576).
constexpr int64_t kQuantLengths[] = {32, 64, 96, 160, 416, 576, 608};

class CacheConvertIsa : public ::testing::TestWithParam<cpu::Isa> {};

TEST_P(CacheConvertIsa, QuantRowsToF32EqualDequantizeRow) {
    const cpu::KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(GetParam());
    std::mt19937 rng(5);
    for (const DType t : {DType::Q8_0, DType::Q4_0}) {
        const cpu::ToF32Fn convert = t == DType::Q8_0 ? table->to_f32_q8_0 : table->to_f32_q4_0;
        ASSERT_NE(convert, nullptr);
        for (const int64_t n : kQuantLengths) {
            auto x = test::random_floats(rng, static_cast<size_t>(n), -3.0f, 3.0f);
            x[static_cast<size_t>(n / 3)] = 40.0f;  // an outlier: one block with a large scale
            // Two bytes of offset: rows of 34- and 18-byte blocks are only 2-byte aligned (the f16 scale).
            std::vector<uint8_t> bytes(static_cast<size_t>(dtype_row_size(t, n)) + 2);
            quantize_row(t, x.data(), bytes.data() + 2, n);
            std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n) + 1, -7.0f);
            dequantize_row(t, bytes.data() + 2, want.data(), n);
            convert(bytes.data() + 2, got.data(), n);
            for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << dtype_name(t) << " n=" << n << " i=" << i;
            EXPECT_EQ(got[static_cast<size_t>(n)], -7.0f) << "wrote past the row";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, CacheConvertIsa,
                         ::testing::Values(cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512),
                         [](const ::testing::TestParamInfo<cpu::Isa> &p) {
                             return std::string(cpu::isa_name(p.param));
                         });

TEST(CacheConvert, ConvertRowToF32TakesQuantRowsAndRejectsPartialBlocks) {
    std::vector<float> x(64, 0.5f), y(64);
    std::vector<uint8_t> q(static_cast<size_t>(dtype_row_size(DType::Q4_0, 64)));
    quantize_row(DType::Q4_0, x.data(), q.data(), 64);
    convert_row_to_f32(DType::Q4_0, q.data(), y.data(), 64);
    for (float v : y) EXPECT_NEAR(v, 0.5f, 1e-3f);
    EXPECT_THROW(convert_row_to_f32(DType::Q8_0, q.data(), y.data(), 48), Error);
    EXPECT_THROW(convert_row_to_f32(DType::Q4_1, q.data(), y.data(), 32), Error);
}

TEST(RowRotation, CutsSegmentsIntoPowerOfTwoBlocks) {
    EXPECT_EQ(RowRotation().segment(512).segment(64).blocks(), (std::vector<int64_t>{512, 64}));
    EXPECT_EQ(RowRotation().segment(96).blocks(), (std::vector<int64_t>{64, 32}));
    EXPECT_EQ(RowRotation().segment(48, 2).blocks(), (std::vector<int64_t>{32, 16, 32, 16}));
    EXPECT_EQ(RowRotation().segment(7).blocks(), (std::vector<int64_t>{4, 2, 1}));
    EXPECT_EQ(RowRotation().segment(96).segment(32).width(), 128);
    EXPECT_TRUE(RowRotation().empty());
    EXPECT_THROW(RowRotation().segment(0), Error);
}

TEST(RowRotation, IsItsOwnInverseAndKeepsDotProducts) {
    std::mt19937 rng(11);
    const RowRotation rot = RowRotation().segment(96).segment(16);  // blocks 64, 32, 16
    const int64_t w = rot.width(), n_rows = 3;
    const auto x = test::random_floats(rng, static_cast<size_t>(w * n_rows));
    const auto q = test::random_floats(rng, static_cast<size_t>(w * n_rows));
    auto xr = x, qr = q;
    rot.apply(xr.data(), n_rows);
    rot.apply(qr.data(), n_rows);
    EXPECT_NE(xr, x);
    for (int64_t r = 0; r < n_rows; ++r) {
        double dot = 0, dot_r = 0;
        for (int64_t i = 0; i < w; ++i) {
            dot += double(x[r * w + i]) * q[r * w + i];
            dot_r += double(xr[r * w + i]) * qr[r * w + i];
        }
        EXPECT_NEAR(dot_r, dot, 1e-5 * w);
    }
    rot.apply(xr.data(), n_rows);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(xr[i], x[i], 1e-6f);
    // Blocks are independent: a change in the 16-block leaves the others alone.
    auto y = x;
    y[static_cast<size_t>(w - 1)] += 1.0f;
    auto a = x, b = y;
    rot.apply(a.data(), 1);
    rot.apply(b.data(), 1);
    for (int64_t i = 0; i < 96; ++i) EXPECT_EQ(a[i], b[i]);
}

TEST(RowStore, QuantRowsReadBackWithAndWithoutRotation) {
    struct Case {
        DType type;
        float tol;  // of the RMS error, relative to the row's RMS
    };
    std::mt19937 rng(3);
    const int64_t width = 96;  // the row of a model with kv_lora 64 and rope 32
    for (const Case c : {Case{DType::Q8_0, 0.01f}, Case{DType::Q4_0, 0.2f}}) {
        for (const bool rotate : {false, true}) {
            RowStore store(c.type, 4, width, rotate ? RowRotation().segment(64).segment(32) : RowRotation());
            EXPECT_EQ(store.rotation().empty(), !rotate);
            EXPECT_EQ(store.row_bytes(), dtype_row_size(c.type, width));
            const auto src = test::random_floats(rng, static_cast<size_t>(width), -2.0f, 2.0f);
            std::vector<float> back(static_cast<size_t>(width));
            store.write(2, src.data());
            store.read(2, back.data());
            double err = 0, norm = 0;
            for (int64_t i = 0; i < width; ++i) {
                err += (back[i] - src[i]) * double(back[i] - src[i]);
                norm += src[i] * double(src[i]);
            }
            EXPECT_LT(std::sqrt(err / norm), c.tol) << dtype_name(c.type) << " rotate=" << rotate;
            // The stored bytes are the quantised rotated row: attention reads them as they are.
            auto rotated = src;
            store.rotation().apply(rotated.data(), 1);
            std::vector<uint8_t> want(static_cast<size_t>(store.row_bytes()));
            quantize_row(c.type, rotated.data(), want.data(), width);
            EXPECT_EQ(std::memcmp(store.row(2), want.data(), want.size()), 0);
        }
    }
}

// A row with one outlier channel per block: quantised as it is, every other element of the block rounds to
// a few levels of a scale set by the outlier; rotated first, the error is far smaller.
TEST(RowStore, RotationLowersQ4ErrorOnOutlierRows) {
    std::mt19937 rng(8);
    const int64_t width = 128;
    auto src = test::random_floats(rng, static_cast<size_t>(width), -1.0f, 1.0f);
    src[5] = 30.0f;
    src[70] = -30.0f;
    double err[2] = {0, 0};
    for (const bool rotate : {false, true}) {
        RowStore store(DType::Q4_0, 1, width, rotate ? RowRotation().segment(width) : RowRotation());
        std::vector<float> back(static_cast<size_t>(width));
        store.write(0, src.data());
        store.read(0, back.data());
        for (int64_t i = 0; i < width; ++i) err[rotate] += (back[i] - src[i]) * double(back[i] - src[i]);
    }
    EXPECT_LT(err[1], 0.5 * err[0]) << "squared error without rotation " << err[0] << ", with " << err[1];
}

TEST(RowStore, RejectsWidthsThatAreNotWholeBlocksAndMismatchedRotations) {
    EXPECT_THROW(RowStore(DType::Q8_0, 4, 48), Error);
    EXPECT_THROW(RowStore(DType::Q4_0, 4, 16), Error);
    EXPECT_THROW(RowStore(DType::Q4_1, 4, 32), Error);
    EXPECT_THROW(RowStore(DType::Q8_0, 4, 64, RowRotation().segment(32)), Error);
    EXPECT_NO_THROW(RowStore(DType::F16, 4, 48, RowRotation().segment(48)));
    try {
        RowStore(DType::Q4_0, 4, 48);
        FAIL() << "no error";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
    }
}

// Attention and the indexer read q8_0 / q4_0 stores exactly as f32 stores holding the dequantised rows: the
// tiles they build are the same floats, so outputs and selections are identical (every ISA level of the
// indexer, both precisions).
TEST(QuantStores, AttentionAndIndexerReadQuantRowsAsTheirDequantisedValues) {
    std::mt19937 rng(21);
    ThreadPool pool(2);
    const int64_t n_cells = 150, n_tokens = 3;
    for (const DType t : {DType::Q8_0, DType::Q4_0}) {
        // llama-like: 4 query heads over 2 KV heads of 32 (K and V rows 64 wide).
        const int64_t width = 64;
        RowStore kq(t, n_cells, width), vq(t, n_cells, width), kf(DType::F32, n_cells, width),
            vf(DType::F32, n_cells, width);
        std::vector<float> row(static_cast<size_t>(width));
        for (int64_t c = 0; c < n_cells; ++c) {
            for (auto *pair : {&kq, &vq}) {
                const auto x = test::random_floats(rng, static_cast<size_t>(width), -2.0f, 2.0f);
                pair->write(c, x.data());
                pair->read(c, row.data());
                (pair == &kq ? kf : vf).write(c, row.data());
            }
        }
        std::vector<std::vector<int32_t>> lists(static_cast<size_t>(n_tokens));
        for (int64_t i = 0; i < n_tokens; ++i) {
            for (int32_t c = 0; c < n_cells - 40 * i; c += 1 + static_cast<int32_t>(i)) lists[i].push_back(c);
        }
        const std::vector<std::span<const int32_t>> rows(lists.begin(), lists.end());
        const AttentionShape shape{.n_head = 4, .n_head_kv = 2, .head_dim_k = 32, .head_dim_v = 32, .scale = 0.2f};
        const auto q = test::random_floats(rng, static_cast<size_t>(n_tokens * 4 * 32));
        std::vector<float> out_q(static_cast<size_t>(n_tokens * 4 * 32)), out_f(out_q.size());
        attention(pool, shape, q.data(), n_tokens, kq, vq, rows, out_q.data());
        attention(pool, shape, q.data(), n_tokens, kf, vf, rows, out_f.data());
        EXPECT_EQ(out_q, out_f) << dtype_name(t);

        // Indexer: 4 heads of 64 over the K store, top-20 of each list.
        const IndexerShape ishape{.n_head = 4, .head_dim = 64};
        const auto iq = test::random_floats(rng, static_cast<size_t>(n_tokens * 4 * 64));
        const auto iw = test::random_floats(rng, static_cast<size_t>(n_tokens * 4), 0.1f, 1.0f);
        for (const cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2}) {
            if (!cpu::cpu_supports(isa)) continue;
            for (const IndexerPrecision prec : {IndexerPrecision::exact, IndexerPrecision::fast}) {
                std::vector<std::vector<int32_t>> sel_q, sel_f;
                indexer::select_with_isa(isa, pool, ishape, prec, iq.data(), iw.data(), n_tokens, kq, rows, 20, sel_q);
                indexer::select_with_isa(isa, pool, ishape, prec, iq.data(), iw.data(), n_tokens, kf, rows, 20, sel_f);
                EXPECT_EQ(sel_q, sel_f) << dtype_name(t) << " " << cpu::isa_name(isa);
                EXPECT_EQ(sel_q[0].size(), 20u);
            }
        }
    }
}

}  // namespace
}  // namespace sparrow
