#include "kernels/ref/ref_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace sparrow::ref {

// --- dot products
// ---------------------------------------------------------------------------------------------

float dot_f32_f32(const float *w, const float *x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(w[i]) * double(x[i]);
    return float(sum);
}

float dot_f16_f32(const uint16_t *w, const float *x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(fp16_to_f32(w[i])) * double(x[i]);
    return float(sum);
}

float dot_bf16_f32(const uint16_t *w, const float *x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(bf16_to_f32(w[i])) * double(x[i]);
    return float(sum);
}

float dot_q8_0_q8_0(const BlockQ8_0 *w, const BlockQ8_0 *x, int64_t n) {
    double sum = 0.0;
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        int32_t isum = 0;
        for (int k = 0; k < QK8_0; ++k) isum += int32_t(w[b].qs[k]) * int32_t(x[b].qs[k]);
        // ggml multiplies the two scales in f32 before scaling the block's integer sum.
        const float d = fp16_to_f32(w[b].d) * fp16_to_f32(x[b].d);
        sum += double(d) * double(isum);
    }
    return float(sum);
}

float dot_q4_0_q8_0(const BlockQ4_0 *w, const BlockQ8_0 *x, int64_t n) {
    double sum = 0.0;
    for (int64_t b = 0; b < n / QK4_0; ++b) {
        int32_t isum = 0;
        for (int k = 0; k < QK4_0 / 2; ++k) {
            isum += ((w[b].qs[k] & 15) - 8) * int32_t(x[b].qs[k]);
            isum += ((w[b].qs[k] >> 4) - 8) * int32_t(x[b].qs[k + QK4_0 / 2]);
        }
        const float d = fp16_to_f32(w[b].d) * fp16_to_f32(x[b].d);
        sum += double(d) * double(isum);
    }
    return float(sum);
}

