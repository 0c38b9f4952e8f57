// AVX2 + FMA + F16C versions of the lightning-indexer inner loops (contracts in indexer_kernels.h).
// Compiled with -mavx2 -mfma -mf16c and called only when cpuid says the CPU has them. The int8 scores also come
// in an AVX-VNNI form (score_i8_avxvnni, score_q8_0_avxvnni: the same loops with the VEX vpdpbusd, which adds four
// u8 x s8 products straight into int32, in place of maddubs + madd + add), called only where cpuid says AVX-VNNI
// (Intel's client cores since Alder Lake have it without AVX-512). The instruction is written in inline asm, so
// this file needs no -mavxvnni and the compiler never emits it elsewhere.
//
// ODR rule (as src/kernels/cpu/kernels_avx2.cpp): this file includes only <immintrin.h>, <cstddef>,
// <cstdint>, <cstring> and indexer_kernels.h (declarations and constants), and everything but the
// exported kernels sits in an anonymous namespace.
//
// Both scoring loops vectorise over heads, not over the key's elements: for each element i of a key, one
// broadcast of k[i] (f32, or 4 int8 elements as a dword) meets 8 heads of q per vector, so a key is read
// once for all heads, no horizontal sum is needed until the key's score, and relu and the head weights
// apply to whole vectors. Two keys share each q load (register block: 2 keys x up to 4 head vectors = 8
// accumulators, what the FMA latency x throughput of Zen 3 and Skylake needs).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attention/indexer_kernels.h"
#include "core/blocks.h"

namespace sparrow::indexer::avx2 {

namespace {

constexpr int kMaxVec = 4;  // head vectors per pass (32 heads): 2 keys x 4 vectors = 8 accumulators

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Keeps a loaded vector in a register: without this GCC folds the load into each of the two FMAs that use
// it, loading q twice per element pair, and the loop becomes load-bound (10 loads per 8 FMAs).
template <typename V>
inline void pin(V &v) {
    asm("" : "+x"(v));
}

// relu keeping NaN: max_ps returns its second operand when either is NaN.
inline __m256 relu(__m256 v) { return _mm256_max_ps(_mm256_setzero_ps(), v); }

// acc + the dword sums of u (unsigned bytes) x s (signed bytes), four products each, without saturation: the VEX
// vpdpbusd of AVX-VNNI (only in the *_avxvnni kernels). "x" keeps the operands in ymm0-15, which VEX encodes.
inline __m256i dpbusd_vex(__m256i acc, __m256i u, __m256i s) {
    asm("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
    return acc;
}

// 8 elements of a key row from element i, widened to f32. R is the row type (kRowF32, kRowF16, kRowBF16).
template <uint32_t R>
inline __m256 load8(const void *row, int64_t i) {
    const auto *h = static_cast<const uint16_t *>(row) + i;
    if constexpr (R == kRowF16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h)));
    } else if constexpr (R == kRowBF16) {
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h))), 16));
    } else {
        return _mm256_loadu_ps(static_cast<const float *>(row) + i);
    }
}

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

// --- exact: f32 ------------------------------------------------------------------------------------------
// Rows up to this width are widened to f32 once, into a stack buffer, and read back from L1 (the f16 / bf16
// keys of score_pass_f32, and quantize_keys' second pass); wider rows go through the buffer in pieces.
constexpr int64_t kQuantBuf = 512;

// Widens elements [i0, i1) of a key row into buf[0, i1 - i0) (a no-op for f32 rows, which are read in place).
template <uint32_t R>
inline const float *widen(const void *row, int64_t i0, int64_t i1, float *buf) {
    if constexpr (R == kRowF32) {
        return static_cast<const float *>(row) + i0;
    } else {
        int64_t i = i0;
        for (; i + 8 <= i1; i += 8) _mm256_store_ps(buf + (i - i0), load8<R>(row, i));
        for (; i < i1; ++i) buf[i - i0] = load1<R>(row, i);
        return buf;
    }
}

