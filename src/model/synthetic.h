// Tiny random-weight models of each supported architecture, written as GGUF files with the metadata keys
// and tensor names llama.cpp uses, so the same file loads in both engines. For tests and benchmarks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sparrow {

struct SyntheticVocab {
    std::vector<std::string> tokens;
    std::vector<int32_t> token_types;  // 1 normal, 3 control, 4 user-defined
    std::vector<std::string> merges;   // "a b", in rank order
    int32_t bos_id = 0;
    int32_t eos_id = 0;
};
// fim: DeepSeek's three fill-in-the-middle control tokens after BOS and EOS (<｜fim▁begin｜>, <｜fim▁hole｜>,
// <｜fim▁end｜>: prefix, suffix, middle).
SyntheticVocab make_synthetic_vocab(int64_t n_vocab, bool fim = false);

// Sizes and options of a synthetic model. The defaults are those of the tiny llama; synthetic_defaults()
// gives each architecture's own (and the "bench" preset's). Fields a given architecture does not use are
// ignored.
struct SyntheticParams {
    std::string arch = "llama";
    int64_t n_vocab = 512;
    int64_t n_embd = 64;
    int64_t n_layer = 2;  // deepseek32 / glm-dsa: layers the forward pass runs (MTP blocks come on top)
    int64_t n_head = 4;
    int64_t n_head_kv = 2;
    int64_t n_ff = 128;  // dense feed-forward width (deepseek32 / glm-dsa: the leading dense layers)
    int64_t n_ctx_train = 2048;
    DType type = DType::F32;  // type of the 2-D/3-D weights (rows not a multiple of its block size stay f32)
    // deepseek32 / glm-dsa: the type of every stack of matrices (a 3-D weight with ne[2] > 1: the routed experts,
    // and MLA's attn_k_b and attn_v_b) where it differs from `type`. llama.cpp's MXFP4_MOE files choose by that
    // shape: mxfp4 stacks, q8_0 elsewhere.
    std::optional<DType> stack_type;
    uint64_t seed = 42;
    bool tied_output = false;
    // Fill-in-the-middle tokens in the vocabulary (make_synthetic_vocab's fim); llama also names them in
    // tokenizer.ggml.fim_pre/suf/mid_token_id, as llama.cpp's converter writes them, while deepseek32 and glm-dsa
    // leave them to be found by their text, as files converted before those keys existed.
    bool fim_tokens = false;
    // deepseek32 / glm-dsa: the routed experts' gate and up in one ffn_gate_up_exps {n_embd, 2 * n_ff_exp, n_expert}
    // (llama.cpp's converter with --fuse-gate-up-exps), holding the values the two separate tensors would hold.
    bool fuse_gate_up_exps = false;

    // deepseek32 / glm-dsa (MLA + lightning indexer + MoE); GGUF keys as llama.cpp's converter writes them
    int64_t n_dense_lead = 1;  // leading_dense_block_count
    int64_t q_lora_rank = 32;
    int64_t kv_lora_rank = 32;
    int64_t head_nope = 32;  // key_length_mla = head_nope + n_rot
    int64_t n_rot = 16;      // rope.dimension_count = qk_rope_head_dim (MLA and indexer)
    int64_t head_v = 32;     // value_length_mla
    int64_t idx_n_head = 8;
    int64_t idx_head_dim = 32;
    int64_t idx_top_k = 64;
    int64_t n_expert = 8;
    int64_t n_expert_used = 2;
    int64_t n_expert_shared = 1;
    int64_t n_expert_groups = 4;  // expert_group_count (1: no group-limited routing)
    int64_t n_group_used = 2;
    int64_t n_ff_exp = 32;
    uint32_t gating = 2;         // expert_gating_func: 1 softmax, 2 sigmoid, 3 softmax_weight, 4 sqrt(softplus)
    bool probs_bias = true;      // write exp_probs_b.bias
    bool weights_norm = true;    // expert_weights_norm
    float weights_scale = 2.5f;  // expert_weights_scale
    float rms_eps = 1e-6f;
    float freq_base = 10000.0f;
    int64_t n_nextn = 0;  // MTP/NextN blocks appended (block_count = n_layer + n_nextn)
    // glm-dsa `attention.indexer.types` (1 full, 0 shared), one per non-MTP layer. Empty: the GLM-5.2
    // pattern (full at 0, 1, 2, 6, 10, ...) written explicitly, unless indexer_types_absent.
    std::vector<int> indexer_types;
    bool indexer_types_absent = false;  // glm-dsa: no types key (llama.cpp then runs every layer full)
    bool yarn = false;         // deepseek32: rope.scaling.* YaRN keys as real V3.2 files have them, scaled down
    float yarn_factor = 4.0f;  // original_context_length = n_ctx_train / factor
    // deepseek32 / glm-dsa: real models have a few channels of the normed MLA latent and of the indexer key
    // far larger than the rest (outliers), which random weights lack and which decide how well a cache
    // quantises. Per layer, this many random channels of c_kv (attn_kv_a_norm.weight) and of the indexer key
    // past its RoPE dims (indexer.k_norm weight and bias) are multiplied by outlier_scale, and the weights
    // that read those channels (attn_k_b rows, attn_v_b columns, indexer.attn_q_b rows) divided by it: the
    // model computes the same function in exact arithmetic, only the cached rows carry the outliers. (Without
    // the compensation a random model's attention is dominated by those channels.) 0: none.
    int64_t outlier_channels = 0;
    float outlier_scale = 30.0f;
};

// The defaults of an architecture: "llama", "deepseek32" or "glm-dsa"; preset "" (tiny) or "bench" (a
// model of a few hundred MB for benchmarks, deepseek32 / glm-dsa only).
SyntheticParams synthetic_defaults(const std::string &arch, const std::string &preset = "");

// glm-dsa's indexer types as written: the explicit list, or the GLM-5.2 pattern (empty when absent).
std::vector<int> synthetic_indexer_types(const SyntheticParams &params);

// Writes the model; throws sparrow::Error for inconsistent parameters or an unsupported architecture.
// Weights are generated while the file is written (one tensor in memory at a time).
void write_synthetic_model(const SyntheticParams &params, const std::string &path);

}  // namespace sparrow
