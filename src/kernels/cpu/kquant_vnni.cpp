// AVX512-VNNI kernels for K-quant rows packed eight to a record (BlockQ2_Kx8 ... BlockQ6_Kx8; core/blocks.h)
// against Q8_K activations. Q4_K first (Q5_K: the same with the fifth bit of each
// element put above its nibble); Q6_K has a kernel of its own below, and Q2_K and Q3_K share one.
// Compiled with AVX-512 and VNNI (CMakeLists.txt: files named *_vnni.cpp) and called only when cpuid has both.
//
// As kernels_vnni.cpp does for Q4_0: sixteen rows at a time, the records of two groups of eight side by side in one
// 512-bit register, so one vpdpbusd multiplies four unsigned nibbles of each of 16 rows with a token's broadcast
// activation dword. A chunk of 64 elements holds two sub-blocks (the low and the high nibbles of 32 bytes), whose
// dots end in two int32 vectors, one lane per row; the rows' 6-bit sub-block scales, unpacked for all 16 rows at once
// from the record's planes of scale words, multiply them (vpmulld) into the super-block's integer sum. The mins are
// four vpmaddwd of the rows' mins (int16 pairs) with the token's 32-element activation sums. Then two FMAs per
// super-block and token, in the order dispatch.h defines for packed Q4_K rows, so every output has the scalar level's
// bits.
//
// Tokens go up to eight per pass over a group's records. Up to four, a group's load serves two sub-blocks (two dot
// vectors per token, its integer sum and f32 accumulator fill the 32 registers); with more, each sub-block is swept
// apart, loading the group again, so that each unpacking serves eight tokens (add_two_sub_blocks).
//
// ODR rule (as kernels_avx2.cpp): this file includes only <immintrin.h>, <cstddef>, <cstdint>, <cstring>,
// core/blocks.h and isa_kernels.h, and everything but the exported kernels sits in an anonymous namespace.

#include "kernels/cpu/avx512_intrinsics.h"  // <immintrin.h> without GCC 12's false warnings

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/blocks.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::avx512vnni {

namespace {

// A token count as a type, to pick a template instance at run time.
template <int N>
struct Count {
    static constexpr int value = N;
};
// Super-blocks of activations staged at a time (8 = a 2048-wide row); the stage serves every group of rows.
constexpr int64_t kStageBlocks = 8;

// As kernels_vnni.cpp: the packed matrix is streamed, so ask for the bytes 4 KiB ahead of those being read.
constexpr int64_t kPrefetchBytes = 4096;
inline void prefetch_ahead(const void *p, size_t bytes) {
    const char *ahead = static_cast<const char *>(p) + kPrefetchBytes;
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
}

// acc + the dword sums of u (unsigned bytes) x the signed dword at p broadcast to all 16 lanes (kernels_vnni.cpp
// says why in asm).
inline __m512i dpbusd_bcast(__m512i acc, __m512i u, const int8_t *p) {
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t(*)>(p)));
    return acc;
}

// Two records' 32 bytes at the same offset (rows 0..7 of a, then of b) in one 512-bit register.
inline __m512i load_pair(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(a))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b)), 1);
}

// NT tokens' Q8_K activations for up to kStageBlocks super-blocks (stage_q8_k), read by every group of rows.
template <int NT>
struct StagedTokens {
    Q8KStaged blk[kStageBlocks][NT];
    void fill(const uint8_t *x, size_t x_stride, int64_t k0, int64_t n) {
        stage_q8_k(x, x_stride, NT, k0, n, &blk[0][0]);
    }
};

// Two records' eight 16-bit fields (the fp16 scales d or dmin, IQ4_XS's scales_h): rows 0..7 of a, then of b.
inline __m256i load_pair16(const uint16_t *a, const uint16_t *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(a))),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i *>(b)), 1);
}

// sum_s n_s * sum(x)_s over the eight sub-blocks of 32, one int32 lane per row: the rows' numbers n_s as int16 pairs
// (n0, n2), (n1, n3), (n4, n6), (n5, n7) against the token's pairs of sums (Q8KStaged::sums32_skip).
inline __m512i dot_sums32(__m512i n02, __m512i n13, __m512i n46, __m512i n57, const int32_t *sums) {
    return _mm512_add_epi32(_mm512_add_epi32(_mm512_madd_epi16(n02, _mm512_set1_epi32(sums[0])),
                                             _mm512_madd_epi16(n13, _mm512_set1_epi32(sums[1]))),
                            _mm512_add_epi32(_mm512_madd_epi16(n46, _mm512_set1_epi32(sums[2])),
                                             _mm512_madd_epi16(n57, _mm512_set1_epi32(sums[3]))));
}

