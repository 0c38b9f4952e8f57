// Random sequences of cache operations against an oracle of each sequence's history.
//
// serving_test.cpp checks each cache operation in a chosen situation. Here a context with four sequences
// goes through a few hundred random steps: batches for one or two sequences (with gaps in the positions),
// seq_rm, seq_cp, seq_keep, seq_add (forwards and backwards, over part of a sequence, on cells shared after
// seq_cp), defrag, and state save/load into another sequence. The test keeps, per sequence, the (position,
// token) pairs it should hold. Every few steps a probe token is decoded for one sequence and its logits
// must equal a fresh context's run of that sequence's history plus the probe. The models have one layer, so
// a cache row depends only on its token and position and any edited history has a fresh equivalent (with
// more layers a row also depends on what was visible when it was written). Top-k 8, so the indexer selects
// among each sequence's own cells. A refused operation must leave the cache byte-identical (digest) and the
// oracle must have predicted the refusal, or the cache be short of free cells.
//
// SPARROW_FUZZ_ITERATIONS (steps, default 1000) and SPARROW_FUZZ_SEED make longer runs by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/synthetic.h"
#include "sparrow/sparrow.h"
#include "test_util.h"

namespace sparrow {
namespace {

constexpr int kSeqs = 4;
constexpr int64_t kCells = 160;

using History = std::map<int32_t, int32_t>;  // position -> token of one sequence

using test::env_or;

ContextParams context_params() {
    ContextParams cp;
    cp.n_ctx = kCells;
    cp.n_ubatch = 16;
    cp.n_threads = 2;
    cp.cache_type_k = cp.cache_type_v = CacheType::f32;
    cp.indexer_cache_type = CacheType::f32;
    cp.dsa_top_k = 8;
    return cp;
}

std::vector<float> logits_of(const Context &ctx, size_t i) {
    const auto l = ctx.logits(i);
    return {l.begin(), l.end()};
}

// The logits of `probe` at `pos` after the history, from a fresh context (one batch).
std::vector<float> fresh_run(const std::shared_ptr<const Model> &model, const History &h, int32_t probe, int32_t pos) {
    Context ctx(model, context_params());
    std::vector<BatchToken> batch;
    for (const auto &[p, t] : h) batch.push_back({t, p, 0, false});
    batch.push_back({probe, pos, 0, true});
    ctx.decode(batch);
    return logits_of(ctx, batch.size() - 1);
}

class CacheOpsFuzz : public ::testing::TestWithParam<std::string> {};

TEST_P(CacheOpsFuzz, RandomOperationsMatchFreshRunsOfEachSequencesHistory) {
    const std::string dir = test::make_temp_dir("cache_ops_fuzz");
    const std::string variant = GetParam();
    SyntheticParams sp = synthetic_defaults(variant == "deepseek32_yarn" ? "deepseek32" : variant);
    sp.n_layer = 1;
    sp.yarn = variant == "deepseek32_yarn";
    write_synthetic_model(sp, dir + "/m.gguf");
    const auto model = load_model(dir + "/m.gguf");
    const int32_t n_vocab = static_cast<int32_t>(model_info(*model).n_vocab);

    Context ctx(model, context_params());
    std::vector<History> oracle(kSeqs);
    std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(variant) + env_or("SPARROW_FUZZ_SEED", 0)));
    auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    auto max_pos = [&](int s) { return oracle[s].empty() ? -1 : oracle[s].rbegin()->first; };
    int n_probes = 0, n_refused = 0;
    double worst = 0;

