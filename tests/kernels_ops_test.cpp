// The ops of ops.h other than matmul (kernels_test.cpp has matmul and the ISA kernels) against their scalar
// references in kernels/ref, plus checks of the definitions themselves (hand-computed values, H H = I, the
// YaRN ramp). Tolerances are a few f32 roundings of the magnitude of the terms that make each output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/ref/ref_ops.h"
#include "test_util.h"

namespace sparrow {
namespace {

constexpr double kF32Eps = 1.1920929e-07;

// Lengths that hit every tail: 1, odd, one short of and one past SIMD and block sizes, large.
const std::vector<int64_t> kLengths = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 96, 100, 257, 4097, 4096 + 32};

// --- norms
// -------------------------------------------------------------------------------------------------------

TEST(Ops, RmsNormMatchesReference) {
    std::mt19937 rng(1);
    for (int64_t n : kLengths) {
        for (int64_t n_rows : {1, 3}) {
            for (bool with_weight : {false, true}) {
                for (bool in_place : {false, true}) {
                    const auto x = test::random_floats(rng, static_cast<size_t>(n * n_rows), -4.0f, 4.0f);
                    const auto w = test::random_floats(rng, static_cast<size_t>(n), 0.5f, 1.5f);
                    const float *wp = with_weight ? w.data() : nullptr;
                    std::vector<float> y(x.size()), y_ref(x.size());
                    ref::rms_norm(x.data(), wp, y_ref.data(), n_rows, n, 1e-6f);
                    if (in_place) {
                        y = x;
                        rms_norm(y.data(), wp, y.data(), n_rows, n, 1e-6f);
                    } else {
                        rms_norm(x.data(), wp, y.data(), n_rows, n, 1e-6f);
                    }
                    for (size_t i = 0; i < y.size(); ++i) {
                        ASSERT_NEAR(y[i], y_ref[i], 4 * kF32Eps * std::fabs(y_ref[i]))
                            << "n=" << n << " rows=" << n_rows << " weight=" << with_weight << " i=" << i;
                    }
                }
            }
        }
    }
}

TEST(Ops, RmsNormOfConstantRowIsItsSign) {
    std::vector<float> x(64, -3.0f), y(64);
    rms_norm(x.data(), nullptr, y.data(), 1, 64, 0.0f);
    for (float v : y) EXPECT_FLOAT_EQ(v, -1.0f);
}

TEST(Ops, LayerNormMatchesReference) {
    std::mt19937 rng(2);
    for (int64_t n : kLengths) {
        for (bool affine : {false, true}) {
            // An offset mean (10) well above the spread, where a one-pass variance would cancel badly.
            auto x = test::random_floats(rng, static_cast<size_t>(2 * n), 9.0f, 11.0f);
            const auto w = test::random_floats(rng, static_cast<size_t>(n), 0.5f, 1.5f);
            const auto b = test::random_floats(rng, static_cast<size_t>(n), -1.0f, 1.0f);
            std::vector<float> y_ref(x.size());
            const float *wp = affine ? w.data() : nullptr, *bp = affine ? b.data() : nullptr;
            ref::layer_norm(x.data(), wp, bp, y_ref.data(), 2, n, 1e-5f);
            layer_norm(x.data(), wp, bp, x.data(), 2, n, 1e-5f);  // in place
            for (int64_t r = 0; r < 2; ++r) {
                for (int64_t i = 0; i < n; ++i) {
                    // x - mean rounds on the scale of |x| (~10), then gets multiplied by 1/std (~1.7).
                    const size_t k = static_cast<size_t>(r * n + i);
                    const double scale_terms = 11.0 * 2.0 * (affine ? std::fabs(w[i]) : 1.0) + std::fabs(y_ref[k]);
                    ASSERT_NEAR(x[k], y_ref[k], 8 * kF32Eps * scale_terms) << "n=" << n << " i=" << i;
                }
            }
        }
    }
}

// --- rope
// --------------------------------------------------------------------------------------------------------

struct RopeCase {
    RopeLayout layout;
    int64_t n_heads, head_dim;
    int n_rot;
    bool yarn;
};

TEST(Ops, RopeMatchesReference) {
    const std::vector<RopeCase> cases = {
        {RopeLayout::adjacent, 1, 2, 2, false},     {RopeLayout::half_split, 1, 2, 2, false},
        {RopeLayout::adjacent, 4, 64, 64, false},   {RopeLayout::half_split, 4, 64, 64, false},
        {RopeLayout::adjacent, 3, 128, 64, false},  {RopeLayout::half_split, 3, 128, 64, false},
        {RopeLayout::adjacent, 2, 96, 32, true},    {RopeLayout::half_split, 2, 96, 32, true},
        {RopeLayout::adjacent, 4, 64, 64, true},    {RopeLayout::half_split, 4, 64, 64, true},
        {RopeLayout::adjacent, 1, 576, 512, true},  {RopeLayout::half_split, 1, 576, 512, false},
        {RopeLayout::adjacent, 5, 80, 78, false},   {RopeLayout::half_split, 5, 80, 78, true},
        {RopeLayout::adjacent, 7, 128, 128, true},  {RopeLayout::half_split, 7, 128, 128, false},
        {RopeLayout::adjacent, 2, 64, 2, true},     {RopeLayout::half_split, 2, 64, 2, false},
        {RopeLayout::adjacent, 1, 192, 64, false},  {RopeLayout::half_split, 1, 192, 64, true},
        {RopeLayout::adjacent, 3, 300, 256, false}, {RopeLayout::half_split, 3, 300, 258, true},
    };
    const std::vector<int32_t> pos = {0, 1, 2, 7, 100, 4095, 65535, 163839, 1000000};
    std::mt19937 rng(3);
    for (const RopeCase &c : cases) {
        RopeParams p;
        p.layout = c.layout;
        p.n_rot = c.n_rot;
        p.freq_base = c.yarn ? 10000.0f : 500000.0f;
        if (c.yarn) {  // DeepSeek-style YaRN: 40x extension of a 4096 context
            p.freq_scale = 1.0f / 40.0f;
            p.ext_factor = 1.0f;
            p.attn_factor = 0.9f;
            p.beta_fast = 32.0f;
            p.beta_slow = 1.0f;
            p.n_ctx_orig = 4096;
        }
        const int64_t n_tokens = static_cast<int64_t>(pos.size());
        const auto x0 = test::random_floats(rng, static_cast<size_t>(n_tokens * c.n_heads * c.head_dim), -2.0f, 2.0f);
        auto x = x0, x_ref = x0;
        ref::rope(x_ref.data(), n_tokens, c.n_heads, c.head_dim, pos.data(), p);
        rope(x.data(), n_tokens, c.n_heads, c.head_dim, pos.data(), p);
        const std::string what = std::string(c.layout == RopeLayout::adjacent ? "adjacent" : "half_split") +
                                 " head_dim=" + std::to_string(c.head_dim) + " n_rot=" + std::to_string(c.n_rot) +
                                 (c.yarn ? " yarn" : "");
        for (int64_t t = 0; t < n_tokens; ++t) {
            for (int64_t h = 0; h < c.n_heads; ++h) {
                const size_t base = static_cast<size_t>((t * c.n_heads + h) * c.head_dim);
                for (int64_t d = 0; d < c.head_dim; ++d) {
                    const size_t i = base + static_cast<size_t>(d);
                    if (d >= c.n_rot) {
                        ASSERT_EQ(x[i], x0[i]) << what << ": dims past n_rot must pass through";
                        continue;
                    }
                    // Outputs mix two inputs of magnitude <= 2 scaled by mscale <= 1.3; angles are exact to
                    // ~1e-7 rad in both (double angle, reduced before f32 sin/cos).
                    ASSERT_NEAR(x[i], x_ref[i], 3e-6) << what << " pos=" << pos[t] << " head " << h << " dim " << d;
                }
            }
        }
    }
}

// The angle and length that rope gives pair i of a head holding (1, 0) in every pair.
struct PairRotation {
    double angle, length;
};
std::vector<PairRotation> rotations_of_unit_pairs(const RopeParams &p, int32_t pos) {
    std::vector<float> x(static_cast<size_t>(p.n_rot), 0.0f);
    const int half = p.n_rot / 2;
    for (int i = 0; i < half; ++i) x[static_cast<size_t>(p.layout == RopeLayout::adjacent ? 2 * i : i)] = 1.0f;
    rope(x.data(), 1, 1, p.n_rot, &pos, p);
    std::vector<PairRotation> out;
    for (int i = 0; i < half; ++i) {
        const float a = x[static_cast<size_t>(p.layout == RopeLayout::adjacent ? 2 * i : i)];
        const float b = x[static_cast<size_t>(p.layout == RopeLayout::adjacent ? 2 * i + 1 : i + half)];
        out.push_back({std::atan2(b, a), std::hypot(a, b)});
    }
    return out;
}

TEST(Ops, RopeFollowsTheDefinition) {
    // Plain RoPE: pair i turns by pos * base^(-2i/n_rot) and keeps its length (attn_factor 1).
    RopeParams p;
    p.n_rot = 8;
    p.freq_base = 10000.0f;
    for (RopeLayout layout : {RopeLayout::adjacent, RopeLayout::half_split}) {
        p.layout = layout;
        const auto rot = rotations_of_unit_pairs(p, 1);
        for (int i = 0; i < 4; ++i) {
            EXPECT_NEAR(rot[i].angle, std::pow(10000.0, -2.0 * i / 8), 1e-6) << "pair " << i;
            EXPECT_NEAR(rot[i].length, 1.0, 1e-6);
        }
    }
}

// A RopeTable made once gives rope() the bits of the RopeParams call, over many calls (plain and YaRN, both layouts,
// n_rot below the head width); an empty or odd table is refused, not a silent no-op.
TEST(Ops, RopeTableGivesTheParamsBits) {
    std::mt19937 rng(21);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    for (RopeLayout layout : {RopeLayout::adjacent, RopeLayout::half_split}) {
        for (float ext : {0.0f, 1.0f}) {
            RopeParams p;
            p.layout = layout;
            p.n_rot = 48;
            p.freq_base = 50000.0f;
            p.freq_scale = ext != 0.0f ? 0.25f : 1.0f;
            p.ext_factor = ext;
            p.attn_factor = 1.1f;
            p.n_ctx_orig = 4096;
            const RopeTable table(p);
            for (int call = 0; call < 5; ++call) {
                const int64_t T = 3, H = 2, D = 64;
                std::vector<float> a(static_cast<size_t>(T * H * D));
                for (float &v : a) v = gauss(rng);
                std::vector<float> b = a;
                const int32_t pos[T] = {call, 1000 * call + 7, 131071 - call};
                rope(a.data(), T, H, D, pos, p);
                rope(b.data(), T, H, D, pos, table);
                EXPECT_EQ(a, b) << "layout " << int(layout) << " ext " << ext << " call " << call;
            }
        }
    }
    std::vector<float> x(8, 1.0f);
    const int32_t pos = 1;
    EXPECT_THROW(rope(x.data(), 1, 1, 8, &pos, RopeTable()), Error);
    RopeParams odd;
    odd.n_rot = 7;
    EXPECT_THROW(RopeTable{odd}, Error);
    RopeParams wide;
    wide.n_rot = 16;
    EXPECT_THROW(rope(x.data(), 1, 1, 8, &pos, RopeTable(wide)), Error);  // n_rot above the head width
}

TEST(Ops, RopeYarnRampAndMagnitude) {
    // n_rot 64, n_ctx_orig 4096, base 10000, beta 32/1: ggml's correction dims are
    // floor(64 ln(4096 / (32 * 2pi)) / (2 ln 10000)) = floor(10.47) = 10 and ceil(22.52) = 23.
    float dims[2];
    ref::rope_yarn_corr_dims(64, 4096, 10000.0f, 32.0f, 1.0f, dims);
    EXPECT_EQ(dims[0], 10.0f);
    EXPECT_EQ(dims[1], 23.0f);

    RopeParams p;
    p.layout = RopeLayout::half_split;
    p.n_rot = 64;
    p.freq_base = 10000.0f;
    p.freq_scale = 0.25f;
    p.ext_factor = 1.0f;
    p.attn_factor = 1.0f;
    p.n_ctx_orig = 4096;
    const int32_t pos = 3;
    const auto rot = rotations_of_unit_pairs(p, pos);
    const double mscale = 1.0 + 0.1 * std::log(4.0);
    const auto wrapped = [](double a) { return std::remainder(a, 2.0 * M_PI); };
    for (int i = 0; i < 32; ++i) {
        const double extrap = pos * std::pow(10000.0, -2.0 * i / 64);
        const double ramp = 1.0 - std::clamp((i - 10.0) / (23.0 - 10.0), 0.0, 1.0);
        const double theta = 0.25 * extrap * (1.0 - ramp) + extrap * ramp;
        // Fast pairs (i <= 10) keep the original frequency, slow ones (i >= 23) are interpolated.
        if (i <= 10) {
            EXPECT_NEAR(theta, extrap, 1e-12);
        }
        if (i >= 23) {
            EXPECT_NEAR(theta, 0.25 * extrap, 1e-12);
        }
        EXPECT_NEAR(std::remainder(rot[i].angle - wrapped(theta), 2.0 * M_PI), 0.0, 1e-6) << "pair " << i;
        EXPECT_NEAR(rot[i].length, mscale, 1e-6) << "pair " << i;
    }
}

TEST(Ops, RopeRejectsBadRotationSizes) {
    std::vector<float> x(16);
    const int32_t pos = 0;
    RopeParams p;
    for (int n_rot : {0, 3, 18}) {
        p.n_rot = n_rot;
        EXPECT_THROW(rope(x.data(), 1, 1, 16, &pos, p), Error) << n_rot;
    }
}

// --- softmax and swiglu
// ---------------------------------------------------------------------------------------

TEST(Ops, SoftmaxMatchesReference) {
    std::mt19937 rng(4);
    for (int64_t n : kLengths) {
        for (float scale : {1.0f, 0.125f, -0.5f}) {
            auto x = test::random_floats(rng, static_cast<size_t>(n), -10.0f, 10.0f);
            const bool masked = n > 4 && scale > 0;  // -inf * a negative scale would be +inf
            if (masked) x[3] = -INFINITY;
            auto x_ref = x;
            ref::softmax(x_ref.data(), n, scale);
            softmax(x.data(), n, scale);
            double sum = 0.0;
            for (int64_t i = 0; i < n; ++i) {
                // exp of an argument rounded once on the scale of |x * scale| <= 10, then a few roundings.
                ASSERT_NEAR(x[i], x_ref[i], 16 * kF32Eps * (1.0 + 10.0 * std::fabs(scale)) * x_ref[i] + 1e-30)
                    << "n=" << n << " scale=" << scale << " i=" << i;
                sum += x[i];
            }
            EXPECT_NEAR(sum, 1.0, 1e-5);
            if (masked) {
                EXPECT_EQ(x[3], 0.0f);
            }
        }
    }
}

TEST(Ops, SoftmaxOfFullyMaskedRowIsZero) {
    std::vector<float> x(7, -INFINITY);
    softmax(x.data(), 7);
    for (float v : x) EXPECT_EQ(v, 0.0f);
    softmax(x.data(), 0);  // empty: nothing to do
}

TEST(Ops, SwigluMatchesReference) {
    std::mt19937 rng(5);
    for (int64_t n : kLengths) {
        auto gate = test::random_floats(rng, static_cast<size_t>(n), -20.0f, 20.0f);
        const auto up = test::random_floats(rng, static_cast<size_t>(n), -3.0f, 3.0f);
        std::vector<float> y_ref(static_cast<size_t>(n));
        ref::swiglu(gate.data(), up.data(), y_ref.data(), n);
        swiglu(gate.data(), up.data(), gate.data(), n);  // out aliases gate
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(gate[i], y_ref[i], 8 * kF32Eps * std::fabs(y_ref[i]) + 1e-30);
    }
}

// --- hadamard
// ---------------------------------------------------------------------------------------------------

TEST(Ops, HadamardMatchesReferenceForEveryPowerOfTwo) {
    std::mt19937 rng(6);
    for (int64_t n = 1; n <= 1024; n *= 2) {
        const int64_t n_rows = 3;
        auto x = test::random_floats(rng, static_cast<size_t>(n * n_rows), -1.0f, 1.0f);
        auto x_ref = x;
        ref::hadamard(x_ref.data(), n_rows, n);
        hadamard(x.data(), n_rows, n);
        for (int64_t r = 0; r < n_rows; ++r) {
            // Each output sums n inputs of size <= 1 over log2(n) stages, then scales by 1/sqrt(n).
            const double tol = (std::log2(double(n)) + 2) * kF32Eps * std::sqrt(double(n));
            for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(x[r * n + i], x_ref[r * n + i], tol) << "n=" << n << " i=" << i;
        }
    }
}

TEST(Ops, HadamardTimesHadamardIsIdentity) {
    for (int64_t n = 1; n <= 1024; n *= 2) {
        // Row j of h is H e_j = column j of H (H is symmetric); transforming it again gives row j of H H.
        std::vector<float> h(static_cast<size_t>(n * n), 0.0f);
        for (int64_t j = 0; j < n; ++j) h[static_cast<size_t>(j * n + j)] = 1.0f;
        hadamard(h.data(), n, n);
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < n; ++j) {
                ASSERT_NEAR(std::fabs(h[i * n + j]) * std::sqrt(double(n)), 1.0, 1e-6) << "entries are +-1/sqrt(n)";
                ASSERT_EQ(h[i * n + j], h[j * n + i]) << "H is symmetric";
            }
        }
        hadamard(h.data(), n, n);
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j < n; ++j) {
                ASSERT_NEAR(h[i * n + j], i == j ? 1.0 : 0.0, 8 * kF32Eps * std::log2(2.0 * n)) << "n=" << n;
            }
        }
    }
}

