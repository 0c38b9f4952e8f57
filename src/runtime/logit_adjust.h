// What is done to a step's logits before the sampler sees them: penalties for what the sequence already holds
// (OpenAI's presence and frequency penalties over the generated tokens, llama.cpp's repetition penalty over the
// last tokens of the sequence), per-token biases, and banned end-of-generation tokens. The server takes these
// from each request, `run` and `batched` from their flags; both go through LogitAdjuster, so a request and a run
// with the same settings sample from the same numbers.
#pragma once

#include <cstdint>
#include <span>
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

    // Whether any of the above changes a logit.
    bool any() const;
};

// llama.cpp's repetition penalty: every distinct token of `window` has its logit divided by `penalty` when positive,
// multiplied by it otherwise (in place; ids must index logits). `window` is sorted and made unique on the way (its
// order and repeats do not matter to the penalty).
void apply_repeat_penalty(std::span<float> logits, std::vector<int32_t> &window, float penalty);

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
    std::vector<float> adjusted_;
};

}  // namespace sparrow
