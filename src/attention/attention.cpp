#include "attention/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "attention/attention_kernels.h"
#include "core/error.h"
#include "core/prefetch.h"
#include "core/vectors.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace sparrow {

namespace {

// Cache rows converted to f32 and scored together (the score kernel takes 3 rows at a time).
constexpr int64_t kTileRows = 18;
// Rows per tile of the head-lane kernels: 16 rows x 576 f32 (MLA) = 36 KiB, within a 48 KiB L1.
constexpr int64_t kLaneTileRows = 16;
// Two prefill tokens are scored together only when their lists share at least this many leading rows. Causal
// prefill shares all of the first list; sparse selections share few rows, and run jointly those cost more in
// extra tile boundaries than the shared broadcasts save (pp512 at 16384 with selection ran 6% slower).
constexpr int64_t kMinSharedRows = 64;
// A query's row list is cut between threads (each piece with its own running softmax, merged at the end)
// only when every piece keeps at least this many rows: decode with MLA is one (token, KV head) pair, and
// without the cut one thread would do all the work. A piece costs a few us besides its rows on the head-lane path
// (its query, state and merge; a 16-row call took 5.9 us, a 64-row one 18.4) against ~0.27 us a row of MLA
// (16 heads x 1088 multiply-adds); 2-thread decode
// calls, 4 alternating runs: 128 rows 34 -> 25 us, 255 rows 65 -> 45 us with 48 instead of 128 (at 256, four
// pieces 46 against two 41; from 512 rows the same). Pieces come in whole rounds of the threads (below).
constexpr int64_t kMinSplitRows = 48;

struct Kernels {
    decltype(&attn::scalar::scores) scores;
    decltype(&attn::scalar::pv) pv;
    decltype(&attn::scalar::exp_sum) exp_sum;
};
constexpr Kernels kScalarKernels = {attn::scalar::scores, attn::scalar::pv, attn::scalar::exp_sum};
constexpr Kernels kAvx2Kernels = {attn::avx2::scores, attn::avx2::pv, attn::avx2::exp_sum};

// One query of the head-lane path (attention_kernels.h): q transposed per slice of 16 heads with the scale
// applied, and the online softmax's state per head.
struct LaneQuery {
    std::vector<float> qt;    // [group / 16][Dk][16]
    std::vector<float> acc;   // [group / 16][Dv][16]
    std::vector<float> m, l;  // [group]: running maximum and sum

    // Sizes the buffers for a call (a workspace keeps them between calls, so they may be longer); reset fills
    // what the call uses.
    void fit(int64_t group, int64_t Dk, int64_t Dv) {
        grow_to(qt, group * Dk);
        grow_to(acc, group * Dv);
        grow_to(m, group);
        grow_to(l, group);
    }
    void reset(const float *q_group, int64_t group, int64_t Dk, int64_t Dv, float scale) {
        for (int64_t g = 0; g < group; g += 16)
            attn::avx512::to_lanes16(q_group + g * Dk, Dk, Dk, scale, qt.data() + g * Dk);
        std::fill(acc.begin(), acc.begin() + group * Dv, 0.0f);
        std::fill(m.begin(), m.begin() + group, -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.begin() + group, 0.0f);
    }
};

}  // namespace

// Kept between calls by an AttentionWorkspace; every vector only grows.
struct AttentionBuffers {
    struct Thread {
        LaneQuery qa, qb;                          // head-lane path: a query (decode) or two (prefill pairs)
        std::vector<float> k_tile, v_tile;         // rows widened to f32
        std::vector<float> sa, sb;                 // scores, then weights (sa serves the head-blocked path)
        std::vector<const void *> lines;           // the next tile's cache lines
        std::vector<float> acc, run_max, run_sum;  // head-blocked path: output and online-softmax state
    };
    std::vector<Thread> threads;  // per pool thread
    // Pieces of a cut list (n_split > 1): per item and head the running max and sum, and the unnormalised output.
    std::vector<float> part_max, part_sum, part_acc;
};

