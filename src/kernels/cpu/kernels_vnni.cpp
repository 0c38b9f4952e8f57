// AVX512-VNNI kernels for weights packed eight rows to a record (BlockQ8_0x8, BlockQ4_0x8, BlockMXFP4x8; blocks.h).
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni (CMakeLists.txt: files named
// *_vnni.cpp) and called only when cpuid says the CPU has AVX-512 with VNNI (dispatch.cpp).
//
// Rows go sixteen at a time: the records of two groups of eight side by side in one 512-bit register, so each
// vpdpbusd (unsigned x signed bytes, four products added into each int32 lane) does 64 products against a token's
// activation dword broadcast from memory, where AVX2 needs sign, maddubs, madd and add for 32. This Xeon issues
// two 512-bit vpdpbusd per cycle, as many as 256-bit ones, so the wide kernel does twice the work per
// instruction (rows16 below). A last group of eight rows runs as both halves of the register. Two to five tokens
// go 32 rows at a time (rows32), each broadcast dword meeting two registers of weights.
//
// Signs. Q8_0: the weights are flipped to u = w + 128 (unsigned) as they are loaded, once per group for all
// tokens, and meet the signed activations as they are; sum(u * x) = sum(w * x) + 128 * sum(x), and the
// activation row carries 128 * sum(x) per block (dispatch.h). Q4_0: the nibbles are unsigned already
// (value + 8), and 8 * sum(x) comes off.
//
// The integer block dots are exact, and the f32 steps after them are the order dispatch.h defines for packed
// rows (acc = fma(float(dot), dw * dx, acc), block after block from 0), so every output has the scalar
// level's bits.
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

constexpr int kMaxQuantTile = 8;  // = cpu::kMaxQuantTile (dispatch.h is not included here: it has inline code)

// Asks for the `bytes` bytes kPrefetchBytes past p, which the caller is about to read (as kernels_avx2.cpp). A
// group's records are contiguous and the groups follow each other, so a matvec streams the packed matrix: on a
// 2-vCPU Xeon the Q8_0 matvec read 21.5 GB/s with this against 17.1 without (medians of 6 alternating runs;
// 8 KiB ahead: 20.9), Q4_0 21.2 against 13.5 (5 runs).
constexpr int64_t kPrefetchBytes = 4096;
inline void prefetch_ahead(const void *p, size_t bytes) {
    const char *ahead = static_cast<const char *>(p) + kPrefetchBytes;
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
}

// acc + the dword sums of u (unsigned bytes) x the signed dword at p broadcast to all 16 lanes, in one
// instruction: the broadcast is vpdpbusd's memory operand. In asm because GCC 12 copies the accumulator to a new
// register around the intrinsic (indexer_kernels_vnni.cpp measured it).
inline __m512i dpbusd_bcast(__m512i acc, __m512i u, const uint8_t *p) {
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t(*)>(p)));
    return acc;
}

// acc + the dword sums of u x v, in one instruction (asm for the same reason as dpbusd_bcast).
inline __m512i dpbusd(__m512i acc, __m512i u, __m512i v) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(v));
    return acc;
}

// Token j's activation dword at byte `at` of its block, in every lane.
inline __m512i x_dword(const uint8_t *xj, int at) {
    int32_t v;
    std::memcpy(&v, xj + at, sizeof v);
    return _mm512_set1_epi32(v);
}

// A tile's activations for up to kStageBlocks blocks, token after token within each block, so that every
// operand of the 16-row loop is a constant offset from one pointer (eight token pointers plus their scales
// left GCC short of registers: it parked pointers in vector registers and moved them back in the loop). Per
// block and token: the 32 quants a block of weights meets (Q4_0: the 16 its low nibbles meet, then the 16 its
// high nibbles meet), the f32 scale, and the negated integer offset that block's dot must lose.
constexpr int64_t kStageBlocks = 64;
template <int NT>
struct StagedX {
    alignas(64) uint8_t qs[kStageBlocks][NT][QK8_0];
    float dx[kStageBlocks][NT];
    int32_t neg_off[kStageBlocks][NT];

