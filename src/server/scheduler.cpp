#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "runtime/context_shift.h"
#include "runtime/json_prefix.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "server/stop_strings.h"

namespace sparrow::server {

namespace {
using Clock = std::chrono::steady_clock;

// Embedding prompts and prompts whose log probabilities are reported ask for an output per token; their
// chunks are capped so that one step's logits stay small ([outputs, n_vocab] floats).
constexpr int64_t kMaxPromptOutputsPerStep = 256;
constexpr std::chrono::seconds kRateWindow{10};

size_t common_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}
}  // namespace

void LatencyHistogram::add(double seconds) {
    const auto bucket = std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin();
    ++counts[static_cast<size_t>(bucket)];
    sum += seconds;
}

int64_t LatencyHistogram::count() const { return std::accumulate(counts.begin(), counts.end(), int64_t(0)); }

const char *finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::none: return "none";
        case FinishReason::stop: return "stop";
        case FinishReason::length: return "length";
        case FinishReason::cancelled: return "cancelled";
        case FinishReason::error: return "error";
    }
    return "?";
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int n) {
    // log softmax, the normaliser summed in double over the whole vocabulary
    const float max = max_logit(logits);
    const double log_z = max + std::log(sum_exp(logits, max));
    const auto logprob = [&](int32_t id) { return static_cast<float>(logits[static_cast<size_t>(id)] - log_z); };
    TokenLogprob out{token, logprob(token), {}};
    // The n best by (logit descending, id ascending), as the sampler's top-k finds them.
    std::vector<Sampler::Candidate> best;
    if (n > 0) best_logits(logits, static_cast<size_t>(n), best);
    for (const Sampler::Candidate &c : best) out.top.emplace_back(c.id, logprob(c.id));
    return out;
}

// --- TaskChannel -------------------------------------------------------------------------------------------

TaskUpdate TaskChannel::wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return news_; });
    news_ = false;
    TaskUpdate out = state_;  // counters and flags
    out.text = std::move(state_.text);
    state_.text.clear();
    out.logprobs = std::move(state_.logprobs);
    state_.logprobs.clear();
    state_.prompt_logprobs.reset();  // handed over once
    if (state_.done) out.embedding = std::move(state_.embedding);
    return out;
}

void TaskChannel::start(int64_t n_prompt, int64_t n_cached, int id_slot) {
    std::lock_guard lock(mu_);
    state_.n_prompt = n_prompt;
    state_.n_cached = n_cached;
    state_.id_slot = id_slot;
    started_ = std::chrono::steady_clock::now();
}

void TaskChannel::push(std::string_view text, int64_t n_generated, std::span<const TokenLogprob> logprobs) {
    {
        std::lock_guard lock(mu_);
        state_.text.append(text);
        state_.logprobs.insert(state_.logprobs.end(), logprobs.begin(), logprobs.end());
        const auto now = std::chrono::steady_clock::now();
        if (state_.n_generated == 0 && n_generated > 0) {
            first_token_ = now;
            state_.prompt_seconds = std::chrono::duration<double>(now - started_).count();
        }
        if (n_generated > 0) state_.generation_seconds = std::chrono::duration<double>(now - first_token_).count();
        state_.n_generated = n_generated;
        news_ = true;
    }
    cv_.notify_all();
}

void TaskChannel::set_embedding(std::vector<float> rows, int64_t n_rows) {
    std::lock_guard lock(mu_);
    state_.embedding = std::move(rows);
    state_.n_embd_rows = n_rows;
}

void TaskChannel::set_prompt_logprobs(std::vector<TokenLogprob> entries) {
    {
        std::lock_guard lock(mu_);
        state_.prompt_logprobs = std::move(entries);
        news_ = true;
    }
    cv_.notify_all();
}

void TaskChannel::finish(FinishReason reason, const std::string &error, bool request_error) {
    {
        std::lock_guard lock(mu_);
        if (state_.done) return;
        if (state_.n_generated == 0 && started_ != std::chrono::steady_clock::time_point{}) {  // a prompt-only task
            state_.prompt_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
        }
        state_.done = true;
        state_.finish = reason;
        state_.error = error;
        state_.request_error = request_error;
        news_ = true;
    }
    cv_.notify_all();
}

// --- Scheduler ---------------------------------------------------------------------------------------------

// One sequence of the context and the task it runs. Scheduler thread only.
struct Scheduler::Slot {
    int32_t seq_id = 0;
    std::vector<int32_t> cache;  // the tokens whose rows the context holds for seq_id, by position
    uint64_t last_used = 0;      // admission stamp of its latest task (least recently used slot wins ties)

