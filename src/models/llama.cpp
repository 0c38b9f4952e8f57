// The Llama architecture (GGUF arch "llama"): RMSNorm, RoPE (adjacent pairs, as llama.cpp's converter
// permutes the q/k weights for), grouped-query attention, SwiGLU feed-forward, tied or separate output.
//
// Per layer, for a ubatch of T tokens:
//   cur  = rms_norm(x) * attn_norm                       [T, n_embd]
//   q    = rope(wq cur), k = rope(wk cur), v = wv cur    [T, n_head*d], [T, n_head_kv*d], [T, n_head_kv*d]
//   k, v -> cache cells of the tokens
//   att  = softmax(q k^T / sqrt(d)) v over each token's visible cells   [T, n_head*d]
//   x   += wo att
//   cur  = rms_norm(x) * ffn_norm
//   x   += ffn_down(silu(ffn_gate cur) * ffn_up cur)
// then logits = output(rms_norm(x) * output_norm) for the rows that asked for them.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "cache/visible_rows.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/rope_shift.h"

namespace sparrow {

namespace {

struct LlamaHParams {
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_ff = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;
    int64_t n_ctx_train = 0;
    float rms_eps = 1e-5f;
    RopeParams rope;
};

struct LlamaLayer {
    const float *attn_norm;  // [n_embd]
    WeightMatrix wq;         // [n_head*d, n_embd]
    WeightMatrix wk;         // [n_head_kv*d, n_embd]
    WeightMatrix wv;         // [n_head_kv*d, n_embd]
    WeightMatrix wo;         // [n_embd, n_head*d]
    const float *ffn_norm;   // [n_embd]
    WeightMatrix ffn_gate;   // [n_ff, n_embd]
    WeightMatrix ffn_up;     // [n_ff, n_embd]
    WeightMatrix ffn_down;   // [n_embd, n_ff]
};

struct LlamaState final : ArchState {
    std::vector<RowStore> k_cache, v_cache;  // per layer: [n_ctx, n_head_kv*d]
    // Per-head Hadamard rotation (RowRotation) of queries when K rows are rotated, and of the attention
    // output (a sum of rotated V rows) when V rows are; empty otherwise.
    RowRotation q_rotation, out_rotation;
    // Scratch for one ubatch of up to n_ubatch tokens.
    std::vector<float> x, cur, q, k, v, att, gate, up, out_x;
    WantedRows wanted;  // the last layer's tokens when only some rows want outputs
    VisibleRows visible;
    AttentionWorkspace attention_workspace;  // attention()'s buffers, kept between calls
    OpScratch op;
};

RopeParams read_rope(const gguf::File &f, const std::string &arch, int64_t head_dim) {
    RopeParams p;
    p.layout = RopeLayout::adjacent;
    p.n_rot = static_cast<int>(f.get_int(arch + ".rope.dimension_count", head_dim));
    p.freq_base = static_cast<float>(hparam_float(f, arch + ".rope.freq_base", 10000.0, FloatRange::positive));
    const std::string scaling = f.get_string(arch + ".rope.scaling.type", "none");
    double factor = hparam_float(f, arch + ".rope.scaling.factor", 0.0, FloatRange::non_negative);
    if (factor == 0.0) factor = hparam_float(f, arch + ".rope.scale_linear", 1.0, FloatRange::positive);
    if (scaling == "none" || scaling == "linear") {
        p.freq_scale = factor > 0.0 ? static_cast<float>(1.0 / factor) : 1.0f;
    } else if (scaling == "yarn") {
        p.freq_scale = factor > 0.0 ? static_cast<float>(1.0 / factor) : 1.0f;
        p.ext_factor = 1.0f;
        p.n_ctx_orig = static_cast<int>(hparam_int(f, arch + ".rope.scaling.original_context_length", 1, INT32_MAX,
                                                   hparam_int(f, arch + ".context_length", 1, INT32_MAX, 4096)));
    } else {
        throw_error("%s: rope scaling type '%s' is not supported", f.name().c_str(), scaling.c_str());
    }
    if (p.n_ctx_orig == 0) p.n_ctx_orig = static_cast<int>(hparam_int(f, arch + ".context_length", 1, INT32_MAX, 4096));
    if (p.n_rot <= 0 || p.n_rot > head_dim || p.n_rot % 2) {
        throw_error("%s: rope dimension count %d must be even and in [2, %lld]", f.name().c_str(), p.n_rot,
                    (long long)head_dim);
    }
    return p;
}

class LlamaModel final : public ArchModel {
  public:
    LlamaModel(const gguf::File &f, WeightLoader &w, ModelInfo &info) {
        const std::string a = "llama";
        hp_.n_embd = f.get_int(a + ".embedding_length");
        hp_.n_layer = f.get_int(a + ".block_count");
        hp_.n_ff = f.get_int(a + ".feed_forward_length");
        hp_.n_head = f.get_int(a + ".attention.head_count");
        hp_.n_head_kv = f.get_int(a + ".attention.head_count_kv", hp_.n_head);
        hp_.n_ctx_train = f.get_int(a + ".context_length", 2048);
        hp_.rms_eps =
            static_cast<float>(hparam_float(f, a + ".attention.layer_norm_rms_epsilon", 1e-5, FloatRange::positive));
        if (hp_.n_embd <= 0 || hp_.n_layer <= 0 || hp_.n_ff <= 0 || hp_.n_head <= 0 || hp_.n_head_kv <= 0 ||
            hp_.n_head % hp_.n_head_kv != 0 || hp_.n_embd % hp_.n_head != 0 || hp_.n_layer > 4096) {
            throw_error(
                "%s: inconsistent llama hyper-parameters (n_embd %lld, n_layer %lld, n_ff %lld, n_head %lld, "
                "n_head_kv %lld)",
                f.name().c_str(), (long long)hp_.n_embd, (long long)hp_.n_layer, (long long)hp_.n_ff,
                (long long)hp_.n_head, (long long)hp_.n_head_kv);
        }
        hp_.head_dim = f.get_int(a + ".attention.key_length", hp_.n_embd / hp_.n_head);
        if (f.get_int(a + ".attention.value_length", hp_.head_dim) != hp_.head_dim) {
            throw_error("%s: llama with different key and value head sizes is not supported", f.name().c_str());
        }
        hp_.rope = read_rope(f, a, hp_.head_dim);
        rope_table_ = RopeTable(hp_.rope);
        if (w.has("rope_freqs.weight")) {
            throw_error(
                "%s: per-dimension RoPE frequency factors (rope_freqs.weight, Llama 3.1) are not supported "
                "yet",
                f.name().c_str());
        }

        const gguf::TensorInfo *embd = f.find_tensor("token_embd.weight");
        if (!embd || embd->ne.size() != 2)
            throw_error("%s: tensor 'token_embd.weight' is missing or not 2-D", f.name().c_str());
        hp_.n_vocab = embd->ne[1];
        tok_embd_ = w.matrix("token_embd.weight", hp_.n_embd, hp_.n_vocab);
        output_norm_ = w.vector("output_norm.weight", hp_.n_embd);
        output_ = w.has("output.weight") ? w.matrix("output.weight", hp_.n_embd, hp_.n_vocab) : tok_embd_;

        const int64_t q_dim = hp_.n_head * hp_.head_dim, kv_dim = hp_.n_head_kv * hp_.head_dim;
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            const std::string p = "blk." + std::to_string(il) + ".";
            layers_.push_back(LlamaLayer{
                .attn_norm = w.vector(p + "attn_norm.weight", hp_.n_embd),
                .wq = w.matrix(p + "attn_q.weight", hp_.n_embd, q_dim),
                .wk = w.matrix(p + "attn_k.weight", hp_.n_embd, kv_dim),
                .wv = w.matrix(p + "attn_v.weight", hp_.n_embd, kv_dim),
                .wo = w.matrix(p + "attn_output.weight", q_dim, hp_.n_embd),
                .ffn_norm = w.vector(p + "ffn_norm.weight", hp_.n_embd),
                .ffn_gate = w.matrix(p + "ffn_gate.weight", hp_.n_embd, hp_.n_ff),
                .ffn_up = w.matrix(p + "ffn_up.weight", hp_.n_embd, hp_.n_ff),
                .ffn_down = w.matrix(p + "ffn_down.weight", hp_.n_ff, hp_.n_embd),
            });
        }
        info.n_vocab = hp_.n_vocab;
        info.n_embd = hp_.n_embd;
        info.n_layer = hp_.n_layer;
        info.n_ctx_train = hp_.n_ctx_train;
    }

