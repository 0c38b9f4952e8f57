// Weights repacked at load (Q8_0, Q4_0, MXFP4, Q2_K ... Q6_K, IQ4_XS; ModelParams::repack, kernels/ops.h
// WeightMatrix::rows8) through the public API, for every architecture and type: the packed model computes what the
// file's rows compute (the same integer block dots, only a different f32 summation order), sequences in one batch still
// equal each alone, and the loader reports what it packed. The kernels themselves are checked in kernels_test.cpp. Also
// the loader's other owned memory: norm vectors stored as f16 are converted at load and must live as long as the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"
#include "model/synthetic.h"
#include "model/weights.h"
#include "sparrow/sparrow.h"
#include "test_util.h"

namespace sparrow {
namespace {

using test::rel_error;

class Repack : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        dir_ = test::make_temp_dir("sparrow-repack-");
        for (const DType t : {DType::Q8_0, DType::Q4_0, DType::MXFP4, DType::Q2_K, DType::Q3_K, DType::Q4_K,
                              DType::Q5_K, DType::Q6_K, DType::IQ4_XS}) {
            SyntheticParams p = synthetic_defaults(GetParam());
            p.type = t;
            // K-quants: a residual stream of one super-block, so the matrices that read it are K-quant rows (the
            // others fall back to 32-element types, as llama.cpp writes them, and are not packed).
            if (dtype_dots_q8_k(t)) p.n_embd = 256;
            p.tied_output = GetParam() == "llama";  // one packed table serves the embedding lookup and the head
            paths_.push_back(dir_ + "/m_" + std::string(dtype_name(t)) + ".gguf");
            types_.push_back(t);
            write_synthetic_model(p, paths_.back());
            n_vocab_ = p.n_vocab;
        }
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }

    Context make_context(const std::shared_ptr<const Model> &model, int64_t dsa_top_k = 0) const {
        ContextParams cp;
        cp.dsa_top_k = dsa_top_k;
        cp.n_ctx = 512;
        cp.n_ubatch = 64;
        cp.n_threads = 2;
        cp.cache_type_k = cp.cache_type_v = CacheType::f32;
        return Context(model, cp);
    }
    std::vector<int32_t> random_ids(size_t n, uint32_t seed) const {
        std::mt19937 rng(seed);
        std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(n_vocab_) - 1);
        std::vector<int32_t> ids(n);
        for (auto &id : ids) id = d(rng);
        return ids;
    }
    // Logits of the last token of each sequence, all decoded in one batch with their tokens interleaved.
    std::vector<std::vector<float>> decode_together(Context &ctx, const std::vector<std::vector<int32_t>> &seqs) const {
        std::vector<BatchToken> batch;
        std::vector<size_t> last(seqs.size());
        size_t longest = 0;
        for (const auto &s : seqs) longest = std::max(longest, s.size());
        for (size_t i = 0; i < longest; ++i) {
            for (size_t s = 0; s < seqs.size(); ++s) {
                if (i >= seqs[s].size()) continue;
                const bool is_last = i + 1 == seqs[s].size();
                batch.push_back({seqs[s][i], static_cast<int32_t>(i), static_cast<int32_t>(s), is_last});
                if (is_last) last[s] = batch.size() - 1;
            }
        }
        ctx.decode(batch);
        std::vector<std::vector<float>> out;
        for (size_t s = 0; s < seqs.size(); ++s) {
            const auto l = ctx.logits(last[s]);
            out.emplace_back(l.begin(), l.end());
        }
        return out;
    }

    std::string dir_;
    std::vector<std::string> paths_;  // the model in q8_0, q4_0, q2_k ... q6_k, iq4_xs
    std::vector<DType> types_;        // the type of each
    int64_t n_vocab_ = 0;
};

