// The mixture-of-experts feed-forward block of the DeepSeek-V3 family (deepseek32, glm-dsa), routed as
// llama.cpp's build_moe_ffn routes it (docs/MODELS.md §2.1b):
//   logits  r = router x                                             [n_expert]
//   scores  p = gating(r): softmax | sigmoid | r itself (softmax_weight) | sqrt(softplus(r))
//   choice  on s = p + probs_bias (the bias only picks experts, it never weighs them); with n_group > 1
//           the experts form n_group equal groups, a group scores the sum of its two largest s, the best
//           n_group_used groups stay and the others are masked; then the top n_expert_used of s.
//           Ties go to the lower index (groups and experts alike).
//   weights w = p of the chosen experts (softmax_weight: softmax over the chosen logits), divided by
//           max(sum, 2^-14) when norm_weights, times weights_scale unless it is 0 or 1
//   out     = sum over chosen e of w_e * down_e(silu(gate_e x) * up_e x) + shared(x)
// Tokens are grouped by expert and each expert's matrices run only on its tokens, so an expert that no
// token chose is never read.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace sparrow {

// Values are llama.cpp's expert_gating_func ids (GGUF `{arch}.expert_gating_func`).
enum class GatingFunc : uint32_t { softmax = 1, sigmoid = 2, softmax_weight = 3, sqrt_softplus = 4 };

// The smallest sum the normalisation divides by (the smallest normal f16, as build_moe_ffn clamps).
constexpr float kMoeWeightSumMin = 6.103515625e-5f;

struct MoeParams {
    int64_t n_embd = 0;
    int64_t n_expert = 0;
    int64_t n_expert_used = 0;
    int64_t n_ff_exp = 0;
    int64_t n_group = 1;       // 1 (or 0) = no group-limited routing
    int64_t n_group_used = 1;  // groups kept when n_group > 1
    GatingFunc gating = GatingFunc::softmax;
    bool norm_weights = false;
    float weights_scale = 1.0f;  // 0 (the key absent) means 1
};

struct MoeWeights {
    WeightMatrix router;                // ffn_gate_inp [n_expert rows, n_embd cols]
    const float *probs_bias = nullptr;  // exp_probs_b.bias [n_expert], or null
    // The 3-D GGUF tensors seen as stacks of per-expert row blocks:
    WeightMatrix gate_exps, up_exps;  // {n_embd, n_ff_exp, n_expert} as [n_expert*n_ff_exp rows, n_embd cols]
    // Or llama.cpp's fused ffn_gate_up_exps {n_embd, 2 * n_ff_exp, n_expert} (its converter's --fuse-gate-up-exps) in
    // both gate_exps and up_exps, as [2 * n_expert * n_ff_exp rows, n_embd cols]: expert e's gate is row block 2e of
    // n_ff_exp rows, its up block 2e + 1.
    bool gate_up_fused = false;
    WeightMatrix down_exps;  // {n_ff_exp, n_embd, n_expert} as [n_expert*n_embd rows, n_ff_exp cols]
    // Shared expert(s): [n_ff_sh rows, n_embd cols] x2 and [n_embd rows, n_ff_sh cols]; n_rows == 0 if absent.
    WeightMatrix gate_shexp, up_shexp, down_shexp;
};

// Working memory of moe_ffn: grows to the largest batch seen, then is reused without allocating.
struct MoeScratch {
    std::vector<float> logits;          // [T, n_expert] router output, then the scores
    std::vector<float> probs;           // [n_expert] unbiased scores of one token
    std::vector<float> select;          // [n_expert] scores + bias of one token (choice only)
    std::vector<float> group_score;     // [n_group]
    std::vector<int32_t> group_idx;     // [n_group]
    std::vector<int32_t> experts;       // [T, n_expert_used] chosen experts, in choice order
    std::vector<float> weights;         // [T, n_expert_used] their weights
    std::vector<int64_t> expert_begin;  // [n_expert + 1] offsets into the grouped slots
    std::vector<int64_t> cursor;        // [n_expert] fill positions while grouping
    std::vector<int32_t> slot_token;    // [T * n_expert_used] token of each grouped slot
    std::vector<float> slot_weight;     // [T * n_expert_used]
    std::vector<float> xg;              // [T * n_expert_used, n_embd] gathered inputs, then expert outputs
    std::vector<float> gate, up;        // [T * n_expert_used, n_ff_exp] routed, then [T, n_ff_sh] shared
    std::vector<WeightMatrix> blocks;   // the routed experts' gate / up / down slices of this call
    std::vector<MatmulTask> tasks;      // one matmul_many section's products
};

// Throws sparrow::Error when the parameters are inconsistent with each other or with the weights' shapes.
void moe_check(const MoeParams &p, const MoeWeights &w);

// Routing only: from router logits [T, n_expert] (not modified), writes the chosen experts [T, n_expert_used]
// (in choice order: best biased score first) and their final weights [T, n_expert_used].
// Uses the probs/select/group_score/group_idx members of `scratch`.
void moe_route(const MoeParams &p, const float *logits, const float *probs_bias, int64_t n_tokens, int32_t *experts,
               float *weights, MoeScratch &scratch);

// out[t, :] = the block above for x[t, :]. x, out: [n_tokens, n_embd] f32 (must not alias).
void moe_ffn(ThreadPool &pool, OpScratch &op, MoeScratch &scratch, const MoeParams &p, const MoeWeights &w,
             const float *x, int64_t n_tokens, float *out);

// One expert's matrices as plain weight matrices (row blocks of the stacks; no copy).
WeightMatrix moe_expert_block(const WeightMatrix &stack, int64_t expert, int64_t rows_per_expert);

}  // namespace sparrow
