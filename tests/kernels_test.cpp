// The ISA kernels and matmul against the scalar references (kernels/ref), on random data and awkward shapes.
// Every test that takes an Isa parameter runs once per level; a level the CPU lacks is skipped with a
// message. Tolerances are relative to the magnitude of the sum (sum |w_i x_i|), so a lost term, a wrong
// scale or a misplaced element fails while f32 rounding order does not.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"
#include "kernels/ref/ref_ops.h"
#include "test_util.h"

// --- allocation counting
// -------------------------------------------------------------------------------------- The global operator
// new is replaced for this test binary (it must be, program-wide, to see allocations made inside the library)
// by one that counts calls and otherwise behaves like the default. Every non-aligned form is replaced, so
// that no pointer from a library-provided new (e.g. ASan's) reaches these deletes; the aligned forms stay the
// library's, in matching pairs.
namespace {
std::atomic<int64_t> g_n_allocations{0};

void *counted_malloc(size_t size) noexcept {
    g_n_allocations.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(size ? size : 1);
}
}  // namespace

// All out of line, so that GCC does not pair an inlined malloc()/free() with a `new`/`delete` expression
// (-Wmismatched-new-delete cannot see that these operators are malloc and free).
__attribute__((noinline)) void *operator new(size_t size) {
    if (void *p = counted_malloc(size)) return p;
    throw std::bad_alloc();
}
__attribute__((noinline)) void *operator new[](size_t size) {
    if (void *p = counted_malloc(size)) return p;
    throw std::bad_alloc();
}
__attribute__((noinline)) void *operator new(size_t size, const std::nothrow_t &) noexcept {
    return counted_malloc(size);
}
__attribute__((noinline)) void *operator new[](size_t size, const std::nothrow_t &) noexcept {
    return counted_malloc(size);
}
__attribute__((noinline)) void operator delete(void *p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete[](void *p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void *p, size_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete[](void *p, size_t) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete[](void *p, const std::nothrow_t &) noexcept { std::free(p); }

namespace sparrow::cpu {
// Names the level in gtest's messages ("avx2" rather than a byte dump).
void PrintTo(Isa isa, std::ostream *os) { *os << isa_name(isa); }
}  // namespace sparrow::cpu

namespace sparrow {
namespace {

using cpu::Isa;
using cpu::KernelTable;

constexpr DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16,   DType::Q8_0,  DType::Q4_0, DType::Q4_1,
                                  DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K, DType::Q3_K,
                                  DType::Q4_K, DType::Q5_K, DType::Q6_K,   DType::IQ4_XS};

std::string skip_message(Isa isa) { return std::string("skipped: CPU lacks ") + cpu::isa_name(isa); }

std::string isa_param_name(const ::testing::TestParamInfo<Isa> &info) { return cpu::isa_name(info.param); }

// A weight row of type t holding (the type's rounding of) x.
std::vector<uint8_t> to_row(DType t, const std::vector<float> &x) {
    std::vector<uint8_t> row(static_cast<size_t>(dtype_row_size(t, static_cast<int64_t>(x.size()))));
    quantize_row(t, x.data(), row.data(), static_cast<int64_t>(x.size()));
    return row;
}

std::vector<float> to_floats(DType t, const void *row, int64_t n) {
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(t, row, y.data(), n);
    return y;
}

// The dot type of weights of type t: activations are quantised to Q8_K for K-quants and IQ4_XS, to Q8_0 for the
// other quantised types.
DType dot_type(DType t) { return dtype_dots_q8_k(t) ? DType::Q8_K : dtype_is_quantized(t) ? DType::Q8_0 : DType::F32; }

// Bytes of one activation row for weights of type t: f32 for float weights, else the table's dot type.
int64_t x_row_bytes(DType t, int64_t n) {
    return dtype_is_quantized(t) ? KernelTable::dot_x_row_bytes(t, n) : n * int64_t(sizeof(float));
}

// xf in the dot type of weights of type t, written to y (x_row_bytes(t, n) bytes) by the given table.
void to_dot_x(const KernelTable &table, DType t, const std::vector<float> &xf, uint8_t *y) {
    const int64_t n = static_cast<int64_t>(xf.size());
    if (dtype_is_quantized(t)) {
        table.quantize_dot_x(t, xf.data(), y, n);
    } else {
        std::memcpy(y, xf.data(), xf.size() * sizeof(float));
    }
}

// sum |w_i x_i| of two rows (of types tw and tx): the scale an error of the dot product is measured on.
double magnitude(DType tw, const void *w, DType tx, const void *x, int64_t n) {
    const auto wf = to_floats(tw, w, n), xf = to_floats(tx, x, n);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::fabs(double(wf[i]) * double(xf[i]));
    return sum;
}

// f32 accumulation of a few thousand terms in 8+ independent chains stays within ~1e-7 of the magnitude;
// one missing term of a 4096-long random row is ~2e-4 of it.
constexpr double kDotRelTol = 1e-6;

// Row lengths for the dot products: every block type needs n % 32 == 0; float types also get odd lengths
// that exercise the SIMD tails.
std::vector<int64_t> dot_lengths(DType t) {
    std::vector<int64_t> n = {32,  64,   96,   128,  160,  224,  256,  288,  480,  512,   544,
                              800, 1024, 1056, 2080, 3072, 4096, 4128, 5120, 8224, 11008, 14336};
    if (!dtype_is_quantized(t)) {
        for (int64_t odd : {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 47, 63, 65, 100, 127, 129, 4097}) n.push_back(odd);
    }
    if (dtype_dots_q8_k(t)) {  // super-blocks of 256: the lengths above that hold whole ones, and a few more
        std::erase_if(n, [](int64_t v) { return v % QK_K != 0; });
        for (int64_t more : {768, 1280, 1792, 7168}) n.push_back(more);
    }
    return n;
}

// --- dispatch
// ---------------------------------------------------------------------------------------------------

TEST(Dispatch, ScalarAlwaysAvailableAndActiveIsSupported) {
    ASSERT_NE(cpu::kernels_for(Isa::scalar), nullptr);
    const KernelTable &active = cpu::kernels();
    EXPECT_TRUE(cpu::cpu_supports(active.isa));
    EXPECT_STREQ(cpu::active_isa_name(), cpu::isa_name(active.isa));
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
        const KernelTable *t = cpu::kernels_for(isa);
        EXPECT_EQ(t != nullptr, cpu::cpu_supports(isa));
        if (!t) continue;
        EXPECT_EQ(t->isa, isa);
        for (DType dt : kWeightTypes) EXPECT_NE(t->dot(dt), nullptr);
        for (DType dt : {DType::F32, DType::F16, DType::BF16}) EXPECT_NE(t->axpy(dt), nullptr);
        EXPECT_NE(t->quantize_row_q8_0, nullptr);
        EXPECT_NE(t->from_f32_f16, nullptr);
        EXPECT_NE(t->swiglu, nullptr);
        EXPECT_NE(t->hadamard_row, nullptr);
    }
    EXPECT_THROW(active.dot(DType::IQ2_XXS), Error);
    EXPECT_THROW(active.axpy(DType::Q8_0), Error);
}

TEST(Dispatch, ResolveIsaHonoursLowerRequestsOnly) {
    const Isa best = cpu::cpu_supports(Isa::avx512) ? Isa::avx512
                     : cpu::cpu_supports(Isa::avx2) ? Isa::avx2
                                                    : Isa::scalar;
    EXPECT_EQ(cpu::resolve_isa(nullptr), best);
    EXPECT_EQ(cpu::resolve_isa(""), best);
    EXPECT_EQ(cpu::resolve_isa("scalar"), Isa::scalar);
    EXPECT_EQ(cpu::resolve_isa("avx2"), cpu::cpu_supports(Isa::avx2) ? Isa::avx2 : best);
    EXPECT_EQ(cpu::resolve_isa("avx512"), best);  // the best there is, never more
    EXPECT_EQ(cpu::resolve_isa("neon"), best);    // unknown names are ignored (with a warning)
}

// --- dot products, per level
// --------------------------------------------------------------------------------

class IsaTest : public ::testing::TestWithParam<Isa> {};

TEST_P(IsaTest, DotTileMatchesReferenceForEveryTypeLengthAndTile) {
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    std::mt19937 rng(11);
    for (DType t : kWeightTypes) {
        const DType tx = dot_type(t);
        for (int64_t n : dot_lengths(t)) {
            const auto w = to_row(t, test::random_floats(rng, static_cast<size_t>(n), -2.0f, 2.0f));
            // kMaxTile activation rows with a gap between them (stride > row size) to catch stride bugs, in the
            // kernel's dot type; and each row as plain Q8_0 (or f32) for the reference.
            const size_t x_row = static_cast<size_t>(x_row_bytes(t, n));
            const size_t stride = x_row + (tx == DType::F32 ? 12 : (t == DType::Q4_0 ? 104 : 34));
            const int max_tile = cpu::max_tile(t);
            std::vector<uint8_t> x(stride * static_cast<size_t>(max_tile));
            std::vector<std::vector<uint8_t>> ref_x;
            for (int j = 0; j < max_tile; ++j) {
                // Rows of very different scale: a tile must not mix up which scale belongs to which row.
                const float s = std::ldexp(1.0f, 3 * j - 9);
                const auto xf = test::random_floats(rng, static_cast<size_t>(n), -s, s);
                to_dot_x(*table, t, xf, x.data() + j * stride);
                ref_x.push_back(to_row(tx, xf));
            }
            for (int n_x = 1; n_x <= max_tile; ++n_x) {
                float out[cpu::kMaxQuantTile];
                table->dot(t)(w.data(), x.data(), stride, n_x, n, out);
                for (int j = 0; j < n_x; ++j) {
                    const void *xj = x.data() + j * stride;
                    const void *rj = ref_x[static_cast<size_t>(j)].data();
                    const double expected = ref::dot_weight_row(t, w.data(), rj, n);
                    const double tol = kDotRelTol * magnitude(t, w.data(), tx, rj, n) + 1e-30;
                    ASSERT_NEAR(out[j], expected, tol) << dtype_name(t) << " n=" << n << " n_x=" << n_x << " row " << j;
                    // The same bits as the row alone: the summation order does not depend on the tile.
                    float alone;
                    table->dot(t)(w.data(), xj, 0, 1, n, &alone);
                    ASSERT_EQ(out[j], alone) << dtype_name(t) << " n=" << n << " n_x=" << n_x << " row " << j;
                }
            }
        }
    }
}

TEST_P(IsaTest, DotRowsQ8_0MatchesDotTileBitForBitOnAwkwardShapes) {
    // The multi-row Q8_0 entry (DotRowsFn): every output must be the bits dot_q8_0 gives for that row and token
    // alone (matmul uses either, and batched runs rely on it), and near the double-precision reference. Awkward
    // shapes: row counts that fill no register block, odd and single-block rows, every tile size 1..8, tokens of
    // very different scale, rows and outputs with gaps after them (w_stride > row bytes, y_stride > n_rows).
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    const cpu::DotRowsFn dot_rows = table->dot_rows(DType::Q8_0);
    ASSERT_NE(dot_rows, nullptr);
    std::mt19937 rng(5);
    // 1027 blocks: longer than the AVX2 kernel's table of activation scales (1024 blocks), which it then
    // rebuilds per chunk and row; the same bits are expected.
    for (int64_t nb : {1, 2, 3, 5, 7, 24, 25, 64, 67, 1027}) {
        const int64_t n = nb * QK8_0;
        const int64_t row_bytes = dtype_row_size(DType::Q8_0, n);
        for (int64_t n_rows : {1, 2, 3, 5, 9, 17}) {
            if (nb > 100 && n_rows > 3) continue;  // keep the long rows quick
            const size_t w_stride = static_cast<size_t>(row_bytes + (n_rows % 2 == 0 ? 0 : 70));
            std::vector<uint8_t> w(w_stride * static_cast<size_t>(n_rows));
            for (int64_t r = 0; r < n_rows; ++r) {
                const auto wf = test::random_floats(rng, static_cast<size_t>(n), -2.0f, 2.0f);
                quantize_row(DType::Q8_0, wf.data(), w.data() + r * w_stride, n);
            }
            const size_t x_stride = static_cast<size_t>(cpu::q8_0_dot_x_row_bytes(n) + 34);
            std::vector<uint8_t> x(x_stride * cpu::kMaxQuantTile);
            std::vector<std::vector<uint8_t>> ref_x;
            for (int j = 0; j < cpu::kMaxQuantTile; ++j) {
                const float s = std::ldexp(1.0f, 3 * j - 9);
                const auto xf = test::random_floats(rng, static_cast<size_t>(n), -s, s);
                table->quantize_dot_x(DType::Q8_0, xf.data(), x.data() + j * x_stride, n);
                ref_x.push_back(to_row(DType::Q8_0, xf));
            }
            for (int n_x = 1; n_x <= cpu::kMaxQuantTile; ++n_x) {
                const size_t y_stride = static_cast<size_t>(n_rows + 3);
                std::vector<float> y(y_stride * static_cast<size_t>(n_x), NAN);
                dot_rows(w.data(), w_stride, n_rows, x.data(), x_stride, n_x, n, y.data(), y_stride);
                for (int64_t r = 0; r < n_rows; ++r) {
                    const uint8_t *wr = w.data() + r * w_stride;
                    float tile[cpu::kMaxQuantTile];
                    table->dot_q8_0(wr, x.data(), x_stride, n_x, n, tile);
                    for (int j = 0; j < n_x; ++j) {
                        const float got = y[static_cast<size_t>(j) * y_stride + static_cast<size_t>(r)];
                        const std::string where = "nb=" + std::to_string(nb) + " rows=" + std::to_string(n_rows) +
                                                  " n_x=" + std::to_string(n_x) + " row " + std::to_string(r) +
                                                  " token " + std::to_string(j);
                        ASSERT_EQ(got, tile[j]) << where;
                        float alone;  // the token by itself: the same bits at every tile size
                        table->dot_q8_0(wr, x.data() + j * x_stride, 0, 1, n, &alone);
                        ASSERT_EQ(got, alone) << where;
                        const void *rj = ref_x[static_cast<size_t>(j)].data();
                        const double expected = ref::dot_weight_row(DType::Q8_0, wr, rj, n);
                        ASSERT_NEAR(got, expected, kDotRelTol * magnitude(DType::Q8_0, wr, DType::Q8_0, rj, n) + 1e-30)
                            << where;
                    }
                    // The gap after each output row is left alone.
                    for (int j = 0; j < n_x; ++j) {
                        for (size_t g = static_cast<size_t>(n_rows); g < y_stride; ++g) {
                            ASSERT_TRUE(std::isnan(y[static_cast<size_t>(j) * y_stride + g]));
                        }
                    }
                }
            }
        }
    }
}

TEST_P(IsaTest, PackedRowsAreTheSameBitsOnEveryLevelAndTile) {
    // Rows packed eight to a record (BlockQ8_0x8, BlockQ4_0x8, BlockMXFP4x8, BlockQ2_Kx8 ... BlockQ6_Kx8,
    // BlockIQ4_XSx8): every level must give the scalar level's bits (the order dispatch.h defines), each token the same
    // bits alone as in any tile, and the result must be near the double-precision reference of the unpacked rows.
    // Awkward shapes: one block, odd block counts (Q4_0's activation records then end half empty; the K-quants' 9 and
    // 17 cross the kernels' stages of eight super-blocks), 8 to 56 rows, every tile size, tokens of very different
    // scale, outputs with gaps after them.
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    const KernelTable &scalar = *cpu::kernels_for(Isa::scalar);
    std::mt19937 rng(11);
    for (const DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                          DType::Q6_K, DType::IQ4_XS}) {
        const cpu::DotRowsFn dot = table->dot_rows8(t), dot_scalar = scalar.dot_rows8(t);
        ASSERT_NE(dot, nullptr);
        const bool k_quant = dtype_dots_q8_k(t);
        for (int64_t nb :
             k_quant ? std::vector<int64_t>{1, 2, 3, 8, 9, 17} : std::vector<int64_t>{1, 2, 3, 7, 24, 67, 130}) {
            const int64_t n = nb * dtype_info(t).block_size;
            const int64_t row_bytes = dtype_row_size(t, n);
            // 32-row passes for two to five tokens (avx512vnni), then 16 rows, then a last 8.
            for (int64_t n_rows : {8, 16, 24, 32, 48, 56}) {
                if (n > 3200 && n_rows > 16) continue;  // keep the long rows quick
                std::vector<uint8_t> rows(static_cast<size_t>(row_bytes * n_rows)), packed(rows.size());
                for (int64_t r = 0; r < n_rows; ++r) {
                    const auto wf = test::random_floats(rng, static_cast<size_t>(n), -2.0f, 2.0f);
                    quantize_row(t, wf.data(), rows.data() + r * row_bytes, n);
                }
                if (t == DType::MXFP4) {  // row 1 every element +6 (u = 24, the widest), row 2 the smallest exponents
                    auto *blk = reinterpret_cast<BlockMXFP4 *>(rows.data() + row_bytes);
                    for (int64_t b = 0; b < nb; ++b) std::memset(blk[b].qs, 0x77, sizeof blk[b].qs);
                    blk = reinterpret_cast<BlockMXFP4 *>(rows.data() + 2 * row_bytes);
                    for (int64_t b = 0; b < nb; ++b) blk[b].e = static_cast<uint8_t>(b % 3);
                } else if (t ==
                           DType::Q4_K) {  // row 1 at the ends of the ranges: every nibble 15, every scale and min 63
                    auto *blk = reinterpret_cast<BlockQ4_K *>(rows.data() + row_bytes);
                    for (int64_t b = 0; b < nb; ++b) {
                        std::memset(blk[b].qs, 0xff, sizeof blk[b].qs);
                        std::memset(blk[b].scales, 0xff, sizeof blk[b].scales);
                    }
                } else if (t == DType::Q2_K) {  // every element 3, every scale and min 15
                    auto *blk = reinterpret_cast<BlockQ2_K *>(rows.data() + row_bytes);
                    for (int64_t b = 0; b < nb; ++b) {
                        std::memset(blk[b].qs, 0xff, sizeof blk[b].qs);
                        std::memset(blk[b].scales, 0xff, sizeof blk[b].scales);
                    }
                } else if (t == DType::Q3_K) {  // every element 7 (+3 after the offset), every scale 31
                    auto *blk = reinterpret_cast<BlockQ3_K *>(rows.data() + row_bytes);
                    for (int64_t b = 0; b < nb; ++b) {
                        std::memset(blk[b].qs, 0xff, sizeof blk[b].qs);
                        std::memset(blk[b].hmask, 0xff, sizeof blk[b].hmask);
                        std::memset(blk[b].scales, 0xff, sizeof blk[b].scales);
                    }
                } else if (t == DType::Q6_K) {  // every element 63 (+31 after the offset), scales -128 and 127
                    auto *blk = reinterpret_cast<BlockQ6_K *>(rows.data() + row_bytes);
                    for (int64_t b = 0; b < nb; ++b) {
                        std::memset(blk[b].ql, 0xff, sizeof blk[b].ql);
                        std::memset(blk[b].qh, 0xff, sizeof blk[b].qh);
                        for (int sb = 0; sb < 16; ++sb) blk[b].scales[sb] = static_cast<int8_t>(sb % 2 ? 127 : -128);
                    }
                } else if (t == DType::IQ4_XS) {  // every element the book's -127, every sub-block scale -32
                    auto *blk = reinterpret_cast<BlockIQ4_XS *>(rows.data() + row_bytes);
                    for (int64_t b = 0; b < nb; ++b) {
                        std::memset(blk[b].qs, 0, sizeof blk[b].qs);
                        std::memset(blk[b].scales_l, 0, sizeof blk[b].scales_l);
                        blk[b].scales_h = 0;
                    }
                } else if (t == DType::Q5_K) {  // and every element 31
                    auto *blk = reinterpret_cast<BlockQ5_K *>(rows.data() + row_bytes);
                    for (int64_t b = 0; b < nb; ++b) {
                        std::memset(blk[b].qs, 0xff, sizeof blk[b].qs);
                        std::memset(blk[b].qh, 0xff, sizeof blk[b].qh);
                        std::memset(blk[b].scales, 0xff, sizeof blk[b].scales);
                    }
                }
                pack_rows8(t, rows.data(), n_rows, n, packed.data());
                const size_t x_stride = static_cast<size_t>(KernelTable::dot_x_row_bytes(t, n) + 36);
                std::vector<uint8_t> x(x_stride * cpu::kMaxQuantTile);
                std::vector<std::vector<uint8_t>> ref_x;
                for (int j = 0; j < cpu::kMaxQuantTile; ++j) {
                    const float s = std::ldexp(1.0f, 3 * j - 9);
                    auto xf = test::random_floats(rng, static_cast<size_t>(n), -s, s);
                    // Token 2 all one value: every Q8_K quant -127, so row 1's int16 sums reach their largest.
                    if (k_quant && j == 2) std::fill(xf.begin(), xf.end(), s);
                    table->quantize_dot_x(t, xf.data(), x.data() + j * x_stride, n);
                    ref_x.push_back(to_row(dot_type(t), xf));
                }
                const size_t y_stride = static_cast<size_t>(n_rows + 3);
                std::vector<float> alone(y_stride * cpu::kMaxQuantTile, NAN);
                for (int j = 0; j < cpu::kMaxQuantTile; ++j) {
                    dot(packed.data(), static_cast<size_t>(row_bytes), n_rows, x.data() + j * x_stride, 0, 1, n,
                        alone.data() + j * y_stride, y_stride);
                }
                for (int n_x = 1; n_x <= cpu::kMaxQuantTile; ++n_x) {
                    std::vector<float> y(y_stride * static_cast<size_t>(n_x), NAN), ys(y.size(), NAN);
                    dot(packed.data(), static_cast<size_t>(row_bytes), n_rows, x.data(), x_stride, n_x, n, y.data(),
                        y_stride);
                    dot_scalar(packed.data(), static_cast<size_t>(row_bytes), n_rows, x.data(), x_stride, n_x, n,
                               ys.data(), y_stride);
                    for (int j = 0; j < n_x; ++j) {
                        for (int64_t r = 0; r < n_rows; ++r) {
                            const size_t at = static_cast<size_t>(j) * y_stride + static_cast<size_t>(r);
                            const std::string where = std::string(dtype_name(t)) + " nb=" + std::to_string(nb) +
                                                      " rows=" + std::to_string(n_rows) +
                                                      " n_x=" + std::to_string(n_x) + " row " + std::to_string(r) +
                                                      " token " + std::to_string(j);
                            ASSERT_EQ(y[at], ys[at]) << where;
                            ASSERT_EQ(y[at], alone[at]) << where;
                            const uint8_t *wr = rows.data() + r * row_bytes;
                            const void *rj = ref_x[static_cast<size_t>(j)].data();
                            const double expected = ref::dot_weight_row(t, wr, rj, n);
                            ASSERT_NEAR(y[at], expected, kDotRelTol * magnitude(t, wr, dot_type(t), rj, n) + 1e-30)
                                << where;
                        }
                        for (size_t g = static_cast<size_t>(n_rows); g < y_stride; ++g)
                            ASSERT_TRUE(std::isnan(y[static_cast<size_t>(j) * y_stride + g]));
                    }
                }
            }
        }
    }
}

TEST_P(IsaTest, DotQuantExtremesStayExact) {
    // Every weight and activation at the ends of their ranges: -127/127 activations with -8/7 (Q4_0) or
    // -127/127 (Q8_0) weights, where the maddubs sign trick would saturate if it were wrong. The integer
    // sums are exact, so only the final f32 scaling rounds.
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    const int64_t n = 256;
    std::vector<float> wf(n), xf(n);
    for (int64_t i = 0; i < n; ++i) {
        wf[i] = (i % 3 == 0) ? -8.0f : (i % 3 == 1 ? 7.0f : -7.0f);
        xf[i] = (i % 2 == 0) ? 127.0f : -127.0f;
        if (i % 32 == 5) xf[i] = 127.0f;  // the block's max is positive
    }
    for (DType t : {DType::Q8_0, DType::Q4_0}) {
        const auto w = to_row(t, wf);
        std::vector<uint8_t> xq(static_cast<size_t>(x_row_bytes(t, n)));
        to_dot_x(*table, t, xf, xq.data());
        const auto rq = to_row(DType::Q8_0, xf);
        float out;
        table->dot(t)(w.data(), xq.data(), 0, 1, n, &out);
        const double expected = ref::dot_weight_row(t, w.data(), rq.data(), n);
        EXPECT_NEAR(out, expected, 1e-6 * magnitude(t, w.data(), DType::Q8_0, rq.data(), n)) << dtype_name(t);
    }
}

// Blocks of 32 floats that test a Q8_0 quantiser's rounding: random blocks at scales from subnormal-half to large,
// an all-zero block, blocks where x * id lands exactly on (or one ulp beside) a half, which must round away from
// zero like std::round, and non-finite cases: blocks whose d is subnormal and whose id = 1 / d overflows to inf
// (scales 1e-38, 2e-37), NaNs before, after and at the block's largest value, an all-NaN block and infinities.
std::vector<float> awkward_q8_0_blocks(unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<float> x;
    for (float s : {1.0f, 1e-3f, 3e-6f, 1e-8f, 50.0f, 6e4f, 1e-38f, 2e-37f}) {
        for (float v : test::random_floats(rng, 64, -s, s)) x.push_back(v);
    }
    for (int j = 0; j < 32; ++j) x.push_back(0.0f);
    for (int j = 0; j < 32; ++j) {
        // amax = 127 gives d = 1 and id = 1: values are used as they are.
        const float v = j == 0 ? 127.0f : float(j % 8) - 3.5f;
        x.push_back(j % 2 ? -v : v);
    }
    for (int j = 0; j < 32; ++j) {
        const float v = j == 0 ? 127.0f : std::nextafter(float(j % 5) + 0.5f, j % 2 ? 0.0f : 100.0f);
        x.push_back(j % 3 ? -v : v);
    }
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (int nan_at : {0, 5, 16, 17, 31}) {  // the block's largest value (9.0) sits at 16
        for (int j = 0; j < 32; ++j) x.push_back(j == nan_at ? nan : (j == 16 ? 9.0f : float(j % 7) - 3.0f));
    }
    for (int j = 0; j < 32; ++j) x.push_back(nan);
    for (int j = 0; j < 32; ++j) x.push_back(j == 3 ? inf : (j == 20 ? -inf : (j == 9 ? nan : float(j))));
    return x;
}

TEST_P(IsaTest, QuantizeRowQ8_0IsBitExact) {
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    const std::vector<float> x = awkward_q8_0_blocks(5);
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<BlockQ8_0> expected(static_cast<size_t>(n / QK8_0)), got(expected.size());
    ref::quantize_row_q8_0(x.data(), expected.data(), n);
    table->quantize_row_q8_0(x.data(), got.data(), n);
    for (size_t b = 0; b < expected.size(); ++b) {
        ASSERT_EQ(got[b].d, expected[b].d) << "block " << b;
        for (int j = 0; j < QK8_0; ++j) ASSERT_EQ(got[b].qs[j], expected[b].qs[j]) << "block " << b << " element " << j;
    }
}

TEST_P(IsaTest, QuantizeDotXWritesQ8_0AndForQ4_0PairedRecords) {
    // Q8_0 weights get the plain Q8_0 row; Q4_0 weights the same blocks in BlockQ8_0x2 records (core/blocks.h):
    // low / high halves of two blocks side by side, 2 * sum per lane, f32 scales; an odd last block paired with
    // zeros. Written 2 bytes off a 4-byte boundary on purpose: Q8_0 rows only need the 2-byte alignment of
    // BlockQ8_0, and the Q4_0 writer must not assume the records' 4-byte alignment.
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    std::mt19937 rng(9);
    for (int64_t n : {32, 64, 96, 256, 4128}) {
        auto x = test::random_floats(rng, static_cast<size_t>(n), -3.0f, 3.0f);
        x[1] = 0.0f;
        for (int k = 0; k < QK8_0; ++k) x[static_cast<size_t>(n - QK8_0 + k)] = -127.0f;  // sum -4064
        const int64_t nb = n / QK8_0;
        std::vector<BlockQ8_0> expected(static_cast<size_t>(nb));
        ref::quantize_row_q8_0(x.data(), expected.data(), n);
        ASSERT_EQ(KernelTable::dot_x_row_bytes(DType::Q8_0, n), nb * (34 + 4 + 4));
        ASSERT_EQ(KernelTable::dot_x_row_bytes(DType::Q4_0, n), (nb + 1) / 2 * 104);
        for (DType t : {DType::Q8_0, DType::Q4_0}) {
            std::vector<uint8_t> y(static_cast<size_t>(KernelTable::dot_x_row_bytes(t, n)) + 2, 0xAB);
            table->quantize_dot_x(t, x.data(), y.data() + 2, n);
            const uint8_t *p = y.data() + 2;
            if (t == DType::Q8_0) {
                // The blocks, then each block's scale as f32, then 128 x each block's sum as int32 (unaligned;
                // the last block, all -127, checks the extreme sum).
                ASSERT_EQ(std::memcmp(p, expected.data(), static_cast<size_t>(nb) * 34), 0);
                for (int64_t b = 0; b < nb; ++b) {
                    float d;
                    std::memcpy(&d, p + nb * 34 + 4 * b, sizeof d);
                    ASSERT_EQ(d, fp16_to_f32(expected[static_cast<size_t>(b)].d)) << "block " << b;
                    int32_t offset, sum = 0;
                    std::memcpy(&offset, p + nb * 38 + 4 * b, sizeof offset);
                    for (const int8_t v : expected[static_cast<size_t>(b)].qs) sum += v;
                    ASSERT_EQ(offset, 128 * sum) << "block " << b;
                }
                continue;
            }
            for (int64_t b = 0; b < (nb + 1) / 2 * 2; ++b) {
                BlockQ8_0x2 r;
                std::memcpy(&r, p + b / 2 * 104, sizeof r);
                const int h = static_cast<int>(b % 2);
                const bool real = b < nb;  // else the zero block paired with an odd last one
                int32_t sum = 0;
                for (int k = 0; k < QK8_0; ++k) {
                    const int8_t want = real ? expected[b].qs[k] : 0;
                    const int8_t got = k < 16 ? r.lo[16 * h + k] : r.hi[16 * h + k - 16];
                    ASSERT_EQ(got, want) << "n " << n << " block " << b << " element " << k;
                    sum += want;
                }
                EXPECT_EQ(r.d[h], real ? fp16_to_f32(expected[b].d) : 0.0f) << "block " << b;
                for (int l = 0; l < 4; ++l) EXPECT_EQ(r.sums[4 * h + l], 2 * sum) << "block " << b;
            }
        }
    }
    // K-quant weights get Q8_K blocks (one scale per 256, the largest magnitude at -127, the sums of each 16),
    // from the same quantiser as the references, written unaligned.
    for (int64_t n : {256, 768}) {
        auto x = test::random_floats(rng, static_cast<size_t>(n), -3.0f, 3.0f);
        x[5] = 7.5f;  // the largest magnitude of the first block: its quant is -127
        std::vector<uint8_t> want(static_cast<size_t>(dtype_row_size(DType::Q8_K, n)));
        quantize_row(DType::Q8_K, x.data(), want.data(), n);
        ASSERT_EQ(KernelTable::dot_x_row_bytes(DType::Q4_K, n), static_cast<int64_t>(want.size()));
        std::vector<uint8_t> y(want.size() + 1);
        table->quantize_dot_x(DType::Q4_K, x.data(), y.data() + 1, n);
        ASSERT_EQ(std::memcmp(y.data() + 1, want.data(), want.size()), 0);
        BlockQ8_K b;
        std::memcpy(&b, want.data(), sizeof b);
        EXPECT_EQ(b.qs[5], -127);
        EXPECT_FLOAT_EQ(b.d, 7.5f / -127.0f);
        for (int k = 0; k < 16; ++k) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += b.qs[16 * k + j];
            EXPECT_EQ(b.bsums[k], sum);
        }
    }
    std::vector<float> x(64);
    std::vector<uint8_t> y(256);
    EXPECT_THROW(table->quantize_dot_x(DType::Q4_K, x.data(), y.data(), 64), Error);  // not whole super-blocks
    EXPECT_THROW(table->quantize_dot_x(DType::F16, x.data(), y.data(), 64), Error);
    EXPECT_THROW(table->quantize_dot_x(DType::Q4_0, x.data(), y.data(), 48), Error);
    EXPECT_THROW(KernelTable::dot_x_row_bytes(DType::F32, 64), Error);
}

