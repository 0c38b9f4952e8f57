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

  private:
    SamplerParams params_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> candidates_;  // (logit, id), reused between calls
};

int32_t argmax(std::span<const float> logits);

}  // namespace sparrow
