// Runtime ISA dispatch for the CPU kernels. One binary runs everywhere: the hot inner loops exist once per
// instruction set (kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp) and a table of function
// pointers picks the best level the CPU has, once, at first use. SPARROW_ISA=scalar|avx2|avx512 in the
// environment forces a lower level (a higher one than the CPU has falls back to the best it has).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/blocks.h"
#include "core/dtype.h"

namespace sparrow::cpu {

enum class Isa : int {
    scalar = 0,  // portable C++ (what the compiler's baseline target gives)
    avx2 = 1,    // AVX2 + FMA + F16C
    avx512 = 2,  // AVX-512 F, BW, VL, DQ
};

// Tokens (activation rows) one dot_tile call handles against one weight row: the weight row is loaded
// once per tile, so prefill reads weights a quarter as often as a token-at-a-time loop.
constexpr int kMaxTile = 4;
// The same for Q8_0 weights: 8, so a step of parallel generation (8 sequences) is one tile and each weight block
// is loaded, unpacked and its scale converted once for all 8 tokens (the Q8_0 kernel keeps one accumulator per
// token, which fits the 16 AVX2 registers). Q4_0 stays at 4: its kernel holds two records' nibbles, scales and
// masks besides the accumulators, and measured slower at 8 tokens per tile than as two tiles of 4.
constexpr int kMaxQuantTile = 8;
// Largest n_x of the dot for weights of type t.
constexpr int max_tile(DType t) { return t == DType::Q8_0 ? kMaxQuantTile : kMaxTile; }

// The activation row Q4_0 weights dot with: ceil(n / 64) BlockQ8_0x2 records (core/blocks.h), the Q8_0
// quantisation of the row (bit-identical to quantize_row_q8_0) rearranged. Why: Q4_0 stores u = value + 8 in
// [0, 15], so a block's integer dot is sum_k u_k x_k - 8 sum_k x_k. With the sums computed once per token,
// the inner loop multiplies the unsigned nibbles directly (one maddubs per nibble half of two blocks) rather
// than re-centring nibbles and moving signs for every block of every weight row; and with the activations
// ordered as the nibbles come out of the weight bytes, two blocks share each unpack, multiply and scaling.
int64_t q4_0_dot_x_row_bytes(int64_t n);

// The activation row Q8_0 weights dot with: the n / 32 Q8_0 blocks of quantize_row_q8_0, followed by the same
// blocks' scales as f32 (n / 32 floats, unaligned), then 128 x the sum of each block's quants (n / 32 int32,
// unaligned). Why the scales: with several tokens per weight row, converting each token's f16 scale in the inner
// loop cost as much as a third of the multiply work; converted once per token per matmul, the inner loop
// broadcasts the f32 straight from memory. Why the sums: the 512-bit VNNI kernel (kernels_vnni.cpp) multiplies
// weights offset by 128 (unsigned) with the signed activations, and takes 128 x sum(x) off each block's dot.
int64_t q8_0_dot_x_row_bytes(int64_t n);

// out[j] = sum_i w[i] * x_j[i] for j < n_x, 1 <= n_x <= max_tile(weight type).
//   w: one weight row of n elements (n % 32 == 0 for Q8_0/Q4_0)
//   x: n_x rows of the weight type's dot type, x_j = (const uint8_t *)x + j * x_stride:
//      f32 for F32/F16/BF16 weights, Q8_0 blocks + f32 scales + sums for Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4
//      weights (above), BlockQ8_K blocks (core/blocks.h; unaligned) for the K-quants, BlockQ8_0x2 records for Q4_0
//      weights (above; rows 4-byte aligned). KernelTable::quantize_dot_x writes them.
//   out: [n_x] f32. Accumulates in f32; Q8_0/Q4_0 sums are integer within each 32-block, as ggml.
using DotTileFn = void (*)(const void *w, const void *x, size_t x_stride, int n_x, int64_t n, float *out);
// Several weight rows against a tile of tokens: y[j * y_stride + r] = w_r . x_j for r < n_rows, j < n_x
// (1 <= n_x <= max_tile(weight type)), w_r = (const uint8_t *)w + r * w_stride, x as DotTileFn. Every output has
// the bits the table's DotTileFn gives for that row and token alone, so a caller may use either (and split rows or
// tokens any way). Why: a kernel that sees several rows can keep a register block of rows x tokens, sharing
// each activation load and scale across rows and each weight block across tokens, with the per-call set-up
// paid once per row range rather than once per row.
using DotRowsFn = void (*)(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x,
                           int64_t n, float *y, size_t y_stride);
// y[0..n) += a * row[0..n), row of the table entry's type (F32, F16 or BF16); y must not alias row.
using AxpyFn = void (*)(const void *row, float a, float *y, int64_t n);
// n floats (n % 32 == 0) to n/32 Q8_0 blocks, bit-identical to ggml's reference quantiser
// (quantize_row(DType::Q8_0, ...) in core/dtype.h).
using QuantizeQ8Fn = void (*)(const float *x, BlockQ8_0 *y, int64_t n);
// n floats (n % 32 == 0) to the activation row Q8_0 weights dot with (q8_0_dot_x_row_bytes above: blocks, f32
// scales, 128 x sums; y unaligned), the blocks bit-identical to QuantizeQ8Fn's. Why a kernel of its own: every
// matmul of a decode step quantises each token's row on the calling thread while the others wait, and a block at a
// time (a horizontal max, two scalar divisions, then a scalar conversion and sum per block) took ~10 ns a block.
using QuantizeDotXFn = void (*)(const float *x, void *y, int64_t n);
using ToF32Fn = void (*)(const void *row, float *y, int64_t n);
// x[0..n) to fp16 in row, rounded to nearest even (overflow to inf, NaN stays NaN): every level the same bits
// for every non-NaN input.
using FromF32Fn = void (*)(const float *x, void *row, int64_t n);
// out[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (SwiGLU's gating; out may alias gate or up). The scalar level
// uses std::exp; the vector levels their polynomial exp (the attention softmax's), within a few ulp of it. Each
// element's result depends on its inputs alone, not on its position or n (tails run the vector code on padded or
// masked lanes), so a token's activations do not change with the batch around it.
using SwigluFn = void (*)(const float *gate, const float *up, float *out, int64_t n);
// One row of rms_norm (ops.h): y = x * scale * w (w may be null: 1), scale = 1 / sqrt(sum(x^2) / n + eps) with
// the sum in double. The levels differ only in the order of that sum (so scale may differ in its last bit); the
// product is x * scale, then * w, on every level. y may alias x.
using RmsNormRowFn = void (*)(const float *x, const float *w, float *y, int64_t n, float eps);
// One row of hadamard (ops.h): x[0..n) (n a power of two) replaced by H_n x * norm, H_n in Sylvester order, as
// butterflies of span 1, 2, 4, ... n/2 (x[j], x[j + span] -> x[j] + x[j + span], x[j] - x[j + span]) and then
// the product by norm. Each element's every step is one add, subtract or product, in the same order on every
// level: the same bits.
using HadamardRowFn = void (*)(float *x, int64_t n, float norm);

struct KernelTable {
    Isa isa = Isa::scalar;
    const char *name = "";
    DotTileFn dot_f32 = nullptr;
    DotTileFn dot_f16 = nullptr;
    DotTileFn dot_bf16 = nullptr;
    DotTileFn dot_q8_0 = nullptr;  // weights Q8_0, activations Q8_0
    DotTileFn dot_q4_0 = nullptr;  // weights Q4_0, activations BlockQ8_0x2
    DotTileFn dot_q4_1 =
        nullptr;  // weights Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: activations Q8_0 (as dot_q8_0's); Q2_K ... Q6_K: Q8_K
    DotTileFn dot_q5_0 = nullptr;
    DotTileFn dot_q5_1 = nullptr;
    DotTileFn dot_iq4_nl = nullptr;
    DotTileFn dot_mxfp4 = nullptr;
    DotTileFn dot_q2_k = nullptr;
    DotTileFn dot_q3_k = nullptr;
    DotTileFn dot_q4_k = nullptr;
    DotTileFn dot_q5_k = nullptr;
    DotTileFn dot_q6_k = nullptr;
    DotTileFn dot_iq4_xs = nullptr;  // weights IQ4_XS, activations Q8_K (as the K-quants')
    DotRowsFn dot_rows_q8_0 = nullptr;
    // Q8_0 rows packed eight to a record (core/blocks.h BlockQ8_0x8; WeightMatrix::rows8): w at a group's first
    // record, w_stride the bytes of one unpacked row, n_rows a multiple of 8. Unlike the kernels above, whose
    // f32 order is their level's own, every level gives the same bits: per row and token, acc = fma(float(the
    // block's integer dot), dw * dx, acc) over the blocks in turn, from 0 (ggml's order, with one rounding per
    // block).
    DotRowsFn dot_rows_q8_0x8 = nullptr;
    // The same for Q4_0 rows packed eight to a record (BlockQ4_0x8) against BlockQ8_0x2 activations: the block's
    // integer dot is sum((u - 8) * x), the same order and the same bits on every level.
    DotRowsFn dot_rows_q4_0x8 = nullptr;
    // MXFP4 rows packed eight to a record (BlockMXFP4x8) against Q8_0 activations: the block's integer dot is
    // sum(value * x), the same order and the same bits on every level.
    DotRowsFn dot_rows_mxfp4x8 = nullptr;
    // Q2_K rows packed eight to a record (BlockQ2_Kx8): as dot_rows_q4_kx8 below, over sub-blocks of 16.
    DotRowsFn dot_rows_q2_kx8 = nullptr;
    // Q3_K (BlockQ3_Kx8): isum = sum_s sc_s * (sum(u x)_s - 4 sum(x)_s), acc = fma(float(isum), d * dx, acc).
    DotRowsFn dot_rows_q3_kx8 = nullptr;
    // Q4_K rows packed eight to a record (BlockQ4_Kx8) against Q8_K activations, the same bits on every level: per
    // row, token and super-block, with isum = sum_s sc_s * sum(u x)_s and msum = sum_s m_s * sum(x)_s (integers),
    // acc = fma(-float(msum), dmin * dx, acc) then acc = fma(float(isum), d * dx, acc), from 0.
    DotRowsFn dot_rows_q4_kx8 = nullptr;
    DotRowsFn dot_rows_q5_kx8 = nullptr;  // the same for Q5_K (BlockQ5_Kx8)
    // Q6_K (BlockQ6_Kx8): isum = sum_s sc_s * (sum(u x)_s - 32 sum(x)_s), acc = fma(float(isum), d * dx, acc).
    DotRowsFn dot_rows_q6_kx8 = nullptr;
    // IQ4_XS (BlockIQ4_XSx8): isum = sum_s (ls_s - 32) * sum(v x)_s with v the code book's values,
    // acc = fma(float(isum), d * dx, acc).
    DotRowsFn dot_rows_iq4_xsx8 = nullptr;
    AxpyFn axpy_f32 = nullptr;
    AxpyFn axpy_f16 = nullptr;
    AxpyFn axpy_bf16 = nullptr;
    QuantizeQ8Fn quantize_row_q8_0 = nullptr;
    QuantizeDotXFn quantize_q8_0_dot_x = nullptr;  // null: quantize_dot_x builds the row from quantize_row_q8_0
    ToF32Fn to_f32_f16 = nullptr;
    ToF32Fn to_f32_bf16 = nullptr;
    ToF32Fn to_f32_q8_0 = nullptr;  // quantised cache rows (n % 32 == 0)
    ToF32Fn to_f32_q4_0 = nullptr;
    FromF32Fn from_f32_f16 = nullptr;
    SwigluFn swiglu = nullptr;
    RmsNormRowFn rms_norm_row = nullptr;
    HadamardRowFn hadamard_row = nullptr;

