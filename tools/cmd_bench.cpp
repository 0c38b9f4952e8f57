// `sparrow bench`: prompt processing (pp) and generation (tg) speed at given context depths, with sparse
// attention on and off in the same run (llama-bench's meaning of -p, -n and -d). Each test repeats -r
// times, the repetitions of its modes (sparse per indexer precision, dense) taking turns; the table shows the
// mean and standard deviation of tokens/s, the bytes a generated token reads (weights touched + cache rows),
// the achieved GB/s against a memory-copy bandwidth measured in the same run, and each sparse row's speed-up
// over the dense row of its test. Deep contexts are filled with synthetic cache rows (timing only), as the
// output says.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
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
    std::vector<std::string> precisions = {"auto"};
    int reps = 3;
    std::string output = "md";
};

struct BenchResult {
    std::string test;  // "pp512" or "tg128"
    int64_t n_prompt = 0, n_gen = 0, depth = 0;
    bool dsa = true;
    std::string precision = "exact";
    double mean = 0, stddev = 0;  // tokens/s
    std::vector<double> speeds;   // tokens/s of each repetition
    // At a depth > 0, when depth 0 is among the depths: the same test and mode at depth 0, one pass in each of
    // the same rounds (fraction_of_depth0)
    std::vector<double> depth0_speeds;
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

// One test (pp or tg at one depth) in one mode: its context, filled to the depth, and the speed of each pass.
struct ModeRun {
    bool dsa = true;
    std::string precision = "exact";
    std::unique_ptr<Context> ctx;
    std::mt19937 rng{42};
    std::vector<double> speeds;  // tokens/s of each repetition after the warm-up pass
};

// One pass of the test on a mode's context: the prompt in decode calls of at most -b tokens (one call by
// default), or n_gen single-token steps.
double run_pass(ModeRun &m, int64_t depth, int64_t n_prompt, int64_t n_gen) {
    Context &ctx = *m.ctx;
    ctx.seq_rm(0, static_cast<int32_t>(depth), -1);
    const int64_t n_vocab = ctx.n_vocab();
    const Stopwatch clock;
    if (n_prompt > 0) {
        const int64_t n_batch = ctx.params().n_batch;
        for (int64_t i = 0; i < n_prompt; i += n_batch) {
            const int64_t n = std::min(n_batch, n_prompt - i);
            ctx.decode(random_tokens(m.rng, n_vocab, n, static_cast<int32_t>(depth + i), false));
        }
    } else {
        for (int64_t i = 0; i < n_gen; ++i) {
            ctx.decode(random_tokens(m.rng, n_vocab, 1, static_cast<int32_t>(depth + i), true));
        }
    }
    return double(n_prompt > 0 ? n_prompt : n_gen) / clock.seconds();
}

// A mode's context for a test at `depth` (filled with synthetic rows there), warmed by one pass.
void start_mode(const std::shared_ptr<const Model> &model, const BenchFlags &f, ModeRun &m, int64_t depth,
                int64_t n_prompt, int64_t n_gen) {
    ContextParams cp = f.model.context_params();
    cp.dsa = m.dsa;
    cp.indexer_fast = m.precision == "fast";
    // The context the test needs, or -c when that is larger; the prompt's decode calls take -b tokens.
    const int64_t needed = depth + std::max(n_prompt, n_gen) + 8;
    if (f.model.n_ctx != 0 && f.model.n_ctx < needed) {
        throw_error("-c %lld is smaller than the %lld cells a test needs (depth %lld + %lld tokens + 8)",
                    (long long)f.model.n_ctx, (long long)needed, (long long)depth,
                    (long long)std::max(n_prompt, n_gen));
    }
    cp.n_ctx = std::max(needed, f.model.n_ctx);
    cp.n_batch = std::min(f.model.n_batch, std::max<int64_t>(n_prompt, 1));
    m.ctx = std::make_unique<Context>(model, cp);
    if (depth > 0) m.ctx->fill_synthetic(0, depth, 1234);
    run_pass(m, depth, n_prompt, n_gen);  // warms caches and page tables
}

// One test in every mode. The modes' contexts exist together, each warmed by one pass, and the repetitions go
// round the modes (rep 1 of each, then rep 2 ...): a ratio between two modes then compares passes made seconds
// apart, where running one mode's repetitions after the other's let a shared machine's drift (10-25% within
// minutes on the VMs these figures come from) into the ratio. With `depth0_rounds` (a test at a depth > 0 when
// depth 0 is measured too) each mode also has a context at depth 0 that takes a pass in every round, so that the
// share of depth 0's speed is a ratio of the same kind. most_cache_bytes: raised to the bytes the test's caches
// hold together, for the peak-memory line.
std::vector<BenchResult> run_test(const std::shared_ptr<const Model> &model, const BenchFlags &f,
                                  const std::vector<std::pair<bool, std::string>> &modes, int64_t depth,
                                  int64_t n_prompt, int64_t n_gen, bool depth0_rounds, int64_t &most_cache_bytes) {
    std::vector<ModeRun> runs(modes.size()), at_depth0(depth0_rounds ? modes.size() : 0);
    for (size_t i = 0; i < modes.size(); ++i) {
        runs[i].dsa = modes[i].first;
        runs[i].precision = modes[i].second;
        start_mode(model, f, runs[i], depth, n_prompt, n_gen);
        if (!depth0_rounds) continue;
        at_depth0[i].dsa = modes[i].first;
        at_depth0[i].precision = modes[i].second;
        start_mode(model, f, at_depth0[i], 0, n_prompt, n_gen);
    }
    int64_t cache_bytes = 0;
    for (const ModeRun &m : runs) cache_bytes += m.ctx->cache_bytes();
    for (const ModeRun &m : at_depth0) cache_bytes += m.ctx->cache_bytes();
    most_cache_bytes = std::max(most_cache_bytes, cache_bytes);
    for (int rep = 0; rep < f.reps; ++rep) {
        for (size_t i = 0; i < runs.size(); ++i) {
            runs[i].speeds.push_back(run_pass(runs[i], depth, n_prompt, n_gen));
            if (depth0_rounds) at_depth0[i].speeds.push_back(run_pass(at_depth0[i], 0, n_prompt, n_gen));
        }
    }
    std::vector<BenchResult> results;
    for (size_t i = 0; i < runs.size(); ++i) {
        ModeRun &m = runs[i];
        BenchResult r;
        if (depth0_rounds) r.depth0_speeds = at_depth0[i].speeds;
        r.test = n_prompt > 0 ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen);
        r.n_prompt = n_prompt;
        r.n_gen = n_gen;
        r.depth = depth;
        r.dsa = m.dsa;
        r.precision = m.precision;
        r.speeds = m.speeds;
        for (double v : m.speeds) r.mean += v / double(m.speeds.size());
        for (double v : m.speeds)
            r.stddev += (v - r.mean) * (v - r.mean) / double(std::max<size_t>(1, m.speeds.size() - 1));
        r.stddev = std::sqrt(r.stddev);
        if (n_gen > 0) r.bytes_per_token = m.ctx->bytes_per_token(depth + n_gen / 2);
        if (f.model.dsa_stats && m.dsa) {  // totals over the warm-up pass and the repetitions
            std::fprintf(stderr, "dsa-stats of %s at depth %lld, %s indexer:\n", r.test.c_str(), (long long)depth,
                         m.precision.c_str());
            print_sparse_stats(*m.ctx, true);
        }
        results.push_back(std::move(r));
    }
    return results;
}

