// The ops of ops.h other than matmul (matmul.cpp). None of them dominates a forward pass, so they are
// tight portable C++ that the compiler can vectorise; the cache-row dot/axpy used by attention go through
// the ISA dispatch table like matmul does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "core/error.h"
#include "core/kquants.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace sparrow {

namespace {

// Independent partial sums per reduction: breaks the add dependency chain and lets the compiler use SIMD
// without reassociating (no -ffast-math). Partial sums are double: norms are cheap, exactness is not.
constexpr int kLanes = 8;

double sum_of(const float *x, int64_t n) {
    double lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) lanes[l] += x[i + l];
    }
    double sum = 0.0;
    for (int l = 0; l < kLanes; ++l) sum += lanes[l];
    for (; i < n; ++i) sum += x[i];
    return sum;
}

// sum (x[i] - center)^2
double sum_of_squares(const float *x, int64_t n, double center) {
    double lanes[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
            const double d = x[i + l] - center;
            lanes[l] += d * d;
        }
    }
    double sum = 0.0;
    for (int l = 0; l < kLanes; ++l) sum += lanes[l];
    for (; i < n; ++i) sum += (x[i] - center) * (x[i] - center);
    return sum;
}

// top_k's order: a ranks before b when its score is larger, NaN ranks after every number, and equal
// scores (or two NaNs) rank by lower index.
struct RanksBefore {
    const float *scores;
    bool operator()(int32_t a, int32_t b) const {
        const float sa = scores[a], sb = scores[b];
        const bool nan_a = std::isnan(sa), nan_b = std::isnan(sb);
        if (nan_a != nan_b) return nan_b;
        if (!nan_a && sa != sb) return sa > sb;
        return a < b;
    }
};

}  // namespace

namespace {

// The packed layouts share one shape: per block, the eight rows' quantised bytes in groups of four (a group
// of each row side by side), then the eight scales (fp16 d, or MXFP4's exponents e). B is BlockQ8_0, BlockQ4_0 or
// BlockMXFP4, R its record.
template <typename B, typename R>
void pack_blocks8(const void *src, int64_t n_rows, int64_t n_cols, void *dst) {
    constexpr int kBytes = sizeof(B::qs);
    const int64_t nb = n_cols / QK8_0;
    const auto *rows = static_cast<const B *>(src);
    auto *rec = static_cast<R *>(dst);
    for (int64_t g0 = 0; g0 < n_rows; g0 += 8) {
        for (int64_t b = 0; b < nb; ++b, ++rec) {
            for (int r = 0; r < 8; ++r) {
                const B &blk = rows[(g0 + r) * nb + b];
                if constexpr (requires { blk.e; }) {
                    rec->e[r] = blk.e;
                } else {
                    rec->d[r] = blk.d;
                }
                for (int g = 0; g < kBytes / 4; ++g) std::memcpy(rec->qs + 32 * g + 4 * r, blk.qs + 4 * g, 4);
            }
        }
    }
}

template <typename B, typename R>
void unpack_block8(const void *packed, int64_t r, int64_t n_cols, void *out) {
    constexpr int kBytes = sizeof(B::qs);
    const int64_t nb = n_cols / QK8_0;
    const auto *rec = static_cast<const R *>(packed) + (r / 8) * nb;
    auto *blk = static_cast<B *>(out);
    const int64_t lane = r % 8;
    for (int64_t b = 0; b < nb; ++b) {
        if constexpr (requires { blk[b].e; }) {
            blk[b].e = rec[b].e[lane];
        } else {
            blk[b].d = rec[b].d[lane];
        }
        for (int g = 0; g < kBytes / 4; ++g) std::memcpy(blk[b].qs + 4 * g, rec[b].qs + 32 * g + 4 * lane, 4);
    }
}

// K-quants and IQ4_XS: each row's super-block b goes to its lane of record b of the group (core/kquants.h pack_lane).
template <typename B, typename R>
void pack_k_blocks8(const void *src, int64_t n_rows, int64_t n_cols, void *dst) {
    const int64_t nb = n_cols / QK_K;
    const auto *rows = static_cast<const B *>(src);
    auto *rec = static_cast<R *>(dst);
    for (int64_t g0 = 0; g0 < n_rows; g0 += 8) {
        for (int64_t b = 0; b < nb; ++b, ++rec) {
            for (int r = 0; r < 8; ++r) pack_lane(rows[(g0 + r) * nb + b], r, *rec);
        }
    }
}

template <typename B, typename R>
void unpack_k_block8(const void *packed, int64_t r, int64_t n_cols, void *out) {
    const int64_t nb = n_cols / QK_K;
    const auto *rec = static_cast<const R *>(packed) + (r / 8) * nb;
    auto *blk = static_cast<B *>(out);
    for (int64_t b = 0; b < nb; ++b) unpack_lane(rec[b], static_cast<int>(r % 8), blk[b]);
}

}  // namespace

