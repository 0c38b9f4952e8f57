// The portable level's products of the other 32-element block types (Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4; blocks.h)
// against the Q8_0 dot-x activations (dispatch.h). A weight block meets one activation block:
//   dx * (d * sum(v x) + m * sum(x)), v the block's integers (core/quants32.h Block32Ints; m = 0 for Q5_0,
//   IQ4_NL and MXFP4)
// with the integer sums exact and one f32 accumulation per block and token.
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/quants32.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::scalar {

namespace {

// Block b of token j's activations: quants, scale, sum.
struct XBlock {
    const int8_t *q;
    float d;
    int32_t sum;
};
XBlock x_block(const void *x, int64_t n, int64_t b) {
    const auto *base = static_cast<const uint8_t *>(x);
    const int64_t nb = n / QK8_0;
    XBlock xb{reinterpret_cast<const BlockQ8_0 *>(base)[b].qs, 0.0f, 0};
    std::memcpy(&xb.d, base + nb * static_cast<int64_t>(sizeof(BlockQ8_0)) + b * 4, 4);
    std::memcpy(&xb.sum, base + nb * static_cast<int64_t>(sizeof(BlockQ8_0) + 4) + b * 4, 4);
    xb.sum /= 128;
    return xb;
}

template <typename Block>
void dot_tile_block32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const Block *>(w);
    float acc[kMaxTile] = {};
    Block32Ints wb;  // decoded as the dequantisers decode it (core/quants32.h)
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        decode_block32(blocks[b], wb);
        for (int j = 0; j < n_x; ++j) {
            const XBlock xb = x_block(static_cast<const uint8_t *>(x) + j * x_stride, n, b);
            int32_t isum = 0;
            for (int l = 0; l < 32; ++l) isum += wb.v[l] * xb.q[l];
            acc[j] += xb.d * (wb.d * float(isum) + wb.m * float(xb.sum));
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

}  // namespace

void dot_tile_q4_1(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockQ4_1>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q5_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockQ5_0>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q5_1(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockQ5_1>(w, x, x_stride, n_x, n, out);
}
void dot_tile_iq4_nl(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockIQ4_NL>(w, x, x_stride, n_x, n, out);
}
void dot_tile_mxfp4(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockMXFP4>(w, x, x_stride, n_x, n, out);
}

void dot_rows_mxfp4x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                      int64_t n, float *y, size_t y_stride) {
    // The packed rows' order (dispatch.h): per row and token, acc = fma(float(sum(v * x)), dw * dx, acc) block by
    // block, with v the code book's values (the SIMD levels reach the same integer as sum((v + 12) x) - 12 sum(x)).
    const int64_t nb = n / QK8_0;
    constexpr int kHalf = QK8_0 / 2;
    for (int64_t g0 = 0; g0 < n_rows; g0 += 8) {
        const auto *rec = reinterpret_cast<const BlockMXFP4x8 *>(static_cast<const uint8_t *>(w) + g0 * w_stride);
        for (int j = 0; j < n_x; ++j) {
            const void *xj = static_cast<const uint8_t *>(x) + j * x_stride;
            float acc[8] = {};
            for (int64_t b = 0; b < nb; ++b) {
                const XBlock xb = x_block(xj, n, b);
                for (int r = 0; r < 8; ++r) {
                    int32_t isum = 0;
                    for (int k = 0; k < kHalf; ++k) {
                        const uint8_t byte = rec[b].qs[(k / 4) * 32 + r * 4 + k % 4];
                        isum += kMxfp4Values[byte & 15] * int32_t(xb.q[k]) +
                                kMxfp4Values[byte >> 4] * int32_t(xb.q[k + kHalf]);
                    }
                    acc[r] = std::fma(static_cast<float>(isum), mxfp4_scale(rec[b].e[r]) * xb.d, acc[r]);
                }
            }
            for (int r = 0; r < 8; ++r) y[j * y_stride + static_cast<size_t>(g0 + r)] = acc[r];
        }
    }
}

}  // namespace sparrow::cpu::scalar