double block_element(DType t, const void *row, int64_t e) {
    const int64_t b = e / QK_K, i = e % QK_K;
    const auto scale_min = [](const uint8_t *scales, int64_t s, int &sc, int &m) {
        // Scales 0-3 and mins 0-3 are the low 6 bits of bytes 0-7; scales and mins 4-7 put their low 4 bits in
        // bytes 8-11 (scale low nibble, min high nibble) and their top 2 bits in the top bits of bytes 0-7.
        if (s < 4) {
            sc = scales[s] % 64;
            m = scales[s + 4] % 64;
        } else {
            sc = scales[s + 4] % 16 + scales[s - 4] / 64 * 16;
            m = scales[s + 4] / 16 + scales[s] / 64 * 16;
        }
    };
    if (t == DType::Q4_K || t == DType::Q5_K) {
        const int64_t chunk = i / 64, l = i % 32;
        const bool high = i % 64 >= 32;
        const uint8_t *scales, *qs;
        uint16_t d16, dmin16;
        int u;
        if (t == DType::Q4_K) {
            const auto &blk = static_cast<const BlockQ4_K *>(row)[b];
            scales = blk.scales, qs = blk.qs, d16 = blk.d, dmin16 = blk.dmin;
            u = high ? qs[32 * chunk + l] / 16 : qs[32 * chunk + l] % 16;
        } else {
            const auto &blk = static_cast<const BlockQ5_K *>(row)[b];
            scales = blk.scales, qs = blk.qs, d16 = blk.d, dmin16 = blk.dmin;
            u = (high ? qs[32 * chunk + l] / 16 : qs[32 * chunk + l] % 16) +
                16 * ((blk.qh[l] >> (2 * chunk + (high ? 1 : 0))) & 1);
        }
        int sc, m;
        scale_min(scales, 2 * chunk + (high ? 1 : 0), sc, m);
        return double(fp16_to_f32(d16)) * sc * u - double(fp16_to_f32(dmin16)) * m;
    }
    if (t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::IQ4_NL || t == DType::MXFP4) {
        // 32-element blocks: element j < 16 is the low nibble of qs[j], element j >= 16 the high nibble of
        // qs[j - 16]; Q5_*: plus 16 times bit j of the little-endian 32-bit qh.
        const int64_t blk = e / 32, j = e % 32;
        const auto nibble = [j](const uint8_t *qs) { return j < 16 ? qs[j] % 16 : qs[j - 16] / 16; };
        const auto bit = [j](const uint8_t *qh) { return qh[j / 8] / (1 << (j % 8)) % 2; };
        if (t == DType::Q4_1) {
            const auto &w = static_cast<const BlockQ4_1 *>(row)[blk];
            return double(fp16_to_f32(w.d)) * nibble(w.qs) + double(fp16_to_f32(w.m));
        }
        if (t == DType::Q5_0) {
            const auto &w = static_cast<const BlockQ5_0 *>(row)[blk];
            return double(fp16_to_f32(w.d)) * (nibble(w.qs) + 16 * bit(w.qh) - 16);
        }
        if (t == DType::Q5_1) {
            const auto &w = static_cast<const BlockQ5_1 *>(row)[blk];
            return double(fp16_to_f32(w.d)) * (nibble(w.qs) + 16 * bit(w.qh)) + double(fp16_to_f32(w.m));
        }
        if (t == DType::MXFP4) {
            // OCP E2M1 from its bits (sign, 2 exponent bits, 1 mantissa bit; exponent 0 is subnormal: m / 2),
            // times the E8M0 scale 2^(e - 127): the spec's numbers, not ggml's doubled table and halved scale.
            const auto &w = static_cast<const BlockMXFP4 *>(row)[blk];
            const int u = nibble(w.qs), exp = u / 2 % 4, mant = u % 2;
            const double mag = exp == 0 ? 0.5 * mant : (1.0 + 0.5 * mant) * std::ldexp(1.0, exp - 1);
            return (u >= 8 ? -mag : mag) * std::ldexp(1.0, int(w.e) - 127);
        }
        const auto &w = static_cast<const BlockIQ4_NL *>(row)[blk];
        constexpr int kBook[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        return double(fp16_to_f32(w.d)) * kBook[nibble(w.qs)];
    }
    if (t == DType::Q2_K || t == DType::Q3_K) {
        // Element i = 128h + 32g + l: bits 2g..2g+1 of qs[32h + l]; sub-block i / 16.
        const int64_t half = i / 128, group = i % 128 / 32, l = i % 32, s = i / 16;
        if (t == DType::Q2_K) {
            const auto &blk = static_cast<const BlockQ2_K *>(row)[b];
            const int u = blk.qs[32 * half + l] / (1 << (2 * group)) % 4;
            return double(fp16_to_f32(blk.d)) * (blk.scales[s] % 16) * u -
                   double(fp16_to_f32(blk.dmin)) * (blk.scales[s] / 16);
        }
        const auto &blk = static_cast<const BlockQ3_K *>(row)[b];
        const int low = blk.qs[32 * half + l] / (1 << (2 * group)) % 4;
        const int third = blk.hmask[i % 32] / (1 << (i / 32)) % 2;  // set: u = low, clear: u = low - 4
        // Scale s: its low nibble from byte s (s < 8, low nibble) or s - 8 (high nibble), its top two bits from
        // byte 8 + s % 4 at bit 2 * (s / 4).
        const int nibble = s < 8 ? blk.scales[s] % 16 : blk.scales[s - 8] / 16;
        const int top = blk.scales[8 + s % 4] / (1 << (2 * (s / 4))) % 4;
        return double(fp16_to_f32(blk.d)) * (nibble + 16 * top - 32) * (low - (third ? 0 : 4));
    }
    if (t == DType::Q6_K) {
        const auto &blk = static_cast<const BlockQ6_K *>(row)[b];
        const int64_t half = i / 128, group = i % 128 / 32, l = i % 32;
        const uint8_t byte = blk.ql[64 * half + 32 * (group % 2) + l];
        const int nibble = group >= 2 ? byte / 16 : byte % 16;
        const int top = (blk.qh[32 * half + l] >> (2 * group)) & 3;
        return double(fp16_to_f32(blk.d)) * blk.scales[i / 16] * (nibble + 16 * top - 32);
    }
    if (t == DType::IQ4_XS) {
        // Sub-block i / 32: its 6-bit scale ls from a nibble of scales_l and two bits of scales_h; element j of it
        // is the low nibble of qs[16 * (i / 32) + j] for j < 16, the high nibble of qs[16 * (i / 32) + j - 16] after.
        const auto &blk = static_cast<const BlockIQ4_XS *>(row)[b];
        const int64_t s = i / 32, j = i % 32;
        const int ls = blk.scales_l[s / 2] / (s % 2 ? 16 : 1) % 16 + 16 * (blk.scales_h / (1 << (2 * s)) % 4);
        const uint8_t byte = blk.qs[16 * s + j % 16];
        constexpr int kBook[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        return double(fp16_to_f32(blk.d)) * (ls - 32) * kBook[j < 16 ? byte % 16 : byte / 16];
    }
    throw_error("ref::block_element: %s is not a K-quant or one of Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, IQ4_XS",
                std::string(dtype_name(t)).c_str());
}

float dot_decoded_q8_0(DType t, const void *w, const BlockQ8_0 *x, int64_t n) {
    double sum = 0.0;
    for (int64_t e = 0; e < n; ++e) {
        sum += block_element(t, w, e) * double(fp16_to_f32(x[e / QK8_0].d)) * x[e / QK8_0].qs[e % QK8_0];
    }
    return float(sum);
}

float dot_decoded_q8_k(DType t, const void *w, const void *x, int64_t n) {
    double sum = 0.0;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        BlockQ8_K xb;
        std::memcpy(&xb, static_cast<const uint8_t *>(x) + b * static_cast<int64_t>(sizeof xb), sizeof xb);
        for (int j = 0; j < QK_K; ++j) sum += block_element(t, w, b * QK_K + j) * double(xb.d) * xb.qs[j];
    }
    return float(sum);
}

float dot_weight_row(DType t, const void *w, const void *x, int64_t n) {
    switch (t) {
        case DType::F32: return dot_f32_f32(static_cast<const float *>(w), static_cast<const float *>(x), n);
        case DType::F16: return dot_f16_f32(static_cast<const uint16_t *>(w), static_cast<const float *>(x), n);
        case DType::BF16: return dot_bf16_f32(static_cast<const uint16_t *>(w), static_cast<const float *>(x), n);
        case DType::Q8_0: return dot_q8_0_q8_0(static_cast<const BlockQ8_0 *>(w), static_cast<const BlockQ8_0 *>(x), n);
        case DType::Q4_0: return dot_q4_0_q8_0(static_cast<const BlockQ4_0 *>(w), static_cast<const BlockQ8_0 *>(x), n);
        case DType::Q4_1:
        case DType::Q5_0:
        case DType::Q5_1:
        case DType::IQ4_NL:
        case DType::MXFP4: return dot_decoded_q8_0(t, w, static_cast<const BlockQ8_0 *>(x), n);
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ4_XS: return dot_decoded_q8_k(t, w, x, n);
        default: throw_error("ref::dot_weight_row: unsupported type %s", std::string(dtype_name(t)).c_str());
    }
}

void quantize_row_q8_0(const float *x, BlockQ8_0 *y, int64_t n) { quantize_row(DType::Q8_0, x, y, n); }

// --- matmul and rows
// -------------------------------------------------------------------------------------------

void matmul(const WeightMatrix &w, const float *x, int64_t n_tokens, float *y) {
    const bool quantized = dtype_is_quantized(w.type);
    const DType xq_type = dtype_dots_q8_k(w.type) ? DType::Q8_K : DType::Q8_0;
    const int64_t xq_bytes = dtype_row_size(xq_type, quantized ? w.n_cols : 0);
    std::vector<uint8_t> xq(static_cast<size_t>(xq_bytes));
    std::vector<uint8_t> unpacked(w.rows8 ? static_cast<size_t>(w.row_bytes) : 0);
    for (int64_t t = 0; t < n_tokens; ++t) {
        const float *xt = x + t * w.n_cols;
        if (quantized) quantize_row(xq_type, xt, xq.data(), w.n_cols);
        const void *xd = quantized ? static_cast<const void *>(xq.data()) : static_cast<const void *>(xt);
        for (int64_t r = 0; r < w.n_rows; ++r) {
            const void *row = w.row(r);
            if (w.rows8) {  // the file's row, unpacked
                unpack_row8(w.type, w.data, r, w.n_cols, unpacked.data());
                row = unpacked.data();
            }
            y[t * w.n_rows + r] = dot_weight_row(w.type, row, xd, w.n_cols);
        }
    }
}

void get_rows(const WeightMatrix &table, const int32_t *ids, int64_t n, float *out) {
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= table.n_rows) {
            throw_error("get_rows: id %d out of range [0, %lld)", ids[i], (long long)table.n_rows);
        }
        if (table.rows8) {
            std::vector<uint8_t> row(static_cast<size_t>(table.row_bytes));
            unpack_row8(table.type, table.data, ids[i], table.n_cols, row.data());
            dequantize_row(table.type, row.data(), out + i * table.n_cols, table.n_cols);
            continue;
        }
        dequantize_row(table.type, table.row(ids[i]), out + i * table.n_cols, table.n_cols);
    }
}

