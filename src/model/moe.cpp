#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"

namespace sparrow {

namespace {

template <typename T>
T *grow(std::vector<T> &v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
}

int64_t effective_groups(const MoeParams &p) { return p.n_group > 1 ? p.n_group : 1; }

void check_stack(const char *what, const WeightMatrix &m, int64_t n_rows, int64_t n_cols) {
    if (m.n_rows != n_rows || m.n_cols != n_cols) {
        throw_error("moe: %s is [%lld, %lld], expected [%lld, %lld]", what, (long long)m.n_rows, (long long)m.n_cols,
                    (long long)n_rows, (long long)n_cols);
    }
}

// Scores in place from router logits (one token's row of n).
void apply_gating(GatingFunc g, float *r, int64_t n) {
    switch (g) {
        case GatingFunc::softmax: softmax(r, n); return;
        case GatingFunc::sigmoid:
            for (int64_t e = 0; e < n; ++e) r[e] = 1.0f / (1.0f + std::exp(-r[e]));
            return;
        case GatingFunc::softmax_weight: return;  // the logits choose; softmax over the chosen weighs
        case GatingFunc::sqrt_softplus:
            for (int64_t e = 0; e < n; ++e) {
                const float v = r[e];  // softplus(v) = max(v, 0) + log1p(exp(-|v|)), stable both ways
                r[e] = std::sqrt(std::max(v, 0.0f) + std::log1p(std::exp(-std::fabs(v))));
            }
            return;
    }
}

}  // namespace

WeightMatrix moe_expert_block(const WeightMatrix &stack, int64_t expert, int64_t rows_per_expert) {
    WeightMatrix m = stack;
    m.data = stack.row(expert * rows_per_expert);
    m.n_rows = rows_per_expert;
    return m;
}

void moe_check(const MoeParams &p, const MoeWeights &w) {
    if (p.n_embd <= 0 || p.n_expert <= 0 || p.n_ff_exp <= 0) throw_error("moe: every size must be positive");
    if (p.n_expert_used <= 0 || p.n_expert_used > p.n_expert) {
        throw_error("moe: %lld experts used of %lld", (long long)p.n_expert_used, (long long)p.n_expert);
    }
    switch (p.gating) {
        case GatingFunc::softmax:
        case GatingFunc::sigmoid:
        case GatingFunc::softmax_weight:
        case GatingFunc::sqrt_softplus: break;
        default: throw_error("moe: unknown gating function %u", static_cast<unsigned>(p.gating));
    }
    const int64_t G = effective_groups(p);
    if (G > 1) {
        if (p.n_expert % G != 0 || p.n_expert / G < 2) {
            throw_error("moe: %lld experts do not form %lld groups of at least 2", (long long)p.n_expert, (long long)G);
        }
        if (p.n_group_used <= 0 || p.n_group_used > G) {
            throw_error("moe: %lld groups used of %lld", (long long)p.n_group_used, (long long)G);
        }
        if (p.n_group_used * (p.n_expert / G) < p.n_expert_used) {
            throw_error("moe: %lld kept groups of %lld experts cannot supply %lld experts", (long long)p.n_group_used,
                        (long long)(p.n_expert / G), (long long)p.n_expert_used);
        }
    }
    check_stack("ffn_gate_inp", w.router, p.n_expert, p.n_embd);
    if (w.gate_up_fused) {
        check_stack("ffn_gate_up_exps", w.gate_exps, 2 * p.n_expert * p.n_ff_exp, p.n_embd);
        if (w.up_exps.data != w.gate_exps.data) throw_error("moe: a fused gate/up stack must be both gate and up");
    } else {
        check_stack("ffn_gate_exps", w.gate_exps, p.n_expert * p.n_ff_exp, p.n_embd);
        check_stack("ffn_up_exps", w.up_exps, p.n_expert * p.n_ff_exp, p.n_embd);
    }
    check_stack("ffn_down_exps", w.down_exps, p.n_expert * p.n_embd, p.n_ff_exp);
    const int64_t n_sh = w.gate_shexp.n_rows;
    if (n_sh > 0 || w.up_shexp.n_rows > 0 || w.down_shexp.n_rows > 0) {
        check_stack("ffn_gate_shexp", w.gate_shexp, n_sh, p.n_embd);
        check_stack("ffn_up_shexp", w.up_shexp, n_sh, p.n_embd);
        check_stack("ffn_down_shexp", w.down_shexp, p.n_embd, n_sh);
    }
}

void moe_route(const MoeParams &p, const float *logits, const float *probs_bias, int64_t n_tokens, int32_t *experts,
               float *weights, MoeScratch &s) {
    const int64_t E = p.n_expert, K = p.n_expert_used, G = effective_groups(p), per_group = E / G;
    float *pr = grow(s.probs, static_cast<size_t>(E));
    float *sel = grow(s.select, static_cast<size_t>(E));
    float *gscore = grow(s.group_score, static_cast<size_t>(G));
    int32_t *gidx = grow(s.group_idx, static_cast<size_t>(G));
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n_tokens; ++t) {
        std::memcpy(pr, logits + t * E, static_cast<size_t>(E) * sizeof(float));
        apply_gating(p.gating, pr, E);
        std::memcpy(sel, pr, static_cast<size_t>(E) * sizeof(float));
        if (probs_bias) {
            for (int64_t e = 0; e < E; ++e) sel[e] += probs_bias[e];
        }
        if (G > 1) {
            for (int64_t g = 0; g < G; ++g) {
                int32_t top2[2];
                const int64_t n = top_k(sel + g * per_group, per_group, 2, top2);
                float sum = 0.0f;
                for (int64_t i = 0; i < n; ++i) sum += sel[g * per_group + top2[i]];
                gscore[g] = sum;
            }
            const int64_t kept = top_k(gscore, G, p.n_group_used, gidx);
            // Mask every expert of a group not kept.
            for (int64_t g = 0; g < G; ++g) {
                bool keep = false;
                for (int64_t i = 0; i < kept; ++i) keep = keep || gidx[i] == g;
                if (!keep) std::fill(sel + g * per_group, sel + (g + 1) * per_group, kNegInf);
            }
        }
        int32_t *ex = experts + t * K;
        float *wt = weights + t * K;
        const int64_t n = top_k(sel, E, K, ex);
        SPARROW_ASSERT(n == K);
        for (int64_t i = 0; i < K; ++i) wt[i] = pr[ex[i]];
        if (p.gating == GatingFunc::softmax_weight) softmax(wt, K);
        if (p.norm_weights) {
            float sum = 0.0f;
            for (int64_t i = 0; i < K; ++i) sum += wt[i];
            sum = std::max(sum, kMoeWeightSumMin);
            for (int64_t i = 0; i < K; ++i) wt[i] /= sum;
        }
        if (p.weights_scale != 0.0f && p.weights_scale != 1.0f) {
            for (int64_t i = 0; i < K; ++i) wt[i] *= p.weights_scale;
        }
    }
}

