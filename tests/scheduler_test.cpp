// The serving scheduler without HTTP: outputs do not depend on what else runs in the batch, a full queue
// refuses, cancelling frees the slot, cached prefixes are reused, embeddings come back pooled.
#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <future>
#include <limits>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "model/synthetic.h"
#include "runtime/tokenizer.h"
#include "test_util.h"

namespace sparrow::server {
namespace {

using namespace std::chrono_literals;

Task greedy(std::vector<int32_t> prompt, int64_t n) {
    Task t;
    t.prompt = std::move(prompt);
    t.sampling.params.temp = 0;
    t.sampling.max_tokens = n;
    return t;
}

// Waits for the task's end; returns its text (after `text`, what was taken before) and last update.
std::pair<std::string, TaskUpdate> finish(TaskChannel &c, std::string text = {}) {
    TaskUpdate u;
    do {
        u = c.wait(1000ms);
        text += u.text;
    } while (!u.done);
    return {text, u};
}

// Runs the task with two alternatives per token; returns its text, every token's log probability entry and the
// last update.
std::tuple<std::string, std::vector<TokenLogprob>, TaskUpdate> with_logprobs(Scheduler &s, Task t) {
    t.sampling.logprobs = 2;
    const auto channel = s.submit(std::move(t));
    std::string text;
    std::vector<TokenLogprob> lps;
    TaskUpdate u;
    do {
        u = channel->wait(1000ms);
        text += u.text;
        lps.insert(lps.end(), u.logprobs.begin(), u.logprobs.end());
    } while (!u.done);
    return {text, lps, u};
}

class SchedulerTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        const std::string dir = test::make_temp_dir("sparrow-scheduler");
        SyntheticParams p;
        write_synthetic_model(p, dir + "/llama.gguf");
        model_ = load_model(dir + "/llama.gguf");
        std::filesystem::remove_all(dir);
    }
    static void TearDownTestSuite() { model_.reset(); }

    static ContextParams context(int64_t n_ctx) {
        ContextParams cp;
        cp.n_ctx = n_ctx;
        cp.n_threads = 1;
        return cp;
    }
    static std::shared_ptr<const Model> model_;
};
std::shared_ptr<const Model> SchedulerTest::model_;

TEST_F(SchedulerTest, BatchingDoesNotChangeGreedyOutputs) {
    Scheduler s(model_, context(1024), {4, 16});
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 6; ++i) {
        std::vector<int32_t> p;
        for (int j = 0; j < 3 + 2 * i; ++j) p.push_back((i * 37 + j * 11) % 500 + 1);
        prompts.push_back(p);
    }
    std::vector<std::string> alone;
    for (const auto &p : prompts) alone.push_back(finish(*s.submit(greedy(p, 12))).first);
    std::vector<std::shared_ptr<TaskChannel>> channels;
    for (const auto &p : prompts) channels.push_back(s.submit(greedy(p, 12)));  // 6 tasks over 4 slots
    for (size_t i = 0; i < prompts.size(); ++i) {
        const auto [text, u] = finish(*channels[i]);
        EXPECT_EQ(text, alone[i]) << "prompt " << i;
        EXPECT_GT(u.n_generated, 0);
        EXPECT_EQ(u.n_prompt, static_cast<int64_t>(prompts[i].size()));
    }
    const SchedulerMetrics m = s.metrics();
    EXPECT_EQ(m.tasks_completed, 12);
    EXPECT_EQ(m.slots_busy, 0);
    EXPECT_LT(m.decode_calls, m.generated_tokens);  // tokens of several slots shared batches
    // Every task's first token counts once in the time to first token, every later one in the inter-token time.
    EXPECT_EQ(m.time_to_first_token.count(), 12);
    EXPECT_EQ(m.time_to_first_token.count() + m.inter_token.count(), m.generated_tokens);
    EXPECT_GT(m.time_to_first_token.sum, 0.0);
    EXPECT_GT(m.inter_token.sum, 0.0);
}

