#include "kernels/cpu/dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu {

namespace {

// One table per level, built from each ISA file's exported functions. Constant data: nothing here changes
// after start-up, and a table is only handed out when cpu_supports() says its code can run.
constexpr KernelTable kScalarTable = {
    .isa = Isa::scalar,
    .name = "scalar",
    .dot_f32 = scalar::dot_tile_f32,
    .dot_f16 = scalar::dot_tile_f16,
    .dot_bf16 = scalar::dot_tile_bf16,
    .dot_q8_0 = scalar::dot_tile_q8_0,
    .dot_q4_0 = scalar::dot_tile_q4_0,
    .axpy_f32 = scalar::axpy_f32,
    .axpy_f16 = scalar::axpy_f16,
    .axpy_bf16 = scalar::axpy_bf16,
    .quantize_row_q8_0 = scalar::quantize_row_q8_0,
    .to_f32_f16 = scalar::to_f32_f16,
    .to_f32_bf16 = scalar::to_f32_bf16,
};
constexpr KernelTable kAvx2Table = {
    .isa = Isa::avx2,
    .name = "avx2",
    .dot_f32 = avx2::dot_tile_f32,
    .dot_f16 = avx2::dot_tile_f16,
    .dot_bf16 = avx2::dot_tile_bf16,
    .dot_q8_0 = avx2::dot_tile_q8_0,
    .dot_q4_0 = avx2::dot_tile_q4_0,
    .axpy_f32 = avx2::axpy_f32,
    .axpy_f16 = avx2::axpy_f16,
    .axpy_bf16 = avx2::axpy_bf16,
    .quantize_row_q8_0 = avx2::quantize_row_q8_0,
    .to_f32_f16 = avx2::to_f32_f16,
    .to_f32_bf16 = avx2::to_f32_bf16,
};
constexpr KernelTable kAvx512Table = {
    .isa = Isa::avx512,
    .name = "avx512",
    .dot_f32 = avx512::dot_tile_f32,
    .dot_f16 = avx512::dot_tile_f16,
    .dot_bf16 = avx512::dot_tile_bf16,
    .dot_q8_0 = avx512::dot_tile_q8_0,
    .dot_q4_0 = avx512::dot_tile_q4_0,
    .axpy_f32 = avx512::axpy_f32,
    .axpy_f16 = avx512::axpy_f16,
    .axpy_bf16 = avx512::axpy_bf16,
    .quantize_row_q8_0 = avx512::quantize_row_q8_0,
    .to_f32_f16 = avx2::to_f32_f16,  // AVX-512 machines run the AVX2 conversion: it is bound by memory
    .to_f32_bf16 = avx2::to_f32_bf16,
};

bool detect(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    // libgcc's cpuid check also asks the OS (XGETBV) whether it saves the AVX / AVX-512 register state.
    __builtin_cpu_init();
    switch (isa) {
        case Isa::scalar: return true;
        case Isa::avx2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
        case Isa::avx512:
            return detect(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    }
    return false;
#else
    return isa == Isa::scalar;
#endif
}

Isa best_isa() {
    if (detect(Isa::avx512)) return Isa::avx512;
    if (detect(Isa::avx2)) return Isa::avx2;
    return Isa::scalar;
}

}  // namespace

DotTileFn KernelTable::dot(DType t) const {
    switch (t) {
        case DType::F32: return dot_f32;
        case DType::F16: return dot_f16;
        case DType::BF16: return dot_bf16;
        case DType::Q8_0: return dot_q8_0;
        case DType::Q4_0: return dot_q4_0;
        default: throw_error("no dot product kernel for weight type %s", std::string(dtype_name(t)).c_str());
    }
}

AxpyFn KernelTable::axpy(DType t) const {
    switch (t) {
        case DType::F32: return axpy_f32;
        case DType::F16: return axpy_f16;
        case DType::BF16: return axpy_bf16;
        default: throw_error("no axpy kernel for row type %s", std::string(dtype_name(t)).c_str());
    }
}

int64_t q8_0_sums_row_bytes(int64_t n) {
    const int64_t nb = n / QK8_0;
    return nb * static_cast<int64_t>(sizeof(BlockQ8_0) + sizeof(float) + sizeof(int32_t));
}

int64_t KernelTable::dot_x_row_bytes(DType t, int64_t n) {
    switch (t) {
        case DType::Q8_0: return dtype_row_size(DType::Q8_0, n);
        case DType::Q4_0: return q8_0_sums_row_bytes(n);
        default: throw_error("no quantised activation type for weight type %s", std::string(dtype_name(t)).c_str());
    }
}

void KernelTable::quantize_dot_x(DType t, const float *x, void *y, int64_t n) const {
    if (t != DType::Q8_0 && t != DType::Q4_0) {
        throw_error("no quantised activation type for weight type %s", std::string(dtype_name(t)).c_str());
    }
    if (n % QK8_0 != 0) throw_error("quantize_dot_x: n = %lld is not a multiple of %d", (long long)n, QK8_0);
    auto *blocks = static_cast<BlockQ8_0 *>(y);
    quantize_row_q8_0(x, blocks, n);
    if (t == DType::Q8_0) return;
    // The scales and sums after the blocks (layout in dispatch.h). Once per token per matmul: plain code.
    const int64_t nb = n / QK8_0;
    uint8_t *scales = static_cast<uint8_t *>(y) + nb * static_cast<int64_t>(sizeof(BlockQ8_0));
    uint8_t *sums = scales + nb * static_cast<int64_t>(sizeof(float));
    for (int64_t b = 0; b < nb; ++b) {
        const float d = fp16_to_f32(blocks[b].d);
        int32_t s = 0;
        for (int k = 0; k < QK8_0; ++k) s += blocks[b].qs[k];
        std::memcpy(scales + b * static_cast<int64_t>(sizeof(float)), &d, sizeof d);
        std::memcpy(sums + b * static_cast<int64_t>(sizeof(int32_t)), &s, sizeof s);
    }
}

bool cpu_supports(Isa isa) {
    // cpuid is cheap but not free; the answers never change, so ask once per level.
    static const bool supported[3] = {detect(Isa::scalar), detect(Isa::avx2), detect(Isa::avx512)};
    const int i = static_cast<int>(isa);
    return i >= 0 && i < 3 && supported[i];
}

const char *isa_name(Isa isa) {
    switch (isa) {
        case Isa::scalar: return "scalar";
        case Isa::avx2: return "avx2";
        case Isa::avx512: return "avx512";
    }
    return "unknown";
}

Isa resolve_isa(const char *requested) {
    const Isa best = best_isa();
    if (!requested || !*requested) return best;
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
        if (std::strcmp(requested, isa_name(isa)) != 0) continue;
        if (!cpu_supports(isa)) {
            std::fprintf(stderr, "sparrow: SPARROW_ISA=%s but this CPU lacks it; using %s\n", requested,
                         isa_name(best));
            return best;
        }
        return isa;
    }
    std::fprintf(stderr, "sparrow: unknown SPARROW_ISA=%s (expected scalar, avx2 or avx512); using %s\n", requested,
                 isa_name(best));
    return best;
}

const KernelTable *kernels_for(Isa isa) {
    if (!cpu_supports(isa)) return nullptr;
    switch (isa) {
        case Isa::scalar: return &kScalarTable;
        case Isa::avx2: return &kAvx2Table;
        case Isa::avx512: return &kAvx512Table;
    }
    return nullptr;
}

const KernelTable &kernels() {
    static const KernelTable *const active = kernels_for(resolve_isa(std::getenv("SPARROW_ISA")));
    return *active;
}

const char *active_isa_name() { return kernels().name; }

}  // namespace sparrow::cpu
