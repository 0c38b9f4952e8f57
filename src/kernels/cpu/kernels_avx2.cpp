// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c (CMakeLists.txt) and called only after
// cpuid says the CPU has them (dispatch.cpp).
//
// ODR rule for this file: it includes only <immintrin.h>, <cstddef>, <cstdint>, <cstring>, core/blocks.h
// (plain data), isa_kernels.h (declarations only) and simd_exp_avx2.h (its exp in an anonymous namespace), and
// everything but the exported kernels sits in an anonymous namespace (templates included: internal linkage). A shared
// inline function compiled here could otherwise be the copy the linker keeps, and crash on a CPU without AVX2.
#include <immintrin.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/blocks.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/simd_exp_avx2.h"  // internal linkage: this file's own copy

namespace sparrow::cpu::avx2 {

namespace {

// = cpu::kMaxTile (dispatch.h is not included here: it pulls in inline code)
constexpr int kMaxTile = 4;
// Weight bytes requested ahead of the ones being read: a matvec streams the rows in order with little arithmetic
// per byte, and the hardware prefetcher alone kept too few lines in flight. On a 2-vCPU Xeon (medians of 4-5
// alternating runs, 1 GiB matrices) with this kernel: f32 21.3 -> 25.8 GB/s, f16 15.8 -> 23.0, bf16 15.2 -> 21.4,
// packed Q8_0 17.0 -> 22.0, packed Q4_0 14.5 -> 22.1.
constexpr int64_t kPrefetchBytes = 4096;

// Asks for the `bytes` bytes kPrefetchBytes past p, which the caller is about to read.
inline void prefetch_ahead(const void *p, size_t bytes) {
    const char *ahead = static_cast<const char *>(p) + kPrefetchBytes;
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
}

// A token count as a type, for the kernels templated on it (this file's own: std::integral_constant would be a
// shared inline function compiled with AVX2).
template <int N>
struct Tile {
    static constexpr int value = N;
};

// f(Tile<n_x>{}) for n_x in 1..8 (8 for anything larger): the quantised kernels' entry points pick their tile.
template <typename F>
inline void with_quant_tile(int n_x, F &&f) {
    switch (n_x) {
        case 1: f(Tile<1>{}); return;
        case 2: f(Tile<2>{}); return;
        case 3: f(Tile<3>{}); return;
        case 4: f(Tile<4>{}); return;
        case 5: f(Tile<5>{}); return;
        case 6: f(Tile<6>{}); return;
        case 7: f(Tile<7>{}); return;
        default: f(Tile<8>{}); return;
    }
}

// Sum of the 8 lanes.
inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline float fp16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// --- f32 / f16 / bf16 weights against f32 activations ------------------------------------------------------
enum class FloatKind { f32, f16, bf16 };

// 8 consecutive weights from element i, widened to f32.
template <FloatKind K>
inline __m256 load8(const void *w, int64_t i) {
    if constexpr (K == FloatKind::f32) {
        return _mm256_loadu_ps(static_cast<const float *>(w) + i);
    } else if constexpr (K == FloatKind::f16) {
        return _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(w) + i)));
    } else {
        // bf16 is the top half of an f32: widen to 32 bits and shift into place.
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(w) + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
}

template <FloatKind K>
inline float load1(const void *w, int64_t i) {
    if constexpr (K == FloatKind::f32) {
        return static_cast<const float *>(w)[i];
    } else if constexpr (K == FloatKind::f16) {
        return fp16_to_f32(static_cast<const uint16_t *>(w)[i]);
    } else {
        return bf16_to_f32(static_cast<const uint16_t *>(w)[i]);
    }
}

// NT tokens against one weight row, two vectors per step. The accumulation order is the same for every NT
// (element i always lands in the same lane of the same accumulator), so a token's result does not depend on
// which tile it shares or with how many others: batched and single-sequence runs agree bit for bit.
template <FloatKind K, int NT>
void dot_tile_float(const void *w, const void *x, size_t x_stride, int64_t n, float *out) {
    constexpr int U = 2;
    const float *xs[NT];
    for (int j = 0; j < NT; ++j)
        xs[j] = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x) + j * x_stride);
    __m256 acc[NT][U];
    for (int j = 0; j < NT; ++j) {
        for (int u = 0; u < U; ++u) acc[j][u] = _mm256_setzero_ps();
    }
    constexpr size_t kElemBytes = K == FloatKind::f32 ? 4 : 2;
    int64_t i = 0;
    for (; i + 8 * U <= n; i += 8 * U) {
        prefetch_ahead(static_cast<const char *>(w) + i * kElemBytes, 8 * U * kElemBytes);
        for (int u = 0; u < U; ++u) {
            const __m256 wv = load8<K>(w, i + 8 * u);
            for (int j = 0; j < NT; ++j) acc[j][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs[j] + i + 8 * u), acc[j][u]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 wv = load8<K>(w, i);
        for (int j = 0; j < NT; ++j) acc[j][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xs[j] + i), acc[j][0]);
    }
    for (int j = 0; j < NT; ++j) {
        __m256 s = acc[j][0];
        for (int u = 1; u < U; ++u) s = _mm256_add_ps(s, acc[j][u]);
        float sum = hsum(s);
        for (int64_t k = i; k < n; ++k) sum += load1<K>(w, k) * xs[j][k];
        out[j] = sum;
    }
}

