// K-quant rows (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; layouts in core/blocks.h): the formats most GGUF files users
// download are written in (Q4_K_M mixes Q4_K and Q6_K; Q2_K and Q3_K files, the ones that fit very large models
// into a workstation, mix Q2_K or Q3_K with the larger ones). Dequantisation computes exactly what ggml's does, in the
// same f32 operations. The quantisers are sparrow's own and simpler than ggml's (which searches each sub-block's scale
// and min to minimise a weighted error): each sub-block spans its own min..max, and the 6-bit (Q6_K: 8-bit)
// sub-block scales are rounded against the super-block's largest. They write valid blocks of the same format,
// for make-model and tests; the files users bring were quantised by llama.cpp.
#pragma once

#include <cstdint>

#include "core/blocks.h"

namespace sparrow {

// Sub-block s (0..7) of a Q4_K / Q5_K block's packed scales: its 6-bit scale and min.
void kquant_scale_min(const uint8_t *scales, int s, int &sc, int &m);
// The element of largest magnitude, with its sign (0 when all are 0; the first of equals), as ggml's
// quantisers pick it.
float signed_absmax(const float *x, int64_t n);
// One K-quant super-block as integers: element e is d * sc[s] * (u[e] - offset) - dmin * m[s], s = e / (256 /
// n_sub), computed in that f32 order by the dequantisers (ggml's) and as integer sums by the scalar kernels.
struct KQuantInts {
    int u[QK_K];
    int sc[16], m[16];
    int n_sub = 0, offset = 0;  // sub-blocks (8 or 16); what comes off every u (Q3_K: 4, Q6_K: 32)
    float d = 0.0f, dmin = 0.0f;
    bool has_mins = false;  // Q2_K, Q4_K, Q5_K (else m and dmin are 0, and the packed products skip their FMA)
};
void decode_kquant(const BlockQ2_K &b, KQuantInts &w);
void decode_kquant(const BlockQ3_K &b, KQuantInts &w);
void decode_kquant(const BlockQ4_K &b, KQuantInts &w);
void decode_kquant(const BlockQ5_K &b, KQuantInts &w);
void decode_kquant(const BlockQ6_K &b, KQuantInts &w);
// IQ4_XS as the same integers: u[e] the code book's value (signed), offset 0, sc[s] = ls - 32, no mins.
void decode_kquant(const BlockIQ4_XS &b, KQuantInts &w);

// Row r's super-block into lane r (0..7) of a record of K-quant (or IQ4_XS) rows packed eight to a record (BlockQ2_Kx8
// ... BlockQ6_Kx8, BlockIQ4_XSx8 in core/blocks.h), and back.
void pack_lane(const BlockQ2_K &blk, int r, BlockQ2_Kx8 &rec);
void pack_lane(const BlockQ3_K &blk, int r, BlockQ3_Kx8 &rec);
void pack_lane(const BlockQ4_K &blk, int r, BlockQ4_Kx8 &rec);
void pack_lane(const BlockQ5_K &blk, int r, BlockQ5_Kx8 &rec);
void pack_lane(const BlockQ6_K &blk, int r, BlockQ6_Kx8 &rec);
void pack_lane(const BlockIQ4_XS &blk, int r, BlockIQ4_XSx8 &rec);
void unpack_lane(const BlockQ2_Kx8 &rec, int r, BlockQ2_K &blk);
void unpack_lane(const BlockQ3_Kx8 &rec, int r, BlockQ3_K &blk);
void unpack_lane(const BlockQ4_Kx8 &rec, int r, BlockQ4_K &blk);
void unpack_lane(const BlockQ5_Kx8 &rec, int r, BlockQ5_K &blk);
void unpack_lane(const BlockQ6_Kx8 &rec, int r, BlockQ6_K &blk);
void unpack_lane(const BlockIQ4_XSx8 &rec, int r, BlockIQ4_XS &blk);

// The activations of K-quant products: n floats (n % 256 == 0) to n / 256 Q8_K blocks written to y byte by byte
// (y need not be aligned). Per block the value of largest magnitude maps to -127, as ggml's quantiser does, the
// others round to nearest even; bsums are the sums of each 16 quants. And back, from an unaligned row.
void quantize_row_q8_k(const float *x, void *y, int64_t n);
void dequantize_row_q8_k(const void *x, float *y, int64_t n);

// n floats (n % 256 == 0) to n / 256 blocks, and back (IQ4_XS, a code book over the K-quants' super-blocks, too).
void quantize_row_q2_k(const float *x, BlockQ2_K *y, int64_t n);
void quantize_row_q3_k(const float *x, BlockQ3_K *y, int64_t n);
void quantize_row_q4_k(const float *x, BlockQ4_K *y, int64_t n);
void quantize_row_q5_k(const float *x, BlockQ5_K *y, int64_t n);
void quantize_row_q6_k(const float *x, BlockQ6_K *y, int64_t n);
// IQ4_XS: each sub-block's scale maps its largest magnitude to the code book's end (-127), the 6-bit sub-block
// scales are rounded against the super-block's largest, and each element takes the nearest code book value.
void quantize_row_iq4_xs(const float *x, BlockIQ4_XS *y, int64_t n);
void dequantize_row_q2_k(const BlockQ2_K *x, float *y, int64_t n);
void dequantize_row_q3_k(const BlockQ3_K *x, float *y, int64_t n);
void dequantize_row_q4_k(const BlockQ4_K *x, float *y, int64_t n);
void dequantize_row_q5_k(const BlockQ5_K *x, float *y, int64_t n);
void dequantize_row_q6_k(const BlockQ6_K *x, float *y, int64_t n);
void dequantize_row_iq4_xs(const BlockIQ4_XS *x, float *y, int64_t n);

}  // namespace sparrow
