// lightning_indexer_select against a plain reference: every score in double, selection by a full stable sort
// (so ties go to the earlier candidate), NaN ranked as -inf. Exact mode must match it exactly where f32
// arithmetic is exact (small-integer data: every product and sum is an integer below 2^24) and up to
// near-ties otherwise; fast mode must keep a mean Jaccard >= 0.98 with exact mode on structured data.
// Every kernel level the CPU has is run.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attention/indexer_internal.h"
#include "attention/indexer_kernels.h"
#include "attention/lightning_indexer.h"
#include "core/blocks.h"
#include "core/dtype.h"
#include "core/error.h"
#include "test_util.h"

namespace sparrow {
namespace {

// The levels to test: every one this CPU runs (avx512 would run the AVX2 kernels again, so it is skipped).
std::vector<cpu::Isa> levels() {
    std::vector<cpu::Isa> out = {cpu::Isa::scalar};
    if (cpu::cpu_supports(cpu::Isa::avx2)) out.push_back(cpu::Isa::avx2);
    if (cpu::cpu_supports(cpu::Isa::avx512)) out.push_back(cpu::Isa::avx512);  // VNNI int8 scores where present
    return out;
}

// A ubatch of queries over sequences whose cells interleave in the store.
struct Problem {
    IndexerShape shape;
    int64_t n_tokens = 0;
    std::vector<float> q, w;                      // [n_tokens, H, D], [n_tokens, H]
    RowStore keys;                                // one row per cell
    std::vector<std::vector<int32_t>> owned;      // candidate lists that are not views of a sequence's cells
    std::vector<std::vector<int32_t>> seq_cells;  // per sequence: its cells in position order
    std::vector<std::span<const int32_t>> cand;   // per token
};

// n_seq sequences of seq_len cells each; the cells of all sequences are shuffled together so that each
// sequence's cells are interleaved with the others' and not contiguous. Token t belongs to sequence
// t % n_seq and, causally, sees a prefix of its sequence: the last token of a sequence sees `last_cand`
// cells, each earlier one a cell less (at least 0). Every third token gets its own copy of its list (not a
// view of the sequence array), and with `fork` a token's tail is replaced by other cells (a forked sequence
// that shares only a prefix).
Problem make_problem(std::mt19937 &rng, int64_t n_tokens, int64_t n_seq, int64_t last_cand, int64_t n_head,
                     int64_t head_dim, DType key_type, bool fork = false) {
    Problem p;
    p.shape = {n_head, head_dim};
    p.n_tokens = n_tokens;
    const int64_t seq_len = last_cand + 64;  // spare cells for forks
    std::vector<int32_t> cells(static_cast<size_t>(n_seq * seq_len));
    std::iota(cells.begin(), cells.end(), 0);
    std::shuffle(cells.begin(), cells.end(), rng);
    p.seq_cells.resize(static_cast<size_t>(n_seq));
    for (int64_t s = 0; s < n_seq; ++s) {
        p.seq_cells[static_cast<size_t>(s)].assign(cells.begin() + s * seq_len, cells.begin() + (s + 1) * seq_len);
    }
    p.keys = RowStore(key_type, n_seq * seq_len, head_dim);
    p.owned.resize(static_cast<size_t>(n_tokens));
    const int64_t per_seq = (n_tokens + n_seq - 1) / n_seq;
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto &sc = p.seq_cells[static_cast<size_t>(t % n_seq)];
        const int64_t i = t / n_seq;  // index of the token within its sequence
        const int64_t len = std::max<int64_t>(0, last_cand - (per_seq - 1 - i));
        auto &own = p.owned[static_cast<size_t>(t)];
        if (fork && len > 8 && t % 2 == 1) {
            own.assign(sc.begin(), sc.begin() + len / 2);  // shared prefix, then the spare cells
            for (int64_t k = len / 2; k < len; ++k)
                own.push_back(sc[static_cast<size_t>(seq_len - 1 - (k - len / 2) % 64)]);
            p.cand.emplace_back(own);
        } else if (t % 3 == 2) {
            own.assign(sc.begin(), sc.begin() + len);
            p.cand.emplace_back(own);
        } else {
            p.cand.emplace_back(sc.data(), static_cast<size_t>(len));
        }
    }
    p.q.resize(static_cast<size_t>(n_tokens * n_head * head_dim));
    p.w.resize(static_cast<size_t>(n_tokens * n_head));
    return p;
}

// Small integers: q, k in [-3, 3], w in {-1, 1, 2, 3} / 4 (exact binary fractions). Dots are integers up to
// 9 * 128, scores multiples of 1/4 below 2^20: f32 computes them exactly in any order, ties are common.
void fill_integer(std::mt19937 &rng, Problem &p) {
    std::uniform_int_distribution<int> small(-3, 3), wsel(0, 3);
    const float wv[4] = {-0.25f, 0.25f, 0.5f, 0.75f};
    for (auto &x : p.q) x = float(small(rng));
    for (auto &x : p.w) x = wv[wsel(rng)];
    const int64_t n_cells = p.keys.n_bytes() / p.keys.row_bytes();
    std::vector<float> row(static_cast<size_t>(p.shape.head_dim));
    for (int64_t c = 0; c < n_cells; ++c) {
        for (auto &x : row) x = float(small(rng));
        p.keys.write(c, row.data());
    }
}

// Keys from 16 clusters plus noise and a slow drift along the cell index; each query head leans towards
// one cluster; head weights mostly positive. Close to what a trained indexer produces: a few keys stand
// out, most are near the bulk.
void fill_structured(std::mt19937 &rng, Problem &p) {
    const int64_t d = p.shape.head_dim, n_cells = p.keys.n_bytes() / p.keys.row_bytes();
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::uniform_int_distribution<int> cluster(0, 15);
    std::vector<float> centroids(static_cast<size_t>(16 * d)), drift(static_cast<size_t>(2 * d));
    for (auto &x : centroids) x = gauss(rng);
    for (auto &x : drift) x = gauss(rng);
    std::vector<float> row(static_cast<size_t>(d));
    for (int64_t c = 0; c < n_cells; ++c) {
        const float *cen = centroids.data() + cluster(rng) * d;
        const float phase = float(c) / 997.0f;
        for (int64_t i = 0; i < d; ++i) {
            row[static_cast<size_t>(i)] = 0.6f * cen[i] + 0.8f * gauss(rng) +
                                          0.3f * (std::cos(phase) * drift[static_cast<size_t>(i)] +
                                                  std::sin(phase) * drift[static_cast<size_t>(d + i)]);
        }
        p.keys.write(c, row.data());
    }
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    for (int64_t t = 0; t < p.n_tokens; ++t) {
        for (int64_t h = 0; h < p.shape.n_head; ++h) {
            const float *cen = centroids.data() + cluster(rng) * d;
            float *qh = p.q.data() + (t * p.shape.n_head + h) * d;
            for (int64_t i = 0; i < d; ++i) qh[i] = 0.5f * cen[i] + gauss(rng);
            const float sign = uni(rng) < 0.85f ? 1.0f : -1.0f;
            p.w[static_cast<size_t>(t * p.shape.n_head + h)] =
                sign * (0.2f + uni(rng)) / std::sqrt(float(p.shape.n_head));
        }
    }
}

// Reference scores of token t for every candidate, in double; NaN becomes -inf.
std::vector<double> reference_scores(const Problem &p, int64_t t) {
    const int64_t H = p.shape.n_head, D = p.shape.head_dim;
    const auto list = p.cand[static_cast<size_t>(t)];
    std::vector<double> out(list.size());
    std::vector<float> k(static_cast<size_t>(D));
    for (size_t j = 0; j < list.size(); ++j) {
        dequantize_row(p.keys.type(), p.keys.row(list[j]), k.data(), D);
        double score = 0.0;
        for (int64_t h = 0; h < H; ++h) {
            const float *qh = p.q.data() + (t * H + h) * D;
            double dot = 0.0;
            for (int64_t i = 0; i < D; ++i) dot += double(qh[i]) * double(k[static_cast<size_t>(i)]);
            const double relu = dot < 0.0 ? 0.0 : dot;  // keeps NaN
            score += double(p.w[static_cast<size_t>(t * H + h)]) * relu;
        }
        out[j] = std::isnan(score) ? -std::numeric_limits<double>::infinity() : score;
    }
    return out;
}

// The reference selection: candidate indices of the top_k by a stable sort (earlier candidate first on
// ties), returned in candidate order.
std::vector<int64_t> reference_pick(const std::vector<double> &scores, int64_t top_k) {
    std::vector<int64_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return scores[static_cast<size_t>(a)] > scores[static_cast<size_t>(b)];
    });
    order.resize(static_cast<size_t>(std::min<int64_t>(top_k, static_cast<int64_t>(order.size()))));
    std::sort(order.begin(), order.end());
    return order;
}

