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

// Element types a KV cache can be stored in. q8_0 / q4_0 are ggml's 32-element blocks with one f16 scale
// (8.5 / 4.5 bits per element); their rows must be a multiple of 32 wide (per head where rows are read per
// head), else creating the context throws.
enum class CacheType { f32, f16, bf16, q8_0, q4_0 };
CacheType cache_type_from_name(std::string_view name);  // "f32" | "f16" | "bf16" | "q8_0" | "q4_0"; throws otherwise
const char *cache_type_name(CacheType t);

// Hadamard rotation of cache rows before they are stored (queries rotated to match, outputs rotated back
// where the rows are also values): it spreads outlier channels over their block so that quantisation loses
// less. `quantized` rotates exactly the q8_0 / q4_0 stores; `on` rotates every store (f16/bf16 too, where
// it only moves rounding error around, slightly for the worse when there are outliers); `off` none.
enum class CacheRotation { quantized, on, off };
CacheRotation cache_rotation_from_name(std::string_view name);  // "auto" (= quantized) | "on" | "off"
const char *cache_rotation_name(CacheRotation r);
bool cache_rotated(CacheRotation r, CacheType t);  // whether a store of type t is rotated under mode r

struct ModelInfo {
    std::string arch;  // general.architecture
    std::string name;  // general.name
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_ctx_train = 0;
    int64_t n_params = 0;  // elements over all weight tensors
    int64_t n_weight_bytes = 0;
    int64_t n_repacked_bytes = 0;  // of those, Q8_0 / Q4_0 matrices repacked at load (ModelParams::repack)
    std::string repack_note;       // why repacking was skipped, when it was asked for and skipped
    std::string weight_types;      // e.g. "f32" or "q8_0 (f32 norms)"
    bool has_indexer = false;      // a sparse-attention (DSA) model
    int64_t indexer_top_k = 0;
    std::string summary;  // architecture-specific description (e.g. which layers run an indexer)
};

struct ModelParams {
    // Q8_0 and Q4_0 weight matrices (rows in multiples of 8) are repacked at load, eight rows to a record, for
    // the kernels (kernels/ops.h, WeightMatrix::rows8): the same bytes in anonymous memory instead of the
    // file's mapping, faster products at several tokens. false keeps every weight in the mapping as stored.
    bool repack = true;
    // Mapped pages can be dropped and read again under memory pressure; repacked ones cannot (without swap).
    // So repacking is skipped when the file's Q8_0 and Q4_0 bytes exceed this many bytes (-1: 3/4 of the memory the
    // system reports available at load), and ModelInfo::repack_note says so.
    int64_t repack_memory_limit = -1;
};

// Loads a GGUF model (memory-mapped). Throws sparrow::Error naming the file and the problem.
std::shared_ptr<const Model> load_model(const std::string &path, const ModelParams &params = {});
const ModelInfo &model_info(const Model &model);
const Tokenizer &model_tokenizer(const Model &model);

// The context size n_ctx = 0 stands for: the model's training context, capped at 4096.
int64_t default_context_size(const ModelInfo &info);

struct ContextParams {
    int64_t n_ctx = 0;       // cache cells; 0 = the model's training context, capped at 4096
    int64_t n_batch = 2048;  // most tokens one decode() call accepts
    int64_t n_ubatch = 512;  // tokens per forward pass; a batch is split into ubatches of this size
    static constexpr int kMaxThreads = 1024;
    int n_threads = 0;  // 0 = all hardware threads; at most kMaxThreads
    CacheType cache_type_k = CacheType::f16;
    CacheType cache_type_v = CacheType::f16;
    // Sparse attention (models with a lightning indexer): off runs dense attention over every visible key.
    bool dsa = true;
    int64_t dsa_top_k = 0;                          // 0 = the model's attention.indexer.top_k
    CacheType indexer_cache_type = CacheType::f16;  // indexer key rows (any CacheType)
    bool record_selections = false;                 // keep the last queries' selections for last_selections()
    bool indexer_fast = false;                      // reduced-precision indexer products (see IndexerPrecision)
    // Attention sinks for sparse attention (--dsa-sink; 0 = off, the reference behaviour): the first
    // dsa_sink present positions of each query's own sequence are always selected, counted within top-k
    // (the indexer picks the other top_k - dsa_sink keys).
    int64_t dsa_sink = 0;
    // Hadamard rotation of the stores (K, V, the MLA latent, indexer keys): see CacheRotation.
    CacheRotation cache_rotation = CacheRotation::quantized;
    bool embeddings = false;  // also keep the final normed hidden state of the tokens with logits (embeddings())
};

// One token of a batch: its id, its position in its sequence(s), the sequence it belongs to, and whether
// logits are wanted for it. A token may belong to several sequences (a prompt shared by several
// conversations is decoded once): list the others in extra_seq_ids; the token's cache cell is then shared
// by all of them. A token sees the cells that belong to ALL of its sequences, up to its own position
// (which is each sequence's own history when they hold the same prefix, as after a shared prompt).
// Aggregate initialisation with the first four fields keeps working: {id, pos, seq_id, logits}.
struct BatchToken {
    int32_t id = 0;
    int32_t pos = 0;
    int32_t seq_id = 0;
    bool logits = false;
    std::vector<int32_t> extra_seq_ids{};  // further sequences the token belongs to (usually none)
};