namespace {

// What both paths of attention() read: the call's arguments and the plan made from them.
struct Job {
    const AttentionShape &shape;
    const float *q;
    int64_t n_tokens;
    const RowStore &k, &v;
    std::span<const std::span<const int32_t>> rows;
    float *out;
    int64_t group, Dk, Dv;                               // query heads per KV head, head widths
    int64_t k_head_bytes, v_head_bytes, v_offset_bytes;  // per KV head in a cache row
    bool v_in_k;                                         // V is read from the converted K tile (MLA)
    int64_t n_split;                                     // pieces each list is cut into (decode)
    int64_t n_items;                                     // (token, KV head, piece) items
    int64_t work;                                        // multiply-adds, to decide on threading
    AttentionBuffers &buf;                               // per-thread tiles and the pieces of cut lists

    // Cache row j of list, KV head kvh's slice of K, as stored.
    const uint8_t *k_head(std::span<const int32_t> list, int64_t j, int64_t kvh) const {
        return static_cast<const uint8_t *>(k.row(list[static_cast<size_t>(j)])) + kvh * k_head_bytes;
    }
    // Rows [j0, j0 + n) of list for KV head kvh widened to f32: K into k_tile [n, Dk], and V into v_tile [n, Dv]
    // unless it is read from the K tile (v_in_k).
    void convert_tile(std::span<const int32_t> list, int64_t j0, int64_t n, int64_t kvh, float *k_tile,
                      float *v_tile) const {
        for (int64_t j = 0; j < n; ++j) {
            convert_row_to_f32(k.type(), k_head(list, j0 + j, kvh), k_tile + j * Dk, Dk);
            if (v_in_k) continue;
            const auto *v_row = static_cast<const uint8_t *>(v.row(list[static_cast<size_t>(j0 + j)])) +
                                v_offset_bytes + kvh * v_head_bytes;
            convert_row_to_f32(v.type(), v_row, v_tile + j * Dv, Dv);
        }
    }
    // Where P.V reads V in a converted tile, and the stride of its rows.
    const float *v_base(const float *k_tile, const float *v_tile) const {
        return v_in_k ? k_tile + shape.v_offset : v_tile;
    }
    int64_t v_stride() const { return v_in_k ? Dk : Dv; }
    // Items cut this small run on the calling thread (waking the pool costs more).
    int64_t grain(int64_t n) const { return work < (int64_t(64) << 10) ? std::max<int64_t>(n, 1) : 1; }
};

// The head-lane path (16 heads per vector; attention_kernels_avx512.cpp).
void attend_lanes(ThreadPool &pool, Job &job) {
    const AttentionShape &shape = job.shape;
    const int64_t group = job.group, Dk = job.Dk, Dv = job.Dv, n_split = job.n_split;
    // Without splits (prefill), an item is two consecutive tokens: the rows their lists share (causal
    // prefill: all of the first token's) are converted once and scored for both by the x2 kernels.
    const int64_t n_lane_items = n_split > 1 ? job.n_items : (job.n_tokens + 1) / 2 * shape.n_head_kv;
    pool.parallel_for_threads(n_lane_items, job.grain(n_lane_items), [&](int ith, int64_t begin, int64_t end) {
        AttentionBuffers::Thread &tb = job.buf.threads[static_cast<size_t>(ith)];
        LaneQuery &qa = tb.qa, &qb = tb.qb;
        qa.fit(group, Dk, Dv);
        if (n_split == 1) qb.fit(group, Dk, Dv);  // query b exists only in prefill (pairs)
        grow_to(tb.k_tile, kLaneTileRows * Dk);
        if (!job.v_in_k) grow_to(tb.v_tile, kLaneTileRows * Dv);
        grow_to(tb.sa, kLaneTileRows * 16);
        grow_to(tb.sb, kLaneTileRows * 16);
        const int64_t lines_per_row = (job.k_head_bytes + 63) / 64;
        grow_to(tb.lines, kLaneTileRows * lines_per_row);
        std::vector<float> &k_tile = tb.k_tile, &v_tile = tb.v_tile, &sa = tb.sa, &sb = tb.sb;
        const void **const lines = tb.lines.data();
        // Rows [lo, hi) of list for query a, and for query b too when it is given.
        auto run = [&](LaneQuery *a, LaneQuery *b, std::span<const int32_t> list, int64_t lo, int64_t hi, int64_t kvh) {
            for (int64_t j = lo; j < std::min(hi, lo + kLaneTileRows); ++j)
                prefetch_bytes(job.k_head(list, j, kvh), job.k_head_bytes);
            for (int64_t j0 = lo; j0 < hi; j0 += kLaneTileRows) {
                const int64_t n = std::min(kLaneTileRows, hi - j0);
                // The next tile's rows, prefetched line by line inside the kernels. Written through a local
                // pointer and count: push_back reloaded the vector's fields after every store (~7% of a decode
                // call's time in a profile).
                int64_t n_lines_next = 0;
                for (int64_t j = j0 + n; j < std::min(hi, j0 + n + kLaneTileRows); ++j) {
                    const uint8_t *row = job.k_head(list, j, kvh);
                    for (int64_t l = 0; l < lines_per_row; ++l) lines[n_lines_next++] = row + 64 * l;
                }
                job.convert_tile(list, j0, n, kvh, k_tile.data(), v_tile.data());
                const float *v_base = job.v_base(k_tile.data(), v_tile.data());
                const int64_t v_stride = job.v_stride();
                for (int64_t g = 0; g < group; g += 16) {
                    // The first slice issues the prefetches, half in the scores and half in P.V.
                    const int64_t n_lines = g == 0 ? n_lines_next : 0;
                    const void *const *pf_s = lines, *const *pf_v = lines + n_lines / 2;
                    float *acc_a = a->acc.data() + g * Dv;  // [Dv][16] for this slice
                    if (!b) {
                        attn::avx512::scores16(a->qt.data() + g * Dk, k_tile.data(), Dk, n, Dk, sa.data(), pf_s,
                                               n_lines / 2);
                        attn::avx512::softmax16(sa.data(), n, a->m.data() + g, a->l.data() + g, acc_a, Dv);
                        attn::avx512::pv16(sa.data(), v_base, v_stride, n, Dv, acc_a, pf_v, n_lines - n_lines / 2);
                        continue;
                    }
                    float *acc_b = b->acc.data() + g * Dv;
                    attn::avx512::scores16x2(a->qt.data() + g * Dk, b->qt.data() + g * Dk, k_tile.data(), Dk, n, Dk,
                                             sa.data(), sb.data(), pf_s, n_lines / 2);
                    attn::avx512::softmax16(sa.data(), n, a->m.data() + g, a->l.data() + g, acc_a, Dv);
                    attn::avx512::softmax16(sb.data(), n, b->m.data() + g, b->l.data() + g, acc_b, Dv);
                    attn::avx512::pv16x2(sa.data(), sb.data(), v_base, v_stride, n, Dv, acc_a, acc_b, pf_v,
                                         n_lines - n_lines / 2);
                }
            }
        };
        auto write_out = [&](const LaneQuery &a, int64_t t, int64_t kvh) {
            for (int64_t g = 0; g < group; g += 16) {
                float inv[16];
                for (int64_t h = 0; h < 16; ++h) {
                    const float l = a.l[static_cast<size_t>(g + h)];
                    inv[h] = l > 0.0f ? 1.0f / l : 0.0f;
                }
                attn::avx512::from_lanes16(a.acc.data() + g * Dv, Dv, inv,
                                           job.out + (t * shape.n_head + kvh * group + g) * Dv, Dv);
            }
        };
        for (int64_t item = begin; item < end; ++item) {
            if (n_split > 1) {  // one piece of one token's list (decode)
                const int64_t pair = item / n_split, split = item % n_split;
                const int64_t t = pair / shape.n_head_kv, kvh = pair % shape.n_head_kv;
                const std::span<const int32_t> list = job.rows[static_cast<size_t>(t)];
                const int64_t len = static_cast<int64_t>(list.size());
                qa.reset(job.q + (t * shape.n_head + kvh * group) * Dk, group, Dk, Dv, shape.scale);
                run(&qa, nullptr, list, len * split / n_split, len * (split + 1) / n_split, kvh);
                // The piece's state as it is, in the lane layout: merge16 reads it so.
                std::copy_n(qa.m.begin(), group, job.buf.part_max.begin() + item * group);
                std::copy_n(qa.l.begin(), group, job.buf.part_sum.begin() + item * group);
                std::copy_n(qa.acc.begin(), group * Dv, job.buf.part_acc.begin() + item * group * Dv);
                continue;
            }
            const int64_t kvh = item % shape.n_head_kv, t0 = item / shape.n_head_kv * 2, t1 = t0 + 1;
            const std::span<const int32_t> la = job.rows[static_cast<size_t>(t0)];
            qa.reset(job.q + (t0 * shape.n_head + kvh * group) * Dk, group, Dk, Dv, shape.scale);
            if (t1 >= job.n_tokens) {
                run(&qa, nullptr, la, 0, static_cast<int64_t>(la.size()), kvh);
                write_out(qa, t0, kvh);
                continue;
            }
            const std::span<const int32_t> lb = job.rows[static_cast<size_t>(t1)];
            qb.reset(job.q + (t1 * shape.n_head + kvh * group) * Dk, group, Dk, Dv, shape.scale);
            const size_t shorter = std::min(la.size(), lb.size());
            auto common = static_cast<int64_t>(
                std::mismatch(la.begin(), la.begin() + static_cast<std::ptrdiff_t>(shorter), lb.begin()).first -
                la.begin());
            if (common < kMinSharedRows) common = 0;
            run(&qa, &qb, la, 0, common, kvh);
            run(&qa, nullptr, la, common, static_cast<int64_t>(la.size()), kvh);
            run(&qb, nullptr, lb, common, static_cast<int64_t>(lb.size()), kvh);
            write_out(qa, t0, kvh);
            write_out(qb, t1, kvh);
        }
    });
}

// The head-blocked path (scalar or AVX2 kernels): an item is one token x one KV head x one piece of its list.
void attend_blocked(ThreadPool &pool, Job &job) {
    const AttentionShape &shape = job.shape;
    const int64_t group = job.group, Dk = job.Dk, Dv = job.Dv, n_split = job.n_split;
    const Kernels &kern = cpu::kernels().isa == cpu::Isa::scalar ? kScalarKernels : kAvx2Kernels;
    pool.parallel_for_threads(job.n_items, job.grain(job.n_items), [&](int ith, int64_t begin, int64_t end) {
        AttentionBuffers::Thread &tb = job.buf.threads[static_cast<size_t>(ith)];
        grow_to(tb.acc, group * Dv);
        grow_to(tb.run_max, group);
        grow_to(tb.run_sum, group);
        grow_to(tb.k_tile, kTileRows * Dk);
        if (!job.v_in_k) grow_to(tb.v_tile, kTileRows * Dv);  // MLA reads V from k_tile
        grow_to(tb.sa, group * kTileRows);                    // scores, then weights, [group, tile]
        const std::span<float> acc(tb.acc.data(), static_cast<size_t>(group * Dv));
        const std::span<float> run_max(tb.run_max.data(), static_cast<size_t>(group));
        const std::span<float> run_sum(tb.run_sum.data(), static_cast<size_t>(group));
        float *const k_tile = tb.k_tile.data(), *const v_tile = tb.v_tile.data(), *const s = tb.sa.data();
        for (int64_t item = begin; item < end; ++item) {
            const int64_t pair = item / n_split, split = item % n_split;
            const int64_t t = pair / shape.n_head_kv, kvh = pair % shape.n_head_kv;
            const std::span<const int32_t> list = job.rows[static_cast<size_t>(t)];
            const int64_t len = static_cast<int64_t>(list.size());
            const int64_t lo = len * split / n_split, hi = len * (split + 1) / n_split;
            std::fill(acc.begin(), acc.end(), 0.0f);
            std::fill(run_max.begin(), run_max.end(), -std::numeric_limits<float>::infinity());
            std::fill(run_sum.begin(), run_sum.end(), 0.0f);
            const float *q_group = job.q + (t * shape.n_head + kvh * group) * Dk;  // [group, Dk]
            for (int64_t j = lo; j < std::min(hi, lo + kTileRows); ++j)
                prefetch_bytes(job.k_head(list, j, kvh), job.k_head_bytes);
            for (int64_t j0 = lo; j0 < hi; j0 += kTileRows) {
                const int64_t n = std::min(kTileRows, hi - j0);
                for (int64_t j = j0 + n; j < std::min(hi, j0 + n + kTileRows); ++j)
                    prefetch_bytes(job.k_head(list, j, kvh), job.k_head_bytes);
                job.convert_tile(list, j0, n, kvh, k_tile, v_tile);
                kern.scores(q_group, Dk, group, k_tile, Dk, n, Dk, shape.scale, s, kTileRows);
                // Online softmax: scores become weights exp(s - running max) in place.
                for (int64_t g = 0; g < group; ++g) {
                    float *s_g = s + g * kTileRows;
                    float tile_max = -std::numeric_limits<float>::infinity();
                    for (int64_t j = 0; j < n; ++j) tile_max = std::max(tile_max, s_g[j]);
                    if (tile_max > run_max[g]) {  // new maximum: rescale what has been accumulated so far
                        const float factor = std::exp(run_max[g] - tile_max);
                        float *acc_g = acc.data() + g * Dv;
                        for (int64_t i = 0; i < Dv; ++i) acc_g[i] *= factor;
                        run_sum[g] *= factor;
                        run_max[g] = tile_max;
                    }
                    run_sum[g] += kern.exp_sum(s_g, n, run_max[g]);
                }
                kern.pv(s, kTileRows, group, job.v_base(k_tile, v_tile), job.v_stride(), n, Dv, acc.data());
            }
            if (n_split == 1) {
                for (int64_t g = 0; g < group; ++g) {
                    float *o = job.out + (t * shape.n_head + kvh * group + g) * Dv;
                    const float inv = run_sum[g] > 0.0f ? 1.0f / run_sum[g] : 0.0f;
                    for (int64_t i = 0; i < Dv; ++i) o[i] = acc[static_cast<size_t>(g * Dv + i)] * inv;
                }
            } else {
                std::copy(run_max.begin(), run_max.end(), job.buf.part_max.begin() + item * group);
                std::copy(run_sum.begin(), run_sum.end(), job.buf.part_sum.begin() + item * group);
                std::copy(acc.begin(), acc.end(), job.buf.part_acc.begin() + item * group * Dv);
            }
        }
    });
}

}  // namespace

