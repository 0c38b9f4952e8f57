// Declarations of the kernels each ISA file exports (kernels_scalar.cpp, kernels_avx2.cpp,
// kernels_avx512.cpp). Declarations only, on purpose: the ISA files include this header so the compiler
// checks their definitions against what the dispatcher calls, and a header without inline functions,
// templates or std types keeps the ODR rule of those files (blocks.h explains it). Only dispatch.cpp
// calls these; everything else goes through the table in dispatch.h.
//
// The three families have one signature each (see dispatch.h for the full contract):
//   dot_tile_<w>:  out[j] = w . x_j for j < n_x (1..4); w one weight row of n elements, x_j = x + j*x_stride
//                  bytes, rows of the weight type's dot type (f32 for f32/f16/bf16, Q8_0 for q8_0,
//                  BlockQ8_0x2 records for q4_0: dispatch.h)
//   dot_rows_q8_0: (AVX2 only; the AVX-512 table takes it too) y[j*y_stride + r] = w_r . x_j for n_rows rows
//                  w_stride bytes apart, the same bits as dot_tile_q8_0 per row; the scalar level gets
//                  dispatch.cpp's row loop over its dot_tile
//   dot_rows_q8_0x8, dot_rows_q4_0x8, dot_rows_q2_kx8 ... q6_kx8, dot_rows_mxfp4x8: as dot_rows_q8_0 for rows packed
//                  eight to a record (BlockQ8_0x8 and BlockMXFP4x8 against Q8_0 activations, BlockQ4_0x8 against
//                  BlockQ8_0x2 records, the K-quant records against Q8_K rows; the scalar MXFP4 one is in
//                  quants32_scalar.cpp; n_rows % 8 == 0, w_stride the bytes of one unpacked row); every level
//                  gives the same bits (dispatch.h)
//   axpy_<t>:      y[0..n) += a * row[0..n)
//   quantize_row_q8_0: n floats (n % 32 == 0) to n/32 Q8_0 blocks, bit-exactly as ggml's reference
//   quantize_q8_0_dot_x: (AVX-512 only) n floats to the Q8_0 dot-x row (dispatch.h), blocks 16 at a time
//   to_f32_<t>:    y[0..n) = row[0..n) converted exactly (the AVX-512 table uses the AVX2 versions)
//   from_f32_f16:  row[0..n) = x[0..n) as fp16, rounded to nearest even (the AVX-512 table uses the AVX2 one)
//   swiglu:        out[i] = silu(gate[i]) * up[i] (dispatch.h: the vector levels' exp within a few ulp)
//   rms_norm_row:  y = x * (1 / sqrt(sum(x^2) / n + eps)) * w, the sum in double (the AVX-512 table uses AVX2's)
//   hadamard_row:  x[0..n) = H_n x * norm (n a power of two), the same bits on every level (dispatch.h); a row
//                  narrower than a vector runs in one padded (AVX2) or masked (AVX-512) vector
// The AVX-512 table also takes the AVX2 Q8_0 and Q4_0 dot kernels (dispatch.cpp says why), except the packed-row
// ones where the CPU has VNNI (kernels_vnni.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/blocks.h"

namespace sparrow::cpu::scalar {
void dot_tile_f32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_f16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_bf16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q8_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q4_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_rows_q8_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q4_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_mxfp4x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                      int64_t n, float *y, size_t y_stride);
void axpy_f32(const void *row, float a, float *y, int64_t n);
void axpy_f16(const void *row, float a, float *y, int64_t n);
void axpy_bf16(const void *row, float a, float *y, int64_t n);
void quantize_row_q8_0(const float *x, BlockQ8_0 *y, int64_t n);
void to_f32_f16(const void *row, float *y, int64_t n);
void to_f32_bf16(const void *row, float *y, int64_t n);
void from_f32_f16(const float *x, void *row, int64_t n);
void swiglu(const float *gate, const float *up, float *out, int64_t n);
void rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps);
void hadamard_row(float *x, int64_t n, float norm);
}  // namespace sparrow::cpu::scalar

namespace sparrow::cpu::avx2 {
void dot_tile_f32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_f16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_bf16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q8_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q4_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_rows_q8_0(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                   float *y, size_t y_stride);
void dot_rows_q8_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q4_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_mxfp4x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                      int64_t n, float *y, size_t y_stride);
void axpy_f32(const void *row, float a, float *y, int64_t n);
void axpy_f16(const void *row, float a, float *y, int64_t n);
void axpy_bf16(const void *row, float a, float *y, int64_t n);
void quantize_row_q8_0(const float *x, BlockQ8_0 *y, int64_t n);
void to_f32_f16(const void *row, float *y, int64_t n);
void to_f32_bf16(const void *row, float *y, int64_t n);
void from_f32_f16(const float *x, void *row, int64_t n);
void swiglu(const float *gate, const float *up, float *out, int64_t n);
void rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps);
void hadamard_row(float *x, int64_t n, float norm);
}  // namespace sparrow::cpu::avx2

