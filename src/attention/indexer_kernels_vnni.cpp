// AVX512-VNNI versions of the fast (int8) lightning-indexer scores (contracts in indexer_kernels.h). Compiled
// with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (CMakeLists.txt: files named *_vnni.cpp) and called only
// when cpuid says the CPU has AVX-512 with VNNI (lightning_indexer.cpp). The exact kernels, the converters and
// the key quantiser stay the AVX2 ones.
//
// The loops are those of indexer_kernels_avx2.cpp at twice the width, with one change: vpdpbusd multiplies the
// unsigned query bytes by the signed key bytes, adds each group of four products and accumulates into int32
// in one instruction, where AVX2 needs maddubs, madd and add. One 512-bit vector holds 16 heads (the dword of
// four elements of each, as qT4 is laid out), so one broadcast dword of a key meets 32 heads in two
// instructions. In a register-only loop on a 2-vCPU Xeon, 512-bit and 256-bit vpdpbusd issued at the same rate
// (~5 G per second per core), so the wider one does twice the products; 8 keys x 2 vectors = 16 independent
// accumulators cover the instruction's latency. The 16K-key decode call went from 1.30-1.56 to 0.96-0.99 ms
// against the 256-bit kernel (one thread). A pass ends on a vector of 8 heads when hp is not a multiple of
// 16: its loads are masked (the lanes past it read nothing and stay 0, and their weight is 0).
//
// Queries are 8-bit here (q_offset kQueryOffsetDpbusd: vpdpbusd adds four products straight into int32, so the
// int16 limit of AVX2's maddubs pairs does not apply; indexer_kernels.h). The int32 sums are the scalar kernel's
// for the same query bytes; the f32 steps after them sum heads in another order, so the scores equal the scalar
// ones up to f32 rounding.
//
// ODR rule (as src/kernels/cpu/kernels_avx2.cpp): this file includes only <immintrin.h>, <cstddef>,
// <cstdint>, <cstring>, core/blocks.h and indexer_kernels.h, and everything but the exported kernels sits in
// an anonymous namespace.

#include "kernels/cpu/avx512_intrinsics.h"  // <immintrin.h> without GCC 12's false warnings

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/indexer_kernels.h"
#include "core/blocks.h"

