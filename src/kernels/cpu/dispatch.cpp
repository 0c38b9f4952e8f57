#include "kernels/cpu/dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/isa_kernels.h"

namespace sparrow::cpu {

namespace {

// DotRowsFn for a level whose kernel sees one row at a time: the rows in turn through its DotTileFn F.
template <DotTileFn F>
void rows_by_tile(const void *w, size_t w_stride, int64_t n_rows, const void *x, size_t x_stride, int n_x, int64_t n,
                  float *y, size_t y_stride) {
    float out[kMaxQuantTile];
    for (int64_t r = 0; r < n_rows; ++r) {
        F(static_cast<const uint8_t *>(w) + r * w_stride, x, x_stride, n_x, n, out);
        for (int j = 0; j < n_x; ++j) y[j * y_stride + r] = out[j];
    }
}

// The sum of a Q8_0 block's 32 quants: with SSE2 (every x86-64), psadbw adds the bytes flipped to unsigned
// (x + 128) eight at a time, and 32 * 128 comes off.
int32_t block_sum(const int8_t *qs) {
#if defined(__SSE2__)
    const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80)), zero = _mm_setzero_si128();
    const __m128i a = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i *>(qs)), flip);
    const __m128i b = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i *>(qs + 16)), flip);
    const __m128i s = _mm_add_epi64(_mm_sad_epu8(a, zero), _mm_sad_epu8(b, zero));
    return _mm_cvtsi128_si32(s) + _mm_cvtsi128_si32(_mm_unpackhi_epi64(s, s)) - 32 * 128;
#else
    int32_t sum = 0;
    for (int i = 0; i < QK8_0; ++i) sum += qs[i];
    return sum;
