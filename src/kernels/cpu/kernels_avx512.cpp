// AVX-512 (F, BW, VL, DQ) kernels. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq (and AVX2, FMA,
// F16C; CMakeLists.txt) and called only after cpuid says the CPU has them (dispatch.cpp).
//
// ODR rule for this file: it includes only <immintrin.h>, <cstddef>, <cstdint>, <cstring>, core/blocks.h
// (plain data), isa_kernels.h (declarations only) and simd_exp_avx512.h (its exp in an anonymous namespace), and
// everything but the exported kernels sits in an anonymous namespace (templates included: internal linkage). A shared
// inline function compiled here could otherwise be the copy the linker keeps, and crash on a CPU without AVX-512.
//
// Tails use masked loads (lanes past the end are neither read nor faulted), so no scalar clean-up loops.
// Q8_0 and Q4_0 products use the AVX2 kernels (dispatch.cpp says why).

#include "kernels/cpu/avx512_intrinsics.h"  // <immintrin.h> without GCC 12's false warnings

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/blocks.h"
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/simd_exp_avx512.h"  // internal linkage: this file's own copy

namespace sparrow::cpu::avx512 {

namespace {

constexpr int kMaxTile = 4;  // = cpu::kMaxTile (dispatch.h is not included here: it pulls in inline code)
// Weight bytes requested ahead of the ones being read, as in kernels_avx2.cpp. On a 2-vCPU Xeon (medians of 5
// alternating runs, 1 GiB matrices) with this kernel: f32 24.1 -> 28.5 GB/s, f16 19.0 -> 24.5, bf16 16.9 -> 22.7.
constexpr int64_t kPrefetchBytes = 4096;

// Asks for the `bytes` bytes kPrefetchBytes past p, which the caller is about to read.
inline void prefetch_ahead(const void *p, size_t bytes) {
    const char *ahead = static_cast<const char *>(p) + kPrefetchBytes;
    for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
}

inline float fp16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

// Mask of the first `count` of 16 lanes (count in 0..16).
inline __mmask16 first_lanes(int64_t count) { return count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1u); }

// --- f32 / f16 / bf16 weights against f32 activations ------------------------------------------------------
enum class FloatKind { f32, f16, bf16 };

// 16 weights from element i widened to f32; lanes outside `mask` read nothing and come back zero.
template <FloatKind K>
inline __m512 load16(const void *w, int64_t i, __mmask16 mask) {
    if constexpr (K == FloatKind::f32) {
        return _mm512_maskz_loadu_ps(mask, static_cast<const float *>(w) + i);
    } else if constexpr (K == FloatKind::f16) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t *>(w) + i));
    } else {
        // bf16 is the top half of an f32: widen to 32 bits and shift into place.
        const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t *>(w) + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

template <FloatKind K>
inline __m512 load16(const void *w, int64_t i) {
    if constexpr (K == FloatKind::f32) {
        return _mm512_loadu_ps(static_cast<const float *>(w) + i);
    } else if constexpr (K == FloatKind::f16) {
        return _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(static_cast<const uint16_t *>(w) + i)));
    } else {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(static_cast<const uint16_t *>(w) + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

// NT tokens against one weight row, four vectors per step (32 registers hold the 16 accumulators of a
// full tile). The accumulation order is the same for every NT (element i always lands in the same lane of
// the same accumulator), so a token's result does not depend on which tile it shares or with how many
// others: batched and single-sequence runs agree bit for bit.
template <FloatKind K, int NT>
void dot_tile_float(const void *w, const void *x, size_t x_stride, int64_t n, float *out) {
    constexpr int U = 4;
    const float *xs[NT];
    for (int j = 0; j < NT; ++j)
        xs[j] = reinterpret_cast<const float *>(static_cast<const uint8_t *>(x) + j * x_stride);
    __m512 acc[NT][U];
    for (int j = 0; j < NT; ++j) {
        for (int u = 0; u < U; ++u) acc[j][u] = _mm512_setzero_ps();
    }
    constexpr size_t kElemBytes = K == FloatKind::f32 ? 4 : 2;
    int64_t i = 0;
    for (; i + 16 * U <= n; i += 16 * U) {
        prefetch_ahead(static_cast<const char *>(w) + i * kElemBytes, 16 * U * kElemBytes);
        for (int u = 0; u < U; ++u) {
            const __m512 wv = load16<K>(w, i + 16 * u);
            for (int j = 0; j < NT; ++j)
                acc[j][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xs[j] + i + 16 * u), acc[j][u]);
        }
    }
    for (; i < n; i += 16) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 wv = load16<K>(w, i, mask);
        for (int j = 0; j < NT; ++j) {
            acc[j][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mask, xs[j] + i), acc[j][0]);
        }
    }
    for (int j = 0; j < NT; ++j) {
        __m512 s = acc[j][0];
        for (int u = 1; u < U; ++u) s = _mm512_add_ps(s, acc[j][u]);
        out[j] = _mm512_reduce_add_ps(s);
    }
}

