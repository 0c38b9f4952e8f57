#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sparrow {

int32_t argmax(std::span<const float> logits) {
    SPARROW_ASSERT(!logits.empty());
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
        if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
    }
    return best;
}

Sampler::Sampler(const SamplerParams &params) : params_(params), rng_(params.seed) {}

int32_t Sampler::sample(std::span<const float> logits) {
    if (params_.temp <= 0.0f) return argmax(logits);
    candidates_.clear();
    for (size_t i = 0; i < logits.size(); ++i) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
    const auto by_logit = [](const auto &a, const auto &b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t n = candidates_.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
        n = static_cast<size_t>(params_.top_k);
        std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<ptrdiff_t>(n), candidates_.end(),
                          by_logit);
    } else {
        std::sort(candidates_.begin(), candidates_.end(), by_logit);
    }
    // Nucleus: the smallest prefix whose probability (at temperature 1) reaches top_p.
    if (params_.top_p < 1.0f) {
        const float max_logit = candidates_[0].first;
        double total = 0.0;
        for (size_t i = 0; i < n; ++i) total += std::exp(double(candidates_[i].first - max_logit));
        double cum = 0.0;
        for (size_t i = 0; i < n; ++i) {
            cum += std::exp(double(candidates_[i].first - max_logit)) / total;
            if (cum >= params_.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    const float max_logit = candidates_[0].first;
    std::vector<double> weights(n);
    for (size_t i = 0; i < n; ++i) weights[i] = std::exp(double(candidates_[i].first - max_logit) / params_.temp);
    std::discrete_distribution<size_t> dist(weights.begin(), weights.end());
    return candidates_[dist(rng_)].second;
}

}  // namespace sparrow
