// The portable level's K-quant products (Q2_K ... Q6_K weights; layouts in core/blocks.h) against Q8_K activations
// (one f32 scale dx per 256 values, and the sums of each 16). Within a super-block everything is an integer:
//   Q4_K / Q5_K: dx * (d * sum_s sc_s * sum(u x)_s - dmin * sum_s m_s * sum(x)_s)            sub-blocks of 32
//   Q2_K:        the same over sub-blocks of 16 (sc_s, m_s: 4 bits)
//   Q3_K, Q6_K:  dx * d * sum_s sc_s * (sum(u x)_s - offset * sum(x)_s), offset 4 or 32        sub-blocks of 16
// with the sums of x from the activations' bsums, and two f32 multiplies per super-block and token. The SIMD
// levels compute the same integers and may round the f32 accumulation in another order.
#include <cstring>

#include "core/dtype.h"
#include "core/kquants.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::scalar {

namespace {

// Super-block i of token j's activation row (unaligned: copied out).
BlockQ8_K x_block(const void *x, size_t x_stride, int j, int64_t i) {
    BlockQ8_K b;
    std::memcpy(&b, static_cast<const uint8_t *>(x) + j * x_stride + i * static_cast<int64_t>(sizeof b), sizeof b);
    return b;
}

// One super-block of weights as integers: u[256], the scale and min (or 0) of each of its n_sub sub-blocks, the
// offset subtracted from every u (0, 4 or 32), and d, dmin.
struct IntBlock {
    int u[QK_K];
    int sc[16], m[16];
    int n_sub = 0, offset = 0;
    float d = 0.0f, dmin = 0.0f;
};

// Adds each token's dx * (d * sum_s sc_s * (sum(u x)_s - offset sum(x)_s) - dmin * sum_s m_s * sum(x)_s).
void accumulate(const IntBlock &w, const void *x, size_t x_stride, int n_x, int64_t i, float *acc) {
    const int len = QK_K / w.n_sub;
    for (int j = 0; j < n_x; ++j) {
        const BlockQ8_K xb = x_block(x, x_stride, j, i);
        int32_t dot = 0, mins = 0;
        for (int s = 0; s < w.n_sub; ++s) {
            int32_t sum_ux = 0, sum_x = 0;
            for (int l = s * len; l < (s + 1) * len; ++l) sum_ux += w.u[l] * xb.qs[l];
            for (int k = s * len / 16; k < (s + 1) * len / 16; ++k) sum_x += xb.bsums[k];
            dot += w.sc[s] * (sum_ux - w.offset * sum_x);
            mins += w.m[s] * sum_x;
        }
        acc[j] += xb.d * (w.d * float(dot) - w.dmin * float(mins));
    }
}

// Q2_K and Q3_K: element e = 128h + 32g + l keeps its low two bits at bits 2g of qs[32h + l].
int two_bits(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3; }

// Q4_K and Q5_K (Block::qh only in Q5_K: HighBits).
template <typename Block, bool HighBits>
void unpack_min_max(const Block &b, IntBlock &w) {
    w.n_sub = 8;
    w.d = fp16_to_f32(b.d);
    w.dmin = fp16_to_f32(b.dmin);
    for (int s = 0; s < 8; ++s) kquant_scale_min(b.scales, s, w.sc[s], w.m[s]);
    for (int c = 0; c < 4; ++c) {
        for (int l = 0; l < 32; ++l) {
            w.u[64 * c + l] = b.qs[32 * c + l] & 15;
            w.u[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
            if constexpr (HighBits) {
                w.u[64 * c + l] |= ((b.qh[l] >> (2 * c)) & 1) << 4;
                w.u[64 * c + 32 + l] |= ((b.qh[l] >> (2 * c + 1)) & 1) << 4;
            }
        }
    }
}

void unpack(const BlockQ4_K &b, IntBlock &w) { unpack_min_max<BlockQ4_K, false>(b, w); }
void unpack(const BlockQ5_K &b, IntBlock &w) { unpack_min_max<BlockQ5_K, true>(b, w); }

void unpack(const BlockQ2_K &b, IntBlock &w) {
    w.n_sub = 16;
    w.d = fp16_to_f32(b.d);
    w.dmin = fp16_to_f32(b.dmin);
    for (int s = 0; s < 16; ++s) w.sc[s] = b.scales[s] & 15, w.m[s] = b.scales[s] >> 4;
    for (int e = 0; e < QK_K; ++e) w.u[e] = two_bits(b.qs, e);
}

void unpack(const BlockQ3_K &b, IntBlock &w) {
    w.n_sub = 16;
    w.offset = 4;
    w.d = fp16_to_f32(b.d);
    for (int s = 0; s < 16; ++s) w.sc[s] = q3_k_scale(b.scales, s), w.m[s] = 0;
    for (int e = 0; e < QK_K; ++e) w.u[e] = two_bits(b.qs, e) | ((b.hmask[e % 32] >> (e / 32)) & 1) << 2;
}

void unpack(const BlockQ6_K &b, IntBlock &w) {
    w.n_sub = 16;
    w.offset = 32;
    w.d = fp16_to_f32(b.d);
    for (int s = 0; s < 16; ++s) w.sc[s] = b.scales[s], w.m[s] = 0;
    for (int h = 0; h < 2; ++h) {
        const uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
        int *uh = w.u + 128 * h;
        for (int l = 0; l < 32; ++l) {
            uh[l] = (ql[l] & 15) | (qh[l] & 3) << 4;
            uh[l + 32] = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4;
            uh[l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
            uh[l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
        }
    }
}

template <typename Block>
void dot_tile_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const Block *>(w);
    float acc[kMaxTile] = {};
    IntBlock b;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        unpack(blocks[i], b);
        accumulate(b, x, x_stride, n_x, i, acc);
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

}  // namespace

void dot_tile_q2_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_k<BlockQ2_K>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q3_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_k<BlockQ3_K>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q4_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_k<BlockQ4_K>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q5_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_k<BlockQ5_K>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q6_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_k<BlockQ6_K>(w, x, x_stride, n_x, n, out);
}

}  // namespace sparrow::cpu::scalar