    // The running task (channel == nullptr: idle).
    std::shared_ptr<TaskChannel> channel;
    Task task;
    uint64_t admitted = 0;
    Clock::time_point submitted, last_token;  // when the task was queued, and when its latest token was sampled
    size_t n_prompt_done = 0;                 // prompt tokens in the cache
    std::optional<Sampler> sampler;
    int32_t next_token = -1;  // sampled, to be decoded at the next step
    int64_t n_generated = 0;
    std::optional<LogitAdjuster> adjuster;        // the task's penalties and biases over its sequence
    std::unique_ptr<TokenConstraint> constraint;  // JSON mode, a schema or a grammar: what may come next
    std::string text;                             // generated text so far
    size_t n_sent = 0;                            // bytes of text handed to the channel
    // logprobs >= 0: the entries of generated tokens not yet handed over, with where each token's text begins
    // in `text` (it ends where the next one begins, or at the end of `text`)
    std::vector<TokenLogprob> logprobs;
    std::vector<size_t> logprob_starts;
    int32_t shift_keep = -1;       // context shifts of the running task: the positions they keep (-1: none happened)
    std::vector<float> embd_rows;  // embeddings: hidden states gathered so far
    std::vector<TokenLogprob> prompt_logprobs;  // Task::prompt_logprobs: prompt tokens 1, 2, ... so far
    // Riding along: another slot (the leader, running the task admitted as leader_admitted) reads a prompt that
    // begins like this one, and its prompt tokens up to follow_until are decoded once for both (this slot's
    // sequence among each token's extra_seq_ids). The two hold the same cells below their common position.
    Slot *leader = nullptr;
    uint64_t leader_admitted = 0;
    size_t follow_until = 0;

    bool busy() const { return channel != nullptr; }
    // The leading cache tokens whose rows equal a fresh evaluation of them: all, but after a context shift only
    // those it kept (the later rows were computed with a longer history). Another task may share only these.
    size_t exact_prefix() const { return shift_keep >= 0 ? std::min(cache.size(), size_t(shift_keep)) : cache.size(); }
    bool reading_prompt() const { return busy() && n_prompt_done < task.prompt.size(); }
    // Still in step with its leader: the leader runs the same task, is as far into its prompt as this slot is,
    // and this slot has not reached follow_until.
    bool following() const {
        return leader && reading_prompt() && n_prompt_done < follow_until && leader->busy() &&
               leader->admitted == leader_admitted && leader->n_prompt_done == n_prompt_done;
    }
};

