// AVX2 K-quant products (Q2_K ... Q6_K weights against Q8_K activations; the integer sums kquant_scalar.cpp
// describes). Compiled with -mavx2 -mfma -mf16c; the ODR rule of kernels_avx2.cpp holds here: only
// <immintrin.h>, <cstddef>, <cstdint>, <cstring>, core/blocks.h and isa_kernels.h, and everything but the
// exported kernels in an anonymous namespace.
//
// Per super-block the weights are unpacked once (per tile of tokens) into eight 32-byte registers of u, and each
// meets the token's 32 activations of the same place in one maddubs (u unsigned, x signed: pairs reach
// 2 * 63 * 127, no saturation) and one madd with the sub-block scales as int16 factors, into int32 lanes that add
// up over the whole super-block. The mins (Q2_K, Q4_K, Q5_K) and the offsets of Q3_K's and Q6_K's u are one madd
// of the sixteen sub-block numbers with the activations' sixteen bsums. With one activation scale per
// super-block, the f32 work is one conversion and FMA per super-block and token (two with mins).
//
// The second half of the file multiplies rows packed eight to a record (BlockQ2_Kx8 ... BlockQ6_Kx8), in the order
// dispatch.h defines for them, as kquant_vnni.cpp does with 256-bit maddubs.
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

// Token j's activation row of Q8_K blocks (unaligned): super-block i's d, its quants 32 at a time, its bsums.
struct XRow {
    const uint8_t *base;
    explicit XRow(const void *x) : base(static_cast<const uint8_t *>(x)) {}
    const uint8_t *block(int64_t i) const { return base + i * static_cast<int64_t>(sizeof(BlockQ8_K)); }
    float d(int64_t i) const {
        float v;
        std::memcpy(&v, block(i) + offsetof(BlockQ8_K, d), 4);
        return v;
    }
    __m256i quants(int64_t i, int g) const {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(block(i) + offsetof(BlockQ8_K, qs) + 32 * g));
    }
    __m256i bsums(int64_t i) const {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(block(i) + offsetof(BlockQ8_K, bsums)));
    }
};

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

// Q4_K / Q5_K (HighBits: Q5_K's fifth bits). Sub-block s of 32 meets the activations' quants 32s..32s+31: one
// maddubs, and one madd with the sub-block's scale broadcast as int16, into the token's int32 lanes; the mins
// are one madd of the eight mins (each twice) with the sixteen bsums.
template <typename Block, bool HighBits>
void dot_tile_min_max(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const Block *>(w);
    const __m256i low4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    XRow xr[kMaxTile] = {XRow(x), XRow(x), XRow(x), XRow(x)};
    for (int j = 0; j < n_x; ++j) xr[j] = XRow(static_cast<const uint8_t *>(x) + j * x_stride);
    __m256 acc[kMaxTile];
    for (auto &a : acc) a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const Block &b = blocks[i];
        prefetch_block(&b, sizeof b);
        uint8_t sc[8], m[8];
        scales_mins(b.scales, sc, m);
        // Mins twice each, in sub-block order, for the sixteen bsums (two per sub-block of 32).
        const __m256i mins16 =
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(m)),
                                                   _mm_loadl_epi64(reinterpret_cast<const __m128i *>(m))));
        __m256i u[8], sc16[8];
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
        // Scale s in every int16 lane: one byte shuffle each from the eight scales (as int16, in both halves).
        const __m256i scales8 =
            _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(sc))));
        for (int s = 0; s < 8; ++s) {
            sc16[s] = _mm256_shuffle_epi8(scales8, _mm256_set1_epi16(static_cast<int16_t>((2 * s + 1) << 8 | 2 * s)));
        }
        const float d = half_to_float(b.d), dmin = half_to_float(b.dmin);
        for (int j = 0; j < n_x; ++j) {
            __m256i sum = _mm256_setzero_si256();
            for (int s = 0; s < 8; ++s) {
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(u[s], xr[j].quants(i, s)), sc16[s]));
            }
            const __m256i mins = _mm256_madd_epi16(mins16, xr[j].bsums(i));
            const float dx = xr[j].d(i);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(d * dx), acc[j]);
            acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(dmin * dx), acc[j]);
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]);
}

