#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "core/kquants.h"
#include "core/quants32.h"

namespace sparrow {

namespace {

struct DTypeEntry {
    uint32_t id;
    DTypeInfo info;
};

// Geometry of every ggml type id (block elements, block bytes), from ggml's block definitions.
constexpr std::array<DTypeEntry, 32> kTypes = {{
    {0, {"f32", 1, 4}},         {1, {"f16", 1, 2}},         {2, {"q4_0", 32, 18}},      {3, {"q4_1", 32, 20}},
    {6, {"q5_0", 32, 22}},      {7, {"q5_1", 32, 24}},      {8, {"q8_0", 32, 34}},      {9, {"q8_1", 32, 36}},
    {10, {"q2_k", 256, 84}},    {11, {"q3_k", 256, 110}},   {12, {"q4_k", 256, 144}},   {13, {"q5_k", 256, 176}},
    {14, {"q6_k", 256, 210}},   {15, {"q8_k", 256, 292}},   {16, {"iq2_xxs", 256, 66}}, {17, {"iq2_xs", 256, 74}},
    {18, {"iq3_xxs", 256, 98}}, {19, {"iq1_s", 256, 50}},   {20, {"iq4_nl", 32, 18}},   {21, {"iq3_s", 256, 110}},
    {22, {"iq2_s", 256, 82}},   {23, {"iq4_xs", 256, 136}}, {24, {"i8", 1, 1}},         {25, {"i16", 1, 2}},
    {26, {"i32", 1, 4}},        {27, {"i64", 1, 8}},        {28, {"f64", 1, 8}},        {29, {"iq1_m", 256, 56}},
    {30, {"bf16", 1, 2}},       {34, {"tq1_0", 256, 54}},   {35, {"tq2_0", 256, 66}},   {39, {"mxfp4", 32, 17}},
}};

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

void quantize_q8_0(const float *x, BlockQ8_0 *out, int64_t n) {
    for (int64_t b = 0; b < n / QK8_0; ++b, x += QK8_0) {
        float amax = 0.0f;
        // std::max(amax, NaN) keeps amax: a NaN does not set the scale.
        for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        out[b].d = f32_to_fp16(d);
        // Every kernel level writes the same quants, all in [-127, 127] (which the integer products rely on), also
        // for non-finite values: a d so small that 1 / d overflows (its f16 is 0 anyway) gives id = 0, and a NaN
        // product (a NaN input, or an infinite one times id = 0) the quant 0.
        const float inv = d != 0.0f ? 1.0f / d : 0.0f;
        const float id = std::isinf(inv) ? 0.0f : inv;
        for (int j = 0; j < QK8_0; ++j) {
            const float s = x[j] * id;
            out[b].qs[j] = s == s ? static_cast<int8_t>(std::round(s)) : int8_t(0);
        }
    }
}

void quantize_q4_0(const float *x, BlockQ4_0 *out, int64_t n) {
    for (int64_t b = 0; b < n / QK4_0; ++b, x += QK4_0) {
        // The scale maps the value of largest magnitude (with its sign) to -8, as ggml does.
        const float d = signed_absmax(x, QK4_0) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = f32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
            const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + QK4_0 / 2] * id + 8.5f)));
            out[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
    }
}

}  // namespace

std::optional<DTypeInfo> dtype_info(uint32_t id) {
    for (const auto &e : kTypes) {
        if (e.id == id) return e.info;
    }
    return std::nullopt;
}

const DTypeInfo &dtype_info(DType t) {
    for (const auto &e : kTypes) {
        if (e.id == static_cast<uint32_t>(t)) return e.info;
    }
    throw_error("unknown data type id %u", static_cast<unsigned>(t));
}

