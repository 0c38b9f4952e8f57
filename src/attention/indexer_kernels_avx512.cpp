// AVX-512 version of the exact (f32) lightning-indexer score (contract in indexer_kernels.h). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq (CMakeLists.txt) and called only when cpuid says the CPU has
// them (lightning_indexer.cpp). The converters, the key quantiser and the int8 scores are the AVX2 (or VNNI)
// ones.
//
// The loop is score_pass_f32 of indexer_kernels_avx2.cpp at twice the width: 16 heads per vector, so one
// broadcast of a key element meets 32 heads in two FMAs. Eight keys x two head vectors = 16 accumulators (of 32
// registers) cover the FMA latency x throughput of two 512-bit FMA units with 10 loads per 16 FMAs (six keys:
// 8 per 12; eight measured 6% faster on a 2-vCPU Xeon, medians of 8 alternating runs). A pass ends on a vector of 8
// heads when hp is not a multiple of 16: its loads are masked (the lanes past it read nothing and stay 0).
//
// ODR rule (as src/kernels/cpu/kernels_avx2.cpp): this file includes only <immintrin.h>, <cstddef>,
// <cstdint>, <cstring> and indexer_kernels.h, and everything but the exported kernel sits in an anonymous
// namespace.

#include "kernels/cpu/avx512_intrinsics.h"  // <immintrin.h> without GCC 12's false warnings

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/indexer_kernels.h"

namespace sparrow::indexer::avx512 {

namespace {

constexpr int kMaxVec = 2;          // 16-head vectors per pass (32 heads)
constexpr int kKeys = 8;            // keys per block: 8 x 2 accumulators
constexpr int64_t kWidenBuf = 512;  // elements of a key row widened to f32 at a time (as the AVX2 kernel)

// relu keeping NaN: max_ps returns its second operand when either is NaN.
inline __m512 relu(__m512 v) { return _mm512_max_ps(_mm512_setzero_ps(), v); }

template <uint32_t R>
inline float load1(const void *row, int64_t i) {
    if constexpr (R == kRowF16) {
        return _cvtsh_ss(static_cast<const uint16_t *>(row)[i]);
    } else if constexpr (R == kRowBF16) {
        const uint32_t u = uint32_t(static_cast<const uint16_t *>(row)[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    } else {
        return static_cast<const float *>(row)[i];
    }
}

// Elements [i0, i1) of a key row as f32: in place for f32 rows, else widened into buf.
template <uint32_t R>
inline const float *widen(const void *row, int64_t i0, int64_t i1, float *buf) {
    if constexpr (R == kRowF32) {
        return static_cast<const float *>(row) + i0;
    } else {
        const auto *h = static_cast<const uint16_t *>(row);
        int64_t i = i0;
        for (; i + 16 <= i1; i += 16) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + i));
            if constexpr (R == kRowF16) {
                _mm512_store_ps(buf + (i - i0), _mm512_cvtph_ps(x));
            } else {
                _mm512_store_ps(buf + (i - i0), _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16)));
            }
        }
        for (; i < i1; ++i) buf[i - i0] = load1<R>(row, i);
        return buf;
    }
}

// The cache lines of the next block of keys, prefetched one at a time inside a block's loop. In one burst per block the
// 32 lines (f16, d = 128) filled the core's line-fill buffers and stalled it while DRAM or L3 answered.
struct NextLines {
    const char *const *next;  // lines not yet prefetched: [next, end)
    const char *const *end;
    inline void one() {
        if (next != end) _mm_prefetch(*next++, _MM_HINT_T0);
    }
};

// NK keys against NV head vectors (the last one masked by last_mask); scores written or added.
template <uint32_t R, int NV, int NK>
inline void score_keys(const float *qT, const __m512 *wv, __mmask16 last_mask, int64_t hp, int64_t d,
                       const void *const *keys, float *scores, bool add, float (*buf)[kWidenBuf], NextLines &next) {
    __m512 a[NK][NV];
    for (int k = 0; k < NK; ++k) {
        for (int v = 0; v < NV; ++v) a[k][v] = _mm512_setzero_ps();
    }
    for (int64_t i0 = 0; i0 < d; i0 += kWidenBuf) {
        const int64_t i1 = i0 + kWidenBuf < d ? i0 + kWidenBuf : d;
        const float *kp[NK];
        for (int k = 0; k < NK; ++k) kp[k] = widen<R>(keys[k], i0, i1, buf[k]);
        const float *qp = qT + i0 * hp;
        for (int64_t i = 0; i < i1 - i0; ++i, qp += hp) {
            if ((i & 3) == 0) next.one();  // d = 128: 32 lines over 128 steps of 8 x NV FMAs
            __m512 q[NV];
            for (int v = 0; v < NV; ++v)
                q[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last_mask, qp + 16 * v) : _mm512_loadu_ps(qp + 16 * v);
            for (int k = 0; k < NK; ++k) {
                const __m512 b = _mm512_set1_ps(kp[k][i]);
                for (int v = 0; v < NV; ++v) a[k][v] = _mm512_fmadd_ps(b, q[v], a[k][v]);
            }
        }
    }
    for (int k = 0; k < NK; ++k) {
        __m512 s = _mm512_mul_ps(wv[0], relu(a[k][0]));
        for (int v = 1; v < NV; ++v) s = _mm512_fmadd_ps(wv[v], relu(a[k][v]), s);
        const float r = _mm512_reduce_add_ps(s);
        scores[k] = add ? scores[k] + r : r;
    }
}

