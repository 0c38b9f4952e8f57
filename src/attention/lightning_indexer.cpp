// The lightning indexer's selection (contract in lightning_indexer.h).
//
// Plan of one call:
//  1. Queries with at most top_k candidates take them all. The others ("scored") are sorted by (precision,
//     first candidate cell, candidate count descending) and cut into chunks of up to kTileQueries. The
//     first query of a chunk is its leader (the longest list); every member records the length of the
//     prefix its list shares with the leader's. Queries of one sequence in a ubatch see prefixes of the same
//     cell list, so in a causal prefill the whole chunk shares the leader's keys.
//  2. Work items are (chunk, split of the leader's list). An item walks its split in tiles of kTileKeys
//     keys; each tile is converted once (f16/bf16 -> f32 for exact, f32/f16/bf16 -> int8 for fast) and
//     scored against every member whose prefix covers it, and the scores go straight into that member's
//     bounded top-k for this split. The last split also scores each member's own tail (the candidates
//     past its shared prefix), one query at a time. Splits exist only to give threads work when there are
//     few chunks (decode); with many chunks there is one split per chunk.
//  3. Per scored query, the splits' top-k sets are merged (select_best, a radix select), the winners put
//     into candidate order and mapped to cells. Fast mode's exact re-scoring of the band around the cut
//     (below) runs between the merge and the choice, cut into pieces over the threads: in decode there is
//     one query, and its merge and choice are the only serial part of the call.
// Fast mode (int8 products) is two-stage, so that its selection stays that of exact mode except where the
// int8 rounding moves a key by more than a margin m of ranks: the int8 scores keep the best top_k + m keys
// per query; of those, the best top_k - m by int8 score are taken, and the 2m around the cut are re-scored
// exactly (f32, as exact mode) to decide which m of them complete the selection. The re-scoring reads 2m
// keys per query against the context's n, so fast mode costs about its int8 pass.
// Memory: per thread, one chunk's prepared queries and one key tile; per scored query, n_split top-k
// buffers of 2 * (top_k + m) entries.
//
// Ranking: entry a beats b when a.score > b.score, or the scores are equal and a has the lower candidate
// index (the earlier position). A NaN score ranks as -inf, so it never beats a finite score. Fast mode
// scores a query with the exact kernels when its q or w holds a non-finite value (int8 scales would be
// meaningless).
//
// The margin: top_k / 8 + 16 ranks (at most top_k), 272 at top-k 2048: int8 keys and 8-bit queries (6-bit on
// AVX2 without VNNI: indexer_kernels.h) move a score by well under that many ranks on the test models (the
// Jaccard tests check, with and without outlier channels).
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "attention/indexer_internal.h"
#include "attention/indexer_kernels.h"
#include "attention/lightning_indexer.h"
#include "attention/top_k_select.h"
#include "core/error.h"
#include "core/prefetch.h"
#include "core/vectors.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace sparrow {

namespace {

constexpr int64_t kTileKeys = 64;     // keys converted per tile: 64 x 128 f32 = 32 KiB, 8 KiB as int8
constexpr int64_t kTileQueries = 16;  // queries sharing each converted key tile
// Below this many multiply-adds a call runs on the calling thread: waking the pool costs more.
constexpr int64_t kMinParallelWork = int64_t(1) << 21;
// Queries per chunk of the parallel per-query phases (merge, choice); with this many or fewer scored queries the
// merges are dealt one query at a time instead (a 16K-key merge takes ~50 us).
constexpr int64_t kMergeGrain = 8;

struct Kernels {
    decltype(&indexer::scalar::score_f32) score_f32;
    decltype(&indexer::scalar::score_i8) score_i8;
    decltype(&indexer::scalar::score_q8_0) score_q8_0;
    decltype(&indexer::scalar::convert_rows) convert_rows;
    decltype(&indexer::scalar::quantize_keys) quantize_keys;
    bool avx512_select;    // select_best's AVX-512 loops (top_k_select.h)
    int32_t query_offset;  // fast mode's query bytes: q_int + query_offset (indexer_kernels.h)
};
// Scalar and VNNI (AVX-VNNI, AVX512-VNNI) kernels take 8-bit queries; AVX2's maddubs pairs need 6-bit ones
// (indexer_kernels.h).
constexpr Kernels kScalarKernels = {indexer::scalar::score_f32,     indexer::scalar::score_i8,
                                    indexer::scalar::score_q8_0,    indexer::scalar::convert_rows,
                                    indexer::scalar::quantize_keys, false,
                                    indexer::kQueryOffsetDpbusd};
constexpr Kernels kAvx2Kernels = {indexer::avx2::score_f32,    indexer::avx2::score_i8,      indexer::avx2::score_q8_0,
                                  indexer::avx2::convert_rows, indexer::avx2::quantize_keys, false,
                                  indexer::kQueryOffsetMaddubs};
// AVX2 with AVX-VNNI: the int8 scores in one VEX vpdpbusd per 8 heads x 4 elements, so 8-bit queries.
constexpr Kernels kAvx2VnniKernels = {indexer::avx2::score_f32,          indexer::avx2::score_i8_avxvnni,
                                      indexer::avx2::score_q8_0_avxvnni, indexer::avx2::convert_rows,
                                      indexer::avx2::quantize_keys,      false,
                                      indexer::kQueryOffsetDpbusd};
// AVX-512: the exact score 16 heads per vector and the top-k select's vector loops; with VNNI also the int8
// scores in one vpdpbusd per 8 heads x 4 elements (3 instructions on AVX2).
constexpr Kernels kAvx512Kernels = {indexer::avx512::score_f32,   indexer::avx2::score_i8,
                                    indexer::avx2::score_q8_0,    indexer::avx2::convert_rows,
                                    indexer::avx2::quantize_keys, true,
                                    indexer::kQueryOffsetMaddubs};
constexpr Kernels kVnniKernels = {indexer::avx512::score_f32,      indexer::avx512vnni::score_i8,
                                  indexer::avx512vnni::score_q8_0, indexer::avx2::convert_rows,
                                  indexer::avx2::quantize_keys,    true,
                                  indexer::kQueryOffsetDpbusd};

// The kernel set of an ISA level (the avx2 level takes AVX-VNNI's int8 scores, the avx512 level AVX512-VNNI's,
// when cpuid has them).
const Kernels &indexer_kernels_for(cpu::Isa isa) {
    if (isa == cpu::Isa::scalar) return kScalarKernels;
    if (isa == cpu::Isa::avx2) return cpu::cpu_has_avx_vnni() ? kAvx2VnniKernels : kAvx2Kernels;
    return cpu::cpu_has_avx512_vnni() ? kVnniKernels : kAvx512Kernels;
}

using Entry = indexer::ScoredIndex;  // score (NaN already replaced by -inf), index into the query's candidates
using indexer::ranks_before;

// A bounded top-k over 2 * k entries of caller-owned storage: keys that beat the threshold are appended;
// when the buffer fills, select_best (a radix select) keeps the best k and the k-th best becomes the new
// threshold. Most keys are rejected by one comparison with the threshold, and an accepted one costs O(1)
// amortised (a heap would pay log k, with unpredictable branches, per accepted key).
struct TopK {
    Entry *data = nullptr;
    int64_t k = 0;
    int64_t size = 0;
    Entry threshold{-std::numeric_limits<float>::infinity(), -1};  // idx -1: none yet, accept everything

