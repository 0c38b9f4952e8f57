// The Llama model through the public API: the stories260K goldens (tokens, greedy ids), and the
// equivalences that batching must keep (one batch = several ubatches = token by token; several sequences
// in one batch = each alone), plus refusal of bad batches without touching the cache.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "model/synthetic.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "sparrow/sparrow.h"
#include "test_util.h"

namespace sparrow {
namespace {

using test::rel_error;

std::vector<float> last_logits(Context &ctx, const std::vector<int32_t> &ids, int32_t seq = 0, int32_t pos0 = 0) {
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < ids.size(); ++i) {
        batch.push_back({ids[i], pos0 + static_cast<int32_t>(i), seq, i + 1 == ids.size()});
    }
    ctx.decode(batch);
    const auto l = ctx.logits(ids.size() - 1);
    return {l.begin(), l.end()};
}

TEST(LlamaStories, TokenizesAndContinuesGreedilyAsKnown) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    auto model = load_model(data + "/models/stories260K.gguf");
    const Tokenizer &tok = model_tokenizer(*model);
    const std::vector<int32_t> prompt = tok.encode("Once upon a time", true, false);
    EXPECT_EQ(prompt, (std::vector<int32_t>{1, 403, 407, 261, 378}));

    ContextParams cp;
    cp.n_threads = 2;
    cp.cache_type_k = cp.cache_type_v = CacheType::f32;
    Context ctx(model, cp);
    std::vector<float> logits = last_logits(ctx, prompt);
    std::vector<int32_t> generated;
    for (int i = 0; i < 32; ++i) {
        const int32_t next = argmax(logits);
        generated.push_back(next);
        logits = last_logits(ctx, {next}, 0, static_cast<int32_t>(prompt.size()) + i);
    }
    const std::vector<int32_t> expected = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                           338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322,
                                           265, 282, 295, 433, 426, 385, 328, 432, 358, 394};
    EXPECT_EQ(generated, expected);
}

class LlamaSynthetic : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = test::make_temp_dir("sparrow-llama-");
        SyntheticParams p;
        p.n_embd = 64;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.n_layer = 2;
        path_ = dir_ + "/m.gguf";
        write_synthetic_model(p, path_);
        model_ = load_model(path_);
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }

    Context make_context(int64_t n_ubatch, int64_t n_ctx = 256) {
        ContextParams cp;
        cp.n_ctx = n_ctx;
        cp.n_ubatch = n_ubatch;
        cp.n_threads = 2;
        cp.cache_type_k = cp.cache_type_v = CacheType::f32;
        return Context(model_, cp);
    }
    std::vector<int32_t> random_ids(size_t n, uint32_t seed) {
        std::mt19937 rng(seed);
        std::uniform_int_distribution<int32_t> d(0, 511);
        std::vector<int32_t> ids(n);
        for (auto &id : ids) id = d(rng);
        return ids;
    }

    std::string dir_, path_;
    std::shared_ptr<const Model> model_;
};

TEST_F(LlamaSynthetic, OneBatchEqualsUbatchesEqualsTokenByToken) {
    const auto ids = random_ids(50, 1);
    Context whole = make_context(512);
    const auto ref = last_logits(whole, ids);
    for (int64_t ub : {1, 7, 16}) {
        Context split = make_context(ub);
        EXPECT_LT(rel_error(last_logits(split, ids), ref), 1e-6) << "ubatch " << ub;
    }
    Context step = make_context(512);
    std::vector<float> l;
    for (size_t i = 0; i < ids.size(); ++i) l = last_logits(step, {ids[i]}, 0, static_cast<int32_t>(i));
    EXPECT_LT(rel_error(l, ref), 1e-6);
}