void attention(ThreadPool &pool, const AttentionShape &shape, const float *q, int64_t n_tokens, const RowStore &k,
               const RowStore &v, std::span<const std::span<const int32_t>> rows, float *out,
               AttentionWorkspace *workspace) {
    SPARROW_ASSERT(shape.n_head % shape.n_head_kv == 0);
    SPARROW_ASSERT(k.width() == shape.n_head_kv * shape.head_dim_k);
    SPARROW_ASSERT(v.width() >= shape.v_offset + shape.n_head_kv * shape.head_dim_v);
    const int64_t group = shape.n_head / shape.n_head_kv;  // query heads per KV head
    const int64_t Dk = shape.head_dim_k, Dv = shape.head_dim_v;
    const int64_t k_head_bytes = dtype_row_size(k.type(), Dk);
    const int64_t v_head_bytes = dtype_row_size(v.type(), Dv);
    const int64_t v_offset_bytes = dtype_row_size(v.type(), shape.v_offset);

    // One work item = one token x one KV head x one piece of its row list: the group's query heads share
    // each converted K/V row. Small problems run on the calling thread: waking the pool costs more.
    int64_t n_row_visits = 0, max_len = 0;
    for (const auto &r : rows) {
        n_row_visits += static_cast<int64_t>(r.size());
        max_len = std::max(max_len, static_cast<int64_t>(r.size()));
    }
    const int64_t work = n_row_visits * shape.n_head * (Dk + Dv);
    const int64_t n_pairs = n_tokens * shape.n_head_kv;
    const int n_threads = pool.n_threads();
    int64_t n_split = 1;
    if (n_threads > 1 && n_pairs > 0 && n_pairs < 2 * n_threads) {
        const int64_t want = (2 * n_threads + n_pairs - 1) / n_pairs;
        n_split = std::clamp<int64_t>(max_len / kMinSplitRows, 1, want);
        if (n_split > n_threads) n_split -= n_split % n_threads;  // whole rounds: 3 pieces on 2 threads wait on one
    }
    const int64_t n_items = n_pairs * n_split;
    // K and V rows of f16/bf16 caches are converted to f32 once per tile and then shared by the group's
    // heads (MLA has 16-128 query heads per latent row). When V is a slice of the same row as K (MLA:
    // V = c_kv, the first kv_lora elements of [c_kv | k_pe]), it is read from the converted K tile.
    const bool v_in_k = &v == &k && shape.v_offset >= 0 && shape.n_head_kv == 1 && shape.v_offset + Dv <= Dk;
    // The head-lane kernels (16 heads per vector) serve KV heads read by a multiple of 16 query heads (MLA)
    // where AVX-512 exists; everything else takes the head-blocked kernels.
    const bool lanes = cpu::kernels().isa == cpu::Isa::avx512 && group % 16 == 0;
    std::optional<AttentionWorkspace> own;  // this call's buffers when the caller keeps none
    AttentionBuffers &buffers = workspace ? workspace->buffers() : own.emplace().buffers();
    if (buffers.threads.size() < static_cast<size_t>(n_threads)) buffers.threads.resize(static_cast<size_t>(n_threads));
    Job job{.shape = shape,
            .q = q,
            .n_tokens = n_tokens,
            .k = k,
            .v = v,
            .rows = rows,
            .out = out,
            .group = group,
            .Dk = Dk,
            .Dv = Dv,
            .k_head_bytes = k_head_bytes,
            .v_head_bytes = v_head_bytes,
            .v_offset_bytes = v_offset_bytes,
            .v_in_k = v_in_k,
            .n_split = n_split,
            .n_items = n_items,
            .work = work,
            .buf = buffers};
    if (n_split > 1) {
        grow_to(buffers.part_max, n_items * group);
        grow_to(buffers.part_sum, n_items * group);
        grow_to(buffers.part_acc, n_items * group * Dv);
    }
    if (lanes) {
        attend_lanes(pool, job);
    } else {
        attend_blocked(pool, job);
    }
    if (n_split == 1) return;
    std::vector<float> &part_max = buffers.part_max;  // merge16 leaves its scale factors there
    const std::vector<float> &part_sum = buffers.part_sum, &part_acc = buffers.part_acc;
    // Merge the pieces of each (token, KV head): rescale each piece to the common maximum. The head-lane path
    // left its pieces in the lane layout, [pieces][group / 16][Dv][16].
    if (lanes) {
        for (int64_t pair = 0; pair < n_pairs; ++pair) {
            const int64_t t = pair / shape.n_head_kv, kvh = pair % shape.n_head_kv, it0 = pair * n_split;
            for (int64_t g = 0; g < group; g += 16) {
                attn::avx512::merge16(part_acc.data() + it0 * group * Dv + g * Dv, group * Dv,
                                      part_max.data() + it0 * group + g, part_sum.data() + it0 * group + g, group,
                                      n_split, Dv, out + (t * shape.n_head + kvh * group + g) * Dv, Dv);
            }
        }
        return;
    }
    for (int64_t pair = 0; pair < n_pairs; ++pair) {
        const int64_t t = pair / shape.n_head_kv, kvh = pair % shape.n_head_kv;
        for (int64_t g = 0; g < group; ++g) {
            float *o = out + (t * shape.n_head + kvh * group + g) * Dv;
            std::fill(o, o + Dv, 0.0f);
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t sp = 0; sp < n_split; ++sp)
                m = std::max(m, part_max[static_cast<size_t>((pair * n_split + sp) * group + g)]);
            if (m == -std::numeric_limits<float>::infinity()) continue;
            float total = 0.0f;
            for (int64_t sp = 0; sp < n_split; ++sp) {
                const int64_t it = pair * n_split + sp;
                const float f = std::exp(part_max[static_cast<size_t>(it * group + g)] - m);
                total += f * part_sum[static_cast<size_t>(it * group + g)];
                const float *a = part_acc.data() + (it * group + g) * Dv;
                for (int64_t i = 0; i < Dv; ++i) o[i] += f * a[i];
            }
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
            for (int64_t i = 0; i < Dv; ++i) o[i] *= inv;
        }
    }
}

AttentionWorkspace::AttentionWorkspace() : buffers_(std::make_unique<AttentionBuffers>()) {}
AttentionWorkspace::~AttentionWorkspace() = default;
AttentionWorkspace::AttentionWorkspace(AttentionWorkspace &&) noexcept = default;
AttentionWorkspace &AttentionWorkspace::operator=(AttentionWorkspace &&) noexcept = default;

}  // namespace sparrow