TEST(LatencyHistogram, BucketsByUpperBound) {
    LatencyHistogram h;
    for (const double s : {0.0, 0.005, 0.0051, 0.3, 30.0, 31.0}) h.add(s);
    EXPECT_EQ(h.count(), 6);
    EXPECT_DOUBLE_EQ(h.sum, 0.0 + 0.005 + 0.0051 + 0.3 + 30.0 + 31.0);
    EXPECT_EQ(h.counts[0], 2);   // (-inf, 0.005]: the bound itself belongs to its bucket
    EXPECT_EQ(h.counts[1], 1);   // (0.005, 0.01]
    EXPECT_EQ(h.counts[6], 1);   // (0.25, 0.5]
    EXPECT_EQ(h.counts[11], 1);  // (10, 30]
    EXPECT_EQ(h.counts[12], 1);  // above every bound
}

TEST_F(SchedulerTest, ReusesTheCachedPrefix) {
    Scheduler s(model_, context(512), {1, 4});
    const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10};
    const auto first = finish(*s.submit(greedy(prompt, 4)));
    EXPECT_EQ(first.second.n_cached, 0);
    const auto again = finish(*s.submit(greedy(prompt, 4)));
    EXPECT_EQ(again.second.n_cached, 5);  // all but the last prompt token, whose logits start generation
    EXPECT_EQ(again.first, first.first);
    std::vector<int32_t> longer = prompt;
    longer.push_back(11);
    EXPECT_EQ(finish(*s.submit(greedy(longer, 4))).second.n_cached, 6);
}

// Slot actions (llama.cpp's /slots/{id}?action=...): a slot's cache saved with its tokens, erased, and restored
// into another slot, whose next task then reuses the prefix and writes what a fresh slot writes.
TEST_F(SchedulerTest, ASavedSlotRestoresIntoAnotherAndItsPrefixIsReused) {
    const std::string dir = test::make_temp_dir("sparrow-slots");
    Scheduler s(model_, context(512), {2, 4});
    const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12};
    Task first = greedy(prompt, 4);
    first.id_slot = 1;
    const auto [text, u] = finish(*s.submit(first));
    EXPECT_EQ(u.id_slot, 1);
    const int64_t held = static_cast<int64_t>(prompt.size()) + 3;  // the last sampled token is not decoded yet
    EXPECT_EQ(s.metrics().slots[1].n_cached, held);

    const SlotActionResult saved = s.slot_action(1, SlotActionKind::save, dir + "/a.state");
    ASSERT_TRUE(saved.ok) << saved.error;
    EXPECT_EQ(saved.n_tokens, held);
    EXPECT_EQ(saved.n_bytes, static_cast<int64_t>(std::filesystem::file_size(dir + "/a.state")));
    const SlotActionResult erased = s.slot_action(1, SlotActionKind::erase, "");
    ASSERT_TRUE(erased.ok);
    EXPECT_EQ(erased.n_tokens, held);
    EXPECT_EQ(s.metrics().slots[1].n_cached, 0);
    EXPECT_EQ(s.metrics().kv_cells_used, 0);

    const SlotActionResult restored = s.slot_action(0, SlotActionKind::restore, dir + "/a.state");
    ASSERT_TRUE(restored.ok) << restored.error;
    EXPECT_EQ(restored.n_tokens, held);
    EXPECT_EQ(s.metrics().slots[0].n_cached, held);
    // The same prompt goes to slot 0 (the longest cached prefix) and reads only its last token.
    const auto again = finish(*s.submit(greedy(prompt, 4)));
    EXPECT_EQ(again.second.id_slot, 0);
    EXPECT_EQ(again.second.n_cached, static_cast<int64_t>(prompt.size()) - 1);
    EXPECT_EQ(again.first, text);

    // A missing file, a file that is no state: errors, and the slot is left as it was (the load checks first).
    EXPECT_FALSE(s.slot_action(0, SlotActionKind::restore, dir + "/missing.state").ok);
    std::FILE *junk = std::fopen((dir + "/junk.state").c_str(), "wb");
    std::fputs("not a state", junk);
    std::fclose(junk);
    const SlotActionResult bad = s.slot_action(0, SlotActionKind::restore, dir + "/junk.state");
    EXPECT_FALSE(bad.ok);
    EXPECT_NE(bad.error.find("junk.state"), std::string::npos) << bad.error;
    EXPECT_EQ(s.metrics().slots[0].n_cached, static_cast<int64_t>(prompt.size()) + 3);
    EXPECT_FALSE(s.slot_action(0, SlotActionKind::save, dir + "/no/such/folder.state").ok);
    std::filesystem::remove_all(dir);
}