TEST_P(IsaTest, QuantizeDotXIsTheScalarLevelsBytesAtEveryLength) {
    // The AVX-512 level writes Q8_0 dot-x rows sixteen blocks at a time (the last n / 32 % 16 as a partial group):
    // every length from 1 to 40 blocks, and the bench preset's widths, against the scalar level's bytes, with the
    // awkward blocks (scales from 1e-8 to 6e4, zero blocks, exact and near halves, the extreme sum) placed at
    // different blocks of the row.
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    const KernelTable *scalar = cpu::kernels_for(Isa::scalar);
    std::vector<float> pool = awkward_q8_0_blocks(11);
    for (int j = 0; j < 32; ++j) pool.push_back(-127.0f);  // the extreme sum
    const int64_t pool_blocks = static_cast<int64_t>(pool.size()) / QK8_0;
    std::vector<int64_t> block_counts;
    for (int64_t nb = 1; nb <= 40; ++nb) block_counts.push_back(nb);
    for (int64_t nb : {48, 64, 129, 192}) block_counts.push_back(nb);  // 1536, 2048, 4128, 6144 wide
    for (const int64_t nb : block_counts) {
        const int64_t n = nb * QK8_0;
        std::vector<float> x(static_cast<size_t>(n));
        for (int64_t b = 0; b < nb; ++b) {  // the pool's blocks in a rotated order, so each lands at many positions
            const int64_t from = (b + nb) % pool_blocks;
            std::copy_n(pool.begin() + from * QK8_0, QK8_0, x.begin() + b * QK8_0);
        }
        for (DType t : {DType::Q8_0, DType::Q4_0}) {  // Q4_0's records are built from the same quantisation
            const auto bytes = static_cast<size_t>(KernelTable::dot_x_row_bytes(t, n));
            std::vector<uint8_t> want(bytes + 3, 0xCD), got(bytes + 3, 0xCD);  // 1 byte off alignment, 2 past the end
            scalar->quantize_dot_x(t, x.data(), want.data() + 1, n);
            table->quantize_dot_x(t, x.data(), got.data() + 1, n);
            for (size_t i = 0; i < want.size(); ++i) {
                ASSERT_EQ(got[i], want[i]) << dtype_name(t) << " nb " << nb << " byte " << i;
            }
        }
    }
}

