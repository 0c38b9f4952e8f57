// Token sampling: greedy at temperature 0, else top-k, then typical-p, then top-p (nucleus, on the untempered
// distribution), then min-p, then XTC, then temperature, then a draw from a seeded generator (llama.cpp's default
// order). The cuts after top-k each see the tokens the previous ones kept, renormalised.
#pragma once

#include <bit>
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
    // > 0: keep only tokens whose probability at temperature 1 is at least min_p times the most likely one's
    // (llama.cpp's min-p: a logit at least max + ln(min_p)); 0: no cut
    float min_p = 0.0f;
    // < 1: locally typical sampling (llama.cpp's typical_p): the tokens whose surprisal -ln p is closest to the
    // distribution's entropy, fewest first, until their probability reaches typical_p; 1: no cut
    float typical_p = 1.0f;
    // XTC, "exclude top choices" (llama.cpp's): with probability xtc_probability, every token at least xtc_threshold
    // likely but the least likely of them is removed (when at least two are; a threshold above 0.5 never applies)
    float xtc_probability = 0.0f;
    float xtc_threshold = 0.1f;
    // > 0: top-n-sigma (llama.cpp's), the first cut: keep the tokens whose logit is at least the maximum minus
    // top_n_sigma standard deviations of the finite logits (over the whole vocabulary); <= 0: no cut
    float top_n_sigma = -1.0f;
    // > 0: dynamic temperature (llama.cpp's dynatemp): the temperature runs from max(0, temp - dynatemp_range) to
    // temp + dynatemp_range with the kept tokens' entropy at temperature 1 over its maximum (the log of their count)
    // raised to dynatemp_exponent; 0: the fixed temperature
    float dynatemp_range = 0.0f;
    float dynatemp_exponent = 1.0f;
    // 1 or 2: Mirostat (llama.cpp's), which replaces every cut above: tokens are drawn at the temperature from a set
    // sized so that the surprise -log2 p of the drawn tokens tracks mirostat_tau, with mu (starting at 2 tau) moved
    // by mirostat_eta times each draw's error. Version 2 keeps the tokens whose surprise is at most mu; version 1
    // the top k, k from mu and the Zipf exponent estimated on the 100 best tokens. 0: off
    int mirostat = 0;
    float mirostat_tau = 5.0f;
    float mirostat_eta = 0.1f;
};

class Sampler {
  public:
    explicit Sampler(const SamplerParams &params);
    int32_t sample(std::span<const float> logits);
    // Mirostat's mu now (2 mirostat_tau before the first draw).
    double mirostat_mu() const { return mu_; }

    struct Candidate {
        float logit;  // NaN as -inf
        int32_t id;
        double mass;  // exp(logit - max logit): the unnormalised probability at temperature 1, where computed
    };

  private:
    // The nucleus of the whole vocabulary (no top-k): candidates_[0, returned) are the smallest set of best-ranked
    // tokens whose probability at temperature 1 reaches top_p, in no particular order. max: the largest logit.
    size_t nucleus(std::span<const float> logits, float max);
    // An index of weights_ drawn with probability weights_[i] / total.
    size_t draw(double total);
    // The id of one of candidates_[first, n) drawn by its tempered weight exp((logit - reference) * inv_temp); the
    // reference is a logit at least as large as theirs, close enough that the weights do not all vanish.
    int32_t draw_candidate(size_t first, size_t n, float reference, float inv_temp);
    // The same draw, as an index of candidates_; leaves weights_[i - first] and their total (Mirostat reads the
    // drawn token's probability from them).
    size_t draw_index(size_t first, size_t n, float reference, float inv_temp, double &total);
    // With typical-p, XTC, top-n-sigma or a dynamic temperature on: the cuts one after another, each on what the
    // previous ones kept (top-k's tokens, else the whole vocabulary), and the draw. max: the largest logit.
    int32_t sample_staged(std::span<const float> logits, float max);
    // Mirostat (params_.mirostat 1 or 2): the draw and mu's update.
    int32_t sample_mirostat(std::span<const float> logits, float max, float inv_temp);

    SamplerParams params_;
    std::mt19937_64 rng_;
    std::vector<Candidate> candidates_;  // reused between calls
    std::vector<float> weights_;         // of the candidates (or of the vocabulary), reused
    std::vector<uint16_t> buckets_;      // nucleus: each token's bucket of logit below the maximum
    double mu_ = 0.0;                    // Mirostat's surprise bound, carried from one draw to the next
};

int32_t argmax(std::span<const float> logits);

// out = the min(n, size) best logits by rank (larger logit, then lower id; NaN as -inf), in rank order (mass 0).
void best_logits(std::span<const float> logits, size_t n, std::vector<Sampler::Candidate> &out);

// The smallest logit min-p keeps when the largest is max: max + ln(min_p), in float (min_p in (0, 1]).
float min_p_floor(float max, float min_p);

// The largest logit, NaN ignored (-inf when there is nothing else).
float max_logit(std::span<const float> logits);
// The sum of exp(logit - max) over the logits (NaN and -inf count 0), max = max_logit(logits): log-softmax's
// normaliser, in vector loops.
double sum_exp(std::span<const float> logits, float max);

// exp(x) for x <= 0 (a logit minus the largest one; not NaN), within 1.1e-7 of it relatively, 0 below -87.34
// (where float leaves its normal range) and at -inf. Branch-free, so loops over a vocabulary vectorise (given
// -fno-trapping-math, as sampler.cpp is compiled): exp in double is a call per element, ~4.5 ns each, which was the
// whole cost of weighing a vocabulary.
inline float exp_nonpositive(float x) {
    constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.42860682030941723e-6f;
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and taking it away rounds to an integer
    constexpr float kMin = -87.33654f;     // -126 ln 2: below it 2^n would leave float's normal range
    const float xc = x < kMin ? kMin : x;
    const float nf = (xc * kLog2e + kRound) - kRound;  // round(x / ln 2), in [-126, 0]
    const float r = (xc - nf * kLn2Hi) - nf * kLn2Lo;  // |r| <= ln 2 / 2
    // exp(r) by its Taylor series to r^7 (relative error < 2e-8 at |r| = ln 2 / 2), Horner's form.
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const auto scale = std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(nf) + 127) << 23);  // 2^n
    return x < kMin ? 0.0f : p * scale;
}

// The nucleus search of Sampler (exposed for its test): moves the smallest set of best-ranked candidates (larger
// logit, then lower id) whose masses sum to at least `need` to c[0, returned), in no particular order; c.size() when
// all of them fall short (rounding).
size_t take_nucleus(std::span<Sampler::Candidate> c, double need);

}  // namespace sparrow
