// Placeholder scalar implementation (replaced by the tiled kernel on the indexer branch).
#include "attention/lightning_indexer.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace sparrow {

void lightning_indexer_select(ThreadPool &pool, const IndexerShape &shape, IndexerPrecision, const float *q,
                              const float *w, int64_t n_tokens, const RowStore &keys,
                              std::span<const std::span<const int32_t>> candidates, int64_t top_k,
                              std::vector<std::vector<int32_t>> &selected) {
    selected.resize(static_cast<size_t>(n_tokens));
    pool.parallel_for(n_tokens, 1, [&](int64_t b, int64_t e) {
        std::vector<std::pair<float, int32_t>> scored;
        for (int64_t t = b; t < e; ++t) {
            const auto cand = candidates[t];
            auto &out = selected[t];
            out.clear();
            if (static_cast<int64_t>(cand.size()) <= top_k) {
                out.assign(cand.begin(), cand.end());
                continue;
            }
            scored.clear();
            for (size_t j = 0; j < cand.size(); ++j) {
                float s = 0;
                for (int64_t h = 0; h < shape.n_head; ++h) {
                    const float d = dot_row(keys.type(), keys.row(cand[j]), q + (t * shape.n_head + h) * shape.head_dim,
                                            shape.head_dim);
                    s += w[t * shape.n_head + h] * std::max(d, 0.0f);
                }
                scored.emplace_back(std::isnan(s) ? -INFINITY : s, static_cast<int32_t>(j));
            }
            std::partial_sort(scored.begin(), scored.begin() + top_k, scored.end(), [](auto &a, auto &c) {
                return a.first > c.first || (a.first == c.first && a.second < c.second);
            });
            std::vector<int32_t> idx;
            for (int64_t i = 0; i < top_k; ++i) idx.push_back(scored[i].second);
            std::sort(idx.begin(), idx.end());
            for (int32_t j : idx) out.push_back(cand[j]);
        }
    });
}

}  // namespace sparrow