// Sub-blocks of 16 (Q2_K, Q3_K, Q6_K): u[g] holds the 32 values meeting the activations' quants 32g..32g+31,
// scale16 the sixteen sub-block numbers as int16 (lane s), offset what comes off every u (0, 4, 32), mins16 the
// sub-blocks' mins (Q2_K; else null). Per token: one maddubs and one madd with the block's two scales per 32
// values, and the offsets and mins from one madd each with the bsums, all in int32 lanes; scaled once.
struct Block16 {
    __m256i u[8];
    __m256i scale16;
    int offset_shift;  // log2 of the offset, or -1 for none
    bool has_mins;
    __m256i mins16;
    float d, dmin;
};

inline void accumulate16(const Block16 &w, const XRow *xr, int n_x, int64_t i, __m256 *acc) {
    __m256i pairs[8];
    spread_pairs(w.scale16, pairs);
    for (int j = 0; j < n_x; ++j) {
        __m256i sum = _mm256_setzero_si256();
        for (int g = 0; g < 8; ++g) {
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(w.u[g], xr[j].quants(i, g)), pairs[g]));
        }
        const __m256i bsums = xr[j].bsums(i);
        if (w.offset_shift >= 0) {
            const __m256i offset = _mm256_madd_epi16(w.scale16, bsums);
            sum = _mm256_sub_epi32(sum, _mm256_sll_epi32(offset, _mm_cvtsi32_si128(w.offset_shift)));
        }
        const float dx = xr[j].d(i);
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(w.d * dx), acc[j]);
        if (w.has_mins) {
            const __m256i mins = _mm256_madd_epi16(w.mins16, bsums);
            acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(w.dmin * dx), acc[j]);
        }
    }
}

template <typename Block, typename Unpack>
void dot_tile_16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out, Unpack unpack) {
    const auto *blocks = static_cast<const Block *>(w);
    XRow xr[kMaxTile] = {XRow(x), XRow(x), XRow(x), XRow(x)};
    for (int j = 0; j < n_x; ++j) xr[j] = XRow(static_cast<const uint8_t *>(x) + j * x_stride);
    __m256 acc[kMaxTile];
    for (auto &a : acc) a = _mm256_setzero_ps();
    Block16 b16;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        prefetch_block(&blocks[i], sizeof(Block));
        unpack(blocks[i], b16);
        accumulate16(b16, xr, n_x, i, acc);
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]);
}

// --- K-quant rows packed eight to a record (BlockQ2_Kx8 ... BlockQ6_Kx8) ------------------------------------------
// Q4_K / Q5_K: one 256-bit load holds four bytes of each of the eight rows; their low nibbles (sub-block 2c) and high
// nibbles (2c + 1) meet the token's broadcast activation dwords in maddubs. Pairs of products reach 2 * 15 * 127, so
// the groups of a sub-block add up in int16 (eight: 30480 at most; Q5_K four) before one madd with the rows' scales as
// int16 pairs takes them to int32. The mins are four madd of the rows' mins (int16 pairs) with the token's pairs of
// 32-element sums; then the two FMAs in the order dispatch.h defines, so the outputs have the scalar level's bits.

constexpr int kPackedPassTokens = 2;  // tokens per pass over a group's records: 16 registers hold two
constexpr int64_t kStageBlocks = 8;   // super-blocks of activations staged at a time

// NT tokens' Q8_K activations for up to kStageBlocks super-blocks (stage_q8_k), read by every group of rows.
template <int NT>
struct StagedTokens {
    Q8KStaged blk[kStageBlocks][NT];
    void fill(const uint8_t *x, size_t x_stride, int64_t k0, int64_t n) {
        stage_q8_k(x, x_stride, NT, k0, n, &blk[0][0]);
    }
};

