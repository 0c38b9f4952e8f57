#include "runtime/logit_adjust.h"

#include <algorithm>
#include <limits>

#include "runtime/tokenizer.h"

namespace sparrow {

bool LogitAdjustments::any() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || (repeat_penalty != 1.0f && repeat_last_n != 0) ||
           !logit_bias.empty() || ignore_eos;
}

void apply_repeat_penalty(std::span<float> logits, std::vector<int32_t> &window, float penalty) {
    // Each distinct token once.
    std::sort(window.begin(), window.end());
    window.erase(std::unique(window.begin(), window.end()), window.end());
    for (const int32_t id : window) {
        float &v = logits[static_cast<size_t>(id)];
        v = v > 0.0f ? v / penalty : v * penalty;
    }
}

std::vector<int32_t> end_of_generation_ids(const Tokenizer &tok) {
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
        if (tok.is_eog(id)) ids.push_back(id);
    }
    return ids;
}

LogitAdjuster::LogitAdjuster(LogitAdjustments adjustments, std::span<const int32_t> eog_ids)
    : a_(std::move(adjustments)), eog_ids_(eog_ids.begin(), eog_ids.end()) {}

void LogitAdjuster::start(std::span<const int32_t> prompt) {
    sequence_.assign(prompt.begin(), prompt.end());
    counts_.clear();
}

void LogitAdjuster::accept(int32_t token) {
    sequence_.push_back(token);
    ++counts_[token];
}

std::span<const float> LogitAdjuster::apply(std::span<const float> logits) {
    if (!a_.any()) return logits;
    adjusted_.assign(logits.begin(), logits.end());
    const auto in_vocab = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < adjusted_.size(); };
    if (a_.repeat_penalty != 1.0f && a_.repeat_last_n != 0) {
        const size_t n =
            a_.repeat_last_n < 0 ? sequence_.size() : std::min(sequence_.size(), static_cast<size_t>(a_.repeat_last_n));
        window_.clear();
        for (const int32_t id : std::span<const int32_t>(sequence_).last(n)) {
            if (in_vocab(id)) window_.push_back(id);
        }
        apply_repeat_penalty(adjusted_, window_, a_.repeat_penalty);
    }
    if (a_.presence_penalty != 0.0f || a_.frequency_penalty != 0.0f) {
        for (const auto &[id, count] : counts_) {
            if (in_vocab(id))
                adjusted_[static_cast<size_t>(id)] -= a_.presence_penalty + a_.frequency_penalty * float(count);
        }
    }
    for (const auto &[id, bias] : a_.logit_bias) {
        if (in_vocab(id)) adjusted_[static_cast<size_t>(id)] += bias;
    }
    if (a_.ignore_eos) {
        for (const int32_t id : eog_ids_) {
            if (in_vocab(id)) adjusted_[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
        }
    }
    return adjusted_;
}

}  // namespace sparrow