TEST_P(IsaTest, AxpyMatchesReference) {
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    std::mt19937 rng(3);
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
        for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 96, 100, 576, 4097}) {
            const auto row = to_row(t, test::random_floats(rng, static_cast<size_t>(n), -3.0f, 3.0f));
            const auto y0 = test::random_floats(rng, static_cast<size_t>(n));
            const float a = 0.7f;
            auto y = y0, y_ref = y0;
            table->axpy(t)(row.data(), a, y.data(), n);
            ref::axpy_row(t, row.data(), a, y_ref.data(), n);
            const auto r = to_floats(t, row.data(), n);
            for (int64_t i = 0; i < n; ++i) {
                // One rounding (FMA) or two (multiply, add) of terms of this size.
                const double tol = 2.5e-7 * (std::fabs(y0[i]) + std::fabs(a * r[i])) + 1e-30;
                ASSERT_NEAR(y[i], y_ref[i], tol) << dtype_name(t) << " n=" << n << " i=" << i;
            }
        }
    }
}

TEST_P(IsaTest, FromF32F16RoundsToNearestEvenAsTheScalarConversion) {
    // Every level's f32 -> fp16 gives the bits of core/dtype.h's f32_to_fp16 (round to nearest even): random
    // values at every scale, the halfway points between fp16 neighbours and one ulp beside them, subnormals, the
    // largest finite value and the first that overflows, infinities, signed zeros; NaN stays NaN. Lengths around
    // the 8-lane vectors (tails).
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    std::mt19937 rng(17);
    std::vector<float> x;
    for (float s : {1.0f, 1e-3f, 3e-6f, 6e-8f, 1e-9f, 300.0f, 6.5e4f, 1e6f}) {
        for (float v : test::random_floats(rng, 40, -s, s)) x.push_back(v);
    }
    for (uint32_t h : {0x0001u, 0x03ffu, 0x0400u, 0x3c00u, 0x3c01u, 0x7bfeu, 0x7bffu}) {
        const float a = fp16_to_f32(uint16_t(h)), b = fp16_to_f32(uint16_t(h + 1));
        const float mid = a + (b - a) / 2;  // exact in f32
        for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
            x.push_back(v);
            x.push_back(-v);
        }
    }
    for (float v : {0.0f, -0.0f, 65504.0f, 65520.0f, 65519.996f, INFINITY, -INFINITY, 1e-30f, -5.9604645e-8f})
        x.push_back(v);
    const float nan = std::nanf("");
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(8), int64_t(9), static_cast<int64_t>(x.size())}) {
        std::vector<uint16_t> got(static_cast<size_t>(n) + 1, 0xabcd);
        table->from_f32_f16(x.data(), got.data(), n);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], f32_to_fp16(x[i])) << "x = " << x[i] << " at " << i;
        ASSERT_EQ(got[static_cast<size_t>(n)], 0xabcd) << "written past n = " << n;
    }
    uint16_t h = 0;
    table->from_f32_f16(&nan, &h, 1);
    EXPECT_TRUE(std::isnan(fp16_to_f32(h)));
}