// The super-block's last f32 step for each token (dispatch.h): acc = fma(float(isum), d * dx, acc).
template <int NT>
inline void add_super_block(const __m256i *isum, __m256 dw, const Q8KStaged *xk, __m256 *acc) {
    for (int j = 0; j < NT; ++j)
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), _mm256_mul_ps(dw, _mm256_set1_ps(xk[j].d)), acc[j]);
}

inline __m256i broadcast_dword(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

// One group of eight rows, super-blocks [0, n) of rec against the NT staged tokens, continuing the sums in y unless
// `first`.
template <int NT, typename R>
void k_rows8(const R *rec, const StagedTokens<NT> &x, int64_t n, bool first, float *y, size_t y_stride) {
    constexpr bool kHighBits = sizeof(R) == sizeof(BlockQ5_Kx8);
    // Groups of four bytes whose maddubs pairs add up in int16: 8 x 2 x 15 x 127 = 30480 fits, Q5_K's 31 does not.
    constexpr int kGroupsPerSum = kHighBits ? 4 : 8;
    const __m256i nibble = _mm256_set1_epi8(0x0f), byte = _mm256_set1_epi32(0xff), one = _mm256_set1_epi8(1);
    const __m256i low6 = _mm256_set1_epi32(0x3f3f3f3f), low4 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i top2 = _mm256_set1_epi32(0x03030303), even_bytes = _mm256_set1_epi32(0x00ff00ff);
    __m256 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        const R &r = rec[k];
        prefetch_block(&r, sizeof r);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(r.d)));
        const __m256 dmw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(r.dmin)));
        const auto word = [&r](int p) {
            return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.scales + 32 * p));
        };
        const __m256i w0 = word(0), w1 = word(1), w2 = word(2);
        const __m256i sc_lo = _mm256_and_si256(w0, low6);
        const __m256i sc_hi = _mm256_or_si256(_mm256_and_si256(w2, low4),
                                              _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), top2), 4));
        const __m256i m_lo = _mm256_and_si256(w1, low6);
        const __m256i m_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), low4),
                                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), top2), 4));
        {
            const __m256i m02 = _mm256_and_si256(m_lo, even_bytes);
            const __m256i m13 = _mm256_and_si256(_mm256_srli_epi32(m_lo, 8), even_bytes);
            const __m256i m46 = _mm256_and_si256(m_hi, even_bytes);
            const __m256i m57 = _mm256_and_si256(_mm256_srli_epi32(m_hi, 8), even_bytes);
            for (int j = 0; j < NT; ++j) {
                const int32_t *p = x.blk[k][j].sums32_skip;
                const __m256i msum =
                    _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(m02, _mm256_set1_epi32(p[0])),
                                                      _mm256_madd_epi16(m13, _mm256_set1_epi32(p[1]))),
                                     _mm256_add_epi32(_mm256_madd_epi16(m46, _mm256_set1_epi32(p[2])),
                                                      _mm256_madd_epi16(m57, _mm256_set1_epi32(p[3]))));
                acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmw, _mm256_set1_ps(x.blk[k][j].d)),
                                          acc[j]);
            }
        }
        __m256i isum[NT];
        for (int j = 0; j < NT; ++j) isum[j] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
            const __m256i sc = c < 2 ? sc_lo : sc_hi;  // sub-blocks 2c and 2c + 1: bytes 2c % 4 and 2c % 4 + 1
            const __m256i sc_a = _mm256_and_si256(_mm256_srli_epi32(sc, 16 * (c % 2)), byte);
            const __m256i sc_b = _mm256_and_si256(_mm256_srli_epi32(sc, 16 * (c % 2) + 8), byte);
            const __m256i sc16_a = _mm256_or_si256(sc_a, _mm256_slli_epi32(sc_a, 16));
            const __m256i sc16_b = _mm256_or_si256(sc_b, _mm256_slli_epi32(sc_b, 16));
            for (int g0 = 0; g0 < 8; g0 += kGroupsPerSum) {
                __m256i slo[NT], shi[NT];
                for (int j = 0; j < NT; ++j) slo[j] = shi[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int g = g0; g < g0 + kGroupsPerSum; ++g) {
                    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.qs + 32 * (8 * c + g)));
                    __m256i lo = _mm256_and_si256(wq, nibble);
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wq, 4), nibble);
                    if constexpr (kHighBits) {  // Q5_K: bits 2c and 2c + 1 of the group's qh bytes, as bit 4
                        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.qh + 32 * g));
                        lo = _mm256_or_si256(lo,
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                        hi = _mm256_or_si256(
                            hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
                    }
                    for (int j = 0; j < NT; ++j) {
                        const int8_t *xq = x.blk[k][j].qs + 64 * c + 4 * g;
                        slo[j] = _mm256_add_epi16(slo[j], _mm256_maddubs_epi16(lo, broadcast_dword(xq)));
                        shi[j] = _mm256_add_epi16(shi[j], _mm256_maddubs_epi16(hi, broadcast_dword(xq + 32)));
                    }
                }
                for (int j = 0; j < NT; ++j) {
                    isum[j] = _mm256_add_epi32(isum[j], _mm256_add_epi32(_mm256_madd_epi16(slo[j], sc16_a),
                                                                         _mm256_madd_epi16(shi[j], sc16_b)));
                }
            }
        }
        add_super_block<NT>(isum, dw, x.blk[k], acc);
    }
    for (int j = 0; j < NT; ++j) _mm256_storeu_ps(y + j * y_stride, acc[j]);
}

