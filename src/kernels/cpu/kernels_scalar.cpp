// The portable level of the kernel table: plain C++ for CPUs without AVX2 (and the baseline every other
// level is checked against alongside the double-precision references in kernels/ref). Written so the
// compiler can keep several independent accumulators and vectorise with whatever the baseline target has;
// results are the same sums as the SIMD levels up to f32 rounding order.
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::scalar {

namespace {

// Lanes of independent partial sums: breaks the add dependency chain and maps onto SIMD registers.
constexpr int kLanes = 8;

// out[j] = w . x_j over n elements; the weight element is converted once and used for every token.
template <typename W, typename Convert>
void dot_tile_float(const W *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out, Convert convert) {
    const float *xs[kMaxTile];
    for (int j = 0; j < n_x; ++j)
        xs[j] = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x) + j * x_stride);
    float acc[kMaxTile][kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        float wl[kLanes];
        for (int l = 0; l < kLanes; ++l) wl[l] = convert(w[i + l]);
        for (int j = 0; j < n_x; ++j) {
            for (int l = 0; l < kLanes; ++l) acc[j][l] += wl[l] * xs[j][i + l];
        }
    }
    for (int j = 0; j < n_x; ++j) {
        float sum = 0.0f;
        for (int l = 0; l < kLanes; ++l) sum += acc[j][l];
        for (int64_t k = i; k < n; ++k) sum += convert(w[k]) * xs[j][k];
        out[j] = sum;
    }
}

// Integer dot of one 32-block of weights (as int8 values) with a Q8_0 activation block.
inline int32_t block_dot(const int8_t *qw, const int8_t *qx) {
    int32_t sum = 0;
    for (int k = 0; k < QK8_0; ++k) sum += int32_t(qw[k]) * int32_t(qx[k]);
    return sum;
}

// Shared body of the Q8_0 and Q4_0 kernels: `unpack` writes a weight block's 32 values as int8 and
// returns its scale.
template <typename Block, typename Unpack>
void dot_tile_quant(const Block *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out, Unpack unpack) {
    const BlockQ8_0 *xs[kMaxQuantTile];
    for (int j = 0; j < n_x; ++j) {
        xs[j] = reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + j * x_stride);
    }
    float acc[kMaxQuantTile] = {};
    int8_t qw[QK8_0];
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        const float dw = unpack(w[b], qw);
        for (int j = 0; j < n_x; ++j) {
            acc[j] += dw * fp16_to_f32(xs[j][b].d) * static_cast<float>(block_dot(qw, xs[j][b].qs));
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

}  // namespace

void dot_tile_f32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float(static_cast<const float *>(w), x, x_stride, n_x, n, out, [](float v) { return v; });
}

void dot_tile_f16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float(static_cast<const uint16_t *>(w), x, x_stride, n_x, n, out, fp16_to_f32);
}

void dot_tile_bf16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float(static_cast<const uint16_t *>(w), x, x_stride, n_x, n, out, bf16_to_f32);
}

void dot_tile_q8_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_quant(static_cast<const BlockQ8_0 *>(w), x, x_stride, n_x, n, out, [](const BlockQ8_0 &b, int8_t *q) {
        std::memcpy(q, b.qs, QK8_0);
        return fp16_to_f32(b.d);
    });
}

void dot_rows_q8_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    // The order every level follows (dispatch.h): per row and token, acc = fma(float(block's integer dot),
    // dw * dx, acc) over the blocks in turn, from 0. std::fma rounds once, as the SIMD fma does.
    const int64_t nb = n / QK8_0;
    const size_t dx_offset = static_cast<size_t>(nb) * sizeof(BlockQ8_0);  // the f32 scales after the blocks
    for (int64_t g0 = 0; g0 < n_rows; g0 += 8) {
        const auto *rec = reinterpret_cast<const BlockQ8_0x8 *>(static_cast<const uint8_t *>(w) + g0 * w_stride);
        for (int j = 0; j < n_x; ++j) {
            const uint8_t *xj = static_cast<const uint8_t *>(x) + j * x_stride;
            const auto *xb = reinterpret_cast<const BlockQ8_0 *>(xj);
            float acc[8] = {};
            for (int64_t b = 0; b < nb; ++b) {
                float dx;
                std::memcpy(&dx, xj + dx_offset + static_cast<size_t>(b) * sizeof(float), sizeof dx);
                for (int r = 0; r < 8; ++r) {
                    int32_t isum = 0;
                    for (int k = 0; k < QK8_0; ++k)
                        isum += int32_t(rec[b].qs[(k / 4) * 32 + r * 4 + k % 4]) * int32_t(xb[b].qs[k]);
                    acc[r] = std::fma(static_cast<float>(isum), fp16_to_f32(rec[b].d[r]) * dx, acc[r]);
                }
            }
            for (int r = 0; r < 8; ++r) y[j * y_stride + static_cast<size_t>(g0 + r)] = acc[r];
        }
    }
}