    // The scores of candidates idx0, idx0 + 1, ... in turn. The size and threshold live in locals for the loop:
    // stores through data could alias the members, so a per-key push reloaded them for every key.
    void push_all(const float *scores, int64_t n, int32_t idx0, std::vector<uint64_t> &scratch, bool avx512) {
        Entry *const d = data;
        int64_t sz = size;
        Entry th = threshold;
        for (int64_t j = 0; j < n; ++j) {
            const float score = scores[j];
            const Entry e{score == score ? score : -std::numeric_limits<float>::infinity(),
                          idx0 + static_cast<int32_t>(j)};
            if (th.idx >= 0 && !ranks_before(e, th)) continue;
            d[sz++] = e;
            if (sz == 2 * k) {
                indexer::select_best(d, sz, k, scratch, avx512);
                sz = k;
                th = d[k - 1];
            }
        }
        size = sz;
        threshold = th;
    }
};

struct ScoredQuery {
    int64_t t = 0;       // token index
    int64_t prefix = 0;  // candidates shared with the chunk leader's list (the first `prefix` of both)
    bool fast = false;   // int8 kernels (fast mode and finite q, w)
};

struct Chunk {
    int64_t begin = 0, end = 0;  // range of the sorted scored queries; begin is the leader
};

bool all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) return false;
    }
    return true;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Per-thread buffers, sized once per call for the largest chunk (`members` queries; 1 in decode).
struct Scratch {
    // exact: [members, d, hp] transposed q and [members, hp] w
    std::vector<float> qT, w;
    // fast: [members, dp / 4, hp, 4] offset uint8 q and [members, hp] w * q scale
    std::vector<uint8_t> qT4;
    std::vector<float> wq;
    std::vector<float> q_rot;  // [n_head, d] one query rotated by the keys' int8 rotation
    // one key tile: row pointers, f32 rows [kTileKeys, d], int8 rows [kTileKeys, dp] with scales and sums,
    // scores
    std::vector<const void *> rows;
    std::vector<const void *> rows_f32;  // the rows as f32 (rows_to_f32)
    std::vector<float> tile_f32;
    std::vector<int8_t> tile_i8;
    std::vector<float> kscale;
    std::vector<int32_t> ksum;
    std::vector<float> scores;
    std::vector<uint64_t> select;  // select_best's keys, indices_in_order's bitmap
    // What qT / w and qT4 / wq hold, so a thread that takes several splits of one chunk (decode) prepares
    // its queries once: the chunk whose members are in the slots (-1: none), the query in exact slot 0.
    int64_t prepared_chunk = -1;
    int64_t exact_slot0_pos = -1;

    // Sizes the buffers for a call (they only grow: a workspace keeps them between calls) and forgets what
    // the slots held.
    void fit(int64_t d, int64_t dp, int64_t hp, int64_t members) {
        grow_to(qT, members * d * hp);
        grow_to(w, members * hp);
        grow_to(qT4, members * dp * hp);
        grow_to(wq, members * hp);
        grow_to(q_rot, hp * d);
        grow_to(rows, kTileKeys);
        grow_to(rows_f32, kTileKeys);
        grow_to(tile_f32, kTileKeys * d);
        grow_to(tile_i8, kTileKeys * dp);
        grow_to(kscale, kTileKeys);
        grow_to(ksum, kTileKeys);
        grow_to(scores, kTileKeys);
        prepared_chunk = -1;
        exact_slot0_pos = -1;
    }
};

int64_t fast_margin(int64_t top_k) { return std::min(top_k, top_k / 8 + 16); }

// Per scored query after merge_splits, whose entries are at heap(pos, 0).data: the band [sure, keep) of int8
// ranks that is re-scored exactly (fast mode; empty, sure = keep = top_k, in exact mode).
struct Merged {
    int64_t sure = 0, keep = 0;
};

// A piece of fast mode's exact re-scoring: entries [begin, end) of query pos's merged entries.
struct Piece {
    int64_t pos, begin, end;
};

}  // namespace

