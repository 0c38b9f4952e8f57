// DeepSeek-V3.2 (GGUF arch "deepseek32") and GLM-5.x (arch "glm-dsa"): multi-head latent attention (MLA),
// mixture of experts, and the DSA lightning indexer that picks which cached keys each query attends.
// GLM-DSA is a delta on the same blocks: its indexer RoPE uses adjacent pairs (DeepSeek: half-split), and
// with IndexShare some layers have no indexer and reuse the previous full layer's selection.
//
// Per layer, for a ubatch of T tokens (shapes per token; MODELS.md §2):
//   h    = rms_norm(x) * attn_norm                                      [n_embd]
//   qr   = rms_norm(attn_q_a h) * attn_q_a_norm                          [q_lora]      the q latent
//   q    = attn_q_b qr -> per head [q_nope (nope) | q_pe (rope)]         [n_head, nope + rope]
//   kv   = attn_kv_a_mqa h = [c_kv (kv_lora) | k_pe (rope)];  c_kv = rms_norm(c_kv) * attn_kv_a_norm
//   q_pe, k_pe: RoPE, adjacent pairs, YaRN from the metadata;  [c_kv | k_pe] -> latent cache
//   q'   = [W_UK_h q_nope_h | q_pe_h] per head                          [n_head, kv_lora + rope]
//   indexer (full layers): qI = rope(indexer.attn_q_b qr), kI = rope(layer_norm(indexer.attn_k h)) -> cache,
//          w = indexer.proj h / sqrt(D*H); each query keeps its top-k keys by sum_h w * relu(qI_h . kI)
//   o_h  = W_UV_h sum_j softmax_j(kq_scale * q'_h . latent_j) c_kv_j  over the selected (or all) keys
//   x   += attn_output o;   x += ffn(rms_norm(x) * ffn_norm)   (dense SwiGLU or MoE)
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <optional>
#include <string_view>
#include <vector>

#include "attention/attention.h"
#include "attention/lightning_indexer.h"
#include "cache/visible_rows.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/hparams.h"
#include "model/moe.h"
#include "model/rope_shift.h"

