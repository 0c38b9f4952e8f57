// AVX512-VNNI versions of the fast (int8) lightning-indexer scores (contracts in indexer_kernels.h). Compiled
// with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (CMakeLists.txt: files named *_vnni.cpp) and called only
// when cpuid says the CPU has AVX-512 with VNNI (lightning_indexer.cpp). The exact kernels, the converters and
// the key quantiser stay the AVX2 ones.
//
// The loops are those of indexer_kernels_avx2.cpp with one change: vpdpbusd multiplies the unsigned query
// bytes by the signed key bytes, adds each group of four products and accumulates into int32 in one
// instruction, where AVX2 needs maddubs, madd and add. The int32 sums are the same integers (maddubs never
// saturates here: indexer_kernels.h) and the f32 steps after them are AVX2's, but the compiler may contract
// the last multiply-add of a score differently, so the scores equal the scalar ones up to f32 rounding (the
// AVX2 ones to the last bit or two; measured on a Xeon with VNNI). Vectors stay 256 bits wide (AVX512-VL):
// 8 heads per vector, as qT4 is laid out.
//
// ODR rule (as src/kernels/cpu/kernels_avx2.cpp): this file includes only <immintrin.h>, <cstddef>,
// <cstdint>, <cstring>, core/blocks.h and indexer_kernels.h, and everything but the exported kernels sits in
// an anonymous namespace.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/indexer_kernels.h"
#include "core/blocks.h"

namespace sparrow::indexer::avx512vnni {

namespace {

constexpr int kMaxVec = 4;  // head vectors per pass (32 heads)
constexpr int kKeys = 4;    // keys per pass of score_pass_i8: 4 keys x 4 vectors = 16 of the 32 registers

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// relu keeping NaN: max_ps returns its second operand when either is NaN.
inline __m256 relu(__m256 v) { return _mm256_max_ps(_mm256_setzero_ps(), v); }

inline __m256i broadcast_dword(const int8_t *p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm256_set1_epi32(x);
}

// NK keys (NK <= kKeys) from keys + j * dp against NV head vectors; as the AVX2 score_pass_i8.
template <int NV, int NK>
inline void score_keys_i8(const uint8_t *qT4, const __m256 *wv, int64_t hp, int64_t dp, const int8_t *keys,
                          const int32_t *ksum, const float *kscale, int64_t j, float *scores, bool add) {
    __m256i a[NK][NV];
    for (int k = 0; k < NK; ++k) {
        for (int v = 0; v < NV; ++v) a[k][v] = _mm256_setzero_si256();
    }
    const int64_t n_groups = dp / 4;
    const int64_t q_stride = hp * 4;  // bytes from one group of four elements to the next
    const uint8_t *qp = qT4;
    for (int64_t g = 0; g < n_groups; ++g, qp += q_stride) {
        __m256i kb[NK];
        for (int k = 0; k < NK; ++k) kb[k] = broadcast_dword(keys + (j + k) * dp + 4 * g);
        for (int v = 0; v < NV; ++v) {
            const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qp + 32 * v));
            for (int k = 0; k < NK; ++k) a[k][v] = _mm256_dpbusd_epi32(a[k][v], qv, kb[k]);
        }
    }
    for (int k = 0; k < NK; ++k) {
        const __m256i offset = _mm256_set1_epi32(kQueryOffset * ksum[j + k]);
        __m256 s = _mm256_mul_ps(wv[0], relu(_mm256_cvtepi32_ps(_mm256_sub_epi32(a[k][0], offset))));
        for (int v = 1; v < NV; ++v)
            s = _mm256_fmadd_ps(wv[v], relu(_mm256_cvtepi32_ps(_mm256_sub_epi32(a[k][v], offset))), s);
        const float r = kscale[j + k] * hsum(s);
        scores[j + k] = add ? scores[j + k] + r : r;
    }
}

template <int NV>
void score_pass_i8(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys, const int32_t *ksum,
                   const float *kscale, int64_t n, float *scores, bool add) {
    __m256 wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = _mm256_loadu_ps(wq + 8 * v);
    int64_t j = 0;
    for (; j + kKeys <= n; j += kKeys) score_keys_i8<NV, kKeys>(qT4, wv, hp, dp, keys, ksum, kscale, j, scores, add);
    switch (n - j) {
        case 3: score_keys_i8<NV, 3>(qT4, wv, hp, dp, keys, ksum, kscale, j, scores, add); break;
        case 2: score_keys_i8<NV, 2>(qT4, wv, hp, dp, keys, ksum, kscale, j, scores, add); break;
        case 1: score_keys_i8<NV, 1>(qT4, wv, hp, dp, keys, ksum, kscale, j, scores, add); break;
        default: break;
    }
}

