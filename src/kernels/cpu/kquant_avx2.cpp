// AVX2 K-quant products (Q4_K, Q5_K, Q6_K weights against the Q8_0 dot-x activations; the integer sums
// kquant_scalar.cpp describes). Compiled with -mavx2 -mfma -mf16c; the ODR rule of kernels_avx2.cpp holds
// here: only <immintrin.h>, <cstddef>, <cstdint>, <cstring>, core/blocks.h and isa_kernels.h, and everything
// but the exported kernels in an anonymous namespace.
//
// Per super-block the weights are unpacked once into 32-byte registers of u (one per activation block) and
// meet each token's block in one maddubs (u unsigned, x signed: pairs reach 2 * 63 * 127, no saturation) and
// one madd into eight int32 lanes. Lanes are scaled in f32 and accumulated per token; the mins (Q4_K, Q5_K)
// are eight sub-blocks' dmin * m * dx * sum(x) in one vector, from the activation row's block sums.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/blocks.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::avx2 {

namespace {

constexpr int kMaxTile = 4;  // = cpu::kMaxTile
// As kernels_avx2.cpp: weight bytes asked for ahead of the ones being read.
constexpr int64_t kPrefetchBytes = 4096;

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The 6-bit scale and min of sub-block s (core/blocks.h packing).
inline void scale_min(const uint8_t *q, int s, int &sc, int &m) {
    if (s < 4) {
        sc = q[s] & 63;
        m = q[s + 4] & 63;
    } else {
        sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
        m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
}

// Token j's activation row: block b's 32 quants, its f32 scale, and the eight block sums / scales from b on.
struct XRow {
    const uint8_t *base;
    int64_t scales_at, sums_at;
    XRow(const void *x, int64_t n)
        : base(static_cast<const uint8_t *>(x)),
          scales_at(n / QK8_0 * static_cast<int64_t>(sizeof(BlockQ8_0))),
          sums_at(scales_at + n / QK8_0 * 4) {}
    __m256i quants(int64_t b) const {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(base + b * sizeof(BlockQ8_0) + 2));
    }
    float scale(int64_t b) const {
        float d;
        std::memcpy(&d, base + scales_at + b * 4, 4);
        return d;
    }
    __m256 scales8(int64_t b) const {
        return _mm256_loadu_ps(reinterpret_cast<const float *>(base + scales_at + b * 4));
    }
    // 128 x sum(x) of eight blocks from b, as f32 (exact: |128 x 32 x 127| < 2^24).
    __m256 sums8(int64_t b) const {
        return _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(base + sums_at + b * 4)));
    }
};

// sum(u x) in eight int32 lanes, four elements each.
inline __m256i dot_u8_i8(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

// Q4_K / Q5_K. HighBits: whether the block has Q5_K's fifth bits.
template <typename Block, bool HighBits>
void dot_tile_min_max(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const Block *>(w);
    const __m256i low4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    XRow xr[kMaxTile] = {XRow(x, n), XRow(x, n), XRow(x, n), XRow(x, n)};
    for (int j = 0; j < n_x; ++j) xr[j] = XRow(static_cast<const uint8_t *>(x) + j * x_stride, n);
    __m256 acc[kMaxTile], mins[kMaxTile];
    for (int j = 0; j < kMaxTile; ++j) acc[j] = mins[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const Block &b = blocks[i];
        for (int l = 0; l < static_cast<int>(sizeof(Block)); l += 64) {
            _mm_prefetch(reinterpret_cast<const char *>(&b) + kPrefetchBytes + l, _MM_HINT_T0);
        }
        const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
        int sc[8], m[8];
        for (int s = 0; s < 8; ++s) scale_min(b.scales, s, sc[s], m[s]);
        const __m256 mv =
            _mm256_mul_ps(_mm256_set1_ps(dmin),
                          _mm256_cvtepi32_ps(_mm256_setr_epi32(m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7])));
        __m256i qh = _mm256_setzero_si256();
        if constexpr (HighBits) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qh));
        for (int c = 0; c < 4; ++c) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if constexpr (HighBits) {
                const __m128i s_lo = _mm_cvtsi32_si128(2 * c), s_hi = _mm_cvtsi32_si128(2 * c + 1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s_lo), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s_hi), one), 4));
            }
            const float d_lo = d * static_cast<float>(sc[2 * c]), d_hi = d * static_cast<float>(sc[2 * c + 1]);
            for (int j = 0; j < n_x; ++j) {
                const int64_t xb = i * 8 + 2 * c;
                const __m256 p_lo = _mm256_cvtepi32_ps(dot_u8_i8(lo, xr[j].quants(xb)));
                const __m256 p_hi = _mm256_cvtepi32_ps(dot_u8_i8(hi, xr[j].quants(xb + 1)));
                acc[j] = _mm256_fmadd_ps(p_lo, _mm256_set1_ps(d_lo * xr[j].scale(xb)), acc[j]);
                acc[j] = _mm256_fmadd_ps(p_hi, _mm256_set1_ps(d_hi * xr[j].scale(xb + 1)), acc[j]);
            }
        }
        for (int j = 0; j < n_x; ++j) {
            mins[j] = _mm256_fmadd_ps(_mm256_mul_ps(mv, xr[j].scales8(i * 8)), xr[j].sums8(i * 8), mins[j]);
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]) - hsum(mins[j]) * (1.0f / 128.0f);
}

}  // namespace

void dot_tile_q4_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_min_max<BlockQ4_K, false>(w, x, x_stride, n_x, n, out);
}

void dot_tile_q5_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_min_max<BlockQ5_K, true>(w, x, x_stride, n_x, n, out);
}

void dot_tile_q6_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const BlockQ6_K *>(w);
    const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    XRow xr[kMaxTile] = {XRow(x, n), XRow(x, n), XRow(x, n), XRow(x, n)};
    for (int j = 0; j < n_x; ++j) xr[j] = XRow(static_cast<const uint8_t *>(x) + j * x_stride, n);
    __m256 acc[kMaxTile];
    for (auto &a : acc) a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const BlockQ6_K &b = blocks[i];
        for (int l = 0; l < static_cast<int>(sizeof(BlockQ6_K)); l += 64) {
            _mm_prefetch(reinterpret_cast<const char *>(&b) + kPrefetchBytes + l, _MM_HINT_T0);
        }
        const float d = half_to_float(b.d);
        for (int h = 0; h < 2; ++h) {
            const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qh + 32 * h));
            // Activation block g of this half: its u, and high bits 2g..2g+1 of qh.
            const __m256i u[4] = {
                _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4)),
                _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4)),
            };
            for (int g = 0; g < 4; ++g) {
                // Lanes 0-3 hold elements 0..15 of the block (scale 8h + 2g), lanes 4-7 elements 16..31 (the next).
                const float s0 = d * static_cast<float>(b.scales[8 * h + 2 * g]);
                const float s1 = d * static_cast<float>(b.scales[8 * h + 2 * g + 1]);
                const __m256 sv = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
                for (int j = 0; j < n_x; ++j) {
                    const int64_t xb = i * 8 + 4 * h + g;
                    const __m256i xq = xr[j].quants(xb);
                    // sum((u - 32) x) = sum(u x) - 32 sum(x), per four elements.
                    const __m256i p = _mm256_sub_epi32(dot_u8_i8(u[g], xq), _mm256_slli_epi32(dot_u8_i8(one, xq), 5));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sv, _mm256_set1_ps(xr[j].scale(xb))),
                                             acc[j]);
                }
            }
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]);
}

}  // namespace sparrow::cpu::avx2