void dot_rows_q4_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    // As dot_rows_q8_0x8: per row and token, acc = fma(float(sum((u - 8) * x)), dw * dx, acc) block by block.
    // Activations are BlockQ8_0x2 records (block b: record b / 2, half b % 2 of lo / hi, scale d[b % 2]).
    const int64_t nb = n / QK4_0;
    constexpr int kHalf = QK4_0 / 2;
    for (int64_t g0 = 0; g0 < n_rows; g0 += 8) {
        const auto *rec = reinterpret_cast<const BlockQ4_0x8 *>(static_cast<const uint8_t *>(w) + g0 * w_stride);
        for (int j = 0; j < n_x; ++j) {
            const auto *xr = reinterpret_cast<const BlockQ8_0x2 *>(static_cast<const uint8_t *>(x) + j * x_stride);
            float acc[8] = {};
            for (int64_t b = 0; b < nb; ++b) {
                const BlockQ8_0x2 &r = xr[b / 2];
                const int h = static_cast<int>(b % 2);
                for (int row = 0; row < 8; ++row) {
                    int32_t isum = 0;
                    for (int k = 0; k < kHalf; ++k) {
                        const uint8_t byte = rec[b].qs[(k / 4) * 32 + row * 4 + k % 4];
                        isum += (int32_t(byte & 15) - 8) * int32_t(r.lo[h * kHalf + k]) +
                                (int32_t(byte >> 4) - 8) * int32_t(r.hi[h * kHalf + k]);
                    }
                    acc[row] = std::fma(static_cast<float>(isum), fp16_to_f32(rec[b].d[row]) * r.d[h], acc[row]);
                }
            }
            for (int row = 0; row < 8; ++row) y[j * y_stride + static_cast<size_t>(g0 + row)] = acc[row];
        }
    }
}

void dot_tile_q4_0(const void *wv, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    // Activations are BlockQ8_0x2 records (core/blocks.h): the nibbles u = value + 8 multiply unsigned and
    // each block's -8 * sum(x) comes from the record (sums hold 2 * sum). The same integer per block, so the
    // same f32 result as unpacking signed values; this level reads the layout the SIMD levels read.
    const auto *w = static_cast<const BlockQ4_0 *>(wv);
    const int64_t nb = n / QK4_0;
    constexpr int kHalf = QK4_0 / 2;
    float acc[kMaxQuantTile] = {};
    for (int64_t b = 0; b < nb; ++b) {
        const float dw = fp16_to_f32(w[b].d);
        const int h = static_cast<int>(b % 2);  // which block of its record
        for (int j = 0; j < n_x; ++j) {
            const auto *r =
                reinterpret_cast<const BlockQ8_0x2 *>(static_cast<const uint8_t *>(x) + j * x_stride) + b / 2;
            int32_t isum = 0;
            for (int k = 0; k < kHalf; ++k) {
                isum +=
                    int32_t(w[b].qs[k] & 15) * r->lo[h * kHalf + k] + int32_t(w[b].qs[k] >> 4) * r->hi[h * kHalf + k];
            }
            acc[j] += dw * r->d[h] * static_cast<float>(isum - 4 * r->sums[4 * h]);
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = acc[j];
}

void axpy_f32(const void *row, float a, float *y, int64_t n) {
    const float *r = static_cast<const float *>(row);
    for (int64_t i = 0; i < n; ++i) y[i] += a * r[i];
}

void axpy_f16(const void *row, float a, float *y, int64_t n) {
    const uint16_t *r = static_cast<const uint16_t *>(row);
    for (int64_t i = 0; i < n; ++i) y[i] += a * fp16_to_f32(r[i]);
}

void axpy_bf16(const void *row, float a, float *y, int64_t n) {
    const uint16_t *r = static_cast<const uint16_t *>(row);
    for (int64_t i = 0; i < n; ++i) y[i] += a * bf16_to_f32(r[i]);
}

void quantize_row_q8_0(const float *x, BlockQ8_0 *y, int64_t n) { quantize_row(DType::Q8_0, x, y, n); }

void to_f32_f16(const void *row, float *y, int64_t n) {
    const auto *h = static_cast<const uint16_t *>(row);
    for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_f32(h[i]);
}

void to_f32_bf16(const void *row, float *y, int64_t n) {
    const auto *h = static_cast<const uint16_t *>(row);
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(h[i]);
}

void from_f32_f16(const float *x, void *row, int64_t n) {
    auto *h = static_cast<uint16_t *>(row);
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(x[i]);
}

void rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps) {
    // Eight independent double partial sums (the compiler vectorises them without reassociating).
    constexpr int kLanes = 8;
    double lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) lanes[l] += double(x[i + l]) * double(x[i + l]);
    }
    double sum = 0.0;
    for (int l = 0; l < kLanes; ++l) sum += lanes[l];
    for (; i < n; ++i) sum += double(x[i]) * double(x[i]);
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / double(n) + eps));
    for (int64_t k = 0; k < n; ++k) y[k] = w ? x[k] * scale * w[k] : x[k] * scale;
}

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void hadamard_row(float *x, int64_t n, float norm) {
    // Butterflies of span len over blocks of 2*len: H_2m = [[H_m, H_m], [H_m, -H_m]] (Sylvester order).
    for (int64_t len = 1; len < n; len *= 2) {
        for (int64_t i = 0; i < n; i += 2 * len) {
            for (int64_t j = i; j < i + len; ++j) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
        }
    }
    for (int64_t i = 0; i < n; ++i) x[i] *= norm;
}

}  // namespace sparrow::cpu::scalar
