// Matrix-vector product (one token of decode) for each weight type, against the memory bandwidth of the same
// machine measured in the same run. Every buffer is at least 4x the last-level cache, so the figures are
// DRAM bandwidth, not cache bandwidth.
//
//   ./build/bench/sparrow_bench [--threads=N] [google benchmark flags, e.g. --benchmark_repetitions=5]
//
// Reported bytes: matvec = weight bytes read; copy = bytes read + bytes written (STREAM's convention);
// read = bytes read. A summary at the end gives each matvec's GB/s as a fraction of copy and of read.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace {

using namespace sparrow;

// Size of the last-level cache from sysfs ("32768K"), or 32 MiB when it cannot be read.
int64_t llc_bytes() {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
    std::string s;
    if (!(f >> s) || s.empty()) return int64_t(32) << 20;
    int64_t value = std::atoll(s.c_str());
    switch (s.back()) {
        case 'K': value <<= 10; break;
        case 'M': value <<= 20; break;
        case 'G': value <<= 30; break;
        default: break;
    }
    return value > 0 ? value : int64_t(32) << 20;
}

// Bytes every benchmark buffer has at least: 4x the LLC.
int64_t working_set_bytes() { return 4 * llc_bytes(); }

// Fills `bytes` with n_rows rows of type t: only the first 64 are really quantised, the rest repeat them (the
// contents do not change the speed, and this keeps set-up short). Returns the matrix over `bytes`.
WeightMatrix repeated_weights(DType t, int64_t n_cols, int64_t n_rows, std::mt19937 &rng, std::vector<uint8_t> &bytes) {
    const int64_t row_bytes = dtype_row_size(t, n_cols);
    bytes.resize(static_cast<size_t>(n_rows * row_bytes));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(n_cols));
    const int64_t n_distinct = std::min<int64_t>(n_rows, 64);
    for (int64_t r = 0; r < n_distinct; ++r) {
        for (auto &v : row) v = dist(rng);
        quantize_row(t, row.data(), bytes.data() + r * row_bytes, n_cols);
    }
    for (int64_t r = n_distinct; r < n_rows; ++r) {
        std::memcpy(bytes.data() + r * row_bytes, bytes.data() + (r % n_distinct) * row_bytes,
                    static_cast<size_t>(row_bytes));
    }
    return WeightMatrix{t, bytes.data(), n_rows, n_cols, row_bytes};
}

// w's rows packed eight to a record into `bytes` (as the loader packs Q8_0 / Q4_0 weights; n_rows % 8 == 0).
WeightMatrix packed_copy(const WeightMatrix &w, std::vector<uint8_t> &bytes) {
    bytes.resize(static_cast<size_t>(w.n_rows * w.row_bytes));
    pack_rows8(w.type, w.data, w.n_rows, w.n_cols, bytes.data());
    WeightMatrix p = w;
    p.data = bytes.data();
    p.rows8 = true;
    return p;
}

// The name of a matrix's weight layout: the type, "x8" added when packed.
std::string layout_name(const WeightMatrix &w) { return std::string(dtype_name(w.type)) + (w.rows8 ? "x8" : ""); }

// A weight matrix of type t with 4096 inputs and enough rows to span the working set.
struct MatvecData {
    std::vector<uint8_t> bytes;
    WeightMatrix w;
    std::vector<float> x, y;

    explicit MatvecData(DType t, bool packed = false) {
        const int64_t n_cols = 4096;
        const int64_t n_rows = (working_set_bytes() / dtype_row_size(t, n_cols) + 63) / 64 * 64;
        std::mt19937 rng(1);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        w = repeated_weights(t, n_cols, n_rows, rng, bytes);
        if (packed) {
            std::vector<uint8_t> rows = std::move(bytes);
            w = packed_copy(w, bytes);
        }
        x.resize(static_cast<size_t>(n_cols));
        for (auto &v : x) v = dist(rng);
        y.resize(static_cast<size_t>(n_rows));
    }
};

