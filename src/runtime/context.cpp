// A context: the KV cache cells, the architecture's per-context state, the thread pool and the logits of
// the last batch. decode() validates the whole batch before touching the cache, then runs it as ubatches.
#include <algorithm>

#include "cache/kv_cells.h"
#include "core/error.h"
#include "model/model.h"

namespace sparrow {

CacheType cache_type_from_name(std::string_view name) {
    if (name == "f32") return CacheType::f32;
    if (name == "f16") return CacheType::f16;
    if (name == "bf16") return CacheType::bf16;
    throw_error("unknown cache type '%.*s' (expected f32, f16 or bf16)", (int)name.size(), name.data());
}

const char *cache_type_name(CacheType t) {
    switch (t) {
        case CacheType::f32: return "f32";
        case CacheType::f16: return "f16";
        case CacheType::bf16: return "bf16";
    }
    return "?";
}

namespace {
DType cache_dtype(CacheType t) {
    switch (t) {
        case CacheType::f32: return DType::F32;
        case CacheType::f16: return DType::F16;
        case CacheType::bf16: return DType::BF16;
    }
    return DType::F32;
}

}  // namespace

struct Context::Impl {
    std::shared_ptr<const Model> model;
    ContextParams params;
    ThreadPool pool;
    KvCells cells;
    std::unique_ptr<ArchState> state;
    std::vector<float> logits;        // [n_outputs, n_vocab] of the last batch
    std::vector<float> hidden;        // [n_outputs, n_embd] of the last batch (params.embeddings only)
    std::vector<int32_t> logits_row;  // per token of the last batch: its row in `logits`, or -1

