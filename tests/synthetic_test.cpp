// `make-model` for deepseek32 and glm-dsa (model/synthetic.h): the files parse, carry exactly the metadata
// keys and tensors (names, GGUF dims, types) that llama.cpp's converter writes for these architectures
// (as tests/reference/make_dsa_fixture.py documents them), for every weight type and option; plus the
// GGUF writer's generated (streamed) tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace sparrow {
namespace {

class SyntheticDsa : public ::testing::Test {
  protected:
    void SetUp() override { dir_ = test::make_temp_dir("sparrow-synth-"); }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    std::string path(const std::string &name) const { return dir_ + "/" + name; }
    std::string dir_;
};

struct Expected {
    std::vector<int64_t> ne;
    DType type;
};

// The tensors a file of parameters p must hold (mirrors make_dsa_fixture.build_fixture).
std::map<std::string, Expected> expected_tensors(const SyntheticParams &p) {
    std::map<std::string, Expected> t;
    const auto typed = [&](int64_t row) { return row % dtype_info(p.type).block_size == 0 ? p.type : DType::F32; };
    const auto mat = [&](const std::string &n, std::vector<int64_t> ne) { t[n] = {ne, typed(ne[0])}; };
    const auto f32 = [&](const std::string &n, std::vector<int64_t> ne) { t[n] = {std::move(ne), DType::F32}; };
    const int64_t E = p.n_embd, L = p.kv_lora_rank, hk = p.head_nope + p.n_rot;
    const std::vector<int> types = synthetic_indexer_types(p);
    mat("token_embd.weight", {E, p.n_vocab});
    f32("output_norm.weight", {E});
    if (!p.tied_output) mat("output.weight", {E, p.n_vocab});
    for (int64_t il = 0; il < p.n_layer + p.n_nextn; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        f32(b + "attn_norm.weight", {E});
        f32(b + "attn_q_a_norm.weight", {p.q_lora_rank});
        f32(b + "attn_kv_a_norm.weight", {L});
        mat(b + "attn_q_a.weight", {E, p.q_lora_rank});
        mat(b + "attn_q_b.weight", {p.q_lora_rank, p.n_head * hk});
        mat(b + "attn_kv_a_mqa.weight", {E, L + p.n_rot});
        mat(b + "attn_k_b.weight", {p.head_nope, L, p.n_head});
        mat(b + "attn_v_b.weight", {L, p.head_v, p.n_head});
        mat(b + "attn_output.weight", {p.n_head * p.head_v, E});
        f32(b + "ffn_norm.weight", {E});
        if (il >= p.n_layer || types.empty() || types[size_t(il)]) {
            f32(b + "indexer.k_norm.weight", {p.idx_head_dim});
            f32(b + "indexer.k_norm.bias", {p.idx_head_dim});
            f32(b + "indexer.proj.weight", {E, p.idx_n_head});
            mat(b + "indexer.attn_k.weight", {E, p.idx_head_dim});
            mat(b + "indexer.attn_q_b.weight", {p.q_lora_rank, p.idx_n_head * p.idx_head_dim});
        }
        if (il < p.n_dense_lead) {
            mat(b + "ffn_gate.weight", {E, p.n_ff});
            mat(b + "ffn_up.weight", {E, p.n_ff});
            mat(b + "ffn_down.weight", {p.n_ff, E});
        } else {
            f32(b + "ffn_gate_inp.weight", {E, p.n_expert});
            if (p.probs_bias) f32(b + "exp_probs_b.bias", {p.n_expert});
            mat(b + "ffn_gate_exps.weight", {E, p.n_ff_exp, p.n_expert});
            mat(b + "ffn_up_exps.weight", {E, p.n_ff_exp, p.n_expert});
            mat(b + "ffn_down_exps.weight", {p.n_ff_exp, E, p.n_expert});
            const int64_t ns = p.n_ff_exp * p.n_expert_shared;
            mat(b + "ffn_gate_shexp.weight", {E, ns});
            mat(b + "ffn_up_shexp.weight", {E, ns});
            mat(b + "ffn_down_shexp.weight", {ns, E});
        }
        if (il >= p.n_layer) {
            mat(b + "nextn.eh_proj.weight", {2 * E, E});
            f32(b + "nextn.enorm.weight", {E});
            f32(b + "nextn.hnorm.weight", {E});
            f32(b + "nextn.shared_head_norm.weight", {E});
        }
    }
    return t;
}

// Checks every key, value and type of the metadata, and the exact tensor set.
void check_file(const SyntheticParams &p, const std::string &file) {
    SCOPED_TRACE(p.arch + " " + std::string(dtype_name(p.type)) + " " + file);
    const gguf::File f = gguf::File::open(file);
    const std::string a = p.arch;
    const auto u32 = [&](const std::string &key, int64_t want) {
        const gguf::Value *v = f.find(key);
        ASSERT_NE(v, nullptr) << key;
        EXPECT_EQ(v->type, gguf::ValueType::UINT32) << key;
        EXPECT_EQ(v->as_int(key), want) << key;
    };
    const auto f32 = [&](const std::string &key, double want) {
        const gguf::Value *v = f.find(key);
        ASSERT_NE(v, nullptr) << key;
        EXPECT_EQ(v->type, gguf::ValueType::FLOAT32) << key;
        EXPECT_FLOAT_EQ(float(v->as_double(key)), float(want)) << key;
    };
    EXPECT_EQ(f.get_string("general.architecture"), a);
    const std::map<DType, int64_t> ftype = {
        {DType::F32, 0}, {DType::F16, 1}, {DType::Q4_0, 2}, {DType::Q8_0, 7}, {DType::BF16, 32}};
    u32("general.file_type", ftype.at(p.type));
    u32(a + ".vocab_size", p.n_vocab);
    u32(a + ".context_length", p.n_ctx_train);
    u32(a + ".embedding_length", p.n_embd);
    u32(a + ".block_count", p.n_layer + p.n_nextn);
    u32(a + ".feed_forward_length", p.n_ff);
    u32(a + ".attention.head_count", p.n_head);
    u32(a + ".attention.head_count_kv", 1);
    f32(a + ".attention.layer_norm_rms_epsilon", p.rms_eps);
    f32(a + ".rope.freq_base", p.freq_base);
    u32(a + ".rope.dimension_count", p.n_rot);
    u32(a + ".leading_dense_block_count", p.n_dense_lead);
    u32(a + ".attention.q_lora_rank", p.q_lora_rank);
    u32(a + ".attention.kv_lora_rank", p.kv_lora_rank);
    u32(a + ".attention.key_length", p.kv_lora_rank + p.n_rot);
    u32(a + ".attention.value_length", p.kv_lora_rank);
    u32(a + ".attention.key_length_mla", p.head_nope + p.n_rot);
    u32(a + ".attention.value_length_mla", p.head_v);
    u32(a + ".expert_feed_forward_length", p.n_ff_exp);
    u32(a + ".expert_count", p.n_expert);
    u32(a + ".expert_used_count", p.n_expert_used);
    u32(a + ".expert_shared_count", p.n_expert_shared);
    u32(a + ".expert_group_count", p.n_expert_groups);
    u32(a + ".expert_group_used_count", p.n_group_used);
    f32(a + ".expert_weights_scale", p.weights_scale);
    EXPECT_EQ(f.find(a + ".expert_weights_norm")->type, gguf::ValueType::BOOL);
    EXPECT_EQ(f.get_bool(a + ".expert_weights_norm"), p.weights_norm);
    u32(a + ".expert_gating_func", p.gating);
    u32(a + ".attention.indexer.head_count", p.idx_n_head);
    u32(a + ".attention.indexer.key_length", p.idx_head_dim);
    u32(a + ".attention.indexer.top_k", p.idx_top_k);
    if (p.n_nextn > 0) {
        u32(a + ".nextn_predict_layers", p.n_nextn);
    } else {
        EXPECT_FALSE(f.has(a + ".nextn_predict_layers"));
    }
    if (p.yarn) {
        EXPECT_EQ(f.get_string(a + ".rope.scaling.type"), "yarn");
        f32(a + ".rope.scaling.factor", p.yarn_factor);
        u32(a + ".rope.scaling.original_context_length", int64_t(p.n_ctx_train / p.yarn_factor));
        f32(a + ".rope.scaling.yarn_log_multiplier", 0.1);
    } else {
        EXPECT_FALSE(f.has(a + ".rope.scaling.type"));
        EXPECT_FALSE(f.has(a + ".rope.scaling.yarn_log_multiplier"));
    }
    const gguf::Array *types = f.get_array(a + ".attention.indexer.types");
    const std::vector<int> want_types = synthetic_indexer_types(p);
    if (want_types.empty()) {
        EXPECT_EQ(types, nullptr);
    } else {
        ASSERT_NE(types, nullptr);
        EXPECT_EQ(types->type, gguf::ValueType::BOOL);
        ASSERT_EQ(types->items.size(), want_types.size());
        for (size_t i = 0; i < want_types.size(); ++i) EXPECT_EQ(types->items[i].as_bool("types"), want_types[i] != 0);
    }
    // The byte-level BPE vocabulary of the llama generator.
    EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
    ASSERT_NE(f.get_array("tokenizer.ggml.tokens"), nullptr);
    EXPECT_EQ(int64_t(f.get_array("tokenizer.ggml.tokens")->items.size()), p.n_vocab);
    EXPECT_NE(f.get_array("tokenizer.ggml.merges"), nullptr);
    EXPECT_TRUE(f.has("tokenizer.ggml.bos_token_id"));
    EXPECT_TRUE(f.has("tokenizer.ggml.eos_token_id"));

    const auto want = expected_tensors(p);
    std::set<std::string> seen;
    for (const auto &t : f.tensors()) {
        seen.insert(t.name);
        const auto it = want.find(t.name);
        if (it == want.end()) {
            ADD_FAILURE() << "unexpected tensor " << t.name;
            continue;
        }
        EXPECT_EQ(t.ne, it->second.ne) << t.name;
        EXPECT_EQ(t.type, it->second.type) << t.name << ": " << dtype_name(t.type);
    }
    for (const auto &[name, e] : want) EXPECT_TRUE(seen.count(name)) << "missing tensor " << name;
}

TEST_F(SyntheticDsa, EveryArchAndTypeHasTheExpectedKeysAndTensors) {
    for (const char *arch : {"deepseek32", "glm-dsa"}) {
        for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
            SyntheticParams p = synthetic_defaults(arch);
            p.type = t;
            const std::string file = path(std::string(arch) + "-" + std::string(dtype_name(t)) + ".gguf");
            write_synthetic_model(p, file);
            check_file(p, file);
        }
    }
}