namespace indexer {

// What a call builds and fills, kept in an IndexerWorkspace between calls (every vector only grows).
struct Buffers {
    std::vector<ScoredQuery> scored;  // sorted into chunks
    std::vector<Chunk> chunks;
    // [n_scored, n_split, 2 * keep]: storage of the top-k buffers (a buffer's entries past its size are never
    // read, so growing it is the only time it is written before use)
    std::vector<Entry> entries;
    std::vector<TopK> heaps;  // [n_scored, n_split]
    // [n_scored, n_split]: each query's split buffers and their sizes as merge_splits hands them to
    // gather_candidates (one query's slots are written only by the thread that merges it)
    std::vector<Entry *> split_parts;
    std::vector<int64_t> split_sizes;
    std::vector<Merged> merged;
    std::vector<Piece> pieces;
    std::vector<Scratch> scratch;               // per pool thread
    std::vector<std::vector<uint64_t>> select;  // per pool thread: select_best's keys, indices_in_order's bitmap
};

}  // namespace indexer

namespace {

class Selector {
  public:
    Selector(const Kernels &kernels, const IndexerShape &shape, const float *q, const float *w, const RowStore &keys,
             std::span<const std::span<const int32_t>> candidates, int64_t top_k, indexer::Buffers &buffers,
             SelectionPhaseSeconds *phases, const std::function<void()> &beside_merge)
        : b_(buffers),
          phases_(phases),
          beside_merge_(beside_merge),
          k_(kernels),
          n_head_(shape.n_head),
          d_(shape.head_dim),
          hp_(round_up(shape.n_head, 8)),
          dp_(indexer_int8_width(shape.head_dim)),
          q_(q),
          w_(w),
          keys_(keys),
          int8_rot_(keys.int8_rotation()),
          cand_(candidates),
          top_k_(top_k),
          margin_(fast_margin(top_k)) {}

    void run(ThreadPool &pool, IndexerPrecision precision, int64_t n_tokens,
             std::vector<std::vector<int32_t>> &selected);

  private:
    void plan(IndexerPrecision precision, int64_t n_tokens, int n_threads);
    void prepare_query(Scratch &s, int64_t slot, const ScoredQuery &sq) const;
    void run_item(Scratch &s, int64_t item);
    // Scores candidates [k0, k1) of `cells` (k1 - k0 <= kTileKeys) for chunk members [m0, m1) up to their
    // own limits limit[m] (keys past a member's limit are not its candidates), into the members' heaps.
    void score_tile(Scratch &s, const Chunk &c, int64_t split, std::span<const int32_t> cells, int64_t k0, int64_t k1,
                    int64_t m0, int64_t m1, bool tail);
    // finish, in three steps so that the exact re-scoring of fast mode spreads over the threads even when
    // there is one query (decode): merge_splits, then rescore_exact over pieces of the band, then choose.
    void merge_splits(std::vector<uint64_t> &select, int64_t pos);
    void choose(std::vector<uint64_t> &select, int64_t pos, std::vector<int32_t> &out);
    // Replaces the scores of entries e[0, n) of scored query `pos` by exact (f32) ones.
    void rescore_exact(Scratch &s, int64_t pos, Entry *e, int64_t n);
    void rows_to_f32(Scratch &s, int64_t n) const;

    TopK &heap(int64_t pos, int64_t split) { return b_.heaps[static_cast<size_t>(pos * n_split_ + split)]; }

    indexer::Buffers &b_;            // the call's storage: queries, chunks, top-k buffers, per-thread scratch
    SelectionPhaseSeconds *phases_;  // where the phases' times are added (null: not timed)
    const std::function<void()> &beside_merge_;  // the caller's work for threads the merge leaves idle (may be empty)
    const Kernels &k_;
    const int64_t n_head_, d_, hp_, dp_;
    const float *q_, *w_;
    const RowStore &keys_;
    const RowRotation &int8_rot_;  // carried by int8 keys beyond the stored rows' own (RowStore::int8_rotation)
    std::span<const std::span<const int32_t>> cand_;
    const int64_t top_k_;
    const int64_t margin_;  // fast mode: ranks re-scored exactly on each side of the cut