#endif
}

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
    .dot_q4_1 = scalar::dot_tile_q4_1,
    .dot_q5_0 = scalar::dot_tile_q5_0,
    .dot_q5_1 = scalar::dot_tile_q5_1,
    .dot_iq4_nl = scalar::dot_tile_iq4_nl,
    .dot_mxfp4 = scalar::dot_tile_mxfp4,
    .dot_q2_k = scalar::dot_tile_q2_k,
    .dot_q3_k = scalar::dot_tile_q3_k,
    .dot_q4_k = scalar::dot_tile_q4_k,
    .dot_q5_k = scalar::dot_tile_q5_k,
    .dot_q6_k = scalar::dot_tile_q6_k,
    .dot_iq4_xs = scalar::dot_tile_iq4_xs,
    .dot_rows_q8_0 = rows_by_tile<scalar::dot_tile_q8_0>,
    .dot_rows_q8_0x8 = scalar::dot_rows_q8_0x8,
    .dot_rows_q4_0x8 = scalar::dot_rows_q4_0x8,
    .dot_rows_mxfp4x8 = scalar::dot_rows_mxfp4x8,
    .dot_rows_q2_kx8 = scalar::dot_rows_q2_kx8,
    .dot_rows_q3_kx8 = scalar::dot_rows_q3_kx8,
    .dot_rows_q4_kx8 = scalar::dot_rows_q4_kx8,
    .dot_rows_q5_kx8 = scalar::dot_rows_q5_kx8,
    .dot_rows_q6_kx8 = scalar::dot_rows_q6_kx8,
    .dot_rows_iq4_xsx8 = scalar::dot_rows_iq4_xsx8,
    .axpy_f32 = scalar::axpy_f32,
    .axpy_f16 = scalar::axpy_f16,
    .axpy_bf16 = scalar::axpy_bf16,
    .quantize_row_q8_0 = scalar::quantize_row_q8_0,
    .to_f32_f16 = scalar::to_f32_f16,
    .to_f32_bf16 = scalar::to_f32_bf16,
    .to_f32_q8_0 = scalar::to_f32_q8_0,
    .to_f32_q4_0 = scalar::to_f32_q4_0,
    .from_f32_f16 = scalar::from_f32_f16,
    .swiglu = scalar::swiglu,
    .rms_norm_row = scalar::rms_norm_row,
    .hadamard_row = scalar::hadamard_row,
};
constexpr KernelTable kAvx2Table = {
    .isa = Isa::avx2,
    .name = "avx2",
    .dot_f32 = avx2::dot_tile_f32,
    .dot_f16 = avx2::dot_tile_f16,
    .dot_bf16 = avx2::dot_tile_bf16,
    .dot_q8_0 = avx2::dot_tile_q8_0,
    .dot_q4_0 = avx2::dot_tile_q4_0,
    .dot_q4_1 = avx2::dot_tile_q4_1,
    .dot_q5_0 = avx2::dot_tile_q5_0,
    .dot_q5_1 = avx2::dot_tile_q5_1,
    .dot_iq4_nl = avx2::dot_tile_iq4_nl,
    .dot_mxfp4 = avx2::dot_tile_mxfp4,
    .dot_q2_k = avx2::dot_tile_q2_k,
    .dot_q3_k = avx2::dot_tile_q3_k,
    .dot_q4_k = avx2::dot_tile_q4_k,
    .dot_q5_k = avx2::dot_tile_q5_k,
    .dot_q6_k = avx2::dot_tile_q6_k,
    .dot_iq4_xs = avx2::dot_tile_iq4_xs,
    .dot_rows_q8_0 = avx2::dot_rows_q8_0,
    .dot_rows_q8_0x8 = avx2::dot_rows_q8_0x8,
    .dot_rows_q4_0x8 = avx2::dot_rows_q4_0x8,
    .dot_rows_mxfp4x8 = avx2::dot_rows_mxfp4x8,
    .dot_rows_q2_kx8 = avx2::dot_rows_q2_kx8,
    .dot_rows_q3_kx8 = avx2::dot_rows_q3_kx8,
    .dot_rows_q4_kx8 = avx2::dot_rows_q4_kx8,
    .dot_rows_q5_kx8 = avx2::dot_rows_q5_kx8,
    .dot_rows_q6_kx8 = avx2::dot_rows_q6_kx8,
    .dot_rows_iq4_xsx8 = avx2::dot_rows_iq4_xsx8,
    .axpy_f32 = avx2::axpy_f32,
    .axpy_f16 = avx2::axpy_f16,
    .axpy_bf16 = avx2::axpy_bf16,
    .quantize_row_q8_0 = avx2::quantize_row_q8_0,
    .to_f32_f16 = avx2::to_f32_f16,
    .to_f32_bf16 = avx2::to_f32_bf16,
    .to_f32_q8_0 = avx2::to_f32_q8_0,
    .to_f32_q4_0 = avx2::to_f32_q4_0,
    .from_f32_f16 = avx2::from_f32_f16,
    .swiglu = avx2::swiglu,
    .rms_norm_row = avx2::rms_norm_row,
    .hadamard_row = avx2::hadamard_row,
};
constexpr KernelTable kAvx512Table = {
    .isa = Isa::avx512,
    .name = "avx512",
    .dot_f32 = avx512::dot_tile_f32,
    .dot_f16 = avx512::dot_tile_f16,
    .dot_bf16 = avx512::dot_tile_bf16,
    // The AVX2 Q8_0 kernels: the multi-row one (dot_rows_q8_0) shares each weight block's |w| and scales between
    // tokens and has no AVX-512 counterpart; measured on a Sapphire Rapids Xeon (8 threads, bench preset),
    // the AVX-512 per-row tile left depth-0 generation at 78-87 t/s against 100 with AVX2's. dot_q8_0 must
    // give the bits dot_rows_q8_0 gives per row (dispatch.h), so both come from AVX2.
    .dot_q8_0 = avx2::dot_tile_q8_0,
    // The AVX2 kernel: its records hold two blocks (one 256-bit register of nibbles), and a matvec streams
    // weights far slower than either width computes; one tested kernel beats an untested wider one.
    .dot_q4_0 = avx2::dot_tile_q4_0,
    // The K-quants and the other 32-element types: AVX2's (no wider kernels yet; README "K-quant weights" has
    // their speed).
    .dot_q4_1 = avx2::dot_tile_q4_1,
    .dot_q5_0 = avx2::dot_tile_q5_0,
    .dot_q5_1 = avx2::dot_tile_q5_1,
    .dot_iq4_nl = avx2::dot_tile_iq4_nl,
    .dot_mxfp4 = avx2::dot_tile_mxfp4,
    .dot_q2_k = avx2::dot_tile_q2_k,
    .dot_q3_k = avx2::dot_tile_q3_k,
    .dot_q4_k = avx2::dot_tile_q4_k,
    .dot_q5_k = avx2::dot_tile_q5_k,
    .dot_q6_k = avx2::dot_tile_q6_k,
    .dot_iq4_xs = avx2::dot_tile_iq4_xs,
    .dot_rows_q8_0 = avx2::dot_rows_q8_0,
    .dot_rows_q8_0x8 = avx2::dot_rows_q8_0x8,
    .dot_rows_q4_0x8 = avx2::dot_rows_q4_0x8,
    .dot_rows_mxfp4x8 = avx2::dot_rows_mxfp4x8,
    .dot_rows_q2_kx8 = avx2::dot_rows_q2_kx8,
    .dot_rows_q3_kx8 = avx2::dot_rows_q3_kx8,
    .dot_rows_q4_kx8 = avx2::dot_rows_q4_kx8,
    .dot_rows_q5_kx8 = avx2::dot_rows_q5_kx8,
    .dot_rows_q6_kx8 = avx2::dot_rows_q6_kx8,
    .dot_rows_iq4_xsx8 = avx2::dot_rows_iq4_xsx8,
    .axpy_f32 = avx512::axpy_f32,
    .axpy_f16 = avx512::axpy_f16,
    .axpy_bf16 = avx512::axpy_bf16,
    .quantize_row_q8_0 = avx512::quantize_row_q8_0,
    .quantize_q8_0_dot_x = avx512::quantize_q8_0_dot_x,
    .to_f32_f16 = avx2::to_f32_f16,  // AVX-512 machines run the AVX2 conversion: it is bound by memory
    .to_f32_bf16 = avx2::to_f32_bf16,
    .to_f32_q8_0 = avx512::to_f32_q8_0,
    .to_f32_q4_0 = avx512::to_f32_q4_0,
    .from_f32_f16 = avx2::from_f32_f16,  // bound by memory, as to_f32_f16
    .swiglu = avx512::swiglu,
    .rms_norm_row = avx2::rms_norm_row,  // 2048-wide rows: the AVX2 loop is already ~0.1 us
    .hadamard_row = avx512::hadamard_row,
};