template <FloatKind K>
void dot_tile_float_any(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    switch (n_x) {
        case 1: dot_tile_float<K, 1>(w, x, x_stride, n, out); return;
        case 2: dot_tile_float<K, 2>(w, x, x_stride, n, out); return;
        case 3: dot_tile_float<K, 3>(w, x, x_stride, n, out); return;
        default: dot_tile_float<K, kMaxTile>(w, x, x_stride, n, out); return;
    }
}

// --- Q8_0 weights against Q8_0 activations -----------------------------------------------------------------
// The 32 weights of a block as signed bytes in element order.
inline __m256i unpack_block(const BlockQ8_0 &b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b.qs)); }

// Eight int32 partial sums of w[k] * x[k] over a block. maddubs multiplies unsigned by signed bytes, so
// move w's sign onto x: |w| * (x * sign(w)) = w * x. Pairs of products fit int16 (2 * 128 * 127 < 32767)
// because activations come from quantize_row_q8_0 and lie in [-127, 127].
inline __m256i block_dot(__m256i w_abs, __m256i w, __m256i x, __m256i ones) {
    const __m256i p16 = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p16, ones);
}

// Q8_0 weights against activation rows of Q8_0 blocks followed by their f32 scales (cpu::q8_0_dot_x_row_bytes):
// one weight row against NT <= 8 tokens, one accumulator per token. With two blocks, their |w|, the pair's
// weight scales and the madd ones that is 14 of the 16 ymm registers; at NT = 8 GCC keeps one accumulator on
// the stack (a load and a store per pair of blocks), nothing else.
//
// Blocks go in pairs (b, b + 1). Per pair of a token: sign, maddubs and madd per block give each block's 8 int32
// partial sums m0 and m1; fold_pair(m0, m1) folds them into one register, 4 lanes per block ([m0 m0 m1 m1] in
// each 128-bit half), so one cvt, one scale multiply and one fma serve both blocks. The scales: d = [dw0 dw0 dw1 dw1]
// (x2) times [dx0 dx0 dx1 dx1] (x2), the products ggml forms; the second factor comes from a table of the tile's
// activation scales laid out that way (lay_out_pair_scales), built once per call, one broadcast load in the loop.
// Per (token, block) that is 3 integer ops + 2.5 others (2 unpacks, add, cvt, mul, fma per pair), against 3 + 3
// one block at a time (measured 5-9% less time per token at 8 tokens). An odd last block pairs with zeros
// (scale lanes 0).
//
// The order, which defines the result: for each token, acc = fma(d, float(fold_pair(m0, m1)), acc) for pairs
// p = 0, 1, ... in one 8-lane accumulator, then the lanes added as hsum does. It does not depend on NT or on
// which tokens share the call, so a token's result is the same alone or in a batch (batched and single-sequence
// runs agree bit for bit).
//
// One row at a time, not a register block of several rows: rows are read from DRAM in a matvec, and there two,
// four or eight rows walked side by side (each a stream of 34-byte steps, rows 2 KiB apart) measured 15-55% slower
// on the 2-core EPYC than one row after another, which the prefetchers follow.

// Block pairs whose activation scales one table holds (lay_out_pair_scales): 8 KiB of stack per token.
constexpr int64_t kPairChunk = 512;

// The activation scales of NT tokens for block pairs [p0, p0 + n_pairs): at [(p - p0) * NT + j], token j's
// [dx_2p, dx_2p, dx_2p+1, dx_2p+1] (dx of a block past nb: 0).
template <int NT>
void lay_out_pair_scales(const uint8_t *x, size_t x_stride, int64_t nb, int64_t p0, int64_t n_pairs, __m128 *out) {
    const size_t dx_offset = static_cast<size_t>(nb) * sizeof(BlockQ8_0);  // the f32 scales after the blocks
    for (int64_t p = p0; p < p0 + n_pairs; ++p) {
        for (int j = 0; j < NT; ++j) {
            const uint8_t *dx = x + j * x_stride + dx_offset + static_cast<size_t>(2 * p) * sizeof(float);
            float d0, d1 = 0.0f;
            std::memcpy(&d0, dx, sizeof d0);
            if (2 * p + 1 < nb) std::memcpy(&d1, dx + sizeof(float), sizeof d1);
            out[(p - p0) * NT + j] = _mm_setr_ps(d0, d0, d1, d1);
        }
    }
}

// One register of both blocks' partial sums, [m0 m0 m1 m1] in each 128-bit half: the 64-bit halves of m0 and m1
// unpacked side by side and added (lanes i and i + 2 of each half). Not hadd: on Zen 3 vphaddd takes about two
// cycles and blocks the pipes that maddubs and madd need.
inline __m256i fold_pair(__m256i m0, __m256i m1) {
    return _mm256_add_epi32(_mm256_unpacklo_epi64(m0, m1), _mm256_unpackhi_epi64(m0, m1));
}

