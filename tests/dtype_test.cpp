#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/kquants.h"
#include "kernels/ref/ref_ops.h"
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
    for (int64_t n : {32, 64, 256, 512, 4096}) {
        if (n % dtype_info(t).block_size != 0) continue;
        const auto x = test::random_floats(rng, static_cast<size_t>(n), -3.0f, 3.0f);
        std::vector<uint8_t> q(static_cast<size_t>(dtype_row_size(t, n)));
        std::vector<float> y(static_cast<size_t>(n));
        quantize_row(t, x.data(), q.data(), n);
        dequantize_row(t, q.data(), y.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            // Per-block step: amax/127 (Q8_0), amax/8 (Q4_0); relative 2^-11 (F16), 2^-8 (BF16). K-quants: half
            // a sub-block's step (range/15, range/31; Q6_K amax/32, or a whole step where +32 clamps to 31) plus
            // what rounding the sub-block scale (to 1/63 or 1/128 of the largest) and min (1/63) moves. Q2_K: one
            // step (range/3) and its 4-bit scales; Q3_K: a step (amax/4, the sign opposite amax clamps at 3).
            // Q4_1 / Q5_1: half of range/15, range/31 (+ the f16 rounding of d and m); Q5_0: a step of amax/16
            // (+16 clamps at 15); IQ4_NL: the code book's widest gap at its end, 113 -> 127, in units of amax/127;
            // IQ4_XS: that, plus what rounding the sub-block scale to steps d (at most the largest / 31) moves an
            // element clamped at the book's end: half a step times 113. MXFP4: E2M1's widest gap (4 -> 6) or the
            // clamp of [6, 8) to 6, in units of the block's 2^(floor(log2 amax) - 2): 2 of them.
            const int64_t b0 = i / 32 * 32;
            const float block_amax = std::fabs(*std::max_element(
                x.begin() + b0, x.begin() + b0 + 32, [](float a, float b) { return std::fabs(a) < std::fabs(b); }));
            const float bound = t == DType::Q8_0     ? 3.0f / 127 * 0.5f + 1e-3f
                                : t == DType::Q4_0   ? 3.0f / 8 + 1e-3f
                                : t == DType::Q4_1   ? 6.0f / 15 * 0.5f + 3e-3f
                                : t == DType::Q5_1   ? 6.0f / 31 * 0.5f + 3e-3f
                                : t == DType::Q5_0   ? 3.0f / 16 + 1e-3f
                                : t == DType::IQ4_NL ? 3.0f / 127 * 14 + 1e-3f
                                : t == DType::Q2_K   ? 6.0f / 3 + 0.3f
                                : t == DType::Q3_K   ? 3.0f / 4 + 4 * (3.0f / 4) / 64 + 1e-3f
                                : t == DType::Q4_K   ? 6.0f / 15 * 0.5f + 16 * (6.0f / 15) / 126 + 3.0f / 126
                                : t == DType::Q5_K   ? 6.0f / 31 * 0.5f + 32 * (6.0f / 31) / 126 + 3.0f / 126
                                : t == DType::Q6_K   ? 3.0f / 32 + 32 * (3.0f / 32) / 256 + 1e-3f
                                : t == DType::IQ4_XS ? 3.0f / 127 * 14 + 56.5f * (3.0f / 127) / 31 + 2e-3f
                                : t == DType::MXFP4  ? std::ldexp(2.0f, std::ilogb(block_amax) - 2) + 1e-6f
                                : t == DType::F16    ? std::fabs(x[i]) / 2048
                                : t == DType::BF16   ? std::fabs(x[i]) / 256
                                                     : 0.0f;
            ASSERT_LE(std::fabs(x[i] - y[i]), bound) << dtype_name(t) << " element " << i;
        }
        // Quantising the dequantised values again must reproduce the same bytes (a fixed point).
        std::vector<uint8_t> q2(q.size());
        quantize_row(t, y.data(), q2.data(), n);
        if (t == DType::MXFP4) {
            // The values, not the bytes: a block whose elements fit one exponent lower (all of E2M1 up to 3, doubled,
            // is in the code book) is written at that exponent the second time.
            std::vector<float> y2(static_cast<size_t>(n));
            dequantize_row(t, q2.data(), y2.data(), n);
            EXPECT_EQ(y, y2);
        } else if (t != DType::Q4_0 && !dtype_dots_q8_k(t)) {
            EXPECT_EQ(q, q2) << dtype_name(t);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantRoundTrip,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                           DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K,
                                           DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS),
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

TEST(DType, KQuantScalesUnpackAsGgmlPacksThem) {
    // Sixteen distinct 6-bit numbers: scale s = 10 + s, min s = 40 + s (both above 15 from s = 6 on, so the top two
    // bits matter). Packed by hand as ggml's quantisers do: for s < 4 the low 6 bits of bytes s and s + 4; for
    // s >= 4 the low nibbles in byte s + 4 (scale low, min high) and the top 2 bits in bytes s - 4 and s.
    uint8_t scales[12] = {};
    for (int s = 0; s < 8; ++s) {
        const int sc = 10 + s, m = 40 + s;
        if (s < 4) {
            scales[s] |= static_cast<uint8_t>(sc);
            scales[s + 4] |= static_cast<uint8_t>(m);
        } else {
            scales[s + 4] = static_cast<uint8_t>((sc & 15) | ((m & 15) << 4));
            scales[s - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
            scales[s] |= static_cast<uint8_t>((m >> 4) << 6);
        }
    }
    for (int s = 0; s < 8; ++s) {
        int sc, m;
        kquant_scale_min(scales, s, sc, m);
        EXPECT_EQ(sc, 10 + s) << "sub-block " << s;
        EXPECT_EQ(m, 40 + s) << "sub-block " << s;
    }
}

TEST(DType, KQuantElementsLieWhereGgmlPutsThem) {
    // Hand-made blocks with one element set, checked against values worked out from the layout by hand.
    BlockQ4_K q4{};
    q4.d = f32_to_fp16(0.5f);
    q4.dmin = f32_to_fp16(0.25f);
    for (int s = 0; s < 4; ++s) q4.scales[s] = 2, q4.scales[s + 4] = 4;  // sub-blocks 0-3: sc 2, m 4
    for (int s = 8; s < 12; ++s) q4.scales[s] = 3 | (1 << 4);            // sub-blocks 4-7: sc 3, m 1
    q4.qs[32 * 2 + 5] = 0x9 << 4;  // chunk 2, high nibble: element 64 * 2 + 32 + 5 = 165, sub-block 5
    q4.qs[7] = 0xB;                // chunk 0, low nibble: element 7, sub-block 0
    float y[QK_K];
    dequantize_row(DType::Q4_K, &q4, y, QK_K);
    EXPECT_EQ(y[165], 0.5f * 3 * 9 - 0.25f * 1);
    EXPECT_EQ(y[7], 0.5f * 2 * 11 - 0.25f * 4);
    EXPECT_EQ(y[6], -0.25f * 4);    // u = 0 in sub-block 0
    EXPECT_EQ(y[200], -0.25f * 1);  // sub-block 6

    BlockQ5_K q5{};
    q5.d = f32_to_fp16(1.0f);
    for (int s = 0; s < 4; ++s) q5.scales[s] = 1;
    for (int s = 8; s < 12; ++s) q5.scales[s] = 1;
    q5.qs[32 * 3 + 2] = 0x3 << 4;  // element 64 * 3 + 32 + 2 = 226
    q5.qh[2] = 1 << 7;             // its fifth bit: bit 2 * 3 + 1
    q5.qh[9] = 1 << 2;             // element 64 * 1 + 9 = 73 gets 16
    dequantize_row(DType::Q5_K, &q5, y, QK_K);
    EXPECT_EQ(y[226], 16.0f + 3.0f);
    EXPECT_EQ(y[73], 16.0f);
    EXPECT_EQ(y[2], 0.0f);

    BlockQ6_K q6{};
    q6.d = f32_to_fp16(0.125f);
    for (int s = 0; s < 16; ++s) q6.scales[s] = static_cast<int8_t>(s - 8);
    // Element 128 + 64 + 20 = 212 (half 1, group 2, l = 20): ql[64 + 20] high nibble, qh[32 + 20] bits 4-5.
    q6.ql[64 + 20] = 0x5 << 4;
    q6.qh[32 + 20] = 2 << 4;
    dequantize_row(DType::Q6_K, &q6, y, QK_K);
    EXPECT_EQ(y[212], 0.125f * float(212 / 16 - 8) * float(0x5 + 32 - 32));
    EXPECT_EQ(y[0], 0.125f * -8 * -32);  // u = 0 everywhere else: (0 - 32) times sub-block 0's scale

    BlockQ2_K q2{};
    q2.d = f32_to_fp16(0.5f);
    q2.dmin = f32_to_fp16(0.25f);
    for (int s = 0; s < 16; ++s) q2.scales[s] = static_cast<uint8_t>((s % 16) | ((15 - s) << 4));
    // Element 128 + 64 + 17 = 209 (half 1, group 2, l = 17): bits 4-5 of qs[32 + 17]; sub-block 13.
    q2.qs[32 + 17] = 3 << 4;
    dequantize_row(DType::Q2_K, &q2, y, QK_K);
    EXPECT_EQ(y[209], 0.5f * 13 * 3 - 0.25f * 2);
    EXPECT_EQ(y[208], -0.25f * 2);  // u = 0 in the same sub-block
    EXPECT_EQ(y[17], -0.25f * 14);  // the same byte's bits 0-1 are element 17: 0

    BlockQ3_K q3{};
    q3.d = f32_to_fp16(2.0f);
    // Scale 9 (s >= 8: high nibble of byte 1, top bits at bit 4 of byte 9) = 0b10'0111 = 39: 39 - 32 = 7.
    q3.scales[1] = 0x7 << 4;
    q3.scales[9] = 2 << 4;
    // Element 151 = 128 + 16 + 7: sub-block 9, half 1, group 0, l = 23: bits 0-1 of qs[32 + 23]; third bit 4 of
    // hmask[23].
    q3.qs[32 + 23] = 2;
    q3.hmask[23] = 1 << 4;
    dequantize_row(DType::Q3_K, &q3, y, QK_K);
    EXPECT_EQ(y[151], 2.0f * 7 * 2);   // u = 2 + 4: (u - 4) = 2
    EXPECT_EQ(y[150], 2.0f * 7 * -4);  // third bit clear, low bits 0: -4
    EXPECT_EQ(y[0], 2.0f * -32 * -4);  // sub-block 0: scale bits all 0, -32

    // 32-element blocks: element 20 is the high nibble of qs[4], its fifth bit bit 20 of qh (byte 2, bit 4).
    BlockQ5_0 q50{};
    q50.d = f32_to_fp16(0.5f);
    q50.qs[4] = 0x3 << 4;
    q50.qh[2] = 1 << 4;
    dequantize_row(DType::Q5_0, &q50, y, 32);
    EXPECT_EQ(y[20], 0.5f * (3 + 16 - 16));
    EXPECT_EQ(y[4], 0.5f * -16);
    BlockQ5_1 q51{};
    q51.d = f32_to_fp16(0.5f);
    q51.m = f32_to_fp16(-1.0f);
    q51.qs[4] = 0x3 << 4;
    q51.qh[2] = 1 << 4;
    dequantize_row(DType::Q5_1, &q51, y, 32);
    EXPECT_EQ(y[20], 0.5f * 19 - 1.0f);
    BlockQ4_1 q41{};
    q41.d = f32_to_fp16(0.25f);
    q41.m = f32_to_fp16(2.0f);
    q41.qs[15] = 0xA1;  // element 15: 1, element 31: 10
    dequantize_row(DType::Q4_1, &q41, y, 32);
    EXPECT_EQ(y[15], 0.25f + 2.0f);
    EXPECT_EQ(y[31], 2.5f + 2.0f);
    BlockIQ4_NL nl{};
    nl.d = f32_to_fp16(0.5f);
    nl.qs[0] = 0xF0;  // element 0: entry 0 (-127), element 16: entry 15 (113)
    dequantize_row(DType::IQ4_NL, &nl, y, 32);
    EXPECT_EQ(y[0], 0.5f * -127);
    EXPECT_EQ(y[16], 0.5f * 113);
}

TEST(DType, Mxfp4MatchesTheOcpFormat) {
    // E8M0 exponent e scales E2M1 codes by 2^(e - 127): code 7 is 6 (0 11 1), code 1 is 0.5 (subnormal), code 8 -0,
    // code 15 is -6, code 4 is 2 (0 10 0).
    BlockMXFP4 b{};
    b.e = 130;        // x 8
    b.qs[0] = 0xF7;   // element 0: 7, element 16: 15
    b.qs[1] = 0x81;   // element 1: 1, element 17: 8
    b.qs[15] = 0x04;  // element 15: 4, element 31: 0
    float y[32];
    dequantize_row(DType::MXFP4, &b, y, 32);
    EXPECT_EQ(y[0], 48.0f);
    EXPECT_EQ(y[16], -48.0f);
    EXPECT_EQ(y[1], 4.0f);
    EXPECT_EQ(y[17], 0.0f);
    EXPECT_EQ(y[15], 16.0f);
    EXPECT_EQ(y[31], 0.0f);
    // The smallest exponents give subnormal scales (2^-127, 2^-128); 0.5 * 2^-127 = 2^-128 is itself subnormal.
    b.e = 0;
    dequantize_row(DType::MXFP4, &b, y, 32);
    EXPECT_EQ(y[1], std::ldexp(1.0f, -128));
    EXPECT_EQ(y[0], std::ldexp(6.0f, -127));
    b.e = 1;
    dequantize_row(DType::MXFP4, &b, y, 32);
    EXPECT_EQ(y[1], std::ldexp(1.0f, -127));
    b.e = 200;
    dequantize_row(DType::MXFP4, &b, y, 32);
    EXPECT_EQ(y[16], std::ldexp(-6.0f, 73));
    // Quantising: the largest magnitude 5 takes exponent floor(log2 5) - 2 = 0 (e = 127), where it rounds to 4 or
    // 6 (both 1 away); one exponent up (step 2 around 5) fits the others worse, so e stays 127.
    float x[32];
    constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, -4.0f};  // each exact at e = 127
    for (int j = 0; j < 32; ++j) x[j] = kE2m1[j % 8];
    x[5] = 5.0f;
    quantize_row(DType::MXFP4, x, &b, 32);
    EXPECT_EQ(b.e, 127);
    dequantize_row(DType::MXFP4, &b, y, 32);
    for (int j = 0; j < 32; ++j) {
        if (j != 5) {
            EXPECT_EQ(y[j], x[j]) << j;
        }
    }
    EXPECT_EQ(std::fabs(y[5] - 5.0f), 1.0f);
    // 7.9 clamps to 6 (error 1.9) at e = 127 and rounds to 8 (0.1) at e = 128: the exponent above OCP's wins.
    for (float &v : x) v = 7.9f;
    quantize_row(DType::MXFP4, x, &b, 32);
    EXPECT_EQ(b.e, 128);
    dequantize_row(DType::MXFP4, &b, y, 32);
    EXPECT_EQ(y[0], 8.0f);
    // An infinite element takes the largest exponent (and no signed overflow on the way: UBSan runs this).
    x[3] = std::numeric_limits<float>::infinity();
    quantize_row(DType::MXFP4, x, &b, 32);
    EXPECT_EQ(b.e, 254);
    // All zeros: exponent 0, codes 0.
    for (float &v : x) v = 0.0f;
    quantize_row(DType::MXFP4, x, &b, 32);
    EXPECT_EQ(b.e, 0);
    for (uint8_t q : b.qs) EXPECT_EQ(q, 0);
}

TEST(DType, KQuantDequantisersAgreeWithTheElementDecoder) {
    // Random bytes in every field (scales, mins, high bits), sane d: dequantize_row against ref::block_element,
    // which decodes each element on its own from the layout, in double.
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> byte(0, 255);
    for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K, DType::Q3_K,
                    DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS}) {
        const int64_t n = 3 * QK_K;
        std::vector<uint8_t> row(static_cast<size_t>(dtype_row_size(t, n)));
        for (auto &b : row) b = static_cast<uint8_t>(byte(rng));
        const int64_t block_bytes = dtype_info(t).type_size;
        for (int64_t b = 0; b < n / dtype_info(t).block_size; ++b) {
            uint8_t *blk = row.data() + b * block_bytes;
            const uint16_t d = f32_to_fp16(0.01f * float(b + 1)), dmin = f32_to_fp16(0.003f * float(b + 2));
            if (t == DType::MXFP4) {
                blk[0] = static_cast<uint8_t>(110 + b % 30);  // exponents 2^-17 .. 2^12
            } else if (t == DType::Q6_K) {
                std::memcpy(blk + offsetof(BlockQ6_K, d), &d, 2);
            } else if (t == DType::Q3_K) {
                std::memcpy(blk + offsetof(BlockQ3_K, d), &d, 2);
            } else if (t == DType::Q5_0 || t == DType::IQ4_NL || t == DType::IQ4_XS) {
                std::memcpy(blk, &d, 2);  // d first; the rest (qh or scales, qs) random
            } else if (t == DType::Q2_K) {
                std::memcpy(blk + offsetof(BlockQ2_K, d), &d, 2);
                std::memcpy(blk + offsetof(BlockQ2_K, dmin), &dmin, 2);
            } else {
                std::memcpy(blk, &d, 2);
                std::memcpy(blk + 2, &dmin, 2);
            }
        }
        std::vector<float> y(static_cast<size_t>(n));
        dequantize_row(t, row.data(), y.data(), n);
        for (int64_t e = 0; e < n; ++e) {
            const double want = ref::block_element(t, row.data(), e);
            ASSERT_NEAR(y[static_cast<size_t>(e)], want, 1e-6 * (std::fabs(want) + 1.0))
                << dtype_name(t) << " element " << e;
        }
    }
}

}  // namespace
}  // namespace sparrow