    std::unique_ptr<ArchState> create_state(const StateParams &sp) const override {
        auto s = std::make_unique<LlamaState>();
        const int64_t kv_dim = hp_.n_head_kv * hp_.head_dim, q_dim = hp_.n_head * hp_.head_dim;
        // Attention reads K and V per head, so a quantised cache needs whole 32-blocks per head.
        for (const DType t : {sp.cache_type_k, sp.cache_type_v}) {
            const int64_t block = dtype_info(t).block_size;
            if (hp_.head_dim % block != 0) {
                throw_error("a %s cache needs a head size that is a multiple of %lld; this model's is %lld",
                            std::string(dtype_name(t)).c_str(), (long long)block, (long long)hp_.head_dim);
            }
        }
        const RowRotation head_rot = RowRotation().segment(hp_.head_dim);
        const RowRotation row_rot = RowRotation().segment(hp_.head_dim, hp_.n_head_kv);
        if (sp.rotate_k) s->q_rotation = head_rot;
        if (sp.rotate_v) s->out_rotation = head_rot;
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            s->k_cache.emplace_back(sp.cache_type_k, sp.n_ctx, kv_dim, sp.rotate_k ? row_rot : RowRotation());
            s->v_cache.emplace_back(sp.cache_type_v, sp.n_ctx, kv_dim, sp.rotate_v ? row_rot : RowRotation());
        }
        const auto n = static_cast<size_t>(sp.n_ubatch);
        s->x.resize(n * hp_.n_embd);
        s->cur.resize(n * hp_.n_embd);
        s->q.resize(n * q_dim);
        s->k.resize(n * kv_dim);
        s->v.resize(n * kv_dim);
        s->att.resize(n * q_dim);
        s->gate.resize(n * hp_.n_ff);
        s->up.resize(n * hp_.n_ff);
        s->out_x.resize(n * hp_.n_embd);
        return s;
    }

