// select_best and indices_in_order against a full sort by the indexer's ranking rule, on data built to
// stress it: many exact ties (scores from a handful of values, +0 and -0 mixed), -inf, huge and tiny
// magnitudes, scores that share their sign and exponent (one binade) or are all equal (so the keys differ only
// in their index bits, where the radix select starts), and every k from 1 to n on small sizes; at indexer sizes
// also data whose evenly spaced entries mislead the AVX-512 path's sample. gather_candidates (the decode merge's cut
// before the select) against the same sort, on split buffers laid out as the indexer lays them out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "attention/top_k_select.h"
#include "kernels/cpu/dispatch.h"

namespace sparrow::indexer {
namespace {

std::vector<ScoredIndex> make_entries(std::mt19937 &rng, int64_t n, int kind) {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    const float few[] = {0.0f,  -0.0f,  1.0f,  -1.0f, 0.5f, -std::numeric_limits<float>::infinity(),
                         3e38f, -3e38f, 1e-40f /* subnormal */};
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<ScoredIndex> e(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        float s = 0.0f;
        switch (kind) {
            case 0: s = gauss(rng); break;
            case 1: s = few[rng() % (sizeof few / sizeof few[0])]; break;
            case 2: s = 1.0f + static_cast<float>(rng() % 100000) / 100000.0f; break;  // [1, 2): one binade
            case 3: s = 0.75f; break;                                                  // all equal
            default:  // gaussian, but the entries at every (n / 512)-th position score far above the rest: a
                      // sample taken at those positions misjudges the k-th best (the sampled path's fallback)
                s = (n >= 512 && i % (n / 512) == 0) ? 1e30f + gauss(rng) * 1e24f : gauss(rng);
                break;
        }
        e[static_cast<size_t>(i)] = {s, idx[static_cast<size_t>(i)] * 3};  // unique, not dense
    }
    return e;
}

// The code paths select_best has on this CPU: scalar, and AVX-512 where cpuid reports it.
std::vector<bool> select_paths() {
    if (cpu::cpu_supports(cpu::Isa::avx512)) return {false, true};
    return {false};
}

void check_select(std::vector<ScoredIndex> e, int64_t k, std::vector<uint64_t> &scratch, bool avx512) {
    const int64_t n = static_cast<int64_t>(e.size());
    std::vector<ScoredIndex> ref = e;
    std::sort(ref.begin(), ref.end(), ranks_before);
    select_best(e.data(), n, k, scratch, avx512);
    // e[k - 1] is the k-th best; the first k are the best k as a set; the rest are the others.
    ASSERT_EQ(e[static_cast<size_t>(k - 1)].idx, ref[static_cast<size_t>(k - 1)].idx)
        << "n " << n << " k " << k << " avx512 " << avx512;
    auto by_idx = [](const ScoredIndex &a, const ScoredIndex &b) { return a.idx < b.idx; };
    std::vector<ScoredIndex> got_top(e.begin(), e.begin() + k), ref_top(ref.begin(), ref.begin() + k);
    std::sort(got_top.begin(), got_top.end(), by_idx);
    std::sort(ref_top.begin(), ref_top.end(), by_idx);
    for (int64_t i = 0; i < k; ++i) ASSERT_EQ(got_top[i].idx, ref_top[i].idx) << "n " << n << " k " << k;
    std::vector<ScoredIndex> all = e;
    std::sort(all.begin(), all.end(), by_idx);
    std::vector<ScoredIndex> ref_all = ref;
    std::sort(ref_all.begin(), ref_all.end(), by_idx);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(all[i].idx, ref_all[i].idx) << "entries lost or duplicated";
    // indices_in_order gives the winners' indices sorted.
    std::vector<int32_t> order(static_cast<size_t>(k));
    indices_in_order(e.data(), k, 3 * n, order.data(), scratch);
    for (int64_t i = 0; i < k; ++i) ASSERT_EQ(order[i], got_top[i].idx);
}

// Both code paths (select_paths) on each case.
TEST(TopKSelect, MatchesFullSortOnEveryKForSmallSizes) {
    std::mt19937 rng(5);
    std::vector<uint64_t> scratch;
    for (int kind : {0, 1, 2, 3}) {
        for (int64_t n : {1, 2, 3, 7, 33, 100}) {  // 100: past the comparison select's size, into the radix one
            const auto e = make_entries(rng, n, kind);
            for (int64_t k = 1; k <= n; ++k) {
                for (const bool avx512 : select_paths()) check_select(e, k, scratch, avx512);
            }
        }
    }
}

TEST(TopKSelect, MatchesFullSortAtIndexerSizes) {
    std::mt19937 rng(6);
    std::vector<uint64_t> scratch;
    for (int kind : {0, 1, 2, 3, 4}) {
        for (auto [n, k] : {std::pair<int64_t, int64_t>{4096, 2048},
                            {8192, 2048},
                            {16384, 2320},
                            {5000, 1},
                            {5000, 4999},
                            {300, 64}}) {
            const auto e = make_entries(rng, n, kind);
            for (const bool avx512 : select_paths()) check_select(e, k, scratch, avx512);
        }
    }
}

// Split buffers of the given sizes one after the other, each in a region of `capacity` entries (as the indexer's
// per-split top-k buffers), filled from e in order; gather_candidates into the first region; checked against a full
// sort of e. Returns how many it gathered.
int64_t check_gather(const std::vector<ScoredIndex> &e, const std::vector<int64_t> &sizes, int64_t capacity, int64_t k,
                     bool avx512, std::vector<ScoredIndex> *gathered = nullptr) {
    const auto n_parts = static_cast<int64_t>(sizes.size());
    std::vector<ScoredIndex> storage(static_cast<size_t>(n_parts * capacity), ScoredIndex{-1.0f, -1});
    std::vector<ScoredIndex *> parts;
    int64_t at = 0;
    for (int64_t p = 0; p < n_parts; ++p) {
        EXPECT_LE(sizes[p], capacity);
        parts.push_back(storage.data() + p * capacity);
        std::copy_n(e.begin() + at, sizes[p], parts.back());
        at += sizes[p];
    }
    EXPECT_EQ(at, static_cast<int64_t>(e.size()));
    const int64_t m = gather_candidates(parts.data(), sizes.data(), n_parts, k, storage.data(), avx512);
    EXPECT_GE(m, k);
    EXPECT_LE(m, at);
    std::vector<ScoredIndex> got(storage.begin(), storage.begin() + m), ref = e;
    if (gathered) *gathered = got;
    // The k best of what was gathered are the k best of all, and nothing was gathered twice or made up.
    std::sort(got.begin(), got.end(), ranks_before);
    std::sort(ref.begin(), ref.end(), ranks_before);
    for (int64_t i = 0; i < k; ++i) {
        EXPECT_EQ(got[static_cast<size_t>(i)].idx, ref[static_cast<size_t>(i)].idx) << "rank " << i << " k " << k;
        if (got[static_cast<size_t>(i)].idx != ref[static_cast<size_t>(i)].idx) break;
    }
    auto by_idx = [](const ScoredIndex &a, const ScoredIndex &b) { return a.idx < b.idx; };
    std::sort(got.begin(), got.end(), by_idx);
    EXPECT_EQ(std::adjacent_find(got.begin(), got.end(), [](auto &a, auto &b) { return a.idx == b.idx; }), got.end());
    std::vector<ScoredIndex> all = e;
    std::sort(all.begin(), all.end(), by_idx);
    EXPECT_TRUE(std::includes(all.begin(), all.end(), got.begin(), got.end(), by_idx));
    return m;
}

TEST(TopKSelect, GatherCandidatesKeepsTheBestOfTheUnion) {
    std::mt19937 rng(7);
    // decode at 16K keys on two threads (four splits of ~4K that never fill: the cut applies), on many threads
    // (32 splits of 512), a union too small to sample, and splits of awkward sizes (the vector loops' tails).
    const std::vector<std::pair<std::vector<int64_t>, int64_t>> layouts = {
        {{4104, 4104, 4104, 4104}, 4640},
        {std::vector<int64_t>(32, 513), 600},
        {{300, 0, 1000}, 1000},
        {{4099, 0, 7, 1, 13, 31, 2049}, 4100},
    };
    for (int kind : {0, 1, 2, 3, 4}) {
        for (const auto &[sizes, capacity] : layouts) {
            const int64_t n = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
            const auto e = make_entries(rng, n, kind);
            for (int64_t k : {int64_t(1), int64_t(64), int64_t(2048), int64_t(2320), n}) {
                if (k > n) continue;
                std::vector<std::vector<ScoredIndex>> by_path;
                for (const bool avx512 : select_paths()) {
                    by_path.emplace_back();
                    check_gather(e, sizes, capacity, k, avx512, &by_path.back());
                }
                // Both paths gather the same entries in the same order (the kernels keep input order).
                for (size_t p = 1; p < by_path.size(); ++p) {
                    ASSERT_EQ(by_path[p].size(), by_path[0].size()) << "kind " << kind << " n " << n << " k " << k;
                    for (size_t i = 0; i < by_path[p].size(); ++i) ASSERT_EQ(by_path[p][i].idx, by_path[0][i].idx);
                }
            }
        }
    }
}

TEST(TopKSelect, GatherCandidatesCutsOnlyWhereTheSampleHolds) {
    std::mt19937 rng(8);
    const std::vector<int64_t> sizes = {4096, 4096, 4096, 4096};  // 16384: the sample lands on every 32nd entry
    const int64_t n = 4 * 4096, k = 2320;
    for (const bool avx512 : select_paths()) {
        // Gaussian scores: the floor sits ~1.5 k from the top, so about a fifth of the 16K entries go on.
        const int64_t m = check_gather(make_entries(rng, n, 0), sizes, 4640, k, avx512);
        EXPECT_LT(m, 2 * k) << "avx512 " << avx512;
        // The sampled positions score far above the rest: fewer than k reach the sample's floor, so nothing is cut.
        EXPECT_EQ(check_gather(make_entries(rng, n, 4), sizes, 4640, k, avx512), n);
        // All scores equal: every entry reaches the floor (ties at the floor are kept).
        EXPECT_EQ(check_gather(make_entries(rng, n, 3), sizes, 4640, k, avx512), n);
    }
}

}  // namespace
}  // namespace sparrow::indexer
