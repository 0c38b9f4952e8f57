#include "attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace sparrow {

namespace {

constexpr int64_t kTileRows = 16;  // cache rows converted to f32 and scored together

}  // namespace

void attention(ThreadPool &pool, const AttentionShape &shape, const float *q, int64_t n_tokens, const RowStore &k,
               const RowStore &v, std::span<const std::span<const int32_t>> rows, float *out) {
    SPARROW_ASSERT(shape.n_head % shape.n_head_kv == 0);
    SPARROW_ASSERT(k.width() == shape.n_head_kv * shape.head_dim_k);
    SPARROW_ASSERT(v.width() >= shape.v_offset + shape.n_head_kv * shape.head_dim_v);
    const int64_t group = shape.n_head / shape.n_head_kv;  // query heads per KV head
    const int64_t k_head_bytes = dtype_row_size(k.type(), shape.head_dim_k);
    const int64_t v_head_bytes = dtype_row_size(v.type(), shape.head_dim_v);
    const int64_t v_offset_bytes = dtype_row_size(v.type(), shape.v_offset);

    // One work item = one token x one KV head: the group's query heads share each K/V row while it is hot.
    // Small problems run on the calling thread: waking the pool costs more than the work.
    int64_t n_row_visits = 0;
    for (const auto &r : rows) n_row_visits += static_cast<int64_t>(r.size());
    const int64_t work = n_row_visits * shape.n_head * (shape.head_dim_k + shape.head_dim_v);
    // Decode with one KV head (MLA) would be a single item: split the group's query heads into chunks so
    // that every thread has work (each chunk converts its own K/V tiles; the rows are shared in cache).
    const int64_t n_pairs = n_tokens * shape.n_head_kv;
    const int64_t n_chunks = std::clamp<int64_t>((pool.n_threads() + n_pairs - 1) / n_pairs, 1, group);
    const int64_t chunk_heads = (group + n_chunks - 1) / n_chunks;
    const int64_t n_items = n_pairs * n_chunks;
    const int64_t grain = work < (int64_t(64) << 10) ? n_items : 1;
    // K and V rows of f16/bf16 caches are converted to f32 once per tile and then shared by the group's
    // heads (MLA has 16-128 query heads per latent row). When V is a slice of the same row as K (MLA:
    // V = c_kv, the first kv_lora elements of [c_kv | k_pe]), it is read from the converted K tile.
    const bool v_in_k = &v == &k && shape.v_offset >= 0 && shape.n_head_kv == 1 &&
                        shape.v_offset + shape.head_dim_v <= shape.head_dim_k;
    const cpu::DotTileFn dot_f32 = cpu::kernels().dot_f32;
    pool.parallel_for(n_items, grain, [&](int64_t begin, int64_t end) {
        const int64_t Dk = shape.head_dim_k, Dv = shape.head_dim_v;
        std::vector<float> acc(static_cast<size_t>(group * Dv));
        std::vector<float> run_max(static_cast<size_t>(group)), run_sum(static_cast<size_t>(group));
        std::vector<float> k_tile(static_cast<size_t>(kTileRows * Dk)), v_tile(static_cast<size_t>(kTileRows * Dv));
        std::vector<float> scores(static_cast<size_t>(chunk_heads * kTileRows));
        for (int64_t item = begin; item < end; ++item) {
            const int64_t pair = item / n_chunks, chunk = item % n_chunks;
            const int64_t t = pair / shape.n_head_kv, kvh = pair % shape.n_head_kv;
            const int64_t g_begin = chunk * chunk_heads, g_end = std::min(group, g_begin + chunk_heads);
            if (g_begin >= g_end) continue;
            std::fill(acc.begin(), acc.end(), 0.0f);
            std::fill(run_max.begin(), run_max.end(), -std::numeric_limits<float>::infinity());
            std::fill(run_sum.begin(), run_sum.end(), 0.0f);
            const std::span<const int32_t> list = rows[static_cast<size_t>(t)];
            for (size_t j0 = 0; j0 < list.size(); j0 += kTileRows) {
                const int64_t n = std::min<int64_t>(kTileRows, static_cast<int64_t>(list.size() - j0));
                for (int64_t j = 0; j < n; ++j) {
                    const auto *k_row = static_cast<const uint8_t *>(k.row(list[j0 + j])) + kvh * k_head_bytes;
                    convert_row_to_f32(k.type(), k_row, k_tile.data() + j * Dk, Dk);
                    if (!v_in_k) {
                        const auto *v_row =
                            static_cast<const uint8_t *>(v.row(list[j0 + j])) + v_offset_bytes + kvh * v_head_bytes;
                        convert_row_to_f32(v.type(), v_row, v_tile.data() + j * Dv, Dv);
                    }
                }
                const float *v_base = v_in_k ? k_tile.data() + shape.v_offset : v_tile.data();
                const int64_t v_stride = v_in_k ? Dk : Dv;
                // Scores of the chunk's heads against the tile: each K row is loaded once for up to
                // cpu::kMaxTile heads (q heads are contiguous, Dk floats apart).
                const float *q_chunk = q + (t * shape.n_head + kvh * group + g_begin) * Dk;
                for (int64_t j = 0; j < n; ++j) {
                    for (int64_t g = g_begin; g < g_end; g += cpu::kMaxTile) {
                        const int n_x = static_cast<int>(std::min<int64_t>(cpu::kMaxTile, g_end - g));
                        float dots[cpu::kMaxTile];
                        dot_f32(k_tile.data() + j * Dk, q_chunk + (g - g_begin) * Dk, Dk * sizeof(float), n_x, Dk,
                                dots);
                        for (int x = 0; x < n_x; ++x) scores[(g - g_begin + x) * kTileRows + j] = shape.scale * dots[x];
                    }
                }
                for (int64_t g = g_begin; g < g_end; ++g) {
                    const float *s_g = scores.data() + (g - g_begin) * kTileRows;
                    float tile_max = -std::numeric_limits<float>::infinity();
                    for (int64_t j = 0; j < n; ++j) tile_max = std::max(tile_max, s_g[j]);
                    float *acc_g = acc.data() + g * Dv;
                    if (tile_max > run_max[g]) {  // new maximum: rescale what has been accumulated so far
                        const float factor = std::exp(run_max[g] - tile_max);
                        for (int64_t i = 0; i < Dv; ++i) acc_g[i] *= factor;
                        run_sum[g] *= factor;
                        run_max[g] = tile_max;
                    }
                    for (int64_t j = 0; j < n; ++j) {
                        const float p = std::exp(s_g[j] - run_max[g]);
                        run_sum[g] += p;
                        axpy_row(DType::F32, v_base + j * v_stride, p, acc_g, Dv);
                    }
                }
            }
            for (int64_t g = g_begin; g < g_end; ++g) {
                float *o = out + (t * shape.n_head + kvh * group + g) * Dv;
                const float inv = run_sum[g] > 0.0f ? 1.0f / run_sum[g] : 0.0f;
                for (int64_t i = 0; i < Dv; ++i) o[i] = acc[g * Dv + i] * inv;
            }
        }
    });
}

}  // namespace sparrow