    // Blocks [k0, k0 + n) of NT Q8_0 activation rows (dispatch.h): the offset is 128 * sum(x), as the
    // Q8_0 kernel flips its weights to w + 128.
    void fill(const BlockQ8_0x8 *, const uint8_t *x, size_t x_stride, int64_t nb, int64_t k0, int64_t n) {
        const size_t dx_offset = static_cast<size_t>(nb) * sizeof(BlockQ8_0);
        const size_t off_offset = dx_offset + static_cast<size_t>(nb) * sizeof(float);
        for (int j = 0; j < NT; ++j) {
            const uint8_t *xj = x + j * x_stride;
            for (int64_t k = 0; k < n; ++k) {
                const size_t at = static_cast<size_t>(k0 + k);
                std::memcpy(qs[k][j], xj + at * sizeof(BlockQ8_0) + offsetof(BlockQ8_0, qs), QK8_0);
                std::memcpy(&dx[k][j], xj + dx_offset + at * sizeof(float), sizeof(float));
                int32_t off;
                std::memcpy(&off, xj + off_offset + at * sizeof(int32_t), sizeof off);
                neg_off[k][j] = -off;
            }
        }
    }

    // The same for MXFP4 weights, whose code book the kernel looks up as value + 12: the offset is 12 * sum(x).
    void fill(const BlockMXFP4x8 *, const uint8_t *x, size_t x_stride, int64_t nb, int64_t k0, int64_t n) {
        fill(static_cast<const BlockQ8_0x8 *>(nullptr), x, x_stride, nb, k0, n);
        for (int64_t k = 0; k < n; ++k) {
            for (int j = 0; j < NT; ++j) neg_off[k][j] = neg_off[k][j] / 128 * 12;
        }
    }

    // The same from BlockQ8_0x2 records (Q4_0 weights): the offset is 8 * sum(x), for the nibbles' + 8.
    void fill(const BlockQ4_0x8 *, const uint8_t *x, size_t x_stride, int64_t, int64_t k0, int64_t n) {
        for (int j = 0; j < NT; ++j) {
            const uint8_t *xj = x + j * x_stride;
            for (int64_t k = 0; k < n; ++k) {
                const int64_t b = k0 + k;
                const int h = static_cast<int>(b % 2);
                const uint8_t *rec = xj + b / 2 * static_cast<int64_t>(sizeof(BlockQ8_0x2));  // block b's record
                std::memcpy(qs[k][j], rec + offsetof(BlockQ8_0x2, lo) + 16 * h, 16);
                std::memcpy(qs[k][j] + 16, rec + offsetof(BlockQ8_0x2, hi) + 16 * h, 16);
                std::memcpy(&dx[k][j], rec + offsetof(BlockQ8_0x2, d) + h * sizeof(float), sizeof(float));
                int32_t sum2;  // 2 * sum(x), as the record keeps it
                std::memcpy(&sum2, rec + offsetof(BlockQ8_0x2, sums) + 4 * h * sizeof(int32_t), sizeof sum2);
                neg_off[k][j] = -4 * sum2;
            }
        }
    }
};

// Two records' group g (rows 0..7 of a, then of b) in one 512-bit register.
inline __m512i load_pair(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(a))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b)), 1);
}

// One block's integer dots of 16 rows against the staged tokens, each started at its negated offset (a
// broadcast load, where zeroing and a subtraction after took two instructions on the multiply ports).
// Q8_0: the weights go in unsigned, flipped to w + 128 as they are loaded (once per group, shared by the tokens),
// and meet each token's signed quants; 128 * sum(x) comes off. No weight sums are needed.
template <int NT>
inline void block_dots(const BlockQ8_0x8 &a, const BlockQ8_0x8 &b, const uint8_t (*x)[QK8_0], const int32_t *neg_off,
                       __m512i *dot) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int j = 0; j < NT; ++j) dot[j] = _mm512_set1_epi32(neg_off[j]);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
        const __m512i w = _mm512_xor_si512(load_pair(a.qs + 32 * g, b.qs + 32 * g), flip);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) dot[j] = dpbusd_bcast(dot[j], w, x[j] + 4 * g);
    }
}

// Q4_0: the nibbles are unsigned already (value + 8); 8 * sum(x) comes off.
template <int NT>
inline void block_dots(const BlockQ4_0x8 &a, const BlockQ4_0x8 &b, const uint8_t (*x)[QK8_0], const int32_t *neg_off,
                       __m512i *dot) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    for (int j = 0; j < NT; ++j) dot[j] = _mm512_set1_epi32(neg_off[j]);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
        const __m512i w = load_pair(a.qs + 32 * g, b.qs + 32 * g);
        const __m512i lo = _mm512_and_si512(w, mask), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) {
            dot[j] = dpbusd_bcast(dot[j], lo, x[j] + 4 * g);
            dot[j] = dpbusd_bcast(dot[j], hi, x[j] + 16 + 4 * g);
        }
    }
}

