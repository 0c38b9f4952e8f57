// The serving scheduler: one thread owns the model's Context and runs every request. HTTP threads submit
// tasks and read their results through a TaskChannel; they never touch the model.
//
// Each of the n slots is one sequence id of the context. A step gathers one batch: the next token of every
// generating slot, then prompt tokens of slots still reading their prompts (up to n_batch in all), so a new
// request joins the running batch at the next step (continuous batching). While any slot generates, a step
// holds at most the prefill chunk (one ubatch by default): a long prompt is read over several steps, and the
// running streams get a token after each of them instead of waiting for the whole prompt. A slot keeps its
// sequence's cache rows after a task and reuses the longest prefix it shares with the next prompt; when another slot
// holds a longer one, the slot shares that slot's cells instead (no rows copied, nothing evaluated twice), and
// while another slot is still reading a prompt that begins like this one, the slot rides along: the other's
// prompt tokens carry both sequences until the prompts part.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/grammar_constraint.h"
#include "runtime/json_prefix.h"
#include "runtime/logit_adjust.h"
#include "runtime/sampler.h"
#include "sparrow/sparrow.h"

namespace sparrow::server {

enum class TaskKind { completion, embedding };
enum class Pooling { none, mean, last };
enum class FinishReason { none, stop, length, cancelled, error };
const char *finish_reason_name(FinishReason r);  // "stop", "length", ...

struct SamplingOptions {
    // The sampler's settings and seed; by default OpenAI's: temperature 1 and no cut.
    SamplerParams params{.temp = 1.0f, .top_k = 0, .top_p = 1.0f};
    LogitAdjustments adjust;        // penalties, biases and banned end-of-generation tokens, before the sampler
    int64_t max_tokens = 16;        // tokens to sample at most (>= 1; 0: only evaluate the prompt)
    std::vector<std::string> stop;  // generation ends before the first occurrence of any of these
    // >= 0: report each generated token's log probability and the `logprobs` most likely tokens at its
    // position, under the model's distribution (the logits before penalties and temperature); -1: none.
    int logprobs = -1;
    // OpenAI's response_format {"type": "json_object"}: only tokens that keep the text the beginning of one JSON
    // object are sampled, and generation ends (only) once it is whole (runtime/json_prefix.h); with json_schema
    // ({"type": "json_schema"}), of one document the schema accepts (runtime/json_schema.h).
    bool json_object = false;
    std::shared_ptr<const JsonSchema> json_schema;
    // llama.cpp's `grammar`: the reply is a text this GBNF grammar derives (runtime/grammar.h), ended only once whole.
    std::shared_ptr<const Grammar> grammar;
    // JSON mode or a grammar: the constrained text comes after this text (a thinking block's "</think>").
    std::string constraint_after;
};

// One generated token's log probabilities (SamplingOptions::logprobs >= 0).
struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;  // (token, log probability), most likely first
};
// The log probability of `token` and the n most likely tokens (ties: lower id first) under softmax(logits).
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int n);

struct Task {
    TaskKind kind = TaskKind::completion;
    std::vector<int32_t> prompt;      // token ids, never empty; prompt.size() + max_tokens <= n_ctx_per_slot
    SamplingOptions sampling;         // completions
    Pooling pooling = Pooling::mean;  // embeddings
    bool normalize = true;            // embeddings: L2-normalise pooled vectors
    // completions: the log probability of every prompt token after the first (with sampling.logprobs
    // alternatives), as OpenAI's echo + logprobs report them; every prompt token is evaluated (no cached prefix)
    bool prompt_logprobs = false;
    // >= 0: run in this slot only (llama.cpp's id_slot), waiting for it while other tasks go ahead; -1: any slot
    int id_slot = -1;
    // With Options::context_shift: the prompt tokens a context shift keeps after a leading BOS (-1: all of them)
    int64_t n_keep = 0;
};

// What Scheduler::slot_action does to a slot's cache: the rows of its sequence with the tokens they hold.
enum class SlotActionKind { save, restore, erase };
struct SlotActionResult {
    bool ok = false;
    std::string error;     // when !ok: why (a state file by the path it was given)
    int64_t n_tokens = 0;  // saved, restored or erased
    int64_t n_bytes = 0;   // the state file's size (save, restore)
    double seconds = 0;
};

// A slot as /slots shows it (SchedulerMetrics::slots).
struct SlotInfo {
    bool busy = false;
    int64_t n_cached = 0;     // tokens whose cache rows the slot holds
    int64_t n_prompt = 0;     // the running task's prompt tokens (busy)
    int64_t n_generated = 0;  // and tokens sampled so far
};