// Two weight scales as [dw0 dw0 dw1 dw1] in both 128-bit halves.
inline __m256 pair_weight_scales(uint16_t h0, uint16_t h1) {
    const __m128i h = _mm_cvtsi32_si128(static_cast<int>(uint32_t(h0) | (uint32_t(h1) << 16)));
    const __m128 d = _mm_cvtph_ps(_mm_unpacklo_epi16(h, h));
    return _mm256_set_m128(d, d);
}

// acc[j] += the pairs [p0, p0 + n_pairs) of row w against token j (the order above). dx2: their PairScales.
template <int NT>
inline void q8_0_row_pairs(const BlockQ8_0 *w, const uint8_t *x, size_t x_stride, int64_t nb, int64_t p0,
                           int64_t n_pairs, const __m128 *dx2, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    // Whole pairs; a last pair with one block (nb odd) goes after the loop.
    const int64_t p_end = p0 + n_pairs, p_full = (2 * p_end <= nb) ? p_end : p_end - 1;
    for (int64_t p = p0; p < p_full; ++p) {
        const BlockQ8_0 &w0 = w[2 * p], &w1 = w[2 * p + 1];
        const __m256i qw0 = unpack_block(w0), qw1 = unpack_block(w1);
        const __m256i qa0 = _mm256_sign_epi8(qw0, qw0), qa1 = _mm256_sign_epi8(qw1, qw1);
        const __m256 dw = pair_weight_scales(w0.d, w1.d);
        const __m128 *dxp = dx2 + (p - p0) * NT;
        for (int j = 0; j < NT; ++j) {
            const BlockQ8_0 *xj = reinterpret_cast<const BlockQ8_0 *>(x + j * x_stride);
            const __m256i m0 = block_dot(qa0, qw0, unpack_block(xj[2 * p]), ones);
            const __m256i m1 = block_dot(qa1, qw1, unpack_block(xj[2 * p + 1]), ones);
            const __m256 d = _mm256_mul_ps(dw, _mm256_broadcast_ps(dxp + j));
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold_pair(m0, m1)), acc[j]);
        }
    }
    if (p_full < p_end) {
        const int64_t p = p_full;
        const BlockQ8_0 &w0 = w[2 * p];
        const __m256i qw0 = unpack_block(w0);
        const __m256i qa0 = _mm256_sign_epi8(qw0, qw0);
        const __m256 dw = pair_weight_scales(w0.d, 0);
        const __m128 *dxp = dx2 + (p - p0) * NT;
        for (int j = 0; j < NT; ++j) {
            const BlockQ8_0 *xj = reinterpret_cast<const BlockQ8_0 *>(x + j * x_stride);
            const __m256i m0 = block_dot(qa0, qw0, unpack_block(xj[2 * p]), ones);
            const __m256 d = _mm256_mul_ps(dw, _mm256_broadcast_ps(dxp + j));
            acc[j] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold_pair(m0, _mm256_setzero_si256())), acc[j]);
        }
    }
}

template <int NT>
void q8_0_rows(const uint8_t *w, size_t w_stride, int64_t n_rows, const uint8_t *x, size_t x_stride, int64_t nb,
               float *y, size_t y_stride) {
    const int64_t n_pairs = (nb + 1) / 2;
    alignas(16) __m128 dx2[kPairChunk * NT];
    // Rows up to 2 * kPairChunk blocks (n <= 32768): the table once for every row. Longer rows rebuild it per
    // chunk of pairs and row (the same sums in the same order, only slower).
    const bool one_table = n_pairs <= kPairChunk;
    if (one_table) lay_out_pair_scales<NT>(x, x_stride, nb, 0, n_pairs, dx2);
    for (int64_t r = 0; r < n_rows; ++r) {
        const BlockQ8_0 *wr = reinterpret_cast<const BlockQ8_0 *>(w + r * w_stride);
        __m256 acc[NT];
        for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
        for (int64_t p0 = 0; p0 < n_pairs; p0 += kPairChunk) {
            const int64_t count = n_pairs - p0 < kPairChunk ? n_pairs - p0 : kPairChunk;
            if (!one_table) lay_out_pair_scales<NT>(x, x_stride, nb, p0, count, dx2);
            q8_0_row_pairs<NT>(wr, x, x_stride, nb, p0, count, dx2, acc);
        }
        for (int j = 0; j < NT; ++j) y[j * y_stride + r] = hsum(acc[j]);
    }
}

// Rows [0, n_rows) against n_x tokens (cpu::kMaxQuantTile at most, from the table).
void dot_rows_q8_0_any(const void *wv, size_t w_stride, int64_t n_rows, const void *xv, size_t x_stride, int n_x,
                       int64_t n, float *y, size_t y_stride) {
    const uint8_t *w = static_cast<const uint8_t *>(wv);
    const uint8_t *x = static_cast<const uint8_t *>(xv);
    const int64_t nb = n / QK8_0;
    with_quant_tile(
        n_x, [&](auto tile) { q8_0_rows<decltype(tile)::value>(w, w_stride, n_rows, x, x_stride, nb, y, y_stride); });
}

