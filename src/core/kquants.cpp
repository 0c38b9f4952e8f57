#include "core/kquants.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "core/dtype.h"

namespace sparrow {

namespace {

constexpr int kSubBlocks = QK_K / 32;  // Q4_K / Q5_K sub-blocks of 32

int nearest(float v) { return static_cast<int>(std::lround(v)); }

// A sub-block's scale and min (x ~ scale * u - min, u in [0, n_max], min >= 0): first spanning its range
// [min(0, lo), hi], then a few rounds of least squares of x on the u that scale gives (min held at 0 where the
// fit wants it negative), keeping the fit with the smallest squared error. ggml searches more candidates; this
// already gives Q4_K a relative RMS error of 0.092 against Q4_0's 0.138 (Gaussian weights with outliers).
void fit_sub_block(const float *x, int len, int n_max, float &scale, float &min) {
    const float lo = std::min(0.0f, *std::min_element(x, x + len)), hi = *std::max_element(x, x + len);
    scale = (hi - lo) / float(n_max);
    min = -lo;
    if (scale <= 0.0f) return;
    double best = -1.0;
    float a = scale, b = min;
    for (int round = 0; round < 4; ++round) {
        double su = 0, suu = 0, sx = 0, sux = 0, sse = 0;
        for (int l = 0; l < len; ++l) {
            const int u = std::clamp(nearest((x[l] + b) / a), 0, n_max);
            const double e = double(a) * u - double(b) - double(x[l]);
            sse += e * e;
            su += u, suu += double(u) * u, sx += x[l], sux += double(u) * x[l];
        }
        if (best < 0.0 || sse < best) best = sse, scale = a, min = b;
        const double det = len * suu - su * su;
        if (det <= 0.0) break;
        double fa = (len * sux - su * sx) / det, fb = (su * fa - sx) / len;  // x ~ fa * u - fb
        if (fb < 0.0) fa = suu > 0.0 ? sux / suu : 0.0, fb = 0.0;
        if (fa <= 0.0) break;
        a = float(fa), b = float(fb);
    }
}

// Q4_K / Q5_K: the sub-blocks' u in [0, n_max] (L[256]) and the packed scales, d and dmin of one super-block.
void quantize_min_max(const float *x, int n_max, uint8_t *L, uint8_t scales[12], uint16_t &d16, uint16_t &dmin16) {
    float scale[kSubBlocks], min[kSubBlocks];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int s = 0; s < kSubBlocks; ++s) {
        fit_sub_block(x + 32 * s, 32, n_max, scale[s], min[s]);
        max_scale = std::max(max_scale, scale[s]);
        max_min = std::max(max_min, min[s]);
    }
    d16 = f32_to_fp16(max_scale / 63.0f);
    dmin16 = f32_to_fp16(max_min / 63.0f);
    const float d = fp16_to_f32(d16), dmin = fp16_to_f32(dmin16);
    std::memset(scales, 0, 12);
    uint8_t ls[kSubBlocks], lm[kSubBlocks];
    for (int s = 0; s < kSubBlocks; ++s) {
        ls[s] = static_cast<uint8_t>(d > 0.0f ? std::clamp(nearest(scale[s] / d), 0, 63) : 0);
        lm[s] = static_cast<uint8_t>(dmin > 0.0f ? std::clamp(nearest(min[s] / dmin), 0, 63) : 0);
    }
    // The packing kquant_scale_min reads (core/blocks.h).
    for (int s = 0; s < kSubBlocks; ++s) {
        if (s < 4) {
            scales[s] |= ls[s];
            scales[s + 4] |= lm[s];
        } else {
            scales[s + 4] = static_cast<uint8_t>((ls[s] & 15) | ((lm[s] & 15) << 4));
            scales[s - 4] |= static_cast<uint8_t>((ls[s] >> 4) << 6);
            scales[s] |= static_cast<uint8_t>((lm[s] >> 4) << 6);
        }
    }
    for (int s = 0; s < kSubBlocks; ++s) {
        int sc, m;
        kquant_scale_min(scales, s, sc, m);
        const float ds = d * float(sc), dm = dmin * float(m);
        for (int l = 0; l < 32; ++l) {
            L[32 * s + l] =
                static_cast<uint8_t>(ds > 0.0f ? std::clamp(nearest((x[32 * s + l] + dm) / ds), 0, n_max) : 0);
        }
    }
}

// The sixteen sub-blocks of 16 scaled so that each one's element of largest magnitude maps to -q_min (Q3_K: 4,
// Q6_K: 32; as Q4_0 maps its to -8); returns the scale of largest magnitude, with its sign.
float signed_sub_block_scales(const float *x, float q_min, float scale[16]) {
    float max_scale = 0.0f;
    for (int s = 0; s < 16; ++s) {
        scale[s] = signed_absmax(x + 16 * s, 16) / -q_min;
        if (std::fabs(scale[s]) > std::fabs(max_scale)) max_scale = scale[s];
    }
    return max_scale;
}

// Q2_K / Q3_K / Q6_K element e = 128h + 32g + l of a super-block's u[256] into the two-bit planes of qs: bits 2g of
// qs[32h + l] (the low two bits of u).
void pack_two_bit_planes(const uint8_t *u, uint8_t *qs) {
    for (int h = 0; h < 2; ++h) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t *uh = u + 128 * h;
            qs[32 * h + l] = static_cast<uint8_t>((uh[l] & 3) | (uh[l + 32] & 3) << 2 | (uh[l + 64] & 3) << 4 |
                                                  (uh[l + 96] & 3) << 6);
        }
    }
}