// A snapshot of a task's progress, taken by the HTTP thread that waits for it.
struct TaskUpdate {
    std::string text;                    // text produced since the previous take: never part of a stop string
    std::vector<TokenLogprob> logprobs;  // SamplingOptions::logprobs >= 0: of the tokens whose text is in `text`
    // Task::prompt_logprobs: the entries of prompt tokens 1, 2, ..., handed over once, when the prompt is in
    std::optional<std::vector<TokenLogprob>> prompt_logprobs;
    bool done = false;
    FinishReason finish = FinishReason::none;
    std::string error;             // finish == error: what went wrong
    bool request_error = false;    // finish == error: the request's own settings made it fail (an HTTP 400)
    int64_t n_prompt = 0;          // prompt tokens
    int64_t n_cached = 0;          // of which were reused from the slot's cache
    int64_t n_generated = 0;       // tokens sampled so far (an end-of-generation token included)
    int64_t n_embd_rows = 0;       // embeddings: rows in `embedding` (1 when pooled)
    int id_slot = -1;              // the slot that runs the task (once started)
    std::vector<float> embedding;  // embeddings, when done: [n_embd_rows, n_embd]
    // From the task's start in a slot to its first sampled token (the prompt's evaluation), and from there to its
    // latest token (llama.cpp's /completion reports them as timings).
    double prompt_seconds = 0;
    double generation_seconds = 0;
};

// One task's link between the scheduler (writer) and the HTTP thread (reader).
class TaskChannel {
  public:
    // Reader: waits until there is new text or the task is done, or until `timeout`; takes the new text.
    TaskUpdate wait(std::chrono::milliseconds timeout);
    // Reader: the client is gone; the scheduler drops the task at its next step and frees the slot.
    void cancel() { cancelled_.store(true); }

    // Writer side (the scheduler thread).
    bool cancelled() const { return cancelled_.load(); }
    void start(int64_t n_prompt, int64_t n_cached, int id_slot);
    void push(std::string_view text, int64_t n_generated, std::span<const TokenLogprob> logprobs = {});
    void set_embedding(std::vector<float> rows, int64_t n_rows);
    void set_prompt_logprobs(std::vector<TokenLogprob> entries);
    void finish(FinishReason reason, const std::string &error = {}, bool request_error = false);

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    TaskUpdate state_;  // pending text and the latest counters, guarded by mu_
    std::chrono::steady_clock::time_point started_, first_token_;  // guarded by mu_
    bool news_ = false;
    std::atomic<bool> cancelled_{false};
};

// Latencies counted into fixed buckets (seconds), as a Prometheus histogram exposes them: counts[i] holds the
// observations in (kBounds[i - 1], kBounds[i]], the last entry those above every bound; count() is their total.
struct LatencyHistogram {
    static constexpr std::array<double, 12> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                                       0.5,   1.0,  2.5,   5.0,  10.0, 30.0};
    std::array<int64_t, kBounds.size() + 1> counts{};
    double sum = 0;
    void add(double seconds);
    int64_t count() const;
};

struct SchedulerMetrics {
    int64_t n_slots = 0;
    int64_t slots_busy = 0;
    int64_t queue_depth = 0;
    int64_t kv_cells_used = 0;  // cache cells holding rows for any slot (reusable prefixes included; shared once)
    int64_t kv_cells_total = 0;
    int64_t tasks_completed = 0;  // finished with stop or length
    int64_t tasks_cancelled = 0;
    int64_t tasks_failed = 0;
    int64_t prompt_tokens = 0;            // prompt tokens of started tasks
    int64_t prompt_tokens_evaluated = 0;  // of which were run through the model (not reused from a cache)
    int64_t prefixes_shared = 0;          // tasks that took their prompt's start from another slot's cells
    int64_t context_shifts = 0;           // Options::context_shift at work
    int64_t generated_tokens = 0;
    int64_t decode_calls = 0;
    double decode_seconds = 0;
    double tokens_per_second = 0;  // generated tokens per second over the last 10 s
    // Per completion task, from its submission to its first sampled token (queue wait and prompt included),
    // and between each two of its sampled tokens (how long a stream stalls: a step, or one that reads a
    // prompt chunk beside it).
    LatencyHistogram time_to_first_token;
    LatencyHistogram inter_token;
    std::vector<SlotInfo> slots;
};

