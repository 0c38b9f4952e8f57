// exp(x) over the 16 float lanes of an AVX-512 register, for the files compiled with the AVX-512 flags
// (*_avx512.cpp): the attention softmax and the SwiGLU kernel share it. In an anonymous namespace, as
// simd_exp_avx2.h says why.
#pragma once

#include "kernels/cpu/avx512_intrinsics.h"  // <immintrin.h> without GCC 12's false warnings

namespace sparrow::cpu::simd {
namespace {

// exp(x) per lane, the AVX2 exp8 at 16 lanes (same reduction and polynomial) with 2^k applied by vscalefps:
// lanes below -87.3 give 0 (no subnormals reach the FMAs), NaN stays NaN.
inline __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.37626f);
    const __mmask16 in_range = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);
    x = _mm512_max_ps(lo, _mm512_min_ps(hi, x));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(in_range, _mm512_scalef_ps(y, k));
}

}  // namespace
}  // namespace sparrow::cpu::simd
