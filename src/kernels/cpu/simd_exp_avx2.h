// exp(x) over the 8 float lanes of an AVX2 register, for the files compiled with -mavx2 -mfma (*_avx2.cpp): the
// attention softmax and the SwiGLU kernel share it. Its function sits in an anonymous namespace, so every file that
// includes it gets its own copy, compiled for that file's ISA (the ODR rule of kernels_avx2.cpp: no shared inline
// function whose kept copy could be one an older CPU cannot run).
#pragma once

#include <immintrin.h>

namespace sparrow::cpu::simd {
namespace {

// exp(x) per lane: x = k ln2 + r with |r| <= ln2 / 2 (ln2 split in two so that k ln2 is exact enough),
// e^r by its degree-6 polynomial, 2^k put into the exponent bits. Lanes below -87.3 (where 2^k would leave
// the normal range) give 0; NaN stays NaN (min/max return their second operand when it is NaN, and the
// final mask is true for unordered lanes).
inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.37626f);
    const __m256 in_range = _mm256_cmp_ps(x, lo, _CMP_NLT_UQ);
    x = _mm256_max_ps(lo, _mm256_min_ps(hi, x));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), in_range);
}

}  // namespace
}  // namespace sparrow::cpu::simd
