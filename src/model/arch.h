// The interface every architecture implements, and the registry that picks one by general.architecture.
// An architecture owns its hyper-parameters, its weights (views into the mapping) and its forward pass;
// its per-context state (cache stores, scratch) is created from the context's parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_cells.h"
#include "cache/row_store.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "model/weights.h"
#include "sparrow/sparrow.h"

namespace sparrow {

// One forward pass's tokens. The context has already assigned each token its cache cell (and recorded
// the cell's position and sequence in KvCells), so the current tokens are visible to themselves.
struct UBatch {
    std::span<const int32_t> tokens;       // [n_tokens] token ids
    std::span<const int32_t> pos;          // [n_tokens] positions
    std::span<const SeqSet> seq;           // [n_tokens] each token's sequences (one or more)
    std::span<const int32_t> cells;        // [n_tokens] cache cells
    std::span<const int32_t> output_rows;  // indices into the ubatch of the tokens whose logits are wanted
    float *hidden_out = nullptr;           // when set: [output_rows.size(), n_embd] receives their final normed states
    bool first_of_call = true;             // the first ubatch of a decode() call (per-call records restart)
    int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// A per-layer cache store of an architecture's state, with the name state files and messages use.
struct NamedStore {
    std::string name;  // e.g. "blk.3.latent"
    RowStore *store = nullptr;
};

// Per-context state of an architecture: its cache stores and scratch buffers.
class ArchState {
  public:
    virtual ~ArchState() = default;
};

struct StateParams {
    int64_t n_ctx = 0;     // cache cells
    int64_t n_ubatch = 0;  // most tokens per forward pass
    DType cache_type_k = DType::F16;
    DType cache_type_v = DType::F16;
    bool dsa = true;
    int64_t dsa_top_k = 0;
    DType indexer_cache_type = DType::F16;
    bool indexer_fast = false;
    bool record_selections = false;
    int64_t dsa_sink = 0;  // ContextParams::dsa_sink
    // Hadamard-rotate the rows of the K store (MLA: the latent), the V store and the indexer key store
    // (RowRotation in cache/row_store.h; the architecture rotates queries and outputs to match).
    bool rotate_k = false;
    bool rotate_v = false;
    bool rotate_indexer = false;
};

class ArchModel {
  public:
    virtual ~ArchModel() = default;
    virtual std::unique_ptr<ArchState> create_state(const StateParams &params) const = 0;
    // Runs one ubatch: stores its cache rows at ub.cells, attends over the cells visible to each token,
    // and writes logits [ub.output_rows.size(), n_vocab] for the output rows.
    virtual void forward(ArchState &state, const KvCells &cells, const UBatch &ub, ThreadPool &pool,
                         float *logits) const = 0;
    // Writes random, plausibly scaled rows into every per-layer store at `cells` (benchmarks of deep contexts
    // where only timing matters; the context has assigned the cells).
    virtual void fill_synthetic(ArchState &state, std::span<const int32_t> cells, uint64_t seed) const = 0;
    // Bytes a forward pass reads per generated token at a context of n_kv keys: the weights it touches
    // (only the routed share of the experts) and the cache rows it reads.
    virtual int64_t bytes_per_token(const ArchState &state, int64_t n_kv) const = 0;
    // Bytes held by the per-layer cache stores.
    virtual int64_t cache_bytes(const ArchState &state) const = 0;

    // Cache operations. Every per-layer store, in a fixed order (the order of state files), with a name
    // for messages; stores without rows (GLM IndexShare layers' indexer keys) are listed too, with zero
    // cells. The context moves and copies cells through these (RowStore::copy_row) and saves their bytes.
    virtual std::vector<NamedStore> stores(ArchState &state) const = 0;
    // Re-rotates the RoPE'd part of every stored key row (llama K; DSA latent k_pe and indexer key rope part)
    // of cells[i] by deltas[i] positions, through RowStore::read/write (so any row encoding is undone and
    // redone). The context has already changed the cells' positions.
    virtual void shift_rows(ArchState &state, std::span<const int32_t> cells,
                            std::span<const int32_t> deltas) const = 0;
    // Whether the architecture knows the file's tensor `name` and leaves it unread on purpose (MTP/NextN
    // layers, a redundant form of tensors it reads, tensors the metadata says a layer does without). The model
    // refuses a file holding a tensor nobody read and the architecture does not leave unread (Model::Model).
    virtual bool leaves_unread(const std::string & /*name*/) const { return false; }
    // See Context::last_selections().
    virtual std::vector<LayerSelection> last_selections(const ArchState &) const { return {}; }
    virtual SparseStats sparse_stats(const ArchState &) const { return {}; }
};

// Builds the architecture named by the file's general.architecture, taking its tensors from `weights`
// and filling the architecture-specific fields of `info`. Throws sparrow::Error for an unknown
// architecture or a bad hyper-parameter/tensor.
std::unique_ptr<ArchModel> create_arch_model(const gguf::File &file, WeightLoader &weights, ModelInfo &info);

// Architectures (one file each in src/models/).
std::unique_ptr<ArchModel> create_llama(const gguf::File &file, WeightLoader &weights, ModelInfo &info);
// deepseek32 (DeepSeek-V3.2) and glm-dsa (GLM-5.x): MLA + MoE + lightning indexer.
std::unique_ptr<ArchModel> create_dsa(const gguf::File &file, WeightLoader &weights, ModelInfo &info);

}  // namespace sparrow
