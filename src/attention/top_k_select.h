// Selection of the best k of n scored candidates, for the lightning indexer's per-query top-k.
//
// Ranking (the indexer's documented rule): a beats b when a.score > b.score, or the scores are equal and a
// has the lower index (the earlier candidate). Scores are finite or -inf (the indexer maps NaN to -inf before
// it gets here); -0 and +0 are equal.
//
// select_best is a radix select: each candidate becomes one unsigned 64-bit key that orders exactly as the
// rule (score bits made monotonic, -0 folded onto +0, in the high half; the complemented index in the low
// half), 11 bits are histogrammed per pass over the candidates still undecided, and the pass keeps only the
// bucket that holds the k-th key. Keys are unique (indices are), so the k-th best is one key, found in a few
// passes whose work shrinks with the candidates; nth_element with the two-part comparison spends most of its
// time on mispredicted branches over the same data (about 3x slower at n = 8192, k = 2048). On the AVX-512 path
// with n >= 4096, a sample of 512 keys first brackets the k-th key, and the radix passes run on the bracket
// alone (all n when the sample misleads): ~1/3 less time at n = 16384.
#pragma once

#include <cstdint>
#include <vector>

namespace sparrow::indexer {

struct ScoredIndex {
    float score;  // finite or -inf
    int32_t idx;  // the candidate's index in its query's list (unique within one selection)
};

inline bool ranks_before(const ScoredIndex &a, const ScoredIndex &b) {
    return a.score > b.score || (a.score == b.score && a.idx < b.idx);
}

// Moves the k best of e[0, n) to e[0, k), the k-th best at e[k - 1] and the others in no particular order;
// e[k, n) holds the rest. 1 <= k <= n. `scratch` is working memory (grown as needed, reusable).
void select_best(ScoredIndex *e, int64_t n, int64_t k, std::vector<uint64_t> &scratch);
// The same on a chosen code path: avx512 (only where the CPU has AVX-512) puts the key conversion, each radix
// pass's compaction and the final partition in vector loops (top_k_kernels_avx512.cpp), 1.5-1.7x faster at n = 16384;
// false is the scalar path. Both select the same entries; the order inside each group may differ.
void select_best(ScoredIndex *e, int64_t n, int64_t k, std::vector<uint64_t> &scratch, bool avx512);

// Moves the entries of n_parts parts into dst[0, m) and returns m, leaving out only entries that cannot be among
// the k best of their union (1 <= k <= its size): when the union is large (at least 4096 entries and 4k), a
// strided sample of 512 scores sets a floor about four standard deviations of the sample's count below the k-th
// best, and when at least k entries reach it those alone are moved: every entry left out then scores lower than
// every entry kept, so the k best are among the kept. Otherwise (a small union, or a sample that misled) every
// entry is moved. Part p is parts[p][0, sizes[p]) and lies in dst's memory at or after dst + sizes[0] + ... +
// sizes[p - 1] (parts[0] may be dst itself): entries only move down. The point is the memory the select then
// touches: a decode merge at 16K keys with top-k 2048 hands select_best ~3.6K entries instead of 16K.
int64_t gather_candidates(ScoredIndex *const *parts, const int64_t *sizes, int64_t n_parts, int64_t k, ScoredIndex *dst,
                          bool avx512);

// Writes the indices of e[0, n) in increasing order to out[0, n). Indices are unique and lie in [0, bound);
// a bitmap of bound bits (in `scratch`) orders them in O(n + bound / 64).
void indices_in_order(const ScoredIndex *e, int64_t n, int64_t bound, int32_t *out, std::vector<uint64_t> &scratch);

}  // namespace sparrow::indexer