    Impl(std::shared_ptr<const Model> m, const ContextParams &p)
        : model(std::move(m)),
          params(p),
          pool(p.n_threads > 0 ? p.n_threads : ThreadPool::hardware_threads()),
          cells(p.n_ctx) {}
};

Context::Context(std::shared_ptr<const Model> model, const ContextParams &params_in) {
    if (!model) throw_error("no model");
    ContextParams p = params_in;
    const ModelInfo &info = model->info();
    if (p.n_ctx < 0 || p.n_batch < 0 || p.n_ubatch < 0) throw_error("context sizes must not be negative");
    if (p.n_ctx == 0) p.n_ctx = std::min<int64_t>(info.n_ctx_train > 0 ? info.n_ctx_train : 4096, 4096);
    if (p.n_batch == 0) p.n_batch = p.n_ctx;
    if (p.n_ubatch == 0) p.n_ubatch = 512;
    p.n_batch = std::min(p.n_batch, p.n_ctx);
    p.n_ubatch = std::min(p.n_ubatch, p.n_batch);
    if (p.n_ctx > (int64_t(1) << 31) - 1) throw_error("context size %lld is too large", (long long)p.n_ctx);
    impl_ = std::make_unique<Impl>(std::move(model), p);
    impl_->state = impl_->model->arch().create_state(StateParams{
        .n_ctx = p.n_ctx,
        .n_ubatch = p.n_ubatch,
        .cache_type_k = cache_dtype(p.cache_type_k),
        .cache_type_v = cache_dtype(p.cache_type_v),
        .dsa = p.dsa,
        .dsa_top_k = p.dsa_top_k,
        .indexer_cache_type = cache_dtype(p.indexer_cache_type),
        .indexer_fast = p.indexer_fast,
        .record_selections = p.record_selections,
    });
}

Context::~Context() = default;

void Context::decode(std::span<const BatchToken> batch) {
    Impl &s = *impl_;
    const int64_t n = static_cast<int64_t>(batch.size());
    const int64_t n_vocab = s.model->info().n_vocab;
    if (n == 0) throw_error("decode: the batch is empty");
    if (n > s.params.n_batch) {
        throw_error("decode: a batch of %lld tokens exceeds the batch size %lld (raise -b)", (long long)n,
                    (long long)s.params.n_batch);
    }
    int64_t n_outputs = 0;
    for (int64_t i = 0; i < n; ++i) {
        const BatchToken &t = batch[i];
        if (t.id < 0 || t.id >= n_vocab) {
            throw_error("decode: token %lld has id %d, outside the vocabulary [0, %lld)", (long long)i, t.id,
                        (long long)n_vocab);
        }
        if (t.seq_id < 0 || t.seq_id >= kMaxSequences) {
            throw_error("decode: token %lld has sequence id %d, outside [0, %d)", (long long)i, t.seq_id,
                        kMaxSequences);
        }
        if (t.pos < 0) throw_error("decode: token %lld has negative position %d", (long long)i, t.pos);
        n_outputs += t.logits ? 1 : 0;
    }
    const std::vector<int32_t> free_cells = s.cells.find_free(n);  // throws before anything changes

    s.logits.assign(static_cast<size_t>(n_outputs * n_vocab), 0.0f);
    const int64_t n_embd = s.model->info().n_embd;
    s.hidden.assign(s.params.embeddings ? static_cast<size_t>(n_outputs * n_embd) : 0, 0.0f);
    s.logits_row.assign(static_cast<size_t>(n), -1);
    std::vector<int32_t> tokens, pos, seq, cells, outputs;
    int64_t out_row = 0;
    int64_t n_assigned = 0;
    try {
        for (int64_t start = 0; start < n; start += s.params.n_ubatch) {
            const int64_t end = std::min(n, start + s.params.n_ubatch);
            tokens.clear(), pos.clear(), seq.clear(), cells.clear(), outputs.clear();
            for (int64_t i = start; i < end; ++i) {
                tokens.push_back(batch[i].id);
                pos.push_back(batch[i].pos);
                seq.push_back(batch[i].seq_id);
                cells.push_back(free_cells[i]);
                s.cells.assign(free_cells[i], batch[i].pos, batch[i].seq_id);
                ++n_assigned;
                if (batch[i].logits) {
                    outputs.push_back(static_cast<int32_t>(i - start));
                    s.logits_row[i] = static_cast<int32_t>(out_row + outputs.size() - 1);
                }
            }
            float *hidden_out = s.params.embeddings ? s.hidden.data() + out_row * n_embd : nullptr;
            const UBatch ub{tokens, pos, seq, cells, outputs, hidden_out};
            s.model->arch().forward(*s.state, s.cells, ub, s.pool, s.logits.data() + out_row * n_vocab);
            out_row += static_cast<int64_t>(outputs.size());
        }
    } catch (...) {
        // Leave the cache as it was: the cells taken by this batch become free again.
        for (int64_t i = 0; i < n_assigned; ++i) s.cells.release(free_cells[i]);
        s.logits_row.assign(static_cast<size_t>(n), -1);
        throw;
    }
}

std::span<const float> Context::logits(size_t i) const {
    const Impl &s = *impl_;
    if (i >= s.logits_row.size() || s.logits_row[i] < 0) {
        throw_error("logits: token %zu of the last batch did not ask for logits", i);
    }
    const auto n_vocab = static_cast<size_t>(s.model->info().n_vocab);
    return {s.logits.data() + static_cast<size_t>(s.logits_row[i]) * n_vocab, n_vocab};
}

std::span<const float> Context::embeddings(size_t i) const {
    const Impl &s = *impl_;
    if (!s.params.embeddings) throw_error("embeddings: the context was created without ContextParams::embeddings");
    if (i >= s.logits_row.size() || s.logits_row[i] < 0) {
        throw_error("embeddings: token %zu of the last batch did not ask for outputs", i);
    }
    const auto n_embd = static_cast<size_t>(s.model->info().n_embd);
    return {s.hidden.data() + static_cast<size_t>(s.logits_row[i]) * n_embd, n_embd};
}

void Context::seq_rm(int32_t seq_id, int32_t p0, int32_t p1) {
    if (seq_id >= kMaxSequences) throw_error("seq_rm: sequence id %d is out of range", seq_id);
    impl_->cells.seq_rm(seq_id, std::max(0, p0), p1);
}

void Context::clear() { impl_->cells.clear(); }

int32_t Context::seq_pos_max(int32_t seq_id) const {
    if (seq_id < 0 || seq_id >= kMaxSequences) return -1;
    return impl_->cells.seq_pos_max(seq_id);
}

std::vector<LayerSelection> Context::last_selections() const {
    return impl_->model->arch().last_selections(*impl_->state);
}

void Context::fill_synthetic(int32_t seq_id, int64_t n_tokens, uint64_t seed) {
    Impl &s = *impl_;
    if (seq_id < 0 || seq_id >= kMaxSequences) throw_error("fill_synthetic: sequence id %d is out of range", seq_id);
    const std::vector<int32_t> cells = s.cells.find_free(n_tokens);
    const int32_t pos0 = s.cells.seq_pos_max(seq_id) + 1;
    for (int64_t i = 0; i < n_tokens; ++i) s.cells.assign(cells[i], pos0 + static_cast<int32_t>(i), seq_id);
    s.model->arch().fill_synthetic(*s.state, cells, seed);
}

int64_t Context::bytes_per_token(int64_t n_kv) const {
    return impl_->model->arch().bytes_per_token(*impl_->state, n_kv);
}

SparseStats Context::sparse_stats() const { return impl_->model->arch().sparse_stats(*impl_->state); }

int64_t Context::cache_bytes() const { return impl_->model->arch().cache_bytes(*impl_->state); }

const Model &Context::model() const { return *impl_->model; }
const ContextParams &Context::params() const { return impl_->params; }
int64_t Context::n_ctx() const { return impl_->params.n_ctx; }
int64_t Context::n_vocab() const { return impl_->model->info().n_vocab; }

}  // namespace sparrow
