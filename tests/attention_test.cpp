// attention() against a plain double-precision softmax attention on random caches: grouped heads, every
// cache row type, V as a slice of K (MLA), row lists of awkward lengths (0, 1, tile +- 1, long) in any
// order, and several thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "attention/attention.h"
#include "attention/attention_kernels.h"
#include "kernels/cpu/dispatch.h"
#include "test_util.h"

namespace sparrow {
namespace {

struct Case {
    int64_t n_head, n_head_kv, dk, dv, v_offset;
    bool v_in_k;  // V read from the K store (MLA)
    DType type;
};

std::vector<float> reference(const Case &c, const std::vector<float> &q, int64_t n_tokens,
                             const std::vector<std::vector<float>> &k_rows,
                             const std::vector<std::vector<float>> &v_rows,
                             const std::vector<std::vector<int32_t>> &lists, float scale) {
    const int64_t group = c.n_head / c.n_head_kv;
    std::vector<float> out(static_cast<size_t>(n_tokens * c.n_head * c.dv), 0.0f);
    for (int64_t t = 0; t < n_tokens; ++t) {
        for (int64_t h = 0; h < c.n_head; ++h) {
            const int64_t kvh = h / group;
            const auto &list = lists[t];
            if (list.empty()) continue;
            std::vector<double> s(list.size());
            double m = -INFINITY;
            for (size_t j = 0; j < list.size(); ++j) {
                double d = 0;
                for (int64_t i = 0; i < c.dk; ++i)
                    d += double(q[(t * c.n_head + h) * c.dk + i]) * k_rows[list[j]][kvh * c.dk + i];
                s[j] = d * scale;
                m = std::max(m, s[j]);
            }
            double z = 0;
            for (auto &v : s) z += (v = std::exp(v - m));
            for (int64_t i = 0; i < c.dv; ++i) {
                double o = 0;
                for (size_t j = 0; j < list.size(); ++j) {
                    const auto &vr = c.v_in_k ? k_rows[list[j]] : v_rows[list[j]];
                    o += s[j] / z * vr[c.v_offset + kvh * c.dv + i];
                }
                out[(t * c.n_head + h) * c.dv + i] = static_cast<float>(o);
            }
        }
    }
    return out;
}

TEST(Attention, MatchesDoubleReference) {
    const std::vector<Case> cases = {
        {4, 4, 8, 8, 0, false, DType::F32},     {8, 2, 16, 16, 0, false, DType::F16},
        {6, 3, 24, 40, 0, false, DType::BF16},  {16, 1, 72, 64, 0, true, DType::F16},
        {5, 1, 36, 32, 0, true, DType::F32},    {2, 1, 64, 48, 16, false, DType::F32},
        {128, 1, 40, 32, 0, true, DType::BF16}, {32, 2, 24, 40, 0, false, DType::F16},
    };
    std::mt19937 rng(3);
    int n_checked = 0;
    for (const Case &c : cases) {
        for (int n_threads : {1, 2, 3}) {
            const int64_t n_cells = 300, n_tokens = 6;
            RowStore k(c.type, n_cells, c.n_head_kv * c.dk);
            RowStore v(c.type, n_cells, c.v_offset + c.n_head_kv * c.dv);
            std::vector<std::vector<float>> k_rows(n_cells), v_rows(n_cells);
            std::vector<float> buf;
            for (int64_t cell = 0; cell < n_cells; ++cell) {
                buf = test::random_floats(rng, static_cast<size_t>(k.width()), -2, 2);
                k.write(cell, buf.data());
                k_rows[cell].resize(buf.size());
                dequantize_row(c.type, k.row(cell), k_rows[cell].data(), k.width());  // what the store holds
                buf = test::random_floats(rng, static_cast<size_t>(v.width()), -2, 2);
                v.write(cell, buf.data());
                v_rows[cell].resize(buf.size());
                dequantize_row(c.type, v.row(cell), v_rows[cell].data(), v.width());
            }
            const auto q = test::random_floats(rng, static_cast<size_t>(n_tokens * c.n_head * c.dk), -1, 1);
            // Lists of 0, 1, 15, 16, 17 and 250 rows, shuffled cells.
            std::vector<std::vector<int32_t>> lists;
            for (int64_t len : {0, 1, 15, 16, 17, 250}) {
                std::vector<int32_t> all(n_cells);
                for (int32_t i = 0; i < n_cells; ++i) all[i] = i;
                std::shuffle(all.begin(), all.end(), rng);
                lists.emplace_back(all.begin(), all.begin() + len);
            }
            std::vector<std::span<const int32_t>> spans(lists.begin(), lists.end());
            const float scale = 0.3f;
            AttentionShape shape{c.n_head, c.n_head_kv, c.dk, c.dv, scale, c.v_offset};
            std::vector<float> got(static_cast<size_t>(n_tokens * c.n_head * c.dv), -1.0f);
            ThreadPool pool(n_threads);
            attention(pool, shape, q.data(), n_tokens, k, c.v_in_k ? k : v, spans, got.data());
            const auto want = reference(c, q, n_tokens, k_rows, v_rows, lists, scale);
            for (size_t i = 0; i < got.size(); ++i) {
                ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i])))
                    << "case heads " << c.n_head << "/" << c.n_head_kv << " dk " << c.dk << " type "
                    << dtype_name(c.type) << " threads " << n_threads << " index " << i;
            }
            ++n_checked;
        }
    }
    EXPECT_EQ(n_checked, 24);
}