// NK keys from keys[j] against NV head vectors (8 * NV heads starting at qT's column 0, row stride hp): their
// scores are written (first pass) or added (later passes over more heads). f16 / bf16 keys are widened into
// stack buffers just before their dot products: the buffers stay in L1, where a separate conversion pass over
// a tile of keys would push q (hp * d floats) out of it. NK * NV accumulators: 12 at 3 keys x 4 vectors, more
// than the 8 that FMA latency x throughput needs on Zen 3, so the loop runs near two FMAs a cycle.
template <uint32_t R, int NV, int NK>
inline void score_keys_f32(const float *qT, const __m256 *wv, int64_t hp, int64_t d, const void *const *keys,
                           float *scores, bool add, float (*buf)[kQuantBuf]) {
    __m256 a[NK][NV];
    for (int k = 0; k < NK; ++k) {
        for (int v = 0; v < NV; ++v) a[k][v] = _mm256_setzero_ps();
    }
    for (int64_t i0 = 0; i0 < d; i0 += kQuantBuf) {
        const int64_t i1 = i0 + kQuantBuf < d ? i0 + kQuantBuf : d;
        const float *kp[NK];
        for (int k = 0; k < NK; ++k) kp[k] = widen<R>(keys[k], i0, i1, buf[k]);
        const float *qp = qT + i0 * hp;
        for (int64_t i = 0; i < i1 - i0; ++i, qp += hp) {
            __m256 b[NK];
            for (int k = 0; k < NK; ++k) b[k] = _mm256_broadcast_ss(kp[k] + i);
            for (int v = 0; v < NV; ++v) {
                __m256 qv = _mm256_loadu_ps(qp + 8 * v);
                pin(qv);
                for (int k = 0; k < NK; ++k) a[k][v] = _mm256_fmadd_ps(b[k], qv, a[k][v]);
            }
        }
    }
    for (int k = 0; k < NK; ++k) {
        __m256 s = _mm256_mul_ps(wv[0], relu(a[k][0]));
        for (int v = 1; v < NV; ++v) s = _mm256_fmadd_ps(wv[v], relu(a[k][v]), s);
        scores[k] = add ? scores[k] + hsum(s) : hsum(s);
    }
}

template <uint32_t R, int NV>
void score_pass_f32(const float *qT, const float *w, int64_t hp, int64_t d, const void *const *keys, int64_t n,
                    float *scores, bool add) {
    alignas(32) float buf[3][kQuantBuf];
    __m256 wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = _mm256_loadu_ps(w + 8 * v);
    int64_t j = 0;
    for (; j + 3 <= n; j += 3) score_keys_f32<R, NV, 3>(qT, wv, hp, d, keys + j, scores + j, add, buf);
    if (n - j == 2) score_keys_f32<R, NV, 2>(qT, wv, hp, d, keys + j, scores + j, add, buf);
    if (n - j == 1) score_keys_f32<R, NV, 1>(qT, wv, hp, d, keys + j, scores + j, add, buf);
}

template <uint32_t R>
void score_f32_t(const float *qT, const float *w, int64_t hp, int64_t d, const void *const *keys, int64_t n_keys,
                 float *scores) {
    for (int64_t h0 = 0; h0 < hp; h0 += 8 * kMaxVec) {
        const int64_t nv = (hp - h0) / 8 < kMaxVec ? (hp - h0) / 8 : kMaxVec;
        const bool add = h0 > 0;
        switch (nv) {
            case 1: score_pass_f32<R, 1>(qT + h0, w + h0, hp, d, keys, n_keys, scores, add); break;
            case 2: score_pass_f32<R, 2>(qT + h0, w + h0, hp, d, keys, n_keys, scores, add); break;
            case 3: score_pass_f32<R, 3>(qT + h0, w + h0, hp, d, keys, n_keys, scores, add); break;
            default: score_pass_f32<R, 4>(qT + h0, w + h0, hp, d, keys, n_keys, scores, add); break;
        }
    }
}