std::vector<int32_t> to_cells(std::span<const int32_t> list, const std::vector<int64_t> &idx) {
    std::vector<int32_t> out;
    for (int64_t i : idx) out.push_back(list[static_cast<size_t>(i)]);
    return out;
}

std::vector<std::vector<int32_t>> run(cpu::Isa isa, ThreadPool &pool, const Problem &p, IndexerPrecision precision,
                                      int64_t top_k) {
    std::vector<std::vector<int32_t>> selected;
    indexer::select_with_isa(isa, pool, p.shape, precision, p.q.data(), p.w.data(), p.n_tokens, p.keys, p.cand, top_k,
                             selected);
    return selected;
}

// run() with the plain AVX2 int8 kernels (6-bit queries), which the avx2 level leaves for AVX-VNNI's where the CPU
// has it.
std::vector<std::vector<int32_t>> run_maddubs(ThreadPool &pool, const Problem &p, IndexerPrecision precision,
                                              int64_t top_k) {
    std::vector<std::vector<int32_t>> selected;
    indexer::select_with_avx2_maddubs(pool, p.shape, precision, p.q.data(), p.w.data(), p.n_tokens, p.keys, p.cand,
                                      top_k, selected);
    return selected;
}

double mean_jaccard(const std::vector<std::vector<int32_t>> &a, const std::vector<std::vector<int32_t>> &b);

double jaccard(std::vector<int32_t> a, std::vector<int32_t> b) {
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::vector<int32_t> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    const size_t uni = a.size() + b.size() - both.size();
    return uni == 0 ? 1.0 : double(both.size()) / double(uni);
}

double mean_jaccard(const std::vector<std::vector<int32_t>> &a, const std::vector<std::vector<int32_t>> &b) {
    double sum = 0.0;
    for (size_t t = 0; t < a.size(); ++t) sum += jaccard(a[t], b[t]);
    return a.empty() ? 1.0 : sum / double(a.size());
}

struct SweepCase {
    int64_t n_tokens, n_seq, last_cand, n_head, head_dim, top_k;
    DType key_type;
    bool fork;
};

std::string describe(const SweepCase &c) {
    return "tokens " + std::to_string(c.n_tokens) + " seqs " + std::to_string(c.n_seq) + " cand " +
           std::to_string(c.last_cand) + " H " + std::to_string(c.n_head) + " D " + std::to_string(c.head_dim) +
           " top_k " + std::to_string(c.top_k) + " keys " + std::string(dtype_name(c.key_type)) +
           (c.fork ? " forked" : "");
}

// Exact mode on small-integer data equals the reference exactly, ties included.
TEST(Indexer, ExactMatchesReferenceOnAwkwardSizes) {
    std::vector<SweepCase> cases;
    // Candidate counts around top_k for each top_k, with small shapes.
    for (int64_t top_k : {1, 7, 64}) {
        for (int64_t cand : {int64_t(0), int64_t(1), top_k - 1, top_k, top_k + 1, int64_t(1000)}) {
            cases.push_back({17, 2, cand, 3, 32, top_k, DType::F32, false});
        }
    }
    cases.push_back({3, 1, 4097, 32, 128, 64, DType::F16, false});
    cases.push_back({3, 3, 4097, 1, 64, 7, DType::F32, false});
    cases.push_back({64, 4, 1000, 3, 32, 7, DType::F16, true});
    cases.push_back({64, 1, 4097, 1, 32, 64, DType::F32, false});
    cases.push_back({1, 1, 4097, 32, 128, 2048, DType::F16, false});
    cases.push_back({17, 3, 1000, 32, 64, 2048, DType::F32, false});  // top_k > every candidate list
    cases.push_back({17, 3, 2049, 3, 128, 2048, DType::BF16, true});
    cases.push_back({1, 1, 1, 32, 128, 64, DType::F16, false});
    cases.push_back({64, 2, 300, 32, 32, 64, DType::F32, true});
    std::mt19937 rng(1234);
    for (const SweepCase &c : cases) {
        Problem p = make_problem(rng, c.n_tokens, c.n_seq, c.last_cand, c.n_head, c.head_dim, c.key_type, c.fork);
        fill_integer(rng, p);
        for (cpu::Isa isa : levels()) {
            for (int n_threads : {1, 2}) {
                ThreadPool pool(n_threads);
                const auto got = run(isa, pool, p, IndexerPrecision::exact, c.top_k);
                ASSERT_EQ(got.size(), static_cast<size_t>(c.n_tokens));
                for (int64_t t = 0; t < c.n_tokens; ++t) {
                    const auto want =
                        to_cells(p.cand[static_cast<size_t>(t)], reference_pick(reference_scores(p, t), c.top_k));
                    ASSERT_EQ(got[static_cast<size_t>(t)], want)
                        << describe(c) << " token " << t << " isa " << cpu::isa_name(isa) << " threads " << n_threads;
                }
            }
        }
    }
}

