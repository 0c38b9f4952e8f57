#include "runtime/constraint.h"

#include "runtime/sampler.h"

namespace sparrow {

std::optional<std::string> StartGate::after(std::string_view piece) const {
    const std::string text = tail_ + std::string(piece);
    const size_t at = text.find(after_);
    if (at == std::string::npos) return std::nullopt;
    return text.substr(at + after_.size());
}

std::optional<std::string> StartGate::pass(std::string_view piece) {
    std::optional<std::string> rest = after(piece);
    if (rest) {
        open_ = true;
        tail_.clear();
    } else {
        const std::string text = tail_ + std::string(piece);
        tail_ = text.substr(text.size() - std::min(text.size(), after_.size() - 1));
    }
    return rest;
}

int32_t sample_constrained(Sampler &sampler, std::span<const float> logits, TokenConstraint &c,
                           std::vector<float> &scratch) {
    int32_t token = sampler.sample(logits);
    if (!c.allows(token)) {
        scratch.assign(logits.begin(), logits.end());
        if (c.mask(scratch) == 0) return -1;
        token = sampler.sample(scratch);
        if (!c.allows(token)) token = argmax(scratch);  // a cut left only masked tokens to draw: the best allowed
    }
    c.accept(token);
    return token;
}

}  // namespace sparrow