// The super-block's last f32 step for each token (dispatch.h): acc = fma(float(isum), d * dx, acc).
template <int NT>
inline void add_super_block(const __m512i *isum, __m512 dw, const Q8KStaged *xk, __m512 *acc) {
#pragma GCC unroll 4
    for (int j = 0; j < NT; ++j)
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(dw, _mm512_set1_ps(xk[j].d)), acc[j]);
}

// isum[j] += sc0 * dot_0 + sc1 * dot_1 for two sub-blocks of 16 rows, dot_w = the sum over groups i < NGroups of
// unpack(i, w) (16 rows x 4 unsigned elements) against token j's activation dword at x_at(j, i, w). Up to four
// tokens, both sub-blocks go in one sweep (the weights of group i are loaded once, for both); with more, each is
// swept apart, so that eight tokens' dot vectors, integer sums and accumulators fit the 32 registers and each
// unpacking still serves every token.
template <int NT, int NGroups, typename Unpack, typename XAt>
inline void add_two_sub_blocks(const Unpack &unpack, const XAt &x_at, __m512i sc0, __m512i sc1, __m512i *isum) {
    if constexpr (NT > 4) {
#pragma GCC unroll 2
        for (int w = 0; w < 2; ++w) {
            __m512i dot[NT];
            for (int j = 0; j < NT; ++j) dot[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int i = 0; i < NGroups; ++i) {
                const __m512i u = unpack(i, w);
#pragma GCC unroll 8
                for (int j = 0; j < NT; ++j) dot[j] = dpbusd_bcast(dot[j], u, x_at(j, i, w));
            }
            const __m512i sc = w ? sc1 : sc0;
#pragma GCC unroll 8
            for (int j = 0; j < NT; ++j) isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(dot[j], sc));
        }
    } else {
        __m512i d0[NT], d1[NT];
        for (int j = 0; j < NT; ++j) d0[j] = d1[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < NGroups; ++i) {
            const __m512i u0 = unpack(i, 0), u1 = unpack(i, 1);
#pragma GCC unroll 4
            for (int j = 0; j < NT; ++j) {
                d0[j] = dpbusd_bcast(d0[j], u0, x_at(j, i, 0));
                d1[j] = dpbusd_bcast(d1[j], u1, x_at(j, i, 1));
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < NT; ++j) {
            isum[j] = _mm512_add_epi32(
                isum[j], _mm512_add_epi32(_mm512_mullo_epi32(d0[j], sc0), _mm512_mullo_epi32(d1[j], sc1)));
        }
    }
}