// Continuous data: exact mode may differ from the double reference only where two scores are closer than
// f32 rounding, i.e. every key it picks scores at least the reference cut minus a tolerance, and every key
// it leaves scores at most the cut plus the tolerance.
TEST(Indexer, ExactMatchesReferenceUpToNearTies) {
    std::mt19937 rng(99);
    for (int64_t top_k : {64, 2048}) {
        Problem p = make_problem(rng, 17, 2, 4097, 32, 128, DType::F16);
        fill_structured(rng, p);
        for (cpu::Isa isa : levels()) {
            ThreadPool pool(2);
            const auto got = run(isa, pool, p, IndexerPrecision::exact, top_k);
            for (int64_t t = 0; t < p.n_tokens; ++t) {
                const auto list = p.cand[static_cast<size_t>(t)];
                const auto scores = reference_scores(p, t);
                ASSERT_EQ(got[static_cast<size_t>(t)].size(), std::min<size_t>(size_t(top_k), list.size()));
                if (static_cast<int64_t>(list.size()) <= top_k) continue;
                std::vector<double> sorted = scores;
                std::sort(sorted.begin(), sorted.end(), std::greater<>());
                const double cut = sorted[static_cast<size_t>(top_k - 1)];
                const double tol = 1e-5 * std::max(1.0, std::fabs(cut));
                std::set<int32_t> picked(got[static_cast<size_t>(t)].begin(), got[static_cast<size_t>(t)].end());
                for (size_t j = 0; j < list.size(); ++j) {
                    if (picked.count(list[j])) {
                        EXPECT_GE(scores[j], cut - tol) << "token " << t << " picked a low key";
                    } else {
                        EXPECT_LE(scores[j], cut + tol) << "token " << t << " left a high key";
                    }
                }
                // Candidate order: positions of the picked cells in the list increase.
                std::vector<int64_t> where(p.keys.n_bytes() / p.keys.row_bytes(), -1);
                for (size_t j = 0; j < list.size(); ++j) where[static_cast<size_t>(list[j])] = static_cast<int64_t>(j);
                const auto &g = got[static_cast<size_t>(t)];
                for (size_t i = 1; i < g.size(); ++i) {
                    EXPECT_LT(where[static_cast<size_t>(g[i - 1])], where[static_cast<size_t>(g[i])]);
                }
            }
        }
    }
}

// All scores equal (every dot product negative, so relu gives 0): the first top_k candidates win.
TEST(Indexer, TiesGoToTheEarlierCandidate) {
    std::mt19937 rng(5);
    Problem p = make_problem(rng, 5, 1, 3000, 32, 64, DType::F16);
    std::vector<float> row(64, 1.0f);
    for (int64_t c = 0; c < p.keys.n_bytes() / p.keys.row_bytes(); ++c) p.keys.write(c, row.data());
    std::fill(p.q.begin(), p.q.end(), -0.5f);
    std::fill(p.w.begin(), p.w.end(), 1.0f);
    for (auto precision : {IndexerPrecision::exact, IndexerPrecision::fast}) {
        for (cpu::Isa isa : levels()) {
            ThreadPool pool(2);
            const auto got = run(isa, pool, p, precision, 700);
            for (int64_t t = 0; t < p.n_tokens; ++t) {
                const auto list = p.cand[static_cast<size_t>(t)];
                EXPECT_EQ(got[static_cast<size_t>(t)], std::vector<int32_t>(list.begin(), list.begin() + 700));
            }
        }
    }
    // Identical positive scores for a block of keys in the middle: the earliest of them fill the cut.
    std::fill(p.q.begin(), p.q.end(), 0.25f);
    std::vector<float> zero(64, 0.0f), low(64, 0.5f);
    const auto &seq = p.seq_cells[0];
    for (size_t j = 0; j < seq.size(); ++j) p.keys.write(seq[j], j >= 1000 && j < 1500 ? row.data() : low.data());
    for (cpu::Isa isa : levels()) {
        ThreadPool pool(2);
        const auto got = run(isa, pool, p, IndexerPrecision::exact, 300);
        EXPECT_EQ(got.back(), std::vector<int32_t>(seq.begin() + 1000, seq.begin() + 1300));
    }
}

// NaN in a query head makes all its scores NaN (= -inf, ties by position); NaN in keys never beats a finite
// key; nothing crashes. Fast mode falls back to exact for such a query and must agree.
TEST(Indexer, NaNNeverBeatsAFiniteScore) {
    std::mt19937 rng(77);
    Problem p = make_problem(rng, 4, 1, 2000, 32, 128, DType::F16);
    fill_structured(rng, p);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    p.q[5] = nan;                            // token 0, head 0
    p.w[static_cast<size_t>(32 + 3)] = nan;  // token 1, head 3
    // Keys holding NaN: the first 100 cells of the sequence.
    std::vector<float> bad(128, 1.0f);
    bad[7] = nan;
    for (int j = 0; j < 100; ++j) p.keys.write(p.seq_cells[0][static_cast<size_t>(j)], bad.data());
    for (auto precision : {IndexerPrecision::exact, IndexerPrecision::fast}) {
        for (cpu::Isa isa : levels()) {
            ThreadPool pool(2);
            const auto got = run(isa, pool, p, precision, 64);
            const auto list0 = p.cand[0];
            EXPECT_EQ(got[0], std::vector<int32_t>(list0.begin(), list0.begin() + 64));
            EXPECT_EQ(got[1], std::vector<int32_t>(p.cand[1].begin(), p.cand[1].begin() + 64));
            for (int64_t t = 2; t < 4; ++t) {
                for (int32_t cell : got[static_cast<size_t>(t)]) {
                    const auto &sc = p.seq_cells[0];
                    EXPECT_GE(std::find(sc.begin(), sc.end(), cell) - sc.begin(), 100) << "a NaN key was selected";
                }
            }
        }
    }
}

// Short candidate lists are returned whole, with no q or w needed; top_k 0 selects nothing.
TEST(Indexer, ShortListsNeedNoScoring) {
    RowStore keys(DType::F16, 10, 32);
    std::vector<int32_t> a = {3, 1, 7}, b = {};
    std::vector<std::span<const int32_t>> cand = {a, b};
    std::vector<std::vector<int32_t>> selected(5, std::vector<int32_t>{42});
    ThreadPool pool(2);
    lightning_indexer_select(pool, {4, 32}, IndexerPrecision::exact, nullptr, nullptr, 2, keys, cand, 3, selected);
    ASSERT_EQ(selected.size(), 2u);
    EXPECT_EQ(selected[0], a);
    EXPECT_TRUE(selected[1].empty());
    std::vector<float> q(2 * 4 * 32, 1.0f), w(2 * 4, 1.0f);
    lightning_indexer_select(pool, {4, 32}, IndexerPrecision::fast, q.data(), w.data(), 2, keys, cand, 0, selected);
    EXPECT_TRUE(selected[0].empty() && selected[1].empty());
}

