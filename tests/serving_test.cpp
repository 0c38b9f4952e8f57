// The serving core through the public API, for llama, deepseek32 and glm-dsa (top-k 32, so that the
// indexer's selection is active): several sequences per batch, tokens shared by several sequences, the
// cache operations (seq_rm/cp/keep/add/div, defrag, state save/load) against fresh runs of the resulting
// histories, refused batches and operations leaving every cache byte-identical, and attention sinks.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include "core/error.h"
#include "model/synthetic.h"
#include "sparrow/sparrow.h"
#include "test_util.h"

namespace sparrow {
namespace {

using Logits = std::vector<float>;

double rel_error(const Logits &a, const Logits &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<int32_t> random_ids(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(0, 511);
    std::vector<int32_t> ids(n);
    for (auto &id : ids) id = d(rng);
    return ids;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t> &b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// Decodes ids for seq at positions pos0, pos0 + step, ... in one batch; returns every token's logits.
std::vector<Logits> decode_all(Context &ctx, const std::vector<int32_t> &ids, int32_t seq = 0, int32_t pos0 = 0,
                               int32_t step = 1) {
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < ids.size(); ++i) batch.push_back({ids[i], pos0 + step * static_cast<int32_t>(i), seq, true});
    ctx.decode(batch);
    std::vector<Logits> out;
    for (size_t i = 0; i < ids.size(); ++i) {
        const auto l = ctx.logits(i);
        out.emplace_back(l.begin(), l.end());
    }
    return out;
}

Logits decode_last(Context &ctx, const std::vector<int32_t> &ids, int32_t seq = 0, int32_t pos0 = 0) {
    return decode_all(ctx, ids, seq, pos0).back();
}

// The keys each layer selected for query i of the last forward pass's recorded queries.
std::vector<std::vector<int32_t>> selection_of(const Context &ctx, size_t i) {
    std::vector<std::vector<int32_t>> keys;
    for (const LayerSelection &l : ctx.last_selections()) keys.push_back(l.queries.at(i).keys);
    return keys;
}

class Serving : public ::testing::TestWithParam<std::string> {
  protected:
    static void SetUpTestSuite() {
        dir_ = new std::string(test::make_temp_dir("sparrow-serving-"));
        models_ = new std::map<std::string, std::shared_ptr<const Model>>();
        for (const char *arch : {"llama", "deepseek32", "glm-dsa"}) {
            for (const int64_t n_layer : {int64_t(0), int64_t(1)}) {
                SyntheticParams p = synthetic_defaults(arch);
                if (n_layer > 0) p.n_layer = n_layer;
                const std::string name = std::string(arch) + (n_layer > 0 ? "-1layer" : "");
                write_synthetic_model(p, *dir_ + "/" + name + ".gguf");
                (*models_)[name] = load_model(*dir_ + "/" + name + ".gguf");
            }
        }
        SyntheticParams yarn = synthetic_defaults("deepseek32");  // YaRN: RoPE with a magnitude factor
        yarn.n_layer = 1;
        yarn.yarn = true;
        write_synthetic_model(yarn, *dir_ + "/yarn.gguf");
        (*models_)["deepseek32-yarn-1layer"] = load_model(*dir_ + "/yarn.gguf");
    }
    static void TearDownTestSuite() {
        std::filesystem::remove_all(*dir_);
        delete models_;
        delete dir_;
    }

    std::shared_ptr<const Model> model() const { return models_->at(GetParam()); }
    bool sparse() const { return GetParam() != "llama"; }
    static ContextParams params(int64_t n_ctx = 512, int64_t n_ubatch = 64) {
        ContextParams cp;
        cp.n_ctx = n_ctx;
        cp.n_ubatch = n_ubatch;
        cp.n_threads = 2;
        cp.cache_type_k = cp.cache_type_v = CacheType::f32;
        cp.indexer_cache_type = CacheType::f32;
        cp.dsa_top_k = 32;
        cp.record_selections = true;
        return cp;
    }
    Context make(int64_t n_ctx = 512, int64_t n_ubatch = 64) const { return Context(model(), params(n_ctx, n_ubatch)); }
    // A one-layer model of the arch: its cache rows depend only on each token and its position, so a cache
    // whose positions were edited (partial shifts, divisions) equals a fresh run of the edited history.
    Context make_one_layer(const std::string &variant = "") const {
        return Context(models_->at(GetParam() + variant + "-1layer"), params());
    }
    std::string path(const std::string &name) const { return *dir_ + "/" + GetParam() + "-" + name; }

    static std::string *dir_;
    static std::map<std::string, std::shared_ptr<const Model>> *models_;
};
std::string *Serving::dir_ = nullptr;
std::map<std::string, std::shared_ptr<const Model>> *Serving::models_ = nullptr;

TEST_P(Serving, SequencesInOneBatchEqualEachAloneWithTheSameSelections) {
    const std::vector<std::vector<int32_t>> seqs = {random_ids(20, 1), random_ids(50, 2), random_ids(90, 3)};
    Context together = make();
    std::vector<BatchToken> batch;
    std::vector<std::vector<size_t>> index(3);  // per sequence: its tokens' indices in the batch
    for (size_t i = 0; i < 90; ++i) {           // interleaved, so that no sequence's cells are contiguous
        for (int32_t s = 0; s < 3; ++s) {
            if (i >= seqs[s].size()) continue;
            index[s].push_back(batch.size());
            batch.push_back({seqs[s][i], static_cast<int32_t>(i), s, true});
        }
    }
    together.decode(batch);
    std::vector<std::vector<Logits>> got(3);
    for (int s = 0; s < 3; ++s) {
        for (size_t idx : index[s]) {
            const auto l = together.logits(idx);
            got[s].emplace_back(l.begin(), l.end());
        }
    }
    // One more step: one token per sequence in one batch, whose selections are recorded.
    const std::vector<int32_t> next = {7, 8, 9};
    std::vector<BatchToken> step;
    for (int32_t s = 0; s < 3; ++s) step.push_back({next[s], static_cast<int32_t>(seqs[s].size()), s, true});
    together.decode(step);
    for (int32_t s = 0; s < 3; ++s) {
        SCOPED_TRACE("sequence " + std::to_string(s));
        Context alone = make();
        const std::vector<Logits> ref = decode_all(alone, seqs[s]);
        for (size_t i = 0; i < ref.size(); ++i) ASSERT_LT(rel_error(got[s][i], ref[i]), 1e-5) << "token " << i;
        const Logits ref_next = decode_last(alone, {next[s]}, 0, static_cast<int32_t>(seqs[s].size()));
        const auto l = together.logits(static_cast<size_t>(s));
        EXPECT_LT(rel_error(Logits(l.begin(), l.end()), ref_next), 1e-5);
        if (sparse()) {
            const auto sel = selection_of(together, static_cast<size_t>(s));
            EXPECT_EQ(sel, selection_of(alone, 0));
            if (s > 0) {  // longer than top-k: the selection is active and keeps 32 keys
                for (const auto &keys : sel) EXPECT_EQ(keys.size(), 32u);
            }
        }
    }
}

// A ubatch runs its last layer's queries, attention and FFN for the rows that want outputs only (WantedRows):
// their logits, every cache byte and the next step's logits equal a run where every row asked for logits, for
// two interleaved sequences over three ubatches (selection active), and when no row asks at all.
TEST_P(Serving, RowsWithoutOutputsSkipTheLastLayerAndChangeNothing) {
    ContextParams cp = params(512, 32);
    cp.record_selections = false;  // a recorded selection keeps every query of every layer
    const std::vector<std::vector<int32_t>> seqs = {random_ids(90, 21), random_ids(70, 22)};
    std::vector<BatchToken> every, some, none;
    std::vector<size_t> wanted;
    for (size_t i = 0; i < 90; ++i) {
        for (int32_t s = 0; s < 2; ++s) {
            if (i >= seqs[s].size()) continue;
            const bool want = i == 5 || i + 1 == seqs[s].size() || (s == 0 && i == 40);
            if (want) wanted.push_back(every.size());
            every.push_back({seqs[s][i], static_cast<int32_t>(i), s, true});
            some.push_back({seqs[s][i], static_cast<int32_t>(i), s, want});
            none.push_back({seqs[s][i], static_cast<int32_t>(i), s, false});
        }
    }
    Context all(model(), cp), trimmed(model(), cp), blind(model(), cp);
    all.decode(every);
    trimmed.decode(some);
    blind.decode(none);
    for (const size_t i : wanted) {
        const auto a = all.logits(i), t = trimmed.logits(i);
        EXPECT_LT(rel_error(Logits(t.begin(), t.end()), Logits(a.begin(), a.end())), 1e-6) << "row " << i;
    }
    EXPECT_THROW(trimmed.logits(0), Error);  // row 0 asked for none
    EXPECT_EQ(trimmed.cache_digest(), all.cache_digest());
    EXPECT_EQ(blind.cache_digest(), all.cache_digest());
    if (sparse()) {  // the last layer saw the wanted queries alone; the others every token
        const SparseStats full = all.sparse_stats(), part = trimmed.sparse_stats();
        ASSERT_EQ(full.layers.size(), part.layers.size());
        for (size_t il = 0; il < full.layers.size(); ++il) {
            const bool last = il + 1 == full.layers.size();
            EXPECT_EQ(full.layers[il].n_queries, 160) << il;
            EXPECT_EQ(part.layers[il].n_queries, last ? static_cast<int64_t>(wanted.size()) : 160) << il;
        }
        EXPECT_EQ(blind.sparse_stats().layers.back().n_queries, 0);
    }
    std::vector<BatchToken> step;
    for (int32_t s = 0; s < 2; ++s) step.push_back({7 + s, static_cast<int32_t>(seqs[s].size()), s, true});
    for (Context *ctx : {&all, &trimmed, &blind}) ctx->decode(step);
    for (size_t s = 0; s < 2; ++s) {
        const auto a = all.logits(s), t = trimmed.logits(s), b = blind.logits(s);
        EXPECT_EQ(Logits(t.begin(), t.end()), Logits(a.begin(), a.end())) << "sequence " << s;
        EXPECT_EQ(Logits(b.begin(), b.end()), Logits(a.begin(), a.end())) << "sequence " << s;
    }
}

TEST_P(Serving, SharedPromptDecodedOnceThenDivergingEqualsEachFromScratch) {
    const std::vector<int32_t> prompt = random_ids(40, 4);
    Context ctx = make(512, 16);  // the prompt spans several ubatches
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < prompt.size(); ++i) {
        batch.push_back({prompt[i], static_cast<int32_t>(i), 0, false, {1, 2}});
    }
    ctx.decode(batch);
    EXPECT_EQ(ctx.n_cells_used(), 40);
    for (int32_t s = 0; s < 3; ++s) EXPECT_EQ(ctx.seq_pos_max(s), 39);
    const std::vector<std::vector<int32_t>> tails = {random_ids(30, 5), random_ids(12, 6), random_ids(25, 7)};
    batch.clear();
    std::vector<size_t> last(3);
    for (size_t i = 0; i < 30; ++i) {
        for (int32_t s = 0; s < 3; ++s) {
            if (i >= tails[s].size()) continue;
            if (i + 1 == tails[s].size()) last[s] = batch.size();
            batch.push_back({tails[s][i], static_cast<int32_t>(40 + i), s, i + 1 == tails[s].size()});
        }
    }
    ctx.decode(batch);
    for (int32_t s = 0; s < 3; ++s) {
        Context fresh = make();
        const auto l = ctx.logits(last[s]);
        EXPECT_LT(rel_error(Logits(l.begin(), l.end()), decode_last(fresh, concat(prompt, tails[s]))), 1e-5)
            << "sequence " << s;
    }
}

TEST_P(Serving, RemovingASuffixThenDecodingEqualsAFreshRun) {
    const auto ids = random_ids(60, 8);
    Context ctx = make();
    decode_all(ctx, ids);
    ctx.seq_rm(0, 45, -1);
    EXPECT_EQ(ctx.seq_pos_max(0), 44);
    const auto tail = random_ids(10, 9);
    const Logits got = decode_last(ctx, tail, 0, 45);
    Context fresh = make();
    EXPECT_LT(rel_error(got, decode_last(fresh, concat({ids.begin(), ids.begin() + 45}, tail))), 1e-5);
}

TEST_P(Serving, CopiedSequenceThenDivergingEqualsTwoFreshRuns) {
    const auto prefix = random_ids(40, 10);
    Context ctx = make();
    decode_all(ctx, prefix);
    ctx.seq_cp(0, 1, 0, -1);
    EXPECT_EQ(ctx.n_cells_used(), 40);  // shared, not copied
    EXPECT_EQ(ctx.seq_pos_max(1), 39);
    const auto a = random_ids(20, 11), b = random_ids(20, 12);
    std::vector<BatchToken> batch;
    for (size_t i = 0; i < 20; ++i) {
        batch.push_back({a[i], static_cast<int32_t>(40 + i), 0, i == 19});
        batch.push_back({b[i], static_cast<int32_t>(40 + i), 1, i == 19});
    }
    ctx.decode(batch);
    Context fresh_a = make(), fresh_b = make();
    const auto la = ctx.logits(38), lb = ctx.logits(39);
    EXPECT_LT(rel_error(Logits(la.begin(), la.end()), decode_last(fresh_a, concat(prefix, a))), 1e-5);
    EXPECT_LT(rel_error(Logits(lb.begin(), lb.end()), decode_last(fresh_b, concat(prefix, b))), 1e-5);
    // seq_keep(1) drops sequence 0 and the cells only it held.
    ctx.seq_keep(1);
    EXPECT_EQ(ctx.seq_pos_max(0), -1);
    EXPECT_EQ(ctx.n_cells_used(), 60);
}

TEST_P(Serving, ShiftedSequenceEqualsAFreshRunAtShiftedPositions) {
    const auto ids = random_ids(50, 13), tail = random_ids(10, 14);
    {  // the whole sequence moves up by 7
        Context ctx = make();
        decode_all(ctx, ids);
        ctx.seq_add(0, 0, -1, 7);
        EXPECT_EQ(ctx.seq_pos_min(0), 7);
        EXPECT_EQ(ctx.seq_pos_max(0), 56);
        const Logits got = decode_last(ctx, tail, 0, 57);
        Context fresh = make();
        EXPECT_LT(rel_error(got, decode_last(fresh, concat(ids, tail), 0, 7)), 1e-4);
    }
    {  // a shared prefix: sequence 1's shift copies the cells, sequence 0 keeps its positions
        Context ctx = make();
        decode_all(ctx, ids);
        ctx.seq_cp(0, 1, 0, -1);
        ctx.seq_add(1, 0, -1, 5);
        EXPECT_EQ(ctx.n_cells_used(), 100);
        EXPECT_EQ(ctx.seq_pos_max(0), 49);
        EXPECT_EQ(ctx.seq_pos_max(1), 54);
        const Logits got0 = decode_last(ctx, tail, 0, 50);
        const Logits got1 = decode_last(ctx, tail, 1, 55);
        Context fresh0 = make(), fresh1 = make();
        EXPECT_LT(rel_error(got0, decode_last(fresh0, concat(ids, tail))), 1e-5);
        EXPECT_LT(rel_error(got1, decode_last(fresh1, concat(ids, tail), 0, 5)), 1e-4);
    }
}

// Shifting part of a sequence changes the relative positions of its keys; on a one-layer model the shifted
// cache equals a fresh run at the new positions, which checks the re-rotation of every stored key kind.
TEST_P(Serving, ContextShiftOnOneLayerEqualsAFreshRunOfTheShortenedHistory) {
    const auto ids = random_ids(50, 13), tail = random_ids(10, 14);
    // deepseek32 also with YaRN, whose RoPE scales by mscale: the extra rotation must have unit magnitude.
    for (const std::string &variant :
         GetParam() == "deepseek32" ? std::vector<std::string>{"", "-yarn"} : std::vector<std::string>{""}) {
        SCOPED_TRACE("variant '" + variant + "'");
        // context shift: drop [4, 14) and move the rest down by 10
        Context ctx = make_one_layer(variant);
        decode_all(ctx, ids);
        ctx.seq_rm(0, 4, 14);
        ctx.seq_add(0, 14, -1, -10);
        EXPECT_EQ(ctx.seq_pos_max(0), 39);
        const Logits got = decode_last(ctx, tail, 0, 40);
        std::vector<int32_t> history(ids.begin(), ids.begin() + 4);
        history.insert(history.end(), ids.begin() + 14, ids.end());
        Context fresh = make_one_layer(variant);
        EXPECT_LT(rel_error(got, decode_last(fresh, concat(history, tail))), 1e-4);
    }
}

// Context::context_shift (llama.cpp's): keep 4, drop the older half of the other 46 (23), move the rest down; on a
// one-layer model the cache then equals a fresh run of the shortened history.
TEST_P(Serving, ContextShiftHelperDropsTheOlderHalfAfterTheKeptPrefix) {
    const auto ids = random_ids(50, 15), tail = random_ids(6, 16);
    Context ctx = make_one_layer();
    decode_all(ctx, ids);
    EXPECT_EQ(ctx.context_shift(0, 4), 23);
    EXPECT_EQ(ctx.seq_pos_max(0), 26);
    EXPECT_EQ(ctx.seq_n_cells(0), 27);
    const Logits got = decode_last(ctx, tail, 0, 27);
    std::vector<int32_t> history(ids.begin(), ids.begin() + 4);
    history.insert(history.end(), ids.begin() + 27, ids.end());
    Context fresh = make_one_layer();
    EXPECT_LT(rel_error(got, decode_last(fresh, concat(history, tail))), 1e-4);
    // Nothing to drop: one position after the kept ones, or none.
    Context small = make_one_layer();
    decode_all(small, random_ids(5, 17));
    EXPECT_EQ(small.context_shift(0, 4), 0);
    EXPECT_EQ(small.context_shift(0, 9), 0);
    EXPECT_EQ(small.seq_pos_max(0), 4);
    EXPECT_THROW(small.context_shift(0, -1), Error);
}

TEST_P(Serving, DividedPositionsOnOneLayerEqualAFreshRunAtThosePositions) {
    const auto ids = random_ids(45, 15), tail = random_ids(5, 16);
    Context ctx = make_one_layer();
    decode_all(ctx, ids, 0, 0, 2);  // positions 0, 2, ..., 88
    ctx.seq_div(0, 0, -1, 2);       // -> 0, 1, ..., 44
    EXPECT_EQ(ctx.seq_pos_max(0), 44);
    const Logits got = decode_last(ctx, tail, 0, 45);
    Context fresh = make_one_layer();
    EXPECT_LT(rel_error(got, decode_last(fresh, concat(ids, tail))), 1e-4);
    EXPECT_THROW(ctx.seq_div(0, 0, -1, 0), Error);
}

// After seq_div cells share positions (4 cells on 0, 0, 1, 1): the saved state loads again (the loader wanted
// strictly increasing positions and refused the file it had just written).
TEST_P(Serving, DividedSequenceStateRoundTrips) {
    const auto ids = random_ids(8, 35), tail = random_ids(3, 36);
    Context ctx = make();
    decode_all(ctx, ids);
    ctx.seq_div(0, 0, -1, 2);
    const std::string file = path("divided.state");
    ctx.state_seq_save(0, file);
    Context fresh = make();
    fresh.state_seq_load(0, file);
    EXPECT_EQ(fresh.cache_digest(), ctx.cache_digest());
    EXPECT_EQ(decode_last(fresh, tail, 0, 4), decode_last(ctx, tail, 0, 4));
}

TEST_P(Serving, DefragmentationChangesNoLogits) {
    const std::vector<std::vector<int32_t>> seqs = {random_ids(30, 17), random_ids(30, 18), random_ids(40, 19)};
    Context a = make(), b = make();
    for (Context *ctx : {&a, &b}) {
        std::vector<BatchToken> batch;
        for (size_t i = 0; i < 40; ++i) {
            for (int32_t s = 0; s < 3; ++s) {
                if (i < seqs[s].size()) batch.push_back({seqs[s][i], static_cast<int32_t>(i), s, false});
            }
        }
        ctx->decode(batch);
        ctx->seq_rm(1, 0, -1);
        ctx->seq_rm(2, 10, 20);
    }
    b.defrag();
    EXPECT_EQ(b.n_cells_used(), 60);
    const auto tail = random_ids(8, 20);
    for (int32_t s : {0, 2}) {
        const int32_t p = a.seq_pos_max(s) + 1;
        EXPECT_EQ(decode_last(a, tail, s, p), decode_last(b, tail, s, p)) << "sequence " << s;
    }
}

TEST_P(Serving, SavedSequenceLoadsIntoAFreshContextAndAnotherSequence) {
    const auto ids = random_ids(50, 21), tail = random_ids(6, 22);
    Context src = make();
    decode_all(src, random_ids(10, 23), 2);  // another sequence in the way
    decode_all(src, ids, 0);
    const std::string file = path("seq0.state");
    src.state_seq_save(0, file, ids);  // the token ids travel with the rows
    const std::string bare = path("seq0-bare.state");
    src.state_seq_save(0, bare);
    // At most one token per cell, each in the vocabulary.
    EXPECT_THROW(src.state_seq_save(0, path("bad.state"), concat(ids, {1})), Error);
    EXPECT_THROW(src.state_seq_save(0, path("bad.state"), std::vector<int32_t>{-1}), Error);
    EXPECT_THROW(src.state_seq_save(0, path("bad.state"), std::vector<int32_t>{1 << 30}), Error);
    const Logits want = decode_last(src, tail, 0, 50);

    Context fresh = make();
    EXPECT_TRUE(fresh.state_seq_load(0, bare).empty());
    EXPECT_EQ(fresh.state_seq_load(0, file), ids);
    EXPECT_EQ(fresh.seq_pos_max(0), 49);
    EXPECT_EQ(decode_last(fresh, tail, 0, 50), want);

    Context other = make();
    decode_all(other, random_ids(33, 24), 0);
    decode_all(other, random_ids(5, 25), 3);  // replaced by the load
    other.state_seq_load(3, file);
    EXPECT_EQ(other.n_cells_used(), 83);
    EXPECT_EQ(decode_last(other, tail, 3, 50), want);
}

// Fast indexer mode keeps an int8 copy of the indexer keys in the cache (RowStore::keep_int8_copy), which
// every cache operation must keep in step: after defragmentation (rows moved), a suffix removed and
// rewritten, and a state load, the selections and logits equal those of a context that never did the
// operation. Selection is active (50+ keys, top-k 32), so a stale int8 row would change what is selected.
TEST_P(Serving, FastIndexerInt8CopyFollowsCacheOperations) {
    if (!sparse()) GTEST_SKIP() << "no indexer";
    ContextParams cp = params();
    cp.indexer_fast = true;
    cp.indexer_cache_type = CacheType::f16;
    const auto a_ids = random_ids(40, 31), b_ids = random_ids(60, 32), tail = random_ids(6, 33);
    // Defragmentation moves sequence 1's rows (sequence 0 is removed first).
    Context plain(model(), cp), moved(model(), cp);
    for (Context *ctx : {&plain, &moved}) {
        decode_all(*ctx, a_ids, 0);
        decode_all(*ctx, b_ids, 1);
        ctx->seq_rm(0, 0, -1);
    }
    moved.defrag();
    EXPECT_EQ(decode_last(moved, tail, 1, 60), decode_last(plain, tail, 1, 60));
    EXPECT_EQ(selection_of(moved, tail.size() - 1), selection_of(plain, tail.size() - 1));
    // A suffix removed and rewritten with other tokens equals a fresh run of the resulting history.
    Context edited(model(), cp), fresh(model(), cp);
    decode_all(edited, b_ids, 0);
    edited.seq_rm(0, 30, -1);
    const auto new_ids = random_ids(30, 34);
    decode_all(edited, new_ids, 0, 30);
    decode_all(fresh, concat(std::vector<int32_t>(b_ids.begin(), b_ids.begin() + 30), new_ids), 0);
    const Logits e = decode_last(edited, tail, 0, 60), f = decode_last(fresh, tail, 0, 60);
    EXPECT_LT(rel_error(e, f), 1e-5);
    EXPECT_EQ(selection_of(edited, tail.size() - 1), selection_of(fresh, tail.size() - 1));
    // A saved sequence loads into a context whose cells held other keys.
    const std::string file = path("fast.state");
    Context src(model(), cp);
    decode_all(src, b_ids, 0);
    src.state_seq_save(0, file);
    const Logits want = decode_last(src, tail, 0, 60);
    const auto want_sel = selection_of(src, tail.size() - 1);
    Context other(model(), cp);
    decode_all(other, random_ids(70, 35), 0);
    other.seq_rm(0, 0, -1);
    other.state_seq_load(0, file);
    EXPECT_EQ(decode_last(other, tail, 0, 60), want);
    EXPECT_EQ(selection_of(other, tail.size() - 1), want_sel);
}

TEST_P(Serving, BadStateFilesAreRefusedAndLeaveTheCacheAlone) {
    Context ctx = make(128);
    decode_all(ctx, random_ids(40, 26));
    const std::string good = path("good.state");
    ctx.state_seq_save(0, good);
    std::ostringstream ss;
    ss << std::ifstream(good, std::ios::binary).rdbuf();
    const std::string bytes = ss.str();
    const auto write = [&](const std::string &name, const std::string &content) {
        std::ofstream out(path(name), std::ios::binary);
        out << content;
        return path(name);
    };
    const uint64_t digest = ctx.cache_digest();
    const auto refused = [&](const std::string &file, const char *what) {
        try {
            ctx.state_seq_load(1, file);
            ADD_FAILURE() << what << ": accepted";
        } catch (const Error &e) {
            EXPECT_EQ(e.code(), ErrorCode::state_file) << what << ": " << e.what();
        }
        EXPECT_EQ(ctx.cache_digest(), digest) << what;
    };
    refused(path("missing.state"), "missing file");
    refused(*dir_, "a directory");
    refused("/dev/zero", "a device that never ends (it was read until memory ran out)");
    const std::string fifo = path("fifo.state");
    if (::mkfifo(fifo.c_str(), 0600) == 0) refused(fifo, "a FIFO (opening it waited for a writer)");
    refused(write("huge.state", bytes + std::string(size_t(2) << 20, 'x')), "larger than any state of the context");
    refused(write("empty.state", ""), "empty file");
    refused(write("magic.state", "NOTSPARROW" + bytes.substr(10)), "bad magic");
    refused(write("short.state", bytes.substr(0, bytes.size() / 2)), "truncated");
    std::string flipped = bytes;
    flipped[bytes.size() / 2] ^= 0x5a;
    refused(write("flipped.state", flipped), "flipped byte");
    // The same sequence from another model, or with another cache type, does not fit.
    const std::string other_arch = GetParam() == "llama" ? "deepseek32" : "llama";
    ContextParams cp = params(128);
    Context foreign(models_->at(other_arch), cp);
    decode_all(foreign, random_ids(10, 27));
    foreign.state_seq_save(0, path("foreign.state"));
    refused(path("foreign.state"), "another model");
    cp.cache_type_k = cp.cache_type_v = CacheType::f16;
    Context f16(model(), cp);
    decode_all(f16, random_ids(10, 28));
    f16.state_seq_save(0, path("f16.state"));
    refused(path("f16.state"), "another cache type");
    // The same cache type with the rows Hadamard-rotated: the bytes mean something else.
    cp = params(128);
    cp.cache_rotation = CacheRotation::on;
    Context rotated(model(), cp);
    decode_all(rotated, random_ids(10, 30));
    rotated.state_seq_save(0, path("rotated.state"));
    refused(path("rotated.state"), "rotated rows");
    // A file that needs more cells than are free.
    Context small = make(64);
    decode_all(small, random_ids(30, 29), 1);
    try {
        small.state_seq_load(0, good);
        ADD_FAILURE() << "loaded 40 cells into 34 free ones";
    } catch (const Error &e) {
        EXPECT_EQ(e.code(), ErrorCode::context_full) << e.what();
    }
    EXPECT_EQ(small.seq_pos_max(0), -1);
}

// fill_synthetic (benchmarks' deep contexts) checks what it is given: a negative or huge count and positions
// past 2^31 - 1 are errors that leave the cache alone (they were std::length_error, std::bad_alloc and an abort on
// the cell table's assertion).
TEST_P(Serving, SyntheticFillIsBounded) {
    Context ctx = make(64);
    const std::vector<BatchToken> last = {{1, std::numeric_limits<int32_t>::max() - 1, 0, true}};
    ctx.decode(last);
    const uint64_t digest = ctx.cache_digest();
    for (const int64_t n : {int64_t(-1), int64_t(1) << 40, int64_t(2)}) {
        try {
            ctx.fill_synthetic(0, n, 1);
            ADD_FAILURE() << n << " rows accepted";
        } catch (const Error &e) {
            EXPECT_EQ(e.code(), n == 2  ? ErrorCode::position_order
                                : n > 0 ? ErrorCode::context_full
                                        : ErrorCode::generic)
                << e.what();
        }
        EXPECT_EQ(ctx.cache_digest(), digest) << n;
    }
    ctx.fill_synthetic(0, 1, 1);  // the last position there is
    EXPECT_EQ(ctx.seq_pos_max(0), std::numeric_limits<int32_t>::max());
}

TEST_P(Serving, RefusedBatchesLeaveEveryCacheByteIdentical) {
    Context ctx = make(64, 8);
    decode_all(ctx, random_ids(20, 30), 0);
    decode_all(ctx, random_ids(10, 31), 1);
    const uint64_t digest = ctx.cache_digest();
    const auto refused = [&](std::vector<BatchToken> batch, ErrorCode code, const char *what) {
        try {
            ctx.decode(batch);
            ADD_FAILURE() << what << ": accepted";
        } catch (const Error &e) {
            EXPECT_EQ(e.code(), code) << what << ": " << e.what();
        }
        EXPECT_EQ(ctx.cache_digest(), digest) << what;
    };
    refused({}, ErrorCode::invalid_batch, "empty batch");
    refused({{1, 20, 0, true}, {512, 21, 0, true}}, ErrorCode::bad_token, "token id = n_vocab");
    refused({{-1, 20, 0, true}}, ErrorCode::bad_token, "negative token id");
    refused({{1, 20, -1, true}}, ErrorCode::bad_sequence, "negative sequence id");
    refused({{1, 20, 256, true}}, ErrorCode::bad_sequence, "sequence id 256");
    refused({{1, 20, 0, true, {1, 300}}}, ErrorCode::bad_sequence, "extra sequence id 300");
    refused({{1, -3, 0, true}}, ErrorCode::invalid_batch, "negative position");
    refused({{1, 19, 0, true}}, ErrorCode::position_order, "a position the cache holds");
    refused({{1, 5, 0, true}}, ErrorCode::position_order, "going backwards from the cache");
    refused({{1, 20, 0, false}, {2, 21, 0, false}, {3, 21, 0, true}}, ErrorCode::position_order, "duplicate in batch");
    refused({{1, 22, 0, false}, {2, 21, 0, true}}, ErrorCode::position_order, "backwards in the batch");
    refused({{1, 5, 2, false, {1}}}, ErrorCode::position_order, "shared token behind one of its sequences");
    std::vector<BatchToken> too_many;
    for (int32_t i = 0; i < 35; ++i) too_many.push_back({1, 20 + i, 0, false});
    refused(too_many, ErrorCode::context_full, "35 tokens for 34 free cells");
    too_many.resize(65);
    refused(too_many, ErrorCode::invalid_batch, "larger than n_batch");
    // Refused cache operations too.
    try {
        ctx.seq_add(0, 10, -1, -5);  // 10.. onto 5..9, which the sequence keeps
        ADD_FAILURE() << "colliding shift accepted";
    } catch (const Error &e) {
        EXPECT_EQ(e.code(), ErrorCode::position_order) << e.what();
    }
    EXPECT_THROW(ctx.seq_add(0, 0, -1, 2147483640), Error);  // positions would overflow
    EXPECT_THROW(ctx.seq_cp(0, 256, 0, -1), Error);
    EXPECT_THROW(ctx.seq_keep(-1), Error);
    EXPECT_EQ(ctx.cache_digest(), digest);
    // Accepted afterwards: continuing equals a fresh run.
    const auto ids = random_ids(20, 30), next = random_ids(3, 32);
    const Logits got = decode_last(ctx, next, 0, 20);
    Context fresh = make(64, 8);
    EXPECT_LT(rel_error(got, decode_last(fresh, concat(ids, next))), 1e-5);
}

TEST_P(Serving, ShiftOfSharedCellsNeedsFreeCells) {
    Context ctx = make(64);
    decode_all(ctx, random_ids(40, 33));
    ctx.seq_cp(0, 1, 0, -1);
    const uint64_t digest = ctx.cache_digest();
    try {
        ctx.seq_add(1, 0, -1, 3);  // 40 shared cells to split, 24 free
        ADD_FAILURE() << "accepted";
    } catch (const Error &e) {
        EXPECT_EQ(e.code(), ErrorCode::context_full) << e.what();
    }
    EXPECT_EQ(ctx.cache_digest(), digest);
    ctx.seq_add(1, 20, -1, 3);  // 20 cells: fits
    EXPECT_EQ(ctx.n_cells_used(), 60);
    EXPECT_EQ(ctx.seq_pos_max(1), 42);
    EXPECT_EQ(ctx.seq_pos_max(0), 39);
}

INSTANTIATE_TEST_SUITE_P(Archs, Serving, ::testing::Values("llama", "deepseek32", "glm-dsa"),
                         [](const auto &p) { return p.param == "glm-dsa" ? std::string("glm_dsa") : p.param; });

// Attention sinks (deepseek32): the first N present positions of each query's own sequence are always
// selected, within top-k.
TEST(ServingSinks, FirstPositionsOfTheQuerysOwnSequenceAreAlwaysSelected) {
    const std::string dir = test::make_temp_dir("sparrow-sink-");
    write_synthetic_model(synthetic_defaults("deepseek32"), dir + "/m.gguf");
    auto model = load_model(dir + "/m.gguf");
    ContextParams cp;
    cp.n_ctx = 512;
    cp.n_threads = 2;
    cp.dsa_top_k = 32;
    cp.dsa_sink = 4;
    cp.record_selections = true;
    Context ctx(model, cp);
    decode_all(ctx, random_ids(80, 34), 0);
    decode_all(ctx, random_ids(60, 35), 1, 100);  // sequence 1 starts at position 100
    ctx.seq_rm(0, 0, 3);                          // sequence 0's first present positions are now 3..6
    std::vector<BatchToken> step = {{5, 80, 0, true}, {6, 160, 1, true}};
    ctx.decode(step);
    const std::vector<std::vector<int32_t>> want_sinks = {{3, 4, 5, 6}, {100, 101, 102, 103}};
    for (const LayerSelection &l : ctx.last_selections()) {
        ASSERT_FALSE(l.dense);
        ASSERT_EQ(l.queries.size(), 2u);
        for (size_t q = 0; q < 2; ++q) {
            const auto &keys = l.queries[q].keys;
            EXPECT_EQ(keys.size(), 32u);
            EXPECT_EQ(std::vector<int32_t>(keys.begin(), keys.begin() + 4), want_sinks[q]) << "layer " << l.layer;
        }
    }
    cp.dsa_sink = -1;
    EXPECT_THROW(Context(model, cp), Error);
    cp.dsa_sink = 0;
    cp.dsa_top_k = -1;  // was taken as 0, the model's top-k
    EXPECT_THROW(Context(model, cp), Error);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sparrow
