// The DSA lightning indexer's selection step: score each query's candidate keys and keep the top-k.
//
//   I[t, s] = sum_h w[t, h] * relu(q[t, h, :] . k[s, :])
//
// Keys are single-head rows of an indexer-key store (one row per cache cell). Scores are computed in tiles
// of queries x keys with the heads accumulated inside the tile, and consumed at once by a bounded running
// top-k per query: no [tokens x context] (or x heads) score tensor ever exists, so peak memory is
// O(tile_q * tile_k + tile_q * top_k), independent of the context length and of the number of heads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cache/row_store.h"
#include "core/thread_pool.h"
#include "sparrow/sparrow.h"

namespace sparrow {

enum class IndexerPrecision {
    exact,  // f32 products and f32 accumulation over f32/f16/bf16 keys: what tests compare with references
    fast,   // reduced-precision products the CPU does quickly (int8 or bf16 dot products); validated by the
            // Jaccard of its selections against exact mode
};

struct IndexerShape {
    int64_t n_head = 0;    // H: indexer query heads
    int64_t head_dim = 0;  // D: width of q per head and of each key row
};

// Per query token t (0 <= t < n_tokens):
//   q: [n_tokens, n_head, head_dim] f32 (RoPE applied);  w: [n_tokens, n_head] f32, already scaled
//   keys: rows of head_dim elements, indexed by cache cell
//   candidates[t]: the cells query t may select, in increasing position order
//   selected[t] (output): the min(top_k, |candidates[t]|) candidates with the largest I[t, s], written in
//     candidate order (so in increasing position). Ties at the cut go to the earlier candidate (the
//     lower position). When |candidates[t]| <= top_k, every candidate is selected without scoring.
//     A NaN score ranks below every other score (as -inf): it is never selected over a finite one.
// `selected` is resized to n_tokens; its inner vectors keep their capacity between calls.
// `workspace` (optional): buffers kept from one call to the next; without it the call allocates its own.
namespace indexer {
struct Buffers;  // lightning_indexer.cpp
}

// The selection's working memory (top-k buffers, per-thread key tiles and prepared queries, the merge's select
// keys: ~0.7 MB by their sizes in a 16K-key fast decode call on 2 threads), kept by whoever calls the indexer
// repeatedly (a context: once per layer and token) so that a call neither allocates nor zeroes it. Allocated per call,
// those buffers are fresh pages whenever the allocator has handed the previous ones back to the system (glibc does so
// at its default thresholds unless earlier frees have raised them): a 16K-key fast decode call in sparrow_indexer_bench
// then took 1.90-1.96 ms against 0.20-0.21 with a workspace (GLIBC_TUNABLES fixing the defaults, same run). One
// workspace serves one call at a time.
class IndexerWorkspace {
  public:
    IndexerWorkspace();
    ~IndexerWorkspace();
    IndexerWorkspace(IndexerWorkspace &&) noexcept;
    IndexerWorkspace &operator=(IndexerWorkspace &&) noexcept;
    indexer::Buffers &buffers() { return *buffers_; }
    // The wall times of this workspace's calls by phase, summed (sparrow.h; what `--dsa-stats` prints).
    SelectionPhaseSeconds &phase_seconds() { return phases_; }
    const SelectionPhaseSeconds &phase_seconds() const { return phases_; }

  private:
    std::unique_ptr<indexer::Buffers> buffers_;
    SelectionPhaseSeconds phases_;
};

// `beside_merge` (optional): other work of the caller's that does not need the selection. When the call merges
// its queries' split buffers (a serial step for one query: decode) with threads to spare, those threads call it
// while the merge runs, and so does each merging thread when it is done; it must be safe to call from several
// threads at once and return when nothing is left to take. The call may also never run it (one thread, or
// many queries whose merges fill every thread): the caller runs whatever is left afterwards.
void lightning_indexer_select(ThreadPool &pool, const IndexerShape &shape, IndexerPrecision precision, const float *q,
                              const float *w, int64_t n_tokens, const RowStore &keys,
                              std::span<const std::span<const int32_t>> candidates, int64_t top_k,
                              std::vector<std::vector<int32_t>> &selected, IndexerWorkspace *workspace = nullptr,
                              const std::function<void()> &beside_merge = {});

// Fast mode over f32 / f16 / bf16 keys quantises every key it scores to int8 (one scale per row). A key store
// that keeps an int8 copy of its rows (RowStore::keep_int8_copy) spares that: give it this quantiser and this
// width (the key width rounded up to 4), and fast mode reads the copy, with the same bits it would compute.
Int8RowQuantizer indexer_key_quantizer();
int64_t indexer_int8_width(int64_t head_dim);
// Bits of fast mode's quantised queries at the active kernel level: 8 where vpdpbusd (VNNI) or the scalar loops
// run them, 6 for AVX2's maddubs pairs (indexer_kernels.h).
int indexer_fast_query_bits();

}  // namespace sparrow