// The median of a[i] / b[i] (a and b of one size, not empty).
double median_ratio(const std::vector<double> &a, const std::vector<double> &b) {
    std::vector<double> ratios;
    for (size_t i = 0; i < a.size(); ++i) ratios.push_back(a[i] / b[i]);
    std::sort(ratios.begin(), ratios.end());
    const size_t n = ratios.size();
    return n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
}

// Each sparse result's speed-up over the dense result of the same test: the median over repetitions of the
// ratio of passes made in the same round (run_test), or 0 without a dense result.
double speedup_over_dense(const BenchResult &r, const std::vector<BenchResult> &all) {
    if (!r.dsa) return 0.0;
    for (const BenchResult &d : all) {
        if (d.dsa || d.test != r.test || d.depth != r.depth || d.speeds.size() != r.speeds.size()) continue;
        return median_ratio(r.speeds, d.speeds);
    }
    return 0.0;
}

// A result at depth > 0 as a fraction of the same test and mode at depth 0: the median of the rounds' ratios to
// the depth-0 passes made in them (run_test), or 0 when depth 0 was not measured. How much of its speed a mode
// keeps as the context grows.
double fraction_of_depth0(const BenchResult &r) {
    return r.depth0_speeds.empty() ? 0.0 : median_ratio(r.speeds, r.depth0_speeds);  // run_test fills both alike
}