// A state without tokens (Context::state_seq_save by another program) cannot seed a slot's prefix: refused, and
// the slot is left empty rather than holding rows it cannot account for.
TEST_F(SchedulerTest, ARestoreWithoutTokensIsRefused) {
    const std::string dir = test::make_temp_dir("sparrow-slots");
    {
        ContextParams cp = context(64);
        Context ctx(model_, cp);
        const std::vector<BatchToken> batch = {{5, 0, 0, false}, {6, 1, 0, true}};
        ctx.decode(batch);
        ctx.state_seq_save(0, dir + "/bare.state");
    }
    Scheduler s(model_, context(512), {2, 4});
    const SlotActionResult r = s.slot_action(1, SlotActionKind::restore, dir + "/bare.state");
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("one token per position"), std::string::npos) << r.error;
    EXPECT_EQ(s.metrics().slots[1].n_cached, 0);
    EXPECT_EQ(s.metrics().kv_cells_used, 0);
    std::filesystem::remove_all(dir);
}

// An action on a busy slot waits for its task to end, and the slot takes no new task meanwhile; a task pinned to
// a busy slot waits for it while another task takes the free slot.
TEST_F(SchedulerTest, SlotActionsAndPinnedTasksWaitForTheirSlot) {
    const std::string dir = test::make_temp_dir("sparrow-slots");
    // With context shifts and no end of generation, the long task runs until it is cancelled: no race with it.
    Scheduler s(model_, context(256), {2, 8, 0, true});
    Task long_task = greedy({1, 2, 3}, int64_t(1) << 20);
    long_task.id_slot = 0;
    long_task.sampling.adjust.ignore_eos = true;
    long_task.n_keep = -1;  // shifts keep the prompt, and so does the slot afterwards
    auto running = s.submit(long_task);
    for (int i = 0; i < 5000 && !s.metrics().slots[0].busy; ++i) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(s.metrics().slots[0].busy);
    Task pinned = greedy({4, 5}, 2);
    pinned.id_slot = 0;
    auto waiting = s.submit(pinned);
    const auto other = finish(*s.submit(greedy({6, 7}, 2)));
    EXPECT_EQ(other.second.id_slot, 1);     // the free slot
    EXPECT_FALSE(waiting->wait(0ms).done);  // queued behind the long task
    auto saving =
        std::async(std::launch::async, [&] { return s.slot_action(0, SlotActionKind::save, dir + "/busy.state"); });
    EXPECT_EQ(saving.wait_for(50ms), std::future_status::timeout);  // waits for the slot
    running->cancel();
    const SlotActionResult saved = saving.get();
    ASSERT_TRUE(saved.ok) << saved.error;
    EXPECT_EQ(finish(*running).second.finish, FinishReason::cancelled);
    EXPECT_EQ(saved.n_tokens, 3);  // what the shifted task left (its prompt), saved before the pinned task ran
    EXPECT_EQ(finish(*waiting).second.id_slot, 0);
    std::filesystem::remove_all(dir);
}

// Options::context_shift: a task generates past its slot's context (each shift keeps a BOS and n_keep prompt
// tokens and drops the older half of the rest), and afterwards the slot offers only the kept tokens for reuse.
TEST_F(SchedulerTest, ContextShiftsLetATaskOutrunItsSlot) {
    Scheduler s(model_, context(128), {2, 4, 0, true});  // 64 cells per slot
    ASSERT_TRUE(s.context_shift());
    const int32_t bos = model_tokenizer(*model_).bos_id();
    std::vector<int32_t> prompt = {bos >= 0 ? bos : 5, 6, 7, 8, 9, 10};
    Task t = greedy(prompt, 300);
    t.n_keep = 2;
    t.sampling.adjust.ignore_eos = true;
    const auto [text, u] = finish(*s.submit(t));
    EXPECT_EQ(u.n_generated, 300);
    EXPECT_EQ(u.finish, FinishReason::length);
    const SchedulerMetrics m = s.metrics();
    EXPECT_GE(m.context_shifts, 4);  // 300 tokens through 64 cells
    const int64_t keep = 2 + (bos >= 0 ? 1 : 0);
    EXPECT_EQ(m.slots[0].n_cached + m.slots[1].n_cached, keep);
    EXPECT_EQ(m.kv_cells_used, keep);
    // Without shifts the same task ends with its slot's context.
    Scheduler plain(model_, context(128), {2, 4});
    EXPECT_EQ(finish(*plain.submit(t)).second.n_generated, 64 - 6);
}

