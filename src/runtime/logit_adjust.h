// What is done to a step's logits before the sampler sees them: penalties for what the sequence already holds
// (OpenAI's presence and frequency penalties over the generated tokens, llama.cpp's repetition penalty over the
// last tokens of the sequence), per-token biases, and banned end-of-generation tokens. The server takes these
// from each request, `run` and `batched` from their flags; both go through LogitAdjuster, so a request and a run
// with the same settings sample from the same numbers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sparrow {

class Tokenizer;

struct LogitAdjustments {
    float presence_penalty = 0.0f;   // subtracted once from the logit of every token generated so far
    float frequency_penalty = 0.0f;  // subtracted per occurrence of the token among the generated ones
    // llama.cpp's repetition penalty over the last repeat_last_n tokens of the sequence (prompt included; -1: all
    // of it): each distinct token's logit is divided by repeat_penalty when positive, multiplied when not (1: off)
    float repeat_penalty = 1.0f;
    int64_t repeat_last_n = 64;
    // (token, bias) added to the token's logit, after the penalties (-inf: never sampled); a token may appear
    // more than once (the biases add up)
    std::vector<std::pair<int32_t, float>> logit_bias;
    bool ignore_eos = false;  // end-of-generation tokens are never sampled
    // DRY ("don't repeat yourself", llama.cpp's): where the sequence's last L tokens (L >= dry_allowed_length) also
    // stand earlier in its last dry_penalty_last_n tokens (-1: all of it, prompt included), the token that followed
    // them there has dry_multiplier * dry_base^(L - dry_allowed_length) subtracted, with the longest such L per
    // token. A repetition never extends back past a breaker token (dry_breaker_tokens). 0: off.
    float dry_multiplier = 0.0f;
    float dry_base = 1.75f;
    int64_t dry_allowed_length = 2;
    int64_t dry_penalty_last_n = -1;
    std::vector<int32_t> dry_breakers;  // sorted token ids (dry_breaker_tokens)

    // Whether any of the above changes a logit.
    bool any() const;
};

// llama.cpp's repetition penalty: every distinct token of `window` has its logit divided by `penalty` when positive,
// multiplied by it otherwise (in place; ids must index logits). `window` is sorted and made unique on the way (its
// order and repeats do not matter to the penalty).
void apply_repeat_penalty(std::span<float> logits, std::vector<int32_t> &window, float penalty);

// llama.cpp's default DRY sequence breakers: newline, colon, double quote, asterisk.
std::vector<std::string> default_dry_breakers();
// The tokens (sorted ids) whose text holds one of `breakers` (non-empty strings): a breaker spelled over several
// tokens, none of which holds it whole, is not seen.
std::vector<int32_t> dry_breaker_tokens(const Tokenizer &tok, std::span<const std::string> breakers);

// DRY's buffers, kept between steps so that a step allocates nothing.
struct DryWorkspace {
    std::vector<int32_t> z;                         // per position of the reversed window: its repeat length
    std::vector<std::pair<int32_t, int32_t>> best;  // (token, repeat length) of the tokens that would repeat
};

// DRY's penalty (LogitAdjustments' dry_* fields) for the tokens that would repeat `window` (the sequence's last
// tokens), subtracted from logits in place (ids must index logits). Linear in the window: the repeated lengths of
// every position come from one Z-function of the reversed window.
void apply_dry_penalty(std::span<float> logits, std::span<const int32_t> window, const LogitAdjustments &a,
                       DryWorkspace &ws);

// The vocabulary's end-of-generation tokens (what LogitAdjustments::ignore_eos bans).
std::vector<int32_t> end_of_generation_ids(const Tokenizer &tok);

// LogitAdjustments over one sequence's steps: start() with its prompt, accept() each generated token, and apply()
// to each step's logits.
class LogitAdjuster {
  public:
    // eog_ids: end_of_generation_ids() of the model's tokenizer (used only with ignore_eos).
    LogitAdjuster(LogitAdjustments adjustments, std::span<const int32_t> eog_ids);

    // A new sequence that begins with `prompt` (no generated tokens yet).
    void start(std::span<const int32_t> prompt);
    // A token generated (sampled) for the sequence.
    void accept(int32_t token);
    // The logits to sample from: `logits` itself when nothing applies, else an adjusted copy held here (valid
    // until the next call). Logits of tokens outside the vocabulary (ids past logits.size()) are never written.
    std::span<const float> apply(std::span<const float> logits);

  private:
    LogitAdjustments a_;
    std::vector<int32_t> eog_ids_;
    std::vector<int32_t> sequence_;                // the prompt, then every generated token
    std::unordered_map<int32_t, int64_t> counts_;  // generated token -> occurrences
    std::vector<int32_t> window_;                  // the repetition penalty's tokens of a step (reused)
    DryWorkspace dry_;                             // DRY's buffers (reused)
    std::vector<float> adjusted_;
};

}  // namespace sparrow