template <uint32_t R, int NV>
void score_pass(const float *qT, const float *w, int64_t heads, int64_t hp, int64_t d, const void *const *keys,
                int64_t n, float *scores, bool add) {
    // heads in this pass: 16 * (NV - 1) + 8 or + 16; the last vector's mask covers what is left
    const int64_t last = heads - 16 * (NV - 1);
    const __mmask16 last_mask = last >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << last) - 1);
    __m512 wv[NV];
    for (int v = 0; v < NV; ++v)
        wv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last_mask, w + 16 * v) : _mm512_loadu_ps(w + 16 * v);
    alignas(64) float buf[kKeys][kWidenBuf];
    int64_t j = 0;
    // The next block's key rows are prefetched line by line inside this block's loop (NextLines), up to
    // kMaxLines per row (d = 128 f16 rows have 4).
    constexpr int64_t kMaxLines = 8;
    const int64_t row_lines = (d * (R == kRowF32 ? 4 : 2) + 63) / 64;
    const int64_t lines_per_row = row_lines < kMaxLines ? row_lines : kMaxLines;
    const char *lines[kKeys * kMaxLines];
    for (; j + kKeys <= n; j += kKeys) {
        int64_t n_lines = 0;
        if (j + 2 * kKeys <= n) {
            for (int k = 0; k < kKeys; ++k) {
                const char *row = static_cast<const char *>(keys[j + kKeys + k]);
                for (int64_t l = 0; l < lines_per_row; ++l) lines[n_lines++] = row + 64 * l;
            }
        }
        NextLines next{lines, lines + n_lines};
        score_keys<R, NV, kKeys>(qT, wv, last_mask, hp, d, keys + j, scores + j, add, buf, next);
    }
    NextLines none{nullptr, nullptr};
    switch (n - j) {
        case 7: score_keys<R, NV, 7>(qT, wv, last_mask, hp, d, keys + j, scores + j, add, buf, none); break;
        case 6: score_keys<R, NV, 6>(qT, wv, last_mask, hp, d, keys + j, scores + j, add, buf, none); break;
        case 5: score_keys<R, NV, 5>(qT, wv, last_mask, hp, d, keys + j, scores + j, add, buf, none); break;
        case 4: score_keys<R, NV, 4>(qT, wv, last_mask, hp, d, keys + j, scores + j, add, buf, none); break;
        case 3: score_keys<R, NV, 3>(qT, wv, last_mask, hp, d, keys + j, scores + j, add, buf, none); break;
        case 2: score_keys<R, NV, 2>(qT, wv, last_mask, hp, d, keys + j, scores + j, add, buf, none); break;
        case 1: score_keys<R, NV, 1>(qT, wv, last_mask, hp, d, keys + j, scores + j, add, buf, none); break;
        default: break;
    }
}

template <uint32_t R>
void score_t(const float *qT, const float *w, int64_t hp, int64_t d, const void *const *keys, int64_t n_keys,
             float *scores) {
    for (int64_t h0 = 0; h0 < hp; h0 += 16 * kMaxVec) {
        const int64_t heads = hp - h0 < 16 * kMaxVec ? hp - h0 : 16 * kMaxVec;  // a multiple of 8
        const bool add = h0 > 0;
        if (heads > 16) {
            score_pass<R, 2>(qT + h0, w + h0, heads, hp, d, keys, n_keys, scores, add);
        } else {
            score_pass<R, 1>(qT + h0, w + h0, heads, hp, d, keys, n_keys, scores, add);
        }
    }
}

}  // namespace

void score_f32(uint32_t row_type, const float *qT, const float *w, int64_t hp, int64_t d, const void *const *keys,
               int64_t n_keys, float *scores) {
    switch (row_type) {
        case kRowF16: score_t<kRowF16>(qT, w, hp, d, keys, n_keys, scores); return;
        case kRowBF16: score_t<kRowBF16>(qT, w, hp, d, keys, n_keys, scores); return;
        default: score_t<kRowF32>(qT, w, hp, d, keys, n_keys, scores); return;
    }
}

}  // namespace sparrow::indexer::avx512