// The AVX-512 level on a CPU with VNNI: the packed-row products multiply a group of four bytes of eight rows in
// one vpdpbusd (kernels_vnni.cpp), where AVX2 needs four instructions. Batched decoding and prefill are bound
// by these products; one token's matvec is bound by memory either way.
constexpr KernelTable with_vnni(KernelTable t) {
    t.dot_rows_q8_0x8 = avx512vnni::dot_rows_q8_0x8;
    t.dot_rows_q4_0x8 = avx512vnni::dot_rows_q4_0x8;
    t.dot_rows_mxfp4x8 = avx512vnni::dot_rows_mxfp4x8;
    t.dot_rows_q2_kx8 = avx512vnni::dot_rows_q2_kx8;
    t.dot_rows_q3_kx8 = avx512vnni::dot_rows_q3_kx8;
    t.dot_rows_q4_kx8 = avx512vnni::dot_rows_q4_kx8;
    t.dot_rows_q5_kx8 = avx512vnni::dot_rows_q5_kx8;
    t.dot_rows_q6_kx8 = avx512vnni::dot_rows_q6_kx8;
    t.dot_rows_iq4_xsx8 = avx512vnni::dot_rows_iq4_xsx8;
    t.q8_0x8_prefill_tile = 5;
    return t;
}
constexpr KernelTable kAvx512VnniTable = with_vnni(kAvx512Table);

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
        case DType::Q4_1: return dot_q4_1;
        case DType::Q5_0: return dot_q5_0;
        case DType::Q5_1: return dot_q5_1;
        case DType::IQ4_NL: return dot_iq4_nl;
        case DType::MXFP4: return dot_mxfp4;
        case DType::Q2_K: return dot_q2_k;
        case DType::Q3_K: return dot_q3_k;
        case DType::Q4_K: return dot_q4_k;
        case DType::Q5_K: return dot_q5_k;
        case DType::Q6_K: return dot_q6_k;
        case DType::IQ4_XS: return dot_iq4_xs;
        default: throw_error("no dot product kernel for weight type %s", std::string(dtype_name(t)).c_str());
    }
}