TEST_F(SyntheticDsa, TinyDefaultsAreAsDocumented) {
    const SyntheticParams d = synthetic_defaults("deepseek32");
    EXPECT_EQ(d.n_embd, 64);
    EXPECT_EQ(d.n_layer, 4);
    EXPECT_EQ(d.n_dense_lead, 1);
    EXPECT_EQ(d.n_expert_groups, 4);
    EXPECT_EQ(d.n_group_used, 2);
    EXPECT_EQ(d.idx_top_k, 64);
    EXPECT_EQ(d.n_vocab, 512);
    const SyntheticParams g = synthetic_defaults("glm-dsa");
    EXPECT_EQ(g.n_expert_groups, 1);
    EXPECT_EQ(synthetic_indexer_types(g), (std::vector<int>{1, 1, 1, 0}));
    EXPECT_EQ(synthetic_defaults("llama").n_layer, 2);  // llama keeps its own defaults
    const SyntheticParams b = synthetic_defaults("deepseek32", "bench");
    EXPECT_EQ(b.n_embd, 2048);
    EXPECT_EQ(b.idx_top_k, 2048);
    EXPECT_EQ(b.type, DType::Q8_0);
    EXPECT_THROW(synthetic_defaults("llama", "bench"), Error);
    EXPECT_THROW(synthetic_defaults("deepseek32", "huge"), Error);
    EXPECT_THROW(synthetic_defaults("qwen"), Error);
}