// Which keys a query attended in one layer (for debugging and comparison with reference engines).
struct QuerySelection {
    int32_t pos = 0;            // the query's position
    std::vector<int32_t> keys;  // positions of the keys it attended, ascending
};
// How many queries Context::last_selections() keeps per layer (the last ones decoded).
constexpr int64_t kRecordedQueries = 16;
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

// Wall time of the sparse-attention selection call's phases, summed over the calls.
struct SelectionPhaseSeconds {
    double plan = 0;     // queries sorted into chunks, buffers sized
    double score = 0;    // every candidate key scored into the threads' top-k buffers (all threads)
    double merge = 0;    // each query's pieces merged (one thread per query: in decode, the calling thread alone)
    double rescore = 0;  // fast mode's exact re-scoring of the keys around the cut (all threads)
    double choose = 0;   // the selections completed and written as cells in order
};

struct SparseStats {
    std::vector<SparseLayerStats> layers;
    double indexer_seconds = 0;    // indexer keys, scores and selection
    double attention_seconds = 0;  // MLA projections and attention over the selected rows
    // Of those: the top-k selection call alone (scoring the cached keys; no projections), and the attention
    // kernel alone (scores, softmax and P.V over the selected or visible rows; no projections).
    double select_seconds = 0;
    double attend_seconds = 0;
    // Of select_seconds, by phase.
    SelectionPhaseSeconds select_phases;
};

class Context {
  public:
    Context(std::shared_ptr<const Model> model, const ContextParams &params);
    ~Context();
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;

    // Runs the model over the batch, appending its tokens to the cache. Refuses an invalid batch by throwing
    // sparrow::Error, whose code() (core/error.h ErrorCode) says why: invalid_batch (empty, larger than
    // n_batch, negative position), bad_token (id outside the vocabulary), bad_sequence (id outside
    // [0, 256)), position_order (a token's position is not after every position its sequence already holds,
    // in the cache or earlier in the batch: positions increase strictly per sequence, gaps are allowed),
    // context_full (fewer free cells than tokens). A refused batch leaves every cache byte-identical.
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
    int32_t seq_pos_min(int32_t seq_id) const;  // -1 when the sequence is empty
    int64_t seq_n_cells(int32_t seq_id) const;  // the cells that belong to the sequence (shared ones included)

    // Cache operations (as llama.cpp's); positions ranges are [p0, p1), p1 < 0 meaning "to the end".
    // Every per-layer store stays in step with the cells. Bad sequence ids throw (bad_sequence).
    // dst shares src's cells in [p0, p1) (no rows are copied; dst's own cells in that range are removed).
    void seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1);
    void seq_keep(int32_t seq_id);  // removes every other sequence
    // Adds delta to the positions of seq_id's cells in [p0, p1); cells whose position would become negative
    // are removed from the sequence. Stored RoPE'd keys are re-rotated by delta. A cell the sequence shares
    // with others is first copied to a free cell (the others keep the original); refused (context_full)
    // when there are not enough free cells, and refused (position_order) when a shifted position would
    // collide with one the sequence keeps. Nothing changes when it is refused.
    void seq_add(int32_t seq_id, int32_t p0, int32_t p1, int32_t delta);
    // llama.cpp's context shift, for a sequence at positions 0..p (p = seq_pos_max): [0, n_keep) stays, the older
    // half of the rest, [n_keep, n_keep + n_discard) with n_discard = (p + 1 - n_keep) / 2, is removed, and the
    // newer half moves down to follow the kept part (seq_rm, then seq_add: keys re-rotated). Returns n_discard
    // (0 when fewer than two positions follow n_keep). When seq_add is refused (shared cells and no free ones),
    // it throws after the removal: the caller must drop the sequence.
    int32_t context_shift(int32_t seq_id, int32_t n_keep);
    // Divides the positions of seq_id's cells in [p0, p1) by d > 1 (rounding down; several cells may then
    // share a position, as in llama.cpp's self-extend). Keys are re-rotated; shared cells as for seq_add.
    void seq_div(int32_t seq_id, int32_t p0, int32_t p1, int32_t d);
    // Compacts the occupied cells to the front of the cache (rows move in every store); logits unchanged.
    void defrag();
    int64_t n_cells_used() const;

    // Writes seq_id's cells (positions and every store's raw row bytes) to a file, with a header naming the
    // model shape and store types, and `tokens` (the caller's record of what the rows hold, e.g. the token ids
    // by position; at most one per cell, each in the vocabulary). Throws (state_file) when the file cannot be
    // written, or when the tokens do not fit that rule.
    void state_seq_save(int32_t seq_id, const std::string &path, std::span<const int32_t> tokens = {}) const;
    // Replaces seq_id's contents with a saved sequence (from any sequence id) placed in free cells and returns
    // the tokens saved with it (none from a version 1 file). The file is checked completely first (magic,
    // version, model shape, store names/types/widths, positions, tokens, checksum); any mismatch or corruption
    // throws (state_file) and leaves the cache as it was, as does a lack of free cells (context_full).
    std::vector<int32_t> state_seq_load(int32_t seq_id, const std::string &path);

    // A 64-bit digest of every cache store's bytes (all cells, used or not) and the cell table: tests use
    // it to check that refused operations leave the caches byte-identical.
    uint64_t cache_digest() const;

    // Sparse-attention models: per layer, the keys attended by the last (up to 16) queries of the last decode
    // call, over its ubatches since the layer last attended densely (then `dense`, with no queries: every
    // visible key). Empty for other models.
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