// MXFP4: the nibbles lie as Q4_0's, and a byte shuffle looks each up as its value + 12 (unsigned); 12 * sum(x)
// comes off.
template <int NT>
inline void block_dots(const BlockMXFP4x8 &a, const BlockMXFP4x8 &b, const uint8_t (*x)[QK8_0], const int32_t *neg_off,
                       __m512i *dot) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kMxfp4ValuesPlus12)));
    for (int j = 0; j < NT; ++j) dot[j] = _mm512_set1_epi32(neg_off[j]);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
        const __m512i w = load_pair(a.qs + 32 * g, b.qs + 32 * g);
        const __m512i lo = _mm512_shuffle_epi8(book, _mm512_and_si512(w, mask));
        const __m512i hi = _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16(w, 4), mask));
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) {
            dot[j] = dpbusd_bcast(dot[j], lo, x[j] + 4 * g);
            dot[j] = dpbusd_bcast(dot[j], hi, x[j] + 16 + 4 * g);
        }
    }
}

// The sixteen rows' scales of two records (rows 0..7 of a, then of b): fp16 d widened, or MXFP4's 2^(e - 128)
// (blocks.h: the f32 exponent field e - 1, or the subnormals 2^-127 and 2^-128 below e = 2).
template <typename R>
inline __m512 record_scales(const R &a, const R &b) {
    return _mm512_cvtph_ps(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(a.d))),
                                _mm_loadu_si128(reinterpret_cast<const __m128i *>(b.d)), 1));
}
inline __m512 record_scales(const BlockMXFP4x8 &a, const BlockMXFP4x8 &b) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(a.e)),
                                                              _mm_loadl_epi64(reinterpret_cast<const __m128i *>(b.e))));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __mmask16 small = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(
        _mm512_mask_mov_epi32(normal, small, _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e)));
}

// One block's step of a row's sum, in the order dispatch.h defines for packed rows (so every level gives these bits):
// acc + float(the block's integer dot) * (dw * dx), one rounding for the product of the scales and one for the fma.
inline __m512 add_block(__m512 acc, __m512i dot, __m512 dw, float dx) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc);
}

// Rows g0..g0+15 (the records of two groups of eight, a and b, side by side in 512-bit registers), blocks
// [0, n) of a and b against the NT staged tokens, continuing the sums in y unless `first`; only the output lanes
// in `lanes` are read and written (a last group of eight rows passes b = a and the low eight). Each vpdpbusd does
// 64 products: twice a 256-bit kernel's work per instruction, on the same two ports (measured on the 2-vCPU
// Xeon: 5.4 G 512-bit vpdpbusd/s against 5.6 G 256-bit). Each lane's f32 steps are the order dispatch.h
// defines, so the outputs keep their bits.
template <int NT, typename R>
void rows16(const R *a, const R *b, const StagedX<NT> &x, int64_t n, bool first, __mmask16 lanes, float *y,
            size_t y_stride) {
    __m512 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(lanes, y + j * y_stride);
    for (int64_t k = 0; k < n; ++k) {
        prefetch_ahead(a + k, sizeof(R));
        prefetch_ahead(b + k, sizeof(R));
        const __m512 dw = record_scales(a[k], b[k]);
        __m512i dot[NT];
        block_dots<NT>(a[k], b[k], x.qs[k], x.neg_off[k], dot);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) {
            acc[j] = add_block(acc[j], dot[j], dw, x.dx[k][j]);
        }
    }
    for (int j = 0; j < NT; ++j) _mm512_mask_storeu_ps(y + j * y_stride, lanes, acc[j]);
}

// block_dots for two sixteen-row pairs at once, (a, b) into dot0 and (c, d) into dot1: each activation dword is
// broadcast into a register once and meets both pairs' weights.
template <int NT>
inline void block_dots2(const BlockQ8_0x8 &a, const BlockQ8_0x8 &b, const BlockQ8_0x8 &c, const BlockQ8_0x8 &d,
                        const uint8_t (*x)[QK8_0], const int32_t *neg_off, __m512i *dot0, __m512i *dot1) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int j = 0; j < NT; ++j) dot0[j] = dot1[j] = _mm512_set1_epi32(neg_off[j]);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
        const __m512i w0 = _mm512_xor_si512(load_pair(a.qs + 32 * g, b.qs + 32 * g), flip);
        const __m512i w1 = _mm512_xor_si512(load_pair(c.qs + 32 * g, d.qs + 32 * g), flip);
#pragma GCC unroll 4
        for (int j = 0; j < NT; ++j) {
            const __m512i xb = x_dword(x[j], 4 * g);
            dot0[j] = dpbusd(dot0[j], w0, xb);
            dot1[j] = dpbusd(dot1[j], w1, xb);
        }
    }
}

