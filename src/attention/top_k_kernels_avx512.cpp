// AVX-512 pieces of the top-k radix select (contracts in top_k_kernels.h). Compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq (CMakeLists.txt) and called only when cpuid says the CPU has them (top_k_select.cpp).
//
// The scalar loops spent ~6 cycles per entry on each of the three passes (key conversion, each radix pass's
// compaction, the final partition): the compaction and the partition branch on data a predictor cannot learn,
// and the key conversion is a dependent chain per entry. Here eight entries go through each step at once, and
// vpcompressq packs the kept ones together without branches.
//
// ODR rule (as src/kernels/cpu/kernels_avx2.cpp): this file includes only <immintrin.h>, <cstdint> and
// top_k_kernels.h, and everything but the exported functions sits in an anonymous namespace.

#include "kernels/cpu/avx512_intrinsics.h"  // <immintrin.h> without GCC 12's false warnings

#include <cstdint>

#include "attention/top_k_kernels.h"

namespace sparrow::indexer::avx512 {

namespace {

// The lanes [0, n) of 8, as a mask.
inline __mmask8 first_lanes(int64_t n) { return n >= 8 ? __mmask8(0xFF) : static_cast<__mmask8>((1u << n) - 1); }

// Rank keys of eight entries (64-bit lanes: score bits low, index high).
inline __m512i keys8(__m512i entries) {
    // Scores: the low halves, + 0.0f so that -0 becomes +0 (equal scores, equal bits).
    const __m256 score = _mm256_add_ps(_mm256_castsi256_ps(_mm512_cvtepi64_epi32(entries)), _mm256_setzero_ps());
    const __m256i u = _mm256_castps_si256(score);
    // Negative floats reversed below the positive ones: ~u when the sign is set, else u with the sign set;
    // both are u ^ (sign spread | 0x80000000).
    const __m256i flip = _mm256_or_si256(_mm256_srai_epi32(u, 31), _mm256_set1_epi32(INT32_MIN));
    const __m512i high = _mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm256_xor_si256(u, flip)), 32);
    // 0xFFFFFFFF - idx: the index's complement in the low half.
    const __m512i low = _mm512_xor_si512(_mm512_srli_epi64(entries, 32), _mm512_set1_epi64(0xFFFFFFFF));
    return _mm512_or_si512(high, low);
}

// Writes the lanes of v that m selects to p[0, popcount(m)), in lane order. (vpcompressq into a register and a
// masked store of the first lanes: the memory form of vpcompressq is microcoded and slow on some cores.)
inline int store_compressed(uint64_t *p, __mmask8 m, __m512i v) {
    const int count = __builtin_popcount(m);
    _mm512_mask_storeu_epi64(p, first_lanes(count), _mm512_maskz_compress_epi64(m, v));
    return count;
}

// The lanes of eight entries whose score (the low half) is >= floor.
inline __mmask8 at_least(__mmask8 valid, __m512i entries, __m256 floor) {
    return _mm256_mask_cmp_ps_mask(valid, _mm256_castsi256_ps(_mm512_cvtepi64_epi32(entries)), floor, _CMP_GE_OQ);
}

}  // namespace

void rank_keys(const void *entries, int64_t n, uint64_t *keys) {
    const auto *e = static_cast<const uint64_t *>(entries);
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 m = first_lanes(n - i);
        _mm512_mask_storeu_epi64(keys + i, m, keys8(_mm512_maskz_loadu_epi64(m, e + i)));
    }
}

int64_t keep_digit(uint64_t *keys, int64_t n, int shift, uint64_t digit_mask, uint64_t digit) {
    const __m512i mask = _mm512_set1_epi64(static_cast<long long>(digit_mask));
    const __m512i want = _mm512_set1_epi64(static_cast<long long>(digit));
    const __m128i count = _mm_cvtsi32_si128(shift);
    int64_t kept = 0;
    // In place: the write position never passes the read position, and each block is loaded before it is written.
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 valid = first_lanes(n - i);
        const __m512i v = _mm512_maskz_loadu_epi64(valid, keys + i);
        const __mmask8 hit =
            _mm512_mask_cmpeq_epi64_mask(valid, _mm512_and_si512(_mm512_srl_epi64(v, count), mask), want);
        kept += store_compressed(keys + kept, hit, v);
    }
    return kept;
}

int64_t keep_range(const uint64_t *keys, int64_t n, uint64_t lo, uint64_t hi, uint64_t *out, int64_t *n_above) {
    const __m512i vlo = _mm512_set1_epi64(static_cast<long long>(lo));
    const __m512i vhi = _mm512_set1_epi64(static_cast<long long>(hi));
    int64_t kept = 0, above = 0;
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 valid = first_lanes(n - i);
        const __m512i v = _mm512_maskz_loadu_epi64(valid, keys + i);
        const __mmask8 up = _mm512_mask_cmpgt_epu64_mask(valid, v, vhi);
        const __mmask8 in = _mm512_mask_cmpge_epu64_mask(valid, v, vlo) & static_cast<__mmask8>(~up);
        above += __builtin_popcount(up);
        kept += store_compressed(out + kept, in, v);
    }
    *n_above = above;
    return kept;
}

int64_t partition_by_key(const void *from, const uint64_t *keys, int64_t n, int64_t k, uint64_t kth, void *to) {
    const auto *src = static_cast<const uint64_t *>(from);
    auto *dst = static_cast<uint64_t *>(to);
    const __m512i t = _mm512_set1_epi64(static_cast<long long>(kth));
    int64_t above = 0, below = k;
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 valid = first_lanes(n - i);
        const __m512i key = _mm512_maskz_loadu_epi64(valid, keys + i);
        const __m512i entry = _mm512_maskz_loadu_epi64(valid, src + i);
        const __mmask8 up = _mm512_mask_cmpgt_epu64_mask(valid, key, t);
        const __mmask8 down = _mm512_mask_cmplt_epu64_mask(valid, key, t);
        above += store_compressed(dst + above, up, entry);
        below += store_compressed(dst + below, down, entry);
        const __mmask8 same = valid & static_cast<__mmask8>(~(up | down));
        if (same) store_compressed(dst + k - 1, same, entry);  // one lane: keys are unique
    }
    return above;
}

int64_t count_at_least(const void *entries, int64_t n, float floor) {
    const auto *e = static_cast<const uint64_t *>(entries);
    const __m256 f = _mm256_set1_ps(floor);
    int64_t count = 0;
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 valid = first_lanes(n - i);
        count += __builtin_popcount(at_least(valid, _mm512_maskz_loadu_epi64(valid, e + i), f));
    }
    return count;
}

int64_t keep_at_least(const void *entries, int64_t n, float floor, void *out) {
    const auto *e = static_cast<const uint64_t *>(entries);
    auto *o = static_cast<uint64_t *>(out);
    const __m256 f = _mm256_set1_ps(floor);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i += 8) {
        const __mmask8 valid = first_lanes(n - i);
        const __m512i v = _mm512_maskz_loadu_epi64(valid, e + i);
        kept += store_compressed(o + kept, at_least(valid, v, f), v);
    }
    return kept;
}

}  // namespace sparrow::indexer::avx512