// --- norms and elementwise
// -------------------------------------------------------------------------------------

void rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *xr = x + r * n;
        double sum_sq = 0.0;
        for (int64_t i = 0; i < n; ++i) sum_sq += double(xr[i]) * double(xr[i]);
        const double scale = 1.0 / std::sqrt(sum_sq / double(n) + double(eps));
        for (int64_t i = 0; i < n; ++i) y[r * n + i] = float(double(xr[i]) * scale * (w ? double(w[i]) : 1.0));
    }
}

void layer_norm(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *xr = x + r * n;
        double mean = 0.0;
        for (int64_t i = 0; i < n; ++i) mean += xr[i];
        mean /= double(n);
        double var = 0.0;
        for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
        var /= double(n);
        const double scale = 1.0 / std::sqrt(var + double(eps));
        for (int64_t i = 0; i < n; ++i) {
            const double v = (xr[i] - mean) * scale * (w ? double(w[i]) : 1.0) + (b ? double(b[i]) : 0.0);
            y[r * n + i] = float(v);
        }
    }
}

void softmax(float *x, int64_t n, float scale) {
    double max = -INFINITY;
    for (int64_t i = 0; i < n; ++i) max = std::max(max, double(x[i]) * scale);
    if (max == -INFINITY) {  // every element -inf: no probability mass anywhere
        std::fill(x, x + n, 0.0f);
        return;
    }
    double sum = 0.0;
    std::vector<double> e(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) sum += e[i] = std::exp(double(x[i]) * scale - max);
    for (int64_t i = 0; i < n; ++i) x[i] = float(e[i] / sum);
}

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const double g = gate[i];
        out[i] = float(g / (1.0 + std::exp(-g)) * double(up[i]));
    }
}

