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
//
// The head-lane form, for a KV head read by a multiple of 16 query heads (MLA: 16-128 heads per latent row):
// 16 heads sit in the 16 lanes of one vector, so one element of a cache row, broadcast, meets 16 heads in one
// FMA, with no horizontal sums. Arrays marked [.., 16] hold one value per head lane:
//   scores16:  s[j * 16 + h] = sum_i qt[i * 16 + h] * k[j * k_stride + i]       j < n_k, i < d
//              (qt is q transposed, [d, 16], with the softmax scale already applied)
//   softmax16: one tile of the online softmax, per lane h: t = max_j s[j * 16 + h]; where t > m[h] the
//              accumulated output and sum are rescaled, acc[c * 16 + h] *= exp(m[h] - t), l[h] *= the same,
//              and m[h] = t; then s[j * 16 + h] = exp(s[j * 16 + h] - m[h]) and l[h] += their sum (n >= 1)
//   pv16:      acc[c * 16 + h] += sum_j p[j * 16 + h] * v[j * v_stride + c]     c < dv, j < n_k
//   scores16x2, pv16x2: the same for two queries a and b over the same rows (causal prefill: a token's rows
//              are the previous token's plus one), each row element broadcast once for both
//   to_lanes16:   qt[i * 16 + h] = scale * q[h * q_stride + i]                 h < 16, i < d
//                 (16 heads' query rows into the lane layout scores16 reads)
//   from_lanes16: out[h * out_stride + c] = acc[c * 16 + h] * row_scale[h]   h < 16, c < dv
//                 (the lane layout back to 16 rows, e.g. the output normalised by 1 / l[h])
//   merge16:   the online-softmax states of n_parts pieces of one query's rows (decode cuts a long list between
//              threads), piece p's at acc + p * part_stride ([dv, 16]), m + p * state_stride and l + p *
//              state_stride ([16]), into 16 output rows: per lane h, M = max_p m_p[h], f_p = exp(m_p[h] - M)
//              (0 for every piece when M = -inf: no rows), L = sum_p f_p l_p[h], and
//              out[h * out_stride + c] = (sum_p f_p acc_p[c * 16 + h]) / L (0 when L = 0; NaN in a lane where
//              some m_p[h] is NaN). m_p[h] is overwritten with f_p (the merge's scratch: no bound on n_parts)
// scores16 and pv16 also prefetch the n_prefetch cache lines at prefetch[] (the next tile's rows, gathered from
// anywhere in the cache), spread over their loops: issued in one burst, they would fill the core's line-fill
// buffers and stall it until DRAM answered, so the loads and the arithmetic would not overlap.
// The scalar versions are the reference; AVX-512 runs them (attention_kernels_avx512.cpp).
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

#define SPARROW_ATTENTION_LANE_KERNELS                                                                              \
    void scores16(const float *qt, const float *k, int64_t k_stride, int64_t n_k, int64_t d, float *s,              \
                  const void *const *prefetch = nullptr, int64_t n_prefetch = 0);                                   \
    void softmax16(float *s, int64_t n, float *m, float *l, float *acc, int64_t dv);                                \
    void pv16(const float *p, const float *v, int64_t v_stride, int64_t n_k, int64_t dv, float *acc,                \
              const void *const *prefetch = nullptr, int64_t n_prefetch = 0);                                       \
    void scores16x2(const float *qt_a, const float *qt_b, const float *k, int64_t k_stride, int64_t n_k, int64_t d, \
                    float *s_a, float *s_b, const void *const *prefetch = nullptr, int64_t n_prefetch = 0);         \
    void pv16x2(const float *p_a, const float *p_b, const float *v, int64_t v_stride, int64_t n_k, int64_t dv,      \
                float *acc_a, float *acc_b, const void *const *prefetch = nullptr, int64_t n_prefetch = 0);         \
    void to_lanes16(const float *q, int64_t q_stride, int64_t d, float scale, float *qt);                           \
    void from_lanes16(const float *acc, int64_t dv, const float *row_scale, float *out, int64_t out_stride);        \
    void merge16(const float *acc, int64_t part_stride, float *m, const float *l, int64_t state_stride,             \
                 int64_t n_parts, int64_t dv, float *out, int64_t out_stride);

namespace sparrow::attn::scalar {
SPARROW_ATTENTION_LANE_KERNELS
}  // namespace sparrow::attn::scalar

namespace sparrow::attn::avx512 {
SPARROW_ATTENTION_LANE_KERNELS
}  // namespace sparrow::attn::avx512

#undef SPARROW_ATTENTION_KERNELS
#undef SPARROW_ATTENTION_LANE_KERNELS