    // Tokens per call of dot_rows_q8_0x8 in a prefill's matmul (more than kMaxQuantTile tokens; any count gives the
    // same bits). The VNNI kernels take up to five tokens 32 rows at a time, where more leave no registers for the
    // second pair of rows: on an L2-resident matrix five tokens took 31 cycles per sixteen rows and block and eight
    // 57-60 (6.2 against 7.4 a token); bench pp512 ran 0.3-14% faster in eight alternating pairs. A decode step of up
    // to eight tokens stays one tile: split 5 + 3, `batched -np 8` ran 2-5% slower (its weights come from memory).
    int q8_0x8_prefill_tile = kMaxQuantTile;

    // Tokens per kernel call of a matmul of n_tokens over weights of type t, packed eight rows to a record or not.
    int tile(DType t, bool packed, int64_t n_tokens) const {
        if (!packed) return max_tile(t);
        return t == DType::Q8_0 && n_tokens > kMaxQuantTile ? q8_0x8_prefill_tile : kMaxQuantTile;
    }
    // The dot for weights of type t (a supported type), or throws sparrow::Error.
    DotTileFn dot(DType t) const;
    // The multi-row dot for weights of type t (a supported type), or nullptr where the level has none for t.
    DotRowsFn dot_rows(DType t) const;
    // The dot of rows of type t packed eight to a record (a type packs_rows8 takes), or throws sparrow::Error.
    DotRowsFn dot_rows8(DType t) const;
    // The axpy for cache rows of type t (F32, F16, BF16), or throws sparrow::Error.
    AxpyFn axpy(DType t) const;
    // Bytes of one activation row of n elements in the dot type of quantised weights of type t (Q4_0:
    // BlockQ8_0x2 records; K-quants: BlockQ8_K blocks; the other block types: the Q8_0 row), or throws
    // sparrow::Error otherwise.
    static int64_t dot_x_row_bytes(DType t, int64_t n);
    // x[0..n) (n % 32 == 0) quantised to the dot type of weights of type t (a supported block type), written to y
    // (dot_x_row_bytes(t, n) bytes), or throws sparrow::Error for other types.
    void quantize_dot_x(DType t, const float *x, void *y, int64_t n) const;
};

// Whether this CPU (and OS) can run the given level.
bool cpu_supports(Isa isa);
// Whether the CPU has AVX-512 (as Isa::avx512) with VNNI (vpdpbusd): the fast indexer's int8 scores use it at
// the avx512 level (lightning_indexer.cpp).
bool cpu_has_avx512_vnni();
// Whether the CPU has AVX2 (as Isa::avx2) with AVX-VNNI (the VEX vpdpbusd, 256 bits): the fast indexer's int8 scores
// use it at the avx2 level (lightning_indexer.cpp).
bool cpu_has_avx_vnni();
// "scalar", "avx2", "avx512".
const char *isa_name(Isa isa);

// The table of a given level, or nullptr when the CPU lacks it (tests run every level that exists).
const KernelTable *kernels_for(Isa isa);
// The level to run given a SPARROW_ISA value (null or empty: none set): the named level when the CPU has
// it, else the best one it has (a higher level cannot be forced; unknown names are ignored, with a warning
// on stderr).
Isa resolve_isa(const char *requested);
// The active table: the best level the CPU has, or the lower level SPARROW_ISA asks for. Chosen once.
const KernelTable &kernels();
// The active level's name, for printing.
const char *active_isa_name();

}  // namespace sparrow::cpu