TEST(Indexer, BadInputsThrow) {
    RowStore keys(DType::F32, 10, 32);
    std::vector<int32_t> a = {1, 2, 10};
    std::vector<std::span<const int32_t>> cand = {a};
    std::vector<float> q(4 * 32, 1.0f), w(4, 1.0f);
    std::vector<std::vector<int32_t>> selected;
    ThreadPool pool(1);
    EXPECT_THROW(lightning_indexer_select(pool, {4, 32}, IndexerPrecision::exact, q.data(), w.data(), 1, keys, cand, 1,
                                          selected),
                 Error);  // cell 10 of a 10-cell store
    a[2] = 3;
    EXPECT_THROW(lightning_indexer_select(pool, {4, 64}, IndexerPrecision::exact, q.data(), w.data(), 1, keys, cand, 1,
                                          selected),
                 Error);  // width mismatch
    EXPECT_THROW(lightning_indexer_select(pool, {4, 32}, IndexerPrecision::exact, q.data(), w.data(), 2, keys, cand, 1,
                                          selected),
                 Error);  // 1 list for 2 tokens
}

// The selection does not depend on the thread count (splits and chunks change, scores do not), and the
// kernel levels agree up to summation order.
// Nine queries of two sequences, and one query alone (decode: the context is cut into splits, and fast mode's
// exact re-scoring of the band around the cut into pieces over the threads).
TEST(Indexer, ThreadCountsAgree) {
    struct Case {
        int64_t n_tokens, n_seq, top_k;
    };
    std::mt19937 rng(31);
    for (const Case &c : {Case{9, 2, 256}, Case{1, 1, 1024}}) {
        Problem p = make_problem(rng, c.n_tokens, c.n_seq, 5000, 32, 128, DType::F16, true);
        fill_structured(rng, p);
        for (auto precision : {IndexerPrecision::exact, IndexerPrecision::fast}) {
            ThreadPool one(1);
            const auto scalar = run(cpu::Isa::scalar, one, p, precision, c.top_k);
            for (cpu::Isa isa : levels()) {
                const auto want = run(isa, one, p, precision, c.top_k);
                for (size_t t = 0; t < want.size(); ++t) EXPECT_GE(jaccard(want[t], scalar[t]), 0.97);
                for (int n : {2, 3, 4}) {
                    ThreadPool pool(n);
                    EXPECT_EQ(run(isa, pool, p, precision, c.top_k), want)
                        << cpu::isa_name(isa) << " threads " << n << " tokens " << c.n_tokens;
                }
            }
        }
    }
}

// One workspace carried through calls that differ in every way its buffers depend on (tokens, shape, top-k,
// precision, thread count, key type: they grow, shrink back and hold stale entries from the call before) selects
// exactly what each call selects with buffers of its own.
TEST(Indexer, ReusedWorkspaceSelectsAsFreshBuffers) {
    struct Case {
        int64_t n_tokens, n_seq, last_cand, n_head, head_dim, top_k;
        DType key_type;
        IndexerPrecision precision;
        int threads;
    };
    const Case cases[] = {
        {1, 1, 3000, 32, 128, 256, DType::F16, IndexerPrecision::fast, 2},
        {9, 2, 700, 8, 64, 100, DType::F32, IndexerPrecision::exact, 3},
        {1, 1, 3000, 32, 128, 512, DType::F16, IndexerPrecision::exact, 2},
        {40, 3, 900, 12, 64, 64, DType::Q8_0, IndexerPrecision::fast, 4},
        {5, 1, 400, 8, 36, 50, DType::F32, IndexerPrecision::fast, 3},
        {1, 1, 5000, 16, 128, 1024, DType::BF16, IndexerPrecision::fast, 1},
        {2, 2, 200, 4, 32, 17, DType::F16, IndexerPrecision::fast, 2},
        {1, 1, 3000, 32, 128, 256, DType::F16, IndexerPrecision::fast, 2},
    };
    std::mt19937 rng(59);
    IndexerWorkspace workspace;
    for (const Case &c : cases) {
        Problem p = make_problem(rng, c.n_tokens, c.n_seq, c.last_cand, c.n_head, c.head_dim, c.key_type, true);
        fill_structured(rng, p);
        ThreadPool pool(c.threads);
        for (cpu::Isa isa : levels()) {
            std::vector<std::vector<int32_t>> fresh, reused;
            indexer::select_with_isa(isa, pool, p.shape, c.precision, p.q.data(), p.w.data(), p.n_tokens, p.keys,
                                     p.cand, c.top_k, fresh);
            indexer::select_with_isa(isa, pool, p.shape, c.precision, p.q.data(), p.w.data(), p.n_tokens, p.keys,
                                     p.cand, c.top_k, reused, &workspace);
            EXPECT_EQ(reused, fresh) << cpu::isa_name(isa) << " tokens " << c.n_tokens << " heads " << c.n_head
                                     << " top-k " << c.top_k;
            EXPECT_FALSE(fresh.empty() || fresh.back().empty());
        }
    }
}

// The workspace times the phases of the calls made with it (what --dsa-stats prints): a call that scores adds to
// scoring (and, in fast mode, to the exact re-scoring of its band); a call whose lists all fit in top-k scores
// nothing and leaves scoring as it was.
TEST(Indexer, WorkspaceTimesThePhases) {
    std::mt19937 rng(61);
    Problem p = make_problem(rng, 1, 1, 3000, 32, 128, DType::F16, true);
    fill_structured(rng, p);
    ThreadPool pool(2);
    IndexerWorkspace workspace;
    std::vector<std::vector<int32_t>> out;
    lightning_indexer_select(pool, p.shape, IndexerPrecision::fast, p.q.data(), p.w.data(), p.n_tokens, p.keys, p.cand,
                             256, out, &workspace);
    const SelectionPhaseSeconds after_fast = workspace.phase_seconds();
    EXPECT_GT(after_fast.score, 0.0);
    EXPECT_GT(after_fast.rescore, 0.0);
    lightning_indexer_select(pool, p.shape, IndexerPrecision::fast, p.q.data(), p.w.data(), p.n_tokens, p.keys, p.cand,
                             4096, out, &workspace);  // top-k above the 3000 candidates: nothing scored
    EXPECT_EQ(workspace.phase_seconds().score, after_fast.score);
    EXPECT_EQ(workspace.phase_seconds().rescore, after_fast.rescore);
    EXPECT_EQ(out.at(0).size(), p.cand.at(0).size());
}