Scheduler::Scheduler(std::shared_ptr<const Model> model, const ContextParams &params, const Options &options)
    : model_(std::move(model)), tokenizer_(model_tokenizer(*model_)), options_(options) {
    if (options_.n_slots < 1 || options_.n_slots > 64) throw_error("the number of slots must be in [1, 64]");
    if (options_.max_queue < 0) throw_error("the queue limit must not be negative");
    if (options_.prefill_chunk < 0) throw_error("the prefill chunk must not be negative");
    ContextParams p = params;
    p.embeddings = true;
    ctx_ = std::make_unique<Context>(model_, p);
    n_ctx_ = ctx_->n_ctx();
    n_ctx_per_slot_ = n_ctx_ / options_.n_slots;
    if (n_ctx_per_slot_ < 8) {
        throw_error("a context of %lld cells leaves %lld per slot for %d slots (raise -c or lower -np)",
                    (long long)n_ctx_, (long long)n_ctx_per_slot_, options_.n_slots);
    }
    n_batch_ = ctx_->params().n_batch;
    prefill_chunk_ = options_.prefill_chunk > 0 ? options_.prefill_chunk : ctx_->params().n_ubatch;
    n_embd_ = model_info(*model_).n_embd;
    eog_ids_ = end_of_generation_ids(tokenizer_);
    slots_.resize(static_cast<size_t>(options_.n_slots));
    for (size_t i = 0; i < slots_.size(); ++i) slots_[i].seq_id = static_cast<int32_t>(i);
    counters_.n_slots = options_.n_slots;
    counters_.kv_cells_total = n_ctx_;
    counters_.slots.resize(slots_.size());  // idle and empty
    metrics_ = counters_;
    thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

std::shared_ptr<TaskChannel> Scheduler::submit(Task task) {
    std::vector<Task> one;
    one.push_back(std::move(task));
    std::vector<std::shared_ptr<TaskChannel>> channels = submit_all(std::move(one));
    return channels.empty() ? nullptr : channels[0];
}

std::vector<std::shared_ptr<TaskChannel>> Scheduler::submit_all(std::vector<Task> tasks) {
    std::vector<std::shared_ptr<TaskChannel>> channels;
    for (const Task &t : tasks) {
        SPARROW_ASSERT(!t.prompt.empty());
        for (const auto &[id, bias] : t.sampling.adjust.logit_bias)
            SPARROW_ASSERT(id >= 0 && id < tokenizer_.n_vocab());
        channels.push_back(std::make_shared<TaskChannel>());
    }
    {
        std::lock_guard lock(mu_);
        if (stop_ || static_cast<int64_t>(queue_.size() + tasks.size()) > options_.max_queue) return {};
        const auto now = Clock::now();
        for (size_t i = 0; i < tasks.size(); ++i) queue_.push_back({std::move(tasks[i]), channels[i], now});
        metrics_.queue_depth = static_cast<int64_t>(queue_.size());
    }
    cv_.notify_all();
    return channels;
}

SchedulerMetrics Scheduler::metrics() const {
    std::lock_guard lock(mu_);
    return metrics_;
}

SlotActionResult Scheduler::slot_action(int slot, SlotActionKind kind, const std::string &path) {
    SPARROW_ASSERT(slot >= 0 && slot < options_.n_slots);
    std::future<SlotActionResult> result;
    {
        std::lock_guard lock(mu_);
        if (stop_) return {.error = "the server is shutting down"};
        actions_.push_back({slot, kind, path, {}});
        result = actions_.back().done.get_future();
    }
    cv_.notify_all();
    return result.get();
}

SlotActionResult Scheduler::run_action(Slot &slot, const PendingAction &action) {
    SPARROW_ASSERT(!slot.busy());
    const auto t0 = Clock::now();
    SlotActionResult r;
    const auto file_size = [&] {
        std::error_code ec;
        const auto n = std::filesystem::file_size(action.path, ec);
        return ec ? int64_t(0) : static_cast<int64_t>(n);
    };
    try {
        switch (action.kind) {
            case SlotActionKind::save:
                ctx_->state_seq_save(slot.seq_id, action.path, slot.cache);
                r.n_tokens = static_cast<int64_t>(slot.cache.size());
                r.n_bytes = file_size();
                break;
            case SlotActionKind::restore: {
                std::vector<int32_t> tokens = ctx_->state_seq_load(slot.seq_id, action.path);  // throws: unchanged
                // The slot's bookkeeping needs the token at each position 0, 1, ... and room for a task after them.
                const auto n = static_cast<int64_t>(tokens.size());
                const bool in_order =
                    ctx_->seq_n_cells(slot.seq_id) == n &&
                    (n == 0 || (ctx_->seq_pos_min(slot.seq_id) == 0 && ctx_->seq_pos_max(slot.seq_id) == n - 1));
                if (!in_order || n >= n_ctx_per_slot_) {
                    ctx_->seq_rm(slot.seq_id, 0, -1);
                    slot.cache.clear();
                    r.error = in_order ? strprintf(
                                             "the state holds %lld tokens, more than a slot's context leaves room "
                                             "for (%lld); the slot is empty now",
                                             (long long)n, (long long)n_ctx_per_slot_)
                                       : "the state does not hold one token per position 0, 1, ... (it was not saved "
                                         "by a slot of sparrow serve); the slot is empty now";
                    return r;
                }
                slot.cache = std::move(tokens);
                r.n_tokens = n;
                r.n_bytes = file_size();
                break;
            }
            case SlotActionKind::erase:
                r.n_tokens = static_cast<int64_t>(slot.cache.size());
                ctx_->seq_rm(slot.seq_id, 0, -1);
                slot.cache.clear();
                break;
        }
    } catch (const std::exception &e) {
        r.error = e.what();
        return r;
    }
    r.ok = true;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
}

void Scheduler::loop() {
    std::vector<PendingAction> runnable;
    std::vector<bool> reserved, taken;  // per slot, each step: an action waits for it; it can take no task now
    while (true) {
        std::vector<Queued> admitted;
        reserved.assign(slots_.size(), false);
        {
            std::unique_lock lock(mu_);
            const auto any_busy = [&] {
                return std::any_of(slots_.begin(), slots_.end(), [](const Slot &s) { return s.busy(); });
            };
            cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !actions_.empty() || any_busy(); });
            if (stop_) break;
            // Slot actions run once their slots are idle; until then those slots take no task.
            for (auto it = actions_.begin(); it != actions_.end();) {
                if (!slots_[static_cast<size_t>(it->slot)].busy()) {
                    runnable.push_back(std::move(*it));
                    it = actions_.erase(it);
                } else {
                    ++it;
                }
            }
            for (const PendingAction &a : actions_) reserved[static_cast<size_t>(a.slot)] = true;
            // Tasks whose clients left while they waited are dropped without taking a slot.
            for (auto it = queue_.begin(); it != queue_.end();) {
                if (it->channel->cancelled()) {
                    it->channel->finish(FinishReason::cancelled);
                    ++counters_.tasks_cancelled;
                    it = queue_.erase(it);
                } else {
                    ++it;
                }
            }
            // Tasks pinned to a slot (Task::id_slot) take it when it is free, then the others take the free slots
            // left, in queue order; a pinned task whose slot is busy waits in the queue.
            taken = reserved;
            for (size_t i = 0; i < slots_.size(); ++i) taken[i] = taken[i] || slots_[i].busy();
            int64_t n_free = std::count(taken.begin(), taken.end(), false);
            for (auto it = queue_.begin(); it != queue_.end() && n_free > 0;) {
                const int pin = it->task.id_slot;
                if (pin >= 0 && !taken[static_cast<size_t>(pin)]) {
                    taken[static_cast<size_t>(pin)] = true;
                    --n_free;
                    admitted.push_back(std::move(*it));
                    it = queue_.erase(it);
                } else {
                    ++it;
                }
            }
            for (auto it = queue_.begin(); it != queue_.end() && n_free > 0;) {
                if (it->task.id_slot < 0) {
                    --n_free;
                    admitted.push_back(std::move(*it));
                    it = queue_.erase(it);
                } else {
                    ++it;
                }
            }
        }
        for (PendingAction &a : runnable) {
            SlotActionResult r = run_action(slots_[static_cast<size_t>(a.slot)], a);
            publish_metrics();  // before the caller hears of it, so that /slots and /metrics already show it
            a.done.set_value(std::move(r));
        }
        runnable.clear();
        // Pinned tasks first, so that the others' choice of a free slot cannot take theirs.
        std::stable_partition(admitted.begin(), admitted.end(), [](const Queued &q) { return q.task.id_slot >= 0; });
        for (Queued &q : admitted) {
            // Its own slot when pinned; else the free slot whose cache shares the longest prefix with the prompt,
            // else the least recently used.
            Slot *best = q.task.id_slot >= 0 ? &slots_[static_cast<size_t>(q.task.id_slot)] : nullptr;
            size_t best_prefix = 0;
            for (Slot &s : slots_) {
                if (q.task.id_slot >= 0) break;
                if (s.busy() || reserved[static_cast<size_t>(s.seq_id)]) continue;
                const size_t prefix = common_prefix(s.cache, q.task.prompt);
                if (!best || prefix > best_prefix || (prefix == best_prefix && s.last_used < best->last_used)) {
                    best = &s;
                    best_prefix = prefix;
                }
            }
            SPARROW_ASSERT(best != nullptr);
            try {
                start_task(*best, q);
            } catch (const std::exception &e) {
                const std::string why = std::string("internal error: ") + e.what();
                if (best->busy()) {
                    release(*best, FinishReason::error, why);
                } else {
                    q.channel->finish(FinishReason::error, why);
                }
            }
        }
        try {
            for (Slot &s : slots_) {
                if (s.busy() && s.channel->cancelled()) release(s, FinishReason::cancelled);
            }
            step();
        } catch (const std::exception &e) {
            // Nothing here should throw (decode errors are handled in step()); if something does, the
            // running tasks fail and their sequences are emptied rather than the server going down.
            for (Slot &s : slots_) {
                ctx_->seq_rm(s.seq_id, 0, -1);
                s.cache.clear();
                if (s.busy()) release(s, FinishReason::error, std::string("internal error: ") + e.what());
            }
        }
        publish_metrics();
    }
    // Shutting down: nothing may wait forever.
    std::lock_guard lock(mu_);
    for (Slot &s : slots_) {
        if (s.busy()) s.channel->finish(FinishReason::error, "the server is shutting down");
    }
    for (Queued &q : queue_) q.channel->finish(FinishReason::error, "the server is shutting down");
    queue_.clear();
    for (PendingAction &a : actions_) a.done.set_value({.error = "the server is shutting down"});
    actions_.clear();
}