// --- Q8_0 weights packed eight rows to a record (BlockQ8_0x8) against Q8_0 activations ---------------------
// Per group of four elements, one load holds the eight rows' bytes; a token's four activation bytes, broadcast,
// go through block_dot with it, and madd leaves each row's partial sum in its own int32 lane. Eight groups
// give each row's whole integer block dot, exact; then, lane by lane, acc = fma(float(dot), dw * dx, acc).
// That is the order dispatch.h defines for packed rows, so the result of a (row, token) does not depend on
// the tile or on the level (the scalar kernel follows it with std::fma). Compared with dot_rows_q8_0, which
// keeps per-row partial sums in lanes and folds them per block pair, this needs no fold, and the weight
// bytes and |w| of a group serve the tokens straight from registers: at 8 tokens 1.7 against 2.35 cycles
// per (token, block, row) in a prototype on the 2-core EPYC (L2-resident weights, same run).
//
// Tokens [J0, J0 + H) of one record b: H int32 accumulators, one per token (H <= 4 keeps them, the group's
// bytes, |w| and the ones in registers).
template <int J0, int H>
inline void q8_0x8_record(const BlockQ8_0x8 &rec, __m256 dw, const uint8_t *x, size_t x_stride, size_t dx_offset,
                          int64_t b, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i dot[H];
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) dot[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
        const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rec.qs + 32 * g));
        const __m256i qa = _mm256_sign_epi8(qw, qw);
#pragma GCC unroll 4
        for (int j = 0; j < H; ++j) {
            const auto *xb = reinterpret_cast<const BlockQ8_0 *>(x + (J0 + j) * x_stride) + b;
            const __m256i xv = _mm256_broadcastd_epi32(_mm_loadu_si32(xb->qs + 4 * g));
            dot[j] = _mm256_add_epi32(dot[j], block_dot(qa, qw, xv, ones));
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) {
        float dx;
        std::memcpy(&dx, x + (J0 + j) * x_stride + dx_offset + static_cast<size_t>(b) * sizeof(float), sizeof dx);
        acc[J0 + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[J0 + j]);
    }
}

// --- Q4_0 weights packed eight rows to a record (BlockQ4_0x8) against BlockQ8_0x2 activations --------------
// Per group of four bytes, one load holds 8 elements of each of the eight rows: the low nibbles (elements 4g..)
// and the high ones (16 + 4g..), stored + 8, go into maddubs unsigned against the token's broadcast activations
// for those elements (the record's lo and hi halves); pairs of products fit int16 (2 * 15 * 127) and so do the
// two halves' sums. After the four groups each lane holds its row's sum(u * x); taking 8 * sum(x) (4 x the
// record's 2 * sum) leaves sum((u - 8) * x), exact, and then acc = fma(float(dot), dw * dx, acc) as
// dot_rows_q8_0x8 (the order dispatch.h defines).
template <int J0, int H>
inline void q4_0x8_record(const BlockQ4_0x8 &rec, __m256 dw, const uint8_t *x, size_t x_stride,
                          size_t /*dx_offset: the scales are in the records*/, int64_t b, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(0x0f);
    const int h = static_cast<int>(b % 2);
    __m256i dot[H];
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) dot[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
        const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rec.qs + 32 * g));
        const __m256i lo = _mm256_and_si256(wb, mask), hi = _mm256_and_si256(_mm256_srli_epi16(wb, 4), mask);
#pragma GCC unroll 4
        for (int j = 0; j < H; ++j) {
            const auto *r = reinterpret_cast<const BlockQ8_0x2 *>(x + (J0 + j) * x_stride) + b / 2;
            const __m256i xl = _mm256_broadcastd_epi32(_mm_loadu_si32(r->lo + 16 * h + 4 * g));
            const __m256i xh = _mm256_broadcastd_epi32(_mm_loadu_si32(r->hi + 16 * h + 4 * g));
            const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
            dot[j] = _mm256_add_epi32(dot[j], _mm256_madd_epi16(p16, ones));
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) {
        const auto *r = reinterpret_cast<const BlockQ8_0x2 *>(x + (J0 + j) * x_stride) + b / 2;
        const __m256i offset = _mm256_set1_epi32(4 * r->sums[4 * h]);  // 8 * sum(x)
        const __m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(r->d[h]));
        acc[J0 + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot[j], offset)), d, acc[J0 + j]);
    }
}

