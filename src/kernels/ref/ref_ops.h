// Scalar reference versions of every op in kernels/ops.h, written for clarity and accumulating in double,
// plus the reference dot product of each weight type. Tests compare the optimised kernels (every ISA level)
// against these; nothing on the hot path calls them. Shape contracts are those of ops.h unless noted.
#pragma once

#include <cstdint>

#include "core/blocks.h"
#include "core/dtype.h"
#include "kernels/ops.h"

namespace sparrow::ref {

// --- dot products per weight type (n elements; n % 32 == 0 for the block types)
// -----------------------------
float dot_f32_f32(const float *w, const float *x, int64_t n);
float dot_f16_f32(const uint16_t *w, const float *x, int64_t n);
float dot_bf16_f32(const uint16_t *w, const float *x, int64_t n);
// sum over blocks of d_w * d_x * (integer dot of the 32 quantised values), as ggml's vec_dot_q8_0_q8_0.
float dot_q8_0_q8_0(const BlockQ8_0 *w, const BlockQ8_0 *x, int64_t n);
// The same with Q4_0 weights (values (nibble - 8)), as ggml's vec_dot_q4_0_q8_0.
float dot_q4_0_q8_0(const BlockQ4_0 *w, const BlockQ8_0 *x, int64_t n);
// Element e of a row of a K-quant or of Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4, in double, decoded element by element from
// the format (core/blocks.h), not through the dequantisers or kernels it checks.
double block_element(DType t, const void *row, int64_t e);
// A weight row of Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 against Q8_0 activations, and of a K-quant against Q8_K
// activations (an unaligned row of BlockQ8_K): sum of block_element * d_x * q_x in double, the exact product of the
// decoded weights and activations (the kernels' integer sums equal it up to f32 rounding).
float dot_decoded_q8_0(DType t, const void *w, const BlockQ8_0 *x, int64_t n);
float dot_decoded_q8_k(DType t, const void *w, const void *x, int64_t n);
// One weight row of type t against the activation row in t's dot type (f32; Q8_K for K-quants; else Q8_0).
float dot_weight_row(DType t, const void *w, const void *x, int64_t n);

// Activations to Q8_0, ggml's reference quantiser (d = amax/127, round half away from zero).
//   x: [n] f32, n % 32 == 0;  y: [n / 32] blocks
void quantize_row_q8_0(const float *x, BlockQ8_0 *y, int64_t n);

// --- the ops of ops.h
// ----------------------------------------------------------------------------------------- y[t, r] = w[r, :]
// . x[t, :]: one token and one row at a time, x quantised per token first for quantised weights (Q8_K for
// K-quants, else Q8_0; so the result is what ggml computes, not the exact real product).
void matmul(const WeightMatrix &w, const float *x, int64_t n_tokens, float *y);
void get_rows(const WeightMatrix &table, const int32_t *ids, int64_t n, float *out);
void rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
void layer_norm(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t n, float eps);
void rope(float *x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t *pos, const RopeParams &p);
void softmax(float *x, int64_t n, float scale = 1.0f);
void swiglu(const float *gate, const float *up, float *out, int64_t n);
// By the definition: y = H x / sqrt(n) with H[i][j] = (-1)^popcount(i & j) (Sylvester order), O(n^2).
void hadamard(float *x, int64_t n_rows, int64_t n);
// Sorts every index by (score descending, NaN last, index ascending) and keeps the first min(k, n).
int64_t top_k(const float *scores, int64_t n, int64_t k, int32_t *idx);
float dot_row(DType t, const void *row, const float *x, int64_t n);
void axpy_row(DType t, const void *row, float a, float *y, int64_t n);

// YaRN correction range [low, high] in pair indices, ggml's ggml_rope_yarn_corr_dims (computed in f32 as
// ggml does, so that floor/ceil land on the same integers in every implementation).
void rope_yarn_corr_dims(int n_rot, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow, float dims[2]);

}  // namespace sparrow::ref