void Scheduler::start_task(Slot &slot, Queued &queued) {
    slot.task = std::move(queued.task);
    slot.channel = std::move(queued.channel);
    slot.submitted = queued.submitted;
    slot.admitted = slot.last_used = ++admissions_;
    const std::vector<int32_t> &prompt = slot.task.prompt;
    // Reuse a cached prefix, but evaluate at least the last prompt token (its logits start generation);
    // embeddings other than the last token's, and prompt log probabilities, need every token evaluated.
    const bool reuse =
        !(slot.task.kind == TaskKind::embedding && slot.task.pooling != Pooling::last) && !slot.task.prompt_logprobs;
    const size_t limit = prompt.size() - 1;
    size_t keep = reuse ? std::min(common_prefix(slot.cache, prompt), limit) : 0;
    // Another slot, busy or not, may hold a longer prefix of the prompt (a system prompt that many
    // conversations begin with): this slot then shares that slot's cells for it (seq_cp copies no rows;
    // a cell stays while any sequence holds it), so the prefix is evaluated once for all of them.
    const Slot *donor = nullptr;
    slot.leader = nullptr;
    size_t follow_until = 0;
    if (reuse) {
        for (const Slot &s : slots_) {
            if (&s == &slot) continue;
            const size_t prefix = std::min({common_prefix(s.cache, prompt), s.exact_prefix(), limit});
            if (prefix > keep) {
                keep = prefix;
                donor = &s;
            }
        }
        // A slot still reading a prompt that begins like this one, further than what is cached (requests with
        // one system prompt arriving together): this slot takes that slot's cells so far and rides along.
        for (Slot &s : slots_) {
            if (&s == &slot || !s.reading_prompt() || s.following() || s.n_prompt_done < keep) continue;
            const size_t common = std::min(common_prefix(s.task.prompt, prompt), limit);
            if (common > s.n_prompt_done && common > follow_until) {
                slot.leader = &s;
                follow_until = common;
            }
        }
    }
    if (slot.leader) {
        donor = slot.leader;
        keep = slot.leader->n_prompt_done;
        slot.leader_admitted = slot.leader->admitted;
        slot.follow_until = follow_until;
    }
    if (donor) {
        ctx_->seq_rm(slot.seq_id, 0, -1);
        if (keep > 0) ctx_->seq_cp(donor->seq_id, slot.seq_id, 0, static_cast<int32_t>(keep));
        slot.cache.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(keep));
        ++counters_.prefixes_shared;
    } else {
        ctx_->seq_rm(slot.seq_id, static_cast<int32_t>(keep), -1);
        slot.cache.resize(keep);
    }
    slot.n_prompt_done = keep;
    const SamplingOptions &so = slot.task.sampling;
    slot.sampler.emplace(so.params);
    slot.next_token = -1;
    slot.n_generated = 0;
    slot.adjuster.emplace(so.adjust, eog_ids_);
    slot.adjuster->start(slot.task.prompt);
    slot.constraint.reset();
    if (so.json_object || so.grammar) {
        if (json_vocab_.pieces.empty()) json_vocab_ = json_vocabulary(tokenizer_);
        if (so.grammar) {
            if (!token_trie_) token_trie_.emplace(json_vocab_.pieces, json_vocab_.eog);
            slot.constraint = std::make_unique<GrammarConstraint>(so.grammar, json_vocab_.pieces, json_vocab_.eog,
                                                                  *token_trie_, so.constraint_after);
        } else {
            slot.constraint = std::make_unique<JsonConstraint>(json_vocab_, so.constraint_after, so.json_schema);
        }
    }
    slot.text.clear();
    slot.n_sent = 0;
    slot.logprobs.clear();
    slot.logprob_starts.clear();
    slot.embd_rows.clear();
    slot.prompt_logprobs.clear();
    slot.channel->start(static_cast<int64_t>(prompt.size()), static_cast<int64_t>(keep), slot.seq_id);
    counters_.prompt_tokens += static_cast<int64_t>(prompt.size());
}