// --- fast: uint8 x int8 ----------------------------------------------------------------------------------
// As score_pass_f32 with byte products: maddubs multiplies a broadcast dword of key bytes (four elements) by
// the four query bytes of each of 8 heads and adds pairs into int16 (never saturating: indexer_kernels.h); the
// results of two groups add in int16, and madd with ones widens their sum into one int32 per head: 64
// multiply-adds per three multiply-pipe instructions (four with a madd per group: 16-18% slower at 16K keys,
// sparrow_indexer_bench, one thread), against an FMA's 8 per instruction, with exact integer sums.
// Dpbusd: the AVX-VNNI form, one vpdpbusd per group of four elements instead of the maddubs pairs (8-bit queries).
template <int NV, bool Dpbusd>
void score_pass_i8(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys, const int32_t *ksum,
                   const float *kscale, int64_t n, float *scores, bool add, int32_t q_offset) {
    __m256 wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = _mm256_loadu_ps(wq + 8 * v);
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t n_groups = dp / 4;
    const int64_t q_stride = hp * 4;  // bytes from one group of four elements to the next
    auto finish = [&](const __m256i *acc, int64_t j) {
        const __m256i offset = _mm256_set1_epi32(q_offset * ksum[j]);
        __m256 s = _mm256_mul_ps(wv[0], relu(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[0], offset))));
        for (int v = 1; v < NV; ++v)
            s = _mm256_fmadd_ps(wv[v], relu(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[v], offset))), s);
        const float r = kscale[j] * hsum(s);
        scores[j] = add ? scores[j] + r : r;
    };
    // Groups in pairs: the two maddubs results of a key and head vector add in int16 (indexer_kernels.h) and
    // one madd widens the sum; an odd last group goes alone.
    const int64_t n_pairs = n_groups / 2;
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
        const int8_t *k0 = keys + j * dp, *k1 = k0 + dp;
        __m256i a0[NV], a1[NV];
        for (int v = 0; v < NV; ++v) a0[v] = a1[v] = _mm256_setzero_si256();
        const uint8_t *qp = qT4;
        for (int64_t g2 = 0; g2 < n_pairs; ++g2, qp += 2 * q_stride) {
            int32_t x0, x0b, x1, x1b;
            std::memcpy(&x0, k0 + 8 * g2, 4);
            std::memcpy(&x0b, k0 + 8 * g2 + 4, 4);
            std::memcpy(&x1, k1 + 8 * g2, 4);
            std::memcpy(&x1b, k1 + 8 * g2 + 4, 4);
            const __m256i b0 = _mm256_set1_epi32(x0), b0b = _mm256_set1_epi32(x0b);
            const __m256i b1 = _mm256_set1_epi32(x1), b1b = _mm256_set1_epi32(x1b);
            for (int v = 0; v < NV; ++v) {
                __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qp + 32 * v));
                __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qp + q_stride + 32 * v));
                pin(qa);
                pin(qb);
                if constexpr (Dpbusd) {
                    a0[v] = dpbusd_vex(dpbusd_vex(a0[v], qa, b0), qb, b0b);
                    a1[v] = dpbusd_vex(dpbusd_vex(a1[v], qa, b1), qb, b1b);
                    continue;
                }
                const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(qa, b0), _mm256_maddubs_epi16(qb, b0b));
                const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(qa, b1), _mm256_maddubs_epi16(qb, b1b));
                a0[v] = _mm256_add_epi32(a0[v], _mm256_madd_epi16(p0, ones));
                a1[v] = _mm256_add_epi32(a1[v], _mm256_madd_epi16(p1, ones));
            }
        }
        if (n_groups % 2 != 0) {
            const int64_t g = n_groups - 1;
            int32_t x0, x1;
            std::memcpy(&x0, k0 + 4 * g, 4);
            std::memcpy(&x1, k1 + 4 * g, 4);
            const __m256i b0 = _mm256_set1_epi32(x0), b1 = _mm256_set1_epi32(x1);
            for (int v = 0; v < NV; ++v) {
                const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qp + 32 * v));
                if constexpr (Dpbusd) {
                    a0[v] = dpbusd_vex(a0[v], qv, b0);
                    a1[v] = dpbusd_vex(a1[v], qv, b1);
                    continue;
                }
                a0[v] = _mm256_add_epi32(a0[v], _mm256_madd_epi16(_mm256_maddubs_epi16(qv, b0), ones));
                a1[v] = _mm256_add_epi32(a1[v], _mm256_madd_epi16(_mm256_maddubs_epi16(qv, b1), ones));
            }
        }
        finish(a0, j);
        finish(a1, j + 1);
    }
    if (j < n) {
        const int8_t *k0 = keys + j * dp;
        __m256i a0[NV];
        for (int v = 0; v < NV; ++v) a0[v] = _mm256_setzero_si256();
        const uint8_t *qp = qT4;
        for (int64_t g = 0; g < n_groups; ++g, qp += q_stride) {
            int32_t x0;
            std::memcpy(&x0, k0 + 4 * g, 4);
            const __m256i b0 = _mm256_set1_epi32(x0);
            for (int v = 0; v < NV; ++v) {
                const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qp + 32 * v));
                if constexpr (Dpbusd) {
                    a0[v] = dpbusd_vex(a0[v], qv, b0);
                    continue;
                }
                a0[v] = _mm256_add_epi32(a0[v], _mm256_madd_epi16(_mm256_maddubs_epi16(qv, b0), ones));
            }
        }
        finish(a0, j);
    }
}

