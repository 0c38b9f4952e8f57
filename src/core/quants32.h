// Rows of the 32-element block types besides Q8_0 and Q4_0 (layouts in core/blocks.h): Q4_1, Q5_0, Q5_1 and
// IQ4_NL, and MXFP4. llama.cpp still writes them: as whole files of the older types, and as the fallback of a K-quant
// file for the matrices whose rows are not whole 256-element super-blocks. Dequantisation computes exactly
// what ggml's does; the quantisers follow ggml's reference ones for Q4_1, Q5_0 and Q5_1 (min/max and
// max-magnitude scales) and, for IQ4_NL, map the largest magnitude to the code book's end and take each
// element's nearest entry (ggml also searches the scale); for MXFP4, take the OCP shared exponent (the largest
// magnitude's power of two over 4, E2M1's largest power) or one above it, whichever leaves the smaller squared
// error, and each element's nearest value.
#pragma once

#include <cstdint>

#include "core/blocks.h"

namespace sparrow {

// One block as integers: element j is d * v[j], plus m for the types with one (Q4_1, Q5_1): v = u (Q4_1, Q5_1),
// u - 16 (Q5_0), the code book's value (IQ4_NL, MXFP4). The dequantisers compute float(v) * d (+ m), ggml's f32 order;
// the scalar kernels the integer sums of v x.
struct Block32Ints {
    int v[32];
    float d = 0.0f, m = 0.0f;
    bool has_m = false;
};
void decode_block32(const BlockQ4_1 &b, Block32Ints &w);
void decode_block32(const BlockQ5_0 &b, Block32Ints &w);
void decode_block32(const BlockQ5_1 &b, Block32Ints &w);
void decode_block32(const BlockIQ4_NL &b, Block32Ints &w);
void decode_block32(const BlockMXFP4 &b, Block32Ints &w);

// n floats (n % 32 == 0) to n / 32 blocks, and back.
void quantize_row_q4_1(const float *x, BlockQ4_1 *y, int64_t n);
void quantize_row_q5_0(const float *x, BlockQ5_0 *y, int64_t n);
void quantize_row_q5_1(const float *x, BlockQ5_1 *y, int64_t n);
void quantize_row_iq4_nl(const float *x, BlockIQ4_NL *y, int64_t n);
void quantize_row_mxfp4(const float *x, BlockMXFP4 *y, int64_t n);
void dequantize_row_q4_1(const BlockQ4_1 *x, float *y, int64_t n);
void dequantize_row_q5_0(const BlockQ5_0 *x, float *y, int64_t n);
void dequantize_row_q5_1(const BlockQ5_1 *x, float *y, int64_t n);
void dequantize_row_iq4_nl(const BlockIQ4_NL *x, float *y, int64_t n);
void dequantize_row_mxfp4(const BlockMXFP4 *x, float *y, int64_t n);

// An MXFP4 block's scale 2^(e - 128) (exact for every e).
float mxfp4_scale(uint8_t e);

}  // namespace sparrow
