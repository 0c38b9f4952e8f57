// The portable level's K-quant products (Q2_K ... Q6_K weights; layouts in core/blocks.h) against Q8_K activations
// (one f32 scale dx per 256 values, and the sums of each 16). Within a super-block everything is an integer:
//   Q4_K / Q5_K: dx * (d * sum_s sc_s * sum(u x)_s - dmin * sum_s m_s * sum(x)_s)            sub-blocks of 32
//   Q2_K:        the same over sub-blocks of 16 (sc_s, m_s: 4 bits)
//   Q3_K, Q6_K:  dx * d * sum_s sc_s * (sum(u x)_s - offset * sum(x)_s), offset 4 or 32        sub-blocks of 16
// with the sums of x from the activations' bsums, and two f32 multiplies per super-block and token. The SIMD
// levels compute the same integers and may round the f32 accumulation in another order.
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/kquants.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu {

void stage_q8_k(const uint8_t *x, size_t x_stride, int n_tokens, int64_t k0, int64_t n, Q8KStaged *out) {
    const auto pair = [](int32_t lo, int32_t hi) {
        return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                    static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16);
    };
    for (int64_t k = 0; k < n; ++k) {
        for (int j = 0; j < n_tokens; ++j) {
            BlockQ8_K b;
            std::memcpy(&b, x + j * x_stride + (k0 + k) * static_cast<int64_t>(sizeof b), sizeof b);
            Q8KStaged &o = out[k * n_tokens + j];
            std::memcpy(o.qs, b.qs, QK_K);
            o.d = b.d;
            int32_t s32[8];
            for (int i = 0; i < 8; ++i) s32[i] = b.bsums[2 * i] + b.bsums[2 * i + 1];
            for (int q = 0; q < 2; ++q) {
                o.sums32_skip[2 * q] = pair(s32[4 * q], s32[4 * q + 2]);
                o.sums32_skip[2 * q + 1] = pair(s32[4 * q + 1], s32[4 * q + 3]);
            }
            for (int q = 0; q < 4; ++q) {
                o.sums16_adjacent[2 * q] = pair(b.bsums[4 * q], b.bsums[4 * q + 1]);
                o.sums16_adjacent[2 * q + 1] = pair(b.bsums[4 * q + 2], b.bsums[4 * q + 3]);
                o.sums16_skip[2 * q] = pair(b.bsums[4 * q], b.bsums[4 * q + 2]);
                o.sums16_skip[2 * q + 1] = pair(b.bsums[4 * q + 1], b.bsums[4 * q + 3]);
            }
        }
    }
}

}  // namespace sparrow::cpu

namespace sparrow::cpu::scalar {

namespace {

// Super-block i of token j's activation row (unaligned: copied out).
BlockQ8_K x_block(const void *x, size_t x_stride, int j, int64_t i) {
    BlockQ8_K b;
    std::memcpy(&b, static_cast<const uint8_t *>(x) + j * x_stride + i * static_cast<int64_t>(sizeof b), sizeof b);
    return b;
}

// Adds each token's dx * (d * sum_s sc_s * (sum(u x)_s - offset sum(x)_s) - dmin * sum_s m_s * sum(x)_s).
void accumulate(const KQuantInts &w, const void *x, size_t x_stride, int n_x, int64_t i, float *acc) {
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

template <typename Block>
void dot_tile_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const Block *>(w);
    float acc[kMaxTile] = {};
    KQuantInts b;  // decoded as the dequantisers decode it (core/kquants.h)
    for (int64_t i = 0; i < n / QK_K; ++i) {
        decode_kquant(blocks[i], b);
        accumulate(b, x, x_stride, n_x, i, acc);
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

// Rows packed eight to a record (BlockQ2_Kx8 ... BlockQ6_Kx8), in the order every level follows
// (dispatch.h): per row, token and super-block, the integer sums, then acc = fma(-float(msum), dmin * dx, acc)
// (not for Q3_K, Q6_K and IQ4_XS, which have no mins) and acc = fma(float(isum), d * dx, acc). The row's block is
// rebuilt from its lane of the record and decoded as the dequantisers decode it.
template <typename Block, typename Record>
void dot_rows_k8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                 float *y, size_t y_stride) {
    const int64_t nb = n / QK_K;
    for (int64_t g0 = 0; g0 < n_rows; g0 += 8) {
        const auto *rec = reinterpret_cast<const Record *>(static_cast<const uint8_t *>(w) + g0 * w_stride);
        for (int r = 0; r < 8; ++r) {
            float acc[kMaxQuantTile] = {};
            KQuantInts b;
            for (int64_t i = 0; i < nb; ++i) {
                Block blk;
                unpack_lane(rec[i], r, blk);
                decode_kquant(blk, b);
                const int len = QK_K / b.n_sub;
                for (int j = 0; j < n_x; ++j) {
                    const BlockQ8_K xb = x_block(x, x_stride, j, i);
                    int32_t isum = 0, msum = 0;
                    for (int s = 0; s < b.n_sub; ++s) {
                        int32_t sum_ux = 0, sum_x = 0;
                        for (int l = s * len; l < (s + 1) * len; ++l) sum_ux += b.u[l] * xb.qs[l];
                        for (int k = s * len / 16; k < (s + 1) * len / 16; ++k) sum_x += xb.bsums[k];
                        isum += b.sc[s] * (sum_ux - b.offset * sum_x);
                        msum += b.m[s] * sum_x;
                    }
                    if (b.has_mins) acc[j] = std::fma(-static_cast<float>(msum), b.dmin * xb.d, acc[j]);
                    acc[j] = std::fma(static_cast<float>(isum), b.d * xb.d, acc[j]);
                }
            }
            for (int j = 0; j < n_x; ++j) y[j * y_stride + static_cast<size_t>(g0 + r)] = acc[j];
        }
    }
}

}  // namespace

void dot_rows_q2_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    dot_rows_k8<BlockQ2_K, BlockQ2_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}
void dot_rows_q3_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    dot_rows_k8<BlockQ3_K, BlockQ3_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}
void dot_rows_q4_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    dot_rows_k8<BlockQ4_K, BlockQ4_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}
void dot_rows_q5_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    dot_rows_k8<BlockQ5_K, BlockQ5_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}
void dot_rows_q6_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    dot_rows_k8<BlockQ6_K, BlockQ6_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_rows_iq4_xsx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                       int64_t n, float *y, size_t y_stride) {
    dot_rows_k8<BlockIQ4_XS, BlockIQ4_XSx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

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
void dot_tile_iq4_xs(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_k<BlockIQ4_XS>(w, x, x_stride, n_x, n, out);
}

}  // namespace sparrow::cpu::scalar