namespace sparrow::indexer::avx512vnni {

namespace {

constexpr int kMaxVec = 2;  // 16-head vectors per pass (32 heads)
constexpr int kKeys = 8;    // keys per block of score_pass_i8: 8 keys x 2 vectors = 16 of the 32 registers
// Keys ahead of the block being scored whose int8 rows are prefetched (4 KiB at width 128). In the model the
// rows come from DRAM (the weights stream through the caches between layers): a fast decode call at 16K keys
// scored for 176 us (two threads) without it, 133 us with it; 16 and 64 keys ahead measured no better.
constexpr int64_t kPrefetchKeys = 32;
constexpr int kQ8Keys = 4;  // keys per block of score_pass_q8_0 (it also holds per-key f32 sums)

// Prefetches the cache lines of bytes [from, from + n) of `base`. The address is computed as an integer: near the
// end of the rows it lies past them, which a prefetch may touch (it never faults) but pointer arithmetic may not.
inline void prefetch_bytes(const void *base, int64_t from, int64_t n) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(from);
    for (int64_t b = 0; b < n; b += 64)
        _mm_prefetch(reinterpret_cast<const char *>(p + static_cast<uintptr_t>(b)), _MM_HINT_T0);
}

// relu keeping NaN: max_ps returns its second operand when either is NaN.
inline __m512 relu(__m512 v) { return _mm512_max_ps(_mm512_setzero_ps(), v); }

// acc + the dword sums of u (unsigned bytes) x s (signed bytes): vpdpbusd, written in asm because GCC 12 copies
// the accumulator to a new register around the intrinsic (two moves per instruction and a spill at 16
// accumulators, measured in the disassembly); the asm keeps it in place.
inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

inline __m512i broadcast_dword(const int8_t *p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm512_set1_epi32(x);
}

// The pass's head vectors of one group of four elements: NV vectors of 16 dwords, the last masked.
template <int NV>
inline void load_queries(const uint8_t *qp, __mmask16 last_mask, __m512i *q) {
    for (int v = 0; v < NV; ++v) {
        q[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(last_mask, qp + 64 * v) : _mm512_loadu_si512(qp + 64 * v);
    }
}

// sum_h w[h] * relu(dot[h]) over the pass's heads, as one f32.
template <int NV>
inline float weighted_relu_sum(const __m512i *dot, const __m512 *wv) {
    __m512 s = _mm512_mul_ps(wv[0], relu(_mm512_cvtepi32_ps(dot[0])));
    for (int v = 1; v < NV; ++v) s = _mm512_fmadd_ps(wv[v], relu(_mm512_cvtepi32_ps(dot[v])), s);
    return _mm512_reduce_add_ps(s);
}

// NK keys (NK <= kKeys) from keys + j * dp against NV head vectors.
template <int NV, int NK>
inline void score_keys_i8(const uint8_t *qT4, const __m512 *wv, __mmask16 last_mask, int64_t hp, int64_t dp,
                          const int8_t *keys, const int32_t *ksum, const float *kscale, int64_t j, float *scores,
                          bool add, int32_t q_offset) {
    // Each key's accumulators start at -q_offset * sum(key), so that they end at the products of the signed query
    // (the offset taken off once, in int32, exactly as after the loop).
    __m512i a[NK][NV];
    for (int k = 0; k < NK; ++k) {
        const __m512i start = _mm512_set1_epi32(-q_offset * ksum[j + k]);
        for (int v = 0; v < NV; ++v) a[k][v] = start;
    }
    const int64_t n_groups = dp / 4;
    const int64_t q_stride = hp * 4;  // bytes from one group of four elements to the next
    const uint8_t *qp = qT4;
    for (int64_t g = 0; g < n_groups; ++g, qp += q_stride) {
        __m512i q[NV];
        load_queries<NV>(qp, last_mask, q);
        for (int k = 0; k < NK; ++k) {
            const __m512i kb = broadcast_dword(keys + (j + k) * dp + 4 * g);
            for (int v = 0; v < NV; ++v) a[k][v] = dpbusd(a[k][v], q[v], kb);
        }
    }
    for (int k = 0; k < NK; ++k) {
        const float r = kscale[j + k] * weighted_relu_sum<NV>(a[k], wv);
        scores[j + k] = add ? scores[j + k] + r : r;
    }
}

template <int NV>
void score_pass_i8(const uint8_t *qT4, const __m512 *wv, __mmask16 last_mask, int64_t hp, int64_t dp,
                   const int8_t *keys, const int32_t *ksum, const float *kscale, int64_t n, float *scores, bool add,
                   int32_t q_offset) {
    int64_t j = 0;
    for (; j + kKeys <= n; j += kKeys) {
        prefetch_bytes(keys, (j + kPrefetchKeys) * dp, kKeys * dp);
        score_keys_i8<NV, kKeys>(qT4, wv, last_mask, hp, dp, keys, ksum, kscale, j, scores, add, q_offset);
    }
    // The tail: a block of four, then of two, then one.
    if (n - j >= 4) {
        score_keys_i8<NV, 4>(qT4, wv, last_mask, hp, dp, keys, ksum, kscale, j, scores, add, q_offset);
        j += 4;
    }
    if (n - j >= 2) {
        score_keys_i8<NV, 2>(qT4, wv, last_mask, hp, dp, keys, ksum, kscale, j, scores, add, q_offset);
        j += 2;
    }
    if (n - j == 1) score_keys_i8<NV, 1>(qT4, wv, last_mask, hp, dp, keys, ksum, kscale, j, scores, add, q_offset);
}

// The byte sum of a Q8_0 block's 32 values: sum(k) = sum(k + 128) - 32 * 128, where sad adds the biased bytes
// into four 64-bit lanes.
inline int32_t block_sum(const int8_t *kq) {
    const __m256i biased = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(kq)),
                                            _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i sad = _mm256_sad_epu8(biased, _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    return static_cast<int32_t>(_mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2)))) - 32 * 128;
}