void hadamard(float *x, int64_t n_rows, int64_t n) {
    if (n <= 0 || (n & (n - 1)) != 0) throw_error("hadamard: n = %lld is not a power of two", (long long)n);
    std::vector<double> y(static_cast<size_t>(n));
    const double norm = 1.0 / std::sqrt(double(n));
    for (int64_t r = 0; r < n_rows; ++r) {
        float *xr = x + r * n;
        for (int64_t i = 0; i < n; ++i) {
            double sum = 0.0;
            for (int64_t j = 0; j < n; ++j) {
                const bool negative = std::popcount(static_cast<uint64_t>(i & j)) & 1;
                sum += negative ? -double(xr[j]) : double(xr[j]);
            }
            y[i] = sum * norm;
        }
        for (int64_t i = 0; i < n; ++i) xr[i] = float(y[i]);
    }
}

int64_t top_k(const float *scores, int64_t n, int64_t k, int32_t *idx) {
    const int64_t m = std::max<int64_t>(0, std::min(k, n));
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        const bool nan_a = std::isnan(scores[a]), nan_b = std::isnan(scores[b]);
        if (nan_a || nan_b) return !nan_a && nan_b;  // NaN after everything; stable keeps index order
        return scores[a] > scores[b];
    });
    std::copy(order.begin(), order.begin() + m, idx);
    return m;
}

