// LogitAdjuster against the formulas written out: OpenAI's presence and frequency penalties over the generated
// tokens only, llama.cpp's repetition penalty over the sequence's last N tokens (prompt included, each distinct
// token once), biases that add up, banned end-of-generation tokens, and ids outside the vocabulary left alone.
#include "runtime/logit_adjust.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

namespace sparrow {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(RepeatPenalty, DividesPositiveAndMultipliesNegativeLogitsOnce) {
    std::vector<float> logits = {2.0f, -1.0f, 0.0f, 3.0f, -0.5f, 1.0f};
    std::vector<int32_t> window = {3, 1, 3, 4, 1, 0};
    apply_repeat_penalty(logits, window, 2.0f);
    EXPECT_EQ(logits, (std::vector<float>{1.0f, -2.0f, 0.0f, 1.5f, -1.0f, 1.0f}));
    std::vector<int32_t> empty;
    apply_repeat_penalty(logits, empty, 2.0f);  // an empty window changes nothing
    EXPECT_EQ(logits, (std::vector<float>{1.0f, -2.0f, 0.0f, 1.5f, -1.0f, 1.0f}));
}

TEST(LogitAdjuster, NothingToDoReturnsTheLogitsThemselves) {
    LogitAdjuster a({}, std::vector<int32_t>{7});
    a.start(std::vector<int32_t>{1, 2});
    a.accept(3);
    const std::vector<float> logits = {0.5f, 1.0f, -1.0f, 2.0f};
    EXPECT_EQ(a.apply(logits).data(), logits.data());
    LogitAdjustments off;
    off.repeat_penalty = 1.5f;
    off.repeat_last_n = 0;  // no window
    EXPECT_FALSE(off.any());
}

TEST(LogitAdjuster, EveryAdjustmentAsItsFormulaSays) {
    LogitAdjustments adj;
    adj.presence_penalty = 0.5f;
    adj.frequency_penalty = 0.25f;
    adj.repeat_penalty = 2.0f;
    adj.repeat_last_n = 4;
    adj.logit_bias = {{1, 1.0f}, {1, 2.0f}, {6, -kInf}, {99, 5.0f}};  // 99: outside the vocabulary
    adj.ignore_eos = true;
    const std::vector<int32_t> eog = {7, 50};  // 50: outside the vocabulary
    LogitAdjuster a(adj, eog);
    a.start(std::vector<int32_t>{0, 4, 5});  // the prompt: only the repetition penalty sees it
    a.accept(2);
    a.accept(2);
    a.accept(3);
    // Sequence 0 4 5 2 2 3: the last four are 5 2 2 3. Generated: 2 twice, 3 once.
    const std::vector<float> logits = {1.0f, 0.5f, 4.0f, -2.0f, 3.0f, 6.0f, 1.0f, 9.0f};
    std::vector<float> want = logits;
    want[5] /= 2.0f;                 // repetition: 5 (positive) ...
    want[2] /= 2.0f;                 // ... 2 once, though twice in the window ...
    want[3] *= 2.0f;                 // ... 3 (negative: multiplied); 0 and 4 are older than the window
    want[2] -= 0.5f + 0.25f * 2.0f;  // presence + frequency x 2
    want[3] -= 0.5f + 0.25f * 1.0f;  // presence + frequency x 1
    want[1] += 3.0f;                 // two biases add up
    want[6] = -kInf;                 // banned
    want[7] = -kInf;                 // end of generation, with ignore_eos
    const std::span<const float> got = a.apply(logits);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "token " << i;
    EXPECT_EQ(logits[2], 4.0f);  // the input is not written

    // A new sequence forgets the old one's tokens: only the bias and the bans stay.
    a.start(std::vector<int32_t>{});
    const std::span<const float> fresh = a.apply(logits);
    EXPECT_FLOAT_EQ(fresh[2], 4.0f);
    EXPECT_FLOAT_EQ(fresh[5], 6.0f);
    EXPECT_FLOAT_EQ(fresh[1], 3.5f);
    EXPECT_EQ(fresh[7], -kInf);

    // repeat_last_n -1: the whole sequence.
    adj.repeat_last_n = -1;
    LogitAdjuster all(adj, eog);
    all.start(std::vector<int32_t>{0, 4});
    EXPECT_FLOAT_EQ(all.apply(logits)[0], 0.5f);
    EXPECT_FLOAT_EQ(all.apply(logits)[4], 1.5f);
}

// DRY written out from its definition: for every earlier position p of the window, the length L of the longest
// common run of tokens ending just before p and at the window's end (not reaching back past the latest breaker);
// the token at p takes multiplier * base^(L - allowed) when L >= allowed, by its longest L. Quadratic, in double.
std::vector<double> dry_reference(const std::vector<double> &logits, const std::vector<int32_t> &w,
                                  const LogitAdjustments &a) {
    const auto n = static_cast<int64_t>(w.size());
    const auto breaker = [&](int32_t id) {
        return std::find(a.dry_breakers.begin(), a.dry_breakers.end(), id) != a.dry_breakers.end();
    };
    int64_t limit = 0;
    while (limit < n && !breaker(w[n - 1 - limit])) ++limit;
    std::vector<int64_t> longest(logits.size(), -1);
    for (int64_t p = 1; p < n; ++p) {
        int64_t len = 0;
        while (len < p && len < limit && w[p - 1 - len] == w[n - 1 - len]) ++len;
        if (len >= a.dry_allowed_length) longest[w[p]] = std::max(longest[w[p]], len);
    }
    std::vector<double> out = logits;
    for (size_t id = 0; id < out.size(); ++id) {
        if (longest[id] >= 0)
            out[id] -= a.dry_multiplier * std::pow(double(a.dry_base), double(longest[id] - a.dry_allowed_length));
    }
    return out;
}

TEST(DryPenalty, MatchesItsDefinitionOnRepetitiveSequences) {
    std::mt19937 rng(7);
    int checked = 0, penalised = 0;
    for (int trial = 0; trial < 400; ++trial) {
        const int n_vocab = 2 + trial % 6;  // few distinct tokens: long repeats everywhere
        const int64_t n = 1 + static_cast<int64_t>(rng() % 90);
        std::vector<int32_t> w(static_cast<size_t>(n));
        for (auto &t : w) t = static_cast<int32_t>(rng() % static_cast<unsigned>(n_vocab));
        if (trial % 3 == 0) {  // a periodic stretch: matches as long as the window
            for (int64_t i = 3; i < n; ++i) w[i] = w[i % 3];
        }
        LogitAdjustments a;
        a.dry_multiplier = 0.8f;
        a.dry_base = 1.5f;
        a.dry_allowed_length = 1 + trial % 4;
        if (trial % 2 == 1) a.dry_breakers = {static_cast<int32_t>(n_vocab - 1)};
        std::vector<float> logits(static_cast<size_t>(n_vocab));
        for (auto &v : logits) v = static_cast<float>(rng() % 1000) / 100.0f - 5.0f;
        const std::vector<double> want = dry_reference(std::vector<double>(logits.begin(), logits.end()), w, a);
        DryWorkspace ws;
        std::vector<float> got = logits;
        apply_dry_penalty(got, w, a, ws);
        for (size_t id = 0; id < got.size(); ++id) {
            ASSERT_NEAR(got[id], want[id], 1e-4 * std::max(1.0, std::abs(want[id])))
                << "trial " << trial << " token " << id;
            penalised += got[id] != logits[id];
        }
        ++checked;
    }
    EXPECT_EQ(checked, 400);
    EXPECT_GT(penalised, 200);  // the sequences do repeat
}

TEST(DryPenalty, PenalisesTheTokenThatWouldExtendARepeat) {
    // 1 2 3 4 ... 1 2 3: 4 would repeat "1 2 3 4" (L = 3); 9 follows "3" once before (L = 1, under allowed 2).
    const std::vector<int32_t> w = {1, 2, 3, 4, 5, 3, 9, 6, 1, 2, 3};
    LogitAdjustments a;
    a.dry_multiplier = 1.0f;
    a.dry_base = 2.0f;
    a.dry_allowed_length = 2;
    std::vector<float> logits(10, 0.0f);
    DryWorkspace ws;
    apply_dry_penalty(logits, w, a, ws);
    std::vector<float> want(10, 0.0f);
    want[4] = -2.0f;  // 1 x 2^(3 - 2)
    EXPECT_EQ(logits, want);
    // A breaker between the two copies' ends cuts the repeat: "3" is a breaker, so nothing before it counts.
    a.dry_breakers = {3};
    std::fill(logits.begin(), logits.end(), 0.0f);
    apply_dry_penalty(logits, w, a, ws);
    EXPECT_EQ(logits, std::vector<float>(10, 0.0f));
    // Through LogitAdjuster, over the prompt and the generated tokens, and only within dry_penalty_last_n.
    a.dry_breakers.clear();
    LogitAdjuster adj(a, {});
    adj.start(std::span<const int32_t>(w).first(9));
    adj.accept(2);
    adj.accept(3);
    EXPECT_FLOAT_EQ(adj.apply(std::vector<float>(10, 0.0f))[4], -2.0f);
    a.dry_penalty_last_n = 5;  // the last five, 9 6 1 2 3, hold one copy only
    LogitAdjuster near(a, {});
    near.start(w);
    EXPECT_FLOAT_EQ(near.apply(std::vector<float>(10, 0.0f))[4], 0.0f);
    a.dry_penalty_last_n = 0;  // off
    EXPECT_FALSE(a.any());
}

}  // namespace
}  // namespace sparrow