void Scheduler::release(Slot &slot, FinishReason reason, const std::string &error, bool request_error) {
    if (reason == FinishReason::cancelled) ++counters_.tasks_cancelled;
    if (reason == FinishReason::error) ++counters_.tasks_failed;
    if (reason == FinishReason::stop || reason == FinishReason::length) ++counters_.tasks_completed;
    const std::shared_ptr<TaskChannel> channel = std::move(slot.channel);
    slot.sampler.reset();
    slot.constraint.reset();
    slot.task = Task{};
    if (slot.shift_keep >= 0) {
        // Rows after the kept ones were computed with a longer history: reusing them for a later prompt that
        // begins with these tokens would not be exact.
        ctx_->seq_rm(slot.seq_id, slot.shift_keep, -1);
        slot.cache.resize(std::min(slot.cache.size(), static_cast<size_t>(slot.shift_keep)));
        slot.shift_keep = -1;
    }
    // Published before the client hears of the end, so that /metrics already counts this task.
    publish_metrics();
    channel->finish(reason, error, request_error);
}

bool Scheduler::step() {
    struct Entry {
        Slot *slot;
        bool output;  // the token asked for logits
    };
    std::vector<BatchToken> batch;
    std::vector<Entry> entries;  // per batch token
    // Decode tokens first: one per generating slot.
    for (Slot &s : slots_) {
        if (!s.busy() || s.reading_prompt()) continue;
        SPARROW_ASSERT(s.next_token >= 0);
        batch.push_back({s.next_token, static_cast<int32_t>(s.cache.size()), s.seq_id, true});
        entries.push_back({&s, true});
    }
    // Then prompt chunks, oldest task first, within the batch size; while slots generate, within the prefill
    // chunk too (at least one prompt token), so that their next tokens wait for one short step, not for a
    // whole long prompt.
    const auto n_decode = static_cast<int64_t>(batch.size());
    const int64_t step_limit = n_decode == 0 ? n_batch_ : std::min(n_batch_, std::max(prefill_chunk_, n_decode + 1));
    // Slots riding along with a leader add nothing of their own: the leader's tokens carry their sequence too.
    std::vector<Slot *> readers, followers;
    for (Slot &s : slots_) {
        if (s.following()) {
            followers.push_back(&s);  // a stale leader (gone, or caught up with) makes following() false for good
        } else if (s.reading_prompt()) {
            readers.push_back(&s);
        }
    }
    std::sort(readers.begin(), readers.end(), [](const Slot *a, const Slot *b) { return a->admitted < b->admitted; });
    for (Slot *s : readers) {
        int64_t budget = step_limit - static_cast<int64_t>(batch.size());
        if (budget <= 0) break;
        const bool all_outputs =
            (s->task.kind == TaskKind::embedding && s->task.pooling != Pooling::last) || s->task.prompt_logprobs;
        if (all_outputs) budget = std::min(budget, kMaxPromptOutputsPerStep);
        const size_t n_prompt = s->task.prompt.size();
        const size_t end = std::min(n_prompt, s->n_prompt_done + static_cast<size_t>(budget));
        for (size_t j = s->n_prompt_done; j < end; ++j) {
            const bool out = all_outputs || j + 1 == n_prompt;
            batch.push_back({s->task.prompt[j], static_cast<int32_t>(j), s->seq_id, out});
            for (const Slot *f : followers) {
                if (f->leader == s && j < f->follow_until) batch.back().extra_seq_ids.push_back(f->seq_id);
            }
            entries.push_back({s, out});
        }
    }
    if (batch.empty()) return false;

    const auto t0 = Clock::now();
    try {
        ctx_->decode(batch);
    } catch (const std::exception &e) {
        // The context is unchanged; fail the tasks of this batch and forget their caches.
        for (Entry &e2 : entries) {
            Slot &s = *e2.slot;
            if (!s.busy()) continue;
            ctx_->seq_rm(s.seq_id, 0, -1);
            s.cache.clear();
            release(s, FinishReason::error, std::string("decode failed: ") + e.what());
        }
        return true;
    }
    const auto t1 = Clock::now();
    counters_.decode_calls += 1;
    counters_.decode_seconds += std::chrono::duration<double>(t1 - t0).count();

    int64_t generated_before = counters_.generated_tokens;
    for (size_t i = 0; i < batch.size(); ++i) {
        Slot &s = *entries[i].slot;
        s.cache.push_back(batch[i].id);
        if (s.reading_prompt()) {
            ++s.n_prompt_done;
            ++counters_.prompt_tokens_evaluated;
        }
        for (const int32_t f : batch[i].extra_seq_ids) {   // riding along: the token is in their caches too
            Slot &rider = slots_[static_cast<size_t>(f)];  // slot i holds sequence i
            rider.cache.push_back(batch[i].id);
            ++rider.n_prompt_done;
        }
        if (!entries[i].output || !s.busy()) continue;
        if (s.task.kind == TaskKind::embedding) {
            const auto h = ctx_->embeddings(i);
            s.embd_rows.insert(s.embd_rows.end(), h.begin(), h.end());
            if (!s.reading_prompt()) {
                // The whole prompt is in: pool and hand over.
                const int64_t n_rows = static_cast<int64_t>(s.embd_rows.size()) / n_embd_;
                std::vector<float> out;
                int64_t out_rows = 1;
                if (s.task.pooling == Pooling::none) {
                    out = std::move(s.embd_rows);
                    out_rows = n_rows;
                } else if (s.task.pooling == Pooling::last) {
                    out.assign(s.embd_rows.end() - n_embd_, s.embd_rows.end());
                } else {
                    out.assign(static_cast<size_t>(n_embd_), 0.0f);
                    for (int64_t r = 0; r < n_rows; ++r) {
                        for (int64_t k = 0; k < n_embd_; ++k) out[k] += s.embd_rows[r * n_embd_ + k];
                    }
                    for (float &v : out) v /= static_cast<float>(n_rows);
                }
                if (s.task.normalize && s.task.pooling != Pooling::none) {
                    double norm = 0;
                    for (float v : out) norm += double(v) * v;
                    norm = std::sqrt(norm);
                    if (norm > 0) {
                        for (float &v : out) v = static_cast<float>(v / norm);
                    }
                }
                s.channel->set_embedding(std::move(out), out_rows);
                s.embd_rows.clear();
                release(s, FinishReason::stop);
            }
            continue;
        }
        if (s.task.prompt_logprobs && static_cast<size_t>(batch[i].pos) < s.task.prompt.size()) {
            // A prompt token's logits: the log probability of the next prompt token, or, after the last one,
            // the prompt's entries are complete.
            const size_t next = static_cast<size_t>(batch[i].pos) + 1;
            if (next < s.task.prompt.size()) {
                s.prompt_logprobs.push_back(
                    token_logprob(ctx_->logits(i), s.task.prompt[next], std::max(s.task.sampling.logprobs, 0)));
                continue;
            }
            s.channel->set_prompt_logprobs(std::move(s.prompt_logprobs));
            s.prompt_logprobs.clear();
        }
        if (s.task.sampling.max_tokens == 0) {  // only the prompt was asked for
            release(s, FinishReason::length);
            continue;
        }
        handle_output(s, ctx_->logits(i), t1);
    }
    const int64_t n_new = counters_.generated_tokens - generated_before;
    recent_.emplace_back(t1, n_new);
    return true;
}