// NK keys (NK <= kQ8Keys) of Q8_0 rows read in place against NV head vectors: per block, each key's int32 dots
// of its eight groups, the query offset taken off with the block's byte sum, and the block's scale applied
// before the next block is added (the order of the other levels).
template <int NV, int NK>
inline void score_keys_q8_0(const uint8_t *qT4, const __m512 *wv, __mmask16 last_mask, int64_t hp, int64_t d,
                            const void *const *keys, float *scores, bool add, int32_t q_offset) {
    const int64_t nb = d / QK8_0;
    const int64_t q_stride = hp * 4;
    __m512 f[NK][NV];
    for (int k = 0; k < NK; ++k) {
        for (int v = 0; v < NV; ++v) f[k][v] = _mm512_setzero_ps();
    }
    const uint8_t *qp = qT4;
    for (int64_t b = 0; b < nb; ++b) {
        const int8_t *kq[NK];
        for (int k = 0; k < NK; ++k) kq[k] = static_cast<const BlockQ8_0 *>(keys[k])[b].qs;
        __m512i a[NK][NV];
        for (int k = 0; k < NK; ++k) {
            for (int v = 0; v < NV; ++v) a[k][v] = _mm512_setzero_si512();
        }
        for (int g = 0; g < QK8_0 / 4; ++g, qp += q_stride) {
            __m512i q[NV];
            load_queries<NV>(qp, last_mask, q);
            for (int k = 0; k < NK; ++k) {
                const __m512i kb = broadcast_dword(kq[k] + 4 * g);
                for (int v = 0; v < NV; ++v) a[k][v] = dpbusd(a[k][v], q[v], kb);
            }
        }
        for (int k = 0; k < NK; ++k) {
            const __m512i offset = _mm512_set1_epi32(q_offset * block_sum(kq[k]));
            const __m512 db = _mm512_set1_ps(_cvtsh_ss(static_cast<const BlockQ8_0 *>(keys[k])[b].d));
            for (int v = 0; v < NV; ++v)
                f[k][v] = _mm512_fmadd_ps(db, _mm512_cvtepi32_ps(_mm512_sub_epi32(a[k][v], offset)), f[k][v]);
        }
    }
    for (int k = 0; k < NK; ++k) {
        __m512 s = _mm512_mul_ps(wv[0], relu(f[k][0]));
        for (int v = 1; v < NV; ++v) s = _mm512_fmadd_ps(wv[v], relu(f[k][v]), s);
        const float r = _mm512_reduce_add_ps(s);
        scores[k] = add ? scores[k] + r : r;
    }
}

template <int NV>
void score_pass_q8_0(const uint8_t *qT4, const __m512 *wv, __mmask16 last_mask, int64_t hp, int64_t d,
                     const void *const *keys, int64_t n, float *scores, bool add, int32_t q_offset) {
    int64_t j = 0;
    for (; j + kQ8Keys <= n; j += kQ8Keys)
        score_keys_q8_0<NV, kQ8Keys>(qT4, wv, last_mask, hp, d, keys + j, scores + j, add, q_offset);
    switch (n - j) {
        case 3: score_keys_q8_0<NV, 3>(qT4, wv, last_mask, hp, d, keys + j, scores + j, add, q_offset); break;
        case 2: score_keys_q8_0<NV, 2>(qT4, wv, last_mask, hp, d, keys + j, scores + j, add, q_offset); break;
        case 1: score_keys_q8_0<NV, 1>(qT4, wv, last_mask, hp, d, keys + j, scores + j, add, q_offset); break;
        default: break;
    }
}

// Runs Pass<NV> over the heads 32 at a time (hp is a multiple of 8): NV = 2 vectors, or 1 for the last 8 or 16
// heads, the last vector masked to what is left. The first pass writes the scores, the others add to them.
template <typename Pass>
void over_head_passes(const uint8_t *qT4, const float *wq, int64_t hp, Pass &&pass) {
    for (int64_t h0 = 0; h0 < hp; h0 += 16 * kMaxVec) {
        const int64_t heads = hp - h0 < 16 * kMaxVec ? hp - h0 : 16 * kMaxVec;
        const int nv = heads > 16 ? 2 : 1;
        const int64_t last = heads - 16 * (nv - 1);
        const __mmask16 last_mask = last >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << last) - 1);
        __m512 wv[kMaxVec];
        for (int v = 0; v < nv; ++v) {
            wv[v] =
                v == nv - 1 ? _mm512_maskz_loadu_ps(last_mask, wq + h0 + 16 * v) : _mm512_loadu_ps(wq + h0 + 16 * v);
        }
        pass(qT4 + 4 * h0, wv, last_mask, nv, h0 > 0);
    }
}

}  // namespace

void score_i8(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys, const int32_t *ksum,
              const float *kscale, int64_t n_keys, float *scores, int32_t q_offset) {
    over_head_passes(qT4, wq, hp, [&](const uint8_t *q, const __m512 *wv, __mmask16 last_mask, int nv, bool add) {
        if (nv == 2) {
            score_pass_i8<2>(q, wv, last_mask, hp, dp, keys, ksum, kscale, n_keys, scores, add, q_offset);
        } else {
            score_pass_i8<1>(q, wv, last_mask, hp, dp, keys, ksum, kscale, n_keys, scores, add, q_offset);
        }
    });
}

void score_q8_0(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys, int64_t n_keys,
                float *scores, int32_t q_offset) {
    over_head_passes(qT4, wq, hp, [&](const uint8_t *q, const __m512 *wv, __mmask16 last_mask, int nv, bool add) {
        if (nv == 2) {
            score_pass_q8_0<2>(q, wv, last_mask, hp, d, keys, n_keys, scores, add, q_offset);
        } else {
            score_pass_q8_0<1>(q, wv, last_mask, hp, d, keys, n_keys, scores, add, q_offset);
        }
    });
}

}  // namespace sparrow::indexer::avx512vnni