// Rows of the records a and b (16 lanes; a last group of eight passes b = a and keeps the low lanes), super-blocks
// [0, n) against the NT staged tokens, continuing the sums in y unless `first`.
template <int NT, typename R>
void k_rows16(const R *a, const R *b, const StagedTokens<NT> &x, int64_t n, bool first, __mmask16 lanes, float *y,
              size_t y_stride) {
    constexpr bool kHighBits = sizeof(R) == sizeof(BlockQ5_Kx8);
    const __m512i nibble = _mm512_set1_epi8(0x0f), byte = _mm512_set1_epi32(0xff), one = _mm512_set1_epi8(1);
    const __m512i low6 = _mm512_set1_epi32(0x3f3f3f3f), low4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i top2 = _mm512_set1_epi32(0x03030303), even_bytes = _mm512_set1_epi32(0x00ff00ff);
    __m512 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes, y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        const R &ra = a[k], &rb = b[k];
        prefetch_ahead(&ra, sizeof ra);
        prefetch_ahead(&rb, sizeof rb);
        const __m512 dw = _mm512_cvtph_ps(load_pair16(ra.d, rb.d)),
                     dmw = _mm512_cvtph_ps(load_pair16(ra.dmin, rb.dmin));
        // The scale words of all 16 rows, unpacked as BlockQ4_K describes: bytes of sc 0-3, sc 4-7, m 0-3, m 4-7.
        const __m512i w0 = load_pair(ra.scales, rb.scales), w1 = load_pair(ra.scales + 32, rb.scales + 32);
        const __m512i w2 = load_pair(ra.scales + 64, rb.scales + 64);
        const __m512i sc_lo = _mm512_and_si512(w0, low6);
        const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(w2, low4),
                                              _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), top2), 4));
        const __m512i m_lo = _mm512_and_si512(w1, low6);
        const __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), low4),
                                             _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), top2), 4));
        // Mins first (the order dispatch.h defines): int16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) against
        // the token's pairs of sums.
        {
            const __m512i m02 = _mm512_and_si512(m_lo, even_bytes);
            const __m512i m13 = _mm512_and_si512(_mm512_srli_epi32(m_lo, 8), even_bytes);
            const __m512i m46 = _mm512_and_si512(m_hi, even_bytes);
            const __m512i m57 = _mm512_and_si512(_mm512_srli_epi32(m_hi, 8), even_bytes);
#pragma GCC unroll 4
            for (int j = 0; j < NT; ++j) {
                const __m512i msum = dot_sums32(m02, m13, m46, m57, x.blk[k][j].sums32_skip);
                acc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmw, _mm512_set1_ps(x.blk[k][j].d)),
                                          acc[j]);
            }
        }
        __m512i isum[NT];
        for (int j = 0; j < NT; ++j) isum[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
            const __m512i sc = c < 2 ? sc_lo : sc_hi;  // sub-blocks 2c and 2c + 1: bytes 2c % 4 and 2c % 4 + 1
            const __m512i sc_a = _mm512_and_si512(_mm512_srli_epi32(sc, 16 * (c % 2)), byte);
            const __m512i sc_b = _mm512_and_si512(_mm512_srli_epi32(sc, 16 * (c % 2) + 8), byte);
            // Group g's elements of sub-block 2c + half: the low nibbles (half 0) or the high ones, Q5_K's fifth bit
            // (bit 2c + half of the group's qh bytes) above them.
            const auto unpack = [&](int g, int half) {
                const __m512i wq = load_pair(ra.qs + 32 * (8 * c + g), rb.qs + 32 * (8 * c + g));
                __m512i u = _mm512_and_si512(half ? _mm512_srli_epi16(wq, 4) : wq, nibble);
                if constexpr (kHighBits) {
                    const __m512i qh = load_pair(ra.qh + 32 * g, rb.qh + 32 * g);
                    u = _mm512_or_si512(
                        u, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * c + half), one), 4));
                }
                return u;
            };
            add_two_sub_blocks<NT, 8>(
                unpack, [&](int j, int g, int half) { return x.blk[k][j].qs + 64 * c + 32 * half + 4 * g; }, sc_a, sc_b,
                isum);
        }
        add_super_block<NT>(isum, dw, x.blk[k], acc);
    }
    for (int j = 0; j < NT; ++j) _mm512_mask_storeu_ps(y + j * y_stride, lanes, acc[j]);
}

// Q6_K (BlockQ6_Kx8): per half h and quarter q of its byte groups, the low and high nibbles of the ql groups
// 16h + i (elements 32t + 4i, t = 0 and 2) and 16h + 8 + i (t = 1 and 3), with two bits of qh group 8h + i above
// each, are sub-blocks 8h + 2t + q. The -32 offset of every element is one madd per pair of sub-blocks: the rows'
// scales as int16 pairs against the token's bsums as they lie. Then one FMA per super-block and token.
template <int NT>
void q6_k_rows16(const BlockQ6_Kx8 *a, const BlockQ6_Kx8 *b, const StagedTokens<NT> &x, int64_t n, bool first,
                 __mmask16 lanes, float *y, size_t y_stride) {
    const __m512i nibble = _mm512_set1_epi8(0x0f), two_bits = _mm512_set1_epi8(3);
    __m512 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes, y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        const BlockQ6_Kx8 &ra = a[k], &rb = b[k];
        prefetch_ahead(&ra, sizeof ra);
        prefetch_ahead(&rb, sizeof rb);
        const __m512 dw = _mm512_cvtph_ps(load_pair16(ra.d, rb.d));
        // Sub-block s's scale, one int32 lane per row.
        const auto scale = [&ra, &rb](int s) {
            return _mm512_cvtepi8_epi32(
                _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(ra.scales + 8 * s)),
                                   _mm_loadl_epi64(reinterpret_cast<const __m128i *>(rb.scales + 8 * s))));
        };
        __m512i isum[NT];
        {
            __m512i offsets[NT];
            for (int j = 0; j < NT; ++j) offsets[j] = _mm512_setzero_si512();
            for (int p = 0; p < 8; ++p) {  // sub-blocks 2p and 2p + 1
                const auto pairs = [p](const BlockQ6_Kx8 &r) {
                    return _mm256_cvtepi8_epi16(
                        _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 16 * p)),
                                          _mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 16 * p + 8))));
                };
                const __m512i sc2 = _mm512_inserti64x4(_mm512_castsi256_si512(pairs(ra)), pairs(rb), 1);
