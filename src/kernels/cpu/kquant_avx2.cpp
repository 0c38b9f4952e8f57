// AVX2 K-quant products (Q2_K ... Q6_K weights against the Q8_0 dot-x activations; the integer sums
// kquant_scalar.cpp describes). Compiled with -mavx2 -mfma -mf16c; the ODR rule of kernels_avx2.cpp holds
// here: only <immintrin.h>, <cstddef>, <cstdint>, <cstring>, core/blocks.h and isa_kernels.h, and everything
// but the exported kernels in an anonymous namespace.
//
// Per super-block the weights are unpacked once into 32-byte registers of u (one per activation block) and
// meet each token's block in one maddubs (u unsigned, x signed: pairs reach 2 * 63 * 127, no saturation) and
// one madd into eight int32 lanes (with the sub-block scales as the madd's factors where sub-blocks have 16
// elements; their mins or offsets come from the activations' half sums in one madd per super-block). The eight blocks'
// lanes are summed to one lane per block, scaled in f32 by eight-lane vectors of the blocks' scales and accumulated per
// token; the mins (Q4_K, Q5_K) are the eight sub-blocks' dmin * m * dx * sum(x) in one vector, from the activation
// row's block sums.
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

// The eight 6-bit scales (sc) and mins (m) of a Q4_K / Q5_K block's twelve packed bytes (core/blocks.h), as
// eight bytes each: with the bytes read as three little-endian words w0..w2, sc 0-3 are the low 6 bits of w0's
// bytes and m 0-3 those of w1's; sc 4-7 are w2's low nibbles with the top 2 bits of w0's bytes above them, and
// m 4-7 w2's high nibbles with the top 2 bits of w1's bytes.
inline void scales_mins(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
    uint32_t w[3];
    std::memcpy(w, q, 12);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
    const uint32_t s[2] = {w[0] & low6, (w[2] & low4) | (((w[0] >> 6) & top2) << 4)};
    const uint32_t mm[2] = {w[1] & low6, ((w[2] >> 4) & low4) | (((w[1] >> 6) & top2) << 4)};
    std::memcpy(sc, s, 8);
    std::memcpy(m, mm, 8);
}

// Eight bytes as eight f32.
inline __m256 bytes_to_ps(const uint8_t *b) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(b))));
}

// Token j's activation row: block b's 32 quants, and the scales, block sums and half sums of the eight blocks
// from b on.
struct XRow {
    const uint8_t *base;
    int64_t scales_at, sums_at, halves_at;
    XRow(const void *x, int64_t n)
        : base(static_cast<const uint8_t *>(x)),
          scales_at(n / QK8_0 * static_cast<int64_t>(sizeof(BlockQ8_0))),
          sums_at(scales_at + n / QK8_0 * 4),
          halves_at(sums_at + n / QK8_0 * 4) {}
    __m256i quants(int64_t b) const {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(base + b * sizeof(BlockQ8_0) + 2));
    }
    __m256 scales8(int64_t b) const {
        return _mm256_loadu_ps(reinterpret_cast<const float *>(base + scales_at + b * 4));
    }
    // 128 x sum(x) of eight blocks from b, as f32 (exact: |128 x 32 x 127| < 2^24).
    __m256 sums8(int64_t b) const {
        return _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(base + sums_at + b * 4)));
    }
    // The sums of the sixteen halves of eight blocks from b (int16 lane 2k: block b + k's first 16 quants).
    __m256i halves16(int64_t b) const {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(base + halves_at + b * 4));
    }
};

// sum(u x) in eight int32 lanes, four elements each.
inline __m256i dot_u8_i8(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

// Eight vectors of eight int32 lanes to one vector whose lane s is the sum of p[s]'s lanes: pairwise adds
// within each 128-bit half leave each vector's two half-sums side by side, and the halves then meet.
inline __m256i sum_lanes8(const __m256i p[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    // a = [s0 s1 s2 s3 | s0' s1' s2' s3'] (low half-sums | high ones), b likewise for 4..7.
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// Sixteen sub-block numbers of 16 elements (int16 lanes of v, sub-block s in lane s) spread over the eight
// 32-element blocks: out[b] holds number 2b in its low 128 bits and 2b + 1 in its high ones, so that a madd of
// block b's sixteen pair sums (pairs 0-7 in the low half) scales each pair by its own sub-block's number.
inline void spread_pairs(__m256i v, __m256i out[8]) {
    const __m256i halves[2] = {_mm256_permute2x128_si256(v, v, 0x00), _mm256_permute2x128_si256(v, v, 0x11)};
    for (int b = 0; b < 8; ++b) {
        const int k = b % 4;  // within a half: int16 lane 2k to the low 128 bits, 2k + 1 to the high ones
        const __m256i pick = _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>((4 * k + 1) << 8 | 4 * k)),
                                               _mm_set1_epi16(static_cast<int16_t>((4 * k + 3) << 8 | (4 * k + 2))));
        out[b] = _mm256_shuffle_epi8(halves[b / 4], pick);
    }
}

// Q2_K and Q3_K: the low two bits of the elements of block 4h + g (g < 4) are bits 2g of the 32 bytes of qs
// from 32h; u[b] gets them.
inline void two_bit_planes(const uint8_t *qs, __m256i u[8]) {
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs + 32 * h));
        u[4 * h] = _mm256_and_si256(q, three);
        u[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), three);
        u[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), three);
        u[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), three);
    }
}