// --- MXFP4 weights packed eight rows to a record (BlockMXFP4x8) against Q8_0 activations -----------------------
// The nibbles lie as BlockQ4_0x8's; a byte shuffle looks each up as its value + 12 (0..24, unsigned, so maddubs
// takes it as it is: pairs of products and the two halves' sum fit int16, 4 * 24 * 127). Taking 12 * sum(x) (from
// the 128 * sum(x) the activation row carries) leaves sum(value * x), exact; then acc = fma(float(dot), dw * dx,
// acc) as dot_rows_q8_0x8 (the order dispatch.h defines).
template <int J0, int H>
inline void mxfp4x8_record(const BlockMXFP4x8 &rec, __m256 dw, const uint8_t *x, size_t x_stride, size_t dx_offset,
                           int64_t b, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(0x0f);
    const __m256i book =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kMxfp4ValuesPlus12)));
    __m256i dot[H];
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) dot[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
        const __m256i wb = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rec.qs + 32 * g));
        const __m256i lo = _mm256_shuffle_epi8(book, _mm256_and_si256(wb, mask));
        const __m256i hi = _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16(wb, 4), mask));
#pragma GCC unroll 4
        for (int j = 0; j < H; ++j) {
            const auto *xb = reinterpret_cast<const BlockQ8_0 *>(x + (J0 + j) * x_stride) + b;
            const __m256i xl = _mm256_broadcastd_epi32(_mm_loadu_si32(xb->qs + 4 * g));
            const __m256i xh = _mm256_broadcastd_epi32(_mm_loadu_si32(xb->qs + 16 + 4 * g));
            const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
            dot[j] = _mm256_add_epi32(dot[j], _mm256_madd_epi16(p16, ones));
        }
    }
    const size_t nb = dx_offset / sizeof(BlockQ8_0), sums_offset = dx_offset + nb * sizeof(float);
#pragma GCC unroll 4
    for (int j = 0; j < H; ++j) {
        const uint8_t *xj = x + (J0 + j) * x_stride;
        float dx;
        int32_t sum128;
        std::memcpy(&dx, xj + dx_offset + static_cast<size_t>(b) * sizeof(float), sizeof dx);
        std::memcpy(&sum128, xj + sums_offset + static_cast<size_t>(b) * sizeof(int32_t), sizeof sum128);
        const __m256i offset = _mm256_set1_epi32(12 * (sum128 / 128));
        acc[J0 + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot[j], offset)),
                                      _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[J0 + j]);
    }
}

// Rows packed eight to a record against NT <= 8 tokens, one group of eight rows after another: per record, the
// rows' scales widened once, then the tokens in two passes over the record's bytes (the first ceil(NT / 2)
// tokens, then the rest) when NT > 4, so each pass keeps its accumulators in registers. Kind: Q8Packed or
// Q4Packed (the record type and its per-record kernel).
template <int NT, typename Kind>
void packed_rows(const uint8_t *w, size_t w_stride, int64_t n_rows, const uint8_t *x, size_t x_stride, int64_t nb,
                 size_t dx_offset, float *y, size_t y_stride) {
    using R = typename Kind::Record;
    constexpr int kFirst = NT > 4 ? (NT + 1) / 2 : NT;
    for (int64_t g0 = 0; g0 < n_rows; g0 += 8) {
        const auto *rec = reinterpret_cast<const R *>(w + g0 * static_cast<int64_t>(w_stride));
        __m256 acc[NT];
        for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_ahead(rec + b, sizeof(R));
            const __m256 dw = Kind::scales(rec[b]);
            Kind::template record<0, kFirst>(rec[b], dw, x, x_stride, dx_offset, b, acc);
            if constexpr (NT > kFirst)
                Kind::template record<kFirst, NT - kFirst>(rec[b], dw, x, x_stride, dx_offset, b, acc);
        }
        for (int j = 0; j < NT; ++j) _mm256_storeu_ps(y + j * y_stride + g0, acc[j]);
    }
}

// The eight rows' fp16 scales widened.
template <typename R>
inline __m256 half_scales(const R &rec) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(rec.d)));
}

struct Q8Packed {
    using Record = BlockQ8_0x8;
    static __m256 scales(const Record &rec) { return half_scales(rec); }
    template <int J0, int H>
    static void record(const Record &rec, __m256 dw, const uint8_t *x, size_t x_stride, size_t dx_offset, int64_t b,
                       __m256 *acc) {
        q8_0x8_record<J0, H>(rec, dw, x, x_stride, dx_offset, b, acc);
    }
};

struct Q4Packed {
    using Record = BlockQ4_0x8;
    static __m256 scales(const Record &rec) { return half_scales(rec); }
    template <int J0, int H>
    static void record(const Record &rec, __m256 dw, const uint8_t *x, size_t x_stride, size_t dx_offset, int64_t b,
                       __m256 *acc) {
        q4_0x8_record<J0, H>(rec, dw, x, x_stride, dx_offset, b, acc);
    }
};

struct Mxfp4Packed {
    using Record = BlockMXFP4x8;
    // 2^(e - 128) per row (blocks.h): the f32 exponent field e - 1, or the subnormals 2^-127, 2^-128 below e = 2.
    static __m256 scales(const Record &rec) {
        const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(rec.e)));
        const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
        const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small));
    }
    template <int J0, int H>
    static void record(const Record &rec, __m256 dw, const uint8_t *x, size_t x_stride, size_t dx_offset, int64_t b,
                       __m256 *acc) {
        mxfp4x8_record<J0, H>(rec, dw, x, x_stride, dx_offset, b, acc);
    }
};