#pragma GCC unroll 4
                for (int j = 0; j < NT; ++j) {
                    offsets[j] = _mm512_add_epi32(
                        offsets[j], _mm512_madd_epi16(sc2, _mm512_set1_epi32(x.blk[k][j].sums16_adjacent[p])));
                }
            }
            for (int j = 0; j < NT; ++j)
                isum[j] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(offsets[j], 5));
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
            for (int q = 0; q < 2; ++q) {
#pragma GCC unroll 2
                for (int src = 0; src < 2; ++src) {  // ql groups 16h + 8 src + i: t = src (low nibbles), src + 2
                    const __m512i sc_lo = scale(8 * h + 2 * src + q), sc_hi = scale(8 * h + 2 * (src + 2) + q);
                    // Group i's elements 32t + 4i + e, t = src + 2 * half: ql's low nibbles (half 0) or high ones,
                    // two bits of the qh group above them.
                    const auto unpack = [&](int i, int half) {
                        const int gl = 16 * h + 8 * src + i, gh = 8 * h + i;
                        const __m512i wq = load_pair(ra.ql + 32 * gl, rb.ql + 32 * gl);
                        const __m512i qh = load_pair(ra.qh + 32 * gh, rb.qh + 32 * gh);
                        return _mm512_or_si512(
                            _mm512_and_si512(half ? _mm512_srli_epi16(wq, 4) : wq, nibble),
                            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * src + 4 * half), two_bits),
                                              4));
                    };
                    add_two_sub_blocks<NT, 4>([&](int i, int half) { return unpack(4 * q + i, half); },
                                              [&](int j, int i, int half) {
                                                  return x.blk[k][j].qs + 128 * h + 4 * (4 * q + i) +
                                                         32 * (src + 2 * half);
                                              },
                                              sc_lo, sc_hi, isum);
                }
            }
        }
        add_super_block<NT>(isum, dw, x.blk[k], acc);
    }
    for (int j = 0; j < NT; ++j) _mm512_mask_storeu_ps(y + j * y_stride, lanes, acc[j]);
}