template <FloatKind K>
void dot_tile_float_any(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    switch (n_x) {
        case 1: dot_tile_float<K, 1>(w, x, x_stride, n, out); return;
        case 2: dot_tile_float<K, 2>(w, x, x_stride, n, out); return;
        case 3: dot_tile_float<K, 3>(w, x, x_stride, n, out); return;
        default: dot_tile_float<K, kMaxTile>(w, x, x_stride, n, out); return;
    }
}

// --- axpy --------------------------------------------------------------------------------------------------
template <FloatKind K>
void axpy(const void *row, float a, float *y, int64_t n) {
    const __m512 av = _mm512_set1_ps(a);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mask = first_lanes(n - i);
        const __m512 yv = _mm512_maskz_loadu_ps(mask, y + i);
        _mm512_mask_storeu_ps(y + i, mask, _mm512_fmadd_ps(av, load16<K>(row, i, mask), yv));
    }
}

}  // namespace

void dot_tile_f32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float_any<FloatKind::f32>(w, x, x_stride, n_x, n, out);
}
void dot_tile_f16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float_any<FloatKind::f16>(w, x, x_stride, n_x, n, out);
}
void dot_tile_bf16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out) {
    dot_tile_float_any<FloatKind::bf16>(w, x, x_stride, n_x, n, out);
}
void axpy_f32(const void *row, float a, float *y, int64_t n) { axpy<FloatKind::f32>(row, a, y, n); }
void axpy_f16(const void *row, float a, float *y, int64_t n) { axpy<FloatKind::f16>(row, a, y, n); }
void axpy_bf16(const void *row, float a, float *y, int64_t n) { axpy<FloatKind::bf16>(row, a, y, n); }

namespace {

// Non-finite values are rare in activations, so the quantisers below look for them once per group of blocks and
// only then take the slower steps that give the scalar quantiser's results (a NaN does not set a block's scale,
// and a NaN product quantises to 0). The look: block maxima of |x| taken on the bits (non-negative floats order as
// their bit patterns, and a NaN's bits exceed infinity's), compared with infinity's bits after the reduction.
inline __m512i abs_bits(__m512 v) { return _mm512_castps_si512(_mm512_abs_ps(v)); }
inline bool any_non_finite(__m512i max_abs_bits) {
    return _mm512_cmpge_epu32_mask(max_abs_bits, _mm512_set1_epi32(0x7F800000)) != 0;
}

// |v|, or 0 where v is NaN: vmaxps returns its second operand when either is NaN, so a block's maximum taken as
// max(|x1|, abs_or_zero(x0)) ignores NaNs, as the scalar quantiser's does.
inline __m512 abs_or_zero(__m512 v) { return _mm512_max_ps(_mm512_abs_ps(v), _mm512_setzero_ps()); }

// The quants of prod = x * id as int32: round half away from zero (std::round), which the SIMD rounding modes lack:
// truncate, then step one away from zero when the exact remainder prod - trunc(prod) reaches 0.5. With
// mask_nan, a NaN product (a NaN input, or an infinite one times id = 0) gives 0, as in the scalar quantiser
// (cvttps gives INT_MIN).
inline __m512i round_to_quant(__m512 prod, bool mask_nan) {
    const __m512 t = _mm512_roundscale_ps(prod, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 round_up =
        _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(prod, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(  // +-1 with the sign of prod
        _mm512_castps_si512(_mm512_set1_ps(1.0f)),
        _mm512_and_si512(_mm512_castps_si512(prod), _mm512_set1_epi32(int32_t(0x80000000u)))));
    const __mmask16 keep = mask_nan ? _mm512_cmp_ps_mask(prod, prod, _CMP_ORD_Q) : __mmask16(0xFFFF);
    return _mm512_maskz_cvttps_epi32(keep, _mm512_mask_add_ps(t, round_up, t, step));
}

}  // namespace

// Bit-identical to ggml's reference quantiser: d = amax / 127 (f32 division), id = 1 / d, q = round(x * id)
// (round_to_quant).
void quantize_row_q8_0(const float *x, BlockQ8_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK8_0; ++b, x += QK8_0) {
        const __m512 v[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
        const __m512i max_bits = _mm512_max_epu32(abs_bits(v[0]), abs_bits(v[1]));
        const bool non_finite = any_non_finite(max_bits);
        const uint32_t amax_bits = _mm512_reduce_max_epu32(max_bits);
        float amax;
        std::memcpy(&amax, &amax_bits, sizeof amax);
        if (non_finite) amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[1]), abs_or_zero(v[0])));
        const float d = amax / 127.0f;
        const float inv = d != 0.0f ? 1.0f / d : 0.0f;
        const float id = inv <= FLT_MAX ? inv : 0.0f;  // a d too small for 1 / d quantises to zeros, as in scalar
        y[b].d = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        const __m512 idv = _mm512_set1_ps(id);
        for (int k = 0; k < 2; ++k) {
            // Values are integers in [-127, 127]: vpmovdb's truncation to 8 bits is exact.
            _mm_storeu_si128(reinterpret_cast<__m128i *>(y[b].qs + 16 * k),
                             _mm512_cvtepi32_epi8(round_to_quant(_mm512_mul_ps(v[k], idv), non_finite)));
        }
    }
}