// NV head vectors against Q8_0 key rows read in place, one key at a time (as the AVX2 score_pass_q8_0): per
// block, the int32 dots of its eight groups, the query offset taken off with the block's byte sum, and the
// block's scale applied before the next block is added.
template <int NV>
void score_pass_q8_0(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys, int64_t n,
                     float *scores, bool add) {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    const int64_t nb = d / QK8_0;
    const int64_t q_stride = hp * 4;
    for (int64_t j = 0; j < n; ++j) {
        const auto *blocks = static_cast<const BlockQ8_0 *>(keys[j]);
        __m256 f[NV];
        for (int v = 0; v < NV; ++v) f[v] = _mm256_setzero_ps();
        const uint8_t *qp = qT4;
        for (int64_t b = 0; b < nb; ++b) {
            const int8_t *kq = blocks[b].qs;
            __m256i a[NV];
            for (int v = 0; v < NV; ++v) a[v] = _mm256_setzero_si256();
            for (int g = 0; g < QK8_0 / 4; ++g, qp += q_stride) {
                const __m256i kb = broadcast_dword(kq + 4 * g);
                for (int v = 0; v < NV; ++v) {
                    const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qp + 32 * v));
                    a[v] = _mm256_dpbusd_epi32(a[v], qv, kb);
                }
            }
            // sum(k) = sum(k + 128) - 32 * 128: sad adds the biased bytes into four 64-bit lanes.
            const __m256i biased = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(kq)), bias);
            const __m256i sad = _mm256_sad_epu8(biased, _mm256_setzero_si256());
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
            const int32_t ksum =
                static_cast<int32_t>(_mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2)))) - 32 * 128;
            const __m256i offset = _mm256_set1_epi32(kQueryOffset * ksum);
            const __m256 db = _mm256_set1_ps(_cvtsh_ss(blocks[b].d));
            for (int v = 0; v < NV; ++v)
                f[v] = _mm256_fmadd_ps(db, _mm256_cvtepi32_ps(_mm256_sub_epi32(a[v], offset)), f[v]);
        }
        __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(wq), relu(f[0]));
        for (int v = 1; v < NV; ++v) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(wq + 8 * v), relu(f[v]), s0);
        scores[j] = add ? scores[j] + hsum(s0) : hsum(s0);
    }
}

}  // namespace

void score_i8(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys, const int32_t *ksum,
              const float *kscale, int64_t n_keys, float *scores) {
    for (int64_t h0 = 0; h0 < hp; h0 += 8 * kMaxVec) {
        const int64_t nv = (hp - h0) / 8 < kMaxVec ? (hp - h0) / 8 : kMaxVec;
        const bool add = h0 > 0;
        const uint8_t *q = qT4 + 4 * h0;
        switch (nv) {
            case 1: score_pass_i8<1>(q, wq + h0, hp, dp, keys, ksum, kscale, n_keys, scores, add); break;
            case 2: score_pass_i8<2>(q, wq + h0, hp, dp, keys, ksum, kscale, n_keys, scores, add); break;
            case 3: score_pass_i8<3>(q, wq + h0, hp, dp, keys, ksum, kscale, n_keys, scores, add); break;
            default: score_pass_i8<4>(q, wq + h0, hp, dp, keys, ksum, kscale, n_keys, scores, add); break;
        }
    }
}

void score_q8_0(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys, int64_t n_keys,
                float *scores) {
    for (int64_t h0 = 0; h0 < hp; h0 += 8 * kMaxVec) {
        const int64_t nv = (hp - h0) / 8 < kMaxVec ? (hp - h0) / 8 : kMaxVec;
        const bool add = h0 > 0;
        const uint8_t *q = qT4 + 4 * h0;
        switch (nv) {
            case 1: score_pass_q8_0<1>(q, wq + h0, hp, d, keys, n_keys, scores, add); break;
            case 2: score_pass_q8_0<2>(q, wq + h0, hp, d, keys, n_keys, scores, add); break;
            case 3: score_pass_q8_0<3>(q, wq + h0, hp, d, keys, n_keys, scores, add); break;
            default: score_pass_q8_0<4>(q, wq + h0, hp, d, keys, n_keys, scores, add); break;
        }
    }
}

}  // namespace sparrow::indexer::avx512vnni
