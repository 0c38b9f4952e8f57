// Quantised block layouts, bit-compatible with GGUF/ggml. Plain data only: this header is included by the
// ISA-specific kernel files (*_avx2.cpp, *_avx512.cpp), which must not share inline functions with the rest
// of the program (the linker could keep an AVX copy and run it on a CPU without AVX).
#pragma once

#include <cstdint>

namespace sparrow {

constexpr int QK8_0 = 32;  // elements per Q8_0 block
constexpr int QK4_0 = 32;  // elements per Q4_0 block
constexpr int QK_K = 256;  // elements per K-quant super-block (and Q8_K block)

// Q8_0: x[i] = d * qs[i]; d = max|x| / 127 stored as IEEE half.
struct BlockQ8_0 {
    uint16_t d;        // fp16 scale
    int8_t qs[QK8_0];  // quantised values
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must match ggml");

// Q4_0: x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8); d = (signed max-magnitude) / -8.
struct BlockQ4_0 {
    uint16_t d;             // fp16 scale
    uint8_t qs[QK4_0 / 2];  // two 4-bit values per byte: low nibble = first half, high = second half
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must match ggml");

// The other 32-element block types llama.cpp writes: older whole-file types, and the fallbacks its quantiser
// uses for matrices whose rows a K-quant cannot hold (Q2_K/Q3_K -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1,
// Q6_K -> Q8_0; e.g. DeepSeek's attn_k_b, rows of 128). Byte j of qs holds element j in its low nibble and
// element j + 16 in its high one; the fifth bit of element j (Q5_*) is bit j of the 32-bit qh.
// Q4_1: x = d * u + m, u in [0, 15].
struct BlockQ4_1 {
    uint16_t d;  // fp16
    uint16_t m;  // fp16
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block must match ggml");
// Q5_0: x = d * (u - 16), u in [0, 31].
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block must match ggml");
// Q5_1: x = d * u + m, u in [0, 31].
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block must match ggml");
// IQ4_NL: x = d * kIq4nlValues[u], u in [0, 15]: a non-linear code book, denser near zero.
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[16];
};
static_assert(sizeof(BlockIQ4_NL) == 18, "IQ4_NL block must match ggml");
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// MXFP4 (OCP Microscaling FP4, ggml type 39): 32 FP4 E2M1 elements sharing one E8M0 exponent e. As ggml stores
// it, x = 2^(e - 128) * kMxfp4Values[u]: the table holds the E2M1 values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 become
// integers) and the scale is halved to match; u's top bit is the sign (u = 8 is -0). Byte j of qs holds element j
// in its low nibble and element j + 16 in its high one, as IQ4_NL. 2^(e - 128) is an f32 for every e (e = 0 and 1
// give the subnormals 2^-128 and 2^-127); llama.cpp's MXFP4_MOE files store the routed experts so.
struct BlockMXFP4 {
    uint8_t e;  // E8M0 shared exponent
    uint8_t qs[16];
};
static_assert(sizeof(BlockMXFP4) == 17, "MXFP4 block must match ggml");
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The activations K-quant weights are multiplied with (ggml's block_q8_K, GGUF id 15, never a weight here): 256
// values x = d * qs with one f32 scale, and the sums of each 16 (a sub-block's min or offset times its sum of x
// is then an integer madd). One scale per super-block, as ggml uses, so that every sub-block's scale can
// multiply integer dot products and the f32 scaling comes once per super-block.
struct BlockQ8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292, "Q8_K block must match ggml");

// Not a GGUF type: one token's Q8_K block as the packed K-quant kernels read it (kernels/cpu/kquant_*.cpp), staged
// once per call for every group of rows (cpu::stage_q8_k): the quants, the scale, and the int16 sums of x in the
// pairs the kernels' vpmaddwd take against the rows' sub-block numbers:
//   sums32_skip      32-element sums (s0, s2), (s1, s3), (s4, s6), (s5, s7): Q4_K / Q5_K mins, as bytes of a word pair
//   sums16_adjacent  the sixteen bsums as they lie, (b0, b1), (b2, b3), ...: Q2_K mins, Q6_K offsets
//   sums16_skip      (b0, b2), (b1, b3), (b4, b6), (b5, b7), ...: Q3_K offsets
struct alignas(64) Q8KStaged {
    int8_t qs[QK_K];
    float d;
    int32_t sums32_skip[4];
    int32_t sums16_adjacent[8];
    int32_t sums16_skip[8];
};

// Not a GGUF type: the activations Q4_0 weights are multiplied with (kernels/cpu/dispatch.h), two Q8_0 blocks
// per record, arranged for the kernels. A Q4_0 byte holds element k in its low nibble and k + 16 in its high
// nibble, and the nibbles u = value + 8 are unsigned, so:
//   lo / hi  the activations the low / high nibbles of both weight blocks meet, in the order the weight
//            bytes of the two blocks lie in one 256-bit register (block 0's 16 first, then block 1's)
//   sums     2 * sum(qs) of block 0 in lanes 0..3 and of block 1 in lanes 4..7: each block's dot ends in 4
//            int32 lanes, and subtracting 2 * sum from each removes the 8 * sum of the nibbles' offset
//   d        the two blocks' scales (Q8_0's fp16 d, widened)
// An odd last block is paired with an all-zero block (zero activations, sums and scale).
struct BlockQ8_0x2 {
    int8_t lo[QK8_0];
    int8_t hi[QK8_0];
    int32_t sums[8];
    float d[2];
};
static_assert(sizeof(BlockQ8_0x2) == 104, "BlockQ8_0x2 has no padding");

// Not a GGUF type: Q8_0 weight rows repacked at load, eight rows to a record (kernels/ops.h, pack_q8_0_rows8).
// Record b of a group of rows 8R..8R+7 holds block b of each of those rows:
//   qs  32 bytes per group of four elements: qs[32 * g + 4 * r + e] = row r's element 4 * g + e, so one
//       256-bit load holds four elements of all eight rows, and a token's four activation bytes, broadcast,
//       meet all of them in one maddubs: the integer dots end one per row in the eight int32 lanes, with no
//       horizontal sums, and the rows' scales multiply lane by lane
//   d   the eight rows' fp16 scales
// 272 bytes = the eight BlockQ8_0 it replaces: a packed matrix has the size of the file's, and the group of
// rows 8R.. starts where row 8R started.
struct BlockQ8_0x8 {
    int8_t qs[8 * QK8_0];
    uint16_t d[8];
};
static_assert(sizeof(BlockQ8_0x8) == 8 * sizeof(BlockQ8_0), "BlockQ8_0x8 is eight Q8_0 blocks");

// Not a GGUF type: Q4_0 weight rows repacked at load the same way (pack_rows8). qs[32 * g + 4 * r + e] = row r's
// byte 4 * g + e (g < 4): its low nibble is element 4 * g + e, its high nibble element 16 + 4 * g + e, both
// stored + 8. One load holds 8 elements of all eight rows; masking and shifting give the two nibble sets,
// which meet a token's broadcast activations unsigned (no sign moves: the + 8 comes off once per block
// through the activation sums of BlockQ8_0x2).
struct BlockQ4_0x8 {
    uint8_t qs[8 * QK4_0 / 2];
    uint16_t d[8];
};
static_assert(sizeof(BlockQ4_0x8) == 8 * sizeof(BlockQ4_0), "BlockQ4_0x8 is eight Q4_0 blocks");

// Not a GGUF type: MXFP4 rows repacked at load as Q4_0's (qs as BlockQ4_0x8's: byte 4 * g + e of row r at
// qs[32 * g + 4 * r + e], low nibble element 4 * g + e, high nibble 16 + 4 * g + e), then the eight rows' exponents.
// The nibbles are codes of kMxfp4Values: the kernels look them up (a byte shuffle) as value + 12, unsigned, and take
// 12 * sum(x) off each block's dot, from the activation sums Q8_0 dot-x rows carry.
struct BlockMXFP4x8 {
    uint8_t qs[8 * 16];
    uint8_t e[8];
};
static_assert(sizeof(BlockMXFP4x8) == 8 * sizeof(BlockMXFP4), "BlockMXFP4x8 is eight MXFP4 blocks");
inline constexpr uint8_t kMxfp4ValuesPlus12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

// --- K-quants: super-blocks of 256 elements (ggml's QK_K), read as llama.cpp's files store them ----------------

// Q2_K: sixteen sub-blocks of 16, x = d * (scales[s] & 15) * u - dmin * (scales[s] >> 4) with u in [0, 3] and
// s = e / 16; element e = 128h + 32g + l (l < 32) is bits 2g..2g+1 of qs[32h + l].
struct BlockQ2_K {
    uint8_t scales[QK_K / 16];  // low nibble: scale, high nibble: min
    uint8_t qs[QK_K / 4];
    uint16_t d;     // fp16 super-block scale of the scales
    uint16_t dmin;  // fp16 super-block scale of the mins
};
static_assert(sizeof(BlockQ2_K) == 84, "Q2_K block must match ggml");

// Not a GGUF type: Q2_K rows packed eight to a record (kernels/ops.h pack_rows8). Record b of rows 8R..8R+7 holds
// super-block b of each: the eight rows' fp16 d and dmin; scales[8 * s + r] = row r's scales[s] (scale and min of
// sub-block s, one byte per row); qs[32 * G + 4 * r + e] = row r's qs[4 * G + e] (G < 16), so with h = G / 8 and
// l = 4 * (G % 8) + e, bits 2g..2g+1 of the byte are element 128h + 32g + l, of sub-block 8h + 2g + l / 16.
// 672 bytes = the eight BlockQ2_K it replaces.
struct BlockQ2_Kx8 {
    uint16_t d[8];
    uint16_t dmin[8];
    uint8_t scales[8 * QK_K / 16];
    uint8_t qs[8 * QK_K / 4];
};
static_assert(sizeof(BlockQ2_Kx8) == 8 * sizeof(BlockQ2_K), "BlockQ2_Kx8 is eight Q2_K blocks");

// Q3_K: sixteen sub-blocks of 16, x = d * (sc_s - 32) * (u - 4) with u in [0, 7] and s = e / 16: u's low two bits
// lie as Q2_K's, its third bit is bit e / 32 of hmask[e % 32]. The 6-bit sc_s has its low nibble in scales[s]
// (s < 8) or in the high nibble of scales[s - 8], and its top two bits at bit 2 * (s / 4) of scales[8 + s % 4].
struct BlockQ3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110, "Q3_K block must match ggml");

// Not a GGUF type: Q3_K rows packed eight to a record (kernels/ops.h pack_rows8). Record b of rows 8R..8R+7 holds
// super-block b of each: the eight rows' fp16 d; their twelve scale bytes as three planes of words, as
// BlockQ4_Kx8's (scales[32 * p + 4 * r + i] = row r's scales[4 * p + i]); hmask[32 * G + 4 * r + e] = row r's
// hmask[4 * G + e] (G < 8); qs as BlockQ2_Kx8's. 880 bytes = the eight BlockQ3_K it replaces.
struct BlockQ3_Kx8 {
    uint16_t d[8];
    uint8_t scales[8 * 12];
    uint8_t hmask[8 * QK_K / 8];
    uint8_t qs[8 * QK_K / 4];
};
static_assert(sizeof(BlockQ3_Kx8) == 8 * sizeof(BlockQ3_K), "BlockQ3_Kx8 is eight Q3_K blocks");

// Q4_K: eight sub-blocks of 32, x = d * sc_s * u - dmin * m_s with u in [0, 15] and a 6-bit scale sc_s and min
// m_s per sub-block. scales[12] packs the sixteen 6-bit numbers: for s < 4, sc_s = scales[s] & 63 and
// m_s = scales[s + 4] & 63; for s >= 4, sc_s = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4 and
// m_s = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4. qs holds 64 elements per 32 bytes: byte l of chunk c
// (c < 4) has element 64c + l in its low nibble and 64c + 32 + l in its high nibble.
struct BlockQ4_K {
    uint16_t d;     // fp16 super-block scale of the scales
    uint16_t dmin;  // fp16 super-block scale of the mins
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block must match ggml");

// Not a GGUF type: Q4_K weight rows repacked at load eight to a record (kernels/ops.h pack_rows8), as Q4_0's.
// Record b of rows 8R..8R+7 holds super-block b of each of those rows:
//   d, dmin  the eight rows' fp16 super-block scales
//   scales   the rows' twelve packed scale bytes as three planes of words: scales[32 * p + 4 * r + i] = row r's
//            scales[4 * p + i], so one load gives word p of all eight rows in eight int32 lanes and the unpacking of
//            the 6-bit scales and mins (masks and shifts on words, BlockQ4_K above) runs on the eight rows at once
//   qs       qs[32 * g + 4 * r + e] = row r's qs[4 * g + e] (g < 32): for chunk c = g / 8 and l = 4 * (g % 8) + e,
//            the low nibble is element 64c + l (sub-block 2c) and the high nibble element 64c + 32 + l (2c + 1)
// 1152 bytes = the eight BlockQ4_K it replaces.
struct BlockQ4_Kx8 {
    uint16_t d[8];
    uint16_t dmin[8];
    uint8_t scales[8 * 12];
    uint8_t qs[8 * QK_K / 2];
};
static_assert(sizeof(BlockQ4_Kx8) == 8 * sizeof(BlockQ4_K), "BlockQ4_Kx8 is eight Q4_K blocks");

// Q5_K: Q4_K with a fifth bit per element, u in [0, 31]: bit 2c of qh[l] is the high bit of element 64c + l,
// bit 2c + 1 that of element 64c + 32 + l.
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block must match ggml");

// Not a GGUF type: Q5_K rows packed eight to a record, as BlockQ4_Kx8 with the fifth bits in groups of four bytes:
// qh[32 * g + 4 * r + e] = row r's qh[4 * g + e] (g < 8), the high bits of the elements whose low bits lie in the
// bytes of qs with the same l = 4 * g + e in every chunk. 1408 bytes = the eight BlockQ5_K it replaces.
struct BlockQ5_Kx8 {
    uint16_t d[8];
    uint16_t dmin[8];
    uint8_t scales[8 * 12];
    uint8_t qh[8 * QK_K / 8];
    uint8_t qs[8 * QK_K / 2];
};
static_assert(sizeof(BlockQ5_Kx8) == 8 * sizeof(BlockQ5_K), "BlockQ5_Kx8 is eight Q5_K blocks");

// Q6_K: sixteen sub-blocks of 16, x = d * scales[e / 16] * (u - 32) with u in [0, 63]. Per half h (128
// elements; ql + 64h, qh + 32h) and l < 32: element 128h + l is ql[l] low nibble | (qh[l] & 3) << 4,
// 128h + 32 + l is ql[l + 32] low | (qh[l] >> 2 & 3) << 4, 128h + 64 + l is ql[l] high | (qh[l] >> 4 & 3) << 4,
// 128h + 96 + l is ql[l + 32] high | (qh[l] >> 6) << 4.
struct BlockQ6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block must match ggml");

// IQ4_XS: IQ4_NL's code book in super-blocks of 256: eight sub-blocks of 32, x = d * (ls - 32) * kIq4nlValues[u]
// with u in [0, 15] and the sub-block's 6-bit scale ls in [0, 63]: ls of sub-block s is (scales_l[s / 2] >> 4 * (s % 2)
// & 15) | (scales_h >> 2s & 3) << 4. Sub-block s's nibbles are qs[16s .. 16s + 15] as in an IQ4_NL block: elements
// 32s + l in the low nibbles and 32s + 16 + l in the high ones (l < 16). Its products take Q8_K activations.
struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136, "IQ4_XS block must match ggml");

// Not a GGUF type: IQ4_XS rows packed eight to a record (kernels/ops.h pack_rows8). Record b of rows 8R..8R+7 holds
// super-block b of each:
//   d, scales_h  the eight rows' fp16 scales and scale high bits, side by side
//   scales_l     scales_l[4 * r + i] = row r's scales_l[i]: one word per row, so one load gives all eight
//   qs           qs[32 * g + 4 * r + e] = row r's qs[4 * g + e] (g < 32): sub-block s's groups are 4s .. 4s + 3, the
//                low nibbles of group 4s + i are elements 32s + 4i + e and the high ones 32s + 16 + 4i + e
// 1088 bytes = the eight BlockIQ4_XS it replaces.
struct BlockIQ4_XSx8 {
    uint16_t d[8];
    uint16_t scales_h[8];
    uint8_t scales_l[8 * QK_K / 64];
    uint8_t qs[8 * QK_K / 2];
};
static_assert(sizeof(BlockIQ4_XSx8) == 8 * sizeof(BlockIQ4_XS), "BlockIQ4_XSx8 is eight IQ4_XS blocks");

// Not a GGUF type: Q6_K rows packed eight to a record (kernels/ops.h pack_rows8). Record b of rows 8R..8R+7 holds
// super-block b of each:
//   d        the eight rows' fp16 scales
//   scales   scales[8 * s + r] = row r's scale of sub-block s: eight bytes per sub-block, one per row, and the
//            sixteen bytes of sub-blocks 2t and 2t + 1 interleave into the int16 pairs a madd multiplies
//   ql, qh   ql[32 * g + 4 * r + e] = row r's ql[4 * g + e] (g < 32), qh[32 * g + 4 * r + e] = row r's qh[4 * g + e]
//            (g < 16): with half h and i < 8, ql groups 16h + i and 16h + 8 + i and qh group 8h + i hold elements
//            128h + 32t + 4i + e (t < 4) as BlockQ6_K describes
// 1680 bytes = the eight BlockQ6_K it replaces.
struct BlockQ6_Kx8 {
    uint16_t d[8];
    int8_t scales[8 * QK_K / 16];
    uint8_t ql[8 * QK_K / 2];
    uint8_t qh[8 * QK_K / 4];
};
static_assert(sizeof(BlockQ6_Kx8) == 8 * sizeof(BlockQ6_K), "BlockQ6_Kx8 is eight Q6_K blocks");

}  // namespace sparrow