// One workspace carried through calls that differ in heads, widths, groups (head-lane and head-blocked paths),
// token counts (prefill pairs, decode lists cut between threads) and thread counts gives the bits of calls with
// buffers of their own: nothing left from one call leaks into the next.
TEST(Attention, ReusedWorkspaceGivesTheSameBits) {
    struct Call {
        Case c;
        int64_t n_tokens, list_len;
        int threads;
    };
    const Call calls[] = {
        {{16, 1, 72, 64, 0, true, DType::F16}, 1, 1000, 3}, {{8, 2, 16, 16, 0, false, DType::F16}, 5, 40, 2},
        {{32, 1, 40, 32, 0, true, DType::BF16}, 7, 300, 1}, {{16, 1, 72, 64, 0, true, DType::F16}, 1, 600, 2},
        {{6, 3, 24, 40, 0, false, DType::F32}, 3, 250, 4},  {{2, 1, 64, 48, 16, false, DType::F32}, 1, 900, 3},
        {{16, 1, 72, 64, 0, true, DType::F16}, 4, 17, 2},
    };
    std::mt19937 rng(17);
    AttentionWorkspace workspace;
    for (const Call &call : calls) {
        const Case &c = call.c;
        const int64_t n_cells = 1000;
        RowStore k(c.type, n_cells, c.n_head_kv * c.dk), v(c.type, n_cells, c.v_offset + c.n_head_kv * c.dv);
        for (int64_t cell = 0; cell < n_cells; ++cell) {
            k.write(cell, test::random_floats(rng, static_cast<size_t>(k.width()), -2, 2).data());
            v.write(cell, test::random_floats(rng, static_cast<size_t>(v.width()), -2, 2).data());
        }
        std::vector<std::vector<int32_t>> lists;
        for (int64_t t = 0; t < call.n_tokens; ++t) {
            std::vector<int32_t> all(n_cells);
            for (int32_t i = 0; i < n_cells; ++i) all[i] = i;
            std::shuffle(all.begin(), all.end(), rng);
            lists.emplace_back(all.begin(), all.begin() + call.list_len - t % 3);
        }
        const std::vector<std::span<const int32_t>> spans(lists.begin(), lists.end());
        const auto q = test::random_floats(rng, static_cast<size_t>(call.n_tokens * c.n_head * c.dk), -1, 1);
        const AttentionShape shape{c.n_head, c.n_head_kv, c.dk, c.dv, 0.3f, c.v_offset};
        ThreadPool pool(call.threads);
        std::vector<float> fresh(static_cast<size_t>(call.n_tokens * c.n_head * c.dv), -1.0f), reused(fresh);
        attention(pool, shape, q.data(), call.n_tokens, k, c.v_in_k ? k : v, spans, fresh.data());
        attention(pool, shape, q.data(), call.n_tokens, k, c.v_in_k ? k : v, spans, reused.data(), &workspace);
        EXPECT_EQ(reused, fresh) << "heads " << c.n_head << "/" << c.n_head_kv << " tokens " << call.n_tokens
                                 << " threads " << call.threads;
    }
}