    const int n_steps = static_cast<int>(env_or("SPARROW_FUZZ_ITERATIONS", 1000));
    for (int step = 0; step < n_steps; ++step) {
        const int op = uniform(0, 11);
        const int s = uniform(0, kSeqs - 1);
        const std::string what =
            "step " + std::to_string(step) + " op " + std::to_string(op) + " seq " + std::to_string(s);
        if (ctx.n_cells_used() > kCells - 24) {  // make room: drop the longest sequence's older half
            int longest = 0;
            for (int q = 1; q < kSeqs; ++q) longest = oracle[q].size() > oracle[longest].size() ? q : longest;
            const int32_t cut =
                oracle[longest].empty() ? 0 : oracle[longest].begin()->first + int32_t(oracle[longest].size() / 2);
            ctx.seq_rm(longest, 0, cut);
            std::erase_if(oracle[longest], [&](const auto &e) { return e.first < cut; });
        }
        if (op <= 2) {  // a batch for one or two sequences, positions after each one's last, with gaps
            std::vector<BatchToken> batch;
            const int other = uniform(0, kSeqs - 1);
            std::vector<int> seqs = {s};
            if (other != s && uniform(0, 1)) seqs.push_back(other);
            for (const int q : seqs) {
                int32_t pos = max_pos(q) + 1 + uniform(0, 1) * uniform(0, 3);
                for (int i = uniform(1, 6); i > 0; --i, pos += 1 + (uniform(0, 5) == 0)) {
                    const int32_t tok = uniform(0, n_vocab - 1);
                    batch.push_back({tok, pos, q, false});
                    oracle[q][pos] = tok;
                }
            }
            ctx.decode(batch);
        } else if (op == 3) {
            const int32_t p0 = uniform(0, std::max(0, max_pos(s))), p1 = uniform(0, 1) ? -1 : p0 + uniform(1, 8);
            ctx.seq_rm(s, p0, p1);
            std::erase_if(oracle[s], [&](const auto &e) { return e.first >= p0 && (p1 < 0 || e.first < p1); });
        } else if (op == 4) {
            const int dst = (s + uniform(1, kSeqs - 1)) % kSeqs;
            const int32_t p0 = uniform(0, 1) ? 0 : uniform(0, std::max(0, max_pos(s))), p1 = -1;
            ctx.seq_cp(s, dst, p0, p1);
            std::erase_if(oracle[dst], [&](const auto &e) { return e.first >= p0; });
            for (const auto &[p, t] : oracle[s])
                if (p >= p0) oracle[dst][p] = t;
        } else if (op == 5 && uniform(0, 3) == 0) {
            ctx.seq_keep(s);
            for (int q = 0; q < kSeqs; ++q)
                if (q != s) oracle[q].clear();
        } else if (op <= 7) {  // shift part or all of a sequence, maybe below zero (those cells go)
            const int32_t p0 = uniform(0, 1) ? 0 : uniform(0, std::max(0, max_pos(s)));
            const int32_t delta = uniform(-12, 12);
            History shifted;
            bool collision = false;
            for (const auto &[p, t] : oracle[s]) {
                if (p < p0) {
                    collision |= shifted.count(p) > 0;
                    shifted[p] = t;
                } else if (p + delta >= 0) {
                    collision |= shifted.count(p + delta) > 0;
                    shifted[p + delta] = t;
                }
            }
            const uint64_t before = ctx.cache_digest();
            try {
                ctx.seq_add(s, p0, -1, delta);
                ASSERT_FALSE(collision) << what << ": a shift onto kept positions was accepted";
                oracle[s] = shifted;
            } catch (const Error &e) {
                ++n_refused;
                ASSERT_EQ(ctx.cache_digest(), before) << what << ": a refused shift changed the cache";
                ASSERT_TRUE(collision || e.code() == ErrorCode::context_full) << what << ": " << e.what();
            }
        } else if (op == 8) {
            ctx.defrag();
        } else if (op == 9) {  // park a sequence in a file and bring it back as another one
            const std::string file = dir + "/seq.state";
            ctx.state_seq_save(s, file);
            const int dst = uniform(0, kSeqs - 1);
            if (dst != s) ctx.seq_rm(dst, 0, -1);
            ctx.seq_rm(s, 0, -1);
            const History saved = oracle[s];
            oracle[s].clear();
            oracle[dst].clear();
            // The removed cells may still hold other sequences (seq_cp shares them): the load can find the
            // cache short of free cells, and must then refuse it and leave the cache as it was.
            const uint64_t before = ctx.cache_digest();
            const bool room = static_cast<int64_t>(saved.size()) <= kCells - ctx.n_cells_used();
            try {
                ctx.state_seq_load(dst, file);
                ASSERT_TRUE(room) << what << ": " << saved.size() << " tokens loaded into fewer free cells";
                oracle[dst] = saved;
            } catch (const Error &e) {
                ++n_refused;
                ASSERT_FALSE(room) << what << ": a load with room for it was refused: " << e.what();
                ASSERT_EQ(e.code(), ErrorCode::context_full) << what << ": " << e.what();
                ASSERT_EQ(ctx.cache_digest(), before) << what << ": a refused load changed the cache";
            }
        } else {  // probe: the next token's logits against a fresh run of the history
            if (oracle[s].empty()) continue;
            const int32_t probe = uniform(0, n_vocab - 1), pos = max_pos(s) + 1;
            const BatchToken t{probe, pos, s, true};
            ctx.decode(std::span<const BatchToken>(&t, 1));
            const std::vector<float> got = logits_of(ctx, 0);
            const double err = test::rel_error(got, fresh_run(model, oracle[s], probe, pos));
            worst = std::max(worst, err);
            ASSERT_LT(err, 1e-4) << what << ": probe of a history of " << oracle[s].size() << " tokens";
            oracle[s][pos] = probe;
            ++n_probes;
        }
        for (int q = 0; q < kSeqs; ++q) {
            ASSERT_EQ(ctx.seq_pos_max(q), max_pos(q)) << what << ", sequence " << q;
            ASSERT_EQ(ctx.seq_pos_min(q), oracle[q].empty() ? -1 : oracle[q].begin()->first) << what;
        }
    }
    EXPECT_GT(n_probes, 20);
    std::printf("%d probes (worst relative error %.2e), %d refused shifts or loads\n", n_probes, worst, n_refused);
    std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, CacheOpsFuzz, ::testing::Values("llama", "deepseek32", "glm-dsa", "deepseek32_yarn"),
                         [](const auto &p) {
                             std::string n = p.param;
                             for (char &c : n) c = c == '-' ? '_' : c;
                             return n;
                         });

}  // namespace
}  // namespace sparrow