TEST(Ops, HadamardRejectsNonPowersOfTwo) {
    std::vector<float> x(12);
    EXPECT_THROW(hadamard(x.data(), 1, 12), Error);
    EXPECT_THROW(hadamard(x.data(), 1, 0), Error);
}

// --- top-k
// ------------------------------------------------------------------------------------------------------

void expect_top_k_matches_reference(const std::vector<float> &s, int64_t k, const std::string &what) {
    const int64_t n = static_cast<int64_t>(s.size());
    const size_t m = static_cast<size_t>(std::max<int64_t>(0, std::min(k, n)));
    std::vector<int32_t> idx(m + 1, -7), idx_ref(m + 1, -7);  // one guard slot past the end
    ASSERT_EQ(top_k(s.data(), n, k, idx.data()), static_cast<int64_t>(m)) << what;
    ASSERT_EQ(ref::top_k(s.data(), n, k, idx_ref.data()), static_cast<int64_t>(m)) << what;
    EXPECT_EQ(idx, idx_ref) << what << " n=" << n << " k=" << k;
}

TEST(Ops, TopKMatchesReference) {
    std::mt19937 rng(7);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int trial = 0; trial < 300; ++trial) {
        const int64_t n = std::uniform_int_distribution<int64_t>(0, trial < 200 ? 40 : 3000)(rng);
        // A small alphabet of values makes ties common; some trials add NaN and infinities.
        const int alphabet = std::uniform_int_distribution<int>(1, 12)(rng);
        std::vector<float> s(static_cast<size_t>(n));
        for (auto &v : s) v = float(std::uniform_int_distribution<int>(0, alphabet - 1)(rng)) - 3.0f;
        if (trial % 3 == 0) {
            for (auto &v : s) {
                const int r = std::uniform_int_distribution<int>(0, 9)(rng);
                v = r == 0 ? nan : r == 1 ? INFINITY : r == 2 ? -INFINITY : r == 3 ? -0.0f : v;
            }
        }
        if (trial % 5 == 0) s = test::random_floats(rng, static_cast<size_t>(n));  // distinct values
        for (int64_t k : {int64_t(0), int64_t(1), int64_t(2), n / 2, n - 1, n, n + 5}) {
            expect_top_k_matches_reference(s, k, "trial " + std::to_string(trial));
        }
    }
}