TEST_P(IsaTest, SwigluIsNearTheScalarFormulaAndIndependentOfPosition) {
    // silu(g) * u within 4 ulp of the scalar level's std::exp formula over gates from -100 to 100 (both exp
    // tails); NaN propagates. An element's result is the same bits whatever n and its position (tails run the
    // vector code), so a token's activations do not depend on the batch around it; out may alias gate.
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    const KernelTable &scalar = *cpu::kernels_for(Isa::scalar);
    std::mt19937 rng(23);
    std::vector<float> gate, up;
    for (float s : {0.01f, 1.0f, 8.0f, 30.0f, 100.0f}) {
        for (float v : test::random_floats(rng, 37, -s, s)) gate.push_back(v);
    }
    gate.push_back(0.0f);
    gate.push_back(-88.0f);
    gate.push_back(88.0f);
    up = test::random_floats(rng, gate.size(), -3.0f, 3.0f);
    const auto n = static_cast<int64_t>(gate.size());
    std::vector<float> got(gate.size()), want(gate.size());
    table->swiglu(gate.data(), up.data(), got.data(), n);
    scalar.swiglu(gate.data(), up.data(), want.data(), n);
    for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], want[i], 4 * std::numeric_limits<float>::epsilon() * std::fabs(want[i]) + 1e-35f)
            << "gate " << gate[i] << ", up " << up[i];
    }
    for (int64_t start : {1, 5, 13}) {
        for (int64_t len : {1, 3, 8, 15, 16, 17, 31}) {
            std::vector<float> part(static_cast<size_t>(len));
            table->swiglu(gate.data() + start, up.data() + start, part.data(), len);
            ASSERT_EQ(std::memcmp(part.data(), got.data() + start, part.size() * sizeof(float)), 0)
                << "start " << start << ", n " << len;
        }
    }
    std::vector<float> in_place = gate;
    table->swiglu(in_place.data(), up.data(), in_place.data(), n);
    ASSERT_EQ(std::memcmp(in_place.data(), got.data(), got.size() * sizeof(float)), 0);
    const float nan = std::nanf(""), one = 1.0f;
    float out = 0.0f;
    table->swiglu(&nan, &one, &out, 1);
    EXPECT_TRUE(std::isnan(out));
}

