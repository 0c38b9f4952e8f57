// AVX-512 versions of the head-lane attention kernels (contracts in attention_kernels.h). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq (CMakeLists.txt) and called only when cpuid says the CPU has them.
//
// 16 query heads fill the 16 lanes of a vector, so every FMA takes one cache-row element as a broadcast memory
// operand (vfmadd231ps zmm, zmm, m32{1to16}: one fused load + FMA) and needs no horizontal sum:
//   scores: 8 rows x 2 elements = 16 accumulators; per two elements, 2 loads of qt feed 16 FMAs.
//   pv:     16 output columns in registers over the tile's rows; per row, 1 load of p feeds 16 FMAs.
// That is ~1.1 loads per FMA, within the two load ports that feed two 512-bit FMA units. The AVX2 kernels put
// 8 elements of a row in a vector and 4 heads in registers, which needs horizontal sums and, at 512 bits, ran
// slower than at 256 (28 against 35-37 G multiply-adds/s on a 2-vCPU Xeon whose 512-bit FMA peak is 88).
//
// ODR rule (as src/kernels/cpu/kernels_avx2.cpp): this file includes only <immintrin.h>, <cstdint>,
// attention_kernels.h and simd_exp_avx512.h (internal linkage), and everything but the exported kernels sits in an
// anonymous namespace.

#include "kernels/cpu/avx512_intrinsics.h"  // <immintrin.h> without GCC 12's false warnings

#include <cstdint>

#include "attention/attention_kernels.h"
#include "kernels/cpu/simd_exp_avx512.h"

namespace sparrow::attn::avx512 {

namespace {

constexpr int kScoreRows = 8;   // rows per score block (x 2 elements in flight = 16 accumulators)
constexpr int kPvColumns = 16;  // output columns per P.V block (16 accumulators)

// NR rows against the 16 heads of qt; even and odd elements go to separate accumulators so that 2 * NR
// FMA chains are in flight (FMA latency 4 x 2 units needs 8).
// Prefetches not yet issued: [next, end).
struct Prefetches {
    const void *const *next;
    const void *const *end;
    inline void one() {
        if (next != end) _mm_prefetch(static_cast<const char *>(*next++), _MM_HINT_T0);
    }
    inline void all() {
        while (next != end) _mm_prefetch(static_cast<const char *>(*next++), _MM_HINT_T0);
    }
};

template <int NR>
inline void score_rows(const float *qt, const float *k, int64_t k_stride, int64_t d, float *s, Prefetches &pf) {
    const float *row[NR];
    __m512 a[NR], b[NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
        row[r] = k + r * k_stride;
        a[r] = _mm512_setzero_ps();
        b[r] = _mm512_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 2 <= d; i += 2) {
        if ((i & 7) == 0) pf.one();  // one line per 64 FMAs
        const __m512 q0 = _mm512_loadu_ps(qt + i * 16), q1 = _mm512_loadu_ps(qt + (i + 1) * 16);
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) a[r] = _mm512_fmadd_ps(q0, _mm512_set1_ps(row[r][i]), a[r]);
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) b[r] = _mm512_fmadd_ps(q1, _mm512_set1_ps(row[r][i + 1]), b[r]);
    }
    if (i < d) {
        const __m512 q0 = _mm512_loadu_ps(qt + i * 16);
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) a[r] = _mm512_fmadd_ps(q0, _mm512_set1_ps(row[r][i]), a[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) _mm512_storeu_ps(s + r * 16, _mm512_add_ps(a[r], b[r]));
}

// NC output columns of the 16 heads, kept in registers over all n_k rows. (The unroll pragmas here and in
// score_rows keep GCC 12 from copying the accumulator array through the stack around the loop: P.V on 16
// L1-resident rows went from ~50 to ~58 G multiply-adds/s.)
template <int NC>
inline void pv_columns(const float *p, const float *v, int64_t v_stride, int64_t n_k, float *acc) {
    __m512 a[NC];
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) a[c] = _mm512_loadu_ps(acc + c * 16);
    for (int64_t j = 0; j < n_k; ++j, v += v_stride) {
        const __m512 pj = _mm512_loadu_ps(p + j * 16);
#pragma GCC unroll 16
        for (int c = 0; c < NC; ++c) a[c] = _mm512_fmadd_ps(pj, _mm512_set1_ps(v[c]), a[c]);
    }
#pragma GCC unroll 16
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc + c * 16, a[c]);
}

