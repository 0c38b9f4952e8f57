// Quantised caches: MLA decode attention (one token, 16 heads over 2048 latent rows of 512 + 64, V = c_kv)
// with f16, q8_0 and q4_0 latent stores on 1 and 2 threads, and the row-to-f32 conversion alone (one thread).
//
//   ./build/bench/sparrow_cache_bench [google benchmark flags]
//
// Reported: rows/s (latent rows read per second) and the bytes of cache read per second.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "attention/attention.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace {

using namespace sparrow;

constexpr int64_t kRows = 2048, kCkv = 512, kRope = 64, kHeads = 16;

DType type_of(int64_t i) { return i == 0 ? DType::F16 : (i == 1 ? DType::Q8_0 : DType::Q4_0); }

RowStore make_store(DType t, int64_t n_cells = kRows) {
    RowStore store(t, n_cells, kCkv + kRope, RowRotation().segment(kCkv).segment(kRope));
    std::mt19937 rng(3);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    if (n_cells > kRows) {  // fast random rows (timing only)
        std::vector<int32_t> all(static_cast<size_t>(n_cells));
        for (int64_t i = 0; i < n_cells; ++i) all[i] = static_cast<int32_t>(i);
        store.fill_random(all, 3, 1.0f);
        return store;
    }
    std::vector<float> row(kCkv + kRope);
    for (int64_t c = 0; c < n_cells; ++c) {
        for (auto &v : row) v = gauss(rng);
        store.write(c, row.data());
    }
    return store;
}

// range(1) = 0: the store holds just the 2048 rows, read in order (they stay in L2/L3 between iterations);
// 1: 2048 rows selected at random from a store of 131072 (151 MB at f16, as a 16K context's 8 layers), the same
// rows every iteration (after the first they come from L3); 2: as 1, but each iteration reads the next of 16
// disjoint selections (75 MB in all, more than L3), so every row comes from DRAM, as in sparse decode, where
// a layer's rows were last read a whole token (the other layers' weights and caches) ago.
void BM_MlaDecodeAttention(benchmark::State &state) {
    const DType t = type_of(state.range(0));
    const int64_t mode = state.range(1);
    const bool scattered = mode != 0;
    const int64_t n_lists = mode == 2 ? 16 : 1;
    const int64_t n_cells = scattered ? 64 * kRows : kRows;
    const RowStore store = make_store(t, n_cells);
    std::vector<std::vector<int32_t>> lists(static_cast<size_t>(n_lists));
    std::vector<int32_t> all(static_cast<size_t>(n_cells));
    for (int64_t i = 0; i < n_cells; ++i) all[i] = static_cast<int32_t>(i);
    if (scattered) {
        std::mt19937 rng(5);
        std::shuffle(all.begin(), all.end(), rng);
    }
    for (int64_t l = 0; l < n_lists; ++l) {
        auto &cells = lists[static_cast<size_t>(l)];
        cells.assign(all.begin() + l * kRows, all.begin() + (l + 1) * kRows);
        std::sort(cells.begin(), cells.end());  // the indexer's selection comes sorted
    }
    std::vector<float> q(kHeads * (kCkv + kRope), 0.01f), out(kHeads * kCkv);
    ThreadPool pool(static_cast<int>(state.range(2)));
    const AttentionShape shape{
        .n_head = kHeads, .n_head_kv = 1, .head_dim_k = kCkv + kRope, .head_dim_v = kCkv, .scale = 0.05f};
    AttentionWorkspace workspace;  // kept between calls, as a context keeps it
    int64_t next = 0;
    for (auto _ : state) {
        const std::vector<std::span<const int32_t>> rows = {lists[static_cast<size_t>(next)]};
        next = (next + 1) % n_lists;
        attention(pool, shape, q.data(), 1, store, store, rows, out.data(), &workspace);
        benchmark::DoNotOptimize(out.data());
    }
    state.SetLabel(std::string(dtype_name(t)) + (mode == 2 ? " cold" : (scattered ? " scattered" : "")) + ", " +
                   std::to_string(state.range(2)) + " thread(s)");
    state.counters["rows/s"] = benchmark::Counter(double(kRows), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bytes/s"] =
        benchmark::Counter(double(kRows * store.row_bytes()), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MlaDecodeAttention)->ArgsProduct({{0, 1, 2}, {0, 1, 2}, {1, 2}});

void BM_ConvertRowToF32(benchmark::State &state) {
    const DType t = type_of(state.range(0));
    const RowStore store = make_store(t);
    std::vector<float> y(kCkv + kRope);
    for (auto _ : state) {
        for (int64_t c = 0; c < kRows; ++c) convert_row_to_f32(t, store.row(c), y.data(), kCkv + kRope);
        benchmark::DoNotOptimize(y.data());
    }
    state.SetLabel(std::string(dtype_name(t)));
    state.counters["rows/s"] = benchmark::Counter(double(kRows), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_ConvertRowToF32)->Arg(0)->Arg(1)->Arg(2);

}  // namespace

BENCHMARK_MAIN();