// The nibble layouts (Q4_0, MXFP4): `unpack` turns a loaded group into its low and high weight sets.
template <int NT, typename Unpack>
inline void nibble_dots2(const uint8_t *a, const uint8_t *b, const uint8_t *c, const uint8_t *d,
                         const uint8_t (*x)[QK8_0], const int32_t *neg_off, __m512i *dot0, __m512i *dot1,
                         Unpack unpack) {
    for (int j = 0; j < NT; ++j) dot0[j] = dot1[j] = _mm512_set1_epi32(neg_off[j]);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
        __m512i lo0, hi0, lo1, hi1;
        unpack(load_pair(a + 32 * g, b + 32 * g), lo0, hi0);
        unpack(load_pair(c + 32 * g, d + 32 * g), lo1, hi1);
#pragma GCC unroll 4
        for (int j = 0; j < NT; ++j) {
            const __m512i xl = x_dword(x[j], 4 * g), xh = x_dword(x[j], 16 + 4 * g);
            dot0[j] = dpbusd(dpbusd(dot0[j], lo0, xl), hi0, xh);
            dot1[j] = dpbusd(dpbusd(dot1[j], lo1, xl), hi1, xh);
        }
    }
}

template <int NT>
inline void block_dots2(const BlockQ4_0x8 &a, const BlockQ4_0x8 &b, const BlockQ4_0x8 &c, const BlockQ4_0x8 &d,
                        const uint8_t (*x)[QK8_0], const int32_t *neg_off, __m512i *dot0, __m512i *dot1) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    nibble_dots2<NT>(a.qs, b.qs, c.qs, d.qs, x, neg_off, dot0, dot1, [&](__m512i w, __m512i &lo, __m512i &hi) {
        lo = _mm512_and_si512(w, mask);
        hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
    });
}

template <int NT>
inline void block_dots2(const BlockMXFP4x8 &a, const BlockMXFP4x8 &b, const BlockMXFP4x8 &c, const BlockMXFP4x8 &d,
                        const uint8_t (*x)[QK8_0], const int32_t *neg_off, __m512i *dot0, __m512i *dot1) {
    const __m512i mask = _mm512_set1_epi8(0x0f);
    const __m512i book = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kMxfp4ValuesPlus12)));
    nibble_dots2<NT>(a.qs, b.qs, c.qs, d.qs, x, neg_off, dot0, dot1, [&](__m512i w, __m512i &lo, __m512i &hi) {
        lo = _mm512_shuffle_epi8(book, _mm512_and_si512(w, mask));
        hi = _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16(w, 4), mask));
    });
}

// The most tokens rows32 takes: two pairs of rows keep 4 * NT accumulators, and at six tokens GCC spilled them
// (94 cycles per sixteen rows and block against rows16's 47).
constexpr int kRows32MaxTokens = 5;

// Rows g0..g0+31 (the records of four groups of eight: a, b, c, d, two sixteen-row pairs) against 2 to 5 staged
// tokens, as two calls of rows16 would compute them, to the bit. Per block, rows16 loads 16 register halves of
// weights and broadcasts 8 * NT activation dwords from memory for 8 * NT vpdpbusd; here the same broadcasts serve
// twice the products. Loads (two a cycle on the Zen 5 VM) bound rows16 once tokens share the weights. Measured on
// Q8_0 (session 32, alternating binaries): an L2-resident matrix on one thread, cycles per sixteen rows and block
// for 2 / 3 / 4 / 5 tokens 21 / 24-25 / 27-28 / 31 against rows16's 21-25 / 24-28 / 35-36 / 41-52; a DRAM-sized
// one (2048 x 61696) on two threads, four tokens 51-55 GB/s against 46-49 (one token's 53-55). One token stays
// on rows16: four streams instead of two ran an L3-resident 2048 x 768 matrix 5-20% slower.
template <int NT, typename R>
void rows32(const R *a, const R *b, const R *c, const R *d, const StagedX<NT> &x, int64_t n, bool first, float *y,
            size_t y_stride) {
    static_assert(NT <= kRows32MaxTokens, "more tokens leave no registers for two pairs of accumulators");
    __m512 acc0[NT], acc1[NT];
    for (int j = 0; j < NT; ++j) {
        acc0[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + j * y_stride);
        acc1[j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + j * y_stride + 16);
    }
    for (int64_t k = 0; k < n; ++k) {
        prefetch_ahead(a + k, sizeof(R));
        prefetch_ahead(b + k, sizeof(R));
        prefetch_ahead(c + k, sizeof(R));
        prefetch_ahead(d + k, sizeof(R));
        __m512i dot0[NT], dot1[NT];
        block_dots2<NT>(a[k], b[k], c[k], d[k], x.qs[k], x.neg_off[k], dot0, dot1);
        const __m512 dw0 = record_scales(a[k], b[k]), dw1 = record_scales(c[k], d[k]);
#pragma GCC unroll 4
        for (int j = 0; j < NT; ++j) {
            acc0[j] = add_block(acc0[j], dot0[j], dw0, x.dx[k][j]);
            acc1[j] = add_block(acc1[j], dot1[j], dw1, x.dx[k][j]);
        }
    }
    for (int j = 0; j < NT; ++j) {
        _mm512_storeu_ps(y + j * y_stride, acc0[j]);
        _mm512_storeu_ps(y + j * y_stride + 16, acc1[j]);
    }
}