// Work handed to the call beside its merge: in decode (one scored query) on two or more threads, the threads the
// merge leaves idle run it (every task done by the time the call returns, here), and the selection is what the call
// makes without it; with many queries or one thread it may not run, and the selection is the same.
TEST(Indexer, WorkBesideTheMergeRunsAndChangesNothing) {
    struct Case {
        int64_t n_tokens, n_seq;
        int threads;
        bool must_run;
    };
    std::mt19937 rng(67);
    for (const Case &c :
         {Case{1, 1, 2, true}, Case{1, 1, 3, true}, Case{3, 2, 2, true}, Case{1, 1, 1, false}, Case{40, 3, 2, false}}) {
        Problem p = make_problem(rng, c.n_tokens, c.n_seq, 3000, 32, 128, DType::F16, true);
        fill_structured(rng, p);
        ThreadPool pool(c.threads);
        for (auto precision : {IndexerPrecision::exact, IndexerPrecision::fast}) {
            std::vector<std::vector<int32_t>> plain, beside;
            lightning_indexer_select(pool, p.shape, precision, p.q.data(), p.w.data(), p.n_tokens, p.keys, p.cand, 256,
                                     plain);
            constexpr int kTasks = 64;
            std::atomic<int> next{0}, done{0};
            const std::function<void()> work = [&] {
                while (next.fetch_add(1) < kTasks) done.fetch_add(1);
            };
            IndexerWorkspace workspace;
            lightning_indexer_select(pool, p.shape, precision, p.q.data(), p.w.data(), p.n_tokens, p.keys, p.cand, 256,
                                     beside, &workspace, work);
            EXPECT_EQ(beside, plain) << c.n_tokens << " tokens, " << c.threads << " threads";
            if (c.must_run) {
                EXPECT_EQ(done.load(), kTasks) << c.n_tokens << " tokens, " << c.threads << " threads";
            }
            if (c.threads == 1) {
                EXPECT_EQ(done.load(), 0);
            }
        }
    }
}

// Fast mode keeps the selection: mean Jaccard with exact mode >= 0.98 at H 32, D 128, contexts to 16K, over an
// f16 key store (keys re-quantised to int8 per use) and a Q8_0 one (its int8 blocks read in place; exact mode
// scores the same stored keys widened to f32).
TEST(Indexer, FastModeJaccardAgainstExact) {
    struct Case {
        int64_t n_tokens, context, top_k;
        DType key_type;
    };
    std::mt19937 rng(2024);
    ThreadPool pool(2);
    for (const Case &c :
         {Case{8, 4096, 64, DType::F16}, Case{8, 4096, 2048, DType::F16}, Case{4, 16384, 64, DType::F16},
          Case{4, 16384, 2048, DType::F16}, Case{8, 4096, 64, DType::Q8_0}, Case{4, 16384, 2048, DType::Q8_0}}) {
        Problem p = make_problem(rng, c.n_tokens, 1, c.context, 32, 128, c.key_type);
        fill_structured(rng, p);
        for (cpu::Isa isa : levels()) {
            if (isa == cpu::Isa::scalar && c.context > 4096) continue;  // the scalar loops are slow under ASan
            const auto exact = run(isa, pool, p, IndexerPrecision::exact, c.top_k);
            const auto fast = run(isa, pool, p, IndexerPrecision::fast, c.top_k);
            double sum = 0.0;
            for (int64_t t = 0; t < c.n_tokens; ++t)
                sum += jaccard(exact[static_cast<size_t>(t)], fast[static_cast<size_t>(t)]);
            const double mean = sum / double(c.n_tokens);
            RecordProperty("jaccard_" + std::string(dtype_name(c.key_type)) + "_" + std::to_string(c.context) + "_" +
                               std::to_string(c.top_k),
                           std::to_string(mean));
            std::printf("fast vs exact (%s, %s keys): context %lld top_k %lld: mean Jaccard %.4f\n", cpu::isa_name(isa),
                        std::string(dtype_name(c.key_type)).c_str(), static_cast<long long>(c.context),
                        static_cast<long long>(c.top_k), mean);
            EXPECT_GE(mean, 0.98) << "context " << c.context << " top_k " << c.top_k;
        }
        if (cpu::cpu_has_avx_vnni()) {  // the plain AVX2 loops (6-bit queries), which the avx2 level above skipped
            const double mean = mean_jaccard(run(cpu::Isa::avx2, pool, p, IndexerPrecision::exact, c.top_k),
                                             run_maddubs(pool, p, IndexerPrecision::fast, c.top_k));
            std::printf("fast vs exact (avx2 maddubs, %s keys): context %lld top_k %lld: mean Jaccard %.4f\n",
                        std::string(dtype_name(c.key_type)).c_str(), static_cast<long long>(c.context),
                        static_cast<long long>(c.top_k), mean);
            EXPECT_GE(mean, 0.98) << "maddubs, context " << c.context << " top_k " << c.top_k;
        }
    }
}

// Fast mode with outlier channels, as real indexer keys have (make-model --outlier-channels): four key channels
// scaled up 20x and the queries' same channels down 20x (the scores are unchanged), so one channel sets each key
// row's int8 scale and the queries' small channels round to few steps. Fast mode quantises rotated keys and
// queries (RowStore::int8_rotation); with 8-bit queries (scalar, VNNI) its selections are exact mode's, with AVX2's
// 6-bit ones near them (unrotated, on the e2e outlier models, 6-bit queries kept a mean Jaccard of 0.78-0.83,
// 8-bit 0.97-0.98; rotated, 8-bit 1.0).
TEST(Indexer, FastModeJaccardWithOutlierChannels) {
    std::mt19937 rng(2026);
    ThreadPool pool(2);
    const int64_t n_tokens = 8, context = 4096, top_k = 512, H = 32, D = 128;
    Problem p = make_problem(rng, n_tokens, 1, context, H, D, DType::F16);
    fill_structured(rng, p);
    std::vector<float> row(static_cast<size_t>(D));
    for (int64_t c = 0; c < context; ++c) {
        p.keys.read(c, row.data());
        for (int64_t i = 0; i < 4; ++i) row[static_cast<size_t>(17 * i + 3)] *= 20.0f;
        p.keys.write(c, row.data());
    }
    for (int64_t r = 0; r < n_tokens * H; ++r) {
        for (int64_t i = 0; i < 4; ++i) p.q[static_cast<size_t>(r * D + 17 * i + 3)] /= 20.0f;
    }
    for (cpu::Isa isa : levels()) {
        const auto exact = run(isa, pool, p, IndexerPrecision::exact, top_k);
        const auto fast = run(isa, pool, p, IndexerPrecision::fast, top_k);
        double sum = 0.0;
        for (int64_t t = 0; t < n_tokens; ++t)
            sum += jaccard(exact[static_cast<size_t>(t)], fast[static_cast<size_t>(t)]);
        const double mean = sum / double(n_tokens);
        const bool wide = indexer::query_offset_for(isa) == indexer::kQueryOffsetDpbusd;
        std::printf("fast vs exact with outlier channels (%s, %s queries): mean Jaccard %.4f\n", cpu::isa_name(isa),
                    wide ? "8-bit" : "6-bit", mean);
        if (wide) {
            EXPECT_GE(mean, 0.98) << cpu::isa_name(isa);
        }
    }
    if (cpu::cpu_has_avx_vnni()) {  // the avx2 level above ran AVX-VNNI's 8-bit queries: the 6-bit path too
        const double mean = mean_jaccard(run(cpu::Isa::avx2, pool, p, IndexerPrecision::exact, top_k),
                                         run_maddubs(pool, p, IndexerPrecision::fast, top_k));
        std::printf("fast vs exact with outlier channels (avx2 maddubs, 6-bit queries): mean Jaccard %.4f\n", mean);
        EXPECT_GE(mean, 0.97);  // 0.982 measured (0.966 before the rotation)
    }
}