// Q2_K and Q3_K (BlockQ2_Kx8, BlockQ3_Kx8): each 512-bit load of a quant group G = 8h + 4q + i holds four 2-bit
// elements per row and bit pair g, of sub-block 8h + 2g + q; Q3_K puts a third bit above them, bit 4h + g of its
// hmask group 4q + i. The bit pairs are taken two at a time so that two dot vectors per token (not four) stay in
// registers.
//   Q2_K: 4-bit scales and mins, one byte per row and sub-block; the mins are one madd per pair of sub-blocks, the
//         rows' mins as int16 pairs against the token's bsums as they lie, and the f32 steps are Q4_K's.
//   Q3_K: the sixteen 6-bit scales of the 16 rows are unpacked from the planes of words as ggml unpacks them, four
//         per int32 lane (sc 0-3, 4-7, 8-11, 12-15), less 32 each; the -4 offset of every element is one madd per
//         pair of sub-blocks (s, s + 2) against the token's bsums in that order; one FMA per super-block.
template <int NT, typename R>
void low2_rows16(const R *a, const R *b, const StagedTokens<NT> &x, int64_t n, bool first, __mmask16 lanes, float *y,
                 size_t y_stride) {
    constexpr bool kQ3 = sizeof(R) == sizeof(BlockQ3_Kx8);
    const __m512i two_bits = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1), byte = _mm512_set1_epi32(0xff);
    const __m512i low4 = _mm512_set1_epi32(0x0f0f0f0f), top2 = _mm512_set1_epi32(0x03030303);
    const __m512i even_bytes = _mm512_set1_epi32(0x00ff00ff), pair32 = _mm512_set1_epi32(0x00200020);
    __m512 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes, y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        const R &ra = a[k], &rb = b[k];
        prefetch_ahead(&ra, sizeof ra);
        prefetch_ahead(&rb, sizeof rb);
        const __m512 dw = _mm512_cvtph_ps(load_pair16(ra.d, rb.d));
        __m512i isum[NT];
        __m512i sc4[4];  // Q3_K: the scales, four per lane
        if constexpr (kQ3) {
            const __m512i w0 = load_pair(ra.scales, rb.scales), w1 = load_pair(ra.scales + 32, rb.scales + 32);
            const __m512i w2 = load_pair(ra.scales + 64, rb.scales + 64);
            const auto top = [&](int shift) {
                return _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, shift), top2), 4);
            };
            sc4[0] = _mm512_or_si512(_mm512_and_si512(w0, low4), top(0));
            sc4[1] = _mm512_or_si512(_mm512_and_si512(w1, low4), top(2));
            sc4[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w0, 4), low4), top(4));
            sc4[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w1, 4), low4), top(6));
            __m512i offsets[NT];
            for (int j = 0; j < NT; ++j) offsets[j] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int q = 0; q < 4; ++q) {  // sub-blocks 4q..4q+3 as int16 pairs (4q, 4q + 2) and (4q + 1, 4q + 3)
                const __m512i even = _mm512_sub_epi16(_mm512_and_si512(sc4[q], even_bytes), pair32);
                const __m512i odd =
                    _mm512_sub_epi16(_mm512_and_si512(_mm512_srli_epi32(sc4[q], 8), even_bytes), pair32);
#pragma GCC unroll 4
                for (int j = 0; j < NT; ++j) {
                    const int32_t *p = x.blk[k][j].sums16_skip;
                    offsets[j] = _mm512_add_epi32(
                        offsets[j], _mm512_add_epi32(_mm512_madd_epi16(even, _mm512_set1_epi32(p[2 * q])),
                                                     _mm512_madd_epi16(odd, _mm512_set1_epi32(p[2 * q + 1]))));
                }
            }
            for (int j = 0; j < NT; ++j)
                isum[j] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(offsets[j], 2));
        } else {
            const __m512 dmw = _mm512_cvtph_ps(load_pair16(ra.dmin, rb.dmin));
            __m512i msum[NT];
            for (int j = 0; j < NT; ++j) msum[j] = _mm512_setzero_si512();
            for (int p = 0; p < 8; ++p) {  // sub-blocks 2p and 2p + 1: their mins (high nibbles) as int16 pairs
                const auto pairs = [p](const R &r) {
                    return _mm256_srli_epi16(
                        _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(
                            _mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 16 * p)),
                            _mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.scales + 16 * p + 8)))),
                        4);
                };
                const __m512i m2 = _mm512_inserti64x4(_mm512_castsi256_si512(pairs(ra)), pairs(rb), 1);
#pragma GCC unroll 4
                for (int j = 0; j < NT; ++j) {
                    msum[j] = _mm512_add_epi32(
                        msum[j], _mm512_madd_epi16(m2, _mm512_set1_epi32(x.blk[k][j].sums16_adjacent[p])));
                }
            }
#pragma GCC unroll 4
            for (int j = 0; j < NT; ++j) {
                acc[j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[j]),
                                          _mm512_mul_ps(dmw, _mm512_set1_ps(x.blk[k][j].d)), acc[j]);
                isum[j] = _mm512_setzero_si512();
            }
        }
        // Sub-block s's scale, one int32 lane per row (Q3_K's less 32).
        const auto scale = [&](int s) {
            if constexpr (kQ3) {
                return _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(sc4[s / 4], 8 * (s % 4)), byte),
                                        _mm512_set1_epi32(32));
            } else {
                return _mm512_and_si512(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(
                                            _mm_loadl_epi64(reinterpret_cast<const __m128i *>(ra.scales + 8 * s)),
                                            _mm_loadl_epi64(reinterpret_cast<const __m128i *>(rb.scales + 8 * s)))),
                                        _mm512_set1_epi32(15));
            }
        };
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
            for (int q = 0; q < 2; ++q) {
                // Bit pair g of group i (G = 8h + 4q + i), with Q3_K's third bit above it.
                const auto unpack = [&](int i, int g) {
                    const int G = 8 * h + 4 * q + i;
                    const __m512i wq = load_pair(ra.qs + 32 * G, rb.qs + 32 * G);
                    __m512i u = _mm512_and_si512(_mm512_srli_epi16(wq, 2 * g), two_bits);
                    if constexpr (kQ3) {
                        const __m512i hm = load_pair(ra.hmask + 32 * (4 * q + i), rb.hmask + 32 * (4 * q + i));
                        u = _mm512_or_si512(
                            u, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hm, 4 * h + g), one), 2));
                    }
                    return u;
                };