std::string_view dtype_name(DType t) { return dtype_info(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
    for (const auto &e : kTypes) {
        if (iequals(e.info.name, name)) return static_cast<DType>(e.id);
    }
    return std::nullopt;
}

bool dtype_is_supported(DType t) {
    return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0 || t == DType::Q4_0 ||
           t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::IQ4_NL || t == DType::MXFP4 ||
           dtype_dots_q8_k(t);
}

bool dtype_is_k_quant(DType t) {
    return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

bool dtype_dots_q8_k(DType t) { return dtype_is_k_quant(t) || t == DType::IQ4_XS; }

bool dtype_is_quantized(DType t) { return dtype_info(t).block_size > 1; }

int64_t dtype_row_size(DType t, int64_t n) {
    const DTypeInfo &info = dtype_info(t);
    SPARROW_ASSERT(n % info.block_size == 0);
    return n / info.block_size * info.type_size;
}

void quantize_row(DType t, const float *x, void *dst, int64_t n) {
    switch (t) {
        case DType::F32: std::memcpy(dst, x, static_cast<size_t>(n) * 4); return;
        case DType::F16: {
            auto *y = static_cast<uint16_t *>(dst);
            for (int64_t i = 0; i < n; ++i) y[i] = f32_to_fp16(x[i]);
            return;
        }
        case DType::BF16: {
            auto *y = static_cast<uint16_t *>(dst);
            for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
            return;
        }
        case DType::Q8_0:
            if (n % QK8_0) throw_error("q8_0 row of %lld elements is not a multiple of 32", (long long)n);
            quantize_q8_0(x, static_cast<BlockQ8_0 *>(dst), n);
            return;
        case DType::Q4_0:
            if (n % QK4_0) throw_error("q4_0 row of %lld elements is not a multiple of 32", (long long)n);
            quantize_q4_0(x, static_cast<BlockQ4_0 *>(dst), n);
            return;
        case DType::Q4_1:
        case DType::Q5_0:
        case DType::Q5_1:
        case DType::IQ4_NL:
        case DType::MXFP4:
            if (n % 32) {
                throw_error("%s row of %lld elements is not a multiple of 32", std::string(dtype_name(t)).c_str(),
                            (long long)n);
            }
            if (t == DType::Q4_1) quantize_row_q4_1(x, static_cast<BlockQ4_1 *>(dst), n);
            if (t == DType::Q5_0) quantize_row_q5_0(x, static_cast<BlockQ5_0 *>(dst), n);
            if (t == DType::Q5_1) quantize_row_q5_1(x, static_cast<BlockQ5_1 *>(dst), n);
            if (t == DType::IQ4_NL) quantize_row_iq4_nl(x, static_cast<BlockIQ4_NL *>(dst), n);
            if (t == DType::MXFP4) quantize_row_mxfp4(x, static_cast<BlockMXFP4 *>(dst), n);
            return;
        case DType::Q8_K:
        case DType::Q2_K:
        case DType::Q3_K:
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
        case DType::IQ4_XS:
            if (n % QK_K) {
                throw_error("%s row of %lld elements is not a multiple of 256", std::string(dtype_name(t)).c_str(),
                            (long long)n);
            }
            if (t == DType::Q8_K) quantize_row_q8_k(x, dst, n);
            if (t == DType::Q2_K) quantize_row_q2_k(x, static_cast<BlockQ2_K *>(dst), n);
            if (t == DType::Q3_K) quantize_row_q3_k(x, static_cast<BlockQ3_K *>(dst), n);
            if (t == DType::Q4_K) quantize_row_q4_k(x, static_cast<BlockQ4_K *>(dst), n);
            if (t == DType::Q5_K) quantize_row_q5_k(x, static_cast<BlockQ5_K *>(dst), n);
            if (t == DType::Q6_K) quantize_row_q6_k(x, static_cast<BlockQ6_K *>(dst), n);
            if (t == DType::IQ4_XS) quantize_row_iq4_xs(x, static_cast<BlockIQ4_XS *>(dst), n);
            return;
        default: throw_error("cannot quantise to type %s", std::string(dtype_name(t)).c_str());
    }
}

void dequantize_row(DType t, const void *src, float *y, int64_t n) {
    switch (t) {
        case DType::F32: std::memcpy(y, src, static_cast<size_t>(n) * 4); return;
        case DType::F16: {
            const auto *x = static_cast<const uint16_t *>(src);
            for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_f32(x[i]);
            return;
        }
        case DType::BF16: {
            const auto *x = static_cast<const uint16_t *>(src);
            for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
            return;
        }
        case DType::Q8_0: {
            const auto *b = static_cast<const BlockQ8_0 *>(src);
            for (int64_t i = 0; i < n / QK8_0; ++i) {
                const float d = fp16_to_f32(b[i].d);
                for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = d * b[i].qs[j];
            }
            return;
        }
        case DType::Q4_0: {
            const auto *b = static_cast<const BlockQ4_0 *>(src);
            for (int64_t i = 0; i < n / QK4_0; ++i) {
                const float d = fp16_to_f32(b[i].d);
                for (int j = 0; j < QK4_0 / 2; ++j) {
                    y[i * QK4_0 + j] = d * ((b[i].qs[j] & 15) - 8);
                    y[i * QK4_0 + j + QK4_0 / 2] = d * ((b[i].qs[j] >> 4) - 8);
                }
            }
            return;
        }
        case DType::Q4_1: dequantize_row_q4_1(static_cast<const BlockQ4_1 *>(src), y, n); return;
        case DType::Q5_0: dequantize_row_q5_0(static_cast<const BlockQ5_0 *>(src), y, n); return;
        case DType::Q5_1: dequantize_row_q5_1(static_cast<const BlockQ5_1 *>(src), y, n); return;
        case DType::IQ4_NL: dequantize_row_iq4_nl(static_cast<const BlockIQ4_NL *>(src), y, n); return;
        case DType::MXFP4: dequantize_row_mxfp4(static_cast<const BlockMXFP4 *>(src), y, n); return;
        case DType::Q8_K: dequantize_row_q8_k(src, y, n); return;
        case DType::Q2_K: dequantize_row_q2_k(static_cast<const BlockQ2_K *>(src), y, n); return;
        case DType::Q3_K: dequantize_row_q3_k(static_cast<const BlockQ3_K *>(src), y, n); return;
        case DType::Q4_K: dequantize_row_q4_k(static_cast<const BlockQ4_K *>(src), y, n); return;
        case DType::Q5_K: dequantize_row_q5_k(static_cast<const BlockQ5_K *>(src), y, n); return;
        case DType::Q6_K: dequantize_row_q6_k(static_cast<const BlockQ6_K *>(src), y, n); return;
        case DType::IQ4_XS: dequantize_row_iq4_xs(static_cast<const BlockIQ4_XS *>(src), y, n); return;
        default: throw_error("cannot dequantise type %s", std::string(dtype_name(t)).c_str());
    }
}

}  // namespace sparrow