float dot_row(DType t, const void *row, const float *x, int64_t n) {
    if (t != DType::F32 && t != DType::F16 && t != DType::BF16) throw_error("ref::dot_row: unsupported row type");
    return dot_weight_row(t, row, x, n);
}

void axpy_row(DType t, const void *row, float a, float *y, int64_t n) {
    std::vector<float> r(static_cast<size_t>(n));
    dequantize_row(t, row, r.data(), n);
    for (int64_t i = 0; i < n; ++i) y[i] = float(double(y[i]) + double(a) * double(r[i]));
}

// --- rope
// ------------------------------------------------------------------------------------------------------

void rope_yarn_corr_dims(int n_rot, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float dims[2]) {
    // The pair index at which the rotation completes `beta` turns over n_ctx_orig positions.
    const auto corr_dim = [&](float beta) {
        return float(n_rot) * std::log(float(n_ctx_orig) / (beta * 2.0f * std::numbers::pi_v<float>)) /
               (2.0f * std::log(freq_base));
    };
    dims[0] = std::max(0.0f, std::floor(corr_dim(beta_fast)));
    dims[1] = std::min(float(n_rot - 1), std::ceil(corr_dim(beta_slow)));
}

void rope(float *x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t *pos, const RopeParams &p) {
    const int n_rot = p.n_rot;
    if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim) {
        throw_error("rope: n_rot = %d must be even and in (0, head_dim = %lld]", n_rot, (long long)head_dim);
    }
    float corr[2];
    rope_yarn_corr_dims(n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
    const bool yarn = p.ext_factor != 0.0f;
    const double mscale =
        yarn ? double(p.attn_factor * (1.0f + 0.1f * std::log(1.0f / p.freq_scale))) : double(p.attn_factor);
    const int half = n_rot / 2;
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t h = 0; h < n_heads; ++h) {
            float *xh = x + (t * n_heads + h) * head_dim;
            for (int i = 0; i < half; ++i) {
                const double theta_extrap = double(pos[t]) * std::pow(double(p.freq_base), -2.0 * i / n_rot);
                const double theta_interp = double(p.freq_scale) * theta_extrap;
                double theta = theta_interp;
                if (yarn) {
                    const double y = (double(i) - corr[0]) / std::max(0.001, double(corr[1]) - corr[0]);
                    const double ramp = 1.0 - std::clamp(y, 0.0, 1.0);
                    const double mix = ramp * p.ext_factor;
                    theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
                }
                const double c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
                float &a = p.layout == RopeLayout::adjacent ? xh[2 * i] : xh[i];
                float &b = p.layout == RopeLayout::adjacent ? xh[2 * i + 1] : xh[i + half];
                const double a0 = a, b0 = b;
                a = float(a0 * c - b0 * s);
                b = float(a0 * s + b0 * c);
            }
        }
    }
}

}  // namespace sparrow::ref