// Q6_K (BlockQ6_Kx8; the element order kquant_vnni.cpp's q6_k_rows16 describes). Pairs of products reach
// 2 * 63 * 127, so each maddubs goes to int32 at once, in one madd with its sub-block's scale as int16 pairs.
template <int NT>
void q6_k_rows8(const BlockQ6_Kx8 *rec, const StagedTokens<NT> &x, int64_t n, bool first, float *y, size_t y_stride) {
    const __m256i nibble = _mm256_set1_epi8(0x0f), two_bits = _mm256_set1_epi8(3);
    __m256 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        const BlockQ6_Kx8 &r = rec[k];
        prefetch_block(&r, sizeof r);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(r.d)));
        // Sub-block s's scale in both int16 halves of each row's lane.
        const auto scale16 = [&r](int s) {
            const __m256i sc =
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 8 * s)));
            return _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(sc, 16));
        };
        __m256i isum[NT];
        {
            __m256i offsets[NT];
            for (int j = 0; j < NT; ++j) offsets[j] = _mm256_setzero_si256();
            for (int p = 0; p < 8; ++p) {  // sub-blocks 2p and 2p + 1, as int16 pairs
                const __m256i sc2 = _mm256_cvtepi8_epi16(
                    _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 16 * p)),
                                      _mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 16 * p + 8))));
                for (int j = 0; j < NT; ++j) {
                    offsets[j] = _mm256_add_epi32(
                        offsets[j], _mm256_madd_epi16(sc2, _mm256_set1_epi32(x.blk[k][j].sums16_adjacent[p])));
                }
            }
            for (int j = 0; j < NT; ++j)
                isum[j] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offsets[j], 5));
        }
        for (int h = 0; h < 2; ++h) {
            for (int q = 0; q < 2; ++q) {
                for (int src = 0; src < 2; ++src) {
                    const __m256i sc_lo = scale16(8 * h + 2 * src + q), sc_hi = scale16(8 * h + 2 * (src + 2) + q);
#pragma GCC unroll 4
                    for (int i = 4 * q; i < 4 * q + 4; ++i) {
                        const __m256i wq =
                            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.ql + 32 * (16 * h + 8 * src + i)));
                        const __m256i qh =
                            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.qh + 32 * (8 * h + i)));
                        const __m256i lo = _mm256_or_si256(
                            _mm256_and_si256(wq, nibble),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * src), two_bits), 4));
                        const __m256i hi = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(wq, 4), nibble),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * src + 4), two_bits), 4));
                        for (int j = 0; j < NT; ++j) {
                            const int8_t *xq = x.blk[k][j].qs + 128 * h + 4 * i;
                            isum[j] = _mm256_add_epi32(
                                isum[j],
                                _mm256_add_epi32(
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(lo, broadcast_dword(xq + 32 * src)), sc_lo),
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(hi, broadcast_dword(xq + 32 * (src + 2))),
                                                      sc_hi)));
                        }
                    }
                }
            }
        }
        add_super_block<NT>(isum, dw, x.blk[k], acc);
    }
    for (int j = 0; j < NT; ++j) _mm256_storeu_ps(y + j * y_stride, acc[j]);
}