int bench(const BenchFlags &f) {
    auto model = load_model_verbose(f.model);
    const ModelInfo &info = model_info(*model);
    const int n_threads = f.model.n_threads > 0 ? f.model.n_threads : ThreadPool::hardware_threads();
    if (std::any_of(f.depths.begin(), f.depths.end(), [](int64_t d) { return d > 0; })) {
        std::fprintf(stderr, "note: contexts at depth > 0 are filled with synthetic cache rows (timing only)\n");
    }
    // The modes: sparse attention on (once per indexer precision) and off; a model without an indexer has only
    // dense attention.
    std::vector<std::pair<bool, std::string>> modes;
    for (const std::string &mode : f.dsa) {
        const bool dsa = mode == "on";
        if (!info.has_indexer && !modes.empty()) break;  // one dense run, whatever --dsa lists
        const bool sparse = info.has_indexer && dsa;
        std::vector<std::string> precisions;  // resolved (auto: fast or exact), each once
        for (const std::string &p : sparse ? f.precisions : std::vector<std::string>{"exact"}) {
            const std::string r = resolve_indexer_precision(p);
            if (std::find(precisions.begin(), precisions.end(), r) == precisions.end()) precisions.push_back(r);
        }
        for (const std::string &precision : precisions) modes.emplace_back(dsa, precision);
    }
    std::vector<BenchResult> results;
    int64_t most_cache_bytes = 0;
    const bool with_depth0 = std::find(f.depths.begin(), f.depths.end(), 0) != f.depths.end();
    for (const int64_t depth : f.depths) {
        const bool depth0_rounds = with_depth0 && depth > 0;
        for (const int64_t p : f.n_prompt) {
            if (p > 0) {
                for (BenchResult &r : run_test(model, f, modes, depth, p, 0, depth0_rounds, most_cache_bytes))
                    results.push_back(std::move(r));
            }
        }
        for (const int64_t n : f.n_gen) {
            if (n > 0) {
                for (BenchResult &r : run_test(model, f, modes, depth, 0, n, depth0_rounds, most_cache_bytes))
                    results.push_back(std::move(r));
            }
        }
        std::fprintf(stderr, "done: depth %lld\n", (long long)depth);
    }
    // Peak memory before the bandwidth test (whose buffers would otherwise count).
    std::fprintf(stderr,
                 "peak resident memory %.1f MiB (weights %.1f MiB, %.1f MiB of them repacked; KV caches %.1f MiB, "
                 "the most one test held)\n",
                 peak_rss_bytes() / 1048576.0, info.n_weight_bytes / 1048576.0, info.n_repacked_bytes / 1048576.0,
                 most_cache_bytes / 1048576.0);
    ThreadPool pool(n_threads);
    const double copy_bw = measure_copy_bandwidth(pool);
    std::fprintf(stderr, "threads %d; memory copy bandwidth %.1f GB/s (read + write)\n", n_threads, copy_bw / 1e9);
    if (f.output == "json") {
        std::printf("[\n");
        for (size_t i = 0; i < results.size(); ++i) {
            const BenchResult &r = results[i];
            const double gbs = r.mean * double(r.bytes_per_token) / 1e9;
            std::string each, each0;
            for (size_t k = 0; k < r.speeds.size(); ++k) each += strprintf(k ? ", %.3f" : "%.3f", r.speeds[k]);
            for (size_t k = 0; k < r.depth0_speeds.size(); ++k)
                each0 += strprintf(k ? ", %.3f" : "%.3f", r.depth0_speeds[k]);
            const double speedup = speedup_over_dense(r, results);
            const double of_depth0 = fraction_of_depth0(r);
            std::printf(
                "  {\"model\": \"%s\", \"test\": \"%s\", \"n_prompt\": %lld, \"n_gen\": %lld, \"depth\": %lld, "
                "\"dsa\": %s, \"indexer_precision\": \"%s\", \"threads\": %d, \"tokens_per_s\": %.3f, "
                "\"tokens_per_s_stddev\": %.3f, \"tokens_per_s_each\": [%s], \"speedup_over_dense\": %s, "
                "\"fraction_of_depth0\": %s, \"depth0_tokens_per_s_each\": [%s], \"bytes_per_token\": %lld, "
                "\"gb_per_s\": %.3f, \"copy_gb_per_s\": %.3f, "
                "\"synthetic_fill\": %s}%s\n",
                f.model.model_path.c_str(), r.test.c_str(), (long long)r.n_prompt, (long long)r.n_gen,
                (long long)r.depth, r.dsa ? "true" : "false", r.precision.c_str(), n_threads, r.mean, r.stddev,
                each.c_str(), speedup > 0 ? strprintf("%.4f", speedup).c_str() : "null",
                of_depth0 > 0 ? strprintf("%.4f", of_depth0).c_str() : "null", each0.c_str(),
                (long long)r.bytes_per_token, gbs, copy_bw / 1e9, r.depth > 0 ? "true" : "false",
                i + 1 < results.size() ? "," : "");
        }
        std::printf("]\n");
        return 0;
    }
    // vs dense: a sparse row's speed-up over the dense row of the same test; of depth 0: the row's speed against
    // the same test and mode at depth 0 (each the median of the rounds' ratios).
    std::printf(
        "| model | test | depth | dsa | indexer | t/s | bytes/token | GB/s | %% of copy | vs dense | of depth 0 |\n");
    std::printf("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (const BenchResult &r : results) {
        std::string bytes = "-", gbs = "-", frac = "-";
        const double speedup = speedup_over_dense(r, results);
        const std::string vs_dense = speedup > 0 ? strprintf("%.2fx", speedup) : "-";
        const double of_depth0 = fraction_of_depth0(r);
        const std::string vs_depth0 = of_depth0 > 0 ? strprintf("%.1f%%", 100.0 * of_depth0) : "-";
        if (r.bytes_per_token > 0) {
            const double bw = r.mean * double(r.bytes_per_token);
            bytes = strprintf("%.1f MB", r.bytes_per_token / 1e6);
            gbs = strprintf("%.2f", bw / 1e9);
            frac = strprintf("%.0f%%", 100.0 * bw / copy_bw);
        }
        std::printf("| %s | %s | %lld | %s | %s | %.2f ± %.2f | %s | %s | %s | %s | %s |\n",
                    info.name.empty() ? info.arch.c_str() : info.name.c_str(), r.test.c_str(), (long long)r.depth,
                    info.has_indexer ? (r.dsa ? "on" : "off") : "-",
                    info.has_indexer && r.dsa ? r.precision.c_str() : "-", r.mean, r.stddev, bytes.c_str(), gbs.c_str(),
                    frac.c_str(), vs_dense.c_str(), vs_depth0.c_str());
    }
    return 0;
}

}  // namespace

