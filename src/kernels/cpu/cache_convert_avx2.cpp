// AVX2 + F16C: Q8_0 / Q4_0 cache rows to f32 (attention and indexer tiles of quantised caches). Compiled
// with -mavx2 -mfma -mf16c and called only after cpuid says the CPU has them (dispatch.cpp).
//
// ODR rule of kernels_avx2.cpp: only <immintrin.h>, <cstdint>, core/blocks.h and isa_kernels.h, and every
// helper in an anonymous namespace.
#include <immintrin.h>

#include <cstdint>

#include "core/blocks.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::avx2 {

namespace {

// 32 int8 values (one block, element order) times d into y[0..32).
inline void store_block(__m256i q, __m256 d, float *y) {
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int p = 0; p < 4; ++p) {
        _mm256_storeu_ps(y + 8 * p, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[p]))));
    }
}

inline __m256 scale(uint16_t d) { return _mm256_set1_ps(_cvtsh_ss(d)); }

}  // namespace

void to_f32_q8_0(const void *row, float *y, int64_t n) {
    const auto *b = static_cast<const BlockQ8_0 *>(row);
    for (int64_t k = 0; k < n / QK8_0; ++k) {
        store_block(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(b[k].qs)), scale(b[k].d), y + k * QK8_0);
    }
}

void to_f32_q4_0(const void *row, float *y, int64_t n) {
    const auto *b = static_cast<const BlockQ4_0 *>(row);
    const __m128i low4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    for (int64_t k = 0; k < n / QK4_0; ++k) {
        // Low nibbles are elements 0..15, high nibbles 16..31; both stored with +8.
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b[k].qs));
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(packed, low4), eight);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low4), eight);
        store_block(_mm256_set_m128i(hi, lo), scale(b[k].d), y + k * QK4_0);
    }
}

}  // namespace sparrow::cpu::avx2
