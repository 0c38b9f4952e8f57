// sparrow's public C++ API: load a model, create a context (its caches and scratch), submit batches of
// tokens for one or many sequences, read logits, tokenize and detokenize. Errors are sparrow::Error
// exceptions (a std::runtime_error) whose message says what was wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparrow {

class Tokenizer;
class Model;
class Context;

// Element types a KV cache can be stored in.
enum class CacheType { f32, f16, bf16 };
CacheType cache_type_from_name(std::string_view name);  // "f32" | "f16" | "bf16"; throws otherwise
const char *cache_type_name(CacheType t);

struct ModelInfo {
    std::string arch;  // general.architecture
    std::string name;  // general.name
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_ctx_train = 0;
    int64_t n_params = 0;  // elements over all weight tensors
    int64_t n_weight_bytes = 0;
    std::string weight_types;  // e.g. "f32" or "q8_0 (f32 norms)"
    bool has_indexer = false;  // a sparse-attention (DSA) model
    int64_t indexer_top_k = 0;
    std::string summary;  // architecture-specific description (e.g. which layers run an indexer)
};

// Loads a GGUF model (memory-mapped). Throws sparrow::Error naming the file and the problem.
std::shared_ptr<const Model> load_model(const std::string &path);
const ModelInfo &model_info(const Model &model);
const Tokenizer &model_tokenizer(const Model &model);

struct ContextParams {
    int64_t n_ctx = 0;       // cache cells; 0 = the model's training context, capped at 4096
    int64_t n_batch = 2048;  // most tokens one decode() call accepts
    int64_t n_ubatch = 512;  // tokens per forward pass; a batch is split into ubatches of this size
    int n_threads = 0;       // 0 = all hardware threads
    CacheType cache_type_k = CacheType::f16;
    CacheType cache_type_v = CacheType::f16;
    // Sparse attention (models with a lightning indexer): off runs dense attention over every visible key.
    bool dsa = true;
    int64_t dsa_top_k = 0;                          // 0 = the model's attention.indexer.top_k
    CacheType indexer_cache_type = CacheType::f16;  // indexer key rows (f32 or f16)
    bool record_selections = false;                 // keep the last queries' selections for last_selections()
    bool indexer_fast = false;                      // reduced-precision indexer products (see IndexerPrecision)
    bool embeddings = false;  // also keep the final normed hidden state of the tokens with logits (embeddings())
};

// One token of a batch: its id, its position in its sequence, the sequence it belongs to, and whether
// logits are wanted for it.
struct BatchToken {
    int32_t id = 0;
    int32_t pos = 0;
    int32_t seq_id = 0;
    bool logits = false;
};

// Which keys a query attended in one layer (for debugging and comparison with reference engines).
struct QuerySelection {
    int32_t pos = 0;            // the query's position
    std::vector<int32_t> keys;  // positions of the keys it attended, ascending
};
struct LayerSelection {
    int64_t layer = 0;
    bool dense = true;  // no selection ran (every visible key attended)
    std::vector<QuerySelection> queries;
};

// Sparse-attention statistics accumulated over a context's forward passes (--dsa-stats).
struct SparseLayerStats {
    int64_t layer = 0;
    bool shared = false;  // reuses an earlier layer's selection (GLM IndexShare)
    int64_t n_queries = 0;
    double keys_attended = 0;  // summed over queries
    double keys_visible = 0;   // summed over queries
};
struct SparseStats {
    std::vector<SparseLayerStats> layers;
    double indexer_seconds = 0;    // indexer keys, scores and selection
    double attention_seconds = 0;  // MLA projections and attention over the selected rows
};

class Context {
  public:
    Context(std::shared_ptr<const Model> model, const ContextParams &params);
    ~Context();
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;

    // Runs the model over the batch, appending its tokens to the cache. Throws sparrow::Error when the
    // batch is invalid (bad token id, batch larger than n_batch, no free cache cells); the cache is then
    // left as it was before the call.
    void decode(std::span<const BatchToken> batch);

    // Logits of the i-th token of the last batch (that token must have asked for logits): n_vocab floats.
    std::span<const float> logits(size_t i) const;
    // With ContextParams::embeddings: the final normed hidden state (the input of the output head) of the
    // i-th token of the last batch, which must have asked for logits: n_embd floats.
    std::span<const float> embeddings(size_t i) const;

    // Removes the cells of seq_id with positions in [p0, p1) (p1 < 0: to the end); seq_id < 0: every
    // sequence.
    void seq_rm(int32_t seq_id, int32_t p0, int32_t p1);
    void clear();                               // empties the cache
    int32_t seq_pos_max(int32_t seq_id) const;  // -1 when the sequence is empty

    // Sparse-attention models: per layer, the keys attended by the last (up to 16) queries of the last
    // forward pass. Empty for other models.
    std::vector<LayerSelection> last_selections() const;  // needs ContextParams::record_selections
    SparseStats sparse_stats() const;

    // Benchmarks: appends n_tokens positions to seq_id whose cache rows are random filler instead of the
    // model's own (only timing is meaningful afterwards).
    void fill_synthetic(int32_t seq_id, int64_t n_tokens, uint64_t seed);
    // Estimated bytes read per generated token at a context of n_kv keys (weights touched + cache rows).
    int64_t bytes_per_token(int64_t n_kv) const;
    int64_t cache_bytes() const;  // memory held by the KV cache stores

    const Model &model() const;
    const ContextParams &params() const;
    int64_t n_ctx() const;
    int64_t n_vocab() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace sparrow