    int64_t max_members_ = 1;  // queries in the largest chunk
    int64_t n_split_ = 1;
};

void Selector::plan(IndexerPrecision precision, int64_t n_tokens, int n_threads) {
    b_.scored.clear();
    b_.chunks.clear();
    for (int64_t t = 0; t < n_tokens; ++t) {
        if (static_cast<int64_t>(cand_[static_cast<size_t>(t)].size()) <= top_k_) continue;
        const bool fast = precision == IndexerPrecision::fast && all_finite(q_ + t * n_head_ * d_, n_head_ * d_) &&
                          all_finite(w_ + t * n_head_, n_head_);
        b_.scored.push_back({t, 0, fast});
    }
    auto list = [&](const ScoredQuery &sq) { return cand_[static_cast<size_t>(sq.t)]; };
    std::sort(b_.scored.begin(), b_.scored.end(), [&](const ScoredQuery &a, const ScoredQuery &b) {
        if (a.fast != b.fast) return a.fast < b.fast;
        const int32_t fa = list(a).front(), fb = list(b).front();
        if (fa != fb) return fa < fb;
        if (list(a).size() != list(b).size()) return list(a).size() > list(b).size();
        return a.t < b.t;
    });
    int64_t max_len = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(b_.scored.size());) {
        const ScoredQuery &lead = b_.scored[static_cast<size_t>(i)];
        const auto lead_list = list(lead);
        Chunk c{i, i};
        while (c.end < static_cast<int64_t>(b_.scored.size()) && c.end - c.begin < kTileQueries) {
            ScoredQuery &m = b_.scored[static_cast<size_t>(c.end)];
            const auto m_list = list(m);
            if (m.fast != lead.fast || m_list.front() != lead_list.front()) break;
            // Lists of one sequence are usually views of one array: then the prefix needs no comparison.
            if (m_list.data() == lead_list.data()) {
                m.prefix = static_cast<int64_t>(m_list.size());
            } else {
                m.prefix = std::mismatch(m_list.begin(), m_list.end(), lead_list.begin()).first - m_list.begin();
            }
            ++c.end;
        }
        max_len = std::max(max_len, static_cast<int64_t>(lead_list.size()));
        max_members_ = std::max(max_members_, c.end - c.begin);
        b_.chunks.push_back(c);
        i = c.end;
    }
    // Splits give idle threads work when there are fewer chunks than threads (decode): two per thread, of at
    // least 8 tiles. A split shorter than 2 * top_k never fills its buffer, so it selects nothing and the
    // merge in finish() sees all its keys: one O(context) select on one thread, against scoring the
    // context (heads x width multiply-adds per key) spread over the threads (16 threads at 16K keys: 32
    // splits of 512 keys instead of 8 of 2048). On few threads the splits stay long (2 threads: 4 of 4096).
    const int64_t n_chunks = static_cast<int64_t>(b_.chunks.size());
    if (n_threads > 1 && n_chunks > 0 && n_chunks < 2 * n_threads) {
        const int64_t want = (2 * n_threads + n_chunks - 1) / n_chunks;
        const int64_t min_split = 8 * kTileKeys;
        n_split_ = std::clamp<int64_t>(max_len / min_split, 1, want);
    }
    // Fast queries keep top_k + margin per split (the re-scoring needs the keys just past the cut).
    const bool any_fast = std::any_of(b_.scored.begin(), b_.scored.end(), [](const ScoredQuery &q) { return q.fast; });
    const int64_t max_keep = top_k_ + (any_fast ? margin_ : 0);
    const size_t n_entries = b_.scored.size() * static_cast<size_t>(n_split_ * 2 * max_keep);
    if (b_.entries.size() < n_entries) b_.entries.resize(n_entries);
    b_.heaps.assign(b_.scored.size() * static_cast<size_t>(n_split_), TopK{});
    if (b_.split_parts.size() < b_.heaps.size()) {
        b_.split_parts.resize(b_.heaps.size());
        b_.split_sizes.resize(b_.heaps.size());
    }
    for (size_t i = 0; i < b_.heaps.size(); ++i) {
        const bool fast = b_.scored[i / static_cast<size_t>(n_split_)].fast;
        b_.heaps[i] = TopK{b_.entries.data() + i * static_cast<size_t>(2 * max_keep), top_k_ + (fast ? margin_ : 0)};
    }
}

// Query `sq` into slot `slot` of the chunk's prepared queries.
void Selector::prepare_query(Scratch &s, int64_t slot, const ScoredQuery &sq) const {
    const float *q = q_ + sq.t * n_head_ * d_;  // [n_head, d]
    const float *w = w_ + sq.t * n_head_;       // [n_head]
    if (!sq.fast) {
        float *qT = s.qT.data() + slot * d_ * hp_;  // [d, hp]
        float *wp = s.w.data() + slot * hp_;
        std::fill(qT, qT + d_ * hp_, 0.0f);
        std::fill(wp, wp + hp_, 0.0f);
        for (int64_t h = 0; h < n_head_; ++h) {
            for (int64_t i = 0; i < d_; ++i) qT[i * hp_ + h] = q[h * d_ + i];
            wp[h] = w[h];
        }
        return;
    }
    if (!int8_rot_.empty()) {  // int8 keys are of rotated rows: so is the query they meet
        std::copy_n(q, n_head_ * d_, s.q_rot.data());
        int8_rot_.apply(s.q_rot.data(), n_head_);
        q = s.q_rot.data();
    }
    // Per head: q_int = round(q * qmax / max|q|) in [-qmax, qmax], stored + the kernels' query offset
    // (qmax = offset - 1); the head's scale max|q| / qmax goes into w. Padding (elements and heads) is q 0.
    const int offset = k_.query_offset, qmax = offset - 1;
    uint8_t *qT4 = s.qT4.data() + slot * dp_ * hp_;  // [dp / 4, hp, 4]
    float *wq = s.wq.data() + slot * hp_;
    std::fill(qT4, qT4 + dp_ * hp_, static_cast<uint8_t>(offset));
    std::fill(wq, wq + hp_, 0.0f);
    for (int64_t h = 0; h < n_head_; ++h) {
        const float *qh = q + h * d_;
        // max |q| over eight running maxima: one chain of maxss waited ~4 cycles per element (q is finite here:
        // a non-finite query takes the exact kernels).
        float lane_max[8] = {};
        for (int64_t i = 0; i < d_; ++i) lane_max[i % 8] = std::max(lane_max[i % 8], std::fabs(qh[i]));
        const float amax = *std::max_element(lane_max, lane_max + 8);
        if (amax == 0.0f) continue;
        const float inv = float(qmax) / amax;
        for (int64_t i = 0; i < d_; ++i) {
            // Round half to even without a libm call: |x| <= qmax, and adding and taking away 1.5 * 2^23 leaves x
            // rounded to an integer in the default rounding mode, as nearbyint does.
            constexpr float kRound = 12582912.0f;
            const float r = std::clamp((qh[i] * inv + kRound) - kRound, -float(qmax), float(qmax));
            qT4[((i / 4) * hp_ + h) * 4 + i % 4] = static_cast<uint8_t>(static_cast<int>(r) + offset);
        }
        wq[h] = w[h] * (amax / float(qmax));
    }
}