// Decode shape (one token, MLA: one KV head, V inside K) with long lists, which attention() cuts between
// threads and merges; the result must not depend on the cut.
TEST(Attention, SplitListsMatchReference) {
    const Case c{16, 1, 72, 64, 0, true, DType::F16};
    std::mt19937 rng(5);
    const int64_t n_cells = 1200;
    RowStore k(c.type, n_cells, c.dk);
    std::vector<std::vector<float>> k_rows(n_cells);
    for (int64_t cell = 0; cell < n_cells; ++cell) {
        const auto buf = test::random_floats(rng, static_cast<size_t>(c.dk), -2, 2);
        k.write(cell, buf.data());
        k_rows[cell].resize(buf.size());
        dequantize_row(c.type, k.row(cell), k_rows[cell].data(), c.dk);
    }
    for (int64_t len : {100, 150, 255, 256, 513, 1000, 1200}) {
        std::vector<int32_t> all(n_cells);
        for (int32_t i = 0; i < n_cells; ++i) all[i] = i;
        std::shuffle(all.begin(), all.end(), rng);
        const std::vector<std::vector<int32_t>> lists = {std::vector<int32_t>(all.begin(), all.begin() + len)};
        const std::vector<std::span<const int32_t>> spans(lists.begin(), lists.end());
        const auto q = test::random_floats(rng, static_cast<size_t>(c.n_head * c.dk), -1, 1);
        const auto want = reference(c, q, 1, k_rows, {}, lists, 0.3f);
        for (int n_threads : {1, 2, 3, 5}) {
            ThreadPool pool(n_threads);
            std::vector<float> got(static_cast<size_t>(c.n_head * c.dv), -1.0f);
            attention(pool, AttentionShape{c.n_head, 1, c.dk, c.dv, 0.3f, 0}, q.data(), 1, k, k, spans, got.data());
            for (size_t i = 0; i < got.size(); ++i)
                ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << len << " " << n_threads << " " << i;
        }
    }
}

// Prefill shapes: consecutive tokens whose lists share a prefix (causal: each token's list is the previous one's
// plus a row; also a shorter second list, a partly shared one and one sharing nothing), an odd token count,
// several thread counts. On AVX-512 the head-lane path scores each pair's shared rows (at least 64 of them)
// with the x2 kernels: here the 140/141, 142/143, 300/301, 150/97 and 160/partly pairs.
TEST(Attention, SharedPrefixListsMatchReference) {
    for (const Case c : {Case{16, 1, 72, 64, 0, true, DType::F16}, Case{32, 2, 24, 40, 0, false, DType::BF16}}) {
        std::mt19937 rng(6);
        const int64_t n_cells = 400;
        RowStore k(c.type, n_cells, c.n_head_kv * c.dk), v(c.type, n_cells, c.v_offset + c.n_head_kv * c.dv);
        std::vector<std::vector<float>> k_rows(n_cells), v_rows(n_cells);
        for (int64_t cell = 0; cell < n_cells; ++cell) {
            auto buf = test::random_floats(rng, static_cast<size_t>(k.width()), -2, 2);
            k.write(cell, buf.data());
            k_rows[cell].resize(buf.size());
            dequantize_row(c.type, k.row(cell), k_rows[cell].data(), k.width());
            buf = test::random_floats(rng, static_cast<size_t>(v.width()), -2, 2);
            v.write(cell, buf.data());
            v_rows[cell].resize(buf.size());
            dequantize_row(c.type, v.row(cell), v_rows[cell].data(), v.width());
        }
        std::vector<int32_t> order(n_cells);
        for (int32_t i = 0; i < n_cells; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<std::vector<int32_t>> lists;
        for (int64_t len : {140, 141, 142, 143, 300, 301})
            lists.emplace_back(order.begin(), order.begin() + len);  // causal
        lists.emplace_back(order.begin(), order.begin() + 150);      // then a shorter list
        lists.emplace_back(order.begin(), order.begin() + 97);
        std::vector<int32_t> partly(order.begin(), order.begin() + 160);
        std::reverse(partly.begin() + 100, partly.end());
        lists.emplace_back(order.begin(), order.begin() + 160);
        lists.push_back(partly);                                  // shares 100 rows, then differs
        lists.emplace_back(order.rbegin(), order.rbegin() + 20);  // shares nothing with the next
        lists.emplace_back(order.begin(), order.begin() + 1);
        lists.emplace_back(order.begin(), order.begin() + 129);  // odd count: the last token is alone
        const auto n_tokens = static_cast<int64_t>(lists.size());
        const std::vector<std::span<const int32_t>> spans(lists.begin(), lists.end());
        const auto q = test::random_floats(rng, static_cast<size_t>(n_tokens * c.n_head * c.dk), -1, 1);
        const auto want = reference(c, q, n_tokens, k_rows, v_rows, lists, 0.3f);
        for (int n_threads : {1, 2, 3}) {
            ThreadPool pool(n_threads);
            std::vector<float> got(static_cast<size_t>(n_tokens * c.n_head * c.dv), -1.0f);
            attention(pool, AttentionShape{c.n_head, c.n_head_kv, c.dk, c.dv, 0.3f, c.v_offset}, q.data(), n_tokens, k,
                      c.v_in_k ? k : v, spans, got.data());
            for (size_t i = 0; i < got.size(); ++i)
                ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i])))
                    << c.n_head << " " << n_threads << " " << i;
        }
    }
}