namespace sparrow::cpu::avx512 {
void dot_tile_f32(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_f16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_bf16(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void axpy_f32(const void *row, float a, float *y, int64_t n);
void axpy_f16(const void *row, float a, float *y, int64_t n);
void axpy_bf16(const void *row, float a, float *y, int64_t n);
void quantize_row_q8_0(const float *x, BlockQ8_0 *y, int64_t n);
void quantize_q8_0_dot_x(const float *x, void *y, int64_t n);
void swiglu(const float *gate, const float *up, float *out, int64_t n);
void hadamard_row(float *x, int64_t n, float norm);
}  // namespace sparrow::cpu::avx512

// AVX512-VNNI (kernels_vnni.cpp): the packed-row Q8_0 and Q4_0 products, for the avx512 level when cpuid has
// VNNI; the same bits as every level.
namespace sparrow::cpu::avx512vnni {
void dot_rows_q8_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q4_0x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_mxfp4x8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                      int64_t n, float *y, size_t y_stride);
}  // namespace sparrow::cpu::avx512vnni

// K-quant and IQ4_XS rows packed eight to a record (BlockQ2_Kx8 ... BlockQ6_Kx8, BlockIQ4_XSx8) against Q8_K
// activations (kquant_<isa>.cpp, kquant_vnni.cpp): every level gives the scalar level's bits (dispatch.h).
namespace sparrow::cpu::scalar {
void dot_rows_q2_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q3_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q4_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q5_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q6_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_iq4_xsx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                       int64_t n, float *y, size_t y_stride);
}  // namespace sparrow::cpu::scalar
namespace sparrow::cpu::avx2 {
void dot_rows_q2_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q3_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q4_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q5_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q6_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_iq4_xsx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                       int64_t n, float *y, size_t y_stride);
}  // namespace sparrow::cpu::avx2
namespace sparrow::cpu::avx512vnni {
void dot_rows_q2_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q3_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q4_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q5_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_q6_kx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                     float *y, size_t y_stride);
void dot_rows_iq4_xsx8(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                       int64_t n, float *y, size_t y_stride);
}  // namespace sparrow::cpu::avx512vnni

// The staging of Q8_K activation rows for the packed K-quant kernels (kquant_scalar.cpp; plain C++, called from every
// level): super-blocks [k0, k0 + n) of n_tokens rows x_stride bytes apart, to out[k * n_tokens + j].
namespace sparrow::cpu {
void stage_q8_k(const uint8_t *x, size_t x_stride, int n_tokens, int64_t k0, int64_t n, Q8KStaged *out);
}  // namespace sparrow::cpu

// Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (quants32_<isa>.cpp) weights against Q8_0 dot-x activations, as dot_tile_q8_0's, and
// K-quant (Q2_K ... Q6_K) and IQ4_XS weights (kquant_<isa>.cpp) against Q8_K ones; the AVX-512 table takes the AVX2
// ones.
namespace sparrow::cpu::scalar {
void dot_tile_q4_1(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q5_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q5_1(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_iq4_nl(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_mxfp4(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q2_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q3_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q4_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q5_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q6_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_iq4_xs(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
}  // namespace sparrow::cpu::scalar
namespace sparrow::cpu::avx2 {
void dot_tile_q4_1(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q5_0(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q5_1(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_iq4_nl(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_mxfp4(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q2_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q3_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q4_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q5_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_q6_k(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
void dot_tile_iq4_xs(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
}  // namespace sparrow::cpu::avx2

// Quantised cache rows to f32 (cache_convert_<isa>.cpp): y[0..n) = the n elements (n % 32 == 0) of a row of
// Q8_0 / Q4_0 blocks, exactly as dequantize_row(DType::Q8_0 / Q4_0, ...) computes them.
namespace sparrow::cpu::scalar {
void to_f32_q8_0(const void *row, float *y, int64_t n);
void to_f32_q4_0(const void *row, float *y, int64_t n);
}  // namespace sparrow::cpu::scalar
namespace sparrow::cpu::avx2 {
void to_f32_q8_0(const void *row, float *y, int64_t n);
void to_f32_q4_0(const void *row, float *y, int64_t n);
}  // namespace sparrow::cpu::avx2
namespace sparrow::cpu::avx512 {
void to_f32_q8_0(const void *row, float *y, int64_t n);
void to_f32_q4_0(const void *row, float *y, int64_t n);
}  // namespace sparrow::cpu::avx512