namespace sparrow {

namespace {

struct DsaHParams {
    bool glm = false;  // glm-dsa: indexer RoPE in adjacent pairs, IndexShare
    int64_t n_vocab = 0, n_embd = 0, n_ctx_train = 0;
    int64_t n_layer = 0;  // layers run (block_count minus the trailing MTP/NextN layers)
    int64_t n_block = 0;  // block_count: the layers run and the MTP/NextN layers after them
    int64_t n_head = 0, q_lora = 0, kv_lora = 0, nope = 0, n_rot = 0, v_head = 0;
    int64_t n_ff = 0, n_dense_lead = 0;
    MoeParams moe;
    int64_t n_expert_shared = 0;
    int64_t idx_n_head = 0, idx_head_dim = 0, idx_top_k = 0;
    std::vector<bool> indexer_full;  // per layer: has its own indexer (else reuses the last full layer's)
    bool any_shared = false;         // some layer reuses a selection: it must be kept for the whole ubatch
    float rms_eps = 1e-6f;
    RopeParams rope;          // MLA q_pe/k_pe
    RopeParams rope_indexer;  // same frequencies, the arch's layout
    float kq_scale = 1.0f;
};

struct DsaLayer {
    const float *attn_norm, *q_a_norm, *kv_a_norm, *ffn_norm;
    WeightMatrix q_a;       // [q_lora, n_embd]
    WeightMatrix q_b;       // [n_head * (nope + rope), q_lora]
    WeightMatrix kv_a_mqa;  // [kv_lora + rope, n_embd]
    WeightMatrix k_b;       // n_head stacked [kv_lora, nope]: W_UK
    WeightMatrix v_b;       // n_head stacked [v_head, kv_lora]: W_UV
    WeightMatrix wo;        // [n_embd, n_head * v_head]
    // Dense FFN (leading layers) or MoE.
    WeightMatrix ffn_gate, ffn_up, ffn_down;
    MoeWeights moe;
    // Lightning indexer (full layers only).
    WeightMatrix idx_q_b;  // [H * D, q_lora]
    WeightMatrix idx_k;    // [D, n_embd]
    const float *idx_k_norm_w = nullptr, *idx_k_norm_b = nullptr;
    WeightMatrix idx_proj;  // [H, n_embd]
};

struct DsaState final : ArchState {
    std::vector<RowStore> latent;       // per layer: [n_ctx, kv_lora + rope] = [c_kv | k_pe]
    std::vector<RowStore> indexer_key;  // per layer (empty store on shared layers): [n_ctx, D]
    // With a rotated latent cache (RowStore::rotation(): c_kv and k_pe blocks apart), queries are rotated
    // like the rows, and the attention output, a sum of rotated c_kv rows, is rotated back with the c_kv
    // blocks alone before W_UV. Empty when the latent is not rotated.
    RowRotation ckv_rotation;
    bool dsa = true;
    int64_t top_k = 0;
    int64_t sink = 0;  // attention sinks: the first `sink` visible cells of each query are always selected
    IndexerPrecision precision = IndexerPrecision::exact;
    // Scratch. x is the residual stream of the whole ubatch [n_ubatch, n_embd]; h and ffn_out hold one FFN
    // chunk ([kFfnChunk, n_embd]); gate/up one FFN chunk of the dense FFN; everything else one attention
    // chunk (kAttnChunk tokens).
    std::vector<float> x, h, qa, q, kv, q_abs, pe, lat_out, o, ffn_out, gate, up;
    std::vector<float> iq, ik, iw;
    VisibleRows visible;
    // The last full layer's selection: per ubatch token when shared layers reuse it (IndexShare), else per
    // token of the current attention chunk.
    std::vector<std::vector<int32_t>> selected;
    std::vector<std::vector<int32_t>> chunk_selected;     // the indexer's output for one chunk (swapped in)
    std::vector<std::span<const int32_t>> selected_rows;  // spans over `selected`
    IndexerWorkspace indexer_workspace;                   // the indexer's buffers, kept between calls
    AttentionWorkspace attention_workspace;               // attention()'s, likewise
    OpScratch op;
    OpScratch op_beside;                    // the W_UK products that run beside the selection's merge (MatmulSection)
    std::vector<WeightMatrix> head_blocks;  // one layer's W_UK or W_UV slices, one per head
    std::vector<MatmulTask> head_tasks;     // their products, in one matmul_many section
    MoeScratch moe;
    WantedRows wanted;  // the last layer's tokens when only some rows want outputs
    bool record_selections = false;
    std::vector<LayerSelection> debug_selections;  // the last queries' attended keys, per layer
    SparseStats stats;
};

// Tokens of a ubatch that go through the attention part of a layer together (projections, indexer,
// attention). Its scratch (latent-space queries, attention outputs, indexer queries, the indexer's top-k
// buffers) is sized by this chunk, not by the ubatch, so memory does not grow with -ub or with the number
// of indexer heads; 64 queries still share every weight row they read 64 times.
constexpr int64_t kAttnChunk = 64;
// Tokens per FFN (and output head) pass: larger, so that each routed expert's weights serve several tokens.
constexpr int64_t kFfnChunk = 256;

// RoPE and softmax scale with llama.cpp's YaRN conventions for DeepSeek-family files
// ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]; MODELS.md §2.1c-d): the RoPE keeps unit magnitude and the whole
// mscale^2 goes into the attention scale. glm-dsa does not read the log multiplier.
void read_rope(const gguf::File &f, const std::string &a, DsaHParams &hp, int64_t key_length_mla) {
    RopeParams &r = hp.rope;
    r.layout = RopeLayout::adjacent;
    r.n_rot = static_cast<int>(hp.n_rot);
    r.freq_base = static_cast<float>(hparam_float(f, a + ".rope.freq_base", 10000.0, FloatRange::positive));
    // Absent, the type is linear, and the factor may come under its old name, as llama.cpp's loader reads them
    // (a factor without a type scales the positions; "none" ignores it).
    const std::string type = f.get_string(a + ".rope.scaling.type", "linear");
    double factor = hparam_float(f, a + ".rope.scaling.factor", 0.0, FloatRange::non_negative);
    if (factor == 0.0) factor = hparam_float(f, a + ".rope.scale_linear", 0.0, FloatRange::non_negative);
    const double attn_factor_key = hparam_float(f, a + ".rope.scaling.attn_factor", 1.0, FloatRange::positive);
    if (type != "none" && type != "linear" && type != "yarn")
        throw_error("%s: rope scaling type '%s' is not supported", f.name().c_str(), type.c_str());
    const bool yarn = type == "yarn";
    const double freq_scale = type == "none" || factor == 0.0 ? 1.0 : 1.0 / factor;
    const double log_mul =
        hp.glm ? 0.0
               : hparam_float(f, a + ".rope.scaling.yarn_log_multiplier", 0.0, FloatRange::non_negative) / double(0.1f);
    // llama.cpp's get_mscale, and its YaRN attention factor (llama-context.cpp): the RoPE's own magnitude.
    const auto get_mscale = [](double s, double m) { return s <= 1.0 ? 1.0 : 1.0 + 0.1 * m * std::log(s); };
    double yarn_attn_factor = 1.0;
    if (yarn) {
        const double s = 1.0 / freq_scale;
        yarn_attn_factor = (log_mul != 0.0 ? get_mscale(s, 1.0) / get_mscale(s, log_mul) : get_mscale(s, 1.0)) /
                           (1.0 + 0.1 * std::log(s));
    }
    yarn_attn_factor *= attn_factor_key;
    // The attention scale's mscale, whatever the type (the graph computes it from freq_scale alone): with linear
    // scaling it grows with the factor too, and with none it is the attention factor.
    const double mscale = yarn_attn_factor * (1.0 + 0.1 * std::log(1.0 / freq_scale)) *
                          (1.0 + 0.1 * log_mul * std::log(1.0 / freq_scale));
    r.freq_scale = static_cast<float>(freq_scale);
    r.ext_factor = yarn ? 1.0f : 0.0f;
    r.n_ctx_orig = static_cast<int>(hparam_int(f, a + ".rope.scaling.original_context_length", 1, INT32_MAX,
                                               std::clamp<int64_t>(hp.n_ctx_train, 1, INT32_MAX)));
    r.attn_factor = static_cast<float>(yarn_attn_factor);
    hp.kq_scale = static_cast<float>(mscale * mscale / std::sqrt(double(key_length_mla)));
    hp.rope_indexer = r;
    hp.rope_indexer.layout = hp.glm ? RopeLayout::adjacent : RopeLayout::half_split;
}

// glm-dsa IndexShare: which layers run their own indexer (MODELS.md §3.3, §3.5).
std::vector<bool> read_indexer_types(const gguf::File &f, const std::string &a, const DsaHParams &hp, int64_t n_block) {
    std::vector<bool> full(static_cast<size_t>(hp.n_layer), true);
    if (!hp.glm) return full;
    const std::string key = a + ".attention.indexer.types";
    if (const gguf::Value *value = f.find(key)) {
        if (value->type != gguf::ValueType::ARRAY) {
            // One value for every layer: llama.cpp reads the key with get_key_or_arr, which takes either.
            std::fill(full.begin(), full.end(), value->as_bool(key));
        } else {
            // llama.cpp wants one entry per layer without the MTP blocks (block_count - nextn_predict_layers);
            // MODELS.md says block_count. Either is taken.
            const gguf::Array &types = value->as_array(key);
            const auto n = static_cast<int64_t>(types.items.size());
            if (n != n_block && n != hp.n_layer) {
                const std::string without_mtp =
                    n_block == hp.n_layer
                        ? ""
                        : strprintf("%lld (block_count - nextn_predict_layers) or ", (long long)hp.n_layer);
                throw_error("%s: '%s' has %lld entries, expected %s%lld (block_count)", f.name().c_str(), key.c_str(),
                            (long long)n, without_mtp.c_str(), (long long)n_block);
            }
            for (int64_t il = 0; il < hp.n_layer; ++il) full[il] = types.items[il].as_bool(key);
        }
    } else if (hp.n_ctx_train >= 1048576) {
        for (int64_t il = 0; il < hp.n_layer; ++il) full[il] = il <= 2 || il % 4 == 2;  // GLM-5.2's pattern
    }
    if (!full[0])
        throw_error("%s: layer 0 is marked as sharing its indexer, but no earlier layer has one", f.name().c_str());
    return full;
}

class DsaModel final : public ArchModel {
  public:
    DsaModel(const gguf::File &f, WeightLoader &w, ModelInfo &info) {
        const std::string a = f.get_string("general.architecture");
        hp_.glm = a == "glm-dsa";
        hp_.n_embd = hparam_positive(f, a + ".embedding_length");
        const int64_t n_block = hparam_positive(f, a + ".block_count");
        const int64_t n_nextn = f.get_int(a + ".nextn_predict_layers", 0);
        if (n_nextn < 0 || n_nextn >= n_block)
            throw_error("%s: nextn_predict_layers %lld is out of range", f.name().c_str(), (long long)n_nextn);
        hp_.n_layer = n_block - n_nextn;
        hp_.n_block = n_block;
        hp_.n_ctx_train = f.get_int(a + ".context_length", 4096);
        hp_.n_head = hparam_positive(f, a + ".attention.head_count");
        if (f.get_int(a + ".attention.head_count_kv", 1) != 1) {
            // llama.cpp writes head_count_kv = 1 for MLA's shared latent; anything else is not MLA.
            throw_error("%s: MLA needs attention.head_count_kv = 1", f.name().c_str());
        }
        hp_.q_lora = hparam_positive(f, a + ".attention.q_lora_rank");
        hp_.kv_lora = hparam_positive(f, a + ".attention.kv_lora_rank");
        hp_.n_rot = hparam_positive(f, a + ".rope.dimension_count");
        const int64_t key_length_mla = hparam_positive(f, a + ".attention.key_length_mla");
        hp_.v_head = hparam_positive(f, a + ".attention.value_length_mla");
        hp_.nope = key_length_mla - hp_.n_rot;
        if (hp_.nope <= 0 || hp_.n_rot % 2)
            throw_error("%s: key_length_mla %lld and rope dims %lld are inconsistent", f.name().c_str(),
                        (long long)key_length_mla, (long long)hp_.n_rot);
        hp_.rms_eps =
            static_cast<float>(hparam_float(f, a + ".attention.layer_norm_rms_epsilon", 1e-6, FloatRange::positive));
        hp_.n_ff = hparam_positive(f, a + ".feed_forward_length");
        hp_.n_dense_lead = hparam_int(f, a + ".leading_dense_block_count", 0, kMaxHParam, 0);
        hp_.moe.n_embd = hp_.n_embd;
        hp_.moe.n_expert = hparam_int(f, a + ".expert_count", 0, kMaxHParam, 0);
        hp_.moe.n_expert_used = hparam_int(f, a + ".expert_used_count", 0, kMaxHParam, 0);
        hp_.moe.n_ff_exp = hparam_int(f, a + ".expert_feed_forward_length", 0, kMaxHParam, 0);
        // 0 is written by some converters for "no groups"; negative counts are refused.
        hp_.moe.n_group = std::max<int64_t>(1, hparam_int(f, a + ".expert_group_count", 0, kMaxHParam, 1));
        hp_.moe.n_group_used =
            std::max<int64_t>(1, hparam_int(f, a + ".expert_group_used_count", 0, kMaxHParam, hp_.moe.n_group));
        hp_.moe.norm_weights = f.get_bool(a + ".expert_weights_norm", false);
        // 0 means no scaling, as in llama.cpp (its default when the key is absent); negative or non-finite is refused.
        hp_.moe.weights_scale =
            static_cast<float>(hparam_float(f, a + ".expert_weights_scale", 1.0, FloatRange::non_negative));
        // glm-dsa: absent or 0 (llama.cpp's NONE) is sigmoid, as llama.cpp's glm-dsa loader maps it; deepseek32
        // must state it (llama.cpp requires the key there).
        int64_t gating = f.get_int(a + ".expert_gating_func", 0);
        if (hp_.glm && gating == 0) gating = 2;
        if (gating < 1 || gating > 4)
            throw_error("%s: expert_gating_func %lld is not one of 1..4", f.name().c_str(), (long long)gating);
        hp_.moe.gating = static_cast<GatingFunc>(gating);
        hp_.n_expert_shared = hparam_int(f, a + ".expert_shared_count", 0, kMaxHParam, 0);
        if (hp_.n_dense_lead < hp_.n_layer &&
            (hp_.moe.n_expert <= 0 || hp_.moe.n_expert_used <= 0 || hp_.moe.n_expert_used > hp_.moe.n_expert ||
             hp_.moe.n_ff_exp <= 0 || hp_.moe.n_expert % hp_.moe.n_group || hp_.moe.n_group_used > hp_.moe.n_group)) {
            throw_error("%s: inconsistent expert parameters (count %lld, used %lld, width %lld, groups %lld/%lld)",
                        f.name().c_str(), (long long)hp_.moe.n_expert, (long long)hp_.moe.n_expert_used,
                        (long long)hp_.moe.n_ff_exp, (long long)hp_.moe.n_group_used, (long long)hp_.moe.n_group);
        }
        hp_.idx_n_head = hparam_positive(f, a + ".attention.indexer.head_count");
        hp_.idx_head_dim = hparam_positive(f, a + ".attention.indexer.key_length");
        hp_.idx_top_k = hparam_positive(f, a + ".attention.indexer.top_k");
        if (hp_.idx_head_dim < hp_.n_rot)
            throw_error("%s: indexer key_length is smaller than the rope dims", f.name().c_str());
        read_rope(f, a, hp_, key_length_mla);
        rope_table_ = RopeTable(hp_.rope);
        rope_indexer_table_ = RopeTable(hp_.rope_indexer);
        hp_.indexer_full = read_indexer_types(f, a, hp_, n_block);
        hp_.any_shared = std::find(hp_.indexer_full.begin(), hp_.indexer_full.end(), false) != hp_.indexer_full.end();

        const gguf::TensorInfo *embd = f.find_tensor("token_embd.weight");
        if (!embd || embd->ne.size() != 2)
            throw_error("%s: tensor 'token_embd.weight' is missing or not 2-D", f.name().c_str());
        hp_.n_vocab = embd->ne[1];
        tok_embd_ = w.matrix("token_embd.weight", hp_.n_embd, hp_.n_vocab);
        output_norm_ = w.vector("output_norm.weight", hp_.n_embd);
        output_ = w.has("output.weight") ? w.matrix("output.weight", hp_.n_embd, hp_.n_vocab) : tok_embd_;
        for (int64_t il = 0; il < hp_.n_layer; ++il) layers_.push_back(load_layer(f, w, il));

        info.n_vocab = hp_.n_vocab;
        info.n_embd = hp_.n_embd;
        info.n_layer = hp_.n_layer;
        info.n_ctx_train = hp_.n_ctx_train;
        const auto n_full = std::count(hp_.indexer_full.begin(), hp_.indexer_full.end(), true);
        info.has_indexer = true;
        info.indexer_top_k = hp_.idx_top_k;
        info.summary = strprintf("indexer on %lld of %lld layers (%lld share), %lld heads x %lld, model top-k %lld",
                                 (long long)n_full, (long long)hp_.n_layer, (long long)(hp_.n_layer - n_full),
                                 (long long)hp_.idx_n_head, (long long)hp_.idx_head_dim, (long long)hp_.idx_top_k);
    }