// A key store with an int8 copy (RowStore::keep_int8_copy) gives fast mode exactly the selection it makes by
// quantising each key per use, at every ISA level and thread count, decode and prefill, f16 and bf16 keys.
TEST(Indexer, FastModeOverAnInt8CopySelectsTheSame) {
    std::mt19937 rng(2025);
    ThreadPool pool(2), one(1);
    for (const DType type : {DType::F16, DType::BF16, DType::F32}) {
        for (const int64_t n_tokens : {1, 6}) {
            Problem p = make_problem(rng, n_tokens, 1, 3000, 32, 128, type);
            fill_structured(rng, p);
            for (cpu::Isa isa : levels()) {
                const auto want = run(isa, pool, p, IndexerPrecision::fast, 256);
                Problem with_copy = p;
                with_copy.keys.keep_int8_copy(indexer_key_quantizer(), indexer_int8_width(p.shape.head_dim));
                EXPECT_EQ(run(isa, pool, with_copy, IndexerPrecision::fast, 256), want)
                    << dtype_name(type) << " " << cpu::isa_name(isa) << " tokens " << n_tokens;
                EXPECT_EQ(run(isa, one, with_copy, IndexerPrecision::fast, 256), want)
                    << dtype_name(type) << " " << cpu::isa_name(isa) << " one thread";
            }
        }
    }
}

// Fast-mode query bytes for q_offset (indexer_kernels.h): q_int + q_offset with q_int in [1 - q_offset,
// q_offset - 1], a few exact extremes and zeros among random values.
std::vector<uint8_t> random_query_bytes(std::mt19937 &rng, size_t n, int q_offset) {
    const int qmax = q_offset - 1;
    std::uniform_int_distribution<int> qd(-qmax, qmax);
    std::vector<uint8_t> qT4(n);
    for (auto &v : qT4) {
        const int r = rng() % 8;
        const int q = r == 0 ? qmax : (r == 1 ? -qmax : (r == 2 ? 0 : qd(rng)));
        v = static_cast<uint8_t>(q + q_offset);
    }
    return qT4;
}

// The int8 kernels: AVX2 quantisation is bit-identical to the scalar one (same rounding, same sums), the
// AVX2 scores (and the AVX512-VNNI ones, where the CPU has them) equal the scalar ones up to f32 summation
// order, on awkward sizes (heads not a multiple of
// 8 or 32, widths not a multiple of 4 or 8, odd key counts) and with extreme queries (+-qmax and 0).
TEST(IndexerKernels, Int8Avx2MatchesScalar) {
    if (!cpu::cpu_supports(cpu::Isa::avx2)) GTEST_SKIP() << "no AVX2";
    std::mt19937 rng(77);
    for (int64_t d : {1, 3, 4, 7, 9, 32, 130}) {
        const int64_t dp = (d + 3) / 4 * 4;
        for (int64_t hp : {8, 16, 24, 40}) {       // VNNI: 16-head vectors, the last one masked to 8 heads
            for (int64_t n : {1, 2, 5, 15, 64}) {  // VNNI: blocks of 8 keys, then 4, 2, 1
                const auto x = test::random_floats(rng, static_cast<size_t>(n * d), -3, 3);
                std::vector<uint16_t> f16(x.size());
                quantize_row(DType::F16, x.data(), f16.data(), static_cast<int64_t>(x.size()));
                std::vector<const void *> rows(static_cast<size_t>(n));
                for (int64_t j = 0; j < n; ++j) rows[static_cast<size_t>(j)] = f16.data() + j * d;
                std::vector<int8_t> k_ref(static_cast<size_t>(n * dp), 9), k_got = k_ref;
                std::vector<float> ks_ref(static_cast<size_t>(n)), ks_got(static_cast<size_t>(n));
                std::vector<int32_t> sum_ref(static_cast<size_t>(n)), sum_got(static_cast<size_t>(n));
                indexer::scalar::quantize_keys(indexer::kRowF16, rows.data(), n, d, dp, k_ref.data(), ks_ref.data(),
                                               sum_ref.data());
                indexer::avx2::quantize_keys(indexer::kRowF16, rows.data(), n, d, dp, k_got.data(), ks_got.data(),
                                             sum_got.data());
                ASSERT_EQ(k_got, k_ref) << d << " " << n;
                ASSERT_EQ(ks_got, ks_ref) << d << " " << n;
                ASSERT_EQ(sum_got, sum_ref) << d << " " << n;
                // AVX2 against scalar with 6-bit queries, VNNI against scalar with 8-bit ones (each level's format)
                const auto q6 = random_query_bytes(rng, static_cast<size_t>(dp * hp), indexer::kQueryOffsetMaddubs);
                const auto q8 = random_query_bytes(rng, static_cast<size_t>(dp * hp), indexer::kQueryOffsetDpbusd);
                const auto wq = test::random_floats(rng, static_cast<size_t>(hp), 0, 1);
                std::vector<float> s_ref(static_cast<size_t>(n)), s_got(static_cast<size_t>(n));
                indexer::scalar::score_i8(q6.data(), wq.data(), hp, dp, k_ref.data(), sum_ref.data(), ks_ref.data(), n,
                                          s_ref.data(), indexer::kQueryOffsetMaddubs);
                indexer::avx2::score_i8(q6.data(), wq.data(), hp, dp, k_ref.data(), sum_ref.data(), ks_ref.data(), n,
                                        s_got.data(), indexer::kQueryOffsetMaddubs);
                for (int64_t j = 0; j < n; ++j)
                    ASSERT_NEAR(s_got[j], s_ref[j], 1e-5f * (1 + std::fabs(s_ref[j]))) << d << " " << hp << " " << n;
                indexer::scalar::score_i8(q8.data(), wq.data(), hp, dp, k_ref.data(), sum_ref.data(), ks_ref.data(), n,
                                          s_ref.data(), indexer::kQueryOffsetDpbusd);
                if (cpu::cpu_has_avx_vnni()) {
                    std::vector<float> s_vnni(static_cast<size_t>(n), -7.0f);
                    indexer::avx2::score_i8_avxvnni(q8.data(), wq.data(), hp, dp, k_ref.data(), sum_ref.data(),
                                                    ks_ref.data(), n, s_vnni.data(), indexer::kQueryOffsetDpbusd);
                    for (int64_t j = 0; j < n; ++j)
                        ASSERT_NEAR(s_vnni[j], s_ref[j], 1e-5f * (1 + std::fabs(s_ref[j])))
                            << "AVX-VNNI " << d << " " << hp << " " << n;
                }
                if (cpu::cpu_has_avx512_vnni()) {
                    std::vector<float> s_vnni(static_cast<size_t>(n), -7.0f);
                    indexer::avx512vnni::score_i8(q8.data(), wq.data(), hp, dp, k_ref.data(), sum_ref.data(),
                                                  ks_ref.data(), n, s_vnni.data(), indexer::kQueryOffsetDpbusd);
                    for (int64_t j = 0; j < n; ++j)
                        ASSERT_NEAR(s_vnni[j], s_ref[j], 1e-5f * (1 + std::fabs(s_ref[j])))
                            << d << " " << hp << " " << n;
                }
            }
        }
    }
}