// Packed rows against Q8_0 dot-x activations (Kind: Q8Packed or Mxfp4Packed).
template <typename Kind>
void dot_rows_q8_x_any(const void *wv, size_t w_stride, int64_t n_rows, const void *xv, size_t x_stride, int n_x,
                       int64_t n, float *y, size_t y_stride) {
    const uint8_t *w = static_cast<const uint8_t *>(wv);
    const uint8_t *x = static_cast<const uint8_t *>(xv);
    const int64_t nb = n / QK8_0;
    const size_t dx_offset = static_cast<size_t>(nb) * sizeof(BlockQ8_0);  // the f32 scales after the blocks
    with_quant_tile(n_x, [&](auto tile) {
        packed_rows<decltype(tile)::value, Kind>(w, w_stride, n_rows, x, x_stride, nb, dx_offset, y, y_stride);
    });
}

void dot_rows_q4_0x8_any(const void *wv, size_t w_stride, int64_t n_rows, const void *xv, size_t x_stride, int n_x,
                         int64_t n, float *y, size_t y_stride) {
    const uint8_t *w = static_cast<const uint8_t *>(wv);
    const uint8_t *x = static_cast<const uint8_t *>(xv);
    const int64_t nb = n / QK4_0;
    with_quant_tile(n_x, [&](auto tile) {
        packed_rows<decltype(tile)::value, Q4Packed>(w, w_stride, n_rows, x, x_stride, nb, 0, y, y_stride);
    });
}

// Q4_0 weights against BlockQ8_0x2 activations (core/blocks.h), two blocks at a time. The 16 bytes of each
// weight block go into one register, block 0 in the low 128 bits and block 1 in the high; masking gives the
// low nibbles of both and shifting the high nibbles, each lined up with the record's lo / hi activations.
// The nibbles u = value + 8 go into maddubs unsigned (no re-centring, no sign moves): pairs of products fit
// int16 (2 * 15 * 127) and so does the sum of the two halves. madd leaves 4 int32 lanes per block; the
// record's sums (2 * sum(x) per lane) take the offset's 8 * sum(x) off each block exactly, so every block's
// integer dot is exact before its f32 scale, as in ggml.
inline __m256i load_nibble_bytes(const BlockQ4_0 &b0, const BlockQ4_0 &b1) {
    return _mm256_loadu2_m128i(reinterpret_cast<const __m128i *>(b1.qs), reinterpret_cast<const __m128i *>(b0.qs));
}

// An odd last block: its bytes in the low half, zeros above (they meet zero activations).
inline __m256i load_nibble_bytes(const BlockQ4_0 &b0) {
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b0.qs)));
}

// acc += the record's two blocks against weight blocks with scales dw = [dw0, dw1] and bytes wb.
inline __m256 record_dot(__m256 acc, __m256i wb, __m128 dw, const BlockQ8_0x2 &r) {
    const __m256i mask = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(wb, mask);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wb, 4), mask);
    const __m256i p16 =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.lo))),
                         _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.hi))));
    const __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i *>(r.sums)));
    // [dw0 dx0, dw1 dx1] (the same f32 products as ggml) spread over lanes 0..3 and 4..7.
    const __m128 dwx = _mm_mul_ps(dw, _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(r.d))));
    const __m256 d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dwx), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), acc);
}

template <int NT>
void dot_tile_q4_0_x2(const void *wv, const void *x, size_t x_stride, int64_t n, float *out) {
    const BlockQ4_0 *w = static_cast<const BlockQ4_0 *>(wv);
    const int64_t nb = n / QK4_0;
    const BlockQ8_0x2 *xs[NT];
    for (int j = 0; j < NT; ++j) {
        xs[j] = reinterpret_cast<const BlockQ8_0x2 *>(static_cast<const uint8_t *>(x) + j * x_stride);
    }
    // One accumulator per token (as the Q8_0 kernel). Two records' terms are summed
    // first and then added to it, so the dependency chain through acc is one add per four blocks at NT = 1;
    // the order is the same for every NT (results do not depend on the tile).
    __m256 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
    int64_t p = 0;  // record index; blocks 2p and 2p + 1
    for (; 2 * p + 4 <= nb; p += 2) {
        __m256i wb[2];
        __m128 dw[2];
        for (int u = 0; u < 2; ++u) {
            const BlockQ4_0 &b0 = w[2 * (p + u)], &b1 = w[2 * (p + u) + 1];
            wb[u] = load_nibble_bytes(b0, b1);
            dw[u] = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(b0.d), b1.d, 1));
        }
        for (int j = 0; j < NT; ++j) {
            const __m256 s = record_dot(_mm256_setzero_ps(), wb[0], dw[0], xs[j][p]);
            acc[j] = _mm256_add_ps(acc[j], record_dot(s, wb[1], dw[1], xs[j][p + 1]));
        }
    }
    for (; 2 * p < nb; ++p) {
        const BlockQ4_0 &b0 = w[2 * p];
        const bool pair = 2 * p + 1 < nb;
        const __m256i wb = pair ? load_nibble_bytes(b0, w[2 * p + 1]) : load_nibble_bytes(b0);
        const __m128 dw = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(b0.d), pair ? w[2 * p + 1].d : 0, 1));
        for (int j = 0; j < NT; ++j) acc[j] = record_dot(acc[j], wb, dw, xs[j][p]);
    }
    for (int j = 0; j < NT; ++j) out[j] = hsum(acc[j]);
}