TEST_P(Repack, PackedWeightsComputeWhatTheFileRowsCompute) {
    // Activations are rounded to Q8_0 integers before every product, so a difference in the last bit of an
    // f32 sum can move one activation by a whole quantisation step or flip a MoE routing choice; attention
    // then carries it to every later token of the sequence. On these tiny models that happens every few
    // dozen tokens, both between packed and unpacked rows and between the scalar and AVX2 levels with the
    // same rows (up to 4% logit error seen). So: many short sequences, each its own experiment; most must agree
    // to f32 rounding and none may be far off. A packing fault (a row, scale or element in the wrong place)
    // puts every sequence far off.
    for (size_t m = 0; m < paths_.size(); ++m) {
        const std::string &path = paths_[m];
        ModelParams as_stored;
        as_stored.repack = false;
        const auto packed = load_model(path), plain = load_model(path, as_stored);
        EXPECT_GT(model_info(*packed).n_repacked_bytes, 0) << path;
        EXPECT_LE(model_info(*packed).n_repacked_bytes, model_info(*packed).n_weight_bytes) << path;
        EXPECT_EQ(model_info(*plain).n_repacked_bytes, 0) << path;
        std::vector<std::vector<int32_t>> seqs;
        for (uint32_t k = 0; k < 24; ++k) seqs.push_back(random_ids(6, 100 + k));
        Context a = make_context(packed), b = make_context(plain);
        const auto la = decode_together(a, seqs), lb = decode_together(b, seqs);
        int n_close = 0;
        for (size_t s = 0; s < seqs.size(); ++s) {
            const double e = rel_error(la[s], lb[s]);
            n_close += e < 1e-5;
            EXPECT_LT(e, 0.1) << path << " sequence " << s;
        }
        // K-quant models have a residual stream of 256 (four times as many activations rounded per product, to
        // Q8_K's one scale per 256), and flip more often: 19-24 of 24 measured on deepseek32, the others 1e-3 to 0.02
        // off.
        const int n_close_min = dtype_dots_q8_k(types_[m]) ? 16 : 20;
        EXPECT_GE(n_close, n_close_min) << path << ": sequences within 1e-5 of the unpacked run, of 24";
    }
}

TEST_P(Repack, SequencesInOneBatchEqualEachAloneWithPackedWeights) {
    for (const std::string &path : paths_) {
        const auto model = load_model(path);
        ASSERT_GT(model_info(*model).n_repacked_bytes, 0) << path;
        const std::vector<std::vector<int32_t>> seqs = {random_ids(90, 3), random_ids(13, 4), random_ids(70, 5)};
        Context together = make_context(model);
        const auto got = decode_together(together, seqs);
        for (size_t s = 0; s < seqs.size(); ++s) {
            Context alone = make_context(model);
            EXPECT_LT(rel_error(got[s], decode_together(alone, {seqs[s]})[0]), 1e-6) << path << " sequence " << s;
        }
    }
}

TEST_P(Repack, SkippedWhenTheWeightsWouldNotFitTheMemoryLimit) {
    const std::string &path = paths_[0];
    ModelParams tight;
    tight.repack_memory_limit = 1024;  // bytes: less than any model's q8_0 weights
    const auto skipped = load_model(path, tight);
    EXPECT_EQ(model_info(*skipped).n_repacked_bytes, 0);
    EXPECT_NE(model_info(*skipped).repack_note.find("not repacked"), std::string::npos);
    ModelParams roomy;
    roomy.repack_memory_limit = int64_t(1) << 40;
    const auto packed = load_model(path, roomy);
    EXPECT_GT(model_info(*packed).n_repacked_bytes, 0);
    EXPECT_TRUE(model_info(*packed).repack_note.empty());
    // The default limit (3/4 of available memory) repacks a model this small.
    EXPECT_GT(model_info(*load_model(path)).n_repacked_bytes, 0);
}