    void forward(ArchState &state, const KvCells &cells, const UBatch &ub, ThreadPool &pool,
                 float *logits) const override {
        auto &s = static_cast<LlamaState &>(state);
        const int64_t T = ub.size(), n_embd = hp_.n_embd;
        const int64_t kv_dim = hp_.n_head_kv * hp_.head_dim;
        float *x = s.x.data(), *cur = s.cur.data();

        s.visible.build(cells, ub.pos, ub.seq);  // each token's visible cells, by position

        get_rows(tok_embd_, ub.tokens.data(), T, x);  // x: [T, n_embd]
        const AttentionShape shape{hp_.n_head, hp_.n_head_kv, hp_.head_dim, hp_.head_dim,
                                   1.0f / std::sqrt(static_cast<float>(hp_.head_dim))};
        // The last layer's queries, attention and FFN run for the rows whose outputs are wanted only (WantedRows).
        const UBatch *q_ub = &ub;  // the tokens whose queries run: all, or the wanted ones in the last layer
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            const LlamaLayer &L = layers_[il];
            rms_norm(x, L.attn_norm, cur, T, n_embd, hp_.rms_eps);
            matmul(pool, s.op, L.wk, cur, T, s.k.data());  // [T, n_head_kv*d]
            matmul(pool, s.op, L.wv, cur, T, s.v.data());  // [T, n_head_kv*d]
            rope(s.k.data(), T, hp_.n_head_kv, hp_.head_dim, ub.pos.data(), rope_table_);
            for (int64_t t = 0; t < T; ++t) {
                s.k_cache[il].write(ub.cells[t], s.k.data() + t * kv_dim);
                s.v_cache[il].write(ub.cells[t], s.v.data() + t * kv_dim);
            }
            if (il + 1 == hp_.n_layer && static_cast<int64_t>(ub.output_rows.size()) < T) {
                s.wanted.build(ub);
                compact_rows(x, n_embd, ub.output_rows);
                compact_rows(cur, n_embd, ub.output_rows);
                s.visible.build(cells, s.wanted.ub.pos, s.wanted.ub.seq);
                q_ub = &s.wanted.ub;
            }
            const int64_t TQ = q_ub->size();
            matmul(pool, s.op, L.wq, cur, TQ, s.q.data());  // [TQ, n_head*d]
            rope(s.q.data(), TQ, hp_.n_head, hp_.head_dim, q_ub->pos.data(), rope_table_);
            s.q_rotation.apply(s.q.data(), TQ * hp_.n_head);  // as the stored K rows (identity if not rotated)
            attention(pool, shape, s.q.data(), TQ, s.k_cache[il], s.v_cache[il], s.visible.rows(), s.att.data(),
                      &s.attention_workspace);
            s.out_rotation.apply(s.att.data(), TQ * hp_.n_head);  // back from the rotated V rows
            matmul(pool, s.op, L.wo, s.att.data(), TQ, cur);      // [TQ, n_embd]
            for (int64_t i = 0; i < TQ * n_embd; ++i) x[i] += cur[i];

            rms_norm(x, L.ffn_norm, cur, TQ, n_embd, hp_.rms_eps);
            swiglu_ffn(pool, s.op, L.ffn_gate, L.ffn_up, L.ffn_down, cur, TQ, s.gate.data(), s.up.data(), cur);
            for (int64_t i = 0; i < TQ * n_embd; ++i) x[i] += cur[i];
        }

