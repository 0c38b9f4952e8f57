// Inner loops of the lightning indexer (lightning_indexer.cpp drives them), once per instruction set:
// indexer_kernels_scalar.cpp and indexer_kernels_avx2.cpp. Declarations only, with plain types: the ISA
// files include this header, and the ODR rule of src/kernels/cpu/kernels_avx2.cpp applies to them (no
// inline functions, templates or std types shared with the rest of the program).
//
// Layouts (hp = heads padded to a multiple of 8; padded heads carry q = 0 and w = 0, so they add 0):
//   exact:  qT   [d, hp] f32           query heads transposed, so 8 heads are one vector
//           keys n_keys pointers to rows of d elements of the row type (f32, f16 or bf16)
//   fast:   qT4  [dp / 4, hp, 4] uint8 q[h, 4g .. 4g + 3] of head h at (g * hp + h) * 4, each stored as
//                                      q_int + q_offset with q_int in [1 - q_offset, q_offset - 1]: one
//                                      dword per head, 8 heads per vector, so one broadcast dword (four elements)
//                                      of a key meets 8 heads in one maddubs
//           keys [n_keys, dp] int8     keys quantised per row to [-kKeyQuantMax, kKeyQuantMax], with per row the
//                                      scale kscale and the sum ksum of its int8 values
//           dp = d rounded up to a multiple of 4; the padding is 0 in keys and q_offset (q 0) in qT4.
//   fast, Q8_0 keys: qT4 as above (d % 32 == 0, so dp = d), keys n_keys pointers to rows of d / 32 Q8_0 blocks
//                  (a Q8_0 indexer cache, read in place: its int8 values meet maddubs as stored, each block's
//                  int32 dot is scaled by the block's d, and nothing is re-quantised per use)
#pragma once

#include <cstddef>
#include <cstdint>

namespace sparrow::indexer {

// Fast mode multiplies bytes: unsigned query bytes by signed key bytes. Keys are int8 in [-kKeyQuantMax,
// kKeyQuantMax] with a scale per row; a query element is q_int + q_offset (unsigned) with q_int in
// [-(q_offset - 1), q_offset - 1] and a scale per head, and q . k = sum (q_int + q_offset) k - q_offset * ksum
// exactly, in int32. The query's width is the ISA's (each set's query_offset in lightning_indexer.cpp):
//   AVX2 (maddubs, which adds pairs of products into int16 with saturation): q_offset kQueryOffsetMaddubs = 32,
//     6-bit queries (+-31 steps). The largest pair sum is 63 * 127 * 2 = 16002, so two maddubs results (two groups
//     of four elements) add in int16 without saturating (32004 < 32767) before one madd widens them to int32:
//     three multiply-pipe instructions per 64 products instead of four.
//   VNNI (AVX-VNNI or AVX512-VNNI: vpdpbusd adds each group of four products into int32, no saturation) and scalar:
//   q_offset
//     kQueryOffsetDpbusd = 128, 8-bit queries (+-127 steps) at no extra cost. On the test models with outlier
//     channels (make-model --outlier-channels 4 --outlier-scale 20) 6-bit queries kept a mean Jaccard of only
//     0.78-0.83 with exact mode's selections, 8-bit ones 0.97-0.98 (the re-scoring margin cannot absorb
//     the coarser query when a few large channels set the scales).
// The kernels take q_offset as an argument; the AVX2 ones require q_offset <= kQueryOffsetMaddubs.
constexpr int kKeyQuantMax = 127;
constexpr int kQueryOffsetMaddubs = 32;
constexpr int kQueryOffsetDpbusd = 128;

// Row types the key converters accept (RowStore's): values of DType.
constexpr uint32_t kRowF32 = 0;
constexpr uint32_t kRowF16 = 1;
constexpr uint32_t kRowBF16 = 30;

}  // namespace sparrow::indexer

// One set per ISA:
//   score_f32:     scores[j] = sum_h w[h] * relu(qT[:, h] . keys[j])        j < n_keys (exact mode; keys widened
//                  to f32, products and sums in f32)
//   score_i8:      scores[j] = kscale[j] * sum_h wq[h] * relu((qT4[:, h] - q_offset) . keys[j])   (fast mode;
//                  the dot in int32 as qT4[:, h] . keys[j] - q_offset * ksum[j])
//   score_q8_0:    scores[j] = sum_h wq[h] * relu(sum_b d_jb * ((qT4[b, h] - q_offset) . keys[j][b]))  (fast mode
//                  over Q8_0 rows; each block's dot in int32 as qT4 . qs - q_offset * sum(qs))
//   convert_rows:  out[j, :] = rows[j] (row_type) widened to f32, j < n_rows
//   quantize_keys: out[j, :] = round(rows[j] / kscale[j]) with kscale[j] = max|rows[j]| / kKeyQuantMax
//                  (nearest even), ksum[j] = sum of out[j, :]; a row with a non-finite element gets kscale NaN
//                  (its score is NaN) and zeros
// relu(NaN) is NaN: a NaN product is never turned into a 0 score.
#define SPARROW_INDEXER_KERNELS                                                                                        \
    void score_f32(uint32_t row_type, const float *qT, const float *w, int64_t hp, int64_t d, const void *const *keys, \
                   int64_t n_keys, float *scores);                                                                     \
    void score_i8(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys,                     \
                  const int32_t *ksum, const float *kscale, int64_t n_keys, float *scores, int32_t q_offset);          \
    void score_q8_0(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys,               \
                    int64_t n_keys, float *scores, int32_t q_offset);                                                  \
    void convert_rows(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, float *out);              \
    void quantize_keys(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, int64_t dp, int8_t *out, \
                       float *kscale, int32_t *ksum);

namespace sparrow::indexer::scalar {
SPARROW_INDEXER_KERNELS
}  // namespace sparrow::indexer::scalar

namespace sparrow::indexer::avx2 {
SPARROW_INDEXER_KERNELS
}  // namespace sparrow::indexer::avx2
// AVX-512 (indexer_kernels_avx512.cpp): the exact score only, 16 heads per vector.
namespace sparrow::indexer::avx512 {
void score_f32(uint32_t row_type, const float *qT, const float *w, int64_t hp, int64_t d, const void *const *keys,
               int64_t n_keys, float *scores);
}  // namespace sparrow::indexer::avx512
// AVX-VNNI (indexer_kernels_avx2.cpp, the VEX vpdpbusd in inline asm): the two int8 scores, any q_offset up to
// kQueryOffsetDpbusd.
namespace sparrow::indexer::avx2 {
void score_i8_avxvnni(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys,
                      const int32_t *ksum, const float *kscale, int64_t n_keys, float *scores, int32_t q_offset);
void score_q8_0_avxvnni(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys,
                        int64_t n_keys, float *scores, int32_t q_offset);
}  // namespace sparrow::indexer::avx2
// AVX512-VNNI (indexer_kernels_vnni.cpp): the two int8 scores only; the rest is the AVX2 set's.
namespace sparrow::indexer::avx512vnni {
void score_i8(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys, const int32_t *ksum,
              const float *kscale, int64_t n_keys, float *scores, int32_t q_offset);
void score_q8_0(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys, int64_t n_keys,
                float *scores, int32_t q_offset);
}  // namespace sparrow::indexer::avx512vnni

#undef SPARROW_INDEXER_KERNELS