void dot_tile_q4_0_any(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    switch (n_x) {
        case 1: dot_tile_q4_0_x2<1>(w, x, x_stride, n, out); return;
        case 2: dot_tile_q4_0_x2<2>(w, x, x_stride, n, out); return;
        case 3: dot_tile_q4_0_x2<3>(w, x, x_stride, n, out); return;
        default: dot_tile_q4_0_x2<kMaxTile>(w, x, x_stride, n, out); return;
    }
}

// --- axpy --------------------------------------------------------------------------------------------------
template <FloatKind K>
void axpy(const void *row, float a, float *y, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, load8<K>(row, i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * load1<K>(row, i);
}

}  // namespace

void dot_tile_f32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float_any<FloatKind::f32>(w, x, x_stride, n_x, n, out);
}
void dot_tile_f16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float_any<FloatKind::f16>(w, x, x_stride, n_x, n, out);
}
void dot_tile_bf16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float_any<FloatKind::bf16>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q8_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    // One row: out[j] at y[j * 1].
    dot_rows_q8_0_any(w, 0, 1, x, x_stride, n_x, n, out, 1);
}
void dot_rows_q8_0(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                   float *y, size_t y_stride) {
    dot_rows_q8_0_any(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}
void dot_rows_q8_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    dot_rows_q8_x_any<Q8Packed>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_rows_q4_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride) {
    dot_rows_q4_0x8_any(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_rows_mxfp4x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                      int64_t n, float *y, size_t y_stride) {
    dot_rows_q8_x_any<Mxfp4Packed>(w, w_stride, n_rows, x, x_stride, n_x, n, y, y_stride);
}

void dot_tile_q4_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_q4_0_any(w, x, x_stride, n_x, n, out);
}

void axpy_f32(const void *row, float a, float *y, int64_t n) { axpy<FloatKind::f32>(row, a, y, n); }
void axpy_f16(const void *row, float a, float *y, int64_t n) { axpy<FloatKind::f16>(row, a, y, n); }
void axpy_bf16(const void *row, float a, float *y, int64_t n) { axpy<FloatKind::bf16>(row, a, y, n); }

// Bit-identical to ggml's reference quantiser: d = amax / 127 (f32 division), id = 1 / d, q = round(x * id)
// with halves away from zero (std::round), which the SIMD rounding modes lack: truncate, then step one
// away from zero when the exact remainder x - trunc(x) reaches 0.5.
void quantize_row_q8_0(const float *x, BlockQ8_0 *y, int64_t n) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t b = 0; b < n / QK8_0; ++b, x += QK8_0) {
        __m256 v[4];
        for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
        // The maximum of |x| on the bits (non-negative floats order as their bit patterns, and a NaN's bits exceed
        // infinity's): non-finite values, rare in activations, are found once per block, and only then the slower
        // steps give the scalar quantiser's results (a NaN does not set the scale, a NaN product quantises to 0).
        __m256i bits8 = _mm256_castps_si256(_mm256_andnot_ps(sign_bit, v[0]));
        for (int k = 1; k < 4; ++k)
            bits8 = _mm256_max_epu32(bits8, _mm256_castps_si256(_mm256_andnot_ps(sign_bit, v[k])));
        __m128i m = _mm_max_epu32(_mm256_castsi256_si128(bits8), _mm256_extracti128_si256(bits8, 1));
        m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
        m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
        const auto amax_bits = static_cast<uint32_t>(_mm_cvtsi128_si32(m));
        const bool non_finite = amax_bits >= 0x7F800000u;
        float amax;
        std::memcpy(&amax, &amax_bits, sizeof amax);
        if (non_finite) {
            // max_ps returns its second operand when either is NaN: with the running maximum second (and 0 to start
            // it), a NaN does not set the scale.
            __m256 amax8 = _mm256_setzero_ps();
            for (int k = 0; k < 4; ++k) amax8 = _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[k]), amax8);
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, amax8);
            amax = 0.0f;
            for (const float l : lanes) amax = amax < l ? l : amax;
        }
        const float d = amax / 127.0f;
        const float inv = d != 0.0f ? 1.0f / d : 0.0f;
        const float id = inv <= FLT_MAX ? inv : 0.0f;  // a d too small for 1 / d quantises to zeros, as in scalar
        y[b].d = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        const __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; ++k) {
            // A NaN product quantises to 0 (cvttps would give INT_MIN, packed to -128).
            const __m256 prod = _mm256_mul_ps(v[k], idv);
            const __m256 s = non_finite ? _mm256_and_ps(_mm256_cmp_ps(prod, prod, _CMP_ORD_Q), prod) : prod;
            const __m256 t = _mm256_round_ps(s, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(s, t));
            const __m256 step = _mm256_or_ps(one, _mm256_and_ps(sign_bit, s));  // +-1 with the sign of s
            const __m256 r = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step));
            q[k] = _mm256_cvttps_epi32(r);
        }
        // Narrow 4 x 8 int32 to 32 int8. packs works within 128-bit lanes, so the result comes out as
        // dword groups 0 2 4 6 1 3 5 7 and the final permute restores element order.
        const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
        const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
        const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        const __m256i ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(y[b].qs), ordered);
    }
}