// Two queries against NR rows: each row element, broadcast once, feeds one FMA per query (NR x 2 accumulators).
template <int NR>
inline void score_rows2(const float *qa, const float *qb, const float *k, int64_t k_stride, int64_t d, float *sa,
                        float *sb, Prefetches &pf) {
    const float *row[NR];
    __m512 a[NR], b[NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
        row[r] = k + r * k_stride;
        a[r] = _mm512_setzero_ps();
        b[r] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < d; ++i) {
        if ((i & 3) == 0) pf.one();  // one line per 64 FMAs
        const __m512 q0 = _mm512_loadu_ps(qa + i * 16), q1 = _mm512_loadu_ps(qb + i * 16);
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) {
            const __m512 x = _mm512_set1_ps(row[r][i]);
            a[r] = _mm512_fmadd_ps(q0, x, a[r]);
            b[r] = _mm512_fmadd_ps(q1, x, b[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
        _mm512_storeu_ps(sa + r * 16, a[r]);
        _mm512_storeu_ps(sb + r * 16, b[r]);
    }
}

// NC output columns of two queries' 16 heads, kept in registers over all n_k rows.
template <int NC>
inline void pv_columns2(const float *pa, const float *pb, const float *v, int64_t v_stride, int64_t n_k, float *acca,
                        float *accb) {
    __m512 a[NC], b[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
        a[c] = _mm512_loadu_ps(acca + c * 16);
        b[c] = _mm512_loadu_ps(accb + c * 16);
    }
    for (int64_t j = 0; j < n_k; ++j, v += v_stride) {
        const __m512 p0 = _mm512_loadu_ps(pa + j * 16), p1 = _mm512_loadu_ps(pb + j * 16);
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) {
            const __m512 x = _mm512_set1_ps(v[c]);
            a[c] = _mm512_fmadd_ps(p0, x, a[c]);
            b[c] = _mm512_fmadd_ps(p1, x, b[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
        _mm512_storeu_ps(acca + c * 16, a[c]);
        _mm512_storeu_ps(accb + c * 16, b[c]);
    }
}

// A block size as a type, so one generic lambda serves every instantiation of a score kernel.
template <int N>
struct Rows {};

// Calls f(Rows<NR>{}, j) for the row blocks of n_k rows: kScoreRows at a time from j = 0, then one block of
// whatever is left (1-7 rows).
template <typename F>
inline void over_row_blocks(int64_t n_k, F &&f) {
    int64_t j = 0;
    for (; j + kScoreRows <= n_k; j += kScoreRows) f(Rows<kScoreRows>{}, j);
    switch (n_k - j) {
        case 7: f(Rows<7>{}, j); break;
        case 6: f(Rows<6>{}, j); break;
        case 5: f(Rows<5>{}, j); break;
        case 4: f(Rows<4>{}, j); break;
        case 3: f(Rows<3>{}, j); break;
        case 2: f(Rows<2>{}, j); break;
        case 1: f(Rows<1>{}, j); break;
        default: break;
    }
}

// r[j][i] = r[i][j] for a 16 x 16 block of floats, one row per register: pairs of rows interleaved (unpack),
// then 4 x 4 blocks gathered inside each 128-bit lane (shuffle_ps), then the 128-bit lanes of four rows
// (shuffle_f32x4, twice). 64 shuffles for 256 elements, against 512 scalar moves with strided stores.
inline void transpose16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);      // lane k: r0[4k] r1[4k] r0[4k+1] r1[4k+1]
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);  // lane k: the same for 4k+2, 4k+3
    }
    __m512 u[16];  // u[4g + c], lane k: rows 4g..4g+3 at column 4k + c
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
        u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);       // lanes 0, 1 of rows 0-3, 4-7
        const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);       // lanes 2, 3
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);  // rows 8-11, 12-15
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);  // column c: lane 0 of each group of four rows
        r[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

}  // namespace