TEST_F(SyntheticDsa, OptionsNextnYarnIndexerTypesTiedNoBias) {
    {
        SyntheticParams p = synthetic_defaults("deepseek32");
        p.n_nextn = 2;
        p.yarn = true;
        p.idx_top_k = 16;
        p.tied_output = true;
        p.probs_bias = false;
        p.type = DType::Q8_0;
        write_synthetic_model(p, path("ds.gguf"));
        check_file(p, path("ds.gguf"));
    }
    {
        SyntheticParams p = synthetic_defaults("glm-dsa");
        p.n_layer = 7;
        p.n_nextn = 1;
        p.indexer_types = {1, 0, 1, 1, 0, 0, 1};
        write_synthetic_model(p, path("g1.gguf"));
        check_file(p, path("g1.gguf"));
        EXPECT_EQ(gguf::File::open(path("g1.gguf")).find_tensor("blk.1.indexer.proj.weight"), nullptr);
    }
    {
        SyntheticParams p = synthetic_defaults("glm-dsa");
        p.n_layer = 7;  // the default pattern: full at 0, 1, 2, 6
        write_synthetic_model(p, path("g2.gguf"));
        check_file(p, path("g2.gguf"));
        const gguf::File f = gguf::File::open(path("g2.gguf"));
        for (int il = 0; il < 7; ++il) {
            const bool full = il <= 2 || il == 6;
            EXPECT_EQ(f.find_tensor("blk." + std::to_string(il) + ".indexer.attn_k.weight") != nullptr, full) << il;
        }
    }
    {
        SyntheticParams p = synthetic_defaults("glm-dsa");
        p.indexer_types_absent = true;  // no key: every layer has an indexer
        write_synthetic_model(p, path("g3.gguf"));
        check_file(p, path("g3.gguf"));
    }
}