TEST_P(IsaTest, RmsNormRowMatchesTheScalarLevel) {
    // Each level's row within 2 ulp of the scalar level's (only the double sum's order differs), with and without
    // weights, in place, at lengths around the vectors and the model widths; rows of large and tiny values.
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    const KernelTable &scalar = *cpu::kernels_for(Isa::scalar);
    std::mt19937 rng(29);
    for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 128, 511, 512, 2048, 2049}) {
        for (float s : {1.0f, 3e4f, 1e-3f}) {
            const auto x = test::random_floats(rng, static_cast<size_t>(n), -s, s);
            const auto w = test::random_floats(rng, static_cast<size_t>(n), -2.0f, 2.0f);
            for (const float *wp : {w.data(), static_cast<const float *>(nullptr)}) {
                std::vector<float> got(x.size()), want(x.size());
                table->rms_norm_row(x.data(), wp, got.data(), n, 1e-6f);
                scalar.rms_norm_row(x.data(), wp, want.data(), n, 1e-6f);
                for (int64_t i = 0; i < n; ++i) {
                    ASSERT_NEAR(got[i], want[i], 2 * std::numeric_limits<float>::epsilon() * std::fabs(want[i]))
                        << "n " << n << ", scale " << s << (wp ? "" : ", no weights") << ", element " << i;
                }
                std::vector<float> in_place = x;
                table->rms_norm_row(in_place.data(), wp, in_place.data(), n, 1e-6f);
                ASSERT_EQ(std::memcmp(in_place.data(), got.data(), got.size() * sizeof(float)), 0)
                    << "in place, n " << n;
            }
        }
    }
}