// s.rows_f32[j] for the key rows s.rows[0..n): the rows themselves when stored as f32, else converted into
// s.tile_f32 (f16 / bf16 by the indexer's converter, Q8_0 / Q4_0 by ops.h's dequantiser).
void Selector::rows_to_f32(Scratch &s, int64_t n) const {
    const DType type = keys_.type();
    for (int64_t j = 0; j < n; ++j) {
        float *dst = s.tile_f32.data() + j * d_;
        if (type == DType::F32) {
            s.rows_f32[static_cast<size_t>(j)] = static_cast<const float *>(s.rows[static_cast<size_t>(j)]);
            continue;
        }
        if (dtype_is_quantized(type)) convert_row_to_f32(type, s.rows[static_cast<size_t>(j)], dst, d_);
        s.rows_f32[static_cast<size_t>(j)] = dst;
    }
    if (type == DType::F16 || type == DType::BF16) {
        k_.convert_rows(static_cast<uint32_t>(type), s.rows.data(), n, d_, s.tile_f32.data());
    }
}

void Selector::score_tile(Scratch &s, const Chunk &c, int64_t split, std::span<const int32_t> cells, int64_t k0,
                          int64_t k1, int64_t m0, int64_t m1, bool tail) {
    const int64_t n = k1 - k0;
    const bool fast = b_.scored[static_cast<size_t>(c.begin)].fast;
    const bool quantized = dtype_is_quantized(keys_.type());
    // Exact mode: the score kernel widens f32 / f16 / bf16 rows itself, key by key, which suits a tile scored by
    // one query (decode); a tile several queries share is widened to f32 once, as are Q8_0 / Q4_0 rows.
    // Fast mode reads Q8_0 rows as stored (int8 with block scales); other rows are re-quantised to int8, from
    // f32 rows when they are Q4_0.
    const bool shared = m1 - m0 > 1;
    const bool q8_direct = fast && keys_.type() == DType::Q8_0;
    // The store's int8 copy holds what quantize_keys would compute here (the same quantiser, bit-identical
    // across ISA levels): gather it instead.
    const bool int8_copy = fast && !q8_direct && keys_.has_int8_copy() && keys_.int8_width() == dp_;
    // Keys quantised here are of rows rotated by the int8 rotation (as the store's int8 copy): widened to f32,
    // then rotated in the tile.
    const bool rotate_keys = fast && !q8_direct && !int8_copy && !int8_rot_.empty();
    const bool widen_tile = fast ? ((quantized || rotate_keys) && !q8_direct && !int8_copy) : (quantized || shared);
    if (!int8_copy) {
        for (int64_t j = 0; j < n; ++j) s.rows[static_cast<size_t>(j)] = keys_.row(cells[static_cast<size_t>(k0 + j)]);
    }
    if (widen_tile) rows_to_f32(s, n);
    if (rotate_keys) {
        for (int64_t j = 0; j < n; ++j) {  // f32 rows are read in place by rows_to_f32: copy them before rotating
            float *dst = s.tile_f32.data() + j * d_;
            if (s.rows_f32[static_cast<size_t>(j)] != dst)
                std::copy_n(static_cast<const float *>(s.rows_f32[static_cast<size_t>(j)]), d_, dst);
            s.rows_f32[static_cast<size_t>(j)] = dst;
        }
        int8_rot_.apply(s.tile_f32.data(), n);
    }
    // The int8 rows, scales and sums the fast kernel reads: the store's own when the tile's cells are
    // consecutive (one sequence decoded in order: the usual case), else gathered into the tile.
    const int8_t *keys_i8 = s.tile_i8.data();
    const float *kscale = s.kscale.data();
    const int32_t *ksum = s.ksum.data();
    if (int8_copy) {
        const int32_t c0 = cells[static_cast<size_t>(k0)];
        bool consecutive = true;
        for (int64_t j = 1; j < n && consecutive; ++j) consecutive = cells[static_cast<size_t>(k0 + j)] == c0 + j;
        if (consecutive) {
            keys_i8 = keys_.int8_row(c0);
            kscale = keys_.int8_scales(c0);
            ksum = keys_.int8_sums(c0);
        } else {
            for (int64_t j = 0; j < n; ++j) {
                const int32_t cell = cells[static_cast<size_t>(k0 + j)];
                std::memcpy(s.tile_i8.data() + j * dp_, keys_.int8_row(cell), static_cast<size_t>(dp_));
                s.kscale[static_cast<size_t>(j)] = keys_.int8_scale(cell);
                s.ksum[static_cast<size_t>(j)] = keys_.int8_sum(cell);
            }
        }
    } else if (fast && !q8_direct) {
        const bool from_f32 = quantized || rotate_keys;
        if (from_f32) std::copy_n(s.rows_f32.begin(), n, s.rows.begin());
        k_.quantize_keys(from_f32 ? indexer::kRowF32 : static_cast<uint32_t>(keys_.type()), s.rows.data(), n, d_, dp_,
                         s.tile_i8.data(), s.kscale.data(), s.ksum.data());
    }
    const uint32_t row_type = widen_tile ? indexer::kRowF32 : static_cast<uint32_t>(keys_.type());
    const void *const *rows = widen_tile ? s.rows_f32.data() : s.rows.data();
    for (int64_t m = m0; m < m1; ++m) {
        const ScoredQuery &sq = b_.scored[static_cast<size_t>(m)];
        const int64_t limit = tail ? k1 : std::min(k1, sq.prefix);
        const int64_t nm = limit - k0;
        if (nm <= 0) continue;
        const int64_t slot = m - c.begin;
        if (q8_direct) {
            k_.score_q8_0(s.qT4.data() + slot * dp_ * hp_, s.wq.data() + slot * hp_, hp_, d_, s.rows.data(), nm,
                          s.scores.data(), k_.query_offset);
        } else if (fast) {
            k_.score_i8(s.qT4.data() + slot * dp_ * hp_, s.wq.data() + slot * hp_, hp_, dp_, keys_i8, ksum, kscale, nm,
                        s.scores.data(), k_.query_offset);
        } else {
            k_.score_f32(row_type, s.qT.data() + slot * d_ * hp_, s.w.data() + slot * hp_, hp_, d_, rows, nm,
                         s.scores.data());
        }
        heap(m, split).push_all(s.scores.data(), nm, static_cast<int32_t>(k0), s.select, k_.avx512_select);
    }
}

