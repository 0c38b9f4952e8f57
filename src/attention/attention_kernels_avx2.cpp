// AVX2 + FMA versions of the attention inner loops (contracts in attention_kernels.h). Compiled with
// -mavx2 -mfma -mf16c and called only when cpuid says the CPU has them.
//
// ODR rule (as src/kernels/cpu/kernels_avx2.cpp): this file includes only <immintrin.h>, <cstdint>,
// attention_kernels.h and simd_exp_avx2.h (internal linkage), and everything but the exported kernels sits in an
// anonymous namespace.
#include <immintrin.h>

#include <cstdint>

#include "attention/attention_kernels.h"
#include "kernels/cpu/simd_exp_avx2.h"

namespace sparrow::attn::avx2 {

namespace {

constexpr int kHeadBlock = 4;  // heads per register block: 4 x 3 accumulators in scores, 4 x 2 in pv

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// NQ heads against NR rows from k: per 8 elements, NR row loads + NQ query loads feed NR * NQ FMAs. 3 rows x
// 4 heads = 12 accumulators, more than the 8 that FMA latency x throughput needs, so the loop keeps both FMA
// pipes busy (2 x 4 ran at about two thirds of the pv kernel's rate).
template <int NQ, int NR>
inline void scores_rows(const float *q, int64_t q_stride, const float *k, int64_t k_stride, int64_t d, float scale,
                        float *s, int64_t ld_s) {
    const int64_t d8 = d / 8 * 8;
    __m256 a[NR][NQ];
    for (int r = 0; r < NR; ++r) {
        for (int g = 0; g < NQ; ++g) a[r][g] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < d8; i += 8) {
        __m256 x[NR];
        for (int r = 0; r < NR; ++r) x[r] = _mm256_loadu_ps(k + r * k_stride + i);
        for (int g = 0; g < NQ; ++g) {
            const __m256 qv = _mm256_loadu_ps(q + g * q_stride + i);
            for (int r = 0; r < NR; ++r) a[r][g] = _mm256_fmadd_ps(qv, x[r], a[r][g]);
        }
    }
    for (int g = 0; g < NQ; ++g) {
        for (int r = 0; r < NR; ++r) {
            float sum = hsum(a[r][g]);
            for (int64_t i = d8; i < d; ++i) sum += q[g * q_stride + i] * k[r * k_stride + i];
            s[g * ld_s + r] = scale * sum;
        }
    }
}

template <int NQ>
void scores_block(const float *q, int64_t q_stride, const float *k, int64_t k_stride, int64_t n_k, int64_t d,
                  float scale, float *s, int64_t ld_s) {
    int64_t j = 0;
    for (; j + 3 <= n_k; j += 3) scores_rows<NQ, 3>(q, q_stride, k + j * k_stride, k_stride, d, scale, s + j, ld_s);
    if (n_k - j == 2) scores_rows<NQ, 2>(q, q_stride, k + j * k_stride, k_stride, d, scale, s + j, ld_s);
    if (n_k - j == 1) scores_rows<NQ, 1>(q, q_stride, k + j * k_stride, k_stride, d, scale, s + j, ld_s);
}

// acc of NQ heads += P V: 16 columns of NQ heads stay in registers over all rows; per row, 2 loads of V and
// NQ broadcasts of p feed 2 * NQ FMAs.
template <int NQ>
void pv_block(const float *p, int64_t ld_p, const float *v, int64_t v_stride, int64_t n_k, int64_t dv, float *acc) {
    int64_t c = 0;
    for (; c + 16 <= dv; c += 16) {
        __m256 a0[NQ], a1[NQ];
        for (int g = 0; g < NQ; ++g) {
            a0[g] = _mm256_loadu_ps(acc + g * dv + c);
            a1[g] = _mm256_loadu_ps(acc + g * dv + c + 8);
        }
        const float *vr = v + c;
        for (int64_t j = 0; j < n_k; ++j, vr += v_stride) {
            const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
            for (int g = 0; g < NQ; ++g) {
                const __m256 pb = _mm256_broadcast_ss(p + g * ld_p + j);
                a0[g] = _mm256_fmadd_ps(pb, v0, a0[g]);
                a1[g] = _mm256_fmadd_ps(pb, v1, a1[g]);
            }
        }
        for (int g = 0; g < NQ; ++g) {
            _mm256_storeu_ps(acc + g * dv + c, a0[g]);
            _mm256_storeu_ps(acc + g * dv + c + 8, a1[g]);
        }
    }
    for (; c + 8 <= dv; c += 8) {
        __m256 a0[NQ];
        for (int g = 0; g < NQ; ++g) a0[g] = _mm256_loadu_ps(acc + g * dv + c);
        const float *vr = v + c;
        for (int64_t j = 0; j < n_k; ++j, vr += v_stride) {
            const __m256 v0 = _mm256_loadu_ps(vr);
            for (int g = 0; g < NQ; ++g) a0[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + g * ld_p + j), v0, a0[g]);
        }
        for (int g = 0; g < NQ; ++g) _mm256_storeu_ps(acc + g * dv + c, a0[g]);
    }
    for (; c < dv; ++c) {
        for (int g = 0; g < NQ; ++g) {
            float a = acc[g * dv + c];
            for (int64_t j = 0; j < n_k; ++j) a += p[g * ld_p + j] * v[j * v_stride + c];
            acc[g * dv + c] = a;
        }
    }
}

}  // namespace

