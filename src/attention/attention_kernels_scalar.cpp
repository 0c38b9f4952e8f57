// Plain C++ versions of the attention inner loops (contracts in attention_kernels.h): the reference the
// AVX2 kernels are tested against, and what runs on CPUs without AVX2.
#include "attention/attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

void scores16(const float *qt, const float *k, int64_t k_stride, int64_t n_k, int64_t d, float *s, const void *const *,
              int64_t) {
    for (int64_t j = 0; j < n_k; ++j) {
        for (int64_t h = 0; h < 16; ++h) {
            float acc = 0.0f;
            for (int64_t i = 0; i < d; ++i) acc += qt[i * 16 + h] * k[j * k_stride + i];
            s[j * 16 + h] = acc;
        }
    }
}

void softmax16(float *s, int64_t n, float *m, float *l, float *acc, int64_t dv) {
    for (int64_t h = 0; h < 16; ++h) {
        float t = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) t = std::max(t, s[j * 16 + h]);
        if (t > m[h]) {
            const float f = std::exp(m[h] - t);
            for (int64_t c = 0; c < dv; ++c) acc[c * 16 + h] *= f;
            l[h] *= f;
            m[h] = t;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) sum += (s[j * 16 + h] = std::exp(s[j * 16 + h] - m[h]));
        l[h] += sum;
    }
}

void pv16(const float *p, const float *v, int64_t v_stride, int64_t n_k, int64_t dv, float *acc, const void *const *,
          int64_t) {
    for (int64_t j = 0; j < n_k; ++j) {
        for (int64_t c = 0; c < dv; ++c) {
            for (int64_t h = 0; h < 16; ++h) acc[c * 16 + h] += p[j * 16 + h] * v[j * v_stride + c];
        }
    }
}

void scores16x2(const float *qt_a, const float *qt_b, const float *k, int64_t k_stride, int64_t n_k, int64_t d,
                float *s_a, float *s_b, const void *const *, int64_t) {
    scores16(qt_a, k, k_stride, n_k, d, s_a);
    scores16(qt_b, k, k_stride, n_k, d, s_b);
}

void pv16x2(const float *p_a, const float *p_b, const float *v, int64_t v_stride, int64_t n_k, int64_t dv, float *acc_a,
            float *acc_b, const void *const *, int64_t) {
    pv16(p_a, v, v_stride, n_k, dv, acc_a);
    pv16(p_b, v, v_stride, n_k, dv, acc_b);
}

void to_lanes16(const float *q, int64_t q_stride, int64_t d, float scale, float *qt) {
    for (int64_t h = 0; h < 16; ++h) {
        for (int64_t i = 0; i < d; ++i) qt[i * 16 + h] = scale * q[h * q_stride + i];
    }
}

void from_lanes16(const float *acc, int64_t dv, const float *row_scale, float *out, int64_t out_stride) {
    for (int64_t h = 0; h < 16; ++h) {
        for (int64_t c = 0; c < dv; ++c) out[h * out_stride + c] = acc[c * 16 + h] * row_scale[h];
    }
}

void merge16(const float *acc, int64_t part_stride, float *m, const float *l, int64_t state_stride, int64_t n_parts,
             int64_t dv, float *out, int64_t out_stride) {
    for (int64_t h = 0; h < 16; ++h) {
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t p = 0; p < n_parts; ++p) {
            const float mp = m[p * state_stride + h];
            top = std::isnan(mp) || std::isnan(top) ? mp + top : std::max(top, mp);  // a NaN piece: a NaN lane
        }
        float total = 0.0f;
        for (int64_t c = 0; c < dv; ++c) out[h * out_stride + c] = 0.0f;
        for (int64_t p = 0; p < n_parts; ++p) {
            float &f = m[p * state_stride + h];  // m_p becomes f_p
            f = top == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(f - top);
            total += f * l[p * state_stride + h];
            for (int64_t c = 0; c < dv; ++c) out[h * out_stride + c] += f * acc[p * part_stride + c * 16 + h];
        }
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int64_t c = 0; c < dv; ++c) out[h * out_stride + c] *= inv;
    }
}

}  // namespace sparrow::attn::scalar