// The AVX2 score and P.V kernels against the scalar ones on awkward sizes (head blocks of 4 with
// remainders, odd row counts, widths that are not multiples of 8 or 16).
TEST(AttentionKernels, Avx2MatchesScalar) {
    if (!cpu::cpu_supports(cpu::Isa::avx2)) GTEST_SKIP() << "no AVX2";
    std::mt19937 rng(11);
    for (int64_t n_q : {1, 3, 4, 5, 9, 16}) {
        for (int64_t n_k : {1, 2, 3, 5, 15, 16, 18}) {
            for (int64_t d : {1, 7, 8, 9, 17, 72, 130}) {
                const int64_t q_stride = d + 3, k_stride = d + 5, ld = n_k + 2;
                const auto q = test::random_floats(rng, static_cast<size_t>(n_q * q_stride), -1, 1);
                const auto kv = test::random_floats(rng, static_cast<size_t>(n_k * k_stride), -2, 2);
                std::vector<float> s_ref(static_cast<size_t>(n_q * ld), 7.0f), s_got = s_ref;
                attn::scalar::scores(q.data(), q_stride, n_q, kv.data(), k_stride, n_k, d, 0.7f, s_ref.data(), ld);
                attn::avx2::scores(q.data(), q_stride, n_q, kv.data(), k_stride, n_k, d, 0.7f, s_got.data(), ld);
                for (size_t i = 0; i < s_ref.size(); ++i)
                    ASSERT_NEAR(s_got[i], s_ref[i], 1e-5f * (1 + std::fabs(s_ref[i]))) << n_q << " " << n_k << " " << d;
                // P.V with V rows of width d read from the same buffer, into a non-zero accumulator.
                auto acc_ref = test::random_floats(rng, static_cast<size_t>(n_q * d), -1, 1);
                auto acc_got = acc_ref;
                const auto p = test::random_floats(rng, static_cast<size_t>(n_q * (n_k + 1)), 0, 1);
                attn::scalar::pv(p.data(), n_k + 1, n_q, kv.data(), k_stride, n_k, d, acc_ref.data());
                attn::avx2::pv(p.data(), n_k + 1, n_q, kv.data(), k_stride, n_k, d, acc_got.data());
                for (size_t i = 0; i < acc_ref.size(); ++i)
                    ASSERT_NEAR(acc_got[i], acc_ref[i], 1e-5f * (1 + std::fabs(acc_ref[i])))
                        << n_q << " " << n_k << " " << d;
            }
        }
    }
}