namespace {

// Lane b of the result = op over the 16 lanes of v[b]: sixteen horizontal reductions in 15 x 2 shuffles and 15
// ops, where one at a time takes 4 shuffles and 4 ops each and a chain of their latencies. Each level halves
// the vectors and the lanes each block's partial occupies: whole 256-bit halves, then 128-bit quarters, then
// pairs, then single lanes, leaving block 4j + k in lane 4k + j, which the last permute puts in order. op is
// given floats; integer ops reinterpret them (the shuffles only move bits).
template <typename Op>
inline __m512 reduce16(const __m512 *v, Op op) {
    __m512 halves[8], quarters[4], pairs[2];
    for (int i = 0; i < 8; ++i) {
        halves[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int i = 0; i < 4; ++i) {
        quarters[i] = op(_mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    for (int i = 0; i < 2; ++i) {
        pairs[i] = op(_mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    const __m512 mixed = op(_mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, mixed);
}

// Blocks [0, count) (count <= 16; 32 floats each at x) of a Q8_0 dot-x row: their BlockQ8_0s at blocks
// (unaligned), their scales as f32 at scales and 128 x their quants' sums at offsets; nothing past count is read or
// written. Per block the same arithmetic as quantize_row_q8_0 (d = amax / 127 and id = 1 / d, exact IEEE division
// either way; round half away from zero), so the same bits. Lanes past count reduce zeros.
void quantize_blocks(const float *x, int count, uint8_t *blocks, uint8_t *scales, uint8_t *offsets) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 acc[16];
    for (int b = 0; b < count; ++b) {
        acc[b] = _mm512_castsi512_ps(
            _mm512_max_epu32(abs_bits(_mm512_loadu_ps(x + 32 * b)), abs_bits(_mm512_loadu_ps(x + 32 * b + 16))));
    }
    for (int b = count; b < 16; ++b) acc[b] = _mm512_setzero_ps();
    __m512 amax = reduce16(acc, [](__m512 a, __m512 b) {
        return _mm512_castsi512_ps(_mm512_max_epu32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
    });
    const bool non_finite = any_non_finite(_mm512_castps_si512(amax));
    if (non_finite) {
        for (int b = 0; b < count; ++b) {
            acc[b] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * b + 16)),
                                   abs_or_zero(_mm512_loadu_ps(x + 32 * b)));
        }
        for (int b = count; b < 16; ++b) acc[b] = _mm512_setzero_ps();
        amax = reduce16(acc, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });
    }
    const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    // id = 1 / d where d != 0 and 1 / d is finite, else 0, as the scalar code decides it.
    const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ), one, d);
    const __m512 id = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(inv, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ), inv);
    const __m256i d16 = _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 lanes = first_lanes(count);
    _mm512_mask_storeu_ps(scales, lanes, _mm512_cvtph_ps(d16));
    alignas(64) float ids[16];
    alignas(32) uint16_t ds[16];
    _mm512_store_ps(ids, id);
    _mm256_store_si256(reinterpret_cast<__m256i *>(ds), d16);
    for (int b = 0; b < count; ++b) {
        uint8_t *block = blocks + b * static_cast<int64_t>(sizeof(BlockQ8_0));
        std::memcpy(block + offsetof(BlockQ8_0, d), &ds[b], sizeof ds[b]);
        const __m512 idv = _mm512_set1_ps(ids[b]);
        __m512i sum = _mm512_setzero_si512();
        for (int k = 0; k < 2; ++k) {
            const __m512i q = round_to_quant(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b + 16 * k), idv), non_finite);
            _mm_storeu_si128(reinterpret_cast<__m128i *>(block + offsetof(BlockQ8_0, qs) + 16 * k),
                             _mm512_cvtepi32_epi8(q));
            sum = _mm512_add_epi32(sum, q);
        }
        acc[b] = _mm512_castsi512_ps(sum);
    }
    for (int b = count; b < 16; ++b) acc[b] = _mm512_setzero_ps();
    const __m512 sums = reduce16(acc, [](__m512 a, __m512 b) {
        return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
    });
    _mm512_mask_storeu_epi32(offsets, lanes, _mm512_slli_epi32(_mm512_castps_si512(sums), 7));  // x 128
}

}  // namespace

