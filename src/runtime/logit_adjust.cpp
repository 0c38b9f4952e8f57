#include "runtime/logit_adjust.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/tokenizer.h"

namespace sparrow {

bool LogitAdjustments::any() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || (repeat_penalty != 1.0f && repeat_last_n != 0) ||
           !logit_bias.empty() || ignore_eos || (dry_multiplier > 0.0f && dry_penalty_last_n != 0);
}

std::vector<std::string> default_dry_breakers() { return {"\n", ":", "\"", "*"}; }

std::vector<int32_t> dry_breaker_tokens(const Tokenizer &tok, std::span<const std::string> breakers) {
    std::vector<int32_t> ids;
    if (breakers.empty()) return ids;
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
        const std::string piece = tok.token_to_piece(id, /*render_special=*/true);
        for (const std::string &b : breakers) {
            if (!b.empty() && piece.find(b) != std::string::npos) {
                ids.push_back(id);
                break;
            }
        }
    }
    return ids;  // ascending already
}

void apply_dry_penalty(std::span<float> logits, std::span<const int32_t> window, const LogitAdjustments &a,
                       DryWorkspace &ws) {
    const auto n = static_cast<int64_t>(window.size());
    if (n < 2 || a.dry_multiplier <= 0.0f) return;
    const auto is_breaker = [&](int32_t id) {
        return std::binary_search(a.dry_breakers.begin(), a.dry_breakers.end(), id);
    };
    // The longest repetition may reach back only to the latest breaker (exclusive).
    int64_t limit = 0;
    while (limit < n && !is_breaker(window[static_cast<size_t>(n - 1 - limit)])) ++limit;
    if (limit < a.dry_allowed_length) return;
    // r = the window reversed; z[k] = the longest common prefix of r and r[k..]: the tokens ending at position
    // n - 1 - k that equal the window's last ones (Z-function, linear: [lo, hi) is the rightmost match found).
    const auto r = [&](int64_t i) { return window[static_cast<size_t>(n - 1 - i)]; };
    std::vector<int32_t> &z = ws.z;
    z.assign(static_cast<size_t>(n), 0);
    for (int64_t k = 1, lo = 0, hi = 0; k < n; ++k) {
        int64_t len = k < hi ? std::min<int64_t>(hi - k, z[static_cast<size_t>(k - lo)]) : 0;
        while (k + len < n && len < limit && r(len) == r(k + len)) ++len;
        z[static_cast<size_t>(k)] = static_cast<int32_t>(len);
        if (k + len > hi) lo = k, hi = k + len;
    }
    // The token after each earlier match (position n - k) with the match's length; each token is penalised once,
    // by its longest.
    std::vector<std::pair<int32_t, int32_t>> &best = ws.best;
    best.clear();
    for (int64_t k = 1; k < n; ++k) {
        const int64_t len = std::min<int64_t>(z[static_cast<size_t>(k)], limit);
        if (len < a.dry_allowed_length) continue;
        best.emplace_back(window[static_cast<size_t>(n - k)], static_cast<int32_t>(len));
    }
    std::sort(best.begin(), best.end(),
              [](auto x, auto y) { return x.first < y.first || (x.first == y.first && x.second > y.second); });
    for (size_t i = 0; i < best.size(); ++i) {
        if (i > 0 && best[i].first == best[i - 1].first) continue;  // a shorter match of the same token
        const int32_t id = best[i].first;
        if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
        // In double, capped: a long repetition's power overflows float.
        const double penalty =
            double(a.dry_multiplier) * std::pow(double(a.dry_base), double(best[i].second - a.dry_allowed_length));
        logits[static_cast<size_t>(id)] -= static_cast<float>(std::min(penalty, 1e30));
    }
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
    if (a_.dry_multiplier > 0.0f && a_.dry_penalty_last_n != 0) {
        const size_t n = a_.dry_penalty_last_n < 0
                             ? sequence_.size()
                             : std::min(sequence_.size(), static_cast<size_t>(a_.dry_penalty_last_n));
        apply_dry_penalty(adjusted_, std::span<const int32_t>(sequence_).last(n), a_, dry_);
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