// Sub-block s (0..15) of a Q3_K block's packed scales: its signed scale sc_s - 32.
int q3_k_scale(const uint8_t *scales, int s) {
    const int low = s < 8 ? scales[s] & 15 : scales[s - 8] >> 4;
    return (low | ((scales[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
}

// Q2_K and Q3_K: element e = 128h + 32g + l keeps its low two bits at bits 2g of qs[32h + l].
int two_bits(const uint8_t *qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3; }

// Q4_K and Q5_K (Block::qh only in Q5_K: HighBits).
template <typename Block, bool HighBits>
void decode_min_max(const Block &b, KQuantInts &w) {
    w.n_sub = 8;
    w.offset = 0;
    w.d = fp16_to_f32(b.d);
    w.dmin = fp16_to_f32(b.dmin);
    w.has_mins = true;
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

// y[0..256) from the decoded super-block in ggml's f32 order: (d * sc) * (u - offset) - dmin * m. Where a type
// has no mins (Q3_K, Q6_K) the last term is +0, which leaves every value as ggml's (d * sc) * (u - offset).
void dequantize_ints(const KQuantInts &w, float *y) {
    const int len = QK_K / w.n_sub;
    for (int e = 0; e < QK_K; ++e) {
        const int s = e / len;
        y[e] = w.d * float(w.sc[s]) * float(w.u[e] - w.offset) - w.dmin * float(w.m[s]);
    }
}

template <typename Block>
void dequantize_k(const Block *x, float *y, int64_t n) {
    KQuantInts w;
    for (int64_t b = 0; b < n / QK_K; ++b, y += QK_K) {
        decode_kquant(x[b], w);
        dequantize_ints(w, y);
    }
}

}  // namespace

float signed_absmax(const float *x, int64_t n) {
    float amax = 0.0f, max = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
    }
    return max;
}

void decode_kquant(const BlockQ4_K &b, KQuantInts &w) { decode_min_max<BlockQ4_K, false>(b, w); }
void decode_kquant(const BlockQ5_K &b, KQuantInts &w) { decode_min_max<BlockQ5_K, true>(b, w); }

namespace {

// Row r's super-block in a record of eight (core/blocks.h) as pieces: f(offset in the record, offset in the block,
// bytes) for each. Q4_K / Q5_K: the fp16 scales side by side, the twelve scale bytes as three planes of words, the
// quants (and Q5_K's fifth bits) in groups of four bytes. Q2_K, Q3_K, Q6_K and IQ4_XS: their own (core/blocks.h).
template <typename B, typename R, typename F>
void lane_pieces(int r, F &&f) {
    f(offsetof(R, d) + 2 * r, offsetof(B, d), 2);
    if constexpr (sizeof(B) == sizeof(BlockQ2_K)) {  // one byte per sub-block's scale and min; 16 quant groups
        f(offsetof(R, dmin) + 2 * r, offsetof(B, dmin), 2);
        for (int s = 0; s < QK_K / 16; ++s) f(offsetof(R, scales) + 8 * s + r, offsetof(B, scales) + s, 1);
        for (int g = 0; g < QK_K / 16; ++g) f(offsetof(R, qs) + 32 * g + 4 * r, offsetof(B, qs) + 4 * g, 4);
    } else if constexpr (sizeof(B) == sizeof(BlockQ3_K)) {  // the scale words in planes; hmask and qs in groups
        for (int p = 0; p < 3; ++p) f(offsetof(R, scales) + 32 * p + 4 * r, offsetof(B, scales) + 4 * p, 4);
        for (int g = 0; g < QK_K / 32; ++g) f(offsetof(R, hmask) + 32 * g + 4 * r, offsetof(B, hmask) + 4 * g, 4);
        for (int g = 0; g < QK_K / 16; ++g) f(offsetof(R, qs) + 32 * g + 4 * r, offsetof(B, qs) + 4 * g, 4);
    } else if constexpr (sizeof(B) == sizeof(BlockIQ4_XS)) {  // scale bits side by side; quants in groups
        f(offsetof(R, scales_h) + 2 * r, offsetof(B, scales_h), 2);
        f(offsetof(R, scales_l) + 4 * r, offsetof(B, scales_l), 4);
        for (int g = 0; g < QK_K / 8; ++g) f(offsetof(R, qs) + 32 * g + 4 * r, offsetof(B, qs) + 4 * g, 4);
    } else if constexpr (sizeof(B) == sizeof(BlockQ6_K)) {  // one byte per sub-block scale; two planes of quant groups
        for (int s = 0; s < QK_K / 16; ++s) f(offsetof(R, scales) + 8 * s + r, offsetof(B, scales) + s, 1);
        for (int g = 0; g < QK_K / 8; ++g) f(offsetof(R, ql) + 32 * g + 4 * r, offsetof(B, ql) + 4 * g, 4);
        for (int g = 0; g < QK_K / 16; ++g) f(offsetof(R, qh) + 32 * g + 4 * r, offsetof(B, qh) + 4 * g, 4);
    } else {
        f(offsetof(R, dmin) + 2 * r, offsetof(B, dmin), 2);
        for (int p = 0; p < 3; ++p) f(offsetof(R, scales) + 32 * p + 4 * r, offsetof(B, scales) + 4 * p, 4);
        for (int g = 0; g < QK_K / 8; ++g) f(offsetof(R, qs) + 32 * g + 4 * r, offsetof(B, qs) + 4 * g, 4);
        if constexpr (sizeof(B) == sizeof(BlockQ5_K)) {
            for (int g = 0; g < QK_K / 32; ++g) f(offsetof(R, qh) + 32 * g + 4 * r, offsetof(B, qh) + 4 * g, 4);
        }
    }
}

template <typename B, typename R>
void pack_lane_of(const B &blk, int r, R &rec) {
    lane_pieces<B, R>(r, [&](size_t at_rec, size_t at_blk, size_t n) {
        std::memcpy(reinterpret_cast<uint8_t *>(&rec) + at_rec, reinterpret_cast<const uint8_t *>(&blk) + at_blk, n);
    });
}

template <typename B, typename R>
void unpack_lane_of(const R &rec, int r, B &blk) {
    lane_pieces<B, R>(r, [&](size_t at_rec, size_t at_blk, size_t n) {
        std::memcpy(reinterpret_cast<uint8_t *>(&blk) + at_blk, reinterpret_cast<const uint8_t *>(&rec) + at_rec, n);
    });
}

}  // namespace

void pack_lane(const BlockQ2_K &blk, int r, BlockQ2_Kx8 &rec) { pack_lane_of(blk, r, rec); }
void pack_lane(const BlockQ3_K &blk, int r, BlockQ3_Kx8 &rec) { pack_lane_of(blk, r, rec); }
void pack_lane(const BlockQ4_K &blk, int r, BlockQ4_Kx8 &rec) { pack_lane_of(blk, r, rec); }
void pack_lane(const BlockQ5_K &blk, int r, BlockQ5_Kx8 &rec) { pack_lane_of(blk, r, rec); }
void pack_lane(const BlockQ6_K &blk, int r, BlockQ6_Kx8 &rec) { pack_lane_of(blk, r, rec); }
void pack_lane(const BlockIQ4_XS &blk, int r, BlockIQ4_XSx8 &rec) { pack_lane_of(blk, r, rec); }
void unpack_lane(const BlockQ2_Kx8 &rec, int r, BlockQ2_K &blk) { unpack_lane_of(rec, r, blk); }
void unpack_lane(const BlockQ3_Kx8 &rec, int r, BlockQ3_K &blk) { unpack_lane_of(rec, r, blk); }
void unpack_lane(const BlockQ4_Kx8 &rec, int r, BlockQ4_K &blk) { unpack_lane_of(rec, r, blk); }
void unpack_lane(const BlockQ5_Kx8 &rec, int r, BlockQ5_K &blk) { unpack_lane_of(rec, r, blk); }
void unpack_lane(const BlockQ6_Kx8 &rec, int r, BlockQ6_K &blk) { unpack_lane_of(rec, r, blk); }
void unpack_lane(const BlockIQ4_XSx8 &rec, int r, BlockIQ4_XS &blk) { unpack_lane_of(rec, r, blk); }

void decode_kquant(const BlockQ2_K &b, KQuantInts &w) {
    w.n_sub = 16;
    w.offset = 0;
    w.d = fp16_to_f32(b.d);
    w.dmin = fp16_to_f32(b.dmin);
    w.has_mins = true;
    for (int s = 0; s < 16; ++s) w.sc[s] = b.scales[s] & 15, w.m[s] = b.scales[s] >> 4;
    for (int e = 0; e < QK_K; ++e) w.u[e] = two_bits(b.qs, e);
}

void decode_kquant(const BlockQ3_K &b, KQuantInts &w) {
    w.n_sub = 16;
    w.offset = 4;  // u = low two bits | third bit << 2; the value is u - 4
    w.d = fp16_to_f32(b.d);
    w.dmin = 0.0f;
    w.has_mins = false;
    for (int s = 0; s < 16; ++s) w.sc[s] = q3_k_scale(b.scales, s), w.m[s] = 0;
    for (int e = 0; e < QK_K; ++e) w.u[e] = two_bits(b.qs, e) | ((b.hmask[e % 32] >> (e / 32)) & 1) << 2;
}

void decode_kquant(const BlockQ6_K &b, KQuantInts &w) {
    w.n_sub = 16;
    w.offset = 32;
    w.d = fp16_to_f32(b.d);
    w.dmin = 0.0f;
    w.has_mins = false;
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

void decode_kquant(const BlockIQ4_XS &b, KQuantInts &w) {
    w.n_sub = QK_K / 32;
    w.offset = 0;
    w.d = fp16_to_f32(b.d);
    w.dmin = 0.0f;
    w.has_mins = false;
    for (int s = 0; s < QK_K / 32; ++s) {
        const int ls = ((b.scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((b.scales_h >> (2 * s)) & 3) << 4);
        w.sc[s] = ls - 32;
        w.m[s] = 0;
        for (int l = 0; l < 16; ++l) {
            w.u[32 * s + l] = kIq4nlValues[b.qs[16 * s + l] & 15];
            w.u[32 * s + 16 + l] = kIq4nlValues[b.qs[16 * s + l] >> 4];
        }
    }
}

void kquant_scale_min(const uint8_t *scales, int s, int &sc, int &m) {
    if (s < 4) {
        sc = scales[s] & 63;
        m = scales[s + 4] & 63;
    } else {
        sc = (scales[s + 4] & 15) | ((scales[s - 4] >> 6) << 4);
        m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
    }
}

void quantize_row_q8_k(const float *x, void *y, int64_t n) {
    auto *out = static_cast<uint8_t *>(y);
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K, out += sizeof(BlockQ8_K)) {
        BlockQ8_K blk;
        const float max = signed_absmax(x, QK_K);
        const float iscale = max != 0.0f ? -127.0f / max : 0.0f;
        blk.d = max != 0.0f ? 1.0f / iscale : 0.0f;
        // Round to nearest even by adding and taking away 1.5 * 2^23 (|v| <= 127): a loop the compiler vectorises.
        constexpr float kRound = 12582912.0f;
        for (int j = 0; j < QK_K; ++j) {
            const float r = (iscale * x[j] + kRound) - kRound;
            blk.qs[j] = static_cast<int8_t>(std::min(r, 127.0f));
        }
        for (int k = 0; k < QK_K / 16; ++k) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += blk.qs[16 * k + j];
            blk.bsums[k] = static_cast<int16_t>(sum);
        }
        std::memcpy(out, &blk, sizeof blk);
    }
}

void dequantize_row_q8_k(const void *x, float *y, int64_t n) {
    const auto *in = static_cast<const uint8_t *>(x);
    for (int64_t b = 0; b < n / QK_K; ++b, in += sizeof(BlockQ8_K), y += QK_K) {
        BlockQ8_K blk;
        std::memcpy(&blk, in, sizeof blk);
        for (int j = 0; j < QK_K; ++j) y[j] = blk.d * float(blk.qs[j]);
    }
}

void quantize_row_q2_k(const float *x, BlockQ2_K *y, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        // Sixteen sub-blocks of 16 fitted as Q4_K's, u in [0, 3]; their scales and mins rounded to 4 bits of the
        // largest.
        float scale[16], min[16], max_scale = 0.0f, max_min = 0.0f;
        for (int s = 0; s < 16; ++s) {
            fit_sub_block(x + 16 * s, 16, 3, scale[s], min[s]);
            max_scale = std::max(max_scale, scale[s]);
            max_min = std::max(max_min, min[s]);
        }
        y[b].d = f32_to_fp16(max_scale / 15.0f);
        y[b].dmin = f32_to_fp16(max_min / 15.0f);
        const float d = fp16_to_f32(y[b].d), dmin = fp16_to_f32(y[b].dmin);
        uint8_t u[QK_K];
        for (int s = 0; s < 16; ++s) {
            const int ls = d > 0.0f ? std::clamp(nearest(scale[s] / d), 0, 15) : 0;
            const int lm = dmin > 0.0f ? std::clamp(nearest(min[s] / dmin), 0, 15) : 0;
            y[b].scales[s] = static_cast<uint8_t>(ls | lm << 4);
            const float ds = d * float(ls), dm = dmin * float(lm);
            for (int l = 0; l < 16; ++l) {
                u[16 * s + l] =
                    static_cast<uint8_t>(ds > 0.0f ? std::clamp(nearest((x[16 * s + l] + dm) / ds), 0, 3) : 0);
            }
        }
        pack_two_bit_planes(u, y[b].qs);
    }
}

void quantize_row_q3_k(const float *x, BlockQ3_K *y, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        float scale[16];
        const float max_scale = signed_sub_block_scales(x, 4.0f, scale);
        std::memset(&y[b], 0, sizeof y[b]);
        if (max_scale == 0.0f) continue;  // an all-zero super-block: d = 0
        // Signed 6-bit scales against d: the largest maps to -32.
        const float iscale = -32.0f / max_scale;
        y[b].d = f32_to_fp16(1.0f / iscale);
        const float d = fp16_to_f32(y[b].d);
        uint8_t u[QK_K];
        for (int s = 0; s < 16; ++s) {
            const int l = std::clamp(nearest(iscale * scale[s]), -32, 31) + 32;
            if (s < 8) {
                y[b].scales[s] |= static_cast<uint8_t>(l & 15);
            } else {
                y[b].scales[s - 8] |= static_cast<uint8_t>((l & 15) << 4);
            }
            y[b].scales[8 + s % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (s / 4)));
            const float ds = d * float(l - 32);
            for (int e = 16 * s; e < 16 * s + 16; ++e) {
                u[e] = static_cast<uint8_t>((ds != 0.0f ? std::clamp(nearest(x[e] / ds), -4, 3) : 0) + 4);
                if (u[e] & 4) y[b].hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
            }
        }
        pack_two_bit_planes(u, y[b].qs);
    }
}