// A slot that has shifted its context while it generates offers other tasks only the prefix the shift kept: the
// rows after it were computed with a longer history, so a task sharing them would not get what it gets alone.
TEST_F(SchedulerTest, ATaskSharesNoRowsAShiftLeftInexact) {
    Scheduler s(model_, context(2048), {2, 4, 0, true});  // 1024 cells per slot
    const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10};
    Task a = greedy(prompt, int64_t(1) << 20);
    a.id_slot = 0;
    a.n_keep = -1;  // shifts keep the prompt
    a.sampling.adjust.ignore_eos = true;
    a.sampling.logprobs = 0;  // for the ids of its tokens
    auto running = s.submit(a);
    // The first shift comes when 1018 tokens are decoded: it drops the first 509, so the cache then holds the
    // prompt and generated tokens 509.. 1017, until the next shift 509 tokens later.
    std::vector<int32_t> generated;
    while (generated.size() < 1030) {
        const TaskUpdate u = running->wait(1000ms);
        for (const TokenLogprob &t : u.logprobs) generated.push_back(t.id);
        ASSERT_FALSE(u.done);
    }
    ASSERT_GE(s.metrics().context_shifts, 1);
    std::vector<int32_t> b_prompt = prompt;
    b_prompt.insert(b_prompt.end(), generated.begin() + 509, generated.begin() + 518);  // cached in slot 0, shifted
    const auto b = finish(*s.submit(greedy(b_prompt, 8)));
    running->cancel();
    EXPECT_EQ(b.second.id_slot, 1);
    EXPECT_EQ(b.second.n_cached, static_cast<int64_t>(prompt.size()));  // the prompt, not the shifted rows after it
    Scheduler fresh(model_, context(2048), {2, 4, 0, true});
    EXPECT_EQ(finish(*fresh.submit(greedy(b_prompt, 8))).first, b.first);
}

TEST_F(SchedulerTest, FullQueueRefusesAndCancelFreesTheSlot) {
    Scheduler s(model_, context(2048), {1, 1});
    Task long_task = greedy({1, 2, 3}, 1500);
    long_task.sampling.adjust.presence_penalty = long_task.sampling.adjust.frequency_penalty =
        -2;  // loops: no early end
    auto running = s.submit(long_task);
    ASSERT_TRUE(running);
    // Wait until it runs (the queue is empty again), then fill the queue.
    for (int i = 0; i < 1000 && s.metrics().slots_busy == 0; ++i) std::this_thread::sleep_for(1ms);
    auto queued = s.submit(greedy({4, 5}, 2));
    ASSERT_TRUE(queued);
    EXPECT_EQ(s.submit(greedy({6}, 2)), nullptr);  // queue of 1 is full
    running->cancel();
    const auto [text, u] = finish(*queued);
    EXPECT_EQ(u.finish == FinishReason::stop || u.finish == FinishReason::length, true);
    EXPECT_EQ(finish(*running).second.finish, FinishReason::cancelled);
    EXPECT_EQ(s.metrics().tasks_cancelled, 1);
}

TEST_F(SchedulerTest, EmbeddingsArePooled) {
    Scheduler s(model_, context(512), {2, 4});
    const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9};
    Task none;
    none.kind = TaskKind::embedding;
    none.prompt = prompt;
    none.pooling = Pooling::none;
    const TaskUpdate rows = finish(*s.submit(none)).second;
    const int64_t n_embd = 64;
    ASSERT_EQ(rows.n_embd_rows, 6);
    ASSERT_EQ(rows.embedding.size(), size_t(6 * n_embd));
    Task mean = none;
    mean.pooling = Pooling::mean;
    const TaskUpdate m = finish(*s.submit(mean)).second;
    ASSERT_EQ(m.embedding.size(), size_t(n_embd));
    std::vector<double> want(n_embd, 0.0);
    for (int64_t r = 0; r < 6; ++r) {
        for (int64_t k = 0; k < n_embd; ++k) want[k] += rows.embedding[r * n_embd + k] / 6.0;
    }
    double norm = 0;
    for (double v : want) norm += v * v;
    for (int64_t k = 0; k < n_embd; ++k) EXPECT_NEAR(m.embedding[k], want[k] / std::sqrt(norm), 1e-5);
    // A completion right after: embeddings leave nothing behind that changes it.
    const std::string before = finish(*s.submit(greedy(prompt, 8))).first;
    finish(*s.submit(mean));
    EXPECT_EQ(finish(*s.submit(greedy(prompt, 8))).first, before);
}