bool packs_rows8(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::MXFP4 || dtype_dots_q8_k(t); }

void pack_rows8(DType t, const void *src, int64_t n_rows, int64_t n_cols, void *dst) {
    SPARROW_ASSERT(packs_rows8(t) && n_rows % 8 == 0 && n_cols % dtype_info(t).block_size == 0);
    switch (t) {
        case DType::Q8_0: pack_blocks8<BlockQ8_0, BlockQ8_0x8>(src, n_rows, n_cols, dst); return;
        case DType::Q4_0: pack_blocks8<BlockQ4_0, BlockQ4_0x8>(src, n_rows, n_cols, dst); return;
        case DType::MXFP4: pack_blocks8<BlockMXFP4, BlockMXFP4x8>(src, n_rows, n_cols, dst); return;
        case DType::Q2_K: pack_k_blocks8<BlockQ2_K, BlockQ2_Kx8>(src, n_rows, n_cols, dst); return;
        case DType::Q3_K: pack_k_blocks8<BlockQ3_K, BlockQ3_Kx8>(src, n_rows, n_cols, dst); return;
        case DType::Q4_K: pack_k_blocks8<BlockQ4_K, BlockQ4_Kx8>(src, n_rows, n_cols, dst); return;
        case DType::Q5_K: pack_k_blocks8<BlockQ5_K, BlockQ5_Kx8>(src, n_rows, n_cols, dst); return;
        case DType::IQ4_XS: pack_k_blocks8<BlockIQ4_XS, BlockIQ4_XSx8>(src, n_rows, n_cols, dst); return;
        default: pack_k_blocks8<BlockQ6_K, BlockQ6_Kx8>(src, n_rows, n_cols, dst); return;
    }
}

void unpack_row8(DType t, const void *packed, int64_t r, int64_t n_cols, void *out) {
    SPARROW_ASSERT(packs_rows8(t) && n_cols % dtype_info(t).block_size == 0);
    switch (t) {
        case DType::Q8_0: unpack_block8<BlockQ8_0, BlockQ8_0x8>(packed, r, n_cols, out); return;
        case DType::Q4_0: unpack_block8<BlockQ4_0, BlockQ4_0x8>(packed, r, n_cols, out); return;
        case DType::MXFP4: unpack_block8<BlockMXFP4, BlockMXFP4x8>(packed, r, n_cols, out); return;
        case DType::Q2_K: unpack_k_block8<BlockQ2_K, BlockQ2_Kx8>(packed, r, n_cols, out); return;
        case DType::Q3_K: unpack_k_block8<BlockQ3_K, BlockQ3_Kx8>(packed, r, n_cols, out); return;
        case DType::Q4_K: unpack_k_block8<BlockQ4_K, BlockQ4_Kx8>(packed, r, n_cols, out); return;
        case DType::Q5_K: unpack_k_block8<BlockQ5_K, BlockQ5_Kx8>(packed, r, n_cols, out); return;
        case DType::IQ4_XS: unpack_k_block8<BlockIQ4_XS, BlockIQ4_XSx8>(packed, r, n_cols, out); return;
        default: unpack_k_block8<BlockQ6_K, BlockQ6_Kx8>(packed, r, n_cols, out); return;
    }
}

void get_rows(const WeightMatrix &table, const int32_t *ids, int64_t n, float *out) {
    if (!dtype_is_supported(table.type)) {
        throw_error("get_rows: table type %s is not supported", std::string(dtype_name(table.type)).c_str());
    }
    std::vector<uint8_t> unpacked(table.rows8 ? static_cast<size_t>(table.row_bytes) : 0);
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= table.n_rows) {
            throw_error("get_rows: id %d out of range [0, %lld)", ids[i], (long long)table.n_rows);
        }
        const void *row = table.row(ids[i]);
        if (table.rows8) {
            unpack_row8(table.type, table.data, ids[i], table.n_cols, unpacked.data());
            row = unpacked.data();
        }
        dequantize_row(table.type, row, out + i * table.n_cols, table.n_cols);
    }
}

void rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    const cpu::RmsNormRowFn row = cpu::kernels().rms_norm_row;
    for (int64_t r = 0; r < n_rows; ++r) row(x + r * n, w, y + r * n, n, eps);
}

void layer_norm(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; ++r) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        // Two passes (mean, then squared deviations): no cancellation when |mean| >> std.
        const double mean = sum_of(xr, n) / double(n);
        const double var = sum_of_squares(xr, n, mean) / double(n);
        const float scale = static_cast<float>(1.0 / std::sqrt(var + eps));
        const float m = static_cast<float>(mean);
        for (int64_t i = 0; i < n; ++i) {
            yr[i] = (xr[i] - m) * scale * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
        }
    }
}

RopeTable::RopeTable(const RopeParams &p) : p_(p) {
    const int n_rot = p.n_rot;
    if (n_rot <= 0 || n_rot % 2 != 0) throw_error("rope: n_rot = %d must be even and positive", n_rot);
    const int half = n_rot / 2;
    const bool yarn = p.ext_factor != 0.0f;
    // YaRN correction range in pair indices, in f32 exactly as ggml (ggml_rope_yarn_corr_dims), so that the
    // floor/ceil land where ggml's do.
    const auto corr_dim = [&](float beta) {
        return float(n_rot) * std::log(float(p.n_ctx_orig) / (beta * 2.0f * std::numbers::pi_v<float>)) /
               (2.0f * std::log(p.freq_base));
    };
    const float corr_low = std::max(0.0f, std::floor(corr_dim(p.beta_fast)));
    const float corr_high = std::min(float(n_rot - 1), std::ceil(corr_dim(p.beta_slow)));
    mscale_ = yarn ? p.attn_factor * (1.0f + 0.1f * std::log(1.0f / p.freq_scale)) : p.attn_factor;
    // Per pair: its frequency and YaRN mix.
    inv_freq_.resize(static_cast<size_t>(half));
    mix_.resize(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
        inv_freq_[static_cast<size_t>(i)] = std::pow(double(p.freq_base), -2.0 * i / n_rot);
        const double ramp =
            1.0 - std::clamp((i - double(corr_low)) / std::max(0.001, double(corr_high) - corr_low), 0.0, 1.0);
        mix_[static_cast<size_t>(i)] = yarn ? ramp * p.ext_factor : 0.0;
    }
}

void rope(float *x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t *pos, const RopeParams &p) {
    rope(x, n_tokens, n_heads, head_dim, pos, RopeTable(p));
}

void rope(float *x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t *pos, const RopeTable &table) {
    const RopeParams &p = table.params();
    const int n_rot = p.n_rot;
    if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim) {
        throw_error("rope: n_rot = %d must be even and in (0, head_dim = %lld]", n_rot, (long long)head_dim);
    }
    const int half = n_rot / 2;
    const float mscale = table.mscale();
    // Pairs go in chunks so the per-token cos/sin live on the stack: per token, cos/sin of each pair (once per
    // token, shared by every head).
    constexpr int kChunk = 128;
    float cos_t[kChunk], sin_t[kChunk];
    for (int i0 = 0; i0 < half; i0 += kChunk) {
        const int n_pairs = std::min(kChunk, half - i0);
        const double *inv_freq = table.inv_freq() + i0, *mix = table.mix() + i0;
        for (int64_t t = 0; t < n_tokens; ++t) {
            for (int k = 0; k < n_pairs; ++k) {
                // theta in double: positions reach 1e5+, where an f32 angle would be off by ~1e-2 rad. The
                // angle is reduced to [-pi, pi] in double, so f32 sin/cos of the remainder stay accurate.
                const double theta_extrap = double(pos[t]) * inv_freq[k];
                const double theta_interp = double(p.freq_scale) * theta_extrap;
                const double theta = theta_interp * (1.0 - mix[k]) + theta_extrap * mix[k];
                const double two_pi = 2.0 * std::numbers::pi;
                const float reduced = static_cast<float>(theta - two_pi * std::nearbyint(theta / two_pi));
                cos_t[k] = std::cos(reduced) * mscale;
                sin_t[k] = std::sin(reduced) * mscale;
            }
            for (int64_t h = 0; h < n_heads; ++h) {
                float *xh = x + (t * n_heads + h) * head_dim;
                if (p.layout == RopeLayout::adjacent) {
                    for (int k = 0; k < n_pairs; ++k) {
                        const float a = xh[2 * (i0 + k)], b = xh[2 * (i0 + k) + 1];
                        xh[2 * (i0 + k)] = a * cos_t[k] - b * sin_t[k];
                        xh[2 * (i0 + k) + 1] = a * sin_t[k] + b * cos_t[k];
                    }
                } else {
                    for (int k = 0; k < n_pairs; ++k) {
                        const float a = xh[i0 + k], b = xh[i0 + k + half];
                        xh[i0 + k] = a * cos_t[k] - b * sin_t[k];
                        xh[i0 + k + half] = a * sin_t[k] + b * cos_t[k];
                    }
                }
            }
        }
    }
}

