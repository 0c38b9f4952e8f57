#include "attention/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"

namespace sparrow {

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
    const int64_t n_items = n_tokens * shape.n_head_kv;
    const int64_t grain = work < (int64_t(64) << 10) ? n_items : 1;
    pool.parallel_for(n_items, grain, [&](int64_t begin, int64_t end) {
        std::vector<float> acc(static_cast<size_t>(group * shape.head_dim_v));
        std::vector<float> run_max(static_cast<size_t>(group)), run_sum(static_cast<size_t>(group));
        for (int64_t item = begin; item < end; ++item) {
            const int64_t t = item / shape.n_head_kv, kvh = item % shape.n_head_kv;
            std::fill(acc.begin(), acc.end(), 0.0f);
            std::fill(run_max.begin(), run_max.end(), -std::numeric_limits<float>::infinity());
            std::fill(run_sum.begin(), run_sum.end(), 0.0f);
            for (const int32_t cell : rows[static_cast<size_t>(t)]) {
                const auto *k_row = static_cast<const uint8_t *>(k.row(cell)) + kvh * k_head_bytes;
                const auto *v_row = static_cast<const uint8_t *>(v.row(cell)) + v_offset_bytes + kvh * v_head_bytes;
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t h = kvh * group + g;
                    const float *q_h = q + (t * shape.n_head + h) * shape.head_dim_k;
                    const float s = shape.scale * dot_row(k.type(), k_row, q_h, shape.head_dim_k);
                    float *acc_g = acc.data() + g * shape.head_dim_v;
                    if (s > run_max[g]) {  // new maximum: rescale what has been accumulated so far
                        const float factor = std::exp(run_max[g] - s);
                        for (int64_t i = 0; i < shape.head_dim_v; ++i) acc_g[i] *= factor;
                        run_sum[g] *= factor;
                        run_max[g] = s;
                    }
                    const float p = std::exp(s - run_max[g]);
                    run_sum[g] += p;
                    axpy_row(v.type(), v_row, p, acc_g, shape.head_dim_v);
                }
            }
            for (int64_t g = 0; g < group; ++g) {
                const int64_t h = kvh * group + g;
                float *o = out + (t * shape.n_head + h) * shape.head_dim_v;
                const float inv = run_sum[g] > 0.0f ? 1.0f / run_sum[g] : 0.0f;
                for (int64_t i = 0; i < shape.head_dim_v; ++i) o[i] = acc[g * shape.head_dim_v + i] * inv;
            }
        }
    });
}

}  // namespace sparrow
