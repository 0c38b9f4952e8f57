// Sampling one token from a vocabulary's logits: greedy, the full distribution (OpenAI's defaults, temperature 1 and
// top_p 1), a nucleus alone, and top-k with a nucleus (the CLI's defaults), at a 32K and a 129K vocabulary (the bench
// model's and DeepSeek's). The server samples once per generated token, on the scheduler thread between steps.
//
//   ./build/bench/sparrow_sampler_bench [google benchmark flags]
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "runtime/sampler.h"
#include "server/scheduler.h"

namespace {

using namespace sparrow;

// range(0): vocabulary size; range(1): 0 greedy, 1 temperature 1 alone, 2 top-p 0.95, 3 top-k 40 + top-p 0.95,
// 4 typical-p 0.9 alone (its selection over the whole vocabulary), 5 top-k 40 + typical 0.9 + XTC 0.5 above 0.1,
// 6 top-n-sigma 1 alone (its mean and deviation over the whole vocabulary, then the tokens above the floor).
void BM_Sample(benchmark::State &state) {
    const auto n_vocab = static_cast<size_t>(state.range(0));
    std::mt19937 rng(1);
    std::normal_distribution<float> gauss(0.0f, 3.0f);  // a spread of logits like a trained model's
    std::vector<float> logits(n_vocab);
    for (float &v : logits) v = gauss(rng);
    SamplerParams p;
    switch (state.range(1)) {
        case 0: p = {0.0f, 0, 1.0f, 1}; break;
        case 1: p = {1.0f, 0, 1.0f, 1}; break;
        case 2: p = {0.8f, 0, 0.95f, 1}; break;
        case 3: p = {0.8f, 40, 0.95f, 1}; break;
        case 4: p = {1.0f, 0, 1.0f, 1, 0.0f, 0.9f}; break;
        case 5: p = {0.8f, 40, 0.95f, 1, 0.05f, 0.9f, 0.5f, 0.1f}; break;
        default: p = {1.0f, 0, 1.0f, 1, 0.0f, 1.0f, 0.0f, 0.1f, 1.0f}; break;
    }
    Sampler sampler(p);
    for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits));
    const char *names[] = {"greedy",      "temperature 1",          "top-p 0.95",   "top-k 40, top-p 0.95",
                           "typical 0.9", "top-k 40, typical, XTC", "top-n-sigma 1"};
    state.SetLabel(names[state.range(1)]);
}
BENCHMARK(BM_Sample)->ArgsProduct({{32000, 129280}, {0, 1, 2, 3, 4, 5, 6}})->Unit(benchmark::kMicrosecond);

// The log probability of a token and the 5 most likely ones (a request with logprobs: 5), per generated token.
void BM_TokenLogprob(benchmark::State &state) {
    const auto n_vocab = static_cast<size_t>(state.range(0));
    std::mt19937 rng(2);
    std::normal_distribution<float> gauss(0.0f, 3.0f);
    std::vector<float> logits(n_vocab);
    for (float &v : logits) v = gauss(rng);
    for (auto _ : state) benchmark::DoNotOptimize(server::token_logprob(logits, 7, 5));
}
BENCHMARK(BM_TokenLogprob)->Arg(32000)->Arg(129280)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
