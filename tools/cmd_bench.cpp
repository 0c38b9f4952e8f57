// `sparrow bench`: prompt processing (pp) and generation (tg) speed at given context depths, with sparse
// attention on and off in the same run (llama-bench's meaning of -p, -n and -d). Each test repeats -r
// times; the table shows the mean and standard deviation of tokens/s, the bytes a generated token reads
// (weights touched + cache rows) and the achieved GB/s against a memory-copy bandwidth measured in the
// same run. Deep contexts are filled with synthetic cache rows (timing only), as the output says.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "commands.h"
#include "common.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace sparrow::tools {

namespace {

struct BenchFlags {
    ModelFlags model;
    std::vector<int64_t> n_prompt = {512};
    std::vector<int64_t> n_gen = {128};
    std::vector<int64_t> depths = {0};
    std::vector<std::string> dsa = {"on"};
    std::vector<std::string> precisions = {"exact"};
    int reps = 3;
    std::string output = "md";
};

struct BenchResult {
    std::string test;  // "pp512" or "tg128"
    int64_t n_prompt = 0, n_gen = 0, depth = 0;
    bool dsa = true;
    std::string precision = "exact";
    double mean = 0, stddev = 0;  // tokens/s
    int64_t bytes_per_token = 0;  // generation tests only
};

// Copy bandwidth (bytes read + bytes written per second) with the pool's threads, best of several passes
// over buffers much larger than the last-level cache.
double measure_copy_bandwidth(ThreadPool &pool) {
    const size_t n = size_t(128) << 20;  // 4x the largest common last-level caches
    std::vector<uint8_t> src(n, 1), dst(n, 0);
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
        const Stopwatch clock;
        pool.parallel_for(static_cast<int64_t>(n >> 20), 1, [&](int64_t b, int64_t e) {
            std::memcpy(dst.data() + (b << 20), src.data() + (b << 20), static_cast<size_t>((e - b) << 20));
        });
        best = std::max(best, 2.0 * double(n) / clock.seconds());
    }
    return best;
}

std::vector<BatchToken> random_tokens(std::mt19937 &rng, int64_t n_vocab, int64_t n, int32_t pos0, bool all_logits) {
    std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(n_vocab - 1));
    std::vector<BatchToken> batch;
    for (int64_t i = 0; i < n; ++i)
        batch.push_back({dist(rng), pos0 + static_cast<int32_t>(i), 0, all_logits || i + 1 == n});
    return batch;
}

BenchResult run_test(const std::shared_ptr<const Model> &model, const BenchFlags &f, bool dsa,
                     const std::string &precision, int64_t depth, int64_t n_prompt, int64_t n_gen) {
    ContextParams cp = f.model.context_params();
    cp.dsa = dsa;
    cp.indexer_fast = precision == "fast";
    cp.n_ctx = depth + std::max(n_prompt, n_gen) + 8;
    cp.n_batch = std::max<int64_t>(n_prompt, 1);
    Context ctx(model, cp);
    if (depth > 0) ctx.fill_synthetic(0, depth, 1234);
    std::mt19937 rng(42);
    const int64_t n_vocab = ctx.n_vocab();
    std::vector<double> speeds;
    for (int rep = 0; rep < f.reps + 1; ++rep) {  // the first pass warms caches and page tables
        ctx.seq_rm(0, static_cast<int32_t>(depth), -1);
        const Stopwatch clock;
        if (n_prompt > 0) {
            ctx.decode(random_tokens(rng, n_vocab, n_prompt, static_cast<int32_t>(depth), false));
        } else {
            for (int64_t i = 0; i < n_gen; ++i) {
                ctx.decode(random_tokens(rng, n_vocab, 1, static_cast<int32_t>(depth + i), true));
            }
        }
        if (rep > 0) speeds.push_back(double(n_prompt > 0 ? n_prompt : n_gen) / clock.seconds());
    }
    BenchResult r;
    r.test = n_prompt > 0 ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen);
    r.n_prompt = n_prompt;
    r.n_gen = n_gen;
    r.depth = depth;
    r.dsa = dsa;
    r.precision = precision;
    for (double s : speeds) r.mean += s / speeds.size();
    for (double s : speeds) r.stddev += (s - r.mean) * (s - r.mean) / std::max<size_t>(1, speeds.size() - 1);
    r.stddev = std::sqrt(r.stddev);
    if (n_gen > 0) r.bytes_per_token = ctx.bytes_per_token(depth + n_gen / 2);
    if (f.model.dsa_stats && dsa) {  // totals over the warm-up pass and the repetitions
        std::fprintf(stderr, "dsa-stats of %s at depth %lld, %s indexer:\n", r.test.c_str(), (long long)depth,
                     precision.c_str());
        print_sparse_stats(ctx, true);
    }
    return r;
}

