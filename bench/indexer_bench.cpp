// Lightning-indexer selection speed: decode (1 query) and prefill (512 queries, the last 512 positions of
// the context, causal) against 4K and 16K keys in an f16 or a Q8_0 store; H 32, D 128, top_k 2048; exact and
// fast mode (fast over Q8_0 reads the stored int8 blocks in place).
//
//   ./build/bench/sparrow_indexer_bench [--threads=N] [google benchmark flags]
//
// Reported: keys/s = (query, key) pairs scored per second; GFLOP/s counts 2 * H * D flops per pair (the
// dot products; relu, weights and the top-k are not counted).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "attention/lightning_indexer.h"
#include "attention/top_k_select.h"
#include "core/thread_pool.h"

namespace {

using namespace sparrow;

constexpr int64_t kHeads = 32, kDim = 128, kTopK = 2048;

int g_threads = 1;  // set once from --threads before the benchmarks run

struct Data {
    RowStore keys;
    std::vector<int32_t> cells;  // the sequence's cells in position order
    std::vector<std::span<const int32_t>> cand;
    std::vector<float> q, w;
    int64_t n_tokens = 0, pairs = 0;

    bool int8_copy = false;

    Data(int64_t context, int64_t n_tokens_, DType key_type, bool int8_copy_)
        : keys(key_type, context, kDim), n_tokens(n_tokens_), int8_copy(int8_copy_) {
        // The context's key store in fast mode over float keys (deepseek32.cpp): an int8 copy kept with it.
        if (int8_copy) keys.keep_int8_copy(indexer_key_quantizer(), indexer_int8_width(kDim));
        std::mt19937 rng(7);
        std::normal_distribution<float> gauss(0.0f, 1.0f);
        std::vector<float> row(kDim);
        for (int64_t c = 0; c < context; ++c) {
            for (auto &x : row) x = gauss(rng);
            keys.write(c, row.data());
        }
        cells.resize(static_cast<size_t>(context));
        for (int64_t c = 0; c < context; ++c) cells[static_cast<size_t>(c)] = static_cast<int32_t>(c);
        for (int64_t t = 0; t < n_tokens; ++t) {
            const int64_t len = context - (n_tokens - 1 - t);  // causal: query t sees positions <= its own
            cand.emplace_back(cells.data(), static_cast<size_t>(len));
            pairs += len;
        }
        q.resize(static_cast<size_t>(n_tokens * kHeads * kDim));
        w.resize(static_cast<size_t>(n_tokens * kHeads));
        for (auto &x : q) x = gauss(rng);
        for (auto &x : w) x = std::fabs(gauss(rng)) / std::sqrt(float(kHeads));
    }
};

// fresh_buffers: no IndexerWorkspace, so every call allocates its buffers (what a caller without one pays).
void BM_indexer(benchmark::State &state, IndexerPrecision precision, int64_t context, int64_t n_tokens, DType key_type,
                bool int8_copy, bool fresh_buffers) {
    static std::unique_ptr<Data> cached;  // the largest set-up is reused between benchmarks of the same shape
    if (!cached || cached->keys.type() != key_type || static_cast<int64_t>(cached->cells.size()) != context ||
        cached->n_tokens != n_tokens || cached->int8_copy != int8_copy) {
        cached = std::make_unique<Data>(context, n_tokens, key_type, int8_copy);
    }
    Data &d = *cached;
    ThreadPool pool(g_threads);
    std::vector<std::vector<int32_t>> selected;
    IndexerWorkspace workspace;  // kept between calls, as a context keeps it
    for (auto _ : state) {
        lightning_indexer_select(pool, {kHeads, kDim}, precision, d.q.data(), d.w.data(), d.n_tokens, d.keys, d.cand,
                                 kTopK, selected, fresh_buffers ? nullptr : &workspace);
        benchmark::DoNotOptimize(selected.data());
    }
    const double pairs = double(d.pairs) * double(state.iterations());
    state.counters["keys/s"] = benchmark::Counter(pairs, benchmark::Counter::kIsRate);
    state.counters["GFLOP/s"] = benchmark::Counter(pairs * 2.0 * kHeads * kDim * 1e-9, benchmark::Counter::kIsRate);
    state.counters["threads"] = g_threads;
}

// The per-query top-k of one decode call's merge: the best k of n gaussian scores (n = 16384 is four splits
// of a 16K context; k = 2048 exact mode, 2320 fast mode's top-k plus margin), on one thread.
void BM_select_best(benchmark::State &state) {
    const int64_t n = state.range(0), k = state.range(1);
    std::mt19937 rng(3);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<indexer::ScoredIndex> input(static_cast<size_t>(n)), e;
    for (int64_t i = 0; i < n; ++i) input[static_cast<size_t>(i)] = {gauss(rng), static_cast<int32_t>(i)};
    std::vector<uint64_t> scratch;
    for (auto _ : state) {
        state.PauseTiming();
        e = input;
        state.ResumeTiming();
        indexer::select_best(e.data(), n, k, scratch);
        benchmark::DoNotOptimize(e.data());
    }
    state.counters["entries/s"] = benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
    benchmark::RegisterBenchmark("select_best", BM_select_best)
        ->Args({16384, 2048})
        ->Args({16384, 2320})
        ->Args({8192, 2048})
        ->Unit(benchmark::kMicrosecond);
    for (int64_t n_tokens : {int64_t(1), int64_t(512)}) {
        for (int64_t context : {int64_t(4096), int64_t(16384)}) {
            // f16 keys, f16 keys with the int8 copy fast mode keeps (fast only: exact reads the f16 rows), q8_0 keys
            for (auto [key_type, int8_copy] :
                 {std::pair{DType::F16, false}, std::pair{DType::F16, true}, std::pair{DType::Q8_0, false}}) {
                for (auto [precision, name] :
                     {std::pair{IndexerPrecision::exact, "exact"}, std::pair{IndexerPrecision::fast, "fast"}}) {
                    if (int8_copy && precision == IndexerPrecision::exact) continue;
                    const std::string label = std::string(n_tokens == 1 ? "decode" : "prefill512") + "/ctx" +
                                              std::to_string(context) + "/" + name + "/" +
                                              std::string(dtype_name(key_type)) + (int8_copy ? "+int8" : "");
                    benchmark::RegisterBenchmark(label.c_str(), BM_indexer, precision, context, n_tokens, key_type,
                                                 int8_copy, false)
                        ->Unit(benchmark::kMillisecond)
                        ->UseRealTime()
                        ->MinTime(n_tokens == 1 ? 0.5 : 0.1);
                }
            }
        }
    }
    // A decode call that allocates its buffers each time (no workspace), against the 16K fast f16+int8 one above.
    benchmark::RegisterBenchmark("decode/ctx16384/fast/f16+int8/fresh_buffers", BM_indexer, IndexerPrecision::fast,
                                 int64_t(16384), int64_t(1), DType::F16, true, true)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(0.5);
}

}  // namespace

int main(int argc, char **argv) {
    // --threads=N is ours; everything else goes to Google Benchmark.
    std::vector<char *> args;
    for (int i = 0; i < argc; ++i) {
        if (std::strncmp(argv[i], "--threads=", 10) == 0) {
            g_threads = std::max(1, std::atoi(argv[i] + 10));
        } else {
            args.push_back(argv[i]);
        }
    }
    int n_args = static_cast<int>(args.size());
    benchmark::Initialize(&n_args, args.data());
    register_all();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
