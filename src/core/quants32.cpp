#include "core/quants32.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/kquants.h"

namespace sparrow {

namespace {

constexpr int kBlock = 32;

// The block's u (element j in the low nibble of byte j, j + 16 in the high one) and, for the 5-bit types, the
// fifth bits as the 32-bit qh.
void pack_nibbles(const int *u, uint8_t qs[16]) {
    for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((u[j] & 15) | (u[j + 16] & 15) << 4);
}
void pack_fifth_bits(const int *u, uint8_t qh[4]) {
    uint32_t bits = 0;
    for (int j = 0; j < kBlock; ++j) bits |= static_cast<uint32_t>((u[j] >> 4) & 1) << j;
    std::memcpy(qh, &bits, 4);
}
uint32_t fifth_bits(const uint8_t qh[4]) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    return bits;
}

// Q4_1 / Q5_1 (n_max 15 / 31): d = (max - min) / n_max, m = min, u = round((x - min) / d) as ggml's reference
// quantisers do it ((int)(v + 0.5f), clamped).
template <typename Block>
void quantize_min_max(const float *x, Block *y, int64_t n, int n_max) {
    for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
        const float lo = *std::min_element(x, x + kBlock), hi = *std::max_element(x, x + kBlock);
        const float d = (hi - lo) / float(n_max), id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_fp16(d);
        y[b].m = f32_to_fp16(lo);
        int u[kBlock];
        for (int j = 0; j < kBlock; ++j) u[j] = std::min(n_max, static_cast<int>((x[j] - lo) * id + 0.5f));
        pack_nibbles(u, y[b].qs);
        if constexpr (requires { y[b].qh; }) pack_fifth_bits(u, y[b].qh);
    }
}

}  // namespace

void quantize_row_q4_1(const float *x, BlockQ4_1 *y, int64_t n) { quantize_min_max(x, y, n, 15); }
void quantize_row_q5_1(const float *x, BlockQ5_1 *y, int64_t n) { quantize_min_max(x, y, n, 31); }

void quantize_row_q5_0(const float *x, BlockQ5_0 *y, int64_t n) {
    // As Q4_0 with 32 levels: the element of largest magnitude maps to -16.
    for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
        const float d = signed_absmax(x, kBlock) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_fp16(d);
        int u[kBlock];
        for (int j = 0; j < kBlock; ++j) u[j] = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
        pack_nibbles(u, y[b].qs);
        pack_fifth_bits(u, y[b].qh);
    }
}

void quantize_row_iq4_nl(const float *x, BlockIQ4_NL *y, int64_t n) {
    for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
        y[b].d = f32_to_fp16(signed_absmax(x, kBlock) / float(kIq4nlValues[0]));
        const float d = fp16_to_f32(y[b].d);
        int u[kBlock];
        for (int j = 0; j < kBlock; ++j) {
            const float v = d != 0.0f ? x[j] / d : 0.0f;
            int best = 0;
            for (int k = 1; k < 16; ++k) {
                if (std::fabs(v - float(kIq4nlValues[k])) < std::fabs(v - float(kIq4nlValues[best]))) best = k;
            }
            u[j] = best;
        }
        pack_nibbles(u, y[b].qs);
    }
}

float mxfp4_scale(uint8_t e) {
    // 2^(e - 128): the f32 exponent field e - 1 for e >= 2; below that the subnormals 2^-127 (bit 22) and 2^-128.
    const uint32_t bits = e >= 2 ? static_cast<uint32_t>(e - 1) << 23 : uint32_t(0x00200000) << e;
    return std::bit_cast<float>(bits);
}

namespace {

// Block x's elements as MXFP4 at shared exponent e: each element's nearest value of the code book (the first of
// two equally near), into u, and the squared error.
double mxfp4_fit(const float *x, int e, int *u) {
    const float d = mxfp4_scale(static_cast<uint8_t>(e));
    double err = 0.0;
    for (int j = 0; j < kBlock; ++j) {
        int best = 0;
        float best_err = std::fabs(x[j] - d * float(kMxfp4Values[0]));
        for (int k = 1; k < 16; ++k) {
            const float dist = std::fabs(x[j] - d * float(kMxfp4Values[k]));
            if (dist < best_err) best = k, best_err = dist;
        }
        u[j] = best;
        err += double(best_err) * double(best_err);
    }
    return err;
}

}  // namespace