TEST_F(SyntheticDsa, RowsOffTheBlockSizeFallBackToF32) {
    SyntheticParams p = synthetic_defaults("deepseek32");
    p.type = DType::Q4_0;
    p.n_ff = 48;       // ffn_down rows of 48
    p.n_ff_exp = 40;   // ffn_down_exps rows of 40
    p.head_nope = 24;  // attn_k_b rows of 24
    write_synthetic_model(p, path("fb.gguf"));
    check_file(p, path("fb.gguf"));
    const gguf::File f = gguf::File::open(path("fb.gguf"));
    EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, DType::F32);
    EXPECT_EQ(f.find_tensor("blk.0.ffn_gate.weight")->type, DType::Q4_0);
    EXPECT_EQ(f.find_tensor("blk.1.ffn_down_exps.weight")->type, DType::F32);
    EXPECT_EQ(f.find_tensor("blk.1.attn_k_b.weight")->type, DType::F32);
    EXPECT_EQ(f.find_tensor("blk.1.attn_v_b.weight")->type, DType::Q4_0);
}

TEST_F(SyntheticDsa, DeterministicPerSeedAndScaledAsDocumented) {
    SyntheticParams p = synthetic_defaults("deepseek32");
    write_synthetic_model(p, path("a.gguf"));
    write_synthetic_model(p, path("b.gguf"));
    p.seed = 43;
    write_synthetic_model(p, path("c.gguf"));
    const auto bytes = [&](const std::string &n) {
        std::ifstream in(path(n), std::ios::binary);
        return std::vector<char>(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(bytes("a.gguf"), bytes("b.gguf"));
    EXPECT_NE(bytes("a.gguf"), bytes("c.gguf"));
    // Standard deviations: embeddings 1, a plain matrix 1/sqrt(n_in), norms around 1.
    const gguf::File f = gguf::File::open(path("a.gguf"));
    const auto stats = [&](const std::string &name) {
        const gguf::TensorInfo *t = f.find_tensor(name);
        std::vector<float> x(static_cast<size_t>(t->n_elements));
        dequantize_row(t->type, t->data, x.data(), t->n_elements);
        double s = 0, s2 = 0;
        for (float v : x) s += v, s2 += double(v) * v;
        const double mean = s / double(x.size());
        return std::pair{mean, std::sqrt(s2 / double(x.size()) - mean * mean)};
    };
    EXPECT_NEAR(stats("token_embd.weight").second, 1.0, 0.02);
    EXPECT_NEAR(stats("token_embd.weight").first, 0.0, 0.02);
    EXPECT_NEAR(stats("blk.1.ffn_gate_exps.weight").second, 1.0 / 8.0, 0.005);
    EXPECT_NEAR(stats("blk.1.attn_norm.weight").first, 1.0, 0.05);
}

TEST_F(SyntheticDsa, RejectsInconsistentParameters) {
    const auto bad = [&](const char *arch, auto edit) {
        SyntheticParams p = synthetic_defaults(arch);
        edit(p);
        EXPECT_THROW(write_synthetic_model(p, path("bad.gguf")), Error);
    };
    bad("deepseek32", [](SyntheticParams &p) { p.n_expert_groups = 3; });
    bad("deepseek32", [](SyntheticParams &p) { p.n_expert_used = 9; });
    bad("deepseek32", [](SyntheticParams &p) { p.n_group_used = 1, p.n_expert_used = 3; });
    bad("deepseek32", [](SyntheticParams &p) { p.n_group_used = 4; });  // all groups kept: llama.cpp asserts
    bad("deepseek32", [](SyntheticParams &p) { p.n_rot = 15; });
    bad("deepseek32", [](SyntheticParams &p) { p.n_rot = 64; });  // wider than an indexer head
    bad("deepseek32", [](SyntheticParams &p) { p.gating = 5; });
    bad("deepseek32", [](SyntheticParams &p) { p.indexer_types = {1, 1, 1, 1}; });
    bad("glm-dsa", [](SyntheticParams &p) { p.yarn = true; });
    bad("glm-dsa", [](SyntheticParams &p) { p.indexer_types = {1, 1, 0}; });  // 4 layers
    bad("glm-dsa", [](SyntheticParams &p) { p.indexer_types = {0, 1, 1, 1}; });
    bad("glm-dsa", [](SyntheticParams &p) { p.indexer_types = {1, 2, 1, 1}; });
    bad("glm-dsa", [](SyntheticParams &p) { p.n_dense_lead = 5; });
}

TEST(GgufWriter, GeneratedTensorsWriteLikeCopiedOnes) {
    std::vector<uint8_t> a(34 * 4), b(64 * 3 * 4);
    for (size_t i = 0; i < a.size(); ++i) a[i] = uint8_t(i * 7);
    for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(i * 13 + 1);
    gguf::Writer copied, generated;
    for (gguf::Writer *w : {&copied, &generated}) w->set("general.alignment", gguf::Value::u32(64));
    copied.add_tensor("a", DType::Q8_0, {64, 2}, a.data(), a.size());
    copied.add_tensor("b", DType::F32, {64, 3}, b.data(), b.size());
    int calls = 0;
    generated.add_tensor("a", DType::Q8_0, {64, 2}, [&](uint8_t *dst, size_t n) {
        ASSERT_EQ(n, a.size());
        std::copy(a.begin(), a.end(), dst);
        ++calls;
    });
    generated.add_tensor("b", DType::F32, {64, 3}, [&](uint8_t *dst, size_t n) {
        ASSERT_EQ(n, b.size());
        std::copy(b.begin(), b.end(), dst);
        ++calls;
    });
    EXPECT_EQ(generated.to_bytes(), copied.to_bytes());
    const std::string dir = test::make_temp_dir("sparrow-gw-");
    generated.write(dir + "/g.gguf");
    std::ifstream in(dir + "/g.gguf", std::ios::binary);
    const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(file, copied.to_bytes());
    EXPECT_EQ(calls, 4);
    const gguf::File f = gguf::File::open(dir + "/g.gguf");
    EXPECT_EQ(f.tensors().size(), 2u);
    std::filesystem::remove_all(dir);
    EXPECT_THROW(generated.add_tensor("c", DType::Q8_0, {48, 1}, [](uint8_t *, size_t) {}), Error);
    EXPECT_THROW(generated.add_tensor("a", DType::F32, {4}, [](uint8_t *, size_t) {}), Error);
}

}  // namespace
}  // namespace sparrow