void bm_matvec(benchmark::State &state, MatvecData *data, int n_threads) {
    ThreadPool pool(n_threads);
    OpScratch scratch;
    for (auto _ : state) {
        matmul(pool, scratch, data->w, data->x.data(), 1, data->y.data());
        benchmark::DoNotOptimize(data->y.data());
        benchmark::ClobberMemory();
    }
    const int64_t weight_bytes = data->w.n_rows * data->w.row_bytes;
    state.SetBytesProcessed(state.iterations() * weight_bytes);
    state.counters["MiB"] = double(weight_bytes) / (1 << 20);
    state.SetLabel(std::string(cpu::active_isa_name()) + ", " + std::to_string(n_threads) + " threads");
}

// The same matvec on a 256 KiB matrix (L2-resident) on one thread, timed in CPU time: the compute cost of
// each kernel with memory and other processes out of the picture (a machine shared with other jobs slows
// the bandwidth figures above, not these). Reported as ns per 32 weights, per token.
struct CachedMatvec {
    std::vector<uint8_t> bytes;
    WeightMatrix w;
    std::vector<float> x, y;
    int64_t n_tokens;

    CachedMatvec(DType t, int64_t n_tok, bool packed = false) : n_tokens(n_tok) {
        const int64_t n_cols = 4096;
        const int64_t row_bytes = dtype_row_size(t, n_cols);
        const int64_t n_rows = std::max<int64_t>(8, (int64_t(256) << 10) / row_bytes / 8 * 8);
        bytes.resize(static_cast<size_t>(n_rows * row_bytes));
        std::mt19937 rng(2);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        std::vector<float> row(static_cast<size_t>(n_cols));
        for (int64_t r = 0; r < n_rows; ++r) {
            for (auto &v : row) v = dist(rng);
            quantize_row(t, row.data(), bytes.data() + r * row_bytes, n_cols);
        }
        w = WeightMatrix{t, bytes.data(), n_rows, n_cols, row_bytes};
        if (packed) {
            std::vector<uint8_t> rows = std::move(bytes);
            w = packed_copy(w, bytes);
        }
        x.resize(static_cast<size_t>(n_cols * n_tokens));
        for (auto &v : x) v = dist(rng);
        y.resize(static_cast<size_t>(n_rows * n_tokens));
    }
};