Command register_bench(CLI::App &app) {
    auto *cmd = app.add_subcommand("bench", "Prompt and generation speed at context depths, sparse vs dense");
    auto f = std::make_shared<BenchFlags>();
    f->model.add_to(*cmd, 0, /*with_dsa_flag=*/false);
    // Each length in [0, 2^31] (checked per element): unbounded, a huge -d (or one CLI11 saturated to INT64_MAX)
    // overflowed the context size computed from depth + length.
    cmd->add_option("-p,--n-prompt", f->n_prompt, "Prompt lengths (comma-separated)")
        ->delimiter(',')
        ->check(count_at_least(0));
    cmd->add_option("-n,--n-gen", f->n_gen, "Generation lengths (comma-separated)")
        ->delimiter(',')
        ->check(count_at_least(0));
    cmd->add_option("-d,--depth", f->depths, "Context depths (comma-separated)")
        ->delimiter(',')
        ->check(count_at_least(0));
    cmd->add_option("--dsa", f->dsa, "Sparse attention modes to run: on, off or on,off")
        ->delimiter(',')
        ->check(CLI::IsMember({"on", "off"}));
    cmd->add_option("--indexer-precision", f->precisions,
                    "Indexer precisions to run: exact, fast, exact,fast or auto (fast where this CPU runs 8-bit "
                    "queries, else exact)")
        ->delimiter(',')
        ->check(CLI::IsMember({"auto", "exact", "fast"}));
    cmd->add_option("-r,--repetitions", f->reps, "Repetitions per test")->check(CLI::Range(1, 1000));
    cmd->add_option("-o,--output", f->output, "Output format: md or json")->check(CLI::IsMember({"md", "json"}));
    return [f] { return bench(*f); };
}

}  // namespace sparrow::tools
