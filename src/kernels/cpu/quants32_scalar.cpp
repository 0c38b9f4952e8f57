// The portable level's products of the other 32-element block types (Q4_1, Q5_0, Q5_1, IQ4_NL; core/blocks.h)
// against the Q8_0 dot-x activations (dispatch.h). A weight block meets one activation block:
//   Q4_1 / Q5_1: dx * (d * sum(u x) + m * sum(x));  Q5_0: dx * d * (sum(u x) - 16 sum(x));
//   IQ4_NL:      dx * d * sum(value(u) x)
// with the integer sums exact and one f32 accumulation per block and token.
#include <cstring>

#include "core/dtype.h"
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

// A weight block as its 32 integer values v (u, or the code book's value), its scale d and its offset m per
// unit of sum(x): the block's dot is d * sum(v x) + m * sum(x).
struct WBlock {
    int v[32];
    float d, m;
};

uint32_t fifth_bits(const uint8_t qh[4]) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    return bits;
}

void unpack(const BlockQ4_1 &w, WBlock &o) {
    for (int j = 0; j < 16; ++j) o.v[j] = w.qs[j] & 15, o.v[j + 16] = w.qs[j] >> 4;
    o.d = fp16_to_f32(w.d);
    o.m = fp16_to_f32(w.m);
}
void unpack(const BlockQ5_1 &w, WBlock &o) {
    const uint32_t qh = fifth_bits(w.qh);
    for (int j = 0; j < 32; ++j) o.v[j] = (j < 16 ? w.qs[j] & 15 : w.qs[j - 16] >> 4) | ((qh >> j) & 1) << 4;
    o.d = fp16_to_f32(w.d);
    o.m = fp16_to_f32(w.m);
}
void unpack(const BlockQ5_0 &w, WBlock &o) {
    const uint32_t qh = fifth_bits(w.qh);
    for (int j = 0; j < 32; ++j) o.v[j] = (j < 16 ? w.qs[j] & 15 : w.qs[j - 16] >> 4) | ((qh >> j) & 1) << 4;
    o.d = fp16_to_f32(w.d);
    o.m = -16.0f * o.d;
}
void unpack(const BlockIQ4_NL &w, WBlock &o) {
    for (int j = 0; j < 16; ++j) o.v[j] = kIq4nlValues[w.qs[j] & 15], o.v[j + 16] = kIq4nlValues[w.qs[j] >> 4];
    o.d = fp16_to_f32(w.d);
    o.m = 0.0f;
}

template <typename Block>
void dot_tile_block32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const Block *>(w);
    float acc[kMaxTile] = {};
    WBlock wb;
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        unpack(blocks[b], wb);
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

}  // namespace sparrow::cpu::scalar
