// A context: the KV cache cells, the architecture's per-context state, the thread pool and the logits of
// the last batch. decode() validates the whole batch before touching the cache, then runs it as ubatches.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "cache/kv_cells.h"
#include "core/error.h"
#include "model/model.h"

namespace sparrow {

CacheType cache_type_from_name(std::string_view name) {
    if (name == "f32") return CacheType::f32;
    if (name == "f16") return CacheType::f16;
    if (name == "bf16") return CacheType::bf16;
    if (name == "q8_0") return CacheType::q8_0;
    if (name == "q4_0") return CacheType::q4_0;
    throw_error("unknown cache type '%.*s' (expected f32, f16, bf16, q8_0 or q4_0)", (int)name.size(), name.data());
}

const char *cache_type_name(CacheType t) {
    switch (t) {
        case CacheType::f32: return "f32";
        case CacheType::f16: return "f16";
        case CacheType::bf16: return "bf16";
        case CacheType::q8_0: return "q8_0";
        case CacheType::q4_0: return "q4_0";
    }
    return "?";
}

CacheRotation cache_rotation_from_name(std::string_view name) {
    if (name == "auto") return CacheRotation::quantized;
    if (name == "on") return CacheRotation::on;
    if (name == "off") return CacheRotation::off;
    throw_error("unknown cache rotation '%.*s' (expected auto, on or off)", (int)name.size(), name.data());
}

const char *cache_rotation_name(CacheRotation r) {
    switch (r) {
        case CacheRotation::quantized: return "auto";
        case CacheRotation::on: return "on";
        case CacheRotation::off: return "off";
    }
    return "?";
}

bool cache_rotated(CacheRotation r, CacheType t) {
    return r == CacheRotation::on || (r == CacheRotation::quantized && (t == CacheType::q8_0 || t == CacheType::q4_0));
}

namespace {
DType cache_dtype(CacheType t) {
    switch (t) {
        case CacheType::f32: return DType::F32;
        case CacheType::f16: return DType::F16;
        case CacheType::bf16: return DType::BF16;
        case CacheType::q8_0: return DType::Q8_0;
        case CacheType::q4_0: return DType::Q4_0;
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

    // seq_add / seq_div: moves seq's cells in [p0, p1) to new_pos(pos) and re-rotates their keys.
    void shift(const char *what, int32_t seq, int32_t p0, int32_t p1, const std::function<int32_t(int32_t)> &new_pos,
               bool refuse_collisions);

    Impl(std::shared_ptr<const Model> m, const ContextParams &p)
        : model(std::move(m)),
          params(p),
          pool(p.n_threads > 0 ? p.n_threads : ThreadPool::hardware_threads()),
          cells(p.n_ctx) {}
};

int64_t default_context_size(const ModelInfo &info) {
    return std::min<int64_t>(info.n_ctx_train > 0 ? info.n_ctx_train : 4096, 4096);
}

Context::Context(std::shared_ptr<const Model> model, const ContextParams &params_in) {
    if (!model) throw_error("no model");
    ContextParams p = params_in;
    const ModelInfo &info = model->info();
    if (p.n_ctx < 0 || p.n_batch < 0 || p.n_ubatch < 0) throw_error("context sizes must not be negative");
    if (p.n_threads < 0 || p.n_threads > ContextParams::kMaxThreads)
        throw_error("%d threads is out of range [0, %d]", p.n_threads, ContextParams::kMaxThreads);
    if (p.n_ctx == 0) p.n_ctx = default_context_size(info);
    if (p.n_batch == 0) p.n_batch = p.n_ctx;
    if (p.n_ubatch == 0) p.n_ubatch = 512;
    p.n_batch = std::min(p.n_batch, p.n_ctx);
    p.n_ubatch = std::min(p.n_ubatch, p.n_batch);
    if (p.dsa_sink < 0) throw_error("dsa_sink must not be negative");
    if (p.dsa_top_k < 0) throw_error("dsa_top_k must not be negative (0 = the model's)");
    if (p.n_ctx > (int64_t(1) << 31) - 1) throw_error("context size %lld is too large", (long long)p.n_ctx);
    // The context's allocations are the KV cache and buffers sized by n_ctx / n_batch: running out of memory
    // here means the context asked for is too large, and the message says so rather than just "out of memory".
    try {
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
            .dsa_sink = p.dsa_sink,
            .rotate_k = cache_rotated(p.cache_rotation, p.cache_type_k),
            .rotate_v = cache_rotated(p.cache_rotation, p.cache_type_v),
            .rotate_indexer = cache_rotated(p.cache_rotation, p.indexer_cache_type),
        });
    } catch (const std::bad_alloc &) {
        throw_error(
            "out of memory allocating a context of %lld cells (KV cache and batch buffers); a smaller context "
            "size, batch size or quantised cache types need less",
            (long long)p.n_ctx);
    }
}

Context::~Context() = default;

namespace {

// FNV-1a, 64-bit: the cache digest and the state files' checksum.
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const auto *p = static_cast<const uint8_t *>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

void check_seq(const char *what, int32_t seq) {
    if (seq < 0 || seq >= kMaxSequences) {
        throw_error_code(ErrorCode::bad_sequence, "%s: sequence id %d is outside [0, %d)", what, seq, kMaxSequences);
    }
}

}  // namespace

void Context::decode(std::span<const BatchToken> batch) {
    Impl &s = *impl_;
    const int64_t n = static_cast<int64_t>(batch.size());
    const int64_t n_vocab = s.model->info().n_vocab;
    if (n == 0) throw_error_code(ErrorCode::invalid_batch, "decode: the batch is empty");
    if (n > s.params.n_batch) {
        throw_error_code(ErrorCode::invalid_batch,
                         "decode: a batch of %lld tokens exceeds the batch size %lld (raise -b)", (long long)n,
                         (long long)s.params.n_batch);
    }
    // Everything is checked before anything changes, so a refused batch leaves the cache as it was.
    std::vector<SeqSet> seqs(static_cast<size_t>(n));
    SeqSet in_batch;
    int64_t n_outputs = 0;
    for (int64_t i = 0; i < n; ++i) {
        const BatchToken &t = batch[i];
        if (t.id < 0 || t.id >= n_vocab) {
            throw_error_code(ErrorCode::bad_token, "decode: token %lld has id %d, outside the vocabulary [0, %lld)",
                             (long long)i, t.id, (long long)n_vocab);
        }
        if (t.pos < 0) {
            throw_error_code(ErrorCode::invalid_batch, "decode: token %lld has negative position %d", (long long)i,
                             t.pos);
        }
        const auto add_seq = [&](int32_t seq) {
            if (seq < 0 || seq >= kMaxSequences) {
                throw_error_code(ErrorCode::bad_sequence, "decode: token %lld has sequence id %d, outside [0, %d)",
                                 (long long)i, seq, kMaxSequences);
            }
            seqs[i].set(static_cast<size_t>(seq));
        };
        add_seq(t.seq_id);
        for (const int32_t extra : t.extra_seq_ids) add_seq(extra);
        in_batch |= seqs[i];
        n_outputs += t.logits ? 1 : 0;
    }
    // Per sequence of the batch, the last position it holds (cache, then earlier tokens of the batch).
    std::vector<int32_t> last(kMaxSequences, -1);
    for (int64_t c = 0; c < s.cells.extent(); ++c) {
        if (s.cells.is_empty(c)) continue;
        const SeqSet hit = s.cells.seqs(c) & in_batch;
        for (size_t q = hit._Find_first(); q < hit.size(); q = hit._Find_next(q)) {
            last[q] = std::max(last[q], s.cells.pos(c));
        }
    }
    const std::vector<int32_t> cache_last = last;
    for (int64_t i = 0; i < n; ++i) {
        const int32_t p = batch[i].pos;
        for (size_t q = seqs[i]._Find_first(); q < seqs[i].size(); q = seqs[i]._Find_next(q)) {
            if (p <= last[q]) {
                const bool in_cache = last[q] == cache_last[q];
                throw_error_code(ErrorCode::position_order,
                                 "decode: token %lld of sequence %zu has position %d, but %s already holds position "
                                 "%d (positions must increase within a sequence; remove a tail with seq_rm first)",
                                 (long long)i, q, p, in_cache ? "the cache" : "an earlier token of the batch", last[q]);
            }
            last[q] = p;
        }
    }
    const std::vector<int32_t> free_cells = s.cells.find_free(n);  // throws (context_full) before any change

    s.logits.assign(static_cast<size_t>(n_outputs * n_vocab), 0.0f);
    const int64_t n_embd = s.model->info().n_embd;
    s.hidden.assign(s.params.embeddings ? static_cast<size_t>(n_outputs * n_embd) : 0, 0.0f);
    s.logits_row.assign(static_cast<size_t>(n), -1);
    std::vector<int32_t> tokens, pos, cells, outputs;
    std::vector<SeqSet> ub_seqs;
    int64_t out_row = 0;
    int64_t n_assigned = 0;
    try {
        for (int64_t start = 0; start < n; start += s.params.n_ubatch) {
            const int64_t end = std::min(n, start + s.params.n_ubatch);
            tokens.clear(), pos.clear(), ub_seqs.clear(), cells.clear(), outputs.clear();
            for (int64_t i = start; i < end; ++i) {
                tokens.push_back(batch[i].id);
                pos.push_back(batch[i].pos);
                ub_seqs.push_back(seqs[i]);
                cells.push_back(free_cells[i]);
                s.cells.assign(free_cells[i], batch[i].pos, seqs[i]);
                ++n_assigned;
                if (batch[i].logits) {
                    outputs.push_back(static_cast<int32_t>(i - start));
                    s.logits_row[i] = static_cast<int32_t>(out_row + outputs.size() - 1);
                }
            }
            float *hidden_out = s.params.embeddings ? s.hidden.data() + out_row * n_embd : nullptr;
            const UBatch ub{tokens, pos, ub_seqs, cells, outputs, hidden_out, start == 0};
            s.model->arch().forward(*s.state, s.cells, ub, s.pool, s.logits.data() + out_row * n_vocab);
            out_row += static_cast<int64_t>(outputs.size());
        }
    } catch (...) {
        // A failure inside a forward pass (not a refused batch): the cells taken by this batch become free
        // again, so the cache holds what it held before (rows of free cells may have been written).
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
    if (seq_id >= kMaxSequences) check_seq("seq_rm", seq_id);
    impl_->cells.seq_rm(seq_id, std::max(0, p0), p1);
}

void Context::clear() { impl_->cells.clear(); }

int32_t Context::seq_pos_max(int32_t seq_id) const {
    if (seq_id < 0 || seq_id >= kMaxSequences) return -1;
    return impl_->cells.seq_pos_max(seq_id);
}

int32_t Context::seq_pos_min(int32_t seq_id) const {
    if (seq_id < 0 || seq_id >= kMaxSequences) return -1;
    return impl_->cells.seq_pos_min(seq_id);
}

int64_t Context::seq_n_cells(int32_t seq_id) const {
    if (seq_id < 0 || seq_id >= kMaxSequences) return 0;
    return static_cast<int64_t>(impl_->cells.seq_cells_by_pos(seq_id).size());
}

int64_t Context::n_cells_used() const { return impl_->cells.n_used(); }

void Context::seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1) {
    check_seq("seq_cp", src);
    check_seq("seq_cp", dst);
    impl_->cells.seq_cp(src, dst, std::max(0, p0), p1);
}

void Context::seq_keep(int32_t seq_id) {
    check_seq("seq_keep", seq_id);
    impl_->cells.seq_keep(seq_id);
}

void Context::Impl::shift(const char *what, int32_t seq, int32_t p0, int32_t p1,
                          const std::function<int32_t(int32_t)> &new_pos, bool refuse_collisions) {
    check_seq(what, seq);
    const std::vector<int32_t> moved = cells.seq_cells_in(seq, std::max(0, p0), p1);
    // Plan everything before changing anything: which cells leave the sequence (negative positions), which
    // must be split off because other sequences share them, and whether positions collide.
    std::vector<int32_t> shift_cells, deltas;
    int64_t n_split = 0;
    for (const int32_t c : moved) {
        const int32_t np = new_pos(cells.pos(c));
        if (np < 0 || np == cells.pos(c)) continue;
        n_split += cells.seqs(c).count() > 1 ? 1 : 0;
    }
    if (refuse_collisions) {
        std::vector<int32_t> kept, shifted;
        for (const int32_t c : cells.seq_cells_by_pos(seq)) {
            const bool in = std::binary_search(moved.begin(), moved.end(), c);  // moved is in cell order
            if (!in)
                kept.push_back(cells.pos(c));
            else if (new_pos(cells.pos(c)) >= 0)
                shifted.push_back(new_pos(cells.pos(c)));
        }
        std::sort(shifted.begin(), shifted.end());
        for (const int32_t p : kept) {
            if (std::binary_search(shifted.begin(), shifted.end(), p)) {
                throw_error_code(ErrorCode::position_order,
                                 "%s: shifting sequence %d would put two of its cells at position %d", what, seq, p);
            }
        }
    }
    const std::vector<int32_t> spare = cells.find_free(n_split);  // throws (context_full) before any change
    const std::vector<NamedStore> all = model->arch().stores(*state);
    size_t next_spare = 0;
    for (const int32_t c : moved) {
        const int32_t old_pos = cells.pos(c);
        const int32_t np = new_pos(old_pos);
        if (np == old_pos) continue;
        if (np < 0) {
            cells.remove_seq(c, seq);
            continue;
        }
        int32_t target = c;
        if (cells.seqs(c).count() > 1) {  // shared: the other sequences keep this cell, seq gets a copy
            target = spare[next_spare++];
            for (const NamedStore &st : all) {
                if (st.store->n_bytes() > 0) st.store->copy_row(c, target);
            }
            cells.remove_seq(c, seq);
            cells.assign(target, np, seq);
        } else {
            cells.set_pos(c, np);
        }
        shift_cells.push_back(target);
        deltas.push_back(np - old_pos);
    }
    model->arch().shift_rows(*state, shift_cells, deltas);
}

int32_t Context::context_shift(int32_t seq_id, int32_t n_keep) {
    check_seq("context_shift", seq_id);
    if (n_keep < 0) throw_error("context_shift: n_keep %d is negative", n_keep);
    const int32_t n_left = seq_pos_max(seq_id) + 1 - n_keep;
    const int32_t n_discard = n_left > 1 ? n_left / 2 : 0;
    if (n_discard == 0) return 0;
    seq_rm(seq_id, n_keep, n_keep + n_discard);
    seq_add(seq_id, n_keep + n_discard, -1, -n_discard);
    return n_discard;
}

void Context::seq_add(int32_t seq_id, int32_t p0, int32_t p1, int32_t delta) {
    if (delta == 0) return check_seq("seq_add", seq_id);
    check_seq("seq_add", seq_id);
    if (delta > 0 && int64_t(impl_->cells.seq_pos_max(seq_id)) + delta > INT32_MAX - 1) {
        throw_error_code(ErrorCode::position_order, "seq_add: shifting sequence %d by %d overflows the positions",
                         seq_id, delta);
    }
    impl_->shift(
        "seq_add", seq_id, p0, p1, [delta](int32_t p) { return p + delta; }, true);
}

void Context::seq_div(int32_t seq_id, int32_t p0, int32_t p1, int32_t d) {
    if (d <= 0) throw_error("seq_div: the divisor %d must be positive", d);
    if (d == 1) return check_seq("seq_div", seq_id);
    impl_->shift(
        "seq_div", seq_id, p0, p1, [d](int32_t p) { return p / d; }, false);
}

void Context::defrag() {
    Impl &s = *impl_;
    const std::vector<NamedStore> all = s.model->arch().stores(*s.state);
    // Occupied cells move, in order, to the lowest free cells: a destination is always below its source
    // and already vacated, so no row is overwritten before it has moved.
    int32_t dst = 0;
    for (int32_t c = 0; c < s.cells.extent(); ++c) {
        if (s.cells.is_empty(c)) continue;
        if (c != dst) {
            for (const NamedStore &st : all) {
                if (st.store->n_bytes() > 0) st.store->copy_row(c, dst);
            }
            s.cells.move(c, dst);
        }
        ++dst;
    }
}

// --- sequence state files ---------------------------------------------------------------------------------
//
// Little-endian, version 2:
//   "SPRWSEQ\0"  u32 version
//   str arch, i64 n_layer, i64 n_embd, i64 n_vocab          (str = u32 length + bytes)
//   u32 n_stores; per store: str name, u32 dtype, i64 width, i64 row_bytes, i64 has_rows (0/1),
//                 i64 rotated (0/1: rows Hadamard-rotated before encoding)
//   u32 n_cells;  per cell, in position order: i32 pos, then the raw row bytes of each store that has rows
//   u32 n_tokens (<= n_cells); i32 token ids (the caller's record of the rows; version 1 has no such part)
//   u64 FNV-1a checksum of every byte before it
namespace {

constexpr char kStateMagic[8] = {'S', 'P', 'R', 'W', 'S', 'E', 'Q', '\0'};
constexpr uint32_t kStateVersion = 2;  // version 1 (no tokens) is read too

struct StateWriter {
    std::string bytes;
    void raw(const void *p, size_t n) { bytes.append(static_cast<const char *>(p), n); }
    template <typename T>
    void put(T v) {
        raw(&v, sizeof v);
    }
    void str(const std::string &v) {
        put(static_cast<uint32_t>(v.size()));
        raw(v.data(), v.size());
    }
};

// Reads a state file's bytes with bounds checks: any short read is a clear error, never a crash.
struct StateReader {
    const std::string &bytes;
    const std::string &path;
    size_t at = 0;
    const char *raw(size_t n) {
        if (n > bytes.size() - at) {
            throw_error_code(ErrorCode::state_file, "state file '%s' is truncated (at byte %zu of %zu)", path.c_str(),
                             at, bytes.size());
        }
        const char *p = bytes.data() + at;
        at += n;
        return p;
    }
    template <typename T>
    T get() {
        T v;
        std::memcpy(&v, raw(sizeof v), sizeof v);
        return v;
    }
    std::string str() {
        const auto n = get<uint32_t>();
        if (n > 4096) throw_error_code(ErrorCode::state_file, "state file '%s': a name of %u bytes", path.c_str(), n);
        return std::string(raw(n), n);
    }
};

}  // namespace

void Context::state_seq_save(int32_t seq_id, const std::string &path, std::span<const int32_t> tokens) const {
    check_seq("state_seq_save", seq_id);
    const Impl &s = *impl_;
    const ModelInfo &info = s.model->info();
    const std::vector<int32_t> cells = s.cells.seq_cells_by_pos(seq_id);
    if (tokens.size() > cells.size()) {
        throw_error_code(ErrorCode::state_file, "state_seq_save: %zu tokens for a sequence of %zu cells", tokens.size(),
                         cells.size());
    }
    for (const int32_t t : tokens) {
        if (t < 0 || t >= info.n_vocab) {
            throw_error_code(ErrorCode::state_file, "state_seq_save: token %d is outside the vocabulary (%lld)", t,
                             (long long)info.n_vocab);
        }
    }
    const std::vector<NamedStore> all = s.model->arch().stores(*s.state);
    StateWriter w;
    w.raw(kStateMagic, sizeof kStateMagic);
    w.put(kStateVersion);
    w.str(info.arch);
    w.put<int64_t>(info.n_layer);
    w.put<int64_t>(info.n_embd);
    w.put<int64_t>(info.n_vocab);
    w.put(static_cast<uint32_t>(all.size()));
    for (const NamedStore &st : all) {
        w.str(st.name);
        w.put(static_cast<uint32_t>(st.store->type()));
        w.put<int64_t>(st.store->width());
        w.put<int64_t>(st.store->row_bytes());
        w.put<int64_t>(st.store->n_bytes() > 0 ? 1 : 0);
        w.put<int64_t>(st.store->rotation().empty() ? 0 : 1);  // rows Hadamard-rotated before encoding
    }
    w.put(static_cast<uint32_t>(cells.size()));
    for (const int32_t c : cells) {
        w.put(s.cells.pos(c));
        for (const NamedStore &st : all) {
            if (st.store->n_bytes() > 0) w.raw(st.store->row(c), static_cast<size_t>(st.store->row_bytes()));
        }
    }
    w.put(static_cast<uint32_t>(tokens.size()));
    for (const int32_t t : tokens) w.put(t);
    w.put(fnv1a(kFnvOffset, w.bytes.data(), w.bytes.size()));
    FILE *out = std::fopen(path.c_str(), "wb");
    if (!out) throw_error_code(ErrorCode::state_file, "state_seq_save: cannot create '%s'", path.c_str());
    const bool ok = std::fwrite(w.bytes.data(), 1, w.bytes.size(), out) == w.bytes.size();
    if (std::fclose(out) != 0 || !ok) {
        throw_error_code(ErrorCode::state_file, "state_seq_save: cannot write '%s'", path.c_str());
    }
}

std::vector<int32_t> Context::state_seq_load(int32_t seq_id, const std::string &path) {
    check_seq("state_seq_load", seq_id);
    Impl &s = *impl_;
    std::string bytes;
    {
        // Only a regular file, and no larger than a state of this context can be: a FIFO would block and a
        // device such as /dev/zero read until memory ran out.
        std::error_code ec;
        const std::filesystem::file_status status = std::filesystem::status(path, ec);
        if (!std::filesystem::is_regular_file(status)) {
            throw_error_code(ErrorCode::state_file, "state_seq_load: '%s' is not a regular file%s", path.c_str(),
                             std::filesystem::exists(status) ? "" : " (it does not exist)");
        }
        int64_t most = int64_t(1) << 20;  // the header (names of the stores, sizes) with room to spare
        int64_t cell_bytes = sizeof(int32_t);
        for (const NamedStore &st : s.model->arch().stores(*s.state)) {
            if (st.store->n_bytes() > 0) cell_bytes += st.store->row_bytes();
        }
        most += s.cells.size() * (cell_bytes + int64_t(sizeof(int32_t)));  // rows and a token per cell
        const auto size = std::filesystem::file_size(path, ec);
        if (!ec && static_cast<int64_t>(size) > most) {
            throw_error_code(ErrorCode::state_file,
                             "state file '%s' holds %llu bytes, more than a state of this "
                             "context can (%lld)",
                             path.c_str(), (unsigned long long)size, (long long)most);
        }
        std::ifstream in(path, std::ios::binary);
        if (!in) throw_error_code(ErrorCode::state_file, "state_seq_load: cannot open '%s'", path.c_str());
        std::ostringstream ss;
        ss << in.rdbuf();
        bytes = ss.str();
    }
    const auto bad = [&](const std::string &why) {
        throw_error_code(ErrorCode::state_file, "state file '%s' does not fit this context: %s", path.c_str(),
                         why.c_str());
    };
    if (bytes.size() < sizeof kStateMagic + sizeof(uint32_t) + sizeof(uint64_t) ||
        std::memcmp(bytes.data(), kStateMagic, sizeof kStateMagic) != 0) {
        throw_error_code(ErrorCode::state_file, "'%s' is not a sparrow sequence state file (bad magic)", path.c_str());
    }
    uint64_t stored_sum;
    std::memcpy(&stored_sum, bytes.data() + bytes.size() - sizeof stored_sum, sizeof stored_sum);
    StateReader r{bytes, path, sizeof kStateMagic};
    const auto version = r.get<uint32_t>();
    if (version < 1 || version > kStateVersion) {
        bad(strprintf("format version %u, this build reads 1 to %u", version, kStateVersion));
    }
    if (fnv1a(kFnvOffset, bytes.data(), bytes.size() - sizeof stored_sum) != stored_sum) {
        throw_error_code(ErrorCode::state_file, "state file '%s' is corrupt (checksum mismatch)", path.c_str());
    }
    const ModelInfo &info = s.model->info();
    const std::string arch = r.str();
    const auto n_layer = r.get<int64_t>(), n_embd = r.get<int64_t>(), n_vocab = r.get<int64_t>();
    if (arch != info.arch || n_layer != info.n_layer || n_embd != info.n_embd || n_vocab != info.n_vocab) {
        bad(strprintf("saved from %s (%lld layers, n_embd %lld, vocab %lld), this model is %s (%lld, %lld, %lld)",
                      arch.c_str(), (long long)n_layer, (long long)n_embd, (long long)n_vocab, info.arch.c_str(),
                      (long long)info.n_layer, (long long)info.n_embd, (long long)info.n_vocab));
    }
    const std::vector<NamedStore> all = s.model->arch().stores(*s.state);
    const auto n_stores = r.get<uint32_t>();
    if (n_stores != all.size()) bad(strprintf("%u cache stores, this context has %zu", n_stores, all.size()));
    size_t cell_bytes = sizeof(int32_t);
    for (const NamedStore &st : all) {
        const std::string name = r.str();
        const auto type = r.get<uint32_t>();
        const auto width = r.get<int64_t>(), row_bytes = r.get<int64_t>(), has_rows = r.get<int64_t>();
        const auto rotated = r.get<int64_t>();
        const bool here = st.store->n_bytes() > 0;
        if (rotated != (st.store->rotation().empty() ? 0 : 1)) {
            bad(strprintf("store '%s' was saved %s, this context's is %s (--cache-rotation)", st.name.c_str(),
                          rotated ? "rotated" : "unrotated", st.store->rotation().empty() ? "unrotated" : "rotated"));
        }
        if (name != st.name || type != static_cast<uint32_t>(st.store->type()) || width != st.store->width() ||
            row_bytes != st.store->row_bytes() || has_rows != (here ? 1 : 0)) {
            const auto saved_type = dtype_info(type);
            bad(strprintf("store '%s' (type %s, width %lld) was saved as '%s' (type %s, width %lld)", st.name.c_str(),
                          std::string(dtype_name(st.store->type())).c_str(), (long long)st.store->width(), name.c_str(),
                          saved_type ? std::string(saved_type->name).c_str() : "unknown", (long long)width));
        }
        if (here) cell_bytes += static_cast<size_t>(row_bytes);
    }
    const auto n_cells = r.get<uint32_t>();
    if (n_cells > s.cells.size()) bad(strprintf("%u cells, the context has %lld", n_cells, (long long)s.cells.size()));
    // After the cells: version 2's tokens (a count and the ids), then the checksum. The tokens are read first (the
    // reader jumps past the cells), so that the file's length is checked before anything is placed.
    const size_t cells_at = r.at, cells_end = cells_at + size_t(n_cells) * cell_bytes;
    std::vector<int32_t> tokens;
    if (version >= 2 && bytes.size() >= cells_end + sizeof(uint32_t)) {
        r.at = cells_end;
        const auto n_tokens = r.get<uint32_t>();
        if (n_tokens > n_cells) bad(strprintf("%u tokens for %u cells", n_tokens, n_cells));
        tokens.resize(n_tokens);
    }
    const size_t expected =
        cells_end + (version >= 2 ? sizeof(uint32_t) + tokens.size() * sizeof(int32_t) : 0) + sizeof stored_sum;
    if (bytes.size() != expected) {
        throw_error_code(ErrorCode::state_file, "state file '%s' has %zu bytes, expected %zu for its %u cells%s",
                         path.c_str(), bytes.size(), expected, n_cells, version >= 2 ? " and tokens" : "");
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = r.get<int32_t>();
        if (tokens[i] < 0 || tokens[i] >= info.n_vocab)
            bad(strprintf("token %zu is %d, outside the vocabulary", i, tokens[i]));
    }
    r.at = cells_at;
    int32_t prev = -1;
    for (uint32_t i = 0; i < n_cells; ++i) {
        const auto p = r.get<int32_t>();
        // Equal positions are a sequence's after seq_div (cells may share one); decreasing ones are damage.
        if (p < 0 || p < prev)
            bad(strprintf("cell %u has position %d after %d (positions must not decrease)", i, p, prev));
        prev = p;
        r.raw(cell_bytes - sizeof(int32_t));
    }

    // Place the rows on a copy of the cell table, so that nothing changes unless everything fits.
    KvCells placed = s.cells;
    placed.seq_rm(seq_id, 0, -1);
    const std::vector<int32_t> free_cells = placed.find_free(n_cells);  // throws (context_full)
    r.at = cells_at;
    for (uint32_t i = 0; i < n_cells; ++i) {
        const int32_t c = free_cells[i];
        placed.assign(c, r.get<int32_t>(), seq_id);
        for (const NamedStore &st : all) {
            if (st.store->n_bytes() > 0) {
                st.store->write_raw(c, r.raw(static_cast<size_t>(st.store->row_bytes())));
            }
        }
    }
    s.cells = std::move(placed);
    return tokens;
}

uint64_t Context::cache_digest() const {
    const Impl &s = *impl_;
    uint64_t h = kFnvOffset;
    for (const NamedStore &st : s.model->arch().stores(*s.state)) {
        const int64_t n_rows = st.store->row_bytes() > 0 ? st.store->n_bytes() / st.store->row_bytes() : 0;
        if (n_rows > 0) h = fnv1a(h, st.store->row(0), static_cast<size_t>(st.store->n_bytes()));
    }
    for (int64_t c = 0; c < s.cells.size(); ++c) {
        const int32_t p = s.cells.pos(c);
        h = fnv1a(h, &p, sizeof p);
        const std::string bits = s.cells.seqs(c).to_string();
        if (p >= 0) h = fnv1a(h, bits.data(), bits.size());
    }
    return h;
}

std::vector<LayerSelection> Context::last_selections() const {
    return impl_->model->arch().last_selections(*impl_->state);
}

void Context::fill_synthetic(int32_t seq_id, int64_t n_tokens, uint64_t seed) {
    Impl &s = *impl_;
    if (seq_id < 0 || seq_id >= kMaxSequences) throw_error("fill_synthetic: sequence id %d is out of range", seq_id);
    const std::vector<int32_t> cells = s.cells.find_free(n_tokens);  // refuses a negative count too
    // The rows go after the sequence's last position, which must stay a position (< 2^31).
    const int64_t pos0 = int64_t(s.cells.seq_pos_max(seq_id)) + 1;
    if (pos0 + n_tokens - 1 > INT32_MAX) {
        throw_error_code(ErrorCode::position_order,
                         "fill_synthetic: %lld positions after %lld pass the largest position, %d", (long long)n_tokens,
                         (long long)pos0 - 1, INT32_MAX);
    }
    for (int64_t i = 0; i < n_tokens; ++i) s.cells.assign(cells[i], static_cast<int32_t>(pos0 + i), seq_id);
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