void to_lanes16(const float *q, int64_t q_stride, int64_t d, float scale, float *qt) {
    const __m512 s = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int h = 0; h < 16; ++h) r[h] = _mm512_loadu_ps(q + h * q_stride + i);
        transpose16(r);
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) _mm512_storeu_ps(qt + (i + j) * 16, _mm512_mul_ps(s, r[j]));
    }
    for (; i < d; ++i) {
        for (int64_t h = 0; h < 16; ++h) qt[i * 16 + h] = scale * q[h * q_stride + i];
    }
}

void from_lanes16(const float *acc, int64_t dv, const float *row_scale, float *out, int64_t out_stride) {
    const __m512 s = _mm512_loadu_ps(row_scale);
    int64_t c = 0;
    for (; c + 16 <= dv; c += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) r[j] = _mm512_mul_ps(_mm512_loadu_ps(acc + (c + j) * 16), s);
        transpose16(r);
#pragma GCC unroll 16
        for (int h = 0; h < 16; ++h) _mm512_storeu_ps(out + h * out_stride + c, r[h]);
    }
    for (; c < dv; ++c) {
        for (int64_t h = 0; h < 16; ++h) out[h * out_stride + c] = acc[c * 16 + h] * row_scale[h];
    }
}

void merge16(const float *acc, int64_t part_stride, float *m, const float *l, int64_t state_stride, int64_t n_parts,
             int64_t dv, float *out, int64_t out_stride) {
    __m512 top = _mm512_set1_ps(-__builtin_inff());
    __mmask16 nan = 0;  // lanes where a piece's maximum is NaN: they stay NaN, as without the cut
    for (int64_t p = 0; p < n_parts; ++p) {
        const __m512 mp = _mm512_loadu_ps(m + p * state_stride);
        nan |= _mm512_cmp_ps_mask(mp, mp, _CMP_UNORD_Q);
        top = _mm512_max_ps(top, mp);
    }
    top = _mm512_mask_mov_ps(top, nan, _mm512_set1_ps(__builtin_nanf("")));
    const __mmask16 any = _mm512_cmp_ps_mask(top, _mm512_set1_ps(-__builtin_inff()), _CMP_NEQ_UQ);
    __m512 total = _mm512_setzero_ps();
    for (int64_t p = 0; p < n_parts; ++p) {  // m_p becomes f_p
        const __m512 f =
            _mm512_maskz_mov_ps(any, cpu::simd::exp16(_mm512_sub_ps(_mm512_loadu_ps(m + p * state_stride), top)));
        _mm512_storeu_ps(m + p * state_stride, f);
        total = _mm512_fmadd_ps(f, _mm512_loadu_ps(l + p * state_stride), total);
    }
    const __mmask16 positive = _mm512_cmp_ps_mask(total, _mm512_setzero_ps(), _CMP_GT_OQ);
    alignas(64) float inv[16];
    _mm512_store_ps(inv, _mm512_maskz_div_ps(positive, _mm512_set1_ps(1.0f), total));
    // Blocks of 16 output columns: the pieces' weighted sum in registers, then out of the lanes into the rows.
    alignas(64) float block[16 * 16];
    for (int64_t c0 = 0; c0 < dv; c0 += 16) {
        const int64_t nc = dv - c0 < 16 ? dv - c0 : 16;
        __m512 r[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) r[j] = _mm512_setzero_ps();
        for (int64_t p = 0; p < n_parts; ++p) {
            const __m512 f = _mm512_loadu_ps(m + p * state_stride);
            const float *a = acc + p * part_stride + c0 * 16;
            for (int64_t j = 0; j < nc; ++j) r[j] = _mm512_fmadd_ps(f, _mm512_loadu_ps(a + j * 16), r[j]);
        }
        for (int64_t j = 0; j < nc; ++j) _mm512_store_ps(block + j * 16, r[j]);
        from_lanes16(block, nc, inv, out + c0, out_stride);
    }
}

void scores16(const float *qt, const float *k, int64_t k_stride, int64_t n_k, int64_t d, float *s,
              const void *const *prefetch, int64_t n_prefetch) {
    Prefetches pf{prefetch, prefetch + n_prefetch};
    over_row_blocks(
        n_k, [&]<int NR>(Rows<NR>, int64_t j) { score_rows<NR>(qt, k + j * k_stride, k_stride, d, s + j * 16, pf); });
    pf.all();
}

