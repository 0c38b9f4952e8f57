// Token sampling: greedy at temperature 0, else top-k, then top-p (nucleus, on the untempered
// distribution), then temperature, then a draw from a seeded generator (llama.cpp's default order).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace sparrow {

struct SamplerParams {
    float temp = 0.8f;    // <= 0: greedy (argmax, ties to the lowest id)
    int top_k = 40;       // <= 0: no top-k cut
    float top_p = 0.95f;  // >= 1: no nucleus cut
    uint64_t seed = 0;
};

class Sampler {
  public:
    explicit Sampler(const SamplerParams &params);
    int32_t sample(std::span<const float> logits);

    struct Candidate {
        float logit;  // NaN as -inf
        int32_t id;
        double mass;  // exp(logit - max logit): the unnormalised probability at temperature 1, where computed
    };

  private:
    // candidates_ = the n best by rank (larger logit, then lower id), in rank order.
    void best_n(std::span<const float> logits, size_t n);
    // The nucleus of the whole vocabulary (no top-k): candidates_[0, returned) are the smallest set of best-ranked
    // tokens whose probability at temperature 1 reaches top_p, in no particular order. max: the largest logit.
    size_t nucleus(std::span<const float> logits, float max);
    // An index of weights_ drawn with probability weights_[i] / total.
    size_t draw(double total);

    SamplerParams params_;
    std::mt19937_64 rng_;
    std::vector<Candidate> candidates_;  // reused between calls
    std::vector<double> weights_;        // of the candidates (or of the vocabulary), reused
};

int32_t argmax(std::span<const float> logits);

// The nucleus search of Sampler (exposed for its test): moves the smallest set of best-ranked candidates (larger
// logit, then lower id) whose masses sum to at least `need` to c[0, returned), in no particular order; c.size() when
// all of them fall short (rounding).
size_t take_nucleus(std::span<Sampler::Candidate> c, double need);

}  // namespace sparrow