// The integer sums of the int8 kernels at their bounds: every key byte +-kKeyQuantMax and every query at +-qmax of
// its level's format. AVX2 (6-bit queries): each maddubs pair and the sum of two groups reach their largest
// magnitude (32004 < 32767, indexer_kernels.h); a saturating sum would differ from the scalar kernel's exact int32
// dot. AVX-VNNI and AVX512-VNNI (8-bit queries, bytes 1 and 255): vpdpbusd must not saturate either. Over int8 rows and
// over Q8_0 rows (the same bytes with block scales).
TEST(IndexerKernels, Int8ExtremesDoNotSaturate) {
    if (!cpu::cpu_supports(cpu::Isa::avx2)) GTEST_SKIP() << "no AVX2";
    const int64_t d = 64, hp = 16, n = 4;
    // Rows: all +127, all -127, alternating signs per pair of groups, all +127 but one.
    std::vector<int8_t> keys(static_cast<size_t>(n * d));
    for (int64_t i = 0; i < d; ++i) {
        keys[static_cast<size_t>(i)] = indexer::kKeyQuantMax;
        keys[static_cast<size_t>(d + i)] = -indexer::kKeyQuantMax;
        keys[static_cast<size_t>(2 * d + i)] = (i / 8) % 2 ? -indexer::kKeyQuantMax : indexer::kKeyQuantMax;
        keys[static_cast<size_t>(3 * d + i)] = i == 5 ? 0 : indexer::kKeyQuantMax;
    }
    std::vector<int32_t> ksum(static_cast<size_t>(n), 0);
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < d; ++i) ksum[static_cast<size_t>(j)] += keys[static_cast<size_t>(j * d + i)];
    }
    // The same bytes as Q8_0 blocks with scale 1.
    std::vector<BlockQ8_0> blocks(static_cast<size_t>(n * d / QK8_0));
    std::vector<const void *> rows(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
        for (int64_t b = 0; b < d / QK8_0; ++b) {
            BlockQ8_0 &blk = blocks[static_cast<size_t>(j * d / QK8_0 + b)];
            blk.d = f32_to_fp16(1.0f);
            std::memcpy(blk.qs, keys.data() + j * d + b * QK8_0, QK8_0);
        }
        rows[static_cast<size_t>(j)] = blocks.data() + j * d / QK8_0;
    }
    const std::vector<float> kscale(static_cast<size_t>(n), 0.5f), wq(static_cast<size_t>(hp), 1.0f);
    for (int qs : {1, -1}) {
        for (const int offset : {indexer::kQueryOffsetMaddubs, indexer::kQueryOffsetDpbusd}) {
            const bool vnni = offset == indexer::kQueryOffsetDpbusd;
            const std::vector<uint8_t> qT4(static_cast<size_t>(d * hp),
                                           static_cast<uint8_t>(qs * (offset - 1) + offset));
            std::vector<float> s_ref(static_cast<size_t>(n)), s_got(static_cast<size_t>(n));
            indexer::scalar::score_i8(qT4.data(), wq.data(), hp, d, keys.data(), ksum.data(), kscale.data(), n,
                                      s_ref.data(), offset);
            // The score of row 0 (all +127) is known: 0.5 * 16 heads * relu(qs * qmax * 127 * 64).
            EXPECT_EQ(s_ref[0], qs > 0 ? 0.5f * 16 * float((offset - 1) * 127 * 64) : 0.0f) << "offset " << offset;
            std::vector<float> q_ref(static_cast<size_t>(n)), q_got(static_cast<size_t>(n));
            indexer::scalar::score_q8_0(qT4.data(), wq.data(), hp, d, rows.data(), n, q_ref.data(), offset);
            if (!vnni) {
                indexer::avx2::score_i8(qT4.data(), wq.data(), hp, d, keys.data(), ksum.data(), kscale.data(), n,
                                        s_got.data(), offset);
                EXPECT_EQ(s_got, s_ref) << "queries " << qs;
                indexer::avx2::score_q8_0(qT4.data(), wq.data(), hp, d, rows.data(), n, q_got.data(), offset);
                EXPECT_EQ(q_got, q_ref) << "queries " << qs << " (Q8_0)";
                continue;
            }
            if (cpu::cpu_has_avx_vnni()) {  // the AVX2 loops with vpdpbusd: the f32 steps of the AVX2 kernel
                indexer::avx2::score_i8_avxvnni(qT4.data(), wq.data(), hp, d, keys.data(), ksum.data(), kscale.data(),
                                                n, s_got.data(), offset);
                EXPECT_EQ(s_got, s_ref) << "queries " << qs << " (AVX-VNNI)";
                indexer::avx2::score_q8_0_avxvnni(qT4.data(), wq.data(), hp, d, rows.data(), n, q_got.data(), offset);
                EXPECT_EQ(q_got, q_ref) << "queries " << qs << " (AVX-VNNI, Q8_0)";
            }
            if (!cpu::cpu_has_avx512_vnni()) continue;
            // exact int32 sums too; the heads are summed in another f32 order
            indexer::avx512vnni::score_i8(qT4.data(), wq.data(), hp, d, keys.data(), ksum.data(), kscale.data(), n,
                                          s_got.data(), offset);
            indexer::avx512vnni::score_q8_0(qT4.data(), wq.data(), hp, d, rows.data(), n, q_got.data(), offset);
            for (int64_t j = 0; j < n; ++j) {
                EXPECT_NEAR(s_got[j], s_ref[j], 1e-5f * (1 + s_ref[j])) << "queries " << qs << " (VNNI)";
                EXPECT_NEAR(q_got[j], q_ref[j], 1e-5f * (1 + q_ref[j])) << "queries " << qs << " (VNNI, Q8_0)";
            }
        }
    }
}

