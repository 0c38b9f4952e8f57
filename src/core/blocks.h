// Quantised block layouts, bit-compatible with GGUF/ggml. Plain data only: this header is included by the
// ISA-specific kernel files (*_avx2.cpp, *_avx512.cpp), which must not share inline functions with the rest
// of the program (the linker could keep an AVX copy and run it on a CPU without AVX).
#pragma once

#include <cstdint>

namespace sparrow {

constexpr int QK8_0 = 32;  // elements per Q8_0 block
constexpr int QK4_0 = 32;  // elements per Q4_0 block

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

}  // namespace sparrow