void quantize_row_q4_k(const float *x, BlockQ4_K *y, int64_t n) {
    uint8_t L[QK_K];
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        quantize_min_max(x, 15, L, y[b].scales, y[b].d, y[b].dmin);
        for (int c = 0; c < 4; ++c) {
            for (int l = 0; l < 32; ++l)
                y[b].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
        }
    }
}

void quantize_row_q5_k(const float *x, BlockQ5_K *y, int64_t n) {
    uint8_t L[QK_K];
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        quantize_min_max(x, 31, L, y[b].scales, y[b].d, y[b].dmin);
        std::memset(y[b].qh, 0, sizeof y[b].qh);
        for (int c = 0; c < 4; ++c) {
            for (int l = 0; l < 32; ++l) {
                const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
                y[b].qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
                y[b].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
        }
    }
}

void quantize_row_q6_k(const float *x, BlockQ6_K *y, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        float scale[16];
        const float max_scale = signed_sub_block_scales(x, 32.0f, scale);
        std::memset(&y[b], 0, sizeof y[b]);
        if (max_scale == 0.0f) continue;  // an all-zero super-block: d = 0
        const float iscale = -128.0f / max_scale;
        y[b].d = f32_to_fp16(1.0f / iscale);
        const float d = fp16_to_f32(y[b].d);
        int8_t L[QK_K];
        for (int s = 0; s < QK_K / 16; ++s) {
            y[b].scales[s] = static_cast<int8_t>(std::clamp(nearest(iscale * scale[s]), -128, 127));
            const float ds = d * float(y[b].scales[s]);
            for (int l = 0; l < 16; ++l) {
                L[16 * s + l] = static_cast<int8_t>(ds != 0.0f ? std::clamp(nearest(x[16 * s + l] / ds), -32, 31) : 0);
            }
        }
        for (int h = 0; h < 2; ++h) {
            uint8_t *ql = y[b].ql + 64 * h, *qh = y[b].qh + 32 * h;
            const int8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; ++l) {
                const int u1 = Lh[l] + 32, u2 = Lh[l + 32] + 32, u3 = Lh[l + 64] + 32, u4 = Lh[l + 96] + 32;
                ql[l] = static_cast<uint8_t>((u1 & 15) | ((u3 & 15) << 4));
                ql[l + 32] = static_cast<uint8_t>((u2 & 15) | ((u4 & 15) << 4));
                qh[l] = static_cast<uint8_t>((u1 >> 4) | ((u2 >> 4) << 2) | ((u3 >> 4) << 4) | ((u4 >> 4) << 6));
            }
        }
    }
}