float exp_sum(float *s, int64_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = cpu::simd::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (j < n) {
        // The tail through a buffer whose lanes past n hold -inf: their exp is 0, so the sum is unchanged.
        alignas(32) float buf[8];
        const int64_t r = n - j;
        for (int64_t i = 0; i < 8; ++i) buf[i] = i < r ? s[j + i] - m : -__builtin_inff();
        const __m256 e = cpu::simd::exp8(_mm256_load_ps(buf));
        _mm256_store_ps(buf, e);
        for (int64_t i = 0; i < r; ++i) s[j + i] = buf[i];
        acc = _mm256_add_ps(acc, e);
    }
    return hsum(acc);
}

void scores(const float *q, int64_t q_stride, int64_t n_q, const float *k, int64_t k_stride, int64_t n_k, int64_t d,
            float scale, float *s, int64_t ld_s) {
    for (int64_t g = 0; g < n_q; g += kHeadBlock) {
        const float *qg = q + g * q_stride;
        float *sg = s + g * ld_s;
        switch (n_q - g < kHeadBlock ? n_q - g : kHeadBlock) {
            case 1: scores_block<1>(qg, q_stride, k, k_stride, n_k, d, scale, sg, ld_s); break;
            case 2: scores_block<2>(qg, q_stride, k, k_stride, n_k, d, scale, sg, ld_s); break;
            case 3: scores_block<3>(qg, q_stride, k, k_stride, n_k, d, scale, sg, ld_s); break;
            default: scores_block<4>(qg, q_stride, k, k_stride, n_k, d, scale, sg, ld_s); break;
        }
    }
}

void pv(const float *p, int64_t ld_p, int64_t n_q, const float *v, int64_t v_stride, int64_t n_k, int64_t dv,
        float *acc) {
    for (int64_t g = 0; g < n_q; g += kHeadBlock) {
        const float *pg = p + g * ld_p;
        float *ag = acc + g * dv;
        switch (n_q - g < kHeadBlock ? n_q - g : kHeadBlock) {
            case 1: pv_block<1>(pg, ld_p, v, v_stride, n_k, dv, ag); break;
            case 2: pv_block<2>(pg, ld_p, v, v_stride, n_k, dv, ag); break;
            case 3: pv_block<3>(pg, ld_p, v, v_stride, n_k, dv, ag); break;
            default: pv_block<4>(pg, ld_p, v, v_stride, n_k, dv, ag); break;
        }
    }
}

}  // namespace sparrow::attn::avx2