inline void prefetch_block(const void *b, size_t bytes) {
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(static_cast<const char *>(b) + kPrefetchBytes + l, _MM_HINT_T0);
}

// Q4_K / Q5_K. HighBits: whether the block has Q5_K's fifth bits. Per super-block and token: the eight
// sub-blocks' integer dots in one vector (lane s), scaled by d * sc_s * dx_s; the mins by dmin * m_s * dx_s *
// sum(x_s), both as eight-lane vectors.
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
        prefetch_block(&b, sizeof b);
        uint8_t sc[8], m[8];
        scales_mins(b.scales, sc, m);
        const __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b.d)), bytes_to_ps(sc));
        const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(half_to_float(b.dmin)), bytes_to_ps(m));
        __m256i u[8];
        __m256i qh = _mm256_setzero_si256();
        if constexpr (HighBits) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qh));
        for (int c = 0; c < 4; ++c) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qs + 32 * c));
            u[2 * c] = _mm256_and_si256(q, low4);
            u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if constexpr (HighBits) {
                const __m128i s_lo = _mm_cvtsi32_si128(2 * c), s_hi = _mm_cvtsi32_si128(2 * c + 1);
                u[2 * c] =
                    _mm256_or_si256(u[2 * c], _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s_lo), one), 4));
                u[2 * c + 1] = _mm256_or_si256(u[2 * c + 1],
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s_hi), one), 4));
            }
        }
        for (int j = 0; j < n_x; ++j) {
            __m256i p[8];
            for (int s = 0; s < 8; ++s) p[s] = dot_u8_i8(u[s], xr[j].quants(i * 8 + s));
            const __m256 dx = xr[j].scales8(i * 8);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum_lanes8(p)), _mm256_mul_ps(dsc, dx), acc[j]);
            mins[j] = _mm256_fmadd_ps(_mm256_mul_ps(dm, dx), xr[j].sums8(i * 8), mins[j]);
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]) - hsum(mins[j]) * (1.0f / 128.0f);
}

}  // namespace

void dot_tile_q2_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    // Per block: madd of the pair sums of u x with the two sub-blocks' scales; the eight blocks then sum to one lane
    // each. The mins: one madd of the sixteen mins with the activations' sixteen half sums gives each block's
    // m_0 * sum(x_0) + m_1 * sum(x_1) in its lane. Scaled by d * dx and dmin * dx.
    const auto *blocks = static_cast<const BlockQ2_K *>(w);
    XRow xr[kMaxTile] = {XRow(x, n), XRow(x, n), XRow(x, n), XRow(x, n)};
    for (int j = 0; j < n_x; ++j) xr[j] = XRow(static_cast<const uint8_t *>(x) + j * x_stride, n);
    __m256 acc[kMaxTile];
    for (auto &a : acc) a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const BlockQ2_K &b = blocks[i];
        prefetch_block(&b, sizeof b);
        __m256i u[8], sc16[8];
        two_bit_planes(b.qs, u);
        const __m256i packed = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b.scales)));
        spread_pairs(_mm256_and_si256(packed, _mm256_set1_epi16(15)), sc16);
        const __m256i mins16 = _mm256_srli_epi16(packed, 4);  // lane s: sub-block s's min
        const __m256 d = _mm256_set1_ps(half_to_float(b.d)), dmin = _mm256_set1_ps(half_to_float(b.dmin));
        for (int j = 0; j < n_x; ++j) {
            __m256i p[8];
            for (int g = 0; g < 8; ++g)
                p[g] = _mm256_madd_epi16(_mm256_maddubs_epi16(u[g], xr[j].quants(i * 8 + g)), sc16[g]);
            const __m256 mins = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, xr[j].halves16(i * 8)));
            const __m256 scaled = _mm256_fmsub_ps(_mm256_cvtepi32_ps(sum_lanes8(p)), d, _mm256_mul_ps(mins, dmin));
            acc[j] = _mm256_fmadd_ps(scaled, xr[j].scales8(i * 8), acc[j]);
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]);
}

