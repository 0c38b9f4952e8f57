// Portable versions of the lightning-indexer inner loops (indexer_kernels.h has the contracts). They run
// where the CPU lacks AVX2 and under SPARROW_ISA=scalar, and are what the AVX2 versions are tested against.
#include <cmath>
#include <cstdint>

#include "attention/indexer_kernels.h"
#include "core/blocks.h"
#include "core/dtype.h"

namespace sparrow::indexer::scalar {

namespace {

// relu that keeps NaN (NaN < 0 is false): a NaN dot product must rank last, not score 0.
inline float relu(float v) { return v < 0.0f ? 0.0f : v; }

inline float load(uint32_t row_type, const void *row, int64_t i) {
    switch (row_type) {
        case kRowF16: return fp16_to_f32(static_cast<const uint16_t *>(row)[i]);
        case kRowBF16: return bf16_to_f32(static_cast<const uint16_t *>(row)[i]);
        default: return static_cast<const float *>(row)[i];
    }
}

}  // namespace

void score_f32(uint32_t row_type, const float *qT, const float *w, int64_t hp, int64_t d, const void *const *keys,
               int64_t n_keys, float *scores) {
    for (int64_t j = 0; j < n_keys; ++j) {
        float score = 0.0f;
        for (int64_t h = 0; h < hp; ++h) {
            float dot = 0.0f;
            for (int64_t i = 0; i < d; ++i) dot += qT[i * hp + h] * load(row_type, keys[j], i);
            score += w[h] * relu(dot);
        }
        scores[j] = score;
    }
}

void score_i8(const uint8_t *qT4, const float *wq, int64_t hp, int64_t dp, const int8_t *keys, const int32_t *ksum,
              const float *kscale, int64_t n_keys, float *scores, int32_t q_offset) {
    for (int64_t j = 0; j < n_keys; ++j) {
        const int8_t *k = keys + j * dp;
        float score = 0.0f;
        for (int64_t h = 0; h < hp; ++h) {
            int32_t dot = 0;  // sum (q + offset) k, as maddubs + madd compute it
            for (int64_t g = 0; g < dp / 4; ++g) {
                for (int64_t i = 0; i < 4; ++i) dot += int32_t(qT4[(g * hp + h) * 4 + i]) * k[4 * g + i];
            }
            score += wq[h] * relu(static_cast<float>(dot - q_offset * ksum[j]));
        }
        scores[j] = kscale[j] * score;
    }
}

void score_q8_0(const uint8_t *qT4, const float *wq, int64_t hp, int64_t d, const void *const *keys, int64_t n_keys,
                float *scores, int32_t q_offset) {
    const int64_t nb = d / QK8_0;
    for (int64_t j = 0; j < n_keys; ++j) {
        const auto *blocks = static_cast<const BlockQ8_0 *>(keys[j]);
        float score = 0.0f;
        for (int64_t h = 0; h < hp; ++h) {
            float dot = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                int32_t acc = 0, sum = 0;  // sum (q + offset) k and sum k over the block, as the AVX2 kernel
                for (int64_t i = 0; i < QK8_0; ++i) {
                    const int64_t e = b * QK8_0 + i;
                    acc += int32_t(qT4[((e / 4) * hp + h) * 4 + e % 4]) * blocks[b].qs[i];
                    sum += blocks[b].qs[i];
                }
                dot += fp16_to_f32(blocks[b].d) * static_cast<float>(acc - q_offset * sum);
            }
            score += wq[h] * relu(dot);
        }
        scores[j] = score;
    }
}

void convert_rows(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, float *out) {
    for (int64_t j = 0; j < n_rows; ++j) {
        for (int64_t i = 0; i < d; ++i) out[j * d + i] = load(row_type, rows[j], i);
    }
}

void quantize_keys(uint32_t row_type, const void *const *rows, int64_t n_rows, int64_t d, int64_t dp, int8_t *out,
                   float *kscale, int32_t *ksum) {
    for (int64_t j = 0; j < n_rows; ++j) {
        int8_t *o = out + j * dp;
        ksum[j] = 0;
        float amax = 0.0f;
        bool finite = true;
        for (int64_t i = 0; i < d; ++i) {
            const float v = load(row_type, rows[j], i);
            finite = finite && std::isfinite(v);
            amax = std::fmax(amax, std::fabs(v));
        }
        for (int64_t i = 0; i < dp; ++i) o[i] = 0;
        if (!finite) {
            kscale[j] = NAN;
            continue;
        }
        kscale[j] = amax / kKeyQuantMax;
        if (amax == 0.0f) continue;
        const float inv = kKeyQuantMax / amax;
        for (int64_t i = 0; i < d; ++i) {
            // nearbyint rounds to nearest even, as the AVX2 conversion does.
            const float r = std::nearbyint(load(row_type, rows[j], i) * inv);
            const float c = std::fmin(std::fmax(r, -float(kKeyQuantMax)), float(kKeyQuantMax));
            o[i] = static_cast<int8_t>(c);
            ksum[j] += o[i];
        }
    }
}

}  // namespace sparrow::indexer::scalar