// Packed rows against NT tokens over stages of kStageBlocks blocks: 32 rows at a time (rows32) for two to five
// tokens, then sixteen (rows16); a last group of eight (n_rows % 16 == 8; matmul hands out 16-row chunks, so only
// at a matrix's end) runs as both halves of the register and keeps the low half.
template <int NT, typename R>
void packed_rows(const uint8_t *w, size_t w_stride, int64_t n_rows, const uint8_t *x, size_t x_stride, int64_t nb,
                 float *y, size_t y_stride) {
    StagedX<NT> staged;
    for (int64_t k0 = 0; k0 < nb; k0 += kStageBlocks) {
        const int64_t n = nb - k0 < kStageBlocks ? nb - k0 : kStageBlocks;
        staged.fill(static_cast<const R *>(nullptr), x, x_stride, nb, k0, n);
        int64_t g0 = 0;
        if constexpr (NT >= 2 && NT <= kRows32MaxTokens) {
            for (; g0 + 32 <= n_rows; g0 += 32) {
                const auto group = [&](int64_t r) {
                    return reinterpret_cast<const R *>(w + r * int64_t(w_stride)) + k0;
                };
                rows32<NT>(group(g0), group(g0 + 8), group(g0 + 16), group(g0 + 24), staged, n, k0 == 0, y + g0,
                           y_stride);
            }
        }
        for (; g0 < n_rows; g0 += 16) {
            const bool pair = g0 + 16 <= n_rows;
            const auto *a = reinterpret_cast<const R *>(w + g0 * static_cast<int64_t>(w_stride));
            const auto *b = pair ? reinterpret_cast<const R *>(w + (g0 + 8) * static_cast<int64_t>(w_stride)) : a;
            rows16<NT>(a + k0, b + k0, staged, n, k0 == 0, pair ? __mmask16(0xFFFF) : __mmask16(0x00FF), y + g0,
                       y_stride);
        }
    }
}

template <typename R>
void packed_rows_any(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                     int64_t nb, float *y, size_t y_stride) {
    const auto *wb = static_cast<const uint8_t *>(w);
    const auto *xb = static_cast<const uint8_t *>(x);
    switch (n_x < kMaxQuantTile ? n_x : kMaxQuantTile) {
        case 1: packed_rows<1, R>(wb, w_stride, n_rows, xb, x_stride, nb, y, y_stride); return;
        case 2: packed_rows<2, R>(wb, w_stride, n_rows, xb, x_stride, nb, y, y_stride); return;
        case 3: packed_rows<3, R>(wb, w_stride, n_rows, xb, x_stride, nb, y, y_stride); return;
        case 4: packed_rows<4, R>(wb, w_stride, n_rows, xb, x_stride, nb, y, y_stride); return;
        case 5: packed_rows<5, R>(wb, w_stride, n_rows, xb, x_stride, nb, y, y_stride); return;
        case 6: packed_rows<6, R>(wb, w_stride, n_rows, xb, x_stride, nb, y, y_stride); return;
        case 7: packed_rows<7, R>(wb, w_stride, n_rows, xb, x_stride, nb, y, y_stride); return;
        default: packed_rows<8, R>(wb, w_stride, n_rows, xb, x_stride, nb, y, y_stride); return;
    }
}

}  // namespace

void dot_rows_q8_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    const int64_t nb = n / QK8_0;
    packed_rows_any<BlockQ8_0x8>(w, w_stride, n_rows, x, x_stride, n_x, nb, y, y_stride);
}

void dot_rows_q4_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    packed_rows_any<BlockQ4_0x8>(w, w_stride, n_rows, x, x_stride, n_x, n / QK4_0, y, y_stride);
}

void dot_rows_mxfp4x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                      int64_t n, float *y, size_t y_stride) {
    packed_rows_any<BlockMXFP4x8>(w, w_stride, n_rows, x, x_stride, n_x, n / QK8_0, y, y_stride);
}

}  // namespace sparrow::cpu::avx512vnni
