// The portable level's K-quant products (Q2_K ... Q6_K weights; layouts in core/blocks.h) against Q8_0
// activations in the dot-x row of Q8_0 weights (dispatch.h: the blocks, then their scales as f32, then
// 128 x each block's sum). Every 32-element activation block meets one Q4_K / Q5_K sub-block (one scale and
// min) or two Q2_K / Q3_K / Q6_K sub-blocks of 16, so a sub-block's dot is an integer sum:
//   Q4_K / Q5_K: dx * (d * (sc * sum(u x)) - dmin * (m * sum(x)))
//   Q2_K:        dx * (d * (sc_0 * sum_{l<16} u x + sc_1 * sum_{l>=16} u x) - dmin * (m_0 * sum_{l<16} x + ...))
//   Q3_K, Q6_K:  dx * d * (sc_0 * sum_{l<16} v x + sc_1 * sum_{l>=16} v x), v = u - 4 or u - 32
// with the integer products in int32 (at most 63 * 31 * 127 * 32 and 2 * 128 * 63 * 127 * 16) and one f32
// accumulation per sub-block and token. The SIMD levels compute the same integers in another f32 order.
#include <cstring>

#include "core/dtype.h"
#include "core/kquants.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::scalar {

namespace {

// Token j's activations: the quantised blocks, and each block's scale as f32 and its sum.
struct XRow {
    const BlockQ8_0 *blocks;
    const uint8_t *scales;  // f32, unaligned
    const uint8_t *sums;    // int32 (128 x the block's sum), unaligned

    XRow(const void *x, int64_t n)
        : blocks(static_cast<const BlockQ8_0 *>(x)),
          scales(static_cast<const uint8_t *>(x) + n / QK8_0 * static_cast<int64_t>(sizeof(BlockQ8_0))),
          sums(scales + n / QK8_0 * static_cast<int64_t>(sizeof(float))) {}
    float scale(int64_t b) const {
        float d;
        std::memcpy(&d, scales + b * 4, 4);
        return d;
    }
    int32_t sum(int64_t b) const {
        int32_t s;
        std::memcpy(&s, sums + b * 4, 4);
        return s / 128;
    }
};

// One Q4_K / Q5_K super-block as u[256], the sub-blocks' scales and mins, d and dmin.
struct MinMaxBlock {
    uint8_t u[QK_K];
    int sc[8], m[8];
    float d, dmin;
};

// Q4_K and Q5_K (Block::qh only in Q5_K: HighBits).
template <typename Block, bool HighBits>
void unpack(const Block &w, MinMaxBlock &o) {
    o.d = fp16_to_f32(w.d);
    o.dmin = fp16_to_f32(w.dmin);
    for (int s = 0; s < 8; ++s) kquant_scale_min(w.scales, s, o.sc[s], o.m[s]);
    for (int c = 0; c < 4; ++c) {
        for (int l = 0; l < 32; ++l) {
            o.u[64 * c + l] = w.qs[32 * c + l] & 15;
            o.u[64 * c + 32 + l] = w.qs[32 * c + l] >> 4;
            if constexpr (HighBits) {
                o.u[64 * c + l] |= static_cast<uint8_t>(((w.qh[l] >> (2 * c)) & 1) << 4);
                o.u[64 * c + 32 + l] |= static_cast<uint8_t>(((w.qh[l] >> (2 * c + 1)) & 1) << 4);
            }
        }
    }
}

template <typename Block, bool HighBits>
void dot_tile_min_max(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const Block *>(w);
    float acc[kMaxTile] = {};
    MinMaxBlock b;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        unpack<Block, HighBits>(blocks[i], b);
        for (int j = 0; j < n_x; ++j) {
            const XRow xr(static_cast<const uint8_t *>(x) + j * x_stride, n);
            for (int s = 0; s < 8; ++s) {
                const int64_t xb = i * 8 + s;
                const int8_t *qx = xr.blocks[xb].qs;
                int32_t isum = 0;
                for (int l = 0; l < 32; ++l) isum += int32_t(b.u[32 * s + l]) * qx[l];
                acc[j] += xr.scale(xb) * (b.d * float(b.sc[s] * isum) - b.dmin * float(b.m[s] * xr.sum(xb)));
            }
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

// Q3_K and Q6_K: one super-block of signed values v[256] in sub-blocks of 16 with integer scales sc[16] and d,
// added to each token's accumulator: dx * d * (sc_2s * sum_{l<16} v x + sc_2s+1 * sum_{l>=16} v x) per block s.
void accumulate_signed16(const int8_t *v, const int *sc, float d, int64_t i, const void *x, size_t x_stride, int n_x,
                         int64_t n, float *acc) {
    for (int j = 0; j < n_x; ++j) {
        const XRow xr(static_cast<const uint8_t *>(x) + j * x_stride, n);
        for (int s = 0; s < 8; ++s) {
            const int64_t xb = i * 8 + s;
            const int8_t *qx = xr.blocks[xb].qs;
            int32_t dot[2] = {0, 0};
            for (int l = 0; l < 32; ++l) dot[l / 16] += int32_t(v[32 * s + l]) * qx[l];
            acc[j] += xr.scale(xb) * (d * float(sc[2 * s] * dot[0] + sc[2 * s + 1] * dot[1]));
        }
    }
}

// Q2_K and Q3_K: element e = 128h + 32g + l keeps its low two bits at bits 2g of qs[32h + l].
int two_bits(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3; }

}  // namespace

void dot_tile_q4_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_min_max<BlockQ4_K, false>(w, x, x_stride, n_x, n, out);
}

void dot_tile_q5_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_min_max<BlockQ5_K, true>(w, x, x_stride, n_x, n, out);
}