void Scheduler::handle_output(Slot &s, std::span<const float> logits, Clock::time_point step_end) {
    const SamplingOptions &so = s.task.sampling;
    const std::span<const float> model_logits = logits;
    // Hands the channel text[n_sent, end) with the log probabilities of the tokens whose text ends in it, or,
    // when the task ends here (last), of every token whose text begins before `end` (a stop string may cut
    // the last one; tokens wholly inside the stop string are not reported).
    const auto send = [&](size_t end, bool last) {
        size_t n = 0;
        while (n < s.logprob_starts.size()) {
            const size_t token_end = n + 1 < s.logprob_starts.size() ? s.logprob_starts[n + 1] : s.text.size();
            if (last ? s.logprob_starts[n] >= end && token_end > s.logprob_starts[n] : token_end > end) break;
            ++n;
        }
        s.channel->push(std::string_view(s.text).substr(s.n_sent, end - s.n_sent), s.n_generated,
                        std::span<const TokenLogprob>(s.logprobs.data(), n));
        s.logprobs.erase(s.logprobs.begin(), s.logprobs.begin() + static_cast<std::ptrdiff_t>(n));
        s.logprob_starts.erase(s.logprob_starts.begin(), s.logprob_starts.begin() + static_cast<std::ptrdiff_t>(n));
        s.n_sent = end;
    };
    logits = s.adjuster->apply(logits);
    const int32_t token =
        s.constraint ? sample_constrained(*s.sampler, logits, *s.constraint, masked_) : s.sampler->sample(logits);
    if (token < 0) {
        // Constrained and nothing may follow: a whole text whose end-of-generation tokens are banned (ignore_eos)
        // ends here, as at one of them; else the vocabulary (with the request's biases) cannot continue it.
        if (s.constraint->complete()) {
            send(s.text.size(), true);
            release(s, FinishReason::stop);
        } else {
            release(s, FinishReason::error,
                    s.task.sampling.grammar
                        ? "no token of the vocabulary continues the grammar's text (the request's biases ban those "
                          "that could)"
                        : "no token of the vocabulary continues the JSON object (the request's biases ban those that "
                          "could)",
                    /*request_error=*/true);
        }
        return;
    }
    ++s.n_generated;
    ++counters_.generated_tokens;
    if (s.n_generated == 1) {
        counters_.time_to_first_token.add(std::chrono::duration<double>(step_end - s.submitted).count());
    } else {
        counters_.inter_token.add(std::chrono::duration<double>(step_end - s.last_token).count());
    }
    s.last_token = step_end;
    if (tokenizer_.is_eog(token)) {
        send(s.text.size(), true);
        release(s, FinishReason::stop);
        return;
    }
    s.adjuster->accept(token);
    if (so.logprobs >= 0) {
        s.logprobs.push_back(token_logprob(model_logits, token, so.logprobs));
        s.logprob_starts.push_back(s.text.size());
    }
    s.text += tokenizer_.token_to_piece(token);
    const StopScan scan = scan_stop_strings(s.text, s.n_sent, so.stop);
    if (scan.stop_at != StopScan::npos) {
        send(scan.stop_at, true);
        release(s, FinishReason::stop);
        return;
    }
    // The token goes to position cache.size() at the next step. With context shifts, a full slot is shifted first
    // (as `run --context-shift` does: when every cell holds a position); without them, requests are checked to
    // fit and this is a guard.
    if (options_.context_shift && s.n_generated < so.max_tokens &&
        static_cast<int64_t>(s.cache.size()) >= n_ctx_per_slot_ && !shift_context(s)) {
        return;  // released
    }
    const int64_t most = options_.context_shift ? n_ctx_per_slot_ : n_ctx_per_slot_ - 1;
    if (s.n_generated >= so.max_tokens || static_cast<int64_t>(s.cache.size()) >= most) {
        send(s.text.size(), true);
        release(s, FinishReason::length);
        return;
    }
    send(scan.safe_end, false);
    s.next_token = token;
}