// Q2_K and Q3_K (BlockQ2_Kx8, BlockQ3_Kx8; the element and scale order kquant_vnni.cpp's low2_rows16 describes).
// Pairs of products reach 2 * 7 * 127, so a sub-block's four groups add up in int16 before one madd with its scale
// as int16 pairs.
template <int NT, typename R>
void low2_rows8(const R *rec, const StagedTokens<NT> &x, int64_t n, bool first, float *y, size_t y_stride) {
    constexpr bool kQ3 = sizeof(R) == sizeof(BlockQ3_Kx8);
    const __m256i two_bits = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i low4 = _mm256_set1_epi32(0x0f0f0f0f), top2 = _mm256_set1_epi32(0x03030303);
    const __m256i even_bytes = _mm256_set1_epi32(0x00ff00ff), pair32 = _mm256_set1_epi32(0x00200020);
    __m256 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        const R &r = rec[k];
        prefetch_block(&r, sizeof r);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(r.d)));
        __m256i isum[NT];
        __m256i sc4[4];  // Q3_K: the scales, four per lane
        if constexpr (kQ3) {
            const auto word = [&r](int p) {
                return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.scales + 32 * p));
            };
            const __m256i w0 = word(0), w1 = word(1), w2 = word(2);
            const auto top = [&](int shift) {
                return _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w2, shift), top2), 4);
            };
            sc4[0] = _mm256_or_si256(_mm256_and_si256(w0, low4), top(0));
            sc4[1] = _mm256_or_si256(_mm256_and_si256(w1, low4), top(2));
            sc4[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w0, 4), low4), top(4));
            sc4[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w1, 4), low4), top(6));
            __m256i offsets[NT];
            for (int j = 0; j < NT; ++j) offsets[j] = _mm256_setzero_si256();
            for (int q = 0; q < 4; ++q) {
                const __m256i even = _mm256_sub_epi16(_mm256_and_si256(sc4[q], even_bytes), pair32);
                const __m256i odd =
                    _mm256_sub_epi16(_mm256_and_si256(_mm256_srli_epi32(sc4[q], 8), even_bytes), pair32);
                for (int j = 0; j < NT; ++j) {
                    const int32_t *p = x.blk[k][j].sums16_skip;
                    offsets[j] = _mm256_add_epi32(
                        offsets[j], _mm256_add_epi32(_mm256_madd_epi16(even, _mm256_set1_epi32(p[2 * q])),
                                                     _mm256_madd_epi16(odd, _mm256_set1_epi32(p[2 * q + 1]))));
                }
            }
            for (int j = 0; j < NT; ++j)
                isum[j] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offsets[j], 2));
        } else {
            const __m256 dmw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(r.dmin)));
            __m256i msum[NT];
            for (int j = 0; j < NT; ++j) msum[j] = _mm256_setzero_si256();
            for (int p = 0; p < 8; ++p) {  // sub-blocks 2p and 2p + 1: their mins (high nibbles) as int16 pairs
                const __m256i m2 =
                    _mm256_srli_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(
                                          _mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 16 * p)),
                                          _mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 16 * p + 8)))),
                                      4);
                for (int j = 0; j < NT; ++j) {
                    msum[j] = _mm256_add_epi32(
                        msum[j], _mm256_madd_epi16(m2, _mm256_set1_epi32(x.blk[k][j].sums16_adjacent[p])));
                }
            }
            for (int j = 0; j < NT; ++j) {
                acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[j]),
                                          _mm256_mul_ps(dmw, _mm256_set1_ps(x.blk[k][j].d)), acc[j]);
                isum[j] = _mm256_setzero_si256();
            }
        }
        for (int h = 0; h < 2; ++h) {
            for (int q = 0; q < 2; ++q) {
                for (int g = 0; g < 4; ++g) {  // sub-block 8h + 2g + q: bit pair g of groups 8h + 4q + i
                    const int s = 8 * h + 2 * g + q;
                    __m256i sc;
                    if constexpr (kQ3) {
                        sc = _mm256_sub_epi32(
                            _mm256_and_si256(_mm256_srli_epi32(sc4[s / 4], 8 * (s % 4)), _mm256_set1_epi32(0xff)),
                            _mm256_set1_epi32(32));
                    } else {
                        sc = _mm256_and_si256(
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 8 * s))),
                            _mm256_set1_epi32(15));
                    }
                    const __m256i sc16 =
                        _mm256_or_si256(_mm256_and_si256(sc, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(sc, 16));
                    __m256i s16[NT];
                    for (int j = 0; j < NT; ++j) s16[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i) {
                        const int G = 8 * h + 4 * q + i;
                        const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.qs + 32 * G));
                        __m256i u = _mm256_and_si256(_mm256_srli_epi16(wq, 2 * g), two_bits);
                        if constexpr (kQ3) {
                            const __m256i hm =
                                _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.hmask + 32 * (4 * q + i)));
                            u = _mm256_or_si256(
                                u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + g), one), 2));
                        }
                        for (int j = 0; j < NT; ++j) {
                            const int8_t *xq = x.blk[k][j].qs + 128 * h + 32 * g + 4 * (4 * q + i);
                            s16[j] = _mm256_add_epi16(s16[j], _mm256_maddubs_epi16(u, broadcast_dword(xq)));
                        }
                    }
                    for (int j = 0; j < NT; ++j) isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(s16[j], sc16));
                }
            }
        }
        add_super_block<NT>(isum, dw, x.blk[k], acc);
    }
    for (int j = 0; j < NT; ++j) _mm256_storeu_ps(y + j * y_stride, acc[j]);
}