TEST_F(SchedulerTest, StopStringsCutTheText) {
    Scheduler s(model_, context(512), {1, 4});
    const std::vector<int32_t> prompt = {7, 8, 9};
    const std::string full = finish(*s.submit(greedy(prompt, 16))).first;
    ASSERT_GE(full.size(), 4u);
    Task t = greedy(prompt, 16);
    t.sampling.stop = {full.substr(2, 2)};
    const auto [text, u] = finish(*s.submit(t));
    EXPECT_EQ(text, full.substr(0, full.find(full.substr(2, 2))));
    EXPECT_EQ(u.finish, FinishReason::stop);
}

// logit_bias: +100 on one token makes greedy pick it at every step; banning (-inf) the greedy first token moves the
// choice to the model's second best there; biases on one token add up; reported log probabilities stay the model's.
TEST_F(SchedulerTest, LogitBiasSteersAndBansTokens) {
    Scheduler s(model_, context(512), {1, 4});
    const std::vector<int32_t> prompt = {7, 8, 9};
    const auto ids = [&](Task t) { return std::get<1>(with_logprobs(s, std::move(t))); };
    const std::vector<TokenLogprob> plain = ids(greedy(prompt, 6));
    ASSERT_EQ(plain.size(), 6u);
    const int32_t first = plain[0].id, second = plain[0].top[1].first;

    Task pushed = greedy(prompt, 6);
    const int32_t target = first == 42 ? 43 : 42;
    pushed.sampling.adjust.logit_bias = {{target, 60.0f}, {target, 40.0f}};  // adds up to +100
    const std::vector<TokenLogprob> steered = ids(pushed);
    ASSERT_EQ(steered.size(), 6u);
    for (const TokenLogprob &t : steered) EXPECT_EQ(t.id, target);
    EXPECT_LT(steered[0].logprob, plain[0].logprob);  // the model's own probability of the forced token

    Task banned = greedy(prompt, 1);
    banned.sampling.adjust.logit_bias = {{first, -std::numeric_limits<float>::infinity()}};
    const std::vector<TokenLogprob> moved = ids(banned);
    ASSERT_EQ(moved.size(), 1u);
    EXPECT_EQ(moved[0].id, second);
    EXPECT_EQ(moved[0].top[0].first, first);  // alternatives are the model's, before the bias

    // Without a bias the same task is greedy again (the slot's state does not carry a bias over).
    EXPECT_EQ(ids(greedy(prompt, 6))[0].id, first);
}

// ignore_eos: with the end-of-generation token pushed to the top, a task ends at its first token unless ignore_eos
// holds, and then runs to max_tokens. The repetition penalty changes greedy text only when it has a window.
TEST_F(SchedulerTest, IgnoreEosAndRepeatPenaltyReachTheSampler) {
    Scheduler s(model_, context(512), {1, 4});
    const std::vector<int32_t> prompt = {7, 8, 9, 7, 8, 9};
    const int32_t eos = model_tokenizer(*model_).eos_id();
    ASSERT_GE(eos, 0);
    Task ends = greedy(prompt, 8);
    ends.sampling.adjust.logit_bias = {{eos, 100.0f}};
    const auto [text, u] = finish(*s.submit(ends));
    EXPECT_EQ(u.n_generated, 1);  // the end-of-generation token, which has no text
    EXPECT_EQ(text, "");
    EXPECT_EQ(u.finish, FinishReason::stop);
    Task runs = ends;
    runs.sampling.adjust.ignore_eos = true;
    const auto [text2, u2] = finish(*s.submit(runs));
    EXPECT_EQ(u2.n_generated, 8);
    EXPECT_EQ(u2.finish, FinishReason::length);

    const std::string plain = finish(*s.submit(greedy(prompt, 16))).first;
    Task penalised = greedy(prompt, 16);
    penalised.sampling.adjust.repeat_penalty = 50.0f;
    penalised.sampling.adjust.repeat_last_n = -1;
    const std::string changed = finish(*s.submit(penalised)).first;
    EXPECT_NE(changed, plain);
    EXPECT_EQ(finish(*s.submit(penalised)).first, changed);  // deterministic
    penalised.sampling.adjust.repeat_last_n = 0;             // no window: off
    EXPECT_EQ(finish(*s.submit(penalised)).first, plain);
}