void Selector::run_item(Scratch &s, int64_t item) {
    const int64_t chunk = item / n_split_, split = item % n_split_;
    const Chunk &c = b_.chunks[static_cast<size_t>(chunk)];
    if (s.prepared_chunk != chunk) {
        for (int64_t m = c.begin; m < c.end; ++m) prepare_query(s, m - c.begin, b_.scored[static_cast<size_t>(m)]);
        s.prepared_chunk = chunk;
        s.exact_slot0_pos = -1;
    }
    const auto lead = cand_[static_cast<size_t>(b_.scored[static_cast<size_t>(c.begin)].t)];
    const int64_t len = static_cast<int64_t>(lead.size());
    const int64_t lo = split == 0 ? 0 : len * split / n_split_ / kTileKeys * kTileKeys;
    const int64_t hi = split == n_split_ - 1 ? len : len * (split + 1) / n_split_ / kTileKeys * kTileKeys;
    for (int64_t k0 = lo; k0 < hi; k0 += kTileKeys)
        score_tile(s, c, split, lead, k0, std::min(hi, k0 + kTileKeys), c.begin, c.end, false);
    if (split == n_split_ - 1) {
        for (int64_t m = c.begin; m < c.end; ++m) {
            const ScoredQuery &sq = b_.scored[static_cast<size_t>(m)];
            const auto own = cand_[static_cast<size_t>(sq.t)];
            const int64_t n = static_cast<int64_t>(own.size());
            for (int64_t k0 = sq.prefix; k0 < n; k0 += kTileKeys) {
                score_tile(s, c, split, own, k0, std::min(n, k0 + kTileKeys), m, m + 1, true);
            }
        }
    }
}

void Selector::rescore_exact(Scratch &s, int64_t pos, Entry *e, int64_t n) {
    const ScoredQuery &sq = b_.scored[static_cast<size_t>(pos)];
    if (s.exact_slot0_pos != pos) {
        prepare_query(s, 0, ScoredQuery{sq.t, 0, false});
        s.prepared_chunk = -1;
        s.exact_slot0_pos = pos;
    }
    const auto list = cand_[static_cast<size_t>(sq.t)];
    // The band's rows lie scattered over the context, mostly in DRAM by now: every line of every row is
    // prefetched first, so that their fetches overlap (the kernel's own prefetch looks one block of keys ahead).
    // A decode call's re-scoring at 16K keys took 43-50 us without this, 25-36 us with it (two threads).
    for (int64_t j = 0; j < n; ++j) prefetch_bytes(keys_.row(list[static_cast<size_t>(e[j].idx)]), keys_.row_bytes());
    for (int64_t j0 = 0; j0 < n; j0 += kTileKeys) {
        const int64_t nt = std::min(kTileKeys, n - j0);
        for (int64_t j = 0; j < nt; ++j)
            s.rows[static_cast<size_t>(j)] = keys_.row(list[static_cast<size_t>(e[j0 + j].idx)]);
        const bool quantized = dtype_is_quantized(keys_.type());
        if (quantized) rows_to_f32(s, nt);
        k_.score_f32(quantized ? indexer::kRowF32 : static_cast<uint32_t>(keys_.type()), s.qT.data(), s.w.data(), hp_,
                     d_, quantized ? s.rows_f32.data() : s.rows.data(), nt, s.scores.data());
        for (int64_t j = 0; j < nt; ++j) {
            const float v = s.scores[static_cast<size_t>(j)];
            e[j0 + j].score = v == v ? v : -std::numeric_limits<float>::infinity();
        }
    }
}

// Merges the query's split buffers into heap(pos, 0)'s storage and keeps its top_k (exact) or, in fast mode,
// orders the int8 ranks into [0, sure) taken, [sure, keep) to be re-scored and the rest dropped.
void Selector::merge_splits(std::vector<uint64_t> &select, int64_t pos) {
    // The splits' buffers lie one after the other from split 0's: gathered down into one run from base, without
    // the entries a sample of the scores shows cannot be among the keep best (the select below then takes ~1.5 keep
    // entries instead of the whole context's; in decode at 16K keys, whose splits never fill, the select over all
    // 16K took ~62 us a call in the model).
    Entry **parts = b_.split_parts.data() + pos * n_split_;
    int64_t *sizes = b_.split_sizes.data() + pos * n_split_;
    int64_t union_size = 0;
    for (int64_t sp = 0; sp < n_split_; ++sp) {
        parts[sp] = heap(pos, sp).data;
        sizes[sp] = heap(pos, sp).size;
        union_size += sizes[sp];
    }
    SPARROW_ASSERT(union_size >= top_k_);
    const bool fast = b_.scored[static_cast<size_t>(pos)].fast;
    const int64_t need = fast ? std::min(union_size, top_k_ + margin_) : top_k_;
    Entry *base = heap(pos, 0).data;
    const int64_t total = indexer::gather_candidates(parts, sizes, n_split_, need, base, k_.avx512_select);
    Merged &mg = b_.merged[static_cast<size_t>(pos)];
    if (!fast) {
        if (total > top_k_) indexer::select_best(base, total, top_k_, select, k_.avx512_select);
        mg.sure = mg.keep = top_k_;
        return;
    }
    mg.keep = need;
    mg.sure = top_k_ - margin_;
    if (total > mg.keep) indexer::select_best(base, total, mg.keep, select, k_.avx512_select);
    if (mg.sure > 0) indexer::select_best(base, mg.keep, mg.sure, select, k_.avx512_select);
}

