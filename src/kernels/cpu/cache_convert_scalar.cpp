// Portable Q8_0 / Q4_0 cache rows to f32 (the scalar level of the kernel table, and the reference the SIMD
// levels are tested against; dequantize_row in core/dtype is the same arithmetic).
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu::scalar {

void to_f32_q8_0(const void *row, float *y, int64_t n) {
    const auto *b = static_cast<const BlockQ8_0 *>(row);
    for (int64_t k = 0; k < n / QK8_0; ++k, y += QK8_0) {
        const float d = fp16_to_f32(b[k].d);
        for (int i = 0; i < QK8_0; ++i) y[i] = d * static_cast<float>(b[k].qs[i]);
    }
}

void to_f32_q4_0(const void *row, float *y, int64_t n) {
    const auto *b = static_cast<const BlockQ4_0 *>(row);
    for (int64_t k = 0; k < n / QK4_0; ++k, y += QK4_0) {
        const float d = fp16_to_f32(b[k].d);
        for (int i = 0; i < QK4_0 / 2; ++i) {
            y[i] = d * static_cast<float>((b[k].qs[i] & 15) - 8);
            y[i + QK4_0 / 2] = d * static_cast<float>((b[k].qs[i] >> 4) - 8);
        }
    }
}

}  // namespace sparrow::cpu::scalar
