#include "model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"
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
        case DType::Q4_1: return 3;
        case DType::Q5_0: return 8;
        case DType::Q5_1: return 9;
        case DType::IQ4_NL: return 25;
        case DType::Q2_K: return 10;    // LLAMA_FTYPE_MOSTLY_Q2_K
        case DType::Q3_K: return 11;    // LLAMA_FTYPE_MOSTLY_Q3_K_S
        case DType::Q4_K: return 14;    // LLAMA_FTYPE_MOSTLY_Q4_K_S
        case DType::Q5_K: return 16;    // LLAMA_FTYPE_MOSTLY_Q5_K_S
        case DType::Q6_K: return 18;    // LLAMA_FTYPE_MOSTLY_Q6_K
        case DType::IQ4_XS: return 30;  // LLAMA_FTYPE_MOSTLY_IQ4_XS
        case DType::MXFP4: return 38;   // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
        default: throw_error("make-model: weight type %s is not supported", std::string(dtype_name(t)).c_str());
    }
}

// The type a matrix with rows of n_cols is stored in when the file's type is t: t where its blocks fit the row;
// else, for K-quants and IQ4_XS (super-blocks of 256), the 32-element type llama.cpp's quantiser falls back to (Q2_K,
// Q3_K and IQ4_XS: IQ4_NL, Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0); else f32.
DType storage_type(DType t, int64_t n_cols) {
    if (n_cols % dtype_info(t).block_size == 0) return t;
    if (dtype_dots_q8_k(t) && n_cols % QK8_0 == 0) {
        switch (t) {
            case DType::Q2_K:
            case DType::Q3_K:
            case DType::IQ4_XS: return DType::IQ4_NL;
            case DType::Q4_K: return DType::Q5_0;
            case DType::Q5_K: return DType::Q5_1;
            default: return DType::Q8_0;
        }
    }
    return DType::F32;
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
        const DType t = storage_type(type_, n_cols);
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

void write_vocab(gguf::Writer &w, int64_t n_vocab, bool fim, bool fim_keys) {
    const SyntheticVocab v = make_synthetic_vocab(n_vocab, fim);
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
    if (fim && fim_keys) {  // the three FIM tokens follow EOS
        w.set("tokenizer.ggml.fim_pre_token_id", Value::u32(static_cast<uint32_t>(v.eos_id + 1)));
        w.set("tokenizer.ggml.fim_suf_token_id", Value::u32(static_cast<uint32_t>(v.eos_id + 2)));
        w.set("tokenizer.ggml.fim_mid_token_id", Value::u32(static_cast<uint32_t>(v.eos_id + 3)));
    }
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
    write_vocab(w, p.n_vocab, p.fim_tokens, /*fim_keys=*/true);

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

// Gains of the DSA weights (see write_dsa).
constexpr float kGainQ = 2.0f, kGainKv = 1.5f, kGainKb = 1.5f, kGainAttnOut = 0.7f, kGainIdx = 1.5f, kGainDown = 0.5f,
                kGainRouter = 2.0f, kGainOutput = 6.0f;

// --- deepseek32 / glm-dsa -------------------------------------------------------------------------------------
// Weights come from a counter-based generator (splitmix64 of the tensor's seed and a chunk index), so they
// are cheap, independent of the thread count, and produced tensor by tensor while the file is written.

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t name_seed(uint64_t seed, const std::string &name) {
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
    return splitmix64(seed ^ h);
}

// Approximately N(0, 1): the sum of four 16-bit uniforms of one 64-bit draw, standardised (Irwin-Hall).
inline float approx_normal(uint64_t r) {
    const uint32_t sum =
        uint32_t(r & 0xffff) + uint32_t((r >> 16) & 0xffff) + uint32_t((r >> 32) & 0xffff) + uint32_t(r >> 48);
    return (static_cast<float>(sum) - 131070.0f) * (1.0f / 37837.23f);
}

// Channels of a generated tensor multiplied by a factor after generation: columns (elements within each
// row) and rows, where row r is scaled when r % row_period is in `rows` (a stack of per-head matrices).
struct Scaled {
    std::vector<int64_t> cols;
    std::vector<int64_t> rows;
    int64_t row_period = 1;
    float factor = 1.0f;
};
Scaled scale_cols(std::vector<int64_t> cols, float factor) { return Scaled{std::move(cols), {}, 1, factor}; }
Scaled scale_rows(std::vector<int64_t> rows, int64_t period, float factor) {
    return Scaled{{}, std::move(rows), period, factor};
}

// `count` distinct channels in [lo, hi), picked from (seed, layer) alone so that every tensor of the layer
// that must agree on them (the scaled norm and the compensating weights) gets the same ones.
std::vector<int64_t> pick_channels(uint64_t seed, int64_t layer, const char *what, int64_t lo, int64_t hi,
                                   int64_t count) {
    std::vector<int64_t> out;
    uint64_t state = name_seed(seed, std::string("outliers.") + what + "." + std::to_string(layer));
    while (static_cast<int64_t>(out.size()) < std::min(count, hi - lo)) {
        state = splitmix64(state);
        const int64_t c = lo + static_cast<int64_t>(state % static_cast<uint64_t>(hi - lo));
        if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
    return out;
}

class StreamSink {
  public:
    StreamSink(gguf::Writer &w, DType type, DType stack_type, uint64_t seed, ThreadPool &pool)
        : w_(w), type_(type), stack_type_(stack_type), seed_(seed), pool_(pool) {}

    // A weight of GGUF dims ne (ne[0] = row length) with entries N(0, (gain / sqrt(n_in))^2): unit-variance
    // inputs give outputs of variance gain^2; n_in = ne[0] (a 3-D stack is a stack of such matrices).
    // keep_f32: stored f32 whatever the model's type (ffn_gate_inp, indexer.proj, as llama.cpp's converter
    // keeps them). A stack (ne[2] > 1) takes the stack type.
    void weight(const std::string &name, std::vector<int64_t> ne, float gain, bool keep_f32 = false,
                Scaled scaled = {}) {
        const bool stack = ne.size() > 2 && ne[2] > 1;
        const int64_t n_cols = ne[0];
        int64_t n_rows = 1;
        for (size_t i = 1; i < ne.size(); ++i) n_rows *= ne[i];
        const DType t = keep_f32 ? DType::F32 : storage_type(stack ? stack_type_ : type_, n_cols);
        const float stddev = gain / std::sqrt(static_cast<float>(n_cols));
        add(name, t, std::move(ne), n_cols, n_rows, 0.0f, stddev, std::move(scaled));
    }
    // An f32 vector with entries N(mean, spread^2) (norm weights around 1, biases around 0).
    void vector(const std::string &name, int64_t n, float mean, float spread, Scaled scaled = {}) {
        add(name, DType::F32, {n}, n, 1, mean, spread, std::move(scaled));
    }

    // The experts' gate and up stacks (GGUF dims {n_embd, n_ff, n_expert} each, named gate_name and up_name) fused
    // into one tensor `name` of dims {n_embd, 2 * n_ff, n_expert}: per expert its gate rows, then its up rows, with
    // the values `weight` would give the two tensors (the same seeds), so a fused file is the separate one's twin.
    void fused_stack(const std::string &name, const std::string &gate_name, const std::string &up_name,
                     std::vector<int64_t> ne, float gain) {
        const int64_t n_cols = ne[0], n_ff = ne[1], n_expert = ne[2];
        const DType t = storage_type(n_expert > 1 ? stack_type_ : type_, n_cols);  // as weight() types a stack
        const float stddev = gain / std::sqrt(static_cast<float>(n_cols));
        const uint64_t gate_seed = name_seed(seed_, gate_name), up_seed = name_seed(seed_, up_name);
        w_.add_tensor(name, t, {n_cols, 2 * n_ff, n_expert}, [=](uint8_t *dst, size_t) {
            const int64_t row_bytes = dtype_row_size(t, n_cols), rows_per_chunk = chunk_rows(n_cols);
            std::vector<float> x(static_cast<size_t>(rows_per_chunk * n_cols));
            const int64_t n_rows = n_ff * n_expert;  // of each separate stack
            for (int part = 0; part < 2; ++part) {
                for (int64_t c = 0; c * rows_per_chunk < n_rows; ++c) {
                    const int64_t r0 = c * rows_per_chunk, r1 = std::min(n_rows, r0 + rows_per_chunk);
                    fill_chunk(x.data(), part == 0 ? gate_seed : up_seed, c, r0, r1, n_cols, 0.0f, stddev, {});
                    for (int64_t r = r0; r < r1; ++r) {  // row r of the part: expert r / n_ff, its row r % n_ff
                        const int64_t out = (r / n_ff * 2 + part) * n_ff + r % n_ff;
                        quantize_row(t, x.data() + (r - r0) * n_cols, dst + out * row_bytes, n_cols);
                    }
                }
            }
        });
    }

  private:
    // Rows per chunk of generated values (each chunk has its own seed, so chunks can be made in any order).
    static int64_t chunk_rows(int64_t n_cols) { return std::max<int64_t>(1, (int64_t(1) << 16) / n_cols); }

    // The values of rows [r0, r1) (chunk c of the tensor whose seed is `seed`) into x, row-major.
    static void fill_chunk(float *x, uint64_t seed, int64_t c, int64_t r0, int64_t r1, int64_t n_cols, float mean,
                           float stddev, const Scaled &scaled) {
        uint64_t state = splitmix64(seed + static_cast<uint64_t>(c));
        const int64_t n = (r1 - r0) * n_cols;
        for (int64_t i = 0; i < n; ++i) {
            state += 0x9e3779b97f4a7c15ull;
            x[i] = mean + stddev * approx_normal(splitmix64(state));
        }
        for (int64_t r = r0; r < r1; ++r) {
            float *row = x + (r - r0) * n_cols;
            for (const int64_t col : scaled.cols) row[col] *= scaled.factor;
            if (std::find(scaled.rows.begin(), scaled.rows.end(), r % scaled.row_period) != scaled.rows.end()) {
                for (int64_t col = 0; col < n_cols; ++col) row[col] *= scaled.factor;
            }
        }
    }

    // The random values do not depend on `scaled`: it multiplies some of them afterwards.
    void add(const std::string &name, DType t, std::vector<int64_t> ne, int64_t n_cols, int64_t n_rows, float mean,
             float stddev, Scaled scaled) {
        const uint64_t seed = name_seed(seed_, name);
        ThreadPool *pool = &pool_;
        w_.add_tensor(name, t, std::move(ne), [=](uint8_t *dst, size_t) {
            const int64_t row_bytes = dtype_row_size(t, n_cols), rows_per_chunk = chunk_rows(n_cols);
            const int64_t n_chunks = (n_rows + rows_per_chunk - 1) / rows_per_chunk;
            pool->parallel_for(n_chunks, 1, [&](int64_t c0, int64_t c1) {
                std::vector<float> x(static_cast<size_t>(rows_per_chunk * n_cols));
                for (int64_t c = c0; c < c1; ++c) {
                    const int64_t r0 = c * rows_per_chunk, r1 = std::min(n_rows, r0 + rows_per_chunk);
                    fill_chunk(x.data(), seed, c, r0, r1, n_cols, mean, stddev, scaled);
                    for (int64_t r = r0; r < r1; ++r) {
                        quantize_row(t, x.data() + (r - r0) * n_cols, dst + r * row_bytes, n_cols);
                    }
                }
            });
        });
    }

    gguf::Writer &w_;
    DType type_, stack_type_;
    uint64_t seed_;
    ThreadPool &pool_;
};

std::vector<int> glm52_indexer_types(int64_t n_layer) {
    std::vector<int> t(static_cast<size_t>(n_layer));
    for (int64_t il = 0; il < n_layer; ++il) t[static_cast<size_t>(il)] = il < 2 || (il - 2) % 4 == 0;
    return t;
}

void check_dsa(const SyntheticParams &p) {
    const auto fail = [&](const char *what) { throw_error("make-model --arch %s: %s", p.arch.c_str(), what); };
    for (int64_t v :
         {p.q_lora_rank, p.kv_lora_rank, p.head_nope, p.n_rot, p.head_v, p.idx_n_head, p.idx_head_dim, p.idx_top_k,
          p.n_expert, p.n_expert_used, p.n_expert_shared, p.n_expert_groups, p.n_group_used, p.n_ff_exp}) {
        if (v <= 0) fail("every size must be positive");
    }
    if (p.n_rot % 2 || p.n_rot > p.idx_head_dim) fail("the rope dims must be even and fit an indexer head");
    if (p.n_dense_lead < 0 || p.n_dense_lead > p.n_layer) fail("leading dense layers must be in [0, n_layer]");
    if (p.n_nextn < 0) fail("negative MTP layer count");
    if (p.outlier_channels < 0 || p.outlier_channels > std::min(p.kv_lora_rank, p.idx_head_dim - p.n_rot))
        fail("outlier channels must fit the latent and the indexer key's non-RoPE dims");
    if (!(p.outlier_scale >= 1.0f)) fail("the outlier scale must be at least 1");
    if (p.n_expert_used > p.n_expert) fail("more experts used than there are");
    if (p.n_expert_groups > 1) {
        const int64_t per = p.n_expert / p.n_expert_groups;
        if (p.n_expert % p.n_expert_groups || per < 2) fail("experts must form equal groups of at least 2");
        // llama.cpp's loader asserts expert_group_used_count < expert_group_count when there are groups.
        if (p.n_group_used >= p.n_expert_groups) fail("keep fewer expert groups than there are");
        if (p.n_group_used * per < p.n_expert_used) fail("the kept expert groups cannot supply the experts used");
    }
    if (p.gating < 1 || p.gating > 4) fail("expert_gating_func must be 1 to 4");
    if (p.arch == "glm-dsa") {
        if (p.yarn) fail("GLM-5.x has no YaRN (glm-dsa does not read the YaRN log multiplier)");
        const std::vector<int> types = synthetic_indexer_types(p);
        if (!p.indexer_types_absent) {
            if (static_cast<int64_t>(types.size()) != p.n_layer) fail("--indexer-types needs one entry per layer");
            if (types[0] != 1) fail("layer 0 must be a full indexer layer");
            for (int t : types) {
                if (t != 0 && t != 1) fail("indexer types are 1 (full) or 0 (shared)");
            }
        }
    } else if (!p.indexer_types.empty() || p.indexer_types_absent) {
        fail("indexer types are a glm-dsa key");
    }
    if (p.yarn && (p.yarn_factor <= 1.0f || p.n_ctx_train / p.yarn_factor < 1.0f)) fail("bad YaRN factor");
}

void write_dsa(const SyntheticParams &p, gguf::Writer &w, ThreadPool &pool) {
    check_dsa(p);
    const std::string a = p.arch;
    const auto u32 = [](int64_t v) { return Value::u32(static_cast<uint32_t>(v)); };
    const int64_t head_k = p.head_nope + p.n_rot, n_block = p.n_layer + p.n_nextn;
    w.set("general.architecture", Value::str(a));
    w.set("general.name", Value::str("sparrow synthetic " + a));
    w.set("general.file_type", Value::u32(file_type_of(p.stack_type.value_or(p.type))));
    w.set("general.quantization_version", Value::u32(2));
    w.set(a + ".vocab_size", u32(p.n_vocab));
    w.set(a + ".context_length", u32(p.n_ctx_train));
    w.set(a + ".embedding_length", u32(p.n_embd));
    w.set(a + ".block_count", u32(n_block));
    w.set(a + ".feed_forward_length", u32(p.n_ff));
    w.set(a + ".attention.head_count", u32(p.n_head));
    w.set(a + ".attention.head_count_kv", u32(1));  // MLA runs as MQA over the latent
    w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(p.rms_eps));
    w.set(a + ".rope.freq_base", Value::f32(p.freq_base));
    w.set(a + ".rope.dimension_count", u32(p.n_rot));
    w.set(a + ".leading_dense_block_count", u32(p.n_dense_lead));
    w.set(a + ".attention.q_lora_rank", u32(p.q_lora_rank));
    w.set(a + ".attention.kv_lora_rank", u32(p.kv_lora_rank));
    w.set(a + ".attention.key_length", u32(p.kv_lora_rank + p.n_rot));
    w.set(a + ".attention.value_length", u32(p.kv_lora_rank));
    w.set(a + ".attention.key_length_mla", u32(head_k));
    w.set(a + ".attention.value_length_mla", u32(p.head_v));
    w.set(a + ".expert_feed_forward_length", u32(p.n_ff_exp));
    w.set(a + ".expert_count", u32(p.n_expert));
    w.set(a + ".expert_used_count", u32(p.n_expert_used));
    w.set(a + ".expert_shared_count", u32(p.n_expert_shared));
    w.set(a + ".expert_group_count", u32(p.n_expert_groups));
    w.set(a + ".expert_group_used_count", u32(p.n_group_used));
    w.set(a + ".expert_weights_scale", Value::f32(p.weights_scale));
    w.set(a + ".expert_weights_norm", Value::boolean(p.weights_norm));
    w.set(a + ".expert_gating_func", Value::u32(p.gating));
    w.set(a + ".attention.indexer.head_count", u32(p.idx_n_head));
    w.set(a + ".attention.indexer.key_length", u32(p.idx_head_dim));
    w.set(a + ".attention.indexer.top_k", u32(p.idx_top_k));
    if (p.n_nextn > 0) w.set(a + ".nextn_predict_layers", u32(p.n_nextn));
    if (p.yarn) {  // as the converter writes V3.2's rope_scaling (factor 40 of 4096 there)
        w.set(a + ".rope.scaling.type", Value::str("yarn"));
        w.set(a + ".rope.scaling.factor", Value::f32(p.yarn_factor));
        w.set(a + ".rope.scaling.original_context_length",
              u32(static_cast<int64_t>(static_cast<float>(p.n_ctx_train) / p.yarn_factor)));
        w.set(a + ".rope.scaling.yarn_log_multiplier", Value::f32(0.1f));  // 0.1 * mscale_all_dim (1)
    }
    const std::vector<int> types = synthetic_indexer_types(p);
    if (a == "glm-dsa" && !p.indexer_types_absent) {
        std::vector<Value> v;
        for (int t : types) v.push_back(Value::boolean(t != 0));
        w.set(a + ".attention.indexer.types", Value::array(ValueType::BOOL, std::move(v)));
    }
    write_vocab(w, p.n_vocab, p.fim_tokens, /*fim_keys=*/false);

    // Gains (output std for unit inputs) chosen so that the model is far from uniform: peaked next-token
    // distributions and attention / indexer scores of a few units (checked by tests/e2e/test_make_model_dsa.py).
    StreamSink s(w, p.type, p.stack_type.value_or(p.type), p.seed, pool);
    const int64_t E = p.n_embd, H = p.n_head, L = p.kv_lora_rank, D = p.idx_head_dim, HI = p.idx_n_head;
    s.weight("token_embd.weight", {E, p.n_vocab}, std::sqrt(static_cast<float>(E)));
    for (int64_t il = 0; il < n_block; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        const bool mtp = il >= p.n_layer;
        // Outlier channels (SyntheticParams::outlier_channels): c_kv channels scaled up by the latent norm and
        // down by the weights that read them; indexer-key channels past the RoPE part (so that RoPE does not
        // mix a scaled channel with an unscaled one) scaled up by the key norm and down in the query.
        const float up = p.outlier_scale, down = 1.0f / p.outlier_scale;
        const std::vector<int64_t> lat_out = pick_channels(p.seed, il, "latent", 0, L, p.outlier_channels);
        const std::vector<int64_t> key_out = pick_channels(p.seed, il, "indexer", p.n_rot, D, p.outlier_channels);
        s.vector(b + "attn_norm.weight", E, 1.0f, 0.1f);
        s.vector(b + "attn_q_a_norm.weight", p.q_lora_rank, 1.0f, 0.1f);
        s.vector(b + "attn_kv_a_norm.weight", L, 1.0f, 0.1f, scale_cols(lat_out, up));
        s.weight(b + "attn_q_a.weight", {E, p.q_lora_rank}, 1.0f);
        s.weight(b + "attn_q_b.weight", {p.q_lora_rank, H * head_k}, kGainQ);
        s.weight(b + "attn_kv_a_mqa.weight", {E, L + p.n_rot}, kGainKv);
        // per head W_UK [kv_lora, nope]: row c of each head meets c_kv channel c
        s.weight(b + "attn_k_b.weight", {p.head_nope, L, H}, kGainKb, false, scale_rows(lat_out, L, down));
        // per head W_UV [v_head, kv_lora]: column c reads c_kv channel c
        s.weight(b + "attn_v_b.weight", {L, p.head_v, H}, 1.0f, false, scale_cols(lat_out, down));
        s.weight(b + "attn_output.weight", {H * p.head_v, E}, kGainAttnOut);
        s.vector(b + "ffn_norm.weight", E, 1.0f, 0.1f);
        if (mtp || types.empty() || types[static_cast<size_t>(il)]) {
            s.vector(b + "indexer.k_norm.weight", D, 1.0f, 0.1f, scale_cols(key_out, up));
            s.vector(b + "indexer.k_norm.bias", D, 0.0f, 0.1f, scale_cols(key_out, up));
            s.weight(b + "indexer.proj.weight", {E, HI}, 1.0f, /*keep_f32=*/true);
            s.weight(b + "indexer.attn_k.weight", {E, D}, kGainIdx);
            s.weight(b + "indexer.attn_q_b.weight", {p.q_lora_rank, HI * D}, kGainIdx, false,
                     scale_rows(key_out, D, down));
        }
        if (il < p.n_dense_lead) {
            s.weight(b + "ffn_gate.weight", {E, p.n_ff}, 1.0f);
            s.weight(b + "ffn_up.weight", {E, p.n_ff}, 1.0f);
            s.weight(b + "ffn_down.weight", {p.n_ff, E}, kGainDown);
        } else {
            s.weight(b + "ffn_gate_inp.weight", {E, p.n_expert}, kGainRouter, /*keep_f32=*/true);
            if (p.probs_bias) s.vector(b + "exp_probs_b.bias", p.n_expert, 0.0f, 0.2f);
            if (p.fuse_gate_up_exps) {
                s.fused_stack(b + "ffn_gate_up_exps.weight", b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight",
                              {E, p.n_ff_exp, p.n_expert}, 1.0f);
            } else {
                s.weight(b + "ffn_gate_exps.weight", {E, p.n_ff_exp, p.n_expert}, 1.0f);
                s.weight(b + "ffn_up_exps.weight", {E, p.n_ff_exp, p.n_expert}, 1.0f);
            }
            s.weight(b + "ffn_down_exps.weight", {p.n_ff_exp, E, p.n_expert}, kGainDown);
            const int64_t ns = p.n_ff_exp * p.n_expert_shared;
            s.weight(b + "ffn_gate_shexp.weight", {E, ns}, 1.0f);
            s.weight(b + "ffn_up_shexp.weight", {E, ns}, 1.0f);
            s.weight(b + "ffn_down_shexp.weight", {ns, E}, kGainDown);
        }
        if (mtp) {  // the MTP / NextN block's own tensors (the main forward pass skips the block)
            s.weight(b + "nextn.eh_proj.weight", {2 * E, E}, 1.0f);
            s.vector(b + "nextn.enorm.weight", E, 1.0f, 0.1f);
            s.vector(b + "nextn.hnorm.weight", E, 1.0f, 0.1f);
            s.vector(b + "nextn.shared_head_norm.weight", E, 1.0f, 0.1f);
        }
    }
    s.vector("output_norm.weight", E, 1.0f, 0.1f);
    if (!p.tied_output) s.weight("output.weight", {E, p.n_vocab}, kGainOutput);
}

}  // namespace

SyntheticParams synthetic_defaults(const std::string &arch, const std::string &preset) {
    SyntheticParams p;
    p.arch = arch;
    const bool dsa = arch == "deepseek32" || arch == "glm-dsa";
    if (arch != "llama" && !dsa) {
        throw_error("make-model: unknown architecture '%s' (available: llama, deepseek32, glm-dsa)", arch.c_str());
    }
    if (!preset.empty() && (preset != "bench" || !dsa)) {
        throw_error("make-model: unknown preset '%s' for %s (available: bench, for deepseek32 and glm-dsa)",
                    preset.c_str(), arch.c_str());
    }
    if (!dsa) return p;
    p.n_head_kv = 1;
    p.n_layer = 4;
    p.n_ff = 96;
    p.n_ctx_train = 4096;
    if (arch == "glm-dsa") {  // GLM-5.x: one expert group, RMS eps 1e-5
        p.n_expert_groups = 1;
        p.n_group_used = 1;
        p.rms_eps = 1e-5f;
    }
    if (preset == "bench") {
        p.n_vocab = 32000;
        p.n_embd = 2048;
        p.n_layer = 8;
        p.n_dense_lead = 1;
        p.n_head = 16;
        p.q_lora_rank = 768;
        p.kv_lora_rank = 512;
        p.head_nope = 128;
        p.n_rot = 64;
        p.head_v = 128;
        p.idx_n_head = 32;
        p.idx_head_dim = 128;
        p.idx_top_k = 2048;
        p.n_expert = 16;
        p.n_ff_exp = 768;
        p.n_expert_used = 2;
        p.n_expert_shared = 1;
        p.n_ff = 4096;
        p.n_ctx_train = 16384;
        if (arch == "deepseek32") p.n_expert_groups = 4, p.n_group_used = 2;
        p.type = DType::Q8_0;
    }
    return p;
}

std::vector<int> synthetic_indexer_types(const SyntheticParams &p) {
    if (p.arch != "glm-dsa" || p.indexer_types_absent) return {};
    return p.indexer_types.empty() ? glm52_indexer_types(p.n_layer) : p.indexer_types;
}

void write_synthetic_model(const SyntheticParams &p, const std::string &path) {
    if (p.n_vocab <= 0 || p.n_embd <= 0 || p.n_layer <= 0 || p.n_head <= 0 || p.n_head_kv <= 0 || p.n_ff <= 0) {
        throw_error("make-model: every size must be positive");
    }
    gguf::Writer w;
    if (p.arch == "llama") {
        write_llama(p, w);
        w.write(path);
    } else if (p.arch == "deepseek32" || p.arch == "glm-dsa") {
        ThreadPool pool(std::min(ThreadPool::hardware_threads(), 16));
        write_dsa(p, w, pool);
        w.write(path);  // generates the weights tensor by tensor, with `pool`
    } else {
        throw_error("make-model: unknown architecture '%s' (available: llama, deepseek32, glm-dsa)", p.arch.c_str());
    }
}

}  // namespace sparrow