void moe_ffn(ThreadPool &pool, OpScratch &op, MoeScratch &s, const MoeParams &p, const MoeWeights &w, const float *x,
             int64_t n_tokens, float *out) {
    moe_check(p, w);
    if (n_tokens < 0) throw_error("moe: n_tokens = %lld", (long long)n_tokens);
    if (n_tokens == 0) return;
    const int64_t T = n_tokens, E = p.n_expert, K = p.n_expert_used, D = p.n_embd, F = p.n_ff_exp;
    const int64_t n_sh = w.gate_shexp.n_rows;
    const size_t n_slots = static_cast<size_t>(T * K);

    // 1. Routing.
    float *logits = grow(s.logits, static_cast<size_t>(T * E));
    matmul(pool, op, w.router, x, T, logits);
    int32_t *experts = grow(s.experts, n_slots);
    float *weights = grow(s.weights, n_slots);
    moe_route(p, logits, w.probs_bias, T, experts, weights, s);

    // 2. Group the (token, weight) slots by expert: a counting sort, stable in token order.
    int64_t *begin = grow(s.expert_begin, static_cast<size_t>(E + 1));
    std::fill(begin, begin + E + 1, int64_t(0));
    for (int64_t i = 0; i < T * K; ++i) ++begin[experts[i] + 1];
    for (int64_t e = 0; e < E; ++e) begin[e + 1] += begin[e];
    int32_t *slot_token = grow(s.slot_token, n_slots);
    float *slot_weight = grow(s.slot_weight, n_slots);
    int64_t *cursor = grow(s.cursor, static_cast<size_t>(E));
    std::copy(begin, begin + E, cursor);
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < K; ++i) {
            const int64_t at = cursor[experts[t * K + i]]++;
            slot_token[at] = static_cast<int32_t>(t);
            slot_weight[at] = weights[t * K + i];
        }
    }

    // 3. Gather the inputs of every slot, grouped by expert.
    float *xg = grow(s.xg, n_slots * static_cast<size_t>(D));
    for (int64_t i = 0; i < T * K; ++i) {
        std::memcpy(xg + i * D, x + static_cast<int64_t>(slot_token[i]) * D, static_cast<size_t>(D) * sizeof(float));
    }
    // gate / up: the routed slots' rows [n_slots, F] first, then the shared expert's [T, n_sh].
    const size_t sh_at = n_slots * static_cast<size_t>(F);
    float *gate = grow(s.gate, sh_at + static_cast<size_t>(T * n_sh));
    float *up = grow(s.up, sh_at + static_cast<size_t>(T * n_sh));

    // 4. Every expert's gate and up in one parallel section (matmul_many), the shared expert's over all
    // tokens among them; then their downs in a second one. A routed expert sees only its own tokens, and its
    // down output overwrites its gathered inputs (no longer needed). The shared expert's down writes out.
    std::vector<MatmulTask> &tasks = s.tasks;
    std::vector<WeightMatrix> &blocks = s.blocks;  // the routed experts' slices of the stacks
    tasks.clear();
    blocks.clear();
    blocks.reserve(static_cast<size_t>(3 * E));  // no reallocation: tasks point into it
    const int64_t per_expert = w.gate_up_fused ? 2 : 1, up_part = w.gate_up_fused ? 1 : 0;  // blocks of F rows
    for (int64_t e = 0; e < E; ++e) {
        const int64_t b = begin[e], n = begin[e + 1] - b;
        if (n == 0) continue;
        blocks.push_back(moe_expert_block(w.gate_exps, per_expert * e, F));
        tasks.push_back({&blocks.back(), xg + b * D, n, gate + b * F});
        blocks.push_back(moe_expert_block(w.up_exps, per_expert * e + up_part, F));
        tasks.push_back({&blocks.back(), xg + b * D, n, up + b * F});
    }
    if (n_sh > 0) {
        tasks.push_back({&w.gate_shexp, x, T, gate + sh_at});
        tasks.push_back({&w.up_shexp, x, T, up + sh_at});
    }
    matmul_many(pool, op, tasks.data(), static_cast<int64_t>(tasks.size()));
    swiglu(gate, up, gate, static_cast<int64_t>(sh_at) + T * n_sh);
    tasks.clear();
    for (int64_t e = 0; e < E; ++e) {
        const int64_t b = begin[e], n = begin[e + 1] - b;
        if (n == 0) continue;
        blocks.push_back(moe_expert_block(w.down_exps, e, D));
        tasks.push_back({&blocks.back(), gate + b * F, n, xg + b * D});
    }
    if (n_sh > 0) {
        tasks.push_back({&w.down_shexp, gate + sh_at, T, out});
    } else {
        std::fill(out, out + T * D, 0.0f);
    }
    matmul_many(pool, op, tasks.data(), static_cast<int64_t>(tasks.size()));

    // 6. Weighted sum into out, in expert order.
    for (int64_t e = 0; e < E; ++e) {
        for (int64_t j = begin[e]; j < begin[e + 1]; ++j) {
            float *o = out + static_cast<int64_t>(slot_token[j]) * D;
            const float *y = xg + j * D;
            const float a = slot_weight[j];
            for (int64_t d = 0; d < D; ++d) o[d] += a * y[d];
        }
    }
}

}  // namespace sparrow