// exp_sum: the AVX2 polynomial against std::exp, element by element (within 2 ulp, relative) and in the
// sum, on every tail length, over the range softmax arguments take (s - max <= 0) and beyond: far below
// -87.3 (0 where std::exp gives a subnormal or 0), -inf (0) and NaN (kept).
TEST(AttentionKernels, ExpSumAvx2MatchesScalar) {
    if (!cpu::cpu_supports(cpu::Isa::avx2)) GTEST_SKIP() << "no AVX2";
    std::mt19937 rng(12);
    for (int64_t n : {1, 5, 8, 13, 18, 64}) {
        auto s = test::random_floats(rng, static_cast<size_t>(n), -90, 5);
        s[0] = 3.0f;  // the maximum: exp(0) = 1
        const float m = 3.0f;
        auto ref = s, got = s;
        const float sum_ref = attn::scalar::exp_sum(ref.data(), n, m);
        const float sum_got = attn::avx2::exp_sum(got.data(), n, m);
        for (int64_t j = 0; j < n; ++j) {
            if (s[j] - m < -87.3f) {
                EXPECT_LE(got[j], 1.2e-38f) << s[j];
            } else {
                EXPECT_NEAR(got[j], ref[j], 2.5e-7f * ref[j]) << "x " << s[j] - m;
            }
        }
        EXPECT_NEAR(sum_got, sum_ref, 1e-6f * sum_ref) << n;
    }
    std::vector<float> special = {0.0f, -std::numeric_limits<float>::infinity(), std::nanf(""), -1000.0f, 0.5f};
    attn::avx2::exp_sum(special.data(), 5, 0.0f);
    EXPECT_EQ(special[0], 1.0f);
    EXPECT_EQ(special[1], 0.0f);
    EXPECT_TRUE(std::isnan(special[2]));
    EXPECT_EQ(special[3], 0.0f);
    EXPECT_NEAR(special[4], std::exp(0.5f), 2.5e-7f * std::exp(0.5f));
}