TEST_P(IsaTest, HadamardRowGivesTheScalarLevelsBits) {
    // Every power of two from 1 (narrower than a vector: the padded and masked paths) to 4096, rows of large and
    // tiny values with signed zeros among them, rows starting off a vector's alignment: the scalar level's bits.
    const KernelTable *table = cpu::kernels_for(GetParam());
    if (!table) GTEST_SKIP() << skip_message(GetParam());
    const KernelTable &scalar = *cpu::kernels_for(Isa::scalar);
    std::mt19937 rng(31);
    for (int64_t n = 1; n <= 4096; n *= 2) {
        for (float s : {1.0f, 3e4f, 1e-30f}) {
            auto x = test::random_floats(rng, static_cast<size_t>(n) + 3, -s, s);
            x[1] = -0.0f;
            x[2] = 0.0f;
            if (n >= 4) x[3 + n / 2] = -0.0f;
            const float norm = static_cast<float>(1.0 / std::sqrt(double(n)));
            for (size_t offset : {size_t{0}, size_t{1}, size_t{3}}) {
                std::vector<float> got(x.begin() + static_cast<std::ptrdiff_t>(offset), x.end());
                std::vector<float> want = got;
                table->hadamard_row(got.data(), n, norm);
                scalar.hadamard_row(want.data(), n, norm);
                ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                    << "n " << n << ", scale " << s << ", offset " << offset << " (and nothing past n written)";
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Levels, IsaTest, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512), isa_param_name);

// --- matmul
// ---------------------------------------------------------------------------------------------------

struct MatmulShape {
    int64_t n_rows, n_cols, n_tokens;
};

// Owns a random weight matrix of type t and its float copy (for the error scale).
struct TestMatrix {
    std::vector<uint8_t> bytes;
    std::vector<float> values;  // dequantised: what the kernels multiply by
    WeightMatrix w;

    TestMatrix(std::mt19937 &rng, DType t, int64_t n_rows, int64_t n_cols) {
        const int64_t row_bytes = dtype_row_size(t, n_cols);
        bytes.resize(static_cast<size_t>(row_bytes * n_rows));
        values.resize(static_cast<size_t>(n_rows * n_cols));
        for (int64_t r = 0; r < n_rows; ++r) {
            const auto x = test::random_floats(rng, static_cast<size_t>(n_cols), -1.0f, 1.0f);
            quantize_row(t, x.data(), bytes.data() + r * row_bytes, n_cols);
            dequantize_row(t, bytes.data() + r * row_bytes, values.data() + r * n_cols, n_cols);
        }
        w = WeightMatrix{t, bytes.data(), n_rows, n_cols, row_bytes};
    }
};

// y (from matmul) against ref::matmul, each element within kDotRelTol of its own magnitude.
void expect_matmul_matches_reference(const TestMatrix &m, const std::vector<float> &x, int64_t n_tokens,
                                     const std::vector<float> &y, const std::string &what) {
    const WeightMatrix &w = m.w;
    std::vector<float> y_ref(static_cast<size_t>(n_tokens * w.n_rows));
    ref::matmul(w, x.data(), n_tokens, y_ref.data());
    const DType tx = dot_type(w.type);
    std::vector<uint8_t> xd(static_cast<size_t>(dtype_row_size(tx, w.n_cols)));
    std::vector<float> xf;
    for (int64_t t = 0; t < n_tokens; ++t) {
        quantize_row(tx, x.data() + t * w.n_cols, xd.data(), w.n_cols);
        xf = to_floats(tx, xd.data(), w.n_cols);
        for (int64_t r = 0; r < w.n_rows; ++r) {
            double mag = 0.0;
            for (int64_t c = 0; c < w.n_cols; ++c) mag += std::fabs(double(m.values[r * w.n_cols + c]) * xf[c]);
            const size_t i = static_cast<size_t>(t * w.n_rows + r);
            ASSERT_NEAR(y[i], y_ref[i], kDotRelTol * mag + 1e-30) << what << " token " << t << " row " << r;
        }
    }
}

TEST(Matmul, MatchesReferenceForEveryTypeAndShape) {
    const std::vector<MatmulShape> shapes = {
        {1, 32, 1},     {1, 32, 3},    {7, 32, 17},   {31, 32, 5},    {1, 96, 1},     {7, 96, 4},     {31, 96, 3},
        {64, 96, 8},    {33, 96, 17},  {1, 4128, 1},  {7, 4128, 3},   {31, 4128, 2},  {4097, 32, 1},  {4097, 96, 3},
        {4097, 32, 17}, {128, 256, 9}, {300, 512, 1}, {257, 1024, 6}, {513, 4128, 1}, {1000, 64, 13}, {2, 4096, 7},
        {96, 160, 16},  {5, 768, 1},   {37, 768, 9},  {130, 2048, 3},
    };
    std::mt19937 rng(21);
    for (int n_threads : {1, 2, 3}) {
        ThreadPool pool(n_threads);
        OpScratch scratch;  // reused across shapes and types, as a context would
        for (DType t : kWeightTypes) {
            for (const MatmulShape &s : shapes) {
                // Keep the run short: the biggest shapes once per type, on the two-thread pool.
                if (s.n_rows * s.n_cols * s.n_tokens > 400000 && n_threads != 2) continue;
                if (s.n_cols % dtype_info(t).block_size != 0) continue;  // K-quants: rows of whole super-blocks
                const TestMatrix m(rng, t, s.n_rows, s.n_cols);
                const auto x = test::random_floats(rng, static_cast<size_t>(s.n_tokens * s.n_cols), -2.0f, 2.0f);
                std::vector<float> y(static_cast<size_t>(s.n_tokens * s.n_rows), NAN);
                matmul(pool, scratch, m.w, x.data(), s.n_tokens, y.data());
                expect_matmul_matches_reference(m, x, s.n_tokens, y,
                                                std::string(dtype_name(t)) + " [" + std::to_string(s.n_rows) + ", " +
                                                    std::to_string(s.n_cols) + "] x " + std::to_string(s.n_tokens) +
                                                    " tokens, " + std::to_string(n_threads) + " threads");
                if (HasFatalFailure()) return;
            }
        }
    }
}

TEST(Matmul, ResultDoesNotDependOnThreadCountOrTiling) {
    // Every output is computed by one dot_tile call whatever the split, so thread counts agree bit for bit;
    // and the kernels sum in the same order at every tile size, so a token alone gets the bits it gets in a
    // batch (what makes "N sequences in one batch = each alone" testable exactly).
    std::mt19937 rng(8);
    for (DType t : kWeightTypes) {
        const TestMatrix m(rng, t, 203, 512);
        const int64_t n_tokens = 11;
        const auto x = test::random_floats(rng, static_cast<size_t>(n_tokens * 512));
        std::vector<float> y1(static_cast<size_t>(n_tokens * 203)), y4(y1.size()), y_single(y1.size());
        ThreadPool one(1), four(4);
        OpScratch scratch;
        matmul(one, scratch, m.w, x.data(), n_tokens, y1.data());
        matmul(four, scratch, m.w, x.data(), n_tokens, y4.data());
        for (int64_t tok = 0; tok < n_tokens; ++tok) {
            matmul(four, scratch, m.w, x.data() + tok * 512, 1, y_single.data() + tok * 203);
        }
        EXPECT_EQ(y1, y4) << dtype_name(t);
        EXPECT_EQ(y1, y_single) << dtype_name(t);
    }
}

TEST(Matmul, PackedRowsMatchTheFileRowsAndAreTheSameAtEveryTileAndThreadCount) {
    // Q8_0, Q4_0, MXFP4, K-quant (Q2_K ... Q6_K) and IQ4_XS rows packed eight to a record (WeightMatrix::rows8), as the
    // loader packs them: near the reference of the rows as stored; each token's outputs the same bits alone as in a
    // batch of any size, on 1-3 threads; matmul_many's the bits of matmul. Shapes: a single group, row counts that
    // leave partial chunks, long rows, a vocabulary-sized matrix; token counts across the 8-token tile.
    struct Shape {
        int64_t n_rows, n_cols;
    };
    std::mt19937 rng(41);
    for (const DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                          DType::Q6_K, DType::IQ4_XS})
        for (const Shape &sh : {Shape{8, 32}, Shape{24, 96}, Shape{136, 1024}, Shape{1024, 1024}, Shape{8000, 256},
                                Shape{128, 2048}, Shape{256, 2048}, Shape{512, 4096}, Shape{40, 2304}}) {
            if (sh.n_cols % dtype_info(t).block_size != 0) continue;
            // The big shapes once for the K-quants (Q4_K): their kernels share the chunking and tiling code.
            if (dtype_dots_q8_k(t) && t != DType::Q4_K && sh.n_rows * sh.n_cols > 300000) continue;
            TestMatrix m(rng, t, sh.n_rows, sh.n_cols);
            std::vector<uint8_t> packed(m.bytes.size());
            pack_rows8(t, m.bytes.data(), sh.n_rows, sh.n_cols, packed.data());
            WeightMatrix pw = m.w;
            pw.data = packed.data();
            pw.rows8 = true;
            // Unpacking gives the file's rows back.
            std::vector<uint8_t> row(static_cast<size_t>(m.w.row_bytes));
            for (int64_t r = 0; r < sh.n_rows; r += 7) {
                unpack_row8(t, packed.data(), r, sh.n_cols, row.data());
                ASSERT_EQ(std::memcmp(row.data(), m.w.row(r), static_cast<size_t>(m.w.row_bytes)), 0) << "row " << r;
            }
            for (int64_t n_tokens : {1, 5, 8, 13, 40}) {
                if (sh.n_rows * sh.n_cols * n_tokens > 20000000) continue;
                const auto x = test::random_floats(rng, static_cast<size_t>(n_tokens * sh.n_cols), -2.0f, 2.0f);
                std::vector<float> y1(static_cast<size_t>(n_tokens * sh.n_rows), NAN), y3(y1.size(), NAN);
                std::vector<float> alone(y1.size(), NAN), many(y1.size(), NAN);
                ThreadPool one(1), three(3);
                OpScratch scratch;
                matmul(one, scratch, pw, x.data(), n_tokens, y1.data());
                matmul(three, scratch, pw, x.data(), n_tokens, y3.data());
                for (int64_t tok = 0; tok < n_tokens; ++tok)
                    matmul(three, scratch, pw, x.data() + tok * sh.n_cols, 1, alone.data() + tok * sh.n_rows);
                const MatmulTask task{&pw, x.data(), n_tokens, many.data()};
                matmul_many(three, scratch, &task, 1);
                const std::string what = std::string(dtype_name(t)) + " [" + std::to_string(sh.n_rows) + ", " +
                                         std::to_string(sh.n_cols) + "] x " + std::to_string(n_tokens);
                EXPECT_EQ(y1, y3) << what;
                EXPECT_EQ(y1, alone) << what;
                EXPECT_EQ(y1, many) << what;
                expect_matmul_matches_reference(m, x, n_tokens, y1, "packed " + what);
                if (HasFailure()) return;
            }
        }
}

TEST(Matmul, ManyEqualsSeparateCallsBitForBit) {
    // matmul_many's outputs are the bits of one matmul per task, whatever the mix: weight types of every
    // activation format in one set, tasks sharing activations (quantised once) and not, 0 tokens, big and tiny
    // products, 1-3 threads.
    std::mt19937 rng(31);
    struct Spec {
        DType type;
        int64_t n_rows, n_cols, n_tokens;
        int x_index;  // tasks with the same index and width read the same activations
    };
    const std::vector<Spec> specs = {
        {DType::Q8_0, 768, 256, 3, 0},
        {DType::Q8_0, 700, 256, 3, 0},
        {DType::Q4_0, 65, 256, 3, 0},
        {DType::Q8_0, 33, 96, 1, 1},
        {DType::F16, 129, 96, 1, 1},
        {DType::F32, 40, 96, 9, 2},
        {DType::BF16, 7, 96, 9, 2},
        {DType::Q8_0, 300, 96, 17, 3},
        {DType::Q8_0, 5, 96, 0, 4},
        {DType::Q4_0, 1000, 512, 2, 5},
        // K-quants (Q8_K activations) and the 32-element types beside Q8_0 / Q4_0 on the same activations, as a
        // K-quant file's MoE layer mixes them (Q4_K gate and up, Q6_K down, a Q5_0 fallback).
        {DType::Q4_K, 768, 256, 3, 0},
        {DType::Q6_K, 70, 256, 3, 0},
        {DType::Q5_0, 33, 96, 1, 1},
        {DType::IQ4_NL, 9, 96, 1, 1},
        {DType::MXFP4, 24, 256, 3, 0},  // llama.cpp's MXFP4_MOE: the experts beside Q8_0 matrices
        {DType::Q4_K, 300, 512, 2, 5},
        {DType::Q2_K, 64, 256, 17, 6},
        {DType::Q3_K, 40, 256, 17, 6},
        {DType::Q5_K, 16, 256, 0, 6},
    };
    std::vector<TestMatrix> mats;
    std::vector<std::vector<float>> xs(7);
    for (const Spec &sp : specs) {
        mats.emplace_back(rng, sp.type, sp.n_rows, sp.n_cols);
        auto &x = xs[static_cast<size_t>(sp.x_index)];
        const auto need = static_cast<size_t>(std::max<int64_t>(sp.n_tokens, 1) * sp.n_cols);
        if (x.size() < need) x = test::random_floats(rng, need, -2.0f, 2.0f);
    }
    for (int n_threads : {1, 2, 3}) {
        ThreadPool pool(n_threads);
        OpScratch scratch;
        std::vector<std::vector<float>> y_many(specs.size()), y_one(specs.size());
        std::vector<MatmulTask> tasks;
        for (size_t i = 0; i < specs.size(); ++i) {
            const Spec &sp = specs[i];
            y_many[i].assign(static_cast<size_t>(sp.n_tokens * sp.n_rows), NAN);
            y_one[i].assign(y_many[i].size(), NAN);
            tasks.push_back({&mats[i].w, xs[static_cast<size_t>(sp.x_index)].data(), sp.n_tokens, y_many[i].data()});
        }
        matmul_many(pool, scratch, tasks.data(), static_cast<int64_t>(tasks.size()));
        for (size_t i = 0; i < specs.size(); ++i) {
            matmul(pool, scratch, mats[i].w, tasks[i].x, specs[i].n_tokens, y_one[i].data());
            if (y_one[i].empty()) continue;  // the 0-token task (memcmp must not see its null pointers)
            ASSERT_EQ(std::memcmp(y_many[i].data(), y_one[i].data(), y_one[i].size() * sizeof(float)), 0)
                << "task " << i << " (" << dtype_name(specs[i].type) << "), " << n_threads << " threads";
        }
    }
    ThreadPool pool(2);
    OpScratch scratch;
    matmul_many(pool, scratch, nullptr, 0);  // an empty set is a no-op
    WeightMatrix bad = mats[0].w;
    bad.n_cols = 48;
    std::vector<float> y(static_cast<size_t>(768 * 3));
    const MatmulTask bad_task{&bad, xs[0].data(), 3, y.data()};
    EXPECT_THROW(matmul_many(pool, scratch, &bad_task, 1), Error);
}

TEST(Matmul, ManyWithStridesReadsAndWritesSlicesInPlace) {
    // MLA's per-head products read one head's slice of [T, NH, in_dim] activations and write one head's slice of
    // [T, NH, out_dim] outputs through the tasks' strides: each slice gets the bits of a matmul over the gathered
    // activations, and nothing outside the slices is written. Heads share a buffer (same x pointer base, different
    // offsets); two tasks on the same x with different strides must not share quantised activations. Float,
    // block, K-quant and packed weights; token counts across the 8-token tile; 1-3 threads.
    std::mt19937 rng(53);
    constexpr int64_t kHeads = 3, kIn = 64, kOut = 40, kOutSlot = 56;
    for (const DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q4_K})
        for (const bool packed : {false, true}) {
            if (packed && !packs_rows8(t)) continue;
            const int64_t n_cols = dtype_dots_q8_k(t) ? 256 : kIn, in_slot = n_cols + 32;
            std::vector<TestMatrix> mats;
            std::vector<std::vector<uint8_t>> packed_bytes;
            for (int64_t h = 0; h < kHeads; ++h) {
                mats.emplace_back(rng, t, kOut, n_cols);
                if (packed) {
                    packed_bytes.emplace_back(mats.back().bytes.size());
                    pack_rows8(t, mats.back().bytes.data(), kOut, n_cols, packed_bytes.back().data());
                    mats.back().w.data = packed_bytes.back().data();
                    mats.back().w.rows8 = true;
                }
            }
            for (const int64_t T : {1, 4, 9}) {
                const auto x = test::random_floats(rng, static_cast<size_t>(T * kHeads * in_slot), -2.0f, 2.0f);
                for (int n_threads : {1, 2, 3}) {
                    ThreadPool pool(n_threads);
                    OpScratch scratch;
                    std::vector<float> y(static_cast<size_t>(T * kHeads * kOutSlot), 1234.5f);
                    std::vector<MatmulTask> tasks;
                    for (int64_t h = 0; h < kHeads; ++h) {
                        tasks.push_back({&mats[static_cast<size_t>(h)].w, x.data() + h * in_slot, T,
                                         y.data() + h * kOutSlot, kHeads * in_slot, kHeads * kOutSlot});
                    }
                    // The first head again on the same x pointer read densely (tokens n_cols apart): other rows.
                    std::vector<float> y_dense(static_cast<size_t>(T * kOut), NAN);
                    tasks.push_back({&mats[0].w, x.data(), T, y_dense.data()});
                    matmul_many(pool, scratch, tasks.data(), static_cast<int64_t>(tasks.size()));
                    for (int64_t h = 0; h < kHeads; ++h) {
                        std::vector<float> xg(static_cast<size_t>(T * n_cols)), yg(static_cast<size_t>(T * kOut));
                        for (int64_t tk = 0; tk < T; ++tk)
                            std::copy_n(x.data() + (tk * kHeads + h) * in_slot, n_cols, xg.data() + tk * n_cols);
                        matmul(pool, scratch, mats[static_cast<size_t>(h)].w, xg.data(), T, yg.data());
                        for (int64_t tk = 0; tk < T; ++tk) {
                            const float *slot = y.data() + (tk * kHeads + h) * kOutSlot;
                            ASSERT_EQ(std::memcmp(slot, yg.data() + tk * kOut, kOut * sizeof(float)), 0)
                                << dtype_name(t) << (packed ? " packed" : "") << ", head " << h << ", token " << tk
                                << " of " << T << ", " << n_threads << " threads";
                            for (int64_t i = kOut; i < kOutSlot; ++i) ASSERT_EQ(slot[i], 1234.5f) << "gap written";
                        }
                    }
                    std::vector<float> y_ref(y_dense.size());
                    matmul(pool, scratch, mats[0].w, x.data(), T, y_ref.data());
                    ASSERT_EQ(std::memcmp(y_dense.data(), y_ref.data(), y_ref.size() * sizeof(float)), 0)
                        << dtype_name(t) << ": a dense task on the same x took the strided task's activations";
                }
            }
        }
    // A stride shorter than a row is refused.
    ThreadPool pool(2);
    OpScratch scratch;
    TestMatrix m(rng, DType::Q8_0, 16, 64);
    std::vector<float> x(256), y(256);
    const MatmulTask short_x{&m.w, x.data(), 2, y.data(), 63, 0};
    EXPECT_THROW(matmul_many(pool, scratch, &short_x, 1), Error);
    const MatmulTask short_y{&m.w, x.data(), 2, y.data(), 0, 15};
    EXPECT_THROW(matmul_many(pool, scratch, &short_y, 1), Error);
}