#pragma GCC unroll 2
                for (int g0 = 0; g0 < 4; g0 += 2) {  // bit pairs g0 and g0 + 1
                    add_two_sub_blocks<NT, 4>(
                        [&](int i, int w) { return unpack(i, g0 + w); },
                        [&](int j, int i, int w) { return x.blk[k][j].qs + 128 * h + 32 * (g0 + w) + 4 * (4 * q + i); },
                        scale(8 * h + 2 * g0 + q), scale(8 * h + 2 * (g0 + 1) + q), isum);
                }
            }
        }
        add_super_block<NT>(isum, dw, x.blk[k], acc);
    }
    for (int j = 0; j < NT; ++j) _mm512_mask_storeu_ps(y + j * y_stride, lanes, acc[j]);
}

// IQ4_XS (BlockIQ4_XSx8): each group's nibbles become the code book's values + 128 (unsigned bytes, for vpdpbusd)
// with one byte shuffle; sub-blocks pair up as in k_rows16 (add_two_sub_blocks: the rows' ls - 32 multiply each
// sub-block's dots), and the + 128 comes off as 128 * sum_s (ls_s - 32) * sum(x)_s: four vpmaddwd of the rows' scales
// as int16 pairs with the token's 32-element sums, as k_rows16's mins. Then one FMA per super-block and token.
template <int NT>
void iq4_xs_rows16(const BlockIQ4_XSx8 *a, const BlockIQ4_XSx8 *b, const StagedTokens<NT> &x, int64_t n, bool first,
                   __mmask16 lanes, float *y, size_t y_stride) {
    const __m512i nibble = _mm512_set1_epi8(0x0f), low4 = _mm512_set1_epi32(15), two_bits = _mm512_set1_epi32(3);
    const __m512i low16 = _mm512_set1_epi32(0xffff), bias = _mm512_set1_epi32(32);
    // The code book as unsigned bytes: v + 128 is v with its top bit flipped.
    const __m512i book =
        _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues))),
                         _mm512_set1_epi8(static_cast<char>(0x80)));
    __m512 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes, y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        const BlockIQ4_XSx8 &ra = a[k], &rb = b[k];
        prefetch_ahead(&ra, sizeof ra);
        prefetch_ahead(&rb, sizeof rb);
        const __m512 dw = _mm512_cvtph_ps(load_pair16(ra.d, rb.d));
        const __m512i sh = _mm512_cvtepu16_epi32(load_pair16(ra.scales_h, rb.scales_h));
        const __m512i sl = load_pair(ra.scales_l, rb.scales_l);
        __m512i sc[8];
        for (int s = 0; s < 8; ++s) {
            const __m512i ls =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sl, 4 * s), low4),
                                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * s), two_bits), 4));
            sc[s] = _mm512_sub_epi32(ls, bias);
        }
        // isum starts at -128 * sum_s sc_s * sum(x)_s: int16 pairs (sc0, sc2), (sc1, sc3), (sc4, sc6), (sc5, sc7)
        // against the token's pairs of sums (Q8KStaged::sums32_skip).
        const auto pair = [&](int s, int t) {
            return _mm512_or_si512(_mm512_and_si512(sc[s], low16), _mm512_slli_epi32(sc[t], 16));
        };
        const __m512i p02 = pair(0, 2), p13 = pair(1, 3), p46 = pair(4, 6), p57 = pair(5, 7);
        __m512i isum[NT];