// The AVX-512 head-lane kernels (16 heads per vector) against the scalar ones: row counts around the score
// block of 8, widths odd and around the P.V block of 16 columns, and a softmax tile where some lanes start
// empty (m = -inf), some grow and some keep their maximum.
TEST(AttentionKernels, Avx512LanesMatchScalar) {
    if (!cpu::cpu_supports(cpu::Isa::avx512)) GTEST_SKIP() << "no AVX-512";
    std::mt19937 rng(13);
    for (int64_t n_k : {1, 2, 7, 8, 9, 15, 16, 17}) {
        for (int64_t d : {1, 2, 3, 17, 72, 576}) {
            const int64_t k_stride = d + 3;
            const auto qt = test::random_floats(rng, static_cast<size_t>(d * 16), -1, 1);
            const auto kv = test::random_floats(rng, static_cast<size_t>(n_k * k_stride), -2, 2);
            std::vector<float> s_ref(static_cast<size_t>(n_k * 16 + 16), 7.0f), s_got = s_ref;
            attn::scalar::scores16(qt.data(), kv.data(), k_stride, n_k, d, s_ref.data());
            attn::avx512::scores16(qt.data(), kv.data(), k_stride, n_k, d, s_got.data());
            // Within 1e-5 of the sum of |terms| (the scores cancel: a relative bound on them would be unfair).
            for (int64_t j = 0; j < n_k; ++j) {
                for (int64_t h = 0; h < 16; ++h) {
                    float bound = 0.0f;
                    for (int64_t i = 0; i < d; ++i) bound += std::fabs(qt[i * 16 + h] * kv[j * k_stride + i]);
                    const size_t i = static_cast<size_t>(j * 16 + h);
                    ASSERT_NEAR(s_got[i], s_ref[i], 1e-5f * bound) << n_k << " " << d << " " << i;
                }
            }
            for (size_t i = static_cast<size_t>(n_k * 16); i < s_ref.size(); ++i) ASSERT_EQ(s_got[i], 7.0f);
            // Two queries at once (b = a scaled by -0.5 and reversed in lane order): each as scores16 computes it.
            std::vector<float> qt_b(qt.size());
            for (size_t i = 0; i < qt.size(); ++i) qt_b[i] = -0.5f * qt[i / 16 * 16 + 15 - i % 16];
            std::vector<float> sa_ref(s_ref.size(), 7.0f), sb_ref = sa_ref, sa_got = sa_ref, sb_got = sa_ref;
            attn::scalar::scores16x2(qt.data(), qt_b.data(), kv.data(), k_stride, n_k, d, sa_ref.data(), sb_ref.data());
            attn::avx512::scores16x2(qt.data(), qt_b.data(), kv.data(), k_stride, n_k, d, sa_got.data(), sb_got.data());
            for (int64_t j = 0; j < n_k; ++j) {
                for (int64_t h = 0; h < 16; ++h) {
                    float bound = 0.0f;
                    for (int64_t i = 0; i < d; ++i) bound += std::fabs(qt[i * 16 + h] * kv[j * k_stride + i]);
                    const size_t i = static_cast<size_t>(j * 16 + h), ir = static_cast<size_t>(j * 16 + 15 - h);
                    ASSERT_NEAR(sa_got[i], sa_ref[i], 1e-5f * bound) << n_k << " " << d << " " << i;
                    ASSERT_NEAR(sb_got[ir], sb_ref[ir], 0.5e-5f * bound) << n_k << " " << d << " " << ir;
                }
            }
            for (size_t i = static_cast<size_t>(n_k * 16); i < sa_ref.size(); ++i) {
                ASSERT_EQ(sa_got[i], 7.0f);
                ASSERT_EQ(sb_got[i], 7.0f);
            }
        }
        for (int64_t dv : {1, 3, 4, 5, 17, 20, 512}) {
            const int64_t v_stride = dv + 5;
            const auto v = test::random_floats(rng, static_cast<size_t>(n_k * v_stride), -2, 2);
            auto s_ref = test::random_floats(rng, static_cast<size_t>(n_k * 16), -6, 6);
            auto acc_ref = test::random_floats(rng, static_cast<size_t>(dv * 16), -1, 1);
            std::vector<float> m_ref(16), l_ref(16);
            for (int h = 0; h < 16; ++h) {
                m_ref[h] = h < 4 ? -std::numeric_limits<float>::infinity() : (h % 2 ? 10.0f : -3.0f);
                l_ref[h] = h < 4 ? 0.0f : 2.5f;
                if (h < 4)
                    for (int64_t c = 0; c < dv; ++c) acc_ref[c * 16 + h] = 0.0f;
            }
            auto s_got = s_ref, acc_got = acc_ref, m_got = m_ref, l_got = l_ref;
            attn::scalar::softmax16(s_ref.data(), n_k, m_ref.data(), l_ref.data(), acc_ref.data(), dv);
            attn::avx512::softmax16(s_got.data(), n_k, m_got.data(), l_got.data(), acc_got.data(), dv);
            EXPECT_EQ(m_got, m_ref);
            for (int h = 0; h < 16; ++h) ASSERT_NEAR(l_got[h], l_ref[h], 1e-6f * l_ref[h]) << h;
            for (size_t i = 0; i < s_ref.size(); ++i) ASSERT_NEAR(s_got[i], s_ref[i], 1e-6f * (1 + s_ref[i])) << i;
            for (size_t i = 0; i < acc_ref.size(); ++i)
                ASSERT_NEAR(acc_got[i], acc_ref[i], 1e-6f * (1 + std::fabs(acc_ref[i]))) << i;
            attn::scalar::pv16(s_ref.data(), v.data(), v_stride, n_k, dv, acc_ref.data());
            attn::avx512::pv16(s_ref.data(), v.data(), v_stride, n_k, dv, acc_got.data());
            for (size_t i = 0; i < acc_ref.size(); ++i)
                ASSERT_NEAR(acc_got[i], acc_ref[i], 1e-5f * (1 + std::fabs(acc_ref[i])))
                    << n_k << " " << dv << " " << i;
            // Two queries at once: query b's weights are a's reversed in lane order, its accumulator a's negated.
            std::vector<float> p_b(s_ref.size()), acc_b(acc_ref.size()), acc_a = acc_got;
            for (size_t i = 0; i < p_b.size(); ++i) p_b[i] = s_ref[i / 16 * 16 + 15 - i % 16];
            for (size_t i = 0; i < acc_b.size(); ++i) acc_b[i] = -acc_got[i];
            auto ref_a = acc_a, ref_b = acc_b;
            attn::scalar::pv16x2(s_ref.data(), p_b.data(), v.data(), v_stride, n_k, dv, ref_a.data(), ref_b.data());
            attn::avx512::pv16x2(s_ref.data(), p_b.data(), v.data(), v_stride, n_k, dv, acc_a.data(), acc_b.data());
            for (size_t i = 0; i < acc_a.size(); ++i) {
                ASSERT_NEAR(acc_a[i], ref_a[i], 1e-5f * (1 + std::fabs(ref_a[i]))) << n_k << " " << dv << " " << i;
                ASSERT_NEAR(acc_b[i], ref_b[i], 1e-5f * (1 + std::fabs(ref_b[i]))) << n_k << " " << dv << " " << i;
            }
        }
    }
}