// Completes the query's selection (fast mode: the best of the re-scored band join the sure ones) and writes
// the chosen cells in candidate order.
void Selector::choose(std::vector<uint64_t> &select, int64_t pos, std::vector<int32_t> &out) {
    Entry *base = heap(pos, 0).data;
    const Merged &mg = b_.merged[static_cast<size_t>(pos)];
    if (mg.keep > top_k_)
        indexer::select_best(base + mg.sure, mg.keep - mg.sure, top_k_ - mg.sure, select, k_.avx512_select);
    const auto list = cand_[static_cast<size_t>(b_.scored[static_cast<size_t>(pos)].t)];
    out.resize(static_cast<size_t>(top_k_));
    indexer::indices_in_order(base, top_k_, static_cast<int64_t>(list.size()), out.data(), select);
    for (int32_t &i : out) i = list[static_cast<size_t>(i)];
}

void Selector::run(ThreadPool &pool, IndexerPrecision precision, int64_t n_tokens,
                   std::vector<std::vector<int32_t>> &selected) {
    // Each phase's end adds the time since the previous one's to its field (a few clock reads per call).
    auto last = phases_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    auto lap = [&](double SelectionPhaseSeconds::*field) {
        if (!phases_) return;
        const auto now = std::chrono::steady_clock::now();
        phases_->*field += std::chrono::duration<double>(now - last).count();
        last = now;
    };
    int64_t work = 0;  // multiply-adds of the scored queries
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto list = cand_[static_cast<size_t>(t)];
        if (static_cast<int64_t>(list.size()) > top_k_) work += static_cast<int64_t>(list.size()) * n_head_ * d_;
    }
    const bool parallel = pool.n_threads() > 1 && work >= kMinParallelWork;
    plan(precision, n_tokens, parallel ? pool.n_threads() : 1);
    lap(&SelectionPhaseSeconds::plan);
    if (b_.scored.empty()) return;

    const int64_t n_items = static_cast<int64_t>(b_.chunks.size()) * n_split_;
    const int n_threads = parallel ? pool.n_threads() : 1;
    grow_to(b_.scratch, n_threads);
    grow_to(b_.select, n_threads);
    std::atomic<int64_t> next{0};
    auto worker = [&](int ith, int) {
        Scratch &s = b_.scratch[static_cast<size_t>(ith)];
        s.fit(d_, dp_, hp_, max_members_);
        for (int64_t item; (item = next.fetch_add(1, std::memory_order_relaxed)) < n_items;) run_item(s, item);
    };
    if (parallel) {
        pool.run(worker);
    } else {
        worker(0, 1);
    }

    const int64_t n_scored = static_cast<int64_t>(b_.scored.size());
    b_.merged.resize(static_cast<size_t>(n_scored));
    // fn(select, pos) for every scored query, eight at a time, with the running thread's select scratch.
    auto for_queries = [&](auto &&fn) {
        auto range = [&](int ith, int64_t begin, int64_t end) {
            for (int64_t pos = begin; pos < end; ++pos) fn(b_.select[static_cast<size_t>(ith)], pos);
        };
        if (parallel) {
            pool.parallel_for_threads(n_scored, kMergeGrain, range);
        } else {
            range(0, 0, n_scored);
        }
    };
    lap(&SelectionPhaseSeconds::score);
    if (parallel && n_scored <= kMergeGrain) {
        // Few queries (decode: one), whose merges for_queries would run on this thread alone: each thread takes
        // whole queries, and then, with the threads no merge needs, the caller's work beside the merge.
        std::atomic<int64_t> next_query{0};
        pool.run([&](int ith, int) {
            for (int64_t pos; (pos = next_query.fetch_add(1, std::memory_order_relaxed)) < n_scored;)
                merge_splits(b_.select[static_cast<size_t>(ith)], pos);
            if (beside_merge_) beside_merge_();
        });
    } else {
        for_queries([&](std::vector<uint64_t> &select, int64_t pos) { merge_splits(select, pos); });
    }
    lap(&SelectionPhaseSeconds::merge);

    // Fast mode's exact re-scoring, in pieces of the queries' bands (about two per thread in decode, where
    // one query's band is all there is).
    std::vector<Piece> &pieces = b_.pieces;
    pieces.clear();
    int64_t band_total = 0;  // exact queries' bands are empty
    for (const Merged &mg : b_.merged) band_total += mg.keep - mg.sure;
    if (band_total > 0) {
        const int64_t piece_len =
            std::max<int64_t>(kTileKeys, band_total / std::max<int64_t>(1, 2 * (parallel ? pool.n_threads() : 1)));
        for (int64_t pos = 0; pos < n_scored; ++pos) {
            const Merged &mg = b_.merged[static_cast<size_t>(pos)];
            for (int64_t b = mg.sure; b < mg.keep; b += piece_len)
                pieces.push_back({pos, b, std::min(mg.keep, b + piece_len)});
        }
        std::atomic<int64_t> next_piece{0};
        auto rescore = [&](int ith, int) {
            Scratch &s = b_.scratch[static_cast<size_t>(ith)];
            s.fit(d_, dp_, hp_, 1);
            for (int64_t i; (i = next_piece.fetch_add(1, std::memory_order_relaxed)) < std::ssize(pieces);) {
                const Piece &p = pieces[static_cast<size_t>(i)];
                rescore_exact(s, p.pos, heap(p.pos, 0).data + p.begin, p.end - p.begin);
            }
        };
        if (parallel && pieces.size() > 1) {
            pool.run(rescore);
        } else {
            rescore(0, 1);
        }
    }
    lap(&SelectionPhaseSeconds::rescore);
    for_queries([&](std::vector<uint64_t> &select, int64_t pos) {
        choose(select, pos, selected[static_cast<size_t>(b_.scored[static_cast<size_t>(pos)].t)]);
    });
    lap(&SelectionPhaseSeconds::choose);
}

}  // namespace

