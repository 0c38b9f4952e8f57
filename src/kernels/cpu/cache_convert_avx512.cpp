// AVX-512 (F, BW, VL, DQ): Q8_0 / Q4_0 cache rows to f32, 16 elements per instruction. Compiled with the
// AVX-512 flags and called only after cpuid says the CPU has them (dispatch.cpp).
//
// ODR rule of kernels_avx512.cpp: only <immintrin.h>, <cstdint>, core/blocks.h and isa_kernels.h, and
// every helper in an anonymous namespace.

#include "kernels/cpu/avx512_intrinsics.h"  // <immintrin.h> without GCC 12's false warnings

#include <cstdint>

#include "core/blocks.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::avx512 {

namespace {

// 16 int8 values times d into y[0..16).
inline void store16(__m128i q, __m512 d, float *y) {
    _mm512_storeu_ps(y, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
}

inline __m512 scale(uint16_t d) { return _mm512_set1_ps(_cvtsh_ss(d)); }

}  // namespace

void to_f32_q8_0(const void *row, float *y, int64_t n) {
    const auto *b = static_cast<const BlockQ8_0 *>(row);
    for (int64_t k = 0; k < n / QK8_0; ++k, y += QK8_0) {
        const __m512 d = scale(b[k].d);
        store16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b[k].qs)), d, y);
        store16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b[k].qs + 16)), d, y + 16);
    }
}

void to_f32_q4_0(const void *row, float *y, int64_t n) {
    const auto *b = static_cast<const BlockQ4_0 *>(row);
    const __m128i low4 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    for (int64_t k = 0; k < n / QK4_0; ++k, y += QK4_0) {
        // Low nibbles are elements 0..15, high nibbles 16..31; both stored with +8.
        const __m512 d = scale(b[k].d);
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b[k].qs));
        store16(_mm_sub_epi8(_mm_and_si128(packed, low4), eight), d, y);
        store16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low4), eight), d, y + 16);
    }
}

}  // namespace sparrow::cpu::avx512