// token_logprob against a direct log-softmax, with ties (broken by the lower id) and n past the vocabulary.
TEST(TokenLogprob, MatchesALogSoftmaxAndOrdersTies) {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 7.25f, -30.0f, 2.0f};
    double z = 0;
    for (const float v : logits) z += std::exp(double(v));
    const auto lp = [&](int id) { return static_cast<float>(logits[static_cast<size_t>(id)] - std::log(z)); };
    const TokenLogprob t = token_logprob(logits, 2, 4);
    EXPECT_EQ(t.id, 2);
    EXPECT_NEAR(t.logprob, lp(2), 1e-6);
    ASSERT_EQ(t.top.size(), 4u);
    const int want[] = {4, 1, 3, 6};  // 7.25, then the three 2.0s by id
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(t.top[i].first, want[i]);
        EXPECT_NEAR(t.top[i].second, lp(want[i]), 1e-6);
    }
    EXPECT_TRUE(token_logprob(logits, 5, 0).top.empty());
    EXPECT_EQ(token_logprob(logits, 5, 100).top.size(), logits.size());
    // Large logits: no overflow (the maximum is taken out first).
    const std::vector<float> big = {1000.0f, 1000.0f};
    EXPECT_NEAR(token_logprob(big, 0, 2).logprob, -std::log(2.0f), 1e-6);
}

// Each generated token's entry arrives with its text (the held-back tail of a possible stop string included),
// and a stop string drops the entries of tokens wholly inside it.
TEST_F(SchedulerTest, LogprobsFollowTheText) {
    Scheduler s(model_, context(512), {1, 4});
    const std::vector<int32_t> prompt = {7, 8, 9};
    const auto collect = [&](Task t) { return with_logprobs(s, std::move(t)); };
    const auto [full, all, u] = collect(greedy(prompt, 12));
    ASSERT_EQ(static_cast<int64_t>(all.size()), u.n_generated);  // max_tokens, no end-of-generation token
    std::string spelled;
    for (const TokenLogprob &t : all) {
        spelled += model_tokenizer(*model_).token_to_piece(t.id);
        ASSERT_EQ(t.top.size(), 2u);
        EXPECT_EQ(t.top[0].first, t.id);  // greedy
        EXPECT_FLOAT_EQ(t.top[0].second, t.logprob);
    }
    EXPECT_EQ(spelled, full);
    // Stop at the text of token 3 onwards: tokens 0..2 are reported (and token 3 only if its text begins
    // before the stop string).
    size_t start3 = 0;
    for (size_t i = 0; i < 3; ++i) start3 += model_tokenizer(*model_).token_to_piece(all[i].id).size();
    ASSERT_LT(start3, full.size());
    Task t = greedy(prompt, 12);
    t.sampling.stop = {full.substr(start3)};
    const auto [text, cut, u2] = collect(t);
    EXPECT_EQ(text, full.substr(0, start3));
    EXPECT_EQ(u2.finish, FinishReason::stop);
    ASSERT_EQ(cut.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(cut[i].id, all[i].id);
}

// Prompt sharing between slots, on llama and on deepseek32 (whose prompts here pass top-k, so selection runs
// over shared indexer keys too).
class SchedulerSharing : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        const std::string dir = test::make_temp_dir("sparrow-scheduler-share");
        SyntheticParams p;
        p.arch = GetParam();
        write_synthetic_model(p, dir + "/m.gguf");
        model_ = load_model(dir + "/m.gguf");
        std::filesystem::remove_all(dir);
        for (int i = 0; i < 70; ++i) system_.push_back((i * 29 + 3) % 500 + 1);
    }
    ContextParams context(int64_t n_batch = 2048) const {
        ContextParams cp;
        cp.n_ctx = 2048;
        cp.n_batch = n_batch;
        cp.n_threads = 1;
        return cp;
    }
    // The system prompt followed by `tail`.
    std::vector<int32_t> prompt(std::initializer_list<int32_t> tail) const {
        std::vector<int32_t> p = system_;
        p.insert(p.end(), tail);
        return p;
    }
    static Task task(std::vector<int32_t> prompt, int64_t n) {
        Task t = greedy(std::move(prompt), n);
        t.sampling.adjust.presence_penalty = t.sampling.adjust.frequency_penalty = -2;  // loops: no early end
        return t;
    }
    // Each task's greedy text when it runs alone.
    std::vector<std::string> alone(const std::vector<Task> &tasks) const {
        Scheduler solo(model_, context(), {1, 4});
        std::vector<std::string> out;
        for (const Task &t : tasks) out.push_back(finish(*solo.submit(t)).first);
        return out;
    }
    // Cache rows a finished task leaves in its slot: its prompt and every sampled token but the last.
    static int64_t held(const Task &t, const TaskUpdate &u) {
        return static_cast<int64_t>(t.prompt.size()) + u.n_generated - 1;
    }

    std::shared_ptr<const Model> model_;
    std::vector<int32_t> system_;
};