void bm_cached(benchmark::State &state, CachedMatvec *data) {
    ThreadPool pool(1);  // runs inline on this thread, so CPU time is the kernel's
    OpScratch scratch;
    for (auto _ : state) {
        matmul(pool, scratch, data->w, data->x.data(), data->n_tokens, data->y.data());
        benchmark::DoNotOptimize(data->y.data());
        benchmark::ClobberMemory();
    }
    const double blocks = double(data->w.n_rows) * double(data->w.n_cols) / 32.0 * double(data->n_tokens);
    // A rate inverted is CPU seconds per unit; counting units of 1e9 blocks makes it ns per block.
    state.counters["ns_per_32"] = benchmark::Counter(blocks * double(state.iterations()) * 1e-9,
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Quantising one activation row of n floats for the weight type's dot (KernelTable::quantize_dot_x): every matmul
// of a decode step does it once per token before its rows start, on the calling thread. The bench preset's widths:
// 128 (a head's no-rope query, W_UK's input), 768 (q-lora, an expert's down), 2048 (n_embd).
void bm_quantize_dot_x(benchmark::State &state, DType t, int64_t n) {
    std::mt19937 rng(4);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto &v : x) v = dist(rng);
    std::vector<uint8_t> y(static_cast<size_t>(cpu::KernelTable::dot_x_row_bytes(t, n)));
    const cpu::KernelTable &k = cpu::kernels();
    for (auto _ : state) {
        k.quantize_dot_x(t, x.data(), y.data(), n);
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    state.counters["ns_per_block"] = benchmark::Counter(double(n / 32) * double(state.iterations()) * 1e-9,
                                                        benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Matmul of T = 1, 2, 4, 8 tokens against one matrix: the cost of small batches (parallel generation runs 8
// sequences per step) relative to one token. One thread, CPU time, as the compute figures above: on a machine
// shared with other jobs the wall time of 2 threads scattered these ratios by 2x between runs. Shapes: n_cols x n_rows
// = 2048 x (4x LLC) (a DRAM-sized projection of the bench preset, n_embd 2048), and the bench preset's expert matrices,
// 2048 x 768 (gate/up) and 768 x 2048 (down), which stay in cache across calls as an expert's do while a step's tokens
// use it. The summary prints time(T) / time(1) from the same run.
struct TokensMatmul {
    std::vector<uint8_t> bytes;
    WeightMatrix w;
    std::vector<float> x, y;
    static constexpr int64_t kMaxTokens = 40;  // 40: eight prefill tiles of five

    TokensMatmul(DType t, int64_t n_cols, int64_t n_rows, bool packed = false) {
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        w = repeated_weights(t, n_cols, n_rows, rng, bytes);
        if (packed) {
            std::vector<uint8_t> rows = std::move(bytes);
            w = packed_copy(w, bytes);
        }
        x.resize(static_cast<size_t>(n_cols * kMaxTokens));
        for (auto &v : x) v = dist(rng);
        y.resize(static_cast<size_t>(n_rows * kMaxTokens));
    }
};

void bm_tokens(benchmark::State &state, TokensMatmul *data, int64_t n_tokens) {
    ThreadPool pool(1);  // runs inline on this thread, so CPU time is the matmul's
    OpScratch scratch;
    for (auto _ : state) {
        matmul(pool, scratch, data->w, data->x.data(), n_tokens, data->y.data());
        benchmark::DoNotOptimize(data->y.data());
        benchmark::ClobberMemory();
    }
    state.SetLabel(cpu::active_isa_name());
}

// Buffers for copy and read, shared by both benchmarks (filled, so every page is mapped before timing).
struct Buffers {
    std::vector<uint8_t> src, dst;
    Buffers() : src(static_cast<size_t>(working_set_bytes()), 1), dst(static_cast<size_t>(working_set_bytes()), 2) {}
};

// memcpy of the working set, each thread copying its own slice.
void bm_copy(benchmark::State &state, Buffers *buffers, int n_threads) {
    Buffers &b = *buffers;
    ThreadPool pool(n_threads);
    const int64_t n = static_cast<int64_t>(b.src.size());
    const int64_t slice = (n / n_threads + 4095) / 4096 * 4096;
    for (auto _ : state) {
        pool.parallel_for(n, slice, [&b](int64_t begin, int64_t end) {
            std::memcpy(b.dst.data() + begin, b.src.data() + begin, static_cast<size_t>(end - begin));
        });
        benchmark::ClobberMemory();
    }
    state.SetBytesProcessed(state.iterations() * 2 * n);
    state.counters["MiB"] = double(n) / (1 << 20);
    state.SetLabel(std::to_string(n_threads) + " threads, read + write bytes");
}

// A plain sum over the working set: the read bandwidth a matvec could reach at best.
void bm_read(benchmark::State &state, Buffers *buffers, int n_threads) {
    Buffers &b = *buffers;
    ThreadPool pool(n_threads);
    const int64_t n_words = static_cast<int64_t>(b.src.size() / 8);
    const int64_t slice = (n_words / n_threads + 511) / 512 * 512;
    std::atomic<uint64_t> total{0};
    for (auto _ : state) {
        pool.parallel_for(n_words, slice, [&](int64_t begin, int64_t end) {
            const uint8_t *p = b.src.data() + begin * 8;
            uint64_t lanes[8] = {};
            int64_t i = 0;
            for (; i + 8 <= end - begin; i += 8) {
                for (int l = 0; l < 8; ++l) {
                    uint64_t v;
                    std::memcpy(&v, p + (i + l) * 8, 8);
                    lanes[l] += v;
                }
            }
            uint64_t s = 0;
            for (uint64_t v : lanes) s += v;
            total.fetch_add(s, std::memory_order_relaxed);
        });
        benchmark::DoNotOptimize(total.load());
    }
    state.SetBytesProcessed(state.iterations() * n_words * 8);
    state.SetLabel(std::to_string(n_threads) + " threads");
}

// Prints the usual console output, then a summary: each matvec's GB/s (median of its runs) as a fraction
// of the copy and read bandwidth from the same run.
class RatioReporter : public benchmark::ConsoleReporter {
  public:
    void ReportRuns(const std::vector<Run> &runs) override {
        for (const Run &run : runs) {
            if (run.error_occurred) continue;
            const std::string &fn = run.run_name.function_name;
            if (fn.rfind("tokens/", 0) == 0) {
                // "tokens/<type>/<cols>x<rows>/T:<n>": CPU time per call, by matrix and token count.
                const size_t at = fn.rfind("/T:");
                if (run.run_type == Run::RT_Iteration && at != std::string::npos) {
                    tokens_[fn.substr(0, at)][std::atoi(fn.c_str() + at + 3)].push_back(run.GetAdjustedCPUTime());
                }
                continue;
            }
            if (const auto c = run.counters.find("ns_per_32"); c != run.counters.end()) {
                if (run.run_type == Run::RT_Iteration) cached_[run.run_name.function_name].push_back(c->second.value);
                continue;
            }
            const auto it = run.counters.find("bytes_per_second");
            if (it == run.counters.end()) continue;
            // Each repetition, or only the median when --benchmark_report_aggregates_only hides them.
            if (run.run_type == Run::RT_Iteration) {
                rates_[run.run_name.function_name].push_back(it->second.value);
            } else if (run.aggregate_name == "median") {
                medians_[run.run_name.function_name] = it->second.value;
            }
        }
        ConsoleReporter::ReportRuns(runs);
    }

    void Finalize() override {
        ConsoleReporter::Finalize();
        const double copy = median("copy"), read = median("read");
        if (copy > 0.0) {
            std::printf("\nsummary (GB/s = 1e9 B/s; medians; ISA %s)\n", cpu::active_isa_name());
            std::printf("  %-14s %8.2f GB/s  (read + write)\n", "copy", copy / 1e9);
            if (read > 0.0) std::printf("  %-14s %8.2f GB/s\n", "read", read / 1e9);
            std::vector<std::string> names;
            for (const auto &[name, rates] : rates_) names.push_back(name);
            for (const auto &[name, rate] : medians_) names.push_back(name);
            std::sort(names.begin(), names.end());
            names.erase(std::unique(names.begin(), names.end()), names.end());
            for (const std::string &name : names) {
                if (name.rfind("matvec/", 0) != 0) continue;
                const double r = median(name);
                std::printf("  %-14s %8.2f GB/s  %5.0f%% of copy  %5.0f%% of read\n", name.c_str(), r / 1e9,
                            100.0 * r / copy, read > 0.0 ? 100.0 * r / read : 0.0);
            }
        }
        if (!cached_.empty()) std::printf("\ncompute (L2-resident matrix, 1 thread, CPU time; medians)\n");
        for (const auto &[name, values] : cached_) {
            std::vector<double> v = values;
            std::sort(v.begin(), v.end());
            std::printf("  %-24s %6.3f ns per 32 weights per token\n", name.c_str(), v[v.size() / 2]);
        }
        if (!tokens_.empty())
            std::printf("\nsmall batches (1 thread, CPU time): time(T) / time(1), medians, same run\n");
        for (const auto &[name, by_t] : tokens_) {
            const auto one = by_t.find(1);
            if (one == by_t.end()) continue;
            const double t1 = median_of(one->second);
            std::printf("  %-28s", name.c_str());
            for (const auto &[n_tok, times] : by_t) std::printf("  T=%d %5.2fx", n_tok, median_of(times) / t1);
            std::printf("\n");
        }
    }

  private:
    static double median_of(std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v[v.size() / 2];
    }

    double median(const std::string &name) const {
        if (const auto m = medians_.find(name); m != medians_.end()) return m->second;
        const auto it = rates_.find(name);
        if (it == rates_.end() || it->second.empty()) return 0.0;
        std::vector<double> v = it->second;
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    }

    std::map<std::string, std::vector<double>> rates_;   // bytes/s of each repetition, by benchmark
    std::map<std::string, double> medians_;              // bytes/s of the median aggregate, when reported
    std::map<std::string, std::vector<double>> cached_;  // ns per 32 weights of each repetition (cached/*)
    // CPU time per call of each repetition (tokens/*), by matrix name and token count.
    std::map<std::string, std::map<int, std::vector<double>>> tokens_;
};

}  // namespace

int main(int argc, char **argv) {
    benchmark::Initialize(&argc, argv);
    int n_threads = 2;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], "--threads=", 10) == 0) {
            n_threads = std::max(1, std::atoi(argv[i] + 10));
        } else {
            std::fprintf(stderr, "unknown argument %s (expected --threads=N or --benchmark_* flags)\n", argv[i]);
            return 2;
        }
    }
    std::printf("working set per buffer: %lld MiB (4x LLC of %lld MiB), %d threads, ISA %s\n",
                (long long)(working_set_bytes() >> 20), (long long)(llc_bytes() >> 20), n_threads,
                cpu::active_isa_name());

    // Every buffer is made (and its pages touched) before any timing starts.
    Buffers buffers;
    std::vector<std::unique_ptr<MatvecData>> matrices;
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::MXFP4}) {
        matrices.push_back(std::make_unique<MatvecData>(t));
    }
    // The loader's layout of Q8_0 / Q4_0 / MXFP4 weights (packed eight rows to a record; names end in x8).
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4}) matrices.push_back(std::make_unique<MatvecData>(t, true));

    benchmark::RegisterBenchmark("copy", bm_copy, &buffers, n_threads)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("read", bm_read, &buffers, n_threads)->UseRealTime()->Unit(benchmark::kMillisecond);
    for (const auto &m : matrices) {
        const std::string name = "matvec/" + layout_name(m->w);
        benchmark::RegisterBenchmark(name.c_str(), bm_matvec, m.get(), n_threads)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
    }
    std::vector<std::unique_ptr<CachedMatvec>> cached;
    for (const auto &[t, packed] : {std::pair{DType::F32, false},
                                    {DType::F16, false},
                                    {DType::BF16, false},
                                    {DType::Q8_0, false},
                                    {DType::Q4_0, false},
                                    {DType::MXFP4, false},
                                    {DType::Q8_0, true},
                                    {DType::Q4_0, true},
                                    {DType::MXFP4, true}}) {
        for (int64_t n_tok : {1, 16}) {
            cached.push_back(std::make_unique<CachedMatvec>(t, n_tok, packed));
            const std::string name = "cached/" + layout_name(cached.back()->w) + "/tokens:" + std::to_string(n_tok);
            benchmark::RegisterBenchmark(name.c_str(), bm_cached, cached.back().get())->Unit(benchmark::kMicrosecond);
        }
    }
    for (DType t : {DType::Q8_0, DType::Q4_0}) {
        for (int64_t n : {128, 768, 2048}) {
            const std::string name = "quantize/" + std::string(dtype_name(t)) + "/" + std::to_string(n);
            benchmark::RegisterBenchmark(name.c_str(), bm_quantize_dot_x, t, n)->Unit(benchmark::kNanosecond);
        }
    }
    std::vector<std::unique_ptr<TokensMatmul>> token_mats;
    for (const auto &[t, packed] : {std::pair{DType::Q8_0, false},
                                    {DType::Q4_0, false},
                                    {DType::MXFP4, false},
                                    {DType::Q8_0, true},
                                    {DType::Q4_0, true},
                                    {DType::MXFP4, true}}) {
        const int64_t dram_rows = (working_set_bytes() / dtype_row_size(t, 2048) + 63) / 64 * 64;
        for (const auto &[n_cols, n_rows] : {std::pair<int64_t, int64_t>{2048, dram_rows}, {2048, 768}, {768, 2048}}) {
            token_mats.push_back(std::make_unique<TokensMatmul>(t, n_cols, n_rows, packed));
            for (int64_t n_tok : {1, 2, 4, 8, 40}) {
                const std::string name = "tokens/" + layout_name(token_mats.back()->w) + "/" + std::to_string(n_cols) +
                                         "x" + std::to_string(n_rows) + "/T:" + std::to_string(n_tok);
                benchmark::RegisterBenchmark(name.c_str(), bm_tokens, token_mats.back().get(), n_tok)
                    ->Unit(benchmark::kMicrosecond);
            }
        }
    }
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}