        output_head(pool, s.op, output_, output_norm_, hp_.rms_eps, x, n_embd, q_ub->output_rows, s.out_x.data(),
                    logits, ub.hidden_out);
    }

    void fill_synthetic(ArchState &state, std::span<const int32_t> cells, uint64_t seed) const override {
        auto &s = static_cast<LlamaState &>(state);
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            s.k_cache[il].fill_random(cells, seed + 2 * il, 1.7f);
            s.v_cache[il].fill_random(cells, seed + 2 * il + 1, 1.7f);
        }
    }

    int64_t cache_bytes(const ArchState &state) const override {
        const auto &s = static_cast<const LlamaState &>(state);
        int64_t bytes = 0;
        for (int64_t il = 0; il < hp_.n_layer; ++il) bytes += s.k_cache[il].n_bytes() + s.v_cache[il].n_bytes();
        return bytes;
    }

    // Cache-operation hooks: K and V per layer; only K is RoPE'd (every head, adjacent pairs).
    std::vector<NamedStore> stores(ArchState &state) const override {
        auto &s = static_cast<LlamaState &>(state);
        std::vector<NamedStore> out;
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            out.push_back({"blk." + std::to_string(il) + ".k", &s.k_cache[il]});
            out.push_back({"blk." + std::to_string(il) + ".v", &s.v_cache[il]});
        }
        return out;
    }

    void shift_rows(ArchState &state, std::span<const int32_t> cells, std::span<const int32_t> deltas) const override {
        auto &s = static_cast<LlamaState &>(state);
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            shift_stored_rope(s.k_cache[il], cells, deltas, 0, hp_.n_head_kv, hp_.head_dim, hp_.rope);
        }
    }

    int64_t bytes_per_token(const ArchState &state, int64_t n_kv) const override {
        const auto &s = static_cast<const LlamaState &>(state);
        int64_t bytes = tok_embd_.row_bytes + output_.n_rows * output_.row_bytes;
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            const LlamaLayer &L = layers_[il];
            for (const WeightMatrix *m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
                bytes += m->n_rows * m->row_bytes;
            }
            bytes += n_kv * (s.k_cache[il].row_bytes() + s.v_cache[il].row_bytes());
        }
        return bytes;
    }

  private:
    LlamaHParams hp_;
    RopeTable rope_table_;   // hp_.rope's pair tables
    WeightMatrix tok_embd_;  // [n_vocab, n_embd]
    const float *output_norm_ = nullptr;
    WeightMatrix output_;  // [n_vocab, n_embd]; token_embd when tied
    std::vector<LlamaLayer> layers_;
};

}  // namespace

std::unique_ptr<ArchModel> create_llama(const gguf::File &file, WeightLoader &weights, ModelInfo &info) {
    return std::make_unique<LlamaModel>(file, weights, info);
}

}  // namespace sparrow