// A prompt that begins with what another slot holds takes that slot's cells for the prefix instead of evaluating
// it again, while the other slot is still generating; both outputs stay those of each request alone, the shared
// cells count once, and they outlive the other slot's next task.
TEST_P(SchedulerSharing, ASlotTakesAnotherSlotsCachedPrefix) {
    const std::vector<Task> tasks = {task(prompt({11, 12, 13}), 400), task(prompt({21, 22}), 12), task({9, 8, 7}, 4)};
    const std::vector<std::string> want = alone(tasks);
    Scheduler s(model_, context(), {2, 4});
    auto ca = s.submit(tasks[0]);
    TaskUpdate first;  // a's prompt is in once it has generated
    std::string text_a;
    do {
        first = ca->wait(1000ms);
        text_a += first.text;
    } while (!first.done && first.n_generated == 0);
    ASSERT_FALSE(first.done);
    const auto [text_b, ub] = finish(*s.submit(tasks[1]));  // the free slot, with a's cells for the prefix
    EXPECT_EQ(ub.n_cached, static_cast<int64_t>(system_.size()));
    EXPECT_EQ(text_b, want[1]);
    const auto [all_a, ua] = finish(*ca, text_a);
    EXPECT_EQ(all_a, want[0]);
    const SchedulerMetrics m = s.metrics();
    EXPECT_EQ(m.prefixes_shared, 1);
    EXPECT_EQ(m.prompt_tokens_evaluated,
              static_cast<int64_t>(tasks[0].prompt.size() + tasks[1].prompt.size() - system_.size()));
    EXPECT_EQ(m.kv_cells_used, held(tasks[0], ua) + held(tasks[1], ub) - static_cast<int64_t>(system_.size()));

    // An unrelated task takes a's slot (the least recently used) and drops its cells; the shared ones stay
    // with b's slot, which serves b again from its own cache.
    EXPECT_EQ(finish(*s.submit(tasks[2])).first, want[2]);
    const auto [again_b, ub2] = finish(*s.submit(tasks[1]));
    EXPECT_EQ(ub2.n_cached, static_cast<int64_t>(tasks[1].prompt.size()) - 1);
    EXPECT_EQ(again_b, want[1]);
    EXPECT_EQ(s.metrics().prefixes_shared, 1);
}

// Requests that arrive together with one system prompt read it once: the first slot's prompt tokens carry the
// others' sequences too (a batch of 32 tokens, so over three steps), until the prompts part.
TEST_P(SchedulerSharing, PromptsThatBeginAlikeAreReadOnce) {
    const std::vector<Task> tasks = {task(prompt({11, 12, 13}), 20), task(prompt({21, 22}), 20), task(prompt({31}), 20),
                                     task({9, 8, 7, 6}, 20)};
    const std::vector<std::string> want = alone(tasks);
    Scheduler s(model_, context(32), {4, 8});
    std::vector<std::shared_ptr<TaskChannel>> channels = s.submit_all(tasks);
    ASSERT_EQ(channels.size(), tasks.size());
    int64_t held_total = 0, n_prompt = 0;
    for (size_t i = 0; i < tasks.size(); ++i) {
        const auto [text, u] = finish(*channels[i]);
        EXPECT_EQ(text, want[i]) << "task " << i;
        EXPECT_EQ(u.n_cached, 0) << "task " << i;  // nothing was cached when they came
        held_total += held(tasks[i], u);
        n_prompt += static_cast<int64_t>(tasks[i].prompt.size());
    }
    const SchedulerMetrics m = s.metrics();
    const auto shared = static_cast<int64_t>(system_.size());
    EXPECT_EQ(m.prefixes_shared, 2);
    EXPECT_EQ(m.prompt_tokens_evaluated, n_prompt - 2 * shared);
    EXPECT_EQ(m.kv_cells_used, held_total - 2 * shared);
}