class Scheduler {
  public:
    struct Options {
        int n_slots = 4;
        int64_t max_queue = 64;  // tasks waiting for a slot; submit() refuses more
        // Most tokens in a step while any slot generates (decode tokens included; at least one prompt token
        // goes in): 0 means the context's ubatch size, so such a step is one forward pass.
        int64_t prefill_chunk = 0;
        // A slot whose context fills while it generates keeps a leading BOS and Task::n_keep prompt tokens, drops
        // the older half of the rest (Context::context_shift) and goes on (llama.cpp's --context-shift); else the
        // task ends there (length).
        bool context_shift = false;
    };
    // Creates the context (ContextParams::embeddings is switched on) and starts the scheduler thread.
    // Throws sparrow::Error when the options do not fit the context.
    Scheduler(std::shared_ptr<const Model> model, const ContextParams &params, const Options &options);
    ~Scheduler();  // stops the thread; unfinished tasks end with an error
    Scheduler(const Scheduler &) = delete;
    Scheduler &operator=(const Scheduler &) = delete;

    // Queues a task; nullptr when the queue is full.
    std::shared_ptr<TaskChannel> submit(Task task);
    // Queues several tasks at once (all or none: empty when the queue cannot take them all). Slots free at the
    // next step take them together, so prompts that begin alike are read once (a slot rides along with another).
    std::vector<std::shared_ptr<TaskChannel>> submit_all(std::vector<Task> tasks);
    SchedulerMetrics metrics() const;
    // Saves the slot's cache to the state file at `path` (Context::state_seq_save, with the tokens), restores it
    // from one (replacing what the slot held; the file must hold one token per position 0, 1, ..., fitting a
    // slot's context) or erases it. Runs on the scheduler thread once the slot is idle, which takes no new task
    // until then; blocks the caller until it is done.
    SlotActionResult slot_action(int slot, SlotActionKind kind, const std::string &path);
    int64_t n_ctx_per_slot() const { return n_ctx_per_slot_; }
    int64_t n_ctx() const { return n_ctx_; }
    int n_slots() const { return options_.n_slots; }
    int64_t max_queue() const { return options_.max_queue; }
    int64_t n_batch() const { return n_batch_; }  // the context's, after its clamp to n_ctx
    int64_t prefill_chunk() const { return prefill_chunk_; }
    bool context_shift() const { return options_.context_shift; }

  private:
    struct Slot;
    struct Queued {
        Task task;
        std::shared_ptr<TaskChannel> channel;
        std::chrono::steady_clock::time_point submitted;
    };

    void loop();
    void start_task(Slot &slot, Queued &queued);  // moves the task out of `queued`
    bool step();                                  // one batch; false when nothing ran
    // Samples the slot's next token from logits computed by the step that ended at step_end.
    void handle_output(Slot &slot, std::span<const float> logits, std::chrono::steady_clock::time_point step_end);
    void release(Slot &slot, FinishReason reason, const std::string &error = {}, bool request_error = false);
    // Options::context_shift for a generating slot whose context is full; false when that failed and the task was
    // released with an error.
    bool shift_context(Slot &slot);
    void publish_metrics();
    struct PendingAction {
        int slot = 0;
        SlotActionKind kind = SlotActionKind::erase;
        std::string path;
        std::promise<SlotActionResult> done;
    };
    SlotActionResult run_action(Slot &slot, const PendingAction &action);

    std::shared_ptr<const Model> model_;
    const Tokenizer &tokenizer_;
    std::vector<int32_t> eog_ids_;  // the vocabulary's end-of-generation tokens (LogitAdjustments::ignore_eos)
    // The constraints' view of the vocabulary (each token's text, and whether it ends generation), made at the first
    // task that asks for it, its texts as a trie for grammars, and the logits they mask. Scheduler thread only.
    JsonVocabulary json_vocab_;
    std::optional<TokenTrie> token_trie_;
    std::vector<float> masked_;
    Options options_;
    std::unique_ptr<Context> ctx_;  // touched only by the scheduler thread after construction
    int64_t n_ctx_ = 0;
    int64_t n_ctx_per_slot_ = 0;
    int64_t n_batch_ = 0;
    int64_t prefill_chunk_ = 0;  // Options::prefill_chunk resolved
    int64_t n_embd_ = 0;
    std::vector<Slot> slots_;  // scheduler thread only
    uint64_t admissions_ = 0;  // scheduler thread only: admission counter (order of prompt processing, LRU)
    std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> recent_;  // (step end, tokens)

    mutable std::mutex mu_;  // guards queue_, actions_, stop_ and metrics_
    std::condition_variable cv_;
    std::deque<Queued> queue_;
    std::deque<PendingAction> actions_;  // slot actions waiting for their slots to be idle
    bool stop_ = false;
    SchedulerMetrics metrics_;
    SchedulerMetrics counters_;  // scheduler thread's running totals, copied into metrics_ after each step

    std::thread thread_;  // last: starts after everything above is built
};

}  // namespace sparrow::server