// NV head vectors against Q8_0 key rows read in place, one key at a time. Per block: eight broadcast dwords of
// the key meet the heads as in score_pass_i8 (int32 sums), the query offset comes off with the block's byte sum
// (sad of the bytes biased to unsigned), and the block's scale turns the int32 dot into f32 before the next
// block's is added: 4 accumulators of each kind, so one key's 32 heads fit the registers.
template <int NV, bool Dpbusd>
void score_pass_q8_0(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys, int64_t n,
                     float *scores, bool add, int32_t q_offset) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    const int64_t nb = d / QK8_0;
    const int64_t q_stride = hp * 4;  // bytes from one group of four elements to the next
    for (int64_t j = 0; j < n; ++j) {
        const auto *blocks = static_cast<const BlockQ8_0 *>(keys[j]);
        __m256 f[NV];
        for (int v = 0; v < NV; ++v) f[v] = _mm256_setzero_ps();
        const uint8_t *qp = qT4;
        for (int64_t b = 0; b < nb; ++b) {
            const int8_t *kq = blocks[b].qs;
            __m256i a[NV];
            for (int v = 0; v < NV; ++v) a[v] = _mm256_setzero_si256();
            for (int g = 0; g < QK8_0 / 4; g += 2, qp += 2 * q_stride) {  // pairs of groups, as score_pass_i8
                int32_t x, xb;
                std::memcpy(&x, kq + 4 * g, 4);
                std::memcpy(&xb, kq + 4 * g + 4, 4);
                const __m256i kb = _mm256_set1_epi32(x), kbb = _mm256_set1_epi32(xb);
                for (int v = 0; v < NV; ++v) {
                    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qp + 32 * v));
                    const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qp + q_stride + 32 * v));
                    if constexpr (Dpbusd) {
                        a[v] = dpbusd_vex(dpbusd_vex(a[v], qa, kb), qb, kbb);
                        continue;
                    }
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(qa, kb), _mm256_maddubs_epi16(qb, kbb));
                    a[v] = _mm256_add_epi32(a[v], _mm256_madd_epi16(p, ones));
                }
            }
            // sum(k) = sum(k + 128) - 32 * 128: sad adds the biased bytes into four 64-bit lanes.
            const __m256i biased = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(kq)), bias);
            const __m256i sad = _mm256_sad_epu8(biased, _mm256_setzero_si256());
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
            const int32_t ksum =
                static_cast<int32_t>(_mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2)))) - 32 * 128;
            const __m256i offset = _mm256_set1_epi32(q_offset * ksum);
            const __m256 db = _mm256_set1_ps(_cvtsh_ss(blocks[b].d));
            for (int v = 0; v < NV; ++v)
                f[v] = _mm256_fmadd_ps(db, _mm256_cvtepi32_ps(_mm256_sub_epi32(a[v], offset)), f[v]);
        }
        // The head weights are loaded here, not kept in registers across the key: the loop needs them all.
        __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(wq), relu(f[0]));
        for (int v = 1; v < NV; ++v) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(wq + 8 * v), relu(f[v]), s0);
        scores[j] = add ? scores[j] + hsum(s0) : hsum(s0);
    }
}

template <uint32_t R>
void convert_rows_t(const void *const *rows, int64_t n_rows, int64_t d, float *out) {
    for (int64_t j = 0; j < n_rows; ++j, out += d) {
        int64_t i = 0;
        for (; i + 8 <= d; i += 8) _mm256_storeu_ps(out + i, load8<R>(rows[j], i));
        for (; i < d; ++i) out[i] = load1<R>(rows[j], i);
    }
}