void quantize_row_iq4_xs(const float *x, BlockIQ4_XS *y, int64_t n) {
    constexpr int n_sub = QK_K / 32;
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        float scale[n_sub];
        float max_scale = 0.0f;  // the sub-block scale of largest magnitude, with its sign
        for (int s = 0; s < n_sub; ++s) {
            scale[s] = signed_absmax(x + 32 * s, 32) / float(kIq4nlValues[0]);
            if (std::fabs(scale[s]) > std::fabs(max_scale)) max_scale = scale[s];
        }
        std::memset(&y[b], 0, sizeof y[b]);
        if (max_scale == 0.0f) continue;  // an all-zero super-block: d = 0
        // ls - 32 spans -32..31: scales of max_scale's sign take the -32 end, the others reach +31 only, so d is
        // the larger of the two needs (a scale clamped at 31 would push its elements past the book's ends).
        float step = 0.0f;
        for (int s = 0; s < n_sub; ++s) {
            step = std::max(step, std::fabs(scale[s]) / ((scale[s] < 0.0f) == (max_scale < 0.0f) ? 32.0f : 31.0f));
        }
        y[b].d = f32_to_fp16(max_scale < 0.0f ? step : -step);
        const float d = fp16_to_f32(y[b].d);
        for (int s = 0; s < n_sub; ++s) {
            const int l = d != 0.0f ? std::clamp(nearest(scale[s] / d), -32, 31) : 0;
            const int ls = l + 32;
            y[b].scales_l[s / 2] = static_cast<uint8_t>(y[b].scales_l[s / 2] | (ls & 15) << (4 * (s % 2)));
            y[b].scales_h = static_cast<uint16_t>(y[b].scales_h | (ls >> 4) << (2 * s));
            const float dl = d * float(l);
            int u[32];
            for (int j = 0; j < 32; ++j) {
                const float v = dl != 0.0f ? x[32 * s + j] / dl : 0.0f;
                int best = 0;
                for (int k = 1; k < 16; ++k) {
                    if (std::fabs(v - float(kIq4nlValues[k])) < std::fabs(v - float(kIq4nlValues[best]))) best = k;
                }
                u[j] = best;
            }
            for (int j = 0; j < 16; ++j) y[b].qs[16 * s + j] = static_cast<uint8_t>(u[j] | u[j + 16] << 4);
        }
    }
}

// The dequantisers: ggml's f32 arithmetic through dequantize_ints.
void dequantize_row_q2_k(const BlockQ2_K *x, float *y, int64_t n) { dequantize_k(x, y, n); }
void dequantize_row_q3_k(const BlockQ3_K *x, float *y, int64_t n) { dequantize_k(x, y, n); }
void dequantize_row_q4_k(const BlockQ4_K *x, float *y, int64_t n) { dequantize_k(x, y, n); }
void dequantize_row_q5_k(const BlockQ5_K *x, float *y, int64_t n) { dequantize_k(x, y, n); }
void dequantize_row_q6_k(const BlockQ6_K *x, float *y, int64_t n) { dequantize_k(x, y, n); }
void dequantize_row_iq4_xs(const BlockIQ4_XS *x, float *y, int64_t n) { dequantize_k(x, y, n); }

}  // namespace sparrow