// A MatmulSection's products are matmul_many's bits however its chunks are taken: all by finish() on the pool,
// all by run_some() on this thread, or some by run_some() on several threads at once (with the rest, if any, by
// finish()). Strided per-head tasks (MLA's W_UK, as the model runs them beside the indexer's merge) and a dense one.
TEST(Matmul, SectionEqualsManyBitForBit) {
    std::mt19937 rng(71);
    constexpr int64_t kHeads = 5, kIn = 128, kOut = 96, kInSlot = 160, kOutSlot = 112;
    for (const DType t : {DType::Q8_0, DType::F16, DType::Q4_K})
        for (const int64_t T : {1, 3, 9}) {
            const int64_t n_cols = dtype_dots_q8_k(t) ? 256 : kIn, in_slot = std::max(kInSlot, n_cols);
            std::vector<TestMatrix> mats;
            for (int64_t h = 0; h < kHeads; ++h) mats.emplace_back(rng, t, kOut, n_cols);
            TestMatrix dense(rng, DType::Q8_0, 600, 256);
            const auto x = test::random_floats(rng, static_cast<size_t>(T * kHeads * in_slot), -2.0f, 2.0f);
            const auto xd = test::random_floats(rng, static_cast<size_t>(T * 256), -2.0f, 2.0f);
            auto make_tasks = [&](std::vector<float> &y, std::vector<float> &yd) {
                y.assign(static_cast<size_t>(T * kHeads * kOutSlot), 1234.5f);
                yd.assign(static_cast<size_t>(T * 600), NAN);
                std::vector<MatmulTask> tasks;
                for (int64_t h = 0; h < kHeads; ++h) {
                    tasks.push_back({&mats[static_cast<size_t>(h)].w, x.data() + h * in_slot, T,
                                     y.data() + h * kOutSlot, kHeads * in_slot, kHeads * kOutSlot});
                }
                tasks.push_back({&dense.w, xd.data(), T, yd.data()});
                return tasks;
            };
            ThreadPool pool(3);
            OpScratch scratch;
            std::vector<float> want, want_d;
            const auto want_tasks = make_tasks(want, want_d);
            matmul_many(pool, scratch, want_tasks.data(), std::ssize(want_tasks));
            for (int mode = 0; mode < 3; ++mode) {
                std::vector<float> y, yd;
                const auto tasks = make_tasks(y, yd);
                MatmulSection section;
                section.prepare(scratch, tasks.data(), std::ssize(tasks), pool.n_threads());
                if (mode == 1) section.run_some();
                if (mode == 2)
                    pool.run([&section](int ith, int) {
                        if (ith > 0) section.run_some();
                    });
                section.finish(pool);
                ASSERT_EQ(std::memcmp(y.data(), want.data(), want.size() * sizeof(float)), 0)
                    << dtype_name(t) << ", " << T << " tokens, mode " << mode;
                ASSERT_EQ(std::memcmp(yd.data(), want_d.data(), want_d.size() * sizeof(float)), 0)
                    << dtype_name(t) << ", " << T << " tokens, mode " << mode;
            }
        }
    // A bad task is refused at prepare(), as by matmul_many.
    TestMatrix m(rng, DType::Q8_0, 16, 64);
    std::vector<float> x(256), y(256);
    const MatmulTask short_x{&m.w, x.data(), 2, y.data(), 63, 0};
    OpScratch scratch;
    MatmulSection section;
    EXPECT_THROW(section.prepare(scratch, &short_x, 1, 2), Error);
}

