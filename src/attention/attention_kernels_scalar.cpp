// Plain C++ versions of the attention inner loops (contracts in attention_kernels.h): the reference the
// AVX2 kernels are tested against, and what runs on CPUs without AVX2.
#include "attention/attention_kernels.h"

#include <cmath>

namespace sparrow::attn::scalar {

void scores(const float *q, int64_t q_stride, int64_t n_q, const float *k, int64_t k_stride, int64_t n_k, int64_t d,
            float scale, float *s, int64_t ld_s) {
    for (int64_t g = 0; g < n_q; ++g) {
        for (int64_t j = 0; j < n_k; ++j) {
            float acc = 0.0f;
            for (int64_t i = 0; i < d; ++i) acc += q[g * q_stride + i] * k[j * k_stride + i];
            s[g * ld_s + j] = scale * acc;
        }
    }
}

void pv(const float *p, int64_t ld_p, int64_t n_q, const float *v, int64_t v_stride, int64_t n_k, int64_t dv,
        float *acc) {
    for (int64_t g = 0; g < n_q; ++g) {
        for (int64_t j = 0; j < n_k; ++j) {
            const float pj = p[g * ld_p + j];
            for (int64_t i = 0; i < dv; ++i) acc[g * dv + i] += pj * v[j * v_stride + i];
        }
    }
}

float exp_sum(float *s, int64_t n, float m) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
    }
    return sum;
}

}  // namespace sparrow::attn::scalar
