#include "attention/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"

namespace sparrow {

namespace {

constexpr int64_t kTileRows = 16;  // cache rows converted to f32 and scored together

// Converts a cache row (f32, f16 or bf16) to f32 with the fastest kernel the CPU has: y = 0 + 1 * row.
class cpu_row_converter {
  public:
    explicit cpu_row_converter(DType type) : type_(type) {}
    void operator()(const void *row, float *y, int64_t n) const {
        if (type_ == DType::F32) {
            std::memcpy(y, row, static_cast<size_t>(n) * sizeof(float));
            return;
        }
        std::fill(y, y + n, 0.0f);
        axpy_row(type_, row, 1.0f, y, n);
    }

  private:
    DType type_;
};

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
    const int64_t n_items = n_tokens * shape.n_head_kv;
    const int64_t grain = work < (int64_t(64) << 10) ? n_items : 1;
    // K and V rows of f16/bf16 caches are converted to f32 once per tile and then shared by the group's
    // heads (MLA has 16-128 query heads per latent row). When V is a slice of the same row as K (MLA:
    // V = c_kv, the first kv_lora elements of [c_kv | k_pe]), it is read from the converted K tile.
    const bool v_in_k = &v == &k && shape.v_offset >= 0 && shape.n_head_kv == 1 &&
                        shape.v_offset + shape.head_dim_v <= shape.head_dim_k;
    const cpu_row_converter to_f32_k(k.type()), to_f32_v(v.type());
    pool.parallel_for(n_items, grain, [&](int64_t begin, int64_t end) {
        const int64_t Dk = shape.head_dim_k, Dv = shape.head_dim_v;
        std::vector<float> acc(static_cast<size_t>(group * Dv));
        std::vector<float> run_max(static_cast<size_t>(group)), run_sum(static_cast<size_t>(group));
        std::vector<float> k_tile(static_cast<size_t>(kTileRows * Dk)), v_tile(static_cast<size_t>(kTileRows * Dv));
        float scores[kTileRows];
        for (int64_t item = begin; item < end; ++item) {
            const int64_t t = item / shape.n_head_kv, kvh = item % shape.n_head_kv;
            std::fill(acc.begin(), acc.end(), 0.0f);
            std::fill(run_max.begin(), run_max.end(), -std::numeric_limits<float>::infinity());
            std::fill(run_sum.begin(), run_sum.end(), 0.0f);
            const std::span<const int32_t> list = rows[static_cast<size_t>(t)];
            for (size_t j0 = 0; j0 < list.size(); j0 += kTileRows) {
                const int64_t n = std::min<int64_t>(kTileRows, static_cast<int64_t>(list.size() - j0));
                for (int64_t j = 0; j < n; ++j) {
                    const auto *k_row = static_cast<const uint8_t *>(k.row(list[j0 + j])) + kvh * k_head_bytes;
                    to_f32_k(k_row, k_tile.data() + j * Dk, Dk);
                    if (!v_in_k) {
                        const auto *v_row =
                            static_cast<const uint8_t *>(v.row(list[j0 + j])) + v_offset_bytes + kvh * v_head_bytes;
                        to_f32_v(v_row, v_tile.data() + j * Dv, Dv);
                    }
                }
                const float *v_base = v_in_k ? k_tile.data() + shape.v_offset : v_tile.data();
                const int64_t v_stride = v_in_k ? Dk : Dv;
                for (int64_t g = 0; g < group; ++g) {
                    const float *q_h = q + (t * shape.n_head + kvh * group + g) * Dk;
                    float tile_max = -std::numeric_limits<float>::infinity();
                    for (int64_t j = 0; j < n; ++j) {
                        scores[j] = shape.scale * dot_row(DType::F32, k_tile.data() + j * Dk, q_h, Dk);
                        tile_max = std::max(tile_max, scores[j]);
                    }
                    float *acc_g = acc.data() + g * Dv;
                    if (tile_max > run_max[g]) {  // new maximum: rescale what has been accumulated so far
                        const float factor = std::exp(run_max[g] - tile_max);
                        for (int64_t i = 0; i < Dv; ++i) acc_g[i] *= factor;
                        run_sum[g] *= factor;
                        run_max[g] = tile_max;
                    }
                    for (int64_t j = 0; j < n; ++j) {
                        const float p = std::exp(scores[j] - run_max[g]);
                        run_sum[g] += p;
                        axpy_row(DType::F32, v_base + j * v_stride, p, acc_g, Dv);
                    }
                }
            }
            for (int64_t g = 0; g < group; ++g) {
                float *o = out + (t * shape.n_head + kvh * group + g) * Dv;
                const float inv = run_sum[g] > 0.0f ? 1.0f / run_sum[g] : 0.0f;
                for (int64_t i = 0; i < Dv; ++i) o[i] = acc[g * Dv + i] * inv;
            }
        }
    });
}

}  // namespace sparrow
