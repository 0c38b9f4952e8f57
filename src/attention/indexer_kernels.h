// Inner loops of the lightning indexer (lightning_indexer.cpp drives them), once per instruction set:
// indexer_kernels_scalar.cpp and indexer_kernels_avx2.cpp. Declarations only, with plain types: the ISA
// files include this header, and the ODR rule of src/kernels/cpu/kernels_avx2.cpp applies to them (no
// inline functions, templates or std types shared with the rest of the program).
//
// Layouts (hp = heads padded to a multiple of 8; padded heads carry q = 0 and w = 0, so they add 0):
//   exact:  qT   [d, hp] f32           query heads transposed, so 8 heads are one vector
//           keys n_keys pointers to rows of d f32
//   fast:   qT2  [dp / 2, hp, 2] int16 q[h, 2g], q[h, 2g + 1] of head h at (g * hp + h) * 2: one dword per
//                                      head, 8 heads per vector, so one broadcast dword (two elements) of a
//                                      key meets 8 heads in one madd
//           keys [n_keys, dp] int16    keys quantised per row to [-kKeyQuantMax, kKeyQuantMax]
//           dp = d rounded up to a multiple of 2; the padding is 0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sparrow::indexer {

// Largest |k| after quantisation in fast mode: 12 bits. madd multiplies 16-bit values at the same speed
// whatever their range, so the only cost of more key bits is fewer for q (query_quant_max: 13 bits at
// dp 128); 12 + 13 bits keep selections within near-ties of exact mode.
constexpr int kKeyQuantMax = 2047;
// Largest |q| after quantisation in fast mode for rows of dp elements: the int32 sum of dp products of at
// most kKeyQuantMax * q_max must not overflow, and q stays within int16.
constexpr int query_quant_max(int64_t dp) {
    const int64_t bound = (int64_t(1) << 31) / (int64_t(kKeyQuantMax) * (dp > 0 ? dp : 1)) - 1;
    return bound > 16383 ? 16383 : (bound < 1 ? 1 : static_cast<int>(bound));
}

// Row types the key converters accept (RowStore's): values of DType.
constexpr uint32_t kRowF32 = 0;
constexpr uint32_t kRowF16 = 1;
constexpr uint32_t kRowBF16 = 30;

}  // namespace sparrow::indexer

// One set per ISA:
//   score_f32:     scores[j] = sum_h w[h] * relu(qT[:, h] . keys[j])        j < n_keys (exact mode)
//   score_i16:     scores[j] = kscale[j] * sum_h wq[h] * relu(qT2[:, h] . keys[j])  (fast mode; the dot in int32)
//   convert_rows:  out[j, :] = rows[j] (row_type) widened to f32, j < n_rows
//   quantize_keys: out[j, :] = round(rows[j] / kscale[j]) with kscale[j] = max|rows[j]| / kKeyQuantMax
//                  (nearest even); a row with a non-finite element gets kscale NaN (its score is NaN) and zeros
// relu(NaN) is NaN: a NaN product is never turned into a 0 score.
#define SPARROW_INDEXER_KERNELS                                                                                      \
    void score_f32(const float *qT, const float *w, int64_t hp, int64_t d, const float *const *keys, int64_t n_keys, \
                   float *scores);                                                                                   \
    void score_i16(const int16_t *qT2, const float *wq, int64_t hp, int64_t dp, const int16_t *keys,                 \
                   const float *kscale, int64_t n_keys, float *scores);                                              \
    void convert_rows(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, float *out);            \
    void quantize_keys(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, int64_t dp,            \
                       int16_t *out, float *kscale);

namespace sparrow::indexer::scalar {
SPARROW_INDEXER_KERNELS
}  // namespace sparrow::indexer::scalar

namespace sparrow::indexer::avx2 {
SPARROW_INDEXER_KERNELS
}  // namespace sparrow::indexer::avx2

#undef SPARROW_INDEXER_KERNELS