void dot_tile_q3_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    // As Q6_K: u = low two bits | third bit << 2 in [0, 7]; per block a madd of the pair sums of u x with the two
    // signed sub-block scales, eight blocks to one lane each, less 4 x (sc_0 sum(x_0) + sc_1 sum(x_1)) from one
    // madd of the sixteen scales with the half sums; scaled by d * dx.
    const auto *blocks = static_cast<const BlockQ3_K *>(w);
    const __m256i one = _mm256_set1_epi8(1);
    XRow xr[kMaxTile] = {XRow(x, n), XRow(x, n), XRow(x, n), XRow(x, n)};
    for (int j = 0; j < n_x; ++j) xr[j] = XRow(static_cast<const uint8_t *>(x) + j * x_stride, n);
    __m256 acc[kMaxTile];
    for (auto &a : acc) a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const BlockQ3_K &b = blocks[i];
        prefetch_block(&b, sizeof b);
        __m256i u[8], sc16[8];
        two_bit_planes(b.qs, u);
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.hmask));
        for (int g = 0; g < 8; ++g) {  // block g's third bits: bit g of hmask's bytes
            const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(g)), one);
            u[g] = _mm256_or_si256(u[g], _mm256_slli_epi16(bit, 2));
        }
        // The sixteen 6-bit scales from the twelve bytes read as words w0..w2 (core/blocks.h): scales 0-3 are w0's
        // low nibbles, 4-7 w1's, 8-11 w0's high nibbles, 12-15 w1's, each with two bits of w2's bytes above
        // (bits 0-1 for 0-3, 2-3 for 4-7, 4-5 for 8-11, 6-7 for 12-15); minus 32.
        uint32_t wv[3];
        std::memcpy(wv, b.scales, 12);
        const uint32_t low4 = 0x0f0f0f0f, top2 = 0x03030303;
        const uint32_t sw[4] = {(wv[0] & low4) | ((wv[2] & top2) << 4), (wv[1] & low4) | (((wv[2] >> 2) & top2) << 4),
                                ((wv[0] >> 4) & low4) | (((wv[2] >> 4) & top2) << 4),
                                ((wv[1] >> 4) & low4) | (((wv[2] >> 6) & top2) << 4)};
        const __m128i sc8 = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i *>(sw)), _mm_set1_epi8(32));
        const __m256i scales16 = _mm256_cvtepi8_epi16(sc8);  // lane s: sub-block s's scale
        spread_pairs(scales16, sc16);
        const __m256 d = _mm256_set1_ps(half_to_float(b.d));
        for (int j = 0; j < n_x; ++j) {
            __m256i p[8];
            for (int g = 0; g < 8; ++g)
                p[g] = _mm256_madd_epi16(_mm256_maddubs_epi16(u[g], xr[j].quants(i * 8 + g)), sc16[g]);
            const __m256i offset = _mm256_madd_epi16(scales16, xr[j].halves16(i * 8));
            const __m256i total = _mm256_sub_epi32(sum_lanes8(p), _mm256_slli_epi32(offset, 2));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, xr[j].scales8(i * 8)), acc[j]);
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]);
}

void dot_tile_q4_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_min_max<BlockQ4_K, false>(w, x, x_stride, n_x, n, out);
}

void dot_tile_q5_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_min_max<BlockQ5_K, true>(w, x, x_stride, n_x, n, out);
}

void dot_tile_q6_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    // Per 32-element activation block: a madd of the pair sums of u x with the block's two sub-block scales (pairs
    // 0-7 meet the first, 8-15 the second) gives eight int32 lanes already scaled; the eight blocks of a
    // super-block then sum to one lane each, less 32 x (sc_0 sum(x_0) + sc_1 sum(x_1)) from one madd of the sixteen
    // scales with the half sums, and are scaled by d * dx.
    const auto *blocks = static_cast<const BlockQ6_K *>(w);
    const __m256i low4 = _mm256_set1_epi8(15), two_bits = _mm256_set1_epi8(3);
    XRow xr[kMaxTile] = {XRow(x, n), XRow(x, n), XRow(x, n), XRow(x, n)};
    for (int j = 0; j < n_x; ++j) xr[j] = XRow(static_cast<const uint8_t *>(x) + j * x_stride, n);
    __m256 acc[kMaxTile];
    for (auto &a : acc) a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const BlockQ6_K &b = blocks[i];
        prefetch_block(&b, sizeof b);
        __m256i u[8], scale16[8];
        for (int h = 0; h < 2; ++h) {
            const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qh + 32 * h));
            // Block 4h + g of the super-block: four bits from ql, bits 2g..2g+1 of qh above them.
            u[4 * h] =
                _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, two_bits), 4));
            u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two_bits), 4));
            u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two_bits), 4));
            u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two_bits), 4));
        }
        const __m256i scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b.scales)));
        spread_pairs(scales16, scale16);
        const __m256 d = _mm256_set1_ps(half_to_float(b.d));
        for (int j = 0; j < n_x; ++j) {
            __m256i p[8];
            for (int g = 0; g < 8; ++g) {
                p[g] = _mm256_madd_epi16(_mm256_maddubs_epi16(u[g], xr[j].quants(i * 8 + g)), scale16[g]);
            }
            const __m256i offset = _mm256_madd_epi16(scales16, xr[j].halves16(i * 8));
            const __m256i total = _mm256_sub_epi32(sum_lanes8(p), _mm256_slli_epi32(offset, 5));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, xr[j].scales8(i * 8)), acc[j]);
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]);
}

}  // namespace sparrow::cpu::avx2
