// Data types: GGUF/ggml type ids, their block geometry, scalar half-precision conversions and row
// quantisation. Every ggml type id is known (so `inspect` and the GGUF validator can size any tensor);
// `dtype_is_supported` says which ones the kernels compute with.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "core/blocks.h"

namespace sparrow {

// Values are ggml_type ids as stored in GGUF tensor infos.
enum class DType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
};

struct DTypeInfo {
    std::string_view name;  // ggml's lower-case name ("q8_0")
    int64_t block_size;     // elements per block (1 for plain types)
    int64_t type_size;      // bytes per block
};

// Geometry of a known type id, or nullopt for an id ggml does not define.
std::optional<DTypeInfo> dtype_info(uint32_t id);
const DTypeInfo &dtype_info(DType t);  // t must be a known id
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // case-insensitive
bool dtype_is_supported(DType t);  // F32, F16, BF16, the 32-element quants (MXFP4 among them), K-quants, IQ4_XS
bool dtype_is_k_quant(DType t);    // Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
bool dtype_dots_q8_k(DType t);     // weights multiplied with Q8_K activations: the K-quants and IQ4_XS
bool dtype_is_quantized(DType t);  // block size > 1
// Bytes of a row of n elements; n must be a multiple of the block size.
int64_t dtype_row_size(DType t, int64_t n);

// --- scalar half-precision conversions (IEEE binary16 and bfloat16, round to nearest even) -------------
inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float f32_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float fp16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // inf / nan
    if (exp == 0) {                                                           // zero or subnormal: man * 2^-24
        const float v = float(man) * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t f32_to_fp16(float f) {
    const uint32_t u = f32_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000;
    const uint32_t abs = u & 0x7fffffff;
    if (abs >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));  // inf / nan
    if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to a value above 65504: inf
    if (abs < 0x38800000u) {                                 // below the smallest normal half: subnormal or zero
        // Adding 0.5 (2^-1 scaled) aligns the mantissa so that the FPU's own rounding does round-to-even.
        const float magic = f32_from_bits(0x3f000000u);  // 0.5
        const float r = f32_from_bits(abs) + magic;
        return uint16_t(sign | (f32_bits(r) - 0x3f000000u));
    }
    const uint32_t mant_odd = (abs >> 13) & 1;
    const uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
    return uint16_t(sign | (rounded >> 13));
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000u) return uint16_t((u >> 16) | 64);  // quiet nan
    return uint16_t((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

// --- rows
// --------------------------------------------------------------------------------------------------- Convert
// n floats to a row of type t (F32, F16, BF16, Q8_0, Q4_0), exactly as ggml's reference quantisers do; n must
// be a multiple of the block size. K-quants and the other 32-blocks: valid blocks from the quantisers of core/kquants.h
// and core/quants32.h.
void quantize_row(DType t, const float *x, void *dst, int64_t n);
// The inverse: n elements of a row of type t (any supported type) to floats.
void dequantize_row(DType t, const void *src, float *y, int64_t n);

}  // namespace sparrow