void dot_tile_q2_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const BlockQ2_K *>(w);
    float acc[kMaxTile] = {};
    uint8_t u[QK_K];
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const BlockQ2_K &b = blocks[i];
        for (int e = 0; e < QK_K; ++e) u[e] = static_cast<uint8_t>(two_bits(b.qs, e));
        const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
        for (int j = 0; j < n_x; ++j) {
            const XRow xr(static_cast<const uint8_t *>(x) + j * x_stride, n);
            for (int s = 0; s < 8; ++s) {
                const int64_t xb = i * 8 + s;
                const int8_t *qx = xr.blocks[xb].qs;
                int32_t dot[2] = {0, 0}, sum[2] = {0, 0};
                for (int l = 0; l < 32; ++l) {
                    dot[l / 16] += int32_t(u[32 * s + l]) * qx[l];
                    sum[l / 16] += qx[l];
                }
                const int sc0 = b.scales[2 * s], sc1 = b.scales[2 * s + 1];
                acc[j] += xr.scale(xb) * (d * float((sc0 & 15) * dot[0] + (sc1 & 15) * dot[1]) -
                                          dmin * float((sc0 >> 4) * sum[0] + (sc1 >> 4) * sum[1]));
            }
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

void dot_tile_q3_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const BlockQ3_K *>(w);
    float acc[kMaxTile] = {};
    int8_t v[QK_K];  // u - 4
    int sc[16];
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const BlockQ3_K &b = blocks[i];
        for (int e = 0; e < QK_K; ++e) {
            v[e] = static_cast<int8_t>(two_bits(b.qs, e) - ((b.hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4));
        }
        for (int s = 0; s < 16; ++s) sc[s] = q3_k_scale(b.scales, s);
        accumulate_signed16(v, sc, fp16_to_f32(b.d), i, x, x_stride, n_x, n, acc);
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

void dot_tile_q6_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const BlockQ6_K *>(w);
    float acc[kMaxTile] = {};
    int8_t v[QK_K];  // u - 32
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const BlockQ6_K &b = blocks[i];
        for (int h = 0; h < 2; ++h) {
            const uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
            int8_t *vh = v + 128 * h;
            for (int l = 0; l < 32; ++l) {
                vh[l] = static_cast<int8_t>(((ql[l] & 15) | (qh[l] & 3) << 4) - 32);
                vh[l + 32] = static_cast<int8_t>(((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
                vh[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
                vh[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
            }
        }
        int sc[16];
        for (int s = 0; s < 16; ++s) sc[s] = b.scales[s];
        accumulate_signed16(v, sc, fp16_to_f32(b.d), i, x, x_stride, n_x, n, acc);
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

}  // namespace sparrow::cpu::scalar