#pragma GCC unroll 4
        for (int j = 0; j < NT; ++j) {
            const __m512i offset = dot_sums32(p02, p13, p46, p57, x.blk[k][j].sums32_skip);
            isum[j] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(offset, 7));
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {  // sub-blocks 2q and 2q + 1
            // Group i of sub-block 2q + w: the low nibbles of its groups (i < 4), then the high ones.
            const auto unpack = [&](int i, int w) {
                const int g = 4 * (2 * q + w) + i % 4;
                const __m512i wq = load_pair(ra.qs + 32 * g, rb.qs + 32 * g);
                return _mm512_shuffle_epi8(book, _mm512_and_si512(i < 4 ? wq : _mm512_srli_epi16(wq, 4), nibble));
            };
            add_two_sub_blocks<NT, 8>(
                unpack,
                [&](int j, int i, int w) {
                    return x.blk[k][j].qs + 32 * (2 * q + w) + (i < 4 ? 4 * i : 16 + 4 * (i - 4));
                },
                sc[2 * q], sc[2 * q + 1], isum);
        }
        add_super_block<NT>(isum, dw, x.blk[k], acc);
    }
    for (int j = 0; j < NT; ++j) _mm512_mask_storeu_ps(y + j * y_stride, lanes, acc[j]);
}

// Packed rows against NT tokens: stages of kStageBlocks super-blocks, each over every group of sixteen rows.
template <int NT, typename R>
void k_pass(const uint8_t *w, size_t w_stride, int64_t n_rows, const uint8_t *x, size_t x_stride, int64_t nb, float *y,
            size_t y_stride) {
    StagedTokens<NT> staged;
    for (int64_t k0 = 0; k0 < nb; k0 += kStageBlocks) {
        const int64_t n = nb - k0 < kStageBlocks ? nb - k0 : kStageBlocks;
        staged.fill(x, x_stride, k0, n);
        for (int64_t g0 = 0; g0 < n_rows; g0 += 16) {
            const bool pair = g0 + 16 <= n_rows;
            const auto *a = reinterpret_cast<const R *>(w + g0 * static_cast<int64_t>(w_stride));
            const auto *b = pair ? reinterpret_cast<const R *>(w + (g0 + 8) * static_cast<int64_t>(w_stride)) : a;
            const __mmask16 lanes = pair ? __mmask16(0xFFFF) : __mmask16(0x00FF);
            if constexpr (sizeof(R) == sizeof(BlockQ6_Kx8)) {
                q6_k_rows16<NT>(a + k0, b + k0, staged, n, k0 == 0, lanes, y + g0, y_stride);
            } else if constexpr (sizeof(R) == sizeof(BlockQ2_Kx8) || sizeof(R) == sizeof(BlockQ3_Kx8)) {
                low2_rows16<NT>(a + k0, b + k0, staged, n, k0 == 0, lanes, y + g0, y_stride);
            } else if constexpr (sizeof(R) == sizeof(BlockIQ4_XSx8)) {
                iq4_xs_rows16<NT>(a + k0, b + k0, staged, n, k0 == 0, lanes, y + g0, y_stride);
            } else {
                k_rows16<NT>(a + k0, b + k0, staged, n, k0 == 0, lanes, y + g0, y_stride);
            }
        }
    }
}

// The tokens in passes of at most eight, as even as they go (7 = 4 + 3). A pass of more than four sweeps each
// sub-block of a group apart (the kernels' NT > 4 branches): eight tokens' dots of two would not fit the registers.
template <typename R>
void k_rows_any(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                float *y, size_t y_stride) {
    constexpr int kMaxPass = 8;  // = cpu::kMaxQuantTile
    const auto *wb = static_cast<const uint8_t *>(w);
    const int64_t nb = n / QK_K;
    const int n_passes = (n_x + kMaxPass - 1) / kMaxPass;
    for (int p = 0, j0 = 0; p < n_passes; ++p) {
        const int nt = (n_x - j0) / (n_passes - p) + ((n_x - j0) % (n_passes - p) != 0);
        const uint8_t *xp = static_cast<const uint8_t *>(x) + j0 * x_stride;
        float *yp = y + j0 * y_stride;
        const auto pass = [&](auto tokens) {
            k_pass<decltype(tokens)::value, R>(wb, w_stride, n_rows, xp, x_stride, nb, yp, y_stride);
        };
        switch (nt) {
            case 1: pass(Count<1>{}); break;
            case 2: pass(Count<2>{}); break;
            case 3: pass(Count<3>{}); break;
            case 4: pass(Count<4>{}); break;
            default:
                switch (nt) {
                    case 5: pass(Count<5>{}); break;
                    case 6: pass(Count<6>{}); break;
                    case 7: pass(Count<7>{}); break;
                    default: pass(Count<8>{}); break;
                }
                break;
        }
        j0 += nt;
    }
}

}  // namespace

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

}  // namespace sparrow::cpu::avx512vnni