// IQ4_XS (BlockIQ4_XSx8), eight rows: each group's nibbles looked up in the code book with a byte shuffle (signed
// values), their signs moved onto the token's broadcast activation dword, and one maddubs (pairs of at most
// 2 * 127 * 127) and one madd per group give one int32 lane per row; the rows' ls - 32 multiply each sub-block's sum
// (vpmulld), then one FMA per super-block and token, in dispatch.h's order.
template <int NT>
void iq4_xs_rows8(const BlockIQ4_XSx8 *rec, const StagedTokens<NT> &x, int64_t n, bool first, float *y,
                  size_t y_stride) {
    const __m256i nibble = _mm256_set1_epi8(0x0f), ones16 = _mm256_set1_epi16(1);
    const __m256i low4 = _mm256_set1_epi32(15), two_bits = _mm256_set1_epi32(3), bias = _mm256_set1_epi32(32);
    const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues)));
    __m256 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        const BlockIQ4_XSx8 &r = rec[k];
        prefetch_block(&r, sizeof r);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(r.d)));
        const __m256i sl = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.scales_l));
        const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(r.scales_h)));
        __m256i isum[NT];
        for (int j = 0; j < NT; ++j) isum[j] = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) {
            const __m256i ls =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(sl, 4 * s), low4),
                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * s), two_bits), 4));
            const __m256i sc = _mm256_sub_epi32(ls, bias);
            __m256i dot[NT];
            for (int j = 0; j < NT; ++j) dot[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.qs + 32 * (4 * s + i)));
                const __m256i lo = _mm256_shuffle_epi8(book, _mm256_and_si256(wq, nibble));
                const __m256i hi = _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16(wq, 4), nibble));
                const __m256i abs_lo = _mm256_abs_epi8(lo), abs_hi = _mm256_abs_epi8(hi);
                for (int j = 0; j < NT; ++j) {
                    const int8_t *xs = x.blk[k][j].qs + 32 * s + 4 * i;
                    const __m256i p_lo = _mm256_maddubs_epi16(abs_lo, _mm256_sign_epi8(broadcast_dword(xs), lo));
                    const __m256i p_hi = _mm256_maddubs_epi16(abs_hi, _mm256_sign_epi8(broadcast_dword(xs + 16), hi));
                    dot[j] = _mm256_add_epi32(
                        dot[j], _mm256_add_epi32(_mm256_madd_epi16(p_lo, ones16), _mm256_madd_epi16(p_hi, ones16)));
                }
            }
            for (int j = 0; j < NT; ++j) isum[j] = _mm256_add_epi32(isum[j], _mm256_mullo_epi32(dot[j], sc));
        }
        add_super_block<NT>(isum, dw, x.blk[k], acc);
    }
    for (int j = 0; j < NT; ++j) _mm256_storeu_ps(y + j * y_stride, acc[j]);
}