TEST(Matmul, RejectsBadShapes) {
    ThreadPool pool(1);
    OpScratch scratch;
    std::vector<uint8_t> bytes(34 * 4);
    std::vector<float> x(64), y(4);
    WeightMatrix w{DType::Q8_0, bytes.data(), 2, 64, 68};
    EXPECT_NO_THROW(matmul(pool, scratch, w, x.data(), 1, y.data()));
    WeightMatrix bad_cols = w;
    bad_cols.n_cols = 48;  // not a multiple of 32
    EXPECT_THROW(matmul(pool, scratch, bad_cols, x.data(), 1, y.data()), Error);
    WeightMatrix bad_stride = w;
    bad_stride.row_bytes = 64;
    EXPECT_THROW(matmul(pool, scratch, bad_stride, x.data(), 1, y.data()), Error);
    WeightMatrix bad_type = w;
    bad_type.type = DType::IQ2_S;  // a ggml type sparrow does not compute with
    EXPECT_THROW(matmul(pool, scratch, bad_type, x.data(), 1, y.data()), Error);
}

TEST(Matmul, DoesNotAllocateOnceWarm) {
    std::mt19937 rng(2);
    ThreadPool pool(2);
    OpScratch scratch;
    for (DType t : kWeightTypes) {
        const TestMatrix m(rng, t, 512, 256);
        const auto x = test::random_floats(rng, 8 * 256);
        std::vector<float> y(8 * 512);
        matmul(pool, scratch, m.w, x.data(), 8, y.data());  // warm: sizes the scratch
        const int64_t before = g_n_allocations.load();
        for (int64_t n_tokens : {1, 3, 8}) matmul(pool, scratch, m.w, x.data(), n_tokens, y.data());
        EXPECT_EQ(g_n_allocations.load(), before) << dtype_name(t);
    }
}

}  // namespace
}  // namespace sparrow