void quantize_q8_0_dot_x(const float *x, void *y, int64_t n) {
    const int64_t nb = n / QK8_0;
    auto *blocks = static_cast<uint8_t *>(y);
    uint8_t *scales = blocks + nb * static_cast<int64_t>(sizeof(BlockQ8_0));
    uint8_t *offsets = scales + nb * static_cast<int64_t>(sizeof(float));
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int count = nb - b0 < 16 ? static_cast<int>(nb - b0) : 16;
        quantize_blocks(x + b0 * QK8_0, count, blocks + b0 * static_cast<int64_t>(sizeof(BlockQ8_0)),
                        scales + b0 * static_cast<int64_t>(sizeof(float)),
                        offsets + b0 * static_cast<int64_t>(sizeof(int32_t)));
    }
}

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);  // tails: masked lanes
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 e = simd::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u));
    }
}

// As avx2::hadamard_row, with spans 1 to 8 inside each 16-float vector (a mask picks the lanes that take
// partner - own: each block's second half); a row narrower than 16 is one masked vector and its spans below n.
void hadamard_row(float *x, int64_t n, float norm) {
    const __mmask16 m = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 p;
        if (n > 1) {
            p = _mm512_permute_ps(v, 0xB1);  // span 1
            v = _mm512_mask_sub_ps(_mm512_add_ps(v, p), 0xAAAA, p, v);
        }
        if (n > 2) {
            p = _mm512_permute_ps(v, 0x4E);  // span 2
            v = _mm512_mask_sub_ps(_mm512_add_ps(v, p), 0xCCCC, p, v);
        }
        if (n > 4) {
            p = _mm512_shuffle_f32x4(v, v, 0xB1);  // span 4: 128-bit lanes 0<->1, 2<->3
            v = _mm512_mask_sub_ps(_mm512_add_ps(v, p), 0xF0F0, p, v);
        }
        if (n > 8) {
            p = _mm512_shuffle_f32x4(v, v, 0x4E);  // span 8: the 256-bit halves swapped
            v = _mm512_mask_sub_ps(_mm512_add_ps(v, p), 0xFF00, p, v);
        }
        if (n <= 16) v = _mm512_mul_ps(v, _mm512_set1_ps(norm));  // the whole row: scaled here
        _mm512_mask_storeu_ps(x + i, m, v);
    }
    for (int64_t len = 16; len < n; len *= 2) {
        for (int64_t i = 0; i < n; i += 2 * len) {
            for (int64_t j = i; j < i + len; j += 16) {
                const __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + len);
                _mm512_storeu_ps(x + j, _mm512_add_ps(a, b));
                _mm512_storeu_ps(x + j + len, _mm512_sub_ps(a, b));
            }
        }
    }
    if (n <= 16) return;  // scaled above
    const __m512 s = _mm512_set1_ps(norm);
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), s));
}

}  // namespace sparrow::cpu::avx512