TEST(Ops, TopKFollowsTheContract) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> s = {1.0f, nan, 3.0f, 3.0f, -INFINITY, 2.0f, nan, 3.0f};
    int32_t idx[8];
    ASSERT_EQ(top_k(s.data(), 8, 8, idx), 8);
    const std::vector<int32_t> expected = {2, 3, 7, 5, 0, 4, 1, 6};  // ties by index, NaN last
    EXPECT_EQ(std::vector<int32_t>(idx, idx + 8), expected);
    ASSERT_EQ(top_k(s.data(), 8, 2, idx), 2);
    EXPECT_EQ(idx[0], 2);
    EXPECT_EQ(idx[1], 3);
    EXPECT_EQ(top_k(s.data(), 8, 0, idx), 0);
    EXPECT_EQ(top_k(s.data(), 8, -3, idx), 0);
    EXPECT_EQ(top_k(s.data(), 0, 5, idx), 0);
    ASSERT_EQ(top_k(s.data(), 3, 10, idx), 3);  // k > n: all of them, sorted
    EXPECT_EQ(std::vector<int32_t>(idx, idx + 3), (std::vector<int32_t>{2, 0, 1}));
}

// --- rows
// -----------------------------------------------------------------------------------------------------

TEST(Ops, GetRowsDequantisesEveryType) {
    std::mt19937 rng(8);
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
        const int64_t n_rows = 9, n_cols = 96;
        const int64_t row_bytes = dtype_row_size(t, n_cols);
        std::vector<uint8_t> bytes(static_cast<size_t>(n_rows * row_bytes));
        const auto values = test::random_floats(rng, static_cast<size_t>(n_rows * n_cols));
        for (int64_t r = 0; r < n_rows; ++r)
            quantize_row(t, values.data() + r * n_cols, bytes.data() + r * row_bytes, n_cols);
        const WeightMatrix table{t, bytes.data(), n_rows, n_cols, row_bytes};
        const std::vector<int32_t> ids = {8, 0, 3, 3, 7};
        std::vector<float> out(ids.size() * n_cols), out_ref(out.size());
        get_rows(table, ids.data(), 5, out.data());
        ref::get_rows(table, ids.data(), 5, out_ref.data());
        EXPECT_EQ(out, out_ref) << dtype_name(t);
        const int32_t bad[] = {9};
        EXPECT_THROW(get_rows(table, bad, 1, out.data()), Error);
        const int32_t negative[] = {-1};
        EXPECT_THROW(get_rows(table, negative, 1, out.data()), Error);
    }
}

