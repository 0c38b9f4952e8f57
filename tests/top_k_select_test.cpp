// select_best and indices_in_order against a full sort by the indexer's ranking rule, on data built to
// stress it: many exact ties (scores from a handful of values, +0 and -0 mixed), -inf, huge and tiny
// magnitudes, scores that share their sign and exponent (one binade) or are all equal (so the keys differ only
// in their index bits, where the radix select starts), and every k from 1 to n on small sizes; at indexer sizes
// also data whose evenly spaced entries mislead the AVX-512 path's sample.
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

}  // namespace
}  // namespace sparrow::indexer