namespace indexer {

namespace {

void select_with_kernels(const Kernels &kernels, ThreadPool &pool, const IndexerShape &shape,
                         IndexerPrecision precision, const float *q, const float *w, int64_t n_tokens,
                         const RowStore &keys, std::span<const std::span<const int32_t>> candidates, int64_t top_k,
                         std::vector<std::vector<int32_t>> &selected, IndexerWorkspace *workspace,
                         const std::function<void()> &beside_merge) {
    if (n_tokens < 0 || static_cast<int64_t>(candidates.size()) != n_tokens) {
        throw_error("lightning indexer: %lld candidate lists for %lld tokens",
                    static_cast<long long>(candidates.size()), static_cast<long long>(n_tokens));
    }
    if (shape.n_head <= 0 || shape.head_dim <= 0 || keys.width() != shape.head_dim) {
        throw_error("lightning indexer: %lld heads of width %lld against key rows of width %lld",
                    static_cast<long long>(shape.n_head), static_cast<long long>(shape.head_dim),
                    static_cast<long long>(keys.width()));
    }
    if (top_k < 0 || top_k > std::numeric_limits<int32_t>::max()) {
        throw_error("lightning indexer: top_k %lld out of range", static_cast<long long>(top_k));
    }
    const int64_t n_cells = keys.row_bytes() > 0 ? keys.n_bytes() / keys.row_bytes() : 0;
    selected.resize(static_cast<size_t>(n_tokens));
    bool any_scored = false;
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto list = candidates[static_cast<size_t>(t)];
        // min and max first (a loop the compiler vectorises: decode checks 16K cells per layer on one thread),
        // then the offending cell for the message.
        int32_t lo = std::numeric_limits<int32_t>::max(), hi = std::numeric_limits<int32_t>::min();
        for (const int32_t cell : list) {
            lo = std::min(lo, cell);
            hi = std::max(hi, cell);
        }
        if (!list.empty() && (lo < 0 || hi >= n_cells)) {
            const int32_t cell = lo < 0 ? lo : hi;
            throw_error("lightning indexer: token %lld has candidate cell %d outside the %lld-cell store",
                        static_cast<long long>(t), cell, static_cast<long long>(n_cells));
        }
        auto &out = selected[static_cast<size_t>(t)];
        if (static_cast<int64_t>(list.size()) <= top_k) {
            out.assign(list.begin(), list.end());
        } else {
            out.clear();
            any_scored = true;
        }
    }
    if (!any_scored || top_k == 0) return;
    if (!q || !w) throw_error("lightning indexer: q and w are required when a query has more than top_k candidates");
    std::optional<IndexerWorkspace> own;  // this call's buffers when the caller keeps none
    indexer::Buffers &buffers = workspace ? workspace->buffers() : own.emplace().buffers();
    Selector(kernels, shape, q, w, keys, candidates, top_k, buffers, workspace ? &workspace->phase_seconds() : nullptr,
             beside_merge)
        .run(pool, precision, n_tokens, selected);
}

}  // namespace

void select_with_isa(cpu::Isa isa, ThreadPool &pool, const IndexerShape &shape, IndexerPrecision precision,
                     const float *q, const float *w, int64_t n_tokens, const RowStore &keys,
                     std::span<const std::span<const int32_t>> candidates, int64_t top_k,
                     std::vector<std::vector<int32_t>> &selected, IndexerWorkspace *workspace,
                     const std::function<void()> &beside_merge) {
    select_with_kernels(indexer_kernels_for(isa), pool, shape, precision, q, w, n_tokens, keys, candidates, top_k,
                        selected, workspace, beside_merge);
}

void select_with_avx2_maddubs(ThreadPool &pool, const IndexerShape &shape, IndexerPrecision precision, const float *q,
                              const float *w, int64_t n_tokens, const RowStore &keys,
                              std::span<const std::span<const int32_t>> candidates, int64_t top_k,
                              std::vector<std::vector<int32_t>> &selected) {
    select_with_kernels(kAvx2Kernels, pool, shape, precision, q, w, n_tokens, keys, candidates, top_k, selected,
                        nullptr, {});
}

int query_offset_for(cpu::Isa isa) { return indexer_kernels_for(isa).query_offset; }

}  // namespace indexer

Int8RowQuantizer indexer_key_quantizer() { return indexer_kernels_for(cpu::kernels().isa).quantize_keys; }

int64_t indexer_int8_width(int64_t head_dim) { return round_up(head_dim, 4); }

int indexer_fast_query_bits() {
    // q_int spans [1 - offset, offset - 1]: offset 2^(b - 1) gives b-bit queries
    return std::bit_width(static_cast<unsigned>(indexer::query_offset_for(cpu::kernels().isa)));
}

void lightning_indexer_select(ThreadPool &pool, const IndexerShape &shape, IndexerPrecision precision, const float *q,
                              const float *w, int64_t n_tokens, const RowStore &keys,
                              std::span<const std::span<const int32_t>> candidates, int64_t top_k,
                              std::vector<std::vector<int32_t>> &selected, IndexerWorkspace *workspace,
                              const std::function<void()> &beside_merge) {
    indexer::select_with_isa(cpu::kernels().isa, pool, shape, precision, q, w, n_tokens, keys, candidates, top_k,
                             selected, workspace, beside_merge);
}

IndexerWorkspace::IndexerWorkspace() : buffers_(std::make_unique<indexer::Buffers>()) {}
IndexerWorkspace::~IndexerWorkspace() = default;
IndexerWorkspace::IndexerWorkspace(IndexerWorkspace &&) noexcept = default;
IndexerWorkspace &IndexerWorkspace::operator=(IndexerWorkspace &&) noexcept = default;

}  // namespace sparrow
