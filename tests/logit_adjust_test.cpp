// LogitAdjuster against the formulas written out: OpenAI's presence and frequency penalties over the generated
// tokens only, llama.cpp's repetition penalty over the sequence's last N tokens (prompt included, each distinct
// token once), biases that add up, banned end-of-generation tokens, and ids outside the vocabulary left alone.
#include "runtime/logit_adjust.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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

}  // namespace
}  // namespace sparrow