// Decode quantises every key it scores (one query per key tile), so this is a sizeable share of fast mode:
// one widening per element, and four vectors narrowed to bytes per store.
template <uint32_t R>
void quantize_keys_t(const void *const *rows, int64_t n_rows, int64_t d, int64_t dp, int8_t *out, float *kscale,
                     int32_t *ksum) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256i byte_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes packs' lane interleave
    alignas(32) float buf[kQuantBuf];
    const bool buffered = d <= kQuantBuf;
    const int64_t d8 = d / 8 * 8;
    for (int64_t j = 0; j < n_rows; ++j, out += dp) {
        const void *row = rows[j];
        // Pass 1: max |x| (inf shows there) and whether any element is NaN (unordered with itself).
        __m256 amax8 = _mm256_setzero_ps(), bad8 = _mm256_setzero_ps();
        for (int64_t i = 0; i < d8; i += 8) {
            const __m256 x = load8<R>(row, i);
            if (buffered) _mm256_store_ps(buf + i, x);
            const __m256 a = _mm256_andnot_ps(sign_bit, x);
            amax8 = _mm256_max_ps(amax8, a);
            bad8 = _mm256_or_ps(bad8, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));  // NaN
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float amax = _mm_cvtss_f32(m);
        bool finite = _mm256_movemask_ps(bad8) == 0 && amax < __builtin_inff();
        for (int64_t t = d8; t < d; ++t) {
            const float v = load1<R>(row, t);
            const float a = v < 0.0f ? -v : v;
            finite = finite && a < __builtin_inff();  // false for inf and NaN
            amax = a > amax ? a : amax;
        }
        ksum[j] = 0;
        if (!finite || amax == 0.0f) {
            std::memset(out, 0, static_cast<size_t>(dp));
            kscale[j] = finite ? 0.0f : __builtin_nanf("");
            continue;
        }
        kscale[j] = amax / kKeyQuantMax;
        const float inv = kKeyQuantMax / amax;
        // Pass 2: round to nearest even (the default MXCSR mode), narrow to int8 (|x * inv| <= 127, so the
        // saturating packs never clip), and sum the bytes (maddubs by ones, then madd by ones: exact).
        const __m256 invv = _mm256_set1_ps(inv);
        auto quant8 = [&](int64_t i) {
            const __m256 x = buffered ? _mm256_load_ps(buf + i) : load8<R>(row, i);
            return _mm256_cvtps_epi32(_mm256_mul_ps(x, invv));
        };
        __m256i sum8 = _mm256_setzero_si256();
        int64_t i = 0;
        for (; i + 32 <= d; i += 32) {
            const __m256i ab = _mm256_packs_epi32(quant8(i), quant8(i + 8));
            const __m256i cd = _mm256_packs_epi32(quant8(i + 16), quant8(i + 24));
            const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), byte_order);
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), bytes);
            sum8 = _mm256_add_epi32(sum8, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bytes), ones16));
        }
        for (; i + 8 <= d; i += 8) {
            const __m256i q = quant8(i);
            sum8 = _mm256_add_epi32(sum8, q);
            const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i *>(out + i), _mm_packs_epi16(q16, q16));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum8), _mm256_extracti128_si256(sum8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        int32_t sum = _mm_cvtsi128_si32(s4);
        for (; i < d; ++i) {
            int32_t r = _mm_cvtss_si32(_mm_set_ss(load1<R>(row, i) * inv));
            r = r > kKeyQuantMax ? kKeyQuantMax : (r < -kKeyQuantMax ? -kKeyQuantMax : r);
            out[i] = static_cast<int8_t>(r);
            sum += r;
        }
        for (; i < dp; ++i) out[i] = 0;
        ksum[j] = sum;
    }
}

