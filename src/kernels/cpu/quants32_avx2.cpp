// AVX2 products of Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 weights against the Q8_0 dot-x activations (the sums
// quants32_scalar.cpp describes). Compiled with -mavx2 -mfma -mf16c; the ODR rule of kernels_avx2.cpp holds:
// only <immintrin.h>, <cstddef>, <cstdint>, <cstring>, core/blocks.h and isa_kernels.h, everything but the
// exported kernels in an anonymous namespace.
//
// A block's 16 bytes of nibbles become one 256-bit register of its 32 elements in order (low nibbles, then
// high ones), the fifth bits are spread from qh with a byte shuffle and a bit mask, and one maddubs + madd
// gives eight int32 lanes of sum(u x) (IQ4_NL, MXFP4: the code book looked up with a byte shuffle, and the
// signs moved onto x, since maddubs wants its first operand unsigned). Each block's lanes are scaled by d * dx
// into the token's accumulator; the offsets m * dx * sum(x) go to a second one.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/blocks.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::avx2 {

namespace {

constexpr int kMaxTile = 4;  // = cpu::kMaxTile
constexpr int64_t kPrefetchBytes = 4096;

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Elements 0..15 (low nibbles) in the low 128 bits, 16..31 (high nibbles) in the high ones.
inline __m256i nibbles(const uint8_t qs[16]) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
    const __m128i low4 = _mm_set1_epi8(15);
    return _mm256_setr_m128i(_mm_and_si128(q, low4), _mm_and_si128(_mm_srli_epi16(q, 4), low4));
}

// 16 in every byte j whose bit j of the 32-bit qh is set.
inline __m256i fifth_bits(const uint8_t qh[4]) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    // Byte j takes byte j / 8 of qh, then keeps bit j % 8 of it.
    const __m256i spread =
        _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                            _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

// The block as u (unsigned bytes, maddubs' first operand) with its d and offset m, or, for IQ4_NL and MXFP4, as signed
// values (Signed: the kernel moves their signs onto x).
struct WBlock {
    __m256i u;
    float d, m;
};
inline WBlock unpack(const BlockQ4_1 &w) { return {nibbles(w.qs), _cvtsh_ss(w.d), _cvtsh_ss(w.m)}; }
inline WBlock unpack(const BlockQ5_1 &w) {
    return {_mm256_or_si256(nibbles(w.qs), fifth_bits(w.qh)), _cvtsh_ss(w.d), _cvtsh_ss(w.m)};
}
inline WBlock unpack(const BlockQ5_0 &w) {
    const float d = _cvtsh_ss(w.d);
    return {_mm256_or_si256(nibbles(w.qs), fifth_bits(w.qh)), d, -16.0f * d};
}
inline WBlock unpack(const BlockIQ4_NL &w) {
    const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kIq4nlValues)));
    return {_mm256_shuffle_epi8(book, nibbles(w.qs)), _cvtsh_ss(w.d), 0.0f};
}
inline WBlock unpack(const BlockMXFP4 &w) {
    const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(kMxfp4Values)));
    // 2^(e - 128) (blocks.h): the f32 exponent field e - 1, or the subnormals 2^-127 and 2^-128 below e = 2.
    const uint32_t bits = w.e >= 2 ? static_cast<uint32_t>(w.e - 1) << 23 : uint32_t(0x00200000) << w.e;
    float d;
    std::memcpy(&d, &bits, 4);
    return {_mm256_shuffle_epi8(book, nibbles(w.qs)), d, 0.0f};
}

template <typename Block, bool Signed>
void dot_tile_block32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    const auto *blocks = static_cast<const Block *>(w);
    const int64_t nb = n / QK8_0;
    const uint8_t *xs[kMaxTile];
    for (int j = 0; j < n_x; ++j) xs[j] = static_cast<const uint8_t *>(x) + j * x_stride;
    const int64_t scales_at = nb * static_cast<int64_t>(sizeof(BlockQ8_0)), sums_at = scales_at + nb * 4;
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 acc[kMaxTile];
    float offsets[kMaxTile] = {};
    for (auto &a : acc) a = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        _mm_prefetch(reinterpret_cast<const char *>(&blocks[b]) + kPrefetchBytes, _MM_HINT_T0);
        const WBlock wb = unpack(blocks[b]);
        const __m256i u = Signed ? _mm256_sign_epi8(wb.u, wb.u) : wb.u;  // |value| for IQ4_NL, MXFP4
        for (int j = 0; j < n_x; ++j) {
            __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xs[j] + b * sizeof(BlockQ8_0) + 2));
            if constexpr (Signed) xq = _mm256_sign_epi8(xq, wb.u);
            float dx;
            int32_t sum128;
            std::memcpy(&dx, xs[j] + scales_at + b * 4, 4);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), ones16);
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(wb.d * dx), acc[j]);
            if constexpr (!Signed) {
                std::memcpy(&sum128, xs[j] + sums_at + b * 4, 4);
                offsets[j] += wb.m * dx * static_cast<float>(sum128 / 128);
            }
        }
    }
    for (int j = 0; j < n_x; ++j) out[j] = hsum(acc[j]) + offsets[j];
}

}  // namespace

void dot_tile_q4_1(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockQ4_1, false>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q5_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockQ5_0, false>(w, x, x_stride, n_x, n, out);
}
void dot_tile_q5_1(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockQ5_1, false>(w, x, x_stride, n_x, n, out);
}
void dot_tile_iq4_nl(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockIQ4_NL, true>(w, x, x_stride, n_x, n, out);
}
void dot_tile_mxfp4(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_block32<BlockMXFP4, true>(w, x, x_stride, n_x, n, out);
}

}  // namespace sparrow::cpu::avx2