// The moves into and out of the lane layout: the same values as the scalar loops, bit for bit (one product
// each), for widths around the 16 x 16 block (tails of 1-15 columns) and row strides wider than the width.
TEST(AttentionKernels, Avx512LaneTransposesMatchScalar) {
    if (!cpu::cpu_supports(cpu::Isa::avx512)) GTEST_SKIP() << "no AVX-512";
    std::mt19937 rng(17);
    for (int64_t d : {1, 5, 15, 16, 17, 31, 32, 33, 100, 512, 576}) {
        for (int64_t stride : {d, d + 3}) {
            const auto q = test::random_floats(rng, static_cast<size_t>(16 * stride), -3, 3);
            std::vector<float> qt_ref(static_cast<size_t>(d * 16 + 8), 9.0f), qt_got = qt_ref;
            attn::scalar::to_lanes16(q.data(), stride, d, 0.125f, qt_ref.data());
            attn::avx512::to_lanes16(q.data(), stride, d, 0.125f, qt_got.data());
            ASSERT_EQ(qt_got, qt_ref) << d << " " << stride;  // includes the 8 untouched floats past the end
            for (int64_t i = 0; i < d; ++i) ASSERT_EQ(qt_ref[i * 16 + 3], 0.125f * q[3 * stride + i]);

            const auto acc = test::random_floats(rng, static_cast<size_t>(d * 16), -3, 3);
            const auto scale = test::random_floats(rng, 16, 0.5f, 2.0f);
            std::vector<float> out_ref(static_cast<size_t>(16 * stride), 9.0f), out_got = out_ref;
            attn::scalar::from_lanes16(acc.data(), d, scale.data(), out_ref.data(), stride);
            attn::avx512::from_lanes16(acc.data(), d, scale.data(), out_got.data(), stride);
            ASSERT_EQ(out_got, out_ref) << d << " " << stride;  // the gaps between rows untouched too
            for (int64_t c = 0; c < d; ++c) ASSERT_EQ(out_ref[5 * stride + c], acc[c * 16 + 5] * scale[5]);
            if (stride > d) {
                ASSERT_EQ(out_ref[d], 9.0f);
            }
        }
    }
}