bool Scheduler::shift_context(Slot &s) {
    const int64_t keep = context_shift_keep(s.task.prompt, tokenizer_.bos_id(), s.task.n_keep);
    if (keep > n_ctx_per_slot_ - 2) return true;  // no room to make: the task ends (length)
    int32_t dropped = 0;
    try {
        dropped = ctx_->context_shift(s.seq_id, static_cast<int32_t>(keep));
    } catch (const std::exception &e) {  // shared cells to copy and no free cell: the sequence is damaged
        ctx_->seq_rm(s.seq_id, 0, -1);
        s.cache.clear();
        release(s, FinishReason::error, std::string("context shift failed: ") + e.what());
        return false;
    }
    if (dropped == 0) return true;  // nothing after the kept tokens to drop: the task ends (length)
    s.cache.erase(s.cache.begin() + keep, s.cache.begin() + keep + dropped);
    s.shift_keep = static_cast<int32_t>(keep);
    ++counters_.context_shifts;
    return true;
}

void Scheduler::publish_metrics() {
    const auto now = Clock::now();
    while (!recent_.empty() && now - recent_.front().first > kRateWindow) recent_.pop_front();
    int64_t recent_tokens = 0;
    for (const auto &r : recent_) recent_tokens += r.second;
    double span = recent_.empty() ? 0.0 : std::chrono::duration<double>(now - recent_.front().first).count();
    span = std::max(span, 1.0);
    counters_.tokens_per_second = recent_tokens / span;
    counters_.slots_busy = std::count_if(slots_.begin(), slots_.end(), [](const Slot &s) { return s.busy(); });
    counters_.kv_cells_used = ctx_->n_cells_used();  // a cell that slots share counts once
    counters_.slots.resize(slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot &s = slots_[i];
        counters_.slots[i] = {.busy = s.busy(),
                              .n_cached = static_cast<int64_t>(s.cache.size()),
                              .n_prompt = s.busy() ? static_cast<int64_t>(s.task.prompt.size()) : 0,
                              .n_generated = s.busy() ? s.n_generated : 0};
    }
    std::lock_guard lock(mu_);
    counters_.queue_depth = static_cast<int64_t>(queue_.size());
    metrics_ = counters_;
}

}  // namespace sparrow::server