// A leader that goes away mid-prompt (cancelled) leaves its rider to read the rest alone, with the same output.
TEST_P(SchedulerSharing, ARiderFinishesAloneWhenItsLeaderIsCancelled) {
    const std::vector<Task> tasks = {task(prompt({11, 12, 13}), 20), task(prompt({21, 22}), 20)};
    const std::vector<std::string> want = alone(tasks);
    for (int64_t after : {0, 4, 32}) {
        Scheduler s(model_, context(4), {2, 4});  // 4-token steps: the shared prompt takes 18
        std::vector<std::shared_ptr<TaskChannel>> channels = s.submit_all(tasks);
        ASSERT_EQ(channels.size(), 2u);
        // Cancelled once the leader has read `after` tokens (the cancel lands a step or so later).
        for (int i = 0; i < 100000 && s.metrics().prompt_tokens_evaluated < after; ++i) std::this_thread::yield();
        channels[0]->cancel();
        EXPECT_EQ(finish(*channels[1]).first, want[1]) << "cancelled after " << after;
        finish(*channels[0]);
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, SchedulerSharing, ::testing::Values("llama", "deepseek32"));

// While a slot generates, a long prompt is read a prefill chunk per step: the generating slot gets a token after
// each step, and both outputs stay those of each request alone. Without the cap the prompt goes in one step (it
// fits n_batch) and the running task gains a token or two meanwhile.
TEST_F(SchedulerTest, ALongPromptIsReadInChunksWhileSlotsGenerate) {
    Task running = greedy({1, 2, 3}, 400);
    running.sampling.adjust.presence_penalty = running.sampling.adjust.frequency_penalty = -2;  // loops: no early end
    std::vector<int32_t> long_prompt;
    for (int j = 0; j < 200; ++j) long_prompt.push_back((j * 13 + 7) % 500 + 1);  // shares no prefix with {1, 2, 3}
    const Task newcomer = greedy(long_prompt, 4);
    std::string want_running, want_newcomer;
    {
        Scheduler solo(model_, context(1024), {1, 4});
        want_running = finish(*solo.submit(running)).first;
        want_newcomer = finish(*solo.submit(newcomer)).first;
    }
    Scheduler s(model_, context(1024), {2, 4, 16});
    ASSERT_EQ(s.prefill_chunk(), 16);
    auto ca = s.submit(running);
    std::string text_a;
    TaskUpdate ua;
    do {
        ua = ca->wait(1000ms);
        text_a += ua.text;
    } while (!ua.done && ua.n_generated == 0);
    ASSERT_FALSE(ua.done);
    const int64_t generated_before = ua.n_generated;  // at most what the running task had when the newcomer came
    const auto [text_b, ub] = finish(*s.submit(newcomer));
    ua = ca->wait(0ms);
    text_a += ua.text;
    // 200 prompt tokens, 15 per step beside the running task's token: 14 steps, each giving it a token.
    EXPECT_GE(ua.n_generated - generated_before, 14);
    EXPECT_EQ(ub.n_prompt, 200);
    EXPECT_EQ(ub.n_cached, 0);
    EXPECT_EQ(text_b, want_newcomer);
    EXPECT_EQ(finish(*ca, text_a).first, want_running);
}

TEST_F(SchedulerTest, RefusesBadOptions) {
    const auto make = [](int64_t n_ctx, int n_slots) { Scheduler s(model_, context(n_ctx), {n_slots, 4}); };
    EXPECT_THROW(make(512, 0), Error);
    EXPECT_THROW(make(16, 4), Error);  // 4 cells per slot
    EXPECT_THROW(Scheduler(model_, context(512), {1, 4, -1}), Error);
    // The prefill chunk defaults to the ubatch size (512, or n_batch when that is smaller).
    EXPECT_EQ(Scheduler(model_, context(2048), {1, 4}).prefill_chunk(), 512);
    EXPECT_EQ(Scheduler(model_, context(64), {1, 4}).prefill_chunk(), 64);
    EXPECT_EQ(Scheduler(model_, context(64), {1, 4}).n_batch(), 64);  // n_batch is clamped to the context
}

}  // namespace
}  // namespace sparrow::server