TEST(Loader, NormVectorsStoredAsF16LiveAsLongAsTheModel) {
    // The same model with every norm weight stored as f16 (converted to f32 at load, into the loader's memory).
    // The loader used to be a local of the model's constructor, so those vectors were read after being freed
    // (AddressSanitizer reports it; without it the logits are usually garbage).
    const std::string dir = test::make_temp_dir("sparrow-f16-norms-");
    SyntheticParams p = synthetic_defaults("deepseek32");
    const std::string f32_path = dir + "/f32.gguf", f16_path = dir + "/f16_norms.gguf";
    write_synthetic_model(p, f32_path);
    {
        const gguf::File f = gguf::File::open(f32_path);
        gguf::Writer w;
        for (const auto &[key, value] : f.metadata()) w.set(key, value);
        int n_converted = 0;
        for (const gguf::TensorInfo &t : f.tensors()) {
            const bool norm = t.name.find("norm.weight") != std::string::npos && t.ne.size() == 1;
            if (!norm || t.type != DType::F32) {
                w.add_tensor(t.name, t.type, t.ne, t.data, static_cast<size_t>(t.n_bytes));
                continue;
            }
            std::vector<uint16_t> half(static_cast<size_t>(t.n_elements));
            quantize_row(DType::F16, reinterpret_cast<const float *>(t.data), half.data(), t.n_elements);
            w.add_tensor(t.name, DType::F16, t.ne, half.data(), half.size() * sizeof(uint16_t));
            ++n_converted;
        }
        ASSERT_GT(n_converted, 3);
        w.write(f16_path);
    }
    std::vector<int32_t> ids(30);
    std::mt19937 rng(9);
    for (auto &id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(p.n_vocab));
    auto logits_of = [&](const std::string &path) {
        const auto model = load_model(path);
        ContextParams cp;
        cp.n_ctx = 64;
        cp.n_threads = 2;
        Context ctx(model, cp);
        std::vector<BatchToken> batch;
        for (size_t i = 0; i < ids.size(); ++i)
            batch.push_back({ids[i], static_cast<int32_t>(i), 0, i + 1 == ids.size()});
        ctx.decode(batch);
        const auto l = ctx.logits(ids.size() - 1);
        return std::vector<float>(l.begin(), l.end());
    };
    // f16 norm weights differ from the f32 ones by at most 2^-11 relative.
    EXPECT_LT(rel_error(logits_of(f16_path), logits_of(f32_path)), 0.02);
    std::filesystem::remove_all(dir);
}

TEST(Loader, PacksNothingUntilTheModelHasPassedItsChecks) {
    // A file the model refuses after taking its matrices (a tensor nobody reads, a vocabulary that does not match)
    // must fail before the packing, which takes minutes on a real model: taking a matrix only places it.
    const std::string dir = test::make_temp_dir("sparrow-pack-later-");
    SyntheticParams p = synthetic_defaults("llama");
    p.type = DType::Q8_0;
    const std::string path = dir + "/q8_0.gguf";
    write_synthetic_model(p, path);
    const gguf::File f = gguf::File::open(path);
    const gguf::TensorInfo *t = f.find_tensor("blk.0.ffn_up.weight");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->type, DType::Q8_0);
    const int64_t n_cols = t->ne[0], n_rows = t->ne[1];
    WeightLoader loader(f, /*repack=*/true);
    const WeightMatrix m = loader.matrix(t->name, n_cols, n_rows);
    ASSERT_TRUE(m.rows8);
    ASSERT_NE(m.data, t->data);
    const auto *placed = static_cast<const uint8_t *>(m.data);
    const size_t n_bytes = static_cast<size_t>(m.n_rows * m.row_bytes);
    EXPECT_TRUE(std::all_of(placed, placed + n_bytes, [](uint8_t b) { return b == 0; })) << "packed before pack()";
    loader.pack();
    // Now every row unpacks to the file's bytes.
    std::vector<uint8_t> row(static_cast<size_t>(m.row_bytes));
    for (int64_t r = 0; r < n_rows; ++r) {
        unpack_row8(m.type, m.data, r, n_cols, row.data());
        ASSERT_EQ(std::memcmp(row.data(), static_cast<const uint8_t *>(t->data) + r * m.row_bytes, row.size()), 0)
            << "row " << r;
    }
    std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, Repack, ::testing::Values("llama", "deepseek32", "glm-dsa"),
                         [](const ::testing::TestParamInfo<std::string> &p) {
                             std::string name = p.param;
                             for (char &c : name) c = c == '-' ? '_' : c;
                             return name;
                         });

}  // namespace
}  // namespace sparrow