TEST_F(LlamaSynthetic, SequencesInOneBatchEqualEachAlone) {
    const std::vector<std::vector<int32_t>> seqs = {random_ids(30, 2), random_ids(11, 3), random_ids(47, 4)};
    Context together = make_context(16);
    std::vector<BatchToken> batch;
    std::vector<size_t> last_index;
    // Interleave the sequences' tokens so that cells of one sequence are not contiguous.
    for (size_t i = 0; i < 47; ++i) {
        for (int32_t s = 0; s < 3; ++s) {
            if (i >= seqs[s].size()) continue;
            batch.push_back({seqs[s][i], static_cast<int32_t>(i), s, i + 1 == seqs[s].size()});
            if (i + 1 == seqs[s].size()) last_index.push_back(batch.size() - 1);
        }
    }
    together.decode(batch);
    std::vector<std::vector<float>> got;
    for (size_t idx : {last_index[0], last_index[1], last_index[2]}) {
        const auto l = together.logits(idx);
        got.emplace_back(l.begin(), l.end());
    }
    // last_index is in order of completion: sequence 1 (11 tokens), 0 (30), 2 (47).
    const int32_t order[3] = {1, 0, 2};
    for (int k = 0; k < 3; ++k) {
        Context alone = make_context(16);
        EXPECT_LT(rel_error(got[k], last_logits(alone, seqs[order[k]])), 1e-6) << "sequence " << order[k];
    }
}

TEST_F(LlamaSynthetic, RemovingASuffixThenDecodingEqualsAFreshRun) {
    const auto ids = random_ids(40, 5);
    Context ctx = make_context(512);
    last_logits(ctx, ids);
    ctx.seq_rm(0, 25, -1);
    EXPECT_EQ(ctx.seq_pos_max(0), 24);
    const std::vector<int32_t> tail = random_ids(5, 6);
    const auto got = last_logits(ctx, tail, 0, 25);
    std::vector<int32_t> history(ids.begin(), ids.begin() + 25);
    history.insert(history.end(), tail.begin(), tail.end());
    Context fresh = make_context(512);
    EXPECT_LT(rel_error(got, last_logits(fresh, history)), 1e-6);
}

TEST_F(LlamaSynthetic, ThreadCountsOutOfRangeAreRefused) {
    for (const int n : {-1, ContextParams::kMaxThreads + 1, 100000}) {
        ContextParams cp;
        cp.n_threads = n;
        EXPECT_THROW(Context(model_, cp), Error) << n;
    }
}

TEST_F(LlamaSynthetic, BadBatchesAreRefusedAndLeaveTheCacheAlone) {
    Context ctx = make_context(8, 32);
    const auto ids = random_ids(20, 7);
    const auto before = last_logits(ctx, ids);
    std::vector<BatchToken> bad = {{3, 20, 0, true}, {100000, 21, 0, true}};
    EXPECT_THROW(ctx.decode(bad), Error);
    bad = {{3, 20, -1, true}};
    EXPECT_THROW(ctx.decode(bad), Error);
    bad = {{3, -5, 0, true}};
    EXPECT_THROW(ctx.decode(bad), Error);
    std::vector<BatchToken> too_many;
    for (int32_t i = 0; i < 13; ++i) too_many.push_back({1, 20 + i, 0, false});
    EXPECT_THROW(ctx.decode(too_many), Error);  // 20 + 13 > 32 cells
    EXPECT_THROW(ctx.decode(std::span<const BatchToken>()), Error);
    EXPECT_EQ(ctx.seq_pos_max(0), 19);
    const auto kept = ctx.logits(19);  // a refused batch keeps the last batch's logits too
    EXPECT_EQ(std::vector<float>(kept.begin(), kept.end()), before);

    // The cache is intact: continuing equals a fresh run of the whole history.
    const std::vector<int32_t> next = {5, 6};
    const auto cont = last_logits(ctx, next, 0, 20);
    std::vector<int32_t> history = ids;
    history.insert(history.end(), next.begin(), next.end());
    Context fresh = make_context(8, 32);
    EXPECT_LT(rel_error(cont, last_logits(fresh, history)), 1e-6);
}

}  // namespace
}  // namespace sparrow