void softmax(float *x, int64_t n, float scale) {
    if (n <= 0) return;
    float max = -INFINITY;
    for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i] * scale);
    if (max == -INFINITY) {  // every element -inf (a fully masked row): no probability mass anywhere
        std::fill(x, x + n, 0.0f);
        return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] * scale - max);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    if (n > 0) cpu::kernels().swiglu(gate, up, out, n);
}

void hadamard(float *x, int64_t n_rows, int64_t n) {
    if (n <= 0 || (n & (n - 1)) != 0) throw_error("hadamard: n = %lld is not a power of two", (long long)n);
    const float norm = static_cast<float>(1.0 / std::sqrt(double(n)));
    const auto row = cpu::kernels().hadamard_row;
    for (int64_t r = 0; r < n_rows; ++r) row(x + r * n, n, norm);
}

int64_t top_k(const float *scores, int64_t n, int64_t k, int32_t *idx) {
    const int64_t m = std::max<int64_t>(0, std::min(k, n));
    if (m == 0) return 0;
    // idx[0 .. m) is a bounded heap whose top is the worst index kept so far (the heap's "largest" under
    // RanksBefore); a new index enters only when it ranks before that worst one.
    const RanksBefore ranks_before{scores};
    for (int64_t i = 0; i < m; ++i) idx[i] = static_cast<int32_t>(i);
    std::make_heap(idx, idx + m, ranks_before);
    for (int64_t i = m; i < n; ++i) {
        if (!ranks_before(static_cast<int32_t>(i), idx[0])) continue;
        std::pop_heap(idx, idx + m, ranks_before);
        idx[m - 1] = static_cast<int32_t>(i);
        std::push_heap(idx, idx + m, ranks_before);
    }
    std::sort_heap(idx, idx + m, ranks_before);  // best first
    return m;
}

float dot_row(DType t, const void *row, const float *x, int64_t n) {
    if (t != DType::F32 && t != DType::F16 && t != DType::BF16) {
        throw_error("dot_row: cache row type %s is not F32, F16 or BF16", std::string(dtype_name(t)).c_str());
    }
    float out;
    cpu::kernels().dot(t)(row, x, 0, 1, n, &out);
    return out;
}

void axpy_row(DType t, const void *row, float a, float *y, int64_t n) { cpu::kernels().axpy(t)(row, a, y, n); }

void convert_row_to_f32(DType t, const void *row, float *y, int64_t n) {
    switch (t) {
        case DType::F32: std::memcpy(y, row, static_cast<size_t>(n) * sizeof(float)); return;
        case DType::F16: cpu::kernels().to_f32_f16(row, y, n); return;
        case DType::BF16: cpu::kernels().to_f32_bf16(row, y, n); return;
        case DType::Q8_0:
        case DType::Q4_0:
            if (n % QK8_0 != 0) throw_error("convert_row_to_f32: %lld elements are not whole 32-blocks", (long long)n);
            (t == DType::Q8_0 ? cpu::kernels().to_f32_q8_0 : cpu::kernels().to_f32_q4_0)(row, y, n);
            return;
        default:
            throw_error("convert_row_to_f32: row type %s is not f32, f16, bf16, q8_0 or q4_0",
                        std::string(dtype_name(t)).c_str());
    }
}

}  // namespace sparrow