void softmax16(float *s, int64_t n, float *m, float *l, float *acc, int64_t dv) {
    __m512 t = _mm512_set1_ps(-__builtin_inff());
    for (int64_t j = 0; j < n; ++j) t = _mm512_max_ps(t, _mm512_loadu_ps(s + j * 16));
    __m512 mv = _mm512_loadu_ps(m), lv = _mm512_loadu_ps(l);
    const __mmask16 grew = _mm512_cmp_ps_mask(t, mv, _CMP_GT_OQ);
    if (grew) {
        // Lanes that did not grow keep factor 1; m = -inf (the first tile) gives exp(-inf) = 0.
        const __m512 f = _mm512_mask_blend_ps(grew, _mm512_set1_ps(1.0f), cpu::simd::exp16(_mm512_sub_ps(mv, t)));
        for (int64_t c = 0; c < dv; ++c)
            _mm512_storeu_ps(acc + c * 16, _mm512_mul_ps(f, _mm512_loadu_ps(acc + c * 16)));
        lv = _mm512_mul_ps(lv, f);
        mv = _mm512_mask_mov_ps(mv, grew, t);
    }
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
        const __m512 e = cpu::simd::exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j * 16), mv));
        _mm512_storeu_ps(s + j * 16, e);
        sum = _mm512_add_ps(sum, e);
    }
    _mm512_storeu_ps(m, mv);
    _mm512_storeu_ps(l, _mm512_add_ps(lv, sum));
}

void pv16(const float *p, const float *v, int64_t v_stride, int64_t n_k, int64_t dv, float *acc,
          const void *const *prefetch, int64_t n_prefetch) {
    // The prefetches go out a few at a time before each block of columns.
    const int64_t n_blocks = dv / kPvColumns;
    const int64_t per_block = n_blocks > 0 ? (n_prefetch + n_blocks - 1) / n_blocks : 0;
    Prefetches pf{prefetch, prefetch + n_prefetch};
    int64_t c = 0;
    for (; c + kPvColumns <= dv; c += kPvColumns) {
        for (int64_t i = 0; i < per_block; ++i) pf.one();
        pv_columns<kPvColumns>(p, v + c, v_stride, n_k, acc + c * 16);
    }
    pf.all();
    for (; c + 4 <= dv; c += 4) pv_columns<4>(p, v + c, v_stride, n_k, acc + c * 16);
    for (; c < dv; ++c) pv_columns<1>(p, v + c, v_stride, n_k, acc + c * 16);
}

void scores16x2(const float *qt_a, const float *qt_b, const float *k, int64_t k_stride, int64_t n_k, int64_t d,
                float *s_a, float *s_b, const void *const *prefetch, int64_t n_prefetch) {
    Prefetches pf{prefetch, prefetch + n_prefetch};
    over_row_blocks(n_k, [&]<int NR>(Rows<NR>, int64_t j) {
        score_rows2<NR>(qt_a, qt_b, k + j * k_stride, k_stride, d, s_a + j * 16, s_b + j * 16, pf);
    });
    pf.all();
}

void pv16x2(const float *p_a, const float *p_b, const float *v, int64_t v_stride, int64_t n_k, int64_t dv, float *acc_a,
            float *acc_b, const void *const *prefetch, int64_t n_prefetch) {
    constexpr int kColumns2 = 8;  // x 2 queries = 16 accumulators
    const int64_t n_blocks = dv / kColumns2;
    const int64_t per_block = n_blocks > 0 ? (n_prefetch + n_blocks - 1) / n_blocks : 0;
    Prefetches pf{prefetch, prefetch + n_prefetch};
    int64_t c = 0;
    for (; c + kColumns2 <= dv; c += kColumns2) {
        for (int64_t i = 0; i < per_block; ++i) pf.one();
        pv_columns2<kColumns2>(p_a, p_b, v + c, v_stride, n_k, acc_a + c * 16, acc_b + c * 16);
    }
    pf.all();
    for (; c < dv; ++c) pv_columns2<1>(p_a, p_b, v + c, v_stride, n_k, acc_a + c * 16, acc_b + c * 16);
}

}  // namespace sparrow::attn::avx512