TEST(Ops, DotRowAndAxpyRowMatchReference) {
    std::mt19937 rng(9);
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
        for (int64_t n : kLengths) {
            std::vector<float> v = test::random_floats(rng, static_cast<size_t>(n), -2.0f, 2.0f);
            std::vector<uint8_t> row(static_cast<size_t>(dtype_row_size(t, n)));
            quantize_row(t, v.data(), row.data(), n);
            dequantize_row(t, row.data(), v.data(), n);
            const auto x = test::random_floats(rng, static_cast<size_t>(n), -2.0f, 2.0f);
            double magnitude = 0.0;
            for (int64_t i = 0; i < n; ++i) magnitude += std::fabs(double(v[i]) * x[i]);
            EXPECT_NEAR(dot_row(t, row.data(), x.data(), n), ref::dot_row(t, row.data(), x.data(), n),
                        1e-6 * magnitude + 1e-30)
                << dtype_name(t) << " n=" << n;
            auto y = x, y_ref = x;
            axpy_row(t, row.data(), -1.5f, y.data(), n);
            ref::axpy_row(t, row.data(), -1.5f, y_ref.data(), n);
            for (int64_t i = 0; i < n; ++i) {
                ASSERT_NEAR(y[i], y_ref[i], 2 * kF32Eps * (std::fabs(x[i]) + 1.5 * std::fabs(v[i])) + 1e-30);
            }
        }
    }
    float x[32] = {};
    BlockQ8_0 q[1] = {};
    EXPECT_THROW(dot_row(DType::Q8_0, q, x, 32), Error);
    EXPECT_THROW(axpy_row(DType::Q8_0, q, 1.0f, x, 32), Error);
}

}  // namespace
}  // namespace sparrow
