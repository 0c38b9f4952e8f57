// Constrained sampling: a TokenConstraint says which tokens may come next (JSON mode and schemas,
// runtime/json_prefix.h; GBNF grammars, runtime/grammar_constraint.h), and sample_constrained draws within it.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparrow {

class Sampler;

class TokenConstraint {
  public:
    virtual ~TokenConstraint() = default;
    // Whether `token` may come next.
    virtual bool allows(int32_t token) const = 0;
    // Sets every logit of a token that may not come next to -inf; returns how many may and have a logit above -inf.
    virtual int64_t mask(std::span<float> logits) const = 0;
    // Takes `token` (one that allows() accepted) as generated.
    virtual void accept(int32_t token) = 0;
    // The text so far is whole (generation may end here).
    virtual bool complete() const = 0;
};

// The text a constraint applies after (a thinking model's "</think>"): until it has been generated, any token may
// come but an end of generation (the reply must reach its constrained part) and a token whose text completes the
// marker with bytes after it that the constraint refuses.
class StartGate {
  public:
    explicit StartGate(std::string after) : after_(std::move(after)), open_(after_.empty()) {}
    bool open() const { return open_; }
    // While shut: the text after the marker if `piece` completes it, else nothing (the gate stays shut).
    std::optional<std::string> after(std::string_view piece) const;
    // Takes `piece` as generated while shut; returns what after() would (the gate is then open).
    std::optional<std::string> pass(std::string_view piece);

  private:
    std::string after_;
    bool open_;
    std::string tail_;  // while shut: the text's last bytes, shorter than after_
};

// Sets the logit of every token `allowed(i)` refuses to -inf (tokens past the end of a vocabulary too: allowed says);
// returns how many it allows that have a logit above -inf. The last step of each constraint's mask().
template <class Allowed>
int64_t keep_allowed(std::span<float> logits, Allowed &&allowed) {
    int64_t n = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
        if (allowed(i)) {
            n += logits[i] > -std::numeric_limits<float>::infinity() ? 1 : 0;
        } else {
            logits[i] = -std::numeric_limits<float>::infinity();
        }
    }
    return n;
}

// The next token drawn by `sampler` from `logits`, kept to what `c` allows and taken by it: the draw is checked
// first, and only when it would break the text are the tokens that cannot come next masked (into `scratch`) and the
// sampler draws again (as llama.cpp's grammars do: most draws of a constrained model fit). -1 when no token may
// come next (c.complete() tells whether the text is whole).
int32_t sample_constrained(Sampler &sampler, std::span<const float> logits, TokenConstraint &c,
                           std::vector<float> &scratch);

}  // namespace sparrow