    std::unique_ptr<ArchState> create_state(const StateParams &sp) const override {
        auto s = std::make_unique<DsaState>();
        s->dsa = sp.dsa;
        s->top_k = sp.dsa_top_k > 0 ? sp.dsa_top_k : hp_.idx_top_k;
        s->precision = sp.indexer_fast ? IndexerPrecision::fast : IndexerPrecision::exact;
        s->record_selections = sp.record_selections;
        s->sink = std::min(std::max<int64_t>(sp.dsa_sink, 0), s->top_k);
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            s->stats.layers.push_back(SparseLayerStats{.layer = il, .shared = !hp_.indexer_full[il]});
        }
        check_cache_width("latent", sp.cache_type_k, hp_.kv_lora + hp_.n_rot);
        check_cache_width("latent's c_kv (the value)", sp.cache_type_k, hp_.kv_lora);  // read as rows of their own
        check_cache_width("indexer key", sp.indexer_cache_type, hp_.idx_head_dim);
        // Rotation blocks: c_kv and k_pe apart (c_kv is also the value); the indexer key as one head.
        const RowRotation latent_rot =
            sp.rotate_k ? RowRotation().segment(hp_.kv_lora).segment(hp_.n_rot) : RowRotation();
        const RowRotation key_rot = sp.rotate_indexer ? RowRotation().segment(hp_.idx_head_dim) : RowRotation();
        if (sp.rotate_k) s->ckv_rotation.segment(hp_.kv_lora);
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            s->latent.emplace_back(sp.cache_type_k, sp.n_ctx, hp_.kv_lora + hp_.n_rot, latent_rot);
            // Shared layers read the full layer's selection: they need no indexer keys.
            s->indexer_key.emplace_back(sp.indexer_cache_type, hp_.indexer_full[il] ? sp.n_ctx : 0, hp_.idx_head_dim,
                                        key_rot);
            // Fast mode over float keys: an int8 copy kept with the cache, so decode does not re-quantise every
            // key of the context at every step (a q8_0 cache is read as stored; q4_0 keys go through f32).
            if (s->precision == IndexerPrecision::fast && hp_.indexer_full[il] &&
                RowStore::int8_copy_supported(s->indexer_key.back().type())) {
                s->indexer_key.back().keep_int8_copy(indexer_key_quantizer(), indexer_int8_width(hp_.idx_head_dim));
            }
        }
        const auto n = static_cast<size_t>(std::min<int64_t>(sp.n_ubatch, kAttnChunk));
        const auto nf = static_cast<size_t>(std::min<int64_t>(sp.n_ubatch, std::max(kAttnChunk, kFfnChunk)));
        const int64_t qk = hp_.nope + hp_.n_rot, lat = hp_.kv_lora + hp_.n_rot;
        s->x.resize(static_cast<size_t>(sp.n_ubatch) * hp_.n_embd);
        s->h.resize(nf * hp_.n_embd);
        s->qa.resize(n * hp_.q_lora);
        s->q.resize(n * hp_.n_head * qk);
        s->kv.resize(n * lat);
        s->q_abs.resize(n * hp_.n_head * lat);
        s->pe.resize(n * hp_.n_rot);
        s->lat_out.resize(n * hp_.n_head * hp_.kv_lora);
        s->o.resize(n * hp_.n_head * hp_.v_head);
        s->ffn_out.resize(nf * hp_.n_embd);
        s->gate.resize(nf * hp_.n_ff);
        s->up.resize(nf * hp_.n_ff);
        s->iq.resize(n * hp_.idx_n_head * hp_.idx_head_dim);
        s->ik.resize(n * hp_.idx_head_dim);
        s->iw.resize(n * hp_.idx_n_head);
        return s;
    }