// Merging the pieces of a cut list: the AVX-512 merge (exp by polynomial) against the scalar one (std::exp), with
// lanes whose pieces all are empty (m = -inf, output 0), lanes where only some pieces saw rows, a NaN lane, and
// widths around the 16-column block.
TEST(AttentionKernels, Avx512MergeMatchesScalar) {
    if (!cpu::cpu_supports(cpu::Isa::avx512)) GTEST_SKIP() << "no AVX-512";
    std::mt19937 rng(19);
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t n_parts : {1, 2, 3, 4, 7, 70}) {
        for (int64_t dv : {1, 15, 16, 17, 64, 512}) {
            const int64_t part_stride = dv * 16 + 32, state_stride = 48, out_stride = dv + 5;
            auto acc = test::random_floats(rng, static_cast<size_t>(n_parts * part_stride), -2, 2);
            auto m = test::random_floats(rng, static_cast<size_t>(n_parts * state_stride), -20, 20);
            auto l = test::random_floats(rng, static_cast<size_t>(n_parts * state_stride), 0.5f, 30);
            for (int64_t p = 0; p < n_parts; ++p) {
                for (int64_t h = 0; h < 16; ++h) {
                    // Lanes 0-1: no piece saw a row. Lanes 2-3: only the last piece did.
                    if (h < 2 || (h < 4 && p + 1 < n_parts)) {
                        m[p * state_stride + h] = ninf;
                        l[p * state_stride + h] = 0.0f;
                        for (int64_t c = 0; c < dv; ++c) acc[p * part_stride + c * 16 + h] = 0.0f;
                    }
                }
            }
            m[6] = std::nanf("");  // lane 6: a piece whose scores were NaN makes the lane NaN, as unmerged
            std::vector<float> want(static_cast<size_t>(16 * out_stride), 9.0f), got = want;
            std::vector<float> f_want = m, f_got = m;  // both overwrite m with their scale factors
            attn::scalar::merge16(acc.data(), part_stride, f_want.data(), l.data(), state_stride, n_parts, dv,
                                  want.data(), out_stride);
            attn::avx512::merge16(acc.data(), part_stride, f_got.data(), l.data(), state_stride, n_parts, dv,
                                  got.data(), out_stride);
            for (int64_t p = 0; p < n_parts; ++p) {
                for (int64_t h = 0; h < 16; ++h) {
                    const size_t i = static_cast<size_t>(p * state_stride + h);
                    if (h == 6) continue;  // NaN
                    ASSERT_NEAR(f_got[i], f_want[i], 1e-6f) << n_parts << " piece " << p << " lane " << h;
                    ASSERT_TRUE(f_want[i] >= 0.0f && f_want[i] <= 1.0f);
                }
            }
            for (int64_t h = 0; h < 16; ++h) {
                for (int64_t c = 0; c < out_stride; ++c) {
                    const size_t i = static_cast<size_t>(h * out_stride + c);
                    if (c >= dv) {
                        ASSERT_EQ(got[i], 9.0f) << "gap written";
                    } else if (h < 2) {
                        ASSERT_EQ(got[i], 0.0f);
                        ASSERT_EQ(want[i], 0.0f);
                    } else if (h == 6) {
                        ASSERT_TRUE(std::isnan(got[i]));
                        ASSERT_TRUE(std::isnan(want[i]));
                    } else {
                        ASSERT_TRUE(std::isfinite(got[i]));
                        ASSERT_NEAR(got[i], want[i], 2e-6f * (1 + std::fabs(want[i])))
                            << n_parts << " " << dv << " " << h << " " << c;
                    }
                }
            }
            // One piece alone is the piece's own normalised output.
            if (n_parts == 1) {
                for (int64_t c = 0; c < dv; ++c) ASSERT_NEAR(got[5 * out_stride + c], acc[c * 16 + 5] / l[5], 1e-6f);
                EXPECT_EQ(f_got[5], 1.0f);  // the piece's own maximum: exp(0)
            }
        }
    }
}

TEST(ConvertRow, EveryIsaMatchesDequantize) {
    std::mt19937 rng(9);
    for (const cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
        const cpu::KernelTable *k = cpu::kernels_for(isa);
        if (!k) continue;  // this CPU lacks the level
        for (int64_t n : {1, 7, 8, 9, 31, 576, 4097}) {
            const auto x = test::random_floats(rng, static_cast<size_t>(n), -100, 100);
            for (const DType t : {DType::F16, DType::BF16}) {
                std::vector<uint16_t> row(static_cast<size_t>(n));
                quantize_row(t, x.data(), row.data(), n);
                std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), -1.0f);
                dequantize_row(t, row.data(), want.data(), n);
                (t == DType::F16 ? k->to_f32_f16 : k->to_f32_bf16)(row.data(), got.data(), n);
                ASSERT_EQ(got, want) << cpu::isa_name(isa) << " " << dtype_name(t) << " n " << n;
            }
        }
    }
}

}  // namespace
}  // namespace sparrow