// The f32 (exact-mode) kernel: the AVX2 scores equal the scalar ones up to f32 summation order for f32, f16
// and bf16 key rows read in place, on awkward sizes: key counts around its 3-key blocks (8 on AVX-512), heads that take
// 1 to 4 vectors and a second pass, and rows wider than its 512-element widening buffer.
TEST(IndexerKernels, F32Avx2MatchesScalar) {
    if (!cpu::cpu_supports(cpu::Isa::avx2)) GTEST_SKIP() << "no AVX2";
    std::mt19937 rng(78);
    for (const DType type : {DType::F32, DType::F16, DType::BF16}) {
        for (int64_t d : {1, 7, 32, 128, 515, 1100}) {
            for (int64_t hp : {8, 16, 24, 40}) {
                for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 13, 17}) {
                    const auto x = test::random_floats(rng, static_cast<size_t>(n * d), -3, 3);
                    const int64_t row_bytes = dtype_row_size(type, d);
                    std::vector<uint8_t> data(static_cast<size_t>(n * row_bytes));
                    std::vector<const void *> rows(static_cast<size_t>(n));
                    for (int64_t j = 0; j < n; ++j) {
                        quantize_row(type, x.data() + j * d, data.data() + j * row_bytes, d);
                        rows[static_cast<size_t>(j)] = data.data() + j * row_bytes;
                    }
                    const auto qT = test::random_floats(rng, static_cast<size_t>(d * hp), -1, 1);
                    const auto w = test::random_floats(rng, static_cast<size_t>(hp), -1, 1);
                    std::vector<float> s_ref(static_cast<size_t>(n)), s_got(static_cast<size_t>(n), -7.0f);
                    const auto row_type = static_cast<uint32_t>(type);
                    indexer::scalar::score_f32(row_type, qT.data(), w.data(), hp, d, rows.data(), n, s_ref.data());
                    indexer::avx2::score_f32(row_type, qT.data(), w.data(), hp, d, rows.data(), n, s_got.data());
                    for (int64_t j = 0; j < n; ++j) {
                        ASSERT_NEAR(s_got[j], s_ref[j], 1e-4f * (1 + std::fabs(s_ref[j])))
                            << dtype_name(type) << " d " << d << " hp " << hp << " n " << n << " j " << j;
                    }
                    if (cpu::cpu_supports(cpu::Isa::avx512)) {
                        std::vector<float> s_512(static_cast<size_t>(n), -7.0f);
                        indexer::avx512::score_f32(row_type, qT.data(), w.data(), hp, d, rows.data(), n, s_512.data());
                        for (int64_t j = 0; j < n; ++j) {
                            ASSERT_NEAR(s_512[j], s_ref[j], 1e-4f * (1 + std::fabs(s_ref[j])))
                                << "avx512 " << dtype_name(type) << " d " << d << " hp " << hp << " n " << n << " j "
                                << j;
                        }
                    }
                }
            }
        }
    }
}

// The fast kernel over Q8_0 rows read in place: AVX2 equals scalar up to f32 summation order, on widths of 1 to
// 5 blocks, heads that take 1 to 4 vectors and a second pass, odd key counts, extreme queries and keys (+-127).
TEST(IndexerKernels, Q8_0Avx2MatchesScalar) {
    if (!cpu::cpu_supports(cpu::Isa::avx2)) GTEST_SKIP() << "no AVX2";
    std::mt19937 rng(79);
    for (int64_t d : {32, 64, 128, 160}) {
        for (int64_t hp : {8, 24, 40}) {
            for (int64_t n : {1, 2, 5, 7}) {
                auto x = test::random_floats(rng, static_cast<size_t>(n * d), -3, 3);
                x[0] = 50.0f;  // a block whose scale puts other elements at +-127 after rounding
                const int64_t row_bytes = dtype_row_size(DType::Q8_0, d);
                std::vector<uint8_t> data(static_cast<size_t>(n * row_bytes));
                std::vector<const void *> rows(static_cast<size_t>(n));
                for (int64_t j = 0; j < n; ++j) {
                    quantize_row(DType::Q8_0, x.data() + j * d, data.data() + j * row_bytes, d);
                    rows[static_cast<size_t>(j)] = data.data() + j * row_bytes;
                }
                const auto q6 = random_query_bytes(rng, static_cast<size_t>(d * hp), indexer::kQueryOffsetMaddubs);
                const auto q8 = random_query_bytes(rng, static_cast<size_t>(d * hp), indexer::kQueryOffsetDpbusd);
                const auto wq = test::random_floats(rng, static_cast<size_t>(hp), -1, 1);
                std::vector<float> s_ref(static_cast<size_t>(n)), s_got(static_cast<size_t>(n), -7.0f);
                indexer::scalar::score_q8_0(q6.data(), wq.data(), hp, d, rows.data(), n, s_ref.data(),
                                            indexer::kQueryOffsetMaddubs);
                indexer::avx2::score_q8_0(q6.data(), wq.data(), hp, d, rows.data(), n, s_got.data(),
                                          indexer::kQueryOffsetMaddubs);
                for (int64_t j = 0; j < n; ++j)
                    ASSERT_NEAR(s_got[j], s_ref[j], 1e-5f * (1 + std::fabs(s_ref[j]))) << d << " " << hp << " " << n;
                indexer::scalar::score_q8_0(q8.data(), wq.data(), hp, d, rows.data(), n, s_ref.data(),
                                            indexer::kQueryOffsetDpbusd);
                if (cpu::cpu_has_avx_vnni()) {
                    std::vector<float> s_vnni(static_cast<size_t>(n), -7.0f);
                    indexer::avx2::score_q8_0_avxvnni(q8.data(), wq.data(), hp, d, rows.data(), n, s_vnni.data(),
                                                      indexer::kQueryOffsetDpbusd);
                    for (int64_t j = 0; j < n; ++j)
                        ASSERT_NEAR(s_vnni[j], s_ref[j], 1e-5f * (1 + std::fabs(s_ref[j])))
                            << "AVX-VNNI " << d << " " << hp << " " << n;
                }
                if (cpu::cpu_has_avx512_vnni()) {
                    std::vector<float> s_vnni(static_cast<size_t>(n), -7.0f);
                    indexer::avx512vnni::score_q8_0(q8.data(), wq.data(), hp, d, rows.data(), n, s_vnni.data(),
                                                    indexer::kQueryOffsetDpbusd);
                    for (int64_t j = 0; j < n; ++j)
                        ASSERT_NEAR(s_vnni[j], s_ref[j], 1e-5f * (1 + std::fabs(s_ref[j])))
                            << d << " " << hp << " " << n;
                }
            }
        }
    }
}

}  // namespace
}  // namespace sparrow
