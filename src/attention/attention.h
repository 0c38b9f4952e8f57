// Attention of query tokens over rows of a KV cache, with an explicit list of rows per query. Dense
// attention passes every visible row; sparse attention passes the selected rows. Either way only the
// listed rows are read.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "cache/row_store.h"
#include "core/thread_pool.h"

namespace sparrow {

struct AttentionShape {
    int64_t n_head = 0;
    int64_t n_head_kv = 0;   // query head h reads KV head h / (n_head / n_head_kv) (grouped-query attention)
    int64_t head_dim_k = 0;  // q and k width per head
    int64_t head_dim_v = 0;
    float scale = 1.0f;    // softmax scale applied to q.k
    int64_t v_offset = 0;  // elements to skip at the start of each V row (MLA reads V as a prefix of K)
};

struct AttentionBuffers;  // attention.cpp

// attention()'s working memory (per thread: the widened row tile, the queries' transposed copies and
// accumulators; the pieces of a list cut between threads), kept by a caller that attends repeatedly (a
// context: once per layer and token) so that a call neither allocates nor zeroes it. Allocated per call, MLA
// decode over 2048 rows (sparrow_cache_bench, one thread) took 0.89-1.04 ms with GLIBC_TUNABLES fixing glibc's
// default thresholds (pages handed back between calls) against 0.66 without. One workspace serves one call at a
// time.
class AttentionWorkspace {
  public:
    AttentionWorkspace();
    ~AttentionWorkspace();
    AttentionWorkspace(AttentionWorkspace &&) noexcept;
    AttentionWorkspace &operator=(AttentionWorkspace &&) noexcept;
    AttentionBuffers &buffers() { return *buffers_; }

  private:
    std::unique_ptr<AttentionBuffers> buffers_;
};

// For each query token t and head h:
//   out[t, h, :] = sum_j softmax_j(scale * q[t, h, :] . K[rows[t][j], kvh, :]) * V[rows[t][j], kvh, :]
//   q: [n_tokens, n_head, head_dim_k] f32;  out: [n_tokens, n_head, head_dim_v] f32
//   k: rows of n_head_kv * head_dim_k;  v: rows holding n_head_kv * head_dim_v from v_offset (f32/f16/bf16)
//   (MLA passes the latent store as both k and v: K = [c_kv | k_pe], V = c_kv = the first kv_lora elements)
//   rows: n_tokens lists of cache cells. An empty list gives zeros (never NaN).
// Softmax is computed online (one pass, running max and sum) in f32; rows are visited in list order.
// workspace (optional): buffers kept between calls; without it the call allocates its own.
void attention(ThreadPool &pool, const AttentionShape &shape, const float *q, int64_t n_tokens, const RowStore &k,
               const RowStore &v, std::span<const std::span<const int32_t>> rows, float *out,
               AttentionWorkspace *workspace = nullptr);

}  // namespace sparrow