void quantize_row_mxfp4(const float *x, BlockMXFP4 *y, int64_t n) {
    for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
        float amax = 0.0f;
        for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
        int u[kBlock] = {}, u_up[kBlock];
        int e = 0;
        if (amax > 0.0f) {
            // OCP's shared exponent: floor(log2(amax)) - 2 (E2M1's largest value is 1.5 * 2^2), stored + 127; the
            // largest element then lands in [4, 8) and clamps to 6 above 6. One exponent up keeps it in range at
            // a coarser step: take whichever fits the block better. 254 is E8M0's largest finite code.
            // An infinite element takes the largest exponent (ilogb(inf) is INT_MAX: no arithmetic on it).
            e = std::isfinite(amax) ? std::clamp(std::ilogb(amax) - 2 + 127, 0, 254) : 254;
            const double err = mxfp4_fit(x, e, u);
            if (e < 254 && mxfp4_fit(x, e + 1, u_up) < err) {
                e += 1;
                std::copy(u_up, u_up + kBlock, u);
            }
        }
        y[b].e = static_cast<uint8_t>(e);
        pack_nibbles(u, y[b].qs);
    }
}

namespace {

// The nibble of element j: byte j's low nibble for j < 16, byte j - 16's high nibble after.
int nibble(const uint8_t qs[16], int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

template <typename Block>
void dequantize_block32(const Block *x, float *y, int64_t n) {
    Block32Ints w;
    for (int64_t b = 0; b < n / kBlock; ++b, y += kBlock) {
        decode_block32(x[b], w);
        for (int j = 0; j < kBlock; ++j) y[j] = w.has_m ? float(w.v[j]) * w.d + w.m : float(w.v[j]) * w.d;
    }
}

}  // namespace

void decode_block32(const BlockQ4_1 &b, Block32Ints &w) {
    for (int j = 0; j < kBlock; ++j) w.v[j] = nibble(b.qs, j);
    w.d = fp16_to_f32(b.d), w.m = fp16_to_f32(b.m), w.has_m = true;
}
void decode_block32(const BlockQ5_0 &b, Block32Ints &w) {
    const uint32_t qh = fifth_bits(b.qh);
    for (int j = 0; j < kBlock; ++j) w.v[j] = (nibble(b.qs, j) | ((qh >> j) & 1) << 4) - 16;
    w.d = fp16_to_f32(b.d), w.m = 0.0f, w.has_m = false;
}
void decode_block32(const BlockQ5_1 &b, Block32Ints &w) {
    const uint32_t qh = fifth_bits(b.qh);
    for (int j = 0; j < kBlock; ++j) w.v[j] = nibble(b.qs, j) | ((qh >> j) & 1) << 4;
    w.d = fp16_to_f32(b.d), w.m = fp16_to_f32(b.m), w.has_m = true;
}
void decode_block32(const BlockIQ4_NL &b, Block32Ints &w) {
    for (int j = 0; j < kBlock; ++j) w.v[j] = kIq4nlValues[nibble(b.qs, j)];
    w.d = fp16_to_f32(b.d), w.m = 0.0f, w.has_m = false;
}
void decode_block32(const BlockMXFP4 &b, Block32Ints &w) {
    for (int j = 0; j < kBlock; ++j) w.v[j] = kMxfp4Values[nibble(b.qs, j)];
    w.d = mxfp4_scale(b.e), w.m = 0.0f, w.has_m = false;
}

// The dequantisers, in ggml's f32 operations: v * d + m (Q4_1, Q5_1), v * d (Q5_0, IQ4_NL, MXFP4; ggml's d * value
// is the same product).
void dequantize_row_q4_1(const BlockQ4_1 *x, float *y, int64_t n) { dequantize_block32(x, y, n); }
void dequantize_row_q5_0(const BlockQ5_0 *x, float *y, int64_t n) { dequantize_block32(x, y, n); }
void dequantize_row_q5_1(const BlockQ5_1 *x, float *y, int64_t n) { dequantize_block32(x, y, n); }
void dequantize_row_iq4_nl(const BlockIQ4_NL *x, float *y, int64_t n) { dequantize_block32(x, y, n); }
void dequantize_row_mxfp4(const BlockMXFP4 *x, float *y, int64_t n) { dequantize_block32(x, y, n); }

}  // namespace sparrow
