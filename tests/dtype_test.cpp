#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "test_util.h"

namespace sparrow {
namespace {

TEST(DType, Fp16RoundTripsEveryHalf) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = fp16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_fp16(f), h) << "half bits " << h;
    }
}

TEST(DType, Fp16RoundsToNearestEvenLikeTheCompiler) {
    std::mt19937 rng(1);
    std::uniform_int_distribution<uint32_t> bits;
    for (int i = 0; i < 2000000; ++i) {
        const float f = f32_from_bits(bits(rng));
        if (std::isnan(f)) continue;
        const _Float16 h = static_cast<_Float16>(f);
        uint16_t expected;
        std::memcpy(&expected, &h, 2);
        ASSERT_EQ(f32_to_fp16(f), expected) << "float " << f;
    }
}

TEST(DType, Bf16RoundTrip) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = bf16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_bf16(f), h);
    }
    EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // tie rounds to even
    EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
}

TEST(DType, GeometryOfKnownTypes) {
    EXPECT_EQ(dtype_row_size(DType::Q8_0, 64), 68);
    EXPECT_EQ(dtype_row_size(DType::Q4_0, 64), 36);
    EXPECT_EQ(dtype_row_size(DType::Q4_K, 256), 144);
    EXPECT_EQ(dtype_from_name("Q8_0"), DType::Q8_0);
    EXPECT_FALSE(dtype_info(4).has_value());  // ids 4 and 5 were removed from ggml
}

class QuantRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(QuantRoundTrip, ErrorWithinTheTypesStep) {
    const DType t = GetParam();
    std::mt19937 rng(7);
    for (int64_t n : {32, 64, 4096}) {
        const auto x = test::random_floats(rng, static_cast<size_t>(n), -3.0f, 3.0f);
        std::vector<uint8_t> q(static_cast<size_t>(dtype_row_size(t, n)));
        std::vector<float> y(static_cast<size_t>(n));
        quantize_row(t, x.data(), q.data(), n);
        dequantize_row(t, q.data(), y.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            // Per-block step: amax/127 (Q8_0), amax/8 (Q4_0); relative 2^-11 (F16), 2^-8 (BF16).
            const float bound = t == DType::Q8_0   ? 3.0f / 127 * 0.5f + 1e-3f
                                : t == DType::Q4_0 ? 3.0f / 8 + 1e-3f
                                : t == DType::F16  ? std::fabs(x[i]) / 2048
                                : t == DType::BF16 ? std::fabs(x[i]) / 256
                                                   : 0.0f;
            ASSERT_LE(std::fabs(x[i] - y[i]), bound) << dtype_name(t) << " element " << i;
        }
        // Quantising the dequantised values again must reproduce the same bytes (a fixed point).
        std::vector<uint8_t> q2(q.size());
        quantize_row(t, y.data(), q2.data(), n);
        if (t != DType::Q4_0) {
            EXPECT_EQ(q, q2) << dtype_name(t);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantRoundTrip,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0),
                         [](const auto &param_info) { return std::string(dtype_name(param_info.param)); });

TEST(DType, Q4_0MatchesGgmlLayout) {
    // One block: values -8..7 times 0.5 with the max-magnitude element negative, so d = -4 / -8 = 0.5.
    float x[32];
    for (int j = 0; j < 32; ++j) x[j] = 0.5f * static_cast<float>((j % 16) - 8);
    BlockQ4_0 b;
    quantize_row(DType::Q4_0, x, &b, 32);
    EXPECT_EQ(fp16_to_f32(b.d), 0.5f);
    for (int j = 0; j < 16; ++j) EXPECT_EQ(b.qs[j], static_cast<uint8_t>(j | (j << 4)));
}

}  // namespace
}  // namespace sparrow