int bench(const BenchFlags &f) {
    auto model = load_model_verbose(f.model);
    const ModelInfo &info = model_info(*model);
    const int n_threads = f.model.n_threads > 0 ? f.model.n_threads : ThreadPool::hardware_threads();
    if (std::any_of(f.depths.begin(), f.depths.end(), [](int64_t d) { return d > 0; })) {
        std::fprintf(stderr, "note: contexts at depth > 0 are filled with synthetic cache rows (timing only)\n");
    }
    std::vector<BenchResult> results;
    for (const int64_t depth : f.depths) {
        for (const std::string &mode : f.dsa) {
            const bool dsa = mode == "on";
            if (!info.has_indexer && !dsa) continue;  // dense is the only mode of a model without an indexer
            // Indexer precision only matters where an indexer runs.
            const std::vector<std::string> precisions =
                info.has_indexer && dsa ? f.precisions : std::vector<std::string>{"exact"};
            for (const std::string &precision : precisions) {
                for (const int64_t p : f.n_prompt) {
                    if (p > 0) results.push_back(run_test(model, f, dsa, precision, depth, p, 0));
                }
                for (const int64_t n : f.n_gen) {
                    if (n > 0) results.push_back(run_test(model, f, dsa, precision, depth, 0, n));
                }
                std::fprintf(stderr, "done: depth %lld, dsa %s, indexer %s\n", (long long)depth, mode.c_str(),
                             precision.c_str());
            }
        }
    }
    // Peak memory before the bandwidth test (whose buffers would otherwise count).
    std::fprintf(stderr, "peak resident memory %.1f MiB (weights %.1f MiB, %.1f MiB of them repacked)\n",
                 peak_rss_bytes() / 1048576.0, info.n_weight_bytes / 1048576.0, info.n_repacked_bytes / 1048576.0);
    ThreadPool pool(n_threads);
    const double copy_bw = measure_copy_bandwidth(pool);
    std::fprintf(stderr, "threads %d; memory copy bandwidth %.1f GB/s (read + write)\n", n_threads, copy_bw / 1e9);
    if (f.output == "json") {
        std::printf("[\n");
        for (size_t i = 0; i < results.size(); ++i) {
            const BenchResult &r = results[i];
            const double gbs = r.mean * double(r.bytes_per_token) / 1e9;
            std::printf(
                "  {\"model\": \"%s\", \"test\": \"%s\", \"n_prompt\": %lld, \"n_gen\": %lld, \"depth\": %lld, "
                "\"dsa\": %s, \"indexer_precision\": \"%s\", \"threads\": %d, \"tokens_per_s\": %.3f, "
                "\"tokens_per_s_stddev\": %.3f, "
                "\"bytes_per_token\": %lld, \"gb_per_s\": %.3f, \"copy_gb_per_s\": %.3f, \"synthetic_fill\": %s}%s\n",
                f.model.model_path.c_str(), r.test.c_str(), (long long)r.n_prompt, (long long)r.n_gen,
                (long long)r.depth, r.dsa ? "true" : "false", r.precision.c_str(), n_threads, r.mean, r.stddev,
                (long long)r.bytes_per_token, gbs, copy_bw / 1e9, r.depth > 0 ? "true" : "false",
                i + 1 < results.size() ? "," : "");
        }
        std::printf("]\n");
        return 0;
    }
    std::printf("| model | test | depth | dsa | indexer | t/s | bytes/token | GB/s | %% of copy |\n");
    std::printf("|---|---|---:|---|---|---:|---:|---:|---:|\n");
    for (const BenchResult &r : results) {
        std::string bytes = "-", gbs = "-", frac = "-";
        if (r.bytes_per_token > 0) {
            const double bw = r.mean * double(r.bytes_per_token);
            bytes = strprintf("%.1f MB", r.bytes_per_token / 1e6);
            gbs = strprintf("%.2f", bw / 1e9);
            frac = strprintf("%.0f%%", 100.0 * bw / copy_bw);
        }
        std::printf("| %s | %s | %lld | %s | %s | %.2f ± %.2f | %s | %s | %s |\n",
                    info.name.empty() ? info.arch.c_str() : info.name.c_str(), r.test.c_str(), (long long)r.depth,
                    info.has_indexer ? (r.dsa ? "on" : "off") : "-",
                    info.has_indexer && r.dsa ? r.precision.c_str() : "-", r.mean, r.stddev, bytes.c_str(), gbs.c_str(),
                    frac.c_str());
    }
    return 0;
}

}  // namespace

Command register_bench(CLI::App &app) {
    auto *cmd = app.add_subcommand("bench", "Prompt and generation speed at context depths, sparse vs dense");
    auto f = std::make_shared<BenchFlags>();
    f->model.add_to(*cmd, 0, /*with_dsa_flag=*/false);
    cmd->add_option("-p,--n-prompt", f->n_prompt, "Prompt lengths (comma-separated)")->delimiter(',');
    cmd->add_option("-n,--n-gen", f->n_gen, "Generation lengths (comma-separated)")->delimiter(',');
    cmd->add_option("-d,--depth", f->depths, "Context depths (comma-separated)")->delimiter(',');
    cmd->add_option("--dsa", f->dsa, "Sparse attention modes to run: on, off or on,off")
        ->delimiter(',')
        ->check(CLI::IsMember({"on", "off"}));
    cmd->add_option("--indexer-precision", f->precisions, "Indexer precisions to run: exact, fast or exact,fast")
        ->delimiter(',')
        ->check(CLI::IsMember({"exact", "fast"}));
    cmd->add_option("-r,--repetitions", f->reps, "Repetitions per test")->check(CLI::Range(1, 1000));
    cmd->add_option("-o,--output", f->output, "Output format: md or json")->check(CLI::IsMember({"md", "json"}));
    return [f] {
        for (int64_t v : f->n_prompt)
            if (v < 0) throw_error("bench: negative prompt length");
        for (int64_t v : f->n_gen)
            if (v < 0) throw_error("bench: negative generation length");
        for (int64_t v : f->depths)
            if (v < 0) throw_error("bench: negative depth");
        return bench(*f);
    };
}

}  // namespace sparrow::tools
