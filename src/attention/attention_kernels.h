// Inner loops of attention() (attention.cpp drives them), once per instruction set:
// attention_kernels_scalar.cpp and attention_kernels_avx2.cpp. Declarations only, with plain types: the
// ISA files include this header, and the ODR rule of src/kernels/cpu/kernels_avx2.cpp applies to them.
//
// One call works on a tile of cache rows already widened to f32 and on the G query heads that share them
// (MLA: all heads of a token share one latent row, so every converted row serves G = n_head heads):
//   scores: s[g * ld_s + j] = scale * q[g * q_stride + :d] . k[j * k_stride + :d]      g < n_q, j < n_k
//   pv:     acc[g * dv + :dv] += sum_j p[g * ld_p + j] * v[j * v_stride + :dv]      g < n_q, j < n_k
//   exp_sum: s[j] = exp(s[j] - m) for j < n, returns the sum (the online softmax's weights of one head and
//            tile). Scalar: std::exp; AVX2: a degree-6 polynomial after range reduction, within 2 ulp of it
//            for arguments down to -87.3, 0 below that (weights under 1e-38 of the row maximum), NaN kept.
// Both are small matrix products blocked in registers (4 heads x 2 rows for scores, 4 heads x 16 columns
// for pv), so a row loaded once meets several heads: the V accumulation never round-trips acc through
// memory per row, which a per-row axpy does.
#pragma once

#include <cstdint>

#define SPARROW_ATTENTION_KERNELS                                                                                 \
    void scores(const float *q, int64_t q_stride, int64_t n_q, const float *k, int64_t k_stride, int64_t n_k,     \
                int64_t d, float scale, float *s, int64_t ld_s);                                                  \
    void pv(const float *p, int64_t ld_p, int64_t n_q, const float *v, int64_t v_stride, int64_t n_k, int64_t dv, \
            float *acc);                                                                                          \
    float exp_sum(float *s, int64_t n, float m);

namespace sparrow::attn::scalar {
SPARROW_ATTENTION_KERNELS
}  // namespace sparrow::attn::scalar

namespace sparrow::attn::avx2 {
SPARROW_ATTENTION_KERNELS
}  // namespace sparrow::attn::avx2

#undef SPARROW_ATTENTION_KERNELS
