#include "core/quants32.h"

#include <algorithm>
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

// The dequantisers, in ggml's f32 operations: v * d + m (Q4_1, Q5_1), v * d (Q5_0, IQ4_NL; ggml's d * value is
// the same product).
void dequantize_row_q4_1(const BlockQ4_1 *x, float *y, int64_t n) { dequantize_block32(x, y, n); }
void dequantize_row_q5_0(const BlockQ5_0 *x, float *y, int64_t n) { dequantize_block32(x, y, n); }
void dequantize_row_q5_1(const BlockQ5_1 *x, float *y, int64_t n) { dequantize_block32(x, y, n); }
void dequantize_row_iq4_nl(const BlockIQ4_NL *x, float *y, int64_t n) { dequantize_block32(x, y, n); }

}  // namespace sparrow