void to_f32_f16(const void *row, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load8<FloatKind::f16>(row, i));
    for (; i < n; ++i) y[i] = load1<FloatKind::f16>(row, i);
}

void to_f32_bf16(const void *row, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load8<FloatKind::bf16>(row, i));
    for (; i < n; ++i) y[i] = load1<FloatKind::bf16>(row, i);
}

void from_f32_f16(const float *x, void *row, int64_t n) {
    auto *h = static_cast<uint16_t *>(row);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i *>(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) h[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

namespace {
inline __m256 swiglu8(__m256 g, __m256 u) {
    const __m256 e = simd::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}
}  // namespace

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {  // the tail through zero-padded lanes: the same code, so an element's result never depends on i
        alignas(32) float g[8] = {}, u[8] = {}, o[8];
        for (int64_t k = 0; k < n - i; ++k) {
            g[k] = gate[i + k];
            u[k] = up[i + k];
        }
        _mm256_store_ps(o, swiglu8(_mm256_load_ps(g), _mm256_load_ps(u)));
        for (int64_t k = 0; k < n - i; ++k) out[i + k] = o[k];
    }
}

void rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps) {
    // The squares in double, eight floats widened per step into two accumulators of four.
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                      hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        acc0 = _mm256_fmadd_pd(lo, lo, acc0);
        acc1 = _mm256_fmadd_pd(hi, hi, acc1);
    }
    const __m256d acc = _mm256_add_pd(acc0, acc1);
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
    s2 = _mm_add_sd(s2, _mm_unpackhi_pd(s2, s2));
    double sum = _mm_cvtsd_f64(s2);
    for (; i < n; ++i) sum += double(x[i]) * double(x[i]);
    const __m128d mean = _mm_set_sd(sum / double(n) + double(eps));
    const auto scale = static_cast<float>(1.0 / _mm_cvtsd_f64(_mm_sqrt_sd(mean, mean)));
    const __m256 sv = _mm256_set1_ps(scale);
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + k), sv);
        _mm256_storeu_ps(y + k, w ? _mm256_mul_ps(v, _mm256_loadu_ps(w + k)) : v);
    }
    for (; k < n; ++k) y[k] = w ? x[k] * scale * w[k] : x[k] * scale;
}

// Spans 1, 2 and 4 inside each 8-float vector: every lane meets its partner (the lane span away, brought by a
// permute), the block's first half keeping own + partner and its second half partner - own, i.e. x[j] + x[j + span]
// and x[j] - x[j + span] as the scalar level computes them (addition commutes exactly). Spans of 8 and more pair
// whole vectors. A row narrower than 8 runs in a zero-padded vector, with its spans below n only.
void hadamard_row(float *x, int64_t n, float norm) {
    alignas(32) float narrow[8] = {};
    float *const row = n < 8 ? narrow : x;
    if (n < 8) std::memcpy(narrow, x, static_cast<size_t>(n) * sizeof(float));
    for (int64_t i = 0; i < (n < 8 ? 8 : n); i += 8) {
        __m256 v = _mm256_loadu_ps(row + i);
        __m256 p;
        if (n > 1) {
            p = _mm256_permute_ps(v, 0xB1);  // span 1: lanes 0<->1, 2<->3
            v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xAA);
        }
        if (n > 2) {
            p = _mm256_permute_ps(v, 0x4E);  // span 2: pairs swapped within each 128-bit half
            v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xCC);
        }
        if (n > 4) {
            p = _mm256_permute2f128_ps(v, v, 0x01);  // span 4: the halves swapped
            v = _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), 0xF0);
        }
        if (n <= 8) v = _mm256_mul_ps(v, _mm256_set1_ps(norm));  // the whole row: scaled here
        _mm256_storeu_ps(row + i, v);
    }
    if (n < 8) {
        std::memcpy(x, narrow, static_cast<size_t>(n) * sizeof(float));
        return;
    }
    for (int64_t len = 8; len < n; len *= 2) {
        for (int64_t i = 0; i < n; i += 2 * len) {
            for (int64_t j = i; j < i + len; j += 8) {
                const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + len);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + len, _mm256_sub_ps(a, b));
            }
        }
    }
    if (n == 8) return;  // scaled above
    const __m256 s = _mm256_set1_ps(norm);
    for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), s));
}

}  // namespace sparrow::cpu::avx2