template <int NT, typename R>
void k_pass(const uint8_t *w, size_t w_stride, int64_t n_rows, const uint8_t *x, size_t x_stride, int64_t nb, float *y,
            size_t y_stride) {
    StagedTokens<NT> staged;
    for (int64_t k0 = 0; k0 < nb; k0 += kStageBlocks) {
        const int64_t n = nb - k0 < kStageBlocks ? nb - k0 : kStageBlocks;
        staged.fill(x, x_stride, k0, n);
        for (int64_t g0 = 0; g0 < n_rows; g0 += 8) {
            const auto *rec = reinterpret_cast<const R *>(w + g0 * static_cast<int64_t>(w_stride));
            if constexpr (sizeof(R) == sizeof(BlockQ6_Kx8)) {
                q6_k_rows8<NT>(rec + k0, staged, n, k0 == 0, y + g0, y_stride);
            } else if constexpr (sizeof(R) == sizeof(BlockQ2_Kx8) || sizeof(R) == sizeof(BlockQ3_Kx8)) {
                low2_rows8<NT>(rec + k0, staged, n, k0 == 0, y + g0, y_stride);
            } else if constexpr (sizeof(R) == sizeof(BlockIQ4_XSx8)) {
                iq4_xs_rows8<NT>(rec + k0, staged, n, k0 == 0, y + g0, y_stride);
            } else {
                k_rows8<NT>(rec + k0, staged, n, k0 == 0, y + g0, y_stride);
            }
        }
    }
}

template <typename R>
void k_rows_any(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                float *y, size_t y_stride) {
    const auto *wb = static_cast<const uint8_t *>(w);
    const int64_t nb = n / QK_K;
    for (int j0 = 0; j0 < n_x; j0 += kPackedPassTokens) {
        const uint8_t *xp = static_cast<const uint8_t *>(x) + j0 * x_stride;
        if (n_x - j0 >= 2) {
            k_pass<2, R>(wb, w_stride, n_rows, xp, x_stride, nb, y + j0 * y_stride, y_stride);
        } else {
            k_pass<1, R>(wb, w_stride, n_rows, xp, x_stride, nb, y + j0 * y_stride, y_stride);
        }
    }
}

}  // namespace

void dot_tile_q2_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_16<BlockQ2_K>(w, x, x_stride, n_x, n, out, [](const BlockQ2_K &b, Block16 &o) {
        two_bit_planes(b.qs, o.u);
        const __m256i packed = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b.scales)));
        o.scale16 = _mm256_and_si256(packed, _mm256_set1_epi16(15));
        o.mins16 = _mm256_srli_epi16(packed, 4);
        o.has_mins = true;
        o.offset_shift = -1;
        o.d = half_to_float(b.d);
        o.dmin = half_to_float(b.dmin);
    });
}

void dot_tile_q3_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_16<BlockQ3_K>(w, x, x_stride, n_x, n, out, [](const BlockQ3_K &b, Block16 &o) {
        // u = low two bits | third bit << 2 in [0, 7]; the value is u - 4.
        two_bit_planes(b.qs, o.u);
        const __m256i one = _mm256_set1_epi8(1);
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.hmask));
        for (int g = 0; g < 8; ++g) {  // block g's third bits: bit g of hmask's bytes
            const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(g)), one);
            o.u[g] = _mm256_or_si256(o.u[g], _mm256_slli_epi16(bit, 2));
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
        o.scale16 = _mm256_cvtepi8_epi16(sc8);
        o.has_mins = false;
        o.offset_shift = 2;
        o.d = half_to_float(b.d);
        o.dmin = 0.0f;
    });
}