    void forward(ArchState &state, const KvCells &cells, const UBatch &ub, ThreadPool &pool,
                 float *logits) const override {
        auto &s = static_cast<DsaState &>(state);
        const int64_t T = ub.size(), E = hp_.n_embd;
        float *x = s.x.data();
        s.visible.build(cells, ub.pos, ub.seq);
        // Recorded selections roll over the ubatches of a decode call (a prompt split into ubatches still shows
        // its last queries) and restart with each call.
        if (s.record_selections && ub.first_of_call) s.debug_selections.assign(static_cast<size_t>(hp_.n_layer), {});
        // Selection is needed only when some query sees more keys than top-k; otherwise every layer
        // attends densely, exactly as with the indexer off.
        const bool select = s.dsa && s.visible.max_rows() > s.top_k;
        if (select) {
            const auto n_sel = static_cast<size_t>(hp_.any_shared ? T : std::min(T, kAttnChunk));
            s.selected.resize(n_sel);
            s.selected_rows.resize(n_sel);
        }

        // The last layer runs its queries and FFN for the rows whose outputs are wanted only (WantedRows); a
        // recorded selection keeps every query.
        const bool trim_last = static_cast<int64_t>(ub.output_rows.size()) < T && !s.record_selections;
        get_rows(tok_embd_, ub.tokens.data(), T, x);  // [T, n_embd]
        const UBatch *q_ub = &ub;  // the tokens whose queries and FFN run: all, or the wanted ones in the last layer
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            const DsaLayer &L = layers_[il];
            const bool trimmed = trim_last && il + 1 == hp_.n_layer;
            // Every token's cache rows first: a query of one chunk may see tokens of a later chunk. A ubatch of
            // one chunk (decode, short prompts) also takes its query's first products from the same normed
            // input there, in the same parallel section.
            const bool one_chunk = T <= kAttnChunk && !trimmed;
            for (int64_t c0 = 0; c0 < T; c0 += kAttnChunk)
                write_cache_rows(s, L, il, ub, pool, c0, std::min(kAttnChunk, T - c0), select, one_chunk);
            if (trimmed) {
                narrow_to_wanted(s, cells, ub, select && hp_.any_shared && !hp_.indexer_full[il]);
                q_ub = &s.wanted.ub;
            }
            const int64_t TQ = q_ub->size();
            if (s.record_selections) {
                // A dense ubatch (every key attended) ends the record; a sparse one continues a sparse record.
                LayerSelection &rec = s.debug_selections[static_cast<size_t>(il)];
                rec.layer = il;
                if (!select || rec.dense) rec.queries.clear();
                rec.dense = !select;
            }
            for (int64_t c0 = 0; c0 < TQ; c0 += kAttnChunk)
                attention_chunk(s, L, il, cells, *q_ub, pool, select, c0, std::min(kAttnChunk, TQ - c0), one_chunk);
            for (int64_t c0 = 0; c0 < TQ; c0 += kFfnChunk) {
                const int64_t n = std::min(kFfnChunk, TQ - c0);
                float *xc = x + c0 * E, *h = s.h.data();
                rms_norm(xc, L.ffn_norm, h, n, E, hp_.rms_eps);
                if (il < hp_.n_dense_lead) {
                    swiglu_ffn(pool, s.op, L.ffn_gate, L.ffn_up, L.ffn_down, h, n, s.gate.data(), s.up.data(),
                               s.ffn_out.data());
                } else {
                    moe_ffn(pool, s.op, s.moe, hp_.moe, L.moe, h, n, s.ffn_out.data());
                }
                for (int64_t i = 0; i < n * E; ++i) xc[i] += s.ffn_out[i];
            }
        }
        const int64_t n_out = static_cast<int64_t>(q_ub->output_rows.size());
        for (int64_t o0 = 0; o0 < n_out; o0 += kFfnChunk) {
            output_head(pool, s.op, output_, output_norm_, hp_.rms_eps, x, E,
                        q_ub->output_rows.subspan(static_cast<size_t>(o0),
                                                  static_cast<size_t>(std::min(kFfnChunk, n_out - o0))),
                        s.h.data(), logits + o0 * hp_.n_vocab, ub.hidden_out ? ub.hidden_out + o0 * E : nullptr);
        }
    }

    void fill_synthetic(ArchState &state, std::span<const int32_t> cells, uint64_t seed) const override {
        auto &s = static_cast<DsaState &>(state);
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            s.latent[il].fill_random(cells, seed + 2 * il, 1.7f);  // ~unit RMS, like the normed latent
            if (hp_.indexer_full[il]) s.indexer_key[il].fill_random(cells, seed + 2 * il + 1, 1.7f);
        }
    }

    int64_t cache_bytes(const ArchState &state) const override {
        const auto &s = static_cast<const DsaState &>(state);
        int64_t bytes = 0;
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            bytes += s.latent[il].n_bytes() + s.indexer_key[il].n_bytes() + s.indexer_key[il].int8_copy_bytes();
        }
        return bytes;
    }

    int64_t bytes_per_token(const ArchState &state, int64_t n_kv) const override {
        const auto &s = static_cast<const DsaState &>(state);
        const auto mat = [](const WeightMatrix &m) { return m.n_rows * m.row_bytes; };
        int64_t bytes = tok_embd_.row_bytes + mat(output_);
        const bool sparse = s.dsa && n_kv > s.top_k;
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            const DsaLayer &L = layers_[il];
            bytes += mat(L.q_a) + mat(L.q_b) + mat(L.kv_a_mqa) + mat(L.k_b) + mat(L.v_b) + mat(L.wo);
            if (il < hp_.n_dense_lead) {
                bytes += mat(L.ffn_gate) + mat(L.ffn_up) + mat(L.ffn_down);
            } else {  // the router, the routed share of the experts, the shared expert
                const double routed = double(hp_.moe.n_expert_used) / double(hp_.moe.n_expert);
                bytes += mat(L.moe.router) + mat(L.moe.gate_shexp) + mat(L.moe.up_shexp) + mat(L.moe.down_shexp);
                const int64_t gate_up = L.moe.gate_up_fused ? mat(L.moe.gate_exps)  // one stack holds both
                                                            : mat(L.moe.gate_exps) + mat(L.moe.up_exps);
                bytes += static_cast<int64_t>(routed * double(gate_up + mat(L.moe.down_exps)));
            }
            if (sparse && hp_.indexer_full[il]) {
                bytes += mat(L.idx_q_b) + mat(L.idx_k) + mat(L.idx_proj) + n_kv * s.indexer_key[il].row_bytes();
            } else if (hp_.indexer_full[il]) {
                bytes += mat(L.idx_k);  // keys are still written for later queries
            }
            bytes += (sparse ? s.top_k : n_kv) * s.latent[il].row_bytes();
        }
        return bytes;
    }

    // Left unread: the MTP/NextN layers past the ones run (llama.cpp loads and skips them too); the combined
    // attn_kv_b some converters write beside the attn_k_b / attn_v_b that MLA reads (load_layer refuses a layer
    // with attn_kv_b alone); and indexer tensors on a layer indexer.types marks as sharing, which reuses the
    // previous full layer's selection whatever it holds (llama.cpp's loader takes them as optional and its graph
    // ignores them there).
    bool leaves_unread(const std::string &name) const override {
        if (!name.starts_with("blk.")) return false;
        const char *const end = name.data() + name.size();
        int64_t il = -1;
        const auto [rest, ec] = std::from_chars(name.data() + 4, end, il);
        if (ec != std::errc() || rest == end || *rest != '.' || il < 0 || il >= hp_.n_block) return false;
        if (il >= hp_.n_layer) return true;
        const std::string_view part(rest, static_cast<size_t>(end - rest));  // ".attn_kv_b.weight", ...
        return part == ".attn_kv_b.weight" ||
               (!hp_.indexer_full[static_cast<size_t>(il)] && part.starts_with(".indexer."));
    }

    // Cache-operation hooks: per layer the latent [c_kv | k_pe] (k_pe RoPE'd in adjacent pairs) and the
    // indexer keys [rope | nope] (the arch's indexer layout; no rows on IndexShare layers).
    std::vector<NamedStore> stores(ArchState &state) const override {
        auto &s = static_cast<DsaState &>(state);
        std::vector<NamedStore> out;
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            out.push_back({"blk." + std::to_string(il) + ".latent", &s.latent[il]});
            out.push_back({"blk." + std::to_string(il) + ".indexer_key", &s.indexer_key[il]});
        }
        return out;
    }

    void shift_rows(ArchState &state, std::span<const int32_t> cells, std::span<const int32_t> deltas) const override {
        auto &s = static_cast<DsaState &>(state);
        for (int64_t il = 0; il < hp_.n_layer; ++il) {
            shift_stored_rope(s.latent[il], cells, deltas, hp_.kv_lora, 1, hp_.n_rot, hp_.rope);
            if (hp_.indexer_full[il]) {
                shift_stored_rope(s.indexer_key[il], cells, deltas, 0, 1, hp_.idx_head_dim, hp_.rope_indexer);
            }
        }
    }

    SparseStats sparse_stats(const ArchState &state) const override {
        const auto &s = static_cast<const DsaState &>(state);
        SparseStats st = s.stats;
        st.select_phases = s.indexer_workspace.phase_seconds();
        return st;
    }

    std::vector<LayerSelection> last_selections(const ArchState &state) const override {
        return static_cast<const DsaState &>(state).debug_selections;
    }

  private:
    static void check_cache_width(const char *what, DType type, int64_t width) {
        const int64_t block = dtype_info(type).block_size;
        if (width % block != 0) {
            throw_error("a %s cache needs rows whose width is a multiple of %lld; this model's %s rows are %lld wide",
                        std::string(dtype_name(type)).c_str(), (long long)block, what, (long long)width);
        }
    }

    // The attended keys of the chunk's tokens [c0, c0 + |rows|) that are among the ubatch's last kRecordedQueries,
    // appended to the layer's record, which keeps the last kRecordedQueries.
    static void record_selection(DsaState &s, const KvCells &cells, const UBatch &ub, int64_t il, int64_t c0,
                                 std::span<const std::span<const int32_t>> rows) {
        LayerSelection &out = s.debug_selections[static_cast<size_t>(il)];
        const int64_t c1 = c0 + static_cast<int64_t>(rows.size());
        for (int64_t t = std::max<int64_t>(c0, ub.size() - kRecordedQueries); t < c1; ++t) {
            QuerySelection q;
            q.pos = ub.pos[t];
            for (const int32_t cell : rows[t - c0]) q.keys.push_back(cells.pos(cell));
            std::sort(q.keys.begin(), q.keys.end());
            out.queries.push_back(std::move(q));
        }
        if (std::ssize(out.queries) > kRecordedQueries)  // the last kRecordedQueries, over the call's ubatches
            out.queries.erase(out.queries.begin(), out.queries.end() - kRecordedQueries);
    }

    DsaLayer load_layer(const gguf::File &f, WeightLoader &w, int64_t il) const {
        const std::string p = "blk." + std::to_string(il) + ".";
        const int64_t qk = hp_.nope + hp_.n_rot;
        if (w.has(p + "attn_kv_b.weight") && !w.has(p + "attn_k_b.weight")) {
            throw_error(
                "%s: layer %lld has the old combined attn_kv_b tensor; sparrow needs attn_k_b/attn_v_b "
                "(convert the model with a recent llama.cpp)",
                f.name().c_str(), (long long)il);
        }
        DsaLayer L{};
        L.attn_norm = w.vector(p + "attn_norm.weight", hp_.n_embd);
        L.q_a = w.matrix(p + "attn_q_a.weight", hp_.n_embd, hp_.q_lora);
        L.q_a_norm = w.vector(p + "attn_q_a_norm.weight", hp_.q_lora);
        L.q_b = w.matrix(p + "attn_q_b.weight", hp_.q_lora, hp_.n_head * qk);
        L.kv_a_mqa = w.matrix(p + "attn_kv_a_mqa.weight", hp_.n_embd, hp_.kv_lora + hp_.n_rot);
        L.kv_a_norm = w.vector(p + "attn_kv_a_norm.weight", hp_.kv_lora);
        L.k_b = w.matrix_stack(p + "attn_k_b.weight", hp_.nope, hp_.kv_lora, hp_.n_head);
        L.v_b = w.matrix_stack(p + "attn_v_b.weight", hp_.kv_lora, hp_.v_head, hp_.n_head);
        L.wo = w.matrix(p + "attn_output.weight", hp_.n_head * hp_.v_head, hp_.n_embd);
        L.ffn_norm = w.vector(p + "ffn_norm.weight", hp_.n_embd);
        if (il < hp_.n_dense_lead) {
            L.ffn_gate = w.matrix(p + "ffn_gate.weight", hp_.n_embd, hp_.n_ff);
            L.ffn_up = w.matrix(p + "ffn_up.weight", hp_.n_embd, hp_.n_ff);
            L.ffn_down = w.matrix(p + "ffn_down.weight", hp_.n_ff, hp_.n_embd);
        } else {
            const MoeParams &m = hp_.moe;
            L.moe.router = w.matrix(p + "ffn_gate_inp.weight", hp_.n_embd, m.n_expert);
            L.moe.probs_bias = w.has(p + "exp_probs_b.bias") ? w.vector(p + "exp_probs_b.bias", m.n_expert) : nullptr;
            if (w.has(p + "ffn_gate_up_exps.weight")) {  // llama.cpp's fused form, which it also prefers
                L.moe.gate_exps =
                    w.matrix_stack_parts(p + "ffn_gate_up_exps.weight", hp_.n_embd, m.n_ff_exp, 2, m.n_expert);
                L.moe.up_exps = L.moe.gate_exps;
                L.moe.gate_up_fused = true;
            } else {
                L.moe.gate_exps = w.matrix_stack(p + "ffn_gate_exps.weight", hp_.n_embd, m.n_ff_exp, m.n_expert);
                L.moe.up_exps = w.matrix_stack(p + "ffn_up_exps.weight", hp_.n_embd, m.n_ff_exp, m.n_expert);
            }
            L.moe.down_exps = w.matrix_stack(p + "ffn_down_exps.weight", m.n_ff_exp, hp_.n_embd, m.n_expert);
            if (hp_.n_expert_shared > 0) {
                const int64_t n_sh = m.n_ff_exp * hp_.n_expert_shared;
                L.moe.gate_shexp = w.matrix(p + "ffn_gate_shexp.weight", hp_.n_embd, n_sh);
                L.moe.up_shexp = w.matrix(p + "ffn_up_shexp.weight", hp_.n_embd, n_sh);
                L.moe.down_shexp = w.matrix(p + "ffn_down_shexp.weight", n_sh, hp_.n_embd);
            } else if (w.has(p + "ffn_gate_shexp.weight") || w.has(p + "ffn_up_shexp.weight") ||
                       w.has(p + "ffn_down_shexp.weight")) {
                // Running without them would silently drop an expert every token uses (llama.cpp requires the key).
                throw_error(
                    "%s: blk.%lld has shared-expert tensors (ffn_*_shexp) but %s.expert_shared_count is absent "
                    "or 0",
                    f.name().c_str(), (long long)il, f.get_string("general.architecture").c_str());
            }
        }
        const bool has_indexer = w.has(p + "indexer.attn_q_b.weight");
        if (hp_.indexer_full[il]) {
            if (!has_indexer) {
                throw_error(
                    "%s: layer %lld runs its own indexer but its indexer tensors (blk.%lld.indexer.*) are "
                    "missing",
                    f.name().c_str(), (long long)il, (long long)il);
            }
            const int64_t H = hp_.idx_n_head, D = hp_.idx_head_dim;
            L.idx_q_b = w.matrix(p + "indexer.attn_q_b.weight", hp_.q_lora, H * D);
            L.idx_k = w.matrix(p + "indexer.attn_k.weight", hp_.n_embd, D);
            L.idx_k_norm_w = w.vector(p + "indexer.k_norm.weight", D);
            L.idx_k_norm_b = w.vector(p + "indexer.k_norm.bias", D);
            L.idx_proj = w.matrix(p + "indexer.proj.weight", hp_.n_embd, H);
        }
        return L;
    }

    // The cache rows of tokens [c0, c0 + n): the latent [c_kv | k_pe] and, on full layers, the indexer key. With
    // `with_query` (a ubatch of one attention chunk) the products of the chunk's query that read the same normed
    // input join the cache's in one matmul_many section, sharing its quantised activations: q_a into s.qa and, on
    // full layers when selecting, the indexer's head weights into s.iw (unscaled); attention_chunk then skips
    // them, and the norm, whose output s.h still holds.
    void write_cache_rows(DsaState &s, const DsaLayer &L, int64_t il, const UBatch &ub, ThreadPool &pool, int64_t c0,
                          int64_t n, bool select, bool with_query) const {
        const int64_t C = hp_.kv_lora, R = hp_.n_rot, lat = C + R, D = hp_.idx_head_dim;
        const auto t0 = std::chrono::steady_clock::now();
        float *h = s.h.data();
        rms_norm(s.x.data() + c0 * hp_.n_embd, L.attn_norm, h, n, hp_.n_embd, hp_.rms_eps);
        MatmulTask tasks[4];
        int64_t n_tasks = 0;
        tasks[n_tasks++] = {&L.kv_a_mqa, h, n, s.kv.data()};                         // [n, C + R]
        if (hp_.indexer_full[il]) tasks[n_tasks++] = {&L.idx_k, h, n, s.ik.data()};  // [n, D]
        if (with_query) {
            tasks[n_tasks++] = {&L.q_a, h, n, s.qa.data()};                                           // [n, q_lora]
            if (select && hp_.indexer_full[il]) tasks[n_tasks++] = {&L.idx_proj, h, n, s.iw.data()};  // [n, H]
        }
        matmul_many(pool, s.op, tasks, n_tasks);  // --dsa-stats counts the whole section as attention's time
        for (int64_t t = 0; t < n; ++t) {
            float *row = s.kv.data() + t * lat;
            rms_norm(row, L.kv_a_norm, row, 1, C, hp_.rms_eps);
            std::copy_n(row + C, R, s.pe.data() + t * R);
        }
        rope(s.pe.data(), n, 1, R, ub.pos.data() + c0, rope_table_);
        for (int64_t t = 0; t < n; ++t) {
            std::copy_n(s.pe.data() + t * R, R, s.kv.data() + t * lat + C);
            s.latent[il].write(ub.cells[c0 + t], s.kv.data() + t * lat);
        }
        const auto t1 = std::chrono::steady_clock::now();
        if (hp_.indexer_full[il]) {
            layer_norm(s.ik.data(), L.idx_k_norm_w, L.idx_k_norm_b, s.ik.data(), n, D, 1e-6f);
            rope(s.ik.data(), n, 1, D, ub.pos.data() + c0, rope_indexer_table_);  // rope part first: [rope | nope]
            for (int64_t t = 0; t < n; ++t) s.indexer_key[il].write(ub.cells[c0 + t], s.ik.data() + t * D);
        }
        const auto t2 = std::chrono::steady_clock::now();
        s.stats.attention_seconds += std::chrono::duration<double>(t1 - t0).count();
        s.stats.indexer_seconds += std::chrono::duration<double>(t2 - t1).count();
    }

    // Before the last layer's queries when only some rows want outputs: those rows of the residual stream move to
    // the front, s.wanted.ub holds their tokens, the visible lists are theirs, and with `shared_selection` (an
    // IndexShare layer reusing the previous full layer's per-token selection) so are the selections.
    void narrow_to_wanted(DsaState &s, const KvCells &cells, const UBatch &ub, bool shared_selection) const {
        s.wanted.build(ub);
        compact_rows(s.x.data(), hp_.n_embd, ub.output_rows);
        s.visible.build(cells, s.wanted.ub.pos, s.wanted.ub.seq);
        if (!shared_selection) return;
        for (size_t i = 0; i < ub.output_rows.size(); ++i) {  // ascending rows: a swap never undoes an earlier one
            const auto r = static_cast<size_t>(ub.output_rows[i]);
            s.selected[i].swap(s.selected[r]);
            s.selected_rows[i] = s.selected[i];
        }
    }

    // The attention part of layer il for tokens [c0, c0 + n) (their cache rows are written): on full layers
    // with selection on, the indexer picks each token's top-k cells (kept per token in s.selected for the
    // following shared layers); then absorbed MLA over the selected (or all visible) cells, added to s.x.
    void attention_chunk(DsaState &s, const DsaLayer &L, int64_t il, const KvCells &cells, const UBatch &ub,
                         ThreadPool &pool, bool select, int64_t c0, int64_t n, bool query_started) const {
        const int64_t E = hp_.n_embd;
        float *h = s.h.data();
        if (!query_started) {  // else write_cache_rows left h, q_a's product and (selecting) the head weights
            rms_norm(s.x.data() + c0 * E, L.attn_norm, h, n, E, hp_.rms_eps);
            matmul(pool, s.op, L.q_a, h, n, s.qa.data());  // [n, q_lora]
        }
        rms_norm(s.qa.data(), L.q_a_norm, s.qa.data(), n, hp_.q_lora, hp_.rms_eps);
        const auto visible = s.visible.rows().subspan(static_cast<size_t>(c0), static_cast<size_t>(n));
        std::span<const std::span<const int32_t>> rows = visible;
        const int64_t sel0 = hp_.any_shared ? c0 : 0;  // the chunk's first entry in s.selected
        const auto t0 = std::chrono::steady_clock::now();
        bool q_ready = false;  // MLA's q_b product done with the indexer's
        if (select && hp_.indexer_full[il]) {
            const int64_t H = hp_.idx_n_head, D = hp_.idx_head_dim;
            // The indexer's queries and MLA's (both from the q latent) in one section, quantised once.
            const MatmulTask from_qa[2] = {{&L.idx_q_b, s.qa.data(), n, s.iq.data()},  // [n, H * D]
                                           {&L.q_b, s.qa.data(), n, s.q.data()}};      // [n, NH * (N + R)]
            matmul_many(pool, s.op, from_qa, 2);
            q_ready = true;
            rope(s.iq.data(), n, H, D, ub.pos.data() + c0, rope_indexer_table_);
            s.indexer_key[il].rotation().apply(s.iq.data(), n * H);  // as the stored keys (identity if none)
            if (!query_started) matmul(pool, s.op, L.idx_proj, h, n, s.iw.data());  // [n, H]
            const float w_scale = 1.0f / std::sqrt(static_cast<float>(D * H));
            for (int64_t i = 0; i < n * H; ++i) s.iw[i] *= w_scale;
            // MLA's W_UK products do not need the selection: threads its serial merge leaves idle run them.
            head_tasks(s, L.k_b, s.q.data(), hp_.nope + hp_.n_rot, n, s.q_abs.data(), hp_.kv_lora + hp_.n_rot);
            MatmulSection k_b_products;
            k_b_products.prepare(s.op_beside, s.head_tasks.data(), std::ssize(s.head_tasks), pool.n_threads());
            const std::function<void()> beside_merge = [&k_b_products] { k_b_products.run_some(); };
            const auto ts = std::chrono::steady_clock::now();
            if (s.sink > 0) {
                select_with_sinks(s, pool, il, visible, beside_merge);
            } else {
                lightning_indexer_select(pool, IndexerShape{H, D}, s.precision, s.iq.data(), s.iw.data(), n,
                                         s.indexer_key[il], visible, s.top_k, s.chunk_selected, &s.indexer_workspace,
                                         beside_merge);
            }
            s.stats.select_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
            k_b_products.finish(pool);
            for (int64_t t = 0; t < n; ++t) {
                auto &sel = s.selected[static_cast<size_t>(sel0 + t)];
                sel.swap(s.chunk_selected[static_cast<size_t>(t)]);  // both keep their capacity
                s.selected_rows[static_cast<size_t>(sel0 + t)] = sel;
            }
        }
        if (select) rows = std::span<const std::span<const int32_t>>(s.selected_rows).subspan(sel0, n);
        const auto t1 = std::chrono::steady_clock::now();
        mla_attention(s, L, il, ub, pool, rows, c0, q_ready);  // x += attention output (W_UK done when q_ready)
        const auto t2 = std::chrono::steady_clock::now();
        s.stats.indexer_seconds += std::chrono::duration<double>(t1 - t0).count();
        s.stats.attention_seconds += std::chrono::duration<double>(t2 - t1).count();
        SparseLayerStats &ls = s.stats.layers[static_cast<size_t>(il)];
        ls.n_queries += n;
        for (int64_t t = 0; t < n; ++t) {
            ls.keys_attended += double(rows[t].size());
            ls.keys_visible += double(visible[t].size());
        }
        if (s.record_selections) record_selection(s, cells, ub, il, c0, rows);
    }

    // Selection with attention sinks (ContextParams::dsa_sink) for one attention chunk: each query's first
    // `sink` visible cells (the first present positions of its own sequence) are always selected and count
    // within top-k; the indexer picks the other top_k - sink among the remaining candidates. The result, in
    // s.chunk_selected, stays in position order.
    void select_with_sinks(DsaState &s, ThreadPool &pool, int64_t il, std::span<const std::span<const int32_t>> visible,
                           const std::function<void()> &beside_merge) const {
        const auto n = static_cast<int64_t>(visible.size());
        std::vector<std::span<const int32_t>> rest(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t) rest[t] = visible[t].subspan(std::min<size_t>(visible[t].size(), s.sink));
        if (s.top_k > s.sink) {
            lightning_indexer_select(pool, IndexerShape{hp_.idx_n_head, hp_.idx_head_dim}, s.precision, s.iq.data(),
                                     s.iw.data(), n, s.indexer_key[il], rest, s.top_k - s.sink, s.chunk_selected,
                                     &s.indexer_workspace, beside_merge);
        } else {
            s.chunk_selected.resize(static_cast<size_t>(n));
            for (auto &sel : s.chunk_selected) sel.clear();
        }
        for (int64_t t = 0; t < n; ++t) {
            const auto sinks = visible[t].first(visible[t].size() - rest[t].size());
            s.chunk_selected[t].insert(s.chunk_selected[t].begin(), sinks.begin(), sinks.end());
        }
    }

    // Absorbed MLA of tokens [c0, c0 + |rows|) over `rows` (each token's selected or visible cells), with
    // s.qa holding their q latent; when q_ready, s.q holds its q_b product and the c part of s.q_abs its W_UK
    // products (attention_chunk ran them beside the selection). Adds the output to s.x.
    void mla_attention(DsaState &s, const DsaLayer &L, int64_t il, const UBatch &ub, ThreadPool &pool,
                       std::span<const std::span<const int32_t>> rows, int64_t c0, bool q_ready) const {
        const int64_t T = static_cast<int64_t>(rows.size());
        const int64_t NH = hp_.n_head, R = hp_.n_rot, C = hp_.kv_lora, N = hp_.nope, V = hp_.v_head;
        const int64_t qk = N + R, lat = C + R;

        // Query: per head [W_UK q_nope | rope(q_pe)] -> q_abs [T, NH, C + R]. The heads' W_UK products read q_nope in
        // place and write the c part of q_abs (one parallel section: one head's block is too small to split well,
        // and 16 sections of their own cost more in wake-ups and barriers than the products); then each head's
        // q_pe goes behind it and is rotated there.
        if (!q_ready) {
            matmul(pool, s.op, L.q_b, s.qa.data(), T, s.q.data());  // [T, NH, N + R]
            per_head_products(s, pool, L.k_b, s.q.data(), qk, T, s.q_abs.data(), lat);
        }
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t hd = 0; hd < NH; ++hd)
                std::copy_n(s.q.data() + (t * NH + hd) * qk + N, R, s.q_abs.data() + (t * NH + hd) * lat + C);
        }
        rope(s.q_abs.data() + C, T, NH, lat, ub.pos.data() + c0, rope_table_);  // the k_pe part of every head

        // Attention over the latent rows: MQA with K = [c_kv | k_pe] and V = c_kv. A rotated cache holds
        // [H c_kv | H k_pe]: queries are rotated alike, and the output (a sum of H c_kv) rotated back.
        s.latent[il].rotation().apply(s.q_abs.data(), T * NH);
        const AttentionShape shape{
            .n_head = NH, .n_head_kv = 1, .head_dim_k = lat, .head_dim_v = C, .scale = hp_.kq_scale, .v_offset = 0};
        const auto ta = std::chrono::steady_clock::now();
        attention(pool, shape, s.q_abs.data(), T, s.latent[il], s.latent[il], rows, s.lat_out.data(),  // [T, NH, C]
                  &s.attention_workspace);
        s.stats.attend_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - ta).count();
        s.ckv_rotation.apply(s.lat_out.data(), T * NH);

        // Per head W_UV back to v_head (one section, as W_UK), then the output projection.
        per_head_products(s, pool, L.v_b, s.lat_out.data(), C, T, s.o.data(), V);  // [T, NH, V]
        matmul(pool, s.op, L.wo, s.o.data(), T, s.ffn_out.data());                 // [T, n_embd]
        float *xc = s.x.data() + c0 * hp_.n_embd;
        for (int64_t i = 0; i < T * hp_.n_embd; ++i) xc[i] += s.ffn_out[i];
    }

    // For every head hd and token t: out[t, hd, :n_rows] = W_hd in[t, hd, :n_in], W_hd the hd-th block of the
    // stack's rows (n_rows = its n_rows / NH, n_in its n_cols); in is [T, NH, in_dim] and out [T, NH, out_dim]
    // (a head's slot may be wider than what is read or written). All heads in one matmul_many section, reading
    // and writing in place through the tasks' strides.
    void per_head_products(DsaState &s, ThreadPool &pool, const WeightMatrix &stack, const float *in, int64_t in_dim,
                           int64_t T, float *out, int64_t out_dim) const {
        head_tasks(s, stack, in, in_dim, T, out, out_dim);
        matmul_many(pool, s.op, s.head_tasks.data(), std::ssize(s.head_tasks));
    }

    // per_head_products' tasks, into s.head_tasks (and their matrices into s.head_blocks).
    void head_tasks(DsaState &s, const WeightMatrix &stack, const float *in, int64_t in_dim, int64_t T, float *out,
                    int64_t out_dim) const {
        const int64_t NH = hp_.n_head, n_rows = stack.n_rows / NH;
        s.head_blocks.resize(static_cast<size_t>(NH));
        s.head_tasks.resize(static_cast<size_t>(NH));
        for (int64_t hd = 0; hd < NH; ++hd) {
            s.head_blocks[static_cast<size_t>(hd)] = head_block(stack, hd, n_rows);
            s.head_tasks[static_cast<size_t>(hd)] = {&s.head_blocks[static_cast<size_t>(hd)],
                                                     in + hd * in_dim,
                                                     T,
                                                     out + hd * out_dim,
                                                     NH * in_dim,
                                                     NH * out_dim};
        }
    }

    // Matrix `index` of a stack whose matrices have n_rows rows each.
    static WeightMatrix head_block(const WeightMatrix &stack, int64_t index, int64_t n_rows) {
        WeightMatrix m = stack;
        m.data = stack.row(index * n_rows);
        m.n_rows = n_rows;
        return m;
    }

    DsaHParams hp_;
    RopeTable rope_table_, rope_indexer_table_;  // hp_.rope's and hp_.rope_indexer's pair tables
    WeightMatrix tok_embd_, output_;
    const float *output_norm_ = nullptr;
    std::vector<DsaLayer> layers_;
};

}  // namespace

std::unique_ptr<ArchModel> create_dsa(const gguf::File &file, WeightLoader &weights, ModelInfo &info) {
    return std::make_unique<DsaModel>(file, weights, info);
}

}  // namespace sparrow