DotRowsFn KernelTable::dot_rows(DType t) const {
    dot(t);  // throws for unsupported types
    return t == DType::Q8_0 ? dot_rows_q8_0 : nullptr;
}

DotRowsFn KernelTable::dot_rows8(DType t) const {
    switch (t) {
        case DType::Q8_0: return dot_rows_q8_0x8;
        case DType::Q4_0: return dot_rows_q4_0x8;
        case DType::MXFP4: return dot_rows_mxfp4x8;
        case DType::Q2_K: return dot_rows_q2_kx8;
        case DType::Q3_K: return dot_rows_q3_kx8;
        case DType::Q4_K: return dot_rows_q4_kx8;
        case DType::Q5_K: return dot_rows_q5_kx8;
        case DType::Q6_K: return dot_rows_q6_kx8;
        case DType::IQ4_XS: return dot_rows_iq4_xsx8;
        default: throw_error("no packed-row kernel for weight type %s", std::string(dtype_name(t)).c_str());
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

int64_t q4_0_dot_x_row_bytes(int64_t n) {
    const int64_t n_pairs = (n / QK8_0 + 1) / 2;
    return n_pairs * static_cast<int64_t>(sizeof(BlockQ8_0x2));
}

int64_t q8_0_dot_x_row_bytes(int64_t n) {
    return (n / QK8_0) * static_cast<int64_t>(sizeof(BlockQ8_0) + sizeof(float) + sizeof(int32_t));
}

int64_t KernelTable::dot_x_row_bytes(DType t, int64_t n) {
    if (!dtype_is_quantized(t) || !dtype_is_supported(t)) {
        throw_error("no quantised activation type for weight type %s", std::string(dtype_name(t)).c_str());
    }
    if (t == DType::Q4_0) return q4_0_dot_x_row_bytes(n);
    if (dtype_dots_q8_k(t)) return n / QK_K * static_cast<int64_t>(sizeof(BlockQ8_K));
    return q8_0_dot_x_row_bytes(n);
}

void KernelTable::quantize_dot_x(DType t, const float *x, void *y, int64_t n) const {
    if (!dtype_is_quantized(t) || !dtype_is_supported(t)) {
        throw_error("no quantised activation type for weight type %s", std::string(dtype_name(t)).c_str());
    }
    if (n % QK8_0 != 0) throw_error("quantize_dot_x: n = %lld is not a multiple of %d", (long long)n, QK8_0);
    if (dtype_dots_q8_k(t)) {
        // core/kquants.h: one quantiser for the kernels and the references (it refuses n % 256 != 0).
        quantize_row(DType::Q8_K, x, y, n);
        return;
    }
    if (t != DType::Q4_0 && quantize_q8_0_dot_x) {
        quantize_q8_0_dot_x(x, y, n);
        return;
    }
    if (t != DType::Q4_0) {
        // The blocks, then their scales as f32 (exact: every f16 is an f32), then 128 x each block's sum. The
        // blocks are quantised up to 64 at a time on the stack (one call of the level's quantiser) and copied, as
        // y need not be aligned for BlockQ8_0. Per token per matmul, this is a tenth
        // or more of a 768-row expert's product: a call per block, and a plain loop for each sum, showed in prefill
        // profiles.
        const int64_t nb = n / QK8_0;
        auto *blocks = static_cast<uint8_t *>(y);
        uint8_t *scales = blocks + nb * static_cast<int64_t>(sizeof(BlockQ8_0));
        uint8_t *offsets = scales + nb * static_cast<int64_t>(sizeof(float));
        constexpr int64_t kChunk = 64;
        BlockQ8_0 q[kChunk];
        for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
            const int64_t nq = nb - b0 < kChunk ? nb - b0 : kChunk;
            quantize_row_q8_0(x + b0 * QK8_0, q, nq * QK8_0);
            std::memcpy(blocks + b0 * static_cast<int64_t>(sizeof(BlockQ8_0)), q,
                        static_cast<size_t>(nq) * sizeof(BlockQ8_0));
            for (int64_t i = 0; i < nq; ++i) {
                const float d = fp16_to_f32(q[i].d);
                std::memcpy(scales + (b0 + i) * static_cast<int64_t>(sizeof d), &d, sizeof d);
                const int32_t offset = 128 * block_sum(q[i].qs);
                std::memcpy(offsets + (b0 + i) * static_cast<int64_t>(sizeof offset), &offset, sizeof offset);
            }
        }
        return;
    }
    // Q4_0: the blocks quantised as Q8_0 up to 64 at a time (as above), each pair then placed in its record
    // (layout in core/blocks.h), built on the stack and copied (y need not be aligned).
    const int64_t nb = n / QK8_0;
    constexpr int kHalf = QK8_0 / 2;
    constexpr int64_t kChunk = 64;  // even: pairs never straddle two chunks
    BlockQ8_0 q[kChunk];
    float d[kChunk];
    int32_t sums[kChunk];
    // Where the level has the Q8_0 dot-x kernel, a chunk of a whole group of 16 blocks or more goes through it
    // (blocks, f32 scales and 128 x sums, the same bytes) and is read back from a Q8_0 dot-x row on the stack; else,
    // and for short rows (a head's 128 floats, where the copies cost more than the kernel saves), block by block.
    uint8_t row[kChunk * (sizeof(BlockQ8_0) + sizeof(float) + sizeof(int32_t))];
    for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
        const int64_t nq = nb - b0 < kChunk ? nb - b0 : kChunk;
        if (quantize_q8_0_dot_x && nq >= 16) {
            quantize_q8_0_dot_x(x + b0 * QK8_0, row, nq * QK8_0);
            std::memcpy(q, row, static_cast<size_t>(nq) * sizeof(BlockQ8_0));
            std::memcpy(d, row + nq * static_cast<int64_t>(sizeof(BlockQ8_0)), static_cast<size_t>(nq) * sizeof(float));
            std::memcpy(sums, row + nq * static_cast<int64_t>(sizeof(BlockQ8_0) + sizeof(float)),
                        static_cast<size_t>(nq) * sizeof(int32_t));
            for (int64_t i = 0; i < nq; ++i) sums[i] /= 128;
        } else {
            quantize_row_q8_0(x + b0 * QK8_0, q, nq * QK8_0);
            for (int64_t i = 0; i < nq; ++i) {
                d[i] = fp16_to_f32(q[i].d);
                sums[i] = block_sum(q[i].qs);
            }
        }
        for (int64_t i = 0; i < nq; i += 2) {
            const int n_here = i + 1 < nq ? 2 : 1;
            BlockQ8_0x2 r{};
            for (int h = 0; h < n_here; ++h) {
                const BlockQ8_0 &blk = q[i + h];
                std::memcpy(r.lo + h * kHalf, blk.qs, kHalf);
                std::memcpy(r.hi + h * kHalf, blk.qs + kHalf, kHalf);
                for (int l = 0; l < 4; ++l) r.sums[4 * h + l] = 2 * sums[i + h];
                r.d[h] = d[i + h];
            }
            std::memcpy(static_cast<uint8_t *>(y) + (b0 + i) / 2 * static_cast<int64_t>(sizeof r), &r, sizeof r);
        }
    }
}

bool cpu_supports(Isa isa) {
    // cpuid is cheap but not free; the answers never change, so ask once per level.
    static const bool supported[3] = {detect(Isa::scalar), detect(Isa::avx2), detect(Isa::avx512)};
    const int i = static_cast<int>(isa);
    return i >= 0 && i < 3 && supported[i];
}

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
    return cpu_supports(Isa::avx512) && __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

bool cpu_has_avx_vnni() {
#if defined(__x86_64__) || defined(__i386__)
    return cpu_supports(Isa::avx2) && __builtin_cpu_supports("avxvnni");
#else
    return false;
#endif
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
        case Isa::avx512: return cpu_has_avx512_vnni() ? &kAvx512VnniTable : &kAvx512Table;
    }
    return nullptr;
}

const KernelTable &kernels() {
    static const KernelTable *const active = kernels_for(resolve_isa(std::getenv("SPARROW_ISA")));
    return *active;
}

const char *active_isa_name() { return kernels().name; }

}  // namespace sparrow::cpu