void dot_tile_q4_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_min_max<BlockQ4_K, false>(w, x, x_stride, n_x, n, out);
}

void dot_tile_q5_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_min_max<BlockQ5_K, true>(w, x, x_stride, n_x, n, out);
}

void dot_tile_q6_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_16<BlockQ6_K>(w, x, x_stride, n_x, n, out, [](const BlockQ6_K &b, Block16 &o) {
        const __m256i low4 = _mm256_set1_epi8(15), two_bits = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; ++h) {
            const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qh + 32 * h));
            // Block 4h + g of the super-block: four bits from ql, bits 2g..2g+1 of qh above them.
            o.u[4 * h] =
                _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, two_bits), 4));
            o.u[4 * h + 1] =
                _mm256_or_si256(_mm256_and_si256(ql1, low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two_bits), 4));
            o.u[4 * h + 2] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two_bits), 4));
            o.u[4 * h + 3] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two_bits), 4));
        }
        o.scale16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b.scales)));
        o.has_mins = false;
        o.offset_shift = 5;
        o.d = half_to_float(b.d);
        o.dmin = 0.0f;
    });
}

// IQ4_XS: each sub-block's nibbles looked up in the code book with a byte shuffle, the values' signs moved onto x
// (maddubs wants its first operand unsigned; no value is 0), then one maddubs and one madd with the sub-block's
// ls - 32 in every int16 lane, summed in int32 and scaled once per super-block, as dot_tile_min_max does.
void dot_tile_iq4_xs(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const BlockIQ4_XS *>(w);
    const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues)));
    const __m128i low4 = _mm_set1_epi8(15);
    XRow xr[kMaxTile] = {XRow(x), XRow(x), XRow(x), XRow(x)};
    for (int j = 0; j < n_x; ++j) xr[j] = XRow(static_cast<const uint8_t *>(x) + j * x_stride);
    __m256 acc[kMaxTile];
    for (auto &a : acc) a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const BlockIQ4_XS &b = blocks[i];
        prefetch_block(&b, sizeof b);
        __m256i v[8], mag[8], sc16[8];
        for (int s = 0; s < 8; ++s) {
            const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b.qs + 16 * s));
            v[s] = _mm256_shuffle_epi8(
                book, _mm256_setr_m128i(_mm_and_si128(q, low4), _mm_and_si128(_mm_srli_epi16(q, 4), low4)));
            mag[s] = _mm256_sign_epi8(v[s], v[s]);
            const int ls = ((b.scales_l[s / 2] >> (4 * (s % 2))) & 15) | (((b.scales_h >> (2 * s)) & 3) << 4);
            sc16[s] = _mm256_set1_epi16(static_cast<int16_t>(ls - 32));
        }
        const float d = half_to_float(b.d);
        for (int j = 0; j < n_x; ++j) {
            __m256i sum = _mm256_setzero_si256();
            for (int s = 0; s < 8; ++s) {
                const __m256i xq = _mm256_sign_epi8(xr[j].quants(i, s), v[s]);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(mag[s], xq), sc16[s]));
            }
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(d * xr[j].d(i)), acc[j]);
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]);
}

void dot_rows_q2_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    k_rows_any<BlockQ2_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_rows_q3_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    k_rows_any<BlockQ3_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_rows_q4_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    k_rows_any<BlockQ4_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_rows_q5_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    k_rows_any<BlockQ5_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_rows_q6_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    k_rows_any<BlockQ6_Kx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_rows_iq4_xsx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                       int64_t n, float *y, size_t y_stride) {
    k_rows_any<BlockIQ4_XSx8>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

}  // namespace sparrow::cpu::avx2
