#include "model/synthetic.h"

#include <cmath>
#include <random>

#include "core/error.h"
#include "gguf/gguf.h"

namespace sparrow {

namespace {

using gguf::Value;
using gguf::ValueType;

// llama.cpp's general.file_type for a file whose matrices are mostly of type t.
uint32_t file_type_of(DType t) {
    switch (t) {
        case DType::F32: return 0;
        case DType::F16: return 1;
        case DType::Q4_0: return 2;
        case DType::Q8_0: return 7;
        case DType::BF16: return 32;
        default: throw_error("make-model: weight type %s is not supported", std::string(dtype_name(t)).c_str());
    }
}

class TensorSink {
  public:
    TensorSink(gguf::Writer &w, DType type, uint64_t seed) : w_(w), type_(type), rng_(seed) {}

    // A matrix [n_rows, n_cols] with entries N(0, scale^2 / n_cols): unit-variance inputs give outputs of
    // variance scale^2.
    void matrix(const std::string &name, int64_t n_cols, int64_t n_rows, float scale = 1.0f) {
        std::normal_distribution<float> dist(0.0f, scale / std::sqrt(static_cast<float>(n_cols)));
        std::vector<float> x(static_cast<size_t>(n_cols * n_rows));
        for (auto &v : x) v = dist(rng_);
        const DType t = n_cols % dtype_info(type_).block_size == 0 ? type_ : DType::F32;
        std::vector<uint8_t> bytes(static_cast<size_t>(dtype_row_size(t, n_cols) * n_rows));
        for (int64_t r = 0; r < n_rows; ++r) {
            quantize_row(t, x.data() + r * n_cols, bytes.data() + r * dtype_row_size(t, n_cols), n_cols);
        }
        w_.add_tensor(name, t, {n_cols, n_rows}, bytes.data(), bytes.size());
    }
    // A norm weight around 1 (f32, as llama.cpp's converter keeps norms).
    void norm(const std::string &name, int64_t n) {
        std::normal_distribution<float> dist(1.0f, 0.1f);
        std::vector<float> x(static_cast<size_t>(n));
        for (auto &v : x) v = dist(rng_);
        w_.add_tensor(name, DType::F32, {n}, x.data(), x.size() * sizeof(float));
    }

  private:
    gguf::Writer &w_;
    DType type_;
    std::mt19937_64 rng_;
};

void write_vocab(gguf::Writer &w, int64_t n_vocab) {
    const SyntheticVocab v = make_synthetic_vocab(n_vocab);
    std::vector<Value> tokens, types, merges;
    for (const auto &t : v.tokens) tokens.push_back(Value::str(t));
    for (int32_t t : v.token_types) types.push_back(Value::i32(t));
    for (const auto &m : v.merges) merges.push_back(Value::str(m));
    w.set("tokenizer.ggml.model", Value::str("gpt2"));
    w.set("tokenizer.ggml.pre", Value::str("default"));
    w.set("tokenizer.ggml.tokens", Value::array(ValueType::STRING, std::move(tokens)));
    w.set("tokenizer.ggml.token_type", Value::array(ValueType::INT32, std::move(types)));
    w.set("tokenizer.ggml.merges", Value::array(ValueType::STRING, std::move(merges)));
    w.set("tokenizer.ggml.bos_token_id", Value::u32(static_cast<uint32_t>(v.bos_id)));
    w.set("tokenizer.ggml.eos_token_id", Value::u32(static_cast<uint32_t>(v.eos_id)));
    w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));
}

void write_llama(const SyntheticParams &p, gguf::Writer &w) {
    if (p.n_embd % p.n_head || p.n_head % p.n_head_kv || (p.n_embd / p.n_head) % 2) {
        throw_error(
            "make-model: n_embd %lld, n_head %lld, n_head_kv %lld do not give an even head size shared "
            "by whole KV groups",
            (long long)p.n_embd, (long long)p.n_head, (long long)p.n_head_kv);
    }
    const int64_t head_dim = p.n_embd / p.n_head;
    const std::string a = "llama";
    w.set("general.architecture", Value::str(a));
    w.set("general.name", Value::str("sparrow synthetic llama"));
    w.set("general.file_type", Value::u32(file_type_of(p.type)));
    w.set(a + ".context_length", Value::u32(static_cast<uint32_t>(p.n_ctx_train)));
    w.set(a + ".embedding_length", Value::u32(static_cast<uint32_t>(p.n_embd)));
    w.set(a + ".block_count", Value::u32(static_cast<uint32_t>(p.n_layer)));
    w.set(a + ".feed_forward_length", Value::u32(static_cast<uint32_t>(p.n_ff)));
    w.set(a + ".attention.head_count", Value::u32(static_cast<uint32_t>(p.n_head)));
    w.set(a + ".attention.head_count_kv", Value::u32(static_cast<uint32_t>(p.n_head_kv)));
    w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(1e-5f));
    w.set(a + ".rope.dimension_count", Value::u32(static_cast<uint32_t>(head_dim)));
    w.set(a + ".rope.freq_base", Value::f32(10000.0f));
    w.set(a + ".vocab_size", Value::u32(static_cast<uint32_t>(p.n_vocab)));
    write_vocab(w, p.n_vocab);

    TensorSink s(w, p.type, p.seed);
    const int64_t q_dim = p.n_head * head_dim, kv_dim = p.n_head_kv * head_dim;
    // Embedding rows of unit variance; a larger output scale makes the next-token distribution peaked
    // rather than near uniform, so that comparisons between code paths are meaningful.
    s.matrix("token_embd.weight", p.n_embd, p.n_vocab, std::sqrt(static_cast<float>(p.n_embd)));
    s.norm("output_norm.weight", p.n_embd);
    if (!p.tied_output) s.matrix("output.weight", p.n_embd, p.n_vocab, 4.0f);
    for (int64_t il = 0; il < p.n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        s.norm(b + "attn_norm.weight", p.n_embd);
        s.matrix(b + "attn_q.weight", p.n_embd, q_dim, 2.0f);
        s.matrix(b + "attn_k.weight", p.n_embd, kv_dim, 2.0f);
        s.matrix(b + "attn_v.weight", p.n_embd, kv_dim);
        s.matrix(b + "attn_output.weight", q_dim, p.n_embd, 0.5f);
        s.norm(b + "ffn_norm.weight", p.n_embd);
        s.matrix(b + "ffn_gate.weight", p.n_embd, p.n_ff);
        s.matrix(b + "ffn_up.weight", p.n_embd, p.n_ff);
        s.matrix(b + "ffn_down.weight", p.n_ff, p.n_embd, 0.5f);
    }
}

}  // namespace

void write_synthetic_model(const SyntheticParams &p, const std::string &path) {
    if (p.n_vocab <= 0 || p.n_embd <= 0 || p.n_layer <= 0 || p.n_head <= 0 || p.n_head_kv <= 0 || p.n_ff <= 0) {
        throw_error("make-model: every size must be positive");
    }
    gguf::Writer w;
    if (p.arch == "llama") {
        write_llama(p, w);
    } else {
        throw_error("make-model: unknown architecture '%s' (available: llama)", p.arch.c_str());
    }
    w.write(path);
}

}  // namespace sparrow