template <bool Dpbusd>
void score_i8_t(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys, const int32_t *ksum,
                const float *kscale, int64_t n_keys, float *scores, int32_t q_offset) {
    for (int64_t h0 = 0; h0 < hp; h0 += 8 * kMaxVec) {
        const int64_t nv = (hp - h0) / 8 < kMaxVec ? (hp - h0) / 8 : kMaxVec;
        const bool add = h0 > 0;
        const uint8_t *q = qT4 + 4 * h0;
        switch (nv) {
            case 1:
                score_pass_i8<1, Dpbusd>(q, wq + h0, hp, dp, keys, ksum, kscale, n_keys, scores, add, q_offset);
                break;
            case 2:
                score_pass_i8<2, Dpbusd>(q, wq + h0, hp, dp, keys, ksum, kscale, n_keys, scores, add, q_offset);
                break;
            case 3:
                score_pass_i8<3, Dpbusd>(q, wq + h0, hp, dp, keys, ksum, kscale, n_keys, scores, add, q_offset);
                break;
            default:
                score_pass_i8<4, Dpbusd>(q, wq + h0, hp, dp, keys, ksum, kscale, n_keys, scores, add, q_offset);
                break;
        }
    }
}

template <bool Dpbusd>
void score_q8_0_t(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys, int64_t n_keys,
                  float *scores, int32_t q_offset) {
    for (int64_t h0 = 0; h0 < hp; h0 += 8 * kMaxVec) {
        const int64_t nv = (hp - h0) / 8 < kMaxVec ? (hp - h0) / 8 : kMaxVec;
        const bool add = h0 > 0;
        const uint8_t *q = qT4 + 4 * h0;
        switch (nv) {
            case 1: score_pass_q8_0<1, Dpbusd>(q, wq + h0, hp, d, keys, n_keys, scores, add, q_offset); break;
            case 2: score_pass_q8_0<2, Dpbusd>(q, wq + h0, hp, d, keys, n_keys, scores, add, q_offset); break;
            case 3: score_pass_q8_0<3, Dpbusd>(q, wq + h0, hp, d, keys, n_keys, scores, add, q_offset); break;
            default: score_pass_q8_0<4, Dpbusd>(q, wq + h0, hp, d, keys, n_keys, scores, add, q_offset); break;
        }
    }
}

}  // namespace

void score_f32(uint32_t row_type, const float *qT, const float *w, int64_t hp, int64_t d, const void *const *keys,
               int64_t n_keys, float *scores) {
    switch (row_type) {
        case kRowF16: score_f32_t<kRowF16>(qT, w, hp, d, keys, n_keys, scores); return;
        case kRowBF16: score_f32_t<kRowBF16>(qT, w, hp, d, keys, n_keys, scores); return;
        default: score_f32_t<kRowF32>(qT, w, hp, d, keys, n_keys, scores); return;
    }
}

void score_i8(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys, const int32_t *ksum,
              const float *kscale, int64_t n_keys, float *scores, int32_t q_offset) {
    score_i8_t<false>(qT4, wq, hp, dp, keys, ksum, kscale, n_keys, scores, q_offset);
}

void score_q8_0(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys, int64_t n_keys,
                float *scores, int32_t q_offset) {
    score_q8_0_t<false>(qT4, wq, hp, d, keys, n_keys, scores, q_offset);
}

void score_i8_avxvnni(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys,
                      const int32_t *ksum, const float *kscale, int64_t n_keys, float *scores, int32_t q_offset) {
    score_i8_t<true>(qT4, wq, hp, dp, keys, ksum, kscale, n_keys, scores, q_offset);
}

void score_q8_0_avxvnni(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys,
                        int64_t n_keys, float *scores, int32_t q_offset) {
    score_q8_0_t<true>(qT4, wq, hp, d, keys, n_keys, scores, q_offset);
}

void convert_rows(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, float *out) {
    switch (row_type) {
        case kRowF16: convert_rows_t<kRowF16>(rows, n_rows, d, out); return;
        case kRowBF16: convert_rows_t<kRowBF16>(rows, n_rows, d, out); return;
        default: convert_rows_t<kRowF32>(rows, n_rows, d, out); return;
    }
}

void quantize_keys(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, int64_t dp, int8_t *out,
                   float *kscale, int32_t *ksum) {
    switch (row_type) {
        case kRowF16: quantize_keys_t<kRowF16>(rows, n_rows, d, dp, out, kscale, ksum); return;
        case kRowBF16: quantize_keys_t<kRowBF16>(rows, n_rows, d, dp, out, kscale, ksum); return;
        default: quantize_keys_t<kRowF32>(rows, n_rows, d, dp, out, kscale, ksum); return;
    }
}

}  // namespace sparrow::indexer::avx2
