// The MoE feed-forward block (model/moe.h) against a scalar double-precision reference written from the
// definition (llama.cpp's build_moe_ffn, docs/MODELS.md §2.1b): every gating function, with and without
// the selection bias, group-limited routing, weight normalisation and scale, several batch sizes, f32 and
// q8_0 expert weights; plus the routing rules one by one (ties, the weight-sum clamp) and a check that the
// experts no token chose are never read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/blocks.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "model/moe.h"
#include "test_util.h"

namespace sparrow {
namespace {

// A matrix [n_rows, n_cols] stored as type t, with the f32 values it really holds (after rounding).
struct OwnedMatrix {
    std::vector<uint8_t> bytes;
    std::vector<double> values;  // dequantised, [n_rows * n_cols]
    WeightMatrix m;
};

OwnedMatrix make_matrix(DType t, int64_t n_rows, int64_t n_cols, const std::vector<float> &x) {
    OwnedMatrix o;
    const int64_t rb = dtype_row_size(t, n_cols);
    o.bytes.resize(static_cast<size_t>(rb * n_rows));
    std::vector<float> row(static_cast<size_t>(n_cols));
    for (int64_t r = 0; r < n_rows; ++r) {
        quantize_row(t, x.data() + r * n_cols, o.bytes.data() + r * rb, n_cols);
        dequantize_row(t, o.bytes.data() + r * rb, row.data(), n_cols);
        o.values.insert(o.values.end(), row.begin(), row.end());
    }
    o.m = {t, o.bytes.data(), n_rows, n_cols, rb};
    return o;
}

struct MoeCase {
    MoeParams p;
    int64_t n_ff_sh = 0;  // 0: no shared expert
    bool bias = false;
    DType type = DType::F32;
};

struct MoeModel {
    MoeParams p;
    OwnedMatrix router, gate, up, down, gate_sh, up_sh, down_sh;
    std::vector<float> bias;
    MoeWeights w;
};

MoeModel make_model(const MoeCase &c, std::mt19937 &rng) {
    MoeModel m;
    m.p = c.p;
    const int64_t D = c.p.n_embd, E = c.p.n_expert, F = c.p.n_ff_exp;
    const auto rnd = [&](int64_t n, float a) { return test::random_floats(rng, static_cast<size_t>(n), -a, a); };
    const float ad = 1.7f / std::sqrt(float(D)), af = 1.7f / std::sqrt(float(F));
    m.router = make_matrix(DType::F32, E, D, rnd(E * D, 3.0f * ad));  // f32, as the converter keeps it
    m.gate = make_matrix(c.type, E * F, D, rnd(E * F * D, ad));
    m.up = make_matrix(c.type, E * F, D, rnd(E * F * D, ad));
    m.down = make_matrix(c.type, E * D, F, rnd(E * D * F, af));
    m.w.router = m.router.m;
    m.w.gate_exps = m.gate.m;
    m.w.up_exps = m.up.m;
    m.w.down_exps = m.down.m;
    if (c.n_ff_sh > 0) {
        const float as = 1.7f / std::sqrt(float(c.n_ff_sh));
        m.gate_sh = make_matrix(c.type, c.n_ff_sh, D, rnd(c.n_ff_sh * D, ad));
        m.up_sh = make_matrix(c.type, c.n_ff_sh, D, rnd(c.n_ff_sh * D, ad));
        m.down_sh = make_matrix(c.type, D, c.n_ff_sh, rnd(D * c.n_ff_sh, as));
        m.w.gate_shexp = m.gate_sh.m;
        m.w.up_shexp = m.up_sh.m;
        m.w.down_shexp = m.down_sh.m;
    }
    if (c.bias) {
        m.bias = rnd(E, 0.3f);
        m.w.probs_bias = m.bias.data();
    }
    return m;
}

// --- the scalar reference (double) ----------------------------------------------------------------------------

std::vector<double> ref_matvec(const std::vector<double> &w, int64_t row0, int64_t n_rows, int64_t n_cols,
                               const double *x) {
    std::vector<double> y(static_cast<size_t>(n_rows));
    for (int64_t r = 0; r < n_rows; ++r) {
        double acc = 0;
        for (int64_t c = 0; c < n_cols; ++c) acc += w[static_cast<size_t>((row0 + r) * n_cols + c)] * x[c];
        y[static_cast<size_t>(r)] = acc;
    }
    return y;
}

// down(silu(gate x) * up x) with rows [row0_gu, +n_ff) of gate/up and [row0_d, +n_embd) of down.
std::vector<double> ref_swiglu_ffn(const std::vector<double> &g, const std::vector<double> &u,
                                   const std::vector<double> &d, int64_t row0_gu, int64_t row0_d, int64_t n_embd,
                                   int64_t n_ff, const double *x) {
    auto a = ref_matvec(g, row0_gu, n_ff, n_embd, x);
    const auto b = ref_matvec(u, row0_gu, n_ff, n_embd, x);
    for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
    return ref_matvec(d, row0_d, n_embd, n_ff, a.data());
}

// Indices of the k largest of v (stable: ties to the lower index).
std::vector<int> ref_top(const std::vector<double> &v, int64_t k) {
    std::vector<int> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return v[size_t(a)] > v[size_t(b)]; });
    idx.resize(static_cast<size_t>(k));
    return idx;
}

void ref_route(const MoeParams &p, const std::vector<double> &logits, const float *bias, std::vector<int> &experts,
               std::vector<double> &weights) {
    const int64_t E = p.n_expert;
    std::vector<double> probs(logits);
    switch (p.gating) {
        case GatingFunc::softmax: {
            const double mx = *std::max_element(probs.begin(), probs.end());
            double sum = 0;
            for (auto &v : probs) sum += (v = std::exp(v - mx));
            for (auto &v : probs) v /= sum;
            break;
        }
        case GatingFunc::sigmoid:
            for (auto &v : probs) v = 1.0 / (1.0 + std::exp(-v));
            break;
        case GatingFunc::softmax_weight: break;
        case GatingFunc::sqrt_softplus:
            for (auto &v : probs) v = std::sqrt(std::log1p(std::exp(v)));
            break;
    }
    std::vector<double> sel(probs);
    if (bias) {
        for (int64_t e = 0; e < E; ++e) sel[size_t(e)] += bias[e];
    }
    if (p.n_group > 1) {
        const int64_t per = E / p.n_group;
        std::vector<double> gs(static_cast<size_t>(p.n_group));
        for (int64_t g = 0; g < p.n_group; ++g) {
            std::vector<double> part(sel.begin() + g * per, sel.begin() + (g + 1) * per);
            std::sort(part.begin(), part.end(), std::greater<>());
            gs[size_t(g)] = part[0] + part[1];
        }
        const auto keep = ref_top(gs, p.n_group_used);
        for (int64_t g = 0; g < p.n_group; ++g) {
            if (std::find(keep.begin(), keep.end(), int(g)) == keep.end()) {
                for (int64_t e = g * per; e < (g + 1) * per; ++e) sel[size_t(e)] = -INFINITY;
            }
        }
    }
    experts = ref_top(sel, p.n_expert_used);
    weights.clear();
    for (int e : experts) weights.push_back(probs[size_t(e)]);
    if (p.gating == GatingFunc::softmax_weight) {
        const double mx = *std::max_element(weights.begin(), weights.end());
        double sum = 0;
        for (auto &v : weights) sum += (v = std::exp(v - mx));
        for (auto &v : weights) v /= sum;
    }
    if (p.norm_weights) {
        double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
        sum = std::max(sum, double(kMoeWeightSumMin));
        for (auto &v : weights) v /= sum;
    }
    if (p.weights_scale != 0.0f && p.weights_scale != 1.0f) {
        for (auto &v : weights) v *= p.weights_scale;
    }
}

std::vector<double> ref_moe(const MoeModel &m, const std::vector<float> &x, int64_t T) {
    const MoeParams &p = m.p;
    const int64_t D = p.n_embd, F = p.n_ff_exp;
    std::vector<double> out(static_cast<size_t>(T * D), 0.0);
    for (int64_t t = 0; t < T; ++t) {
        const std::vector<double> xt(x.begin() + t * D, x.begin() + (t + 1) * D);
        const auto logits = ref_matvec(m.router.values, 0, p.n_expert, D, xt.data());
        std::vector<int> experts;
        std::vector<double> weights;
        ref_route(p, logits, m.w.probs_bias, experts, weights);
        double *o = out.data() + t * D;
        for (size_t i = 0; i < experts.size(); ++i) {
            const int64_t e = experts[i];
            const auto y = ref_swiglu_ffn(m.gate.values, m.up.values, m.down.values, e * F, e * D, D, F, xt.data());
            for (int64_t d = 0; d < D; ++d) o[d] += weights[i] * y[size_t(d)];
        }
        if (m.w.gate_shexp.n_rows > 0) {
            const auto y = ref_swiglu_ffn(m.gate_sh.values, m.up_sh.values, m.down_sh.values, 0, 0, D,
                                          m.w.gate_shexp.n_rows, xt.data());
            for (int64_t d = 0; d < D; ++d) o[d] += y[size_t(d)];
        }
    }
    return out;
}

// Largest per-token relative error ||got - want|| / ||want||.
double max_token_rel_error(const std::vector<float> &got, const std::vector<double> &want, int64_t T, int64_t D) {
    double worst = 0;
    for (int64_t t = 0; t < T; ++t) {
        double num = 0, den = 0;
        for (int64_t d = 0; d < D; ++d) {
            const double a = got[size_t(t * D + d)], b = want[size_t(t * D + d)];
            num += (a - b) * (a - b);
            den += b * b;
        }
        worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
    }
    return worst;
}

MoeParams base_params() {
    MoeParams p;
    p.n_embd = 64;
    p.n_expert = 8;
    p.n_expert_used = 2;
    p.n_ff_exp = 32;
    return p;
}

const char *gating_name(GatingFunc g) {
    switch (g) {
        case GatingFunc::softmax: return "softmax";
        case GatingFunc::sigmoid: return "sigmoid";
        case GatingFunc::softmax_weight: return "softmax_weight";
        case GatingFunc::sqrt_softplus: return "sqrt_softplus";
    }
    return "?";
}

TEST(Moe, MatchesScalarReferenceForEveryRoutingVariant) {
    std::mt19937 rng(7);
    ThreadPool pool(2);
    OpScratch op;
    MoeScratch scratch;  // one scratch for every case: reuse across shapes must be safe
    int n_cases = 0;
    for (DType type : {DType::F32, DType::Q8_0}) {
        // Q8_0: the weights are exact in the reference (dequantised) but the activations are quantised to
        // Q8_0 per token as ggml does, so the error is that of 8-bit activations.
        const double tol = type == DType::F32 ? 2e-5 : 2.5e-2;
        for (GatingFunc g :
             {GatingFunc::softmax, GatingFunc::sigmoid, GatingFunc::softmax_weight, GatingFunc::sqrt_softplus}) {
            for (bool bias : {false, true}) {
                for (int groups : {1, 4}) {
                    for (int variant = 0; variant < 3; ++variant) {
                        MoeCase c;
                        c.p = base_params();
                        c.p.gating = g;
                        c.p.n_group = groups;
                        c.p.n_group_used = groups > 1 ? 2 : 1;
                        c.p.norm_weights = variant >= 1;
                        c.p.weights_scale = variant == 2 ? 2.5f : (variant == 0 ? 0.0f : 1.0f);
                        c.bias = bias;
                        c.type = type;
                        c.n_ff_sh = variant == 1 ? 0 : 64;
                        const MoeModel m = make_model(c, rng);
                        for (int64_t T : {1, 5, 33}) {
                            const auto x = test::random_floats(rng, static_cast<size_t>(T * c.p.n_embd), -1.5f, 1.5f);
                            std::vector<float> out(x.size(), std::nanf(""));
                            moe_ffn(pool, op, scratch, m.p, m.w, x.data(), T, out.data());
                            const auto want = ref_moe(m, x, T);
                            const double err = max_token_rel_error(out, want, T, c.p.n_embd);
                            EXPECT_LT(err, tol)
                                << dtype_name(type) << " " << gating_name(g) << " bias=" << bias << " groups=" << groups
                                << " norm=" << c.p.norm_weights << " scale=" << c.p.weights_scale
                                << " shared=" << c.n_ff_sh << " T=" << T;
                            ++n_cases;
                        }
                    }
                }
            }
        }
    }
    EXPECT_EQ(n_cases, 2 * 4 * 2 * 2 * 3 * 3);
}

TEST(Moe, RoutingMatchesReferenceExactlyOnChoice) {
    // moe_route alone: the same experts in the same order as the double reference, weights to f32 rounding.
    std::mt19937 rng(11);
    MoeScratch s;
    for (GatingFunc g :
         {GatingFunc::softmax, GatingFunc::sigmoid, GatingFunc::softmax_weight, GatingFunc::sqrt_softplus}) {
        for (int groups : {1, 2, 4, 8}) {
            MoeParams p = base_params();
            p.n_expert = 16;
            p.n_expert_used = 4;
            p.gating = g;
            p.n_group = groups;
            p.n_group_used = groups > 1 ? std::max(1, groups / 2) : 1;
            p.norm_weights = true;
            p.weights_scale = 1.5f;
            const int64_t T = 50;
            const auto logits = test::random_floats(rng, static_cast<size_t>(T * p.n_expert), -4.0f, 4.0f);
            const auto bias = test::random_floats(rng, static_cast<size_t>(p.n_expert), -0.5f, 0.5f);
            std::vector<int32_t> ex(static_cast<size_t>(T * p.n_expert_used));
            std::vector<float> wt(ex.size());
            moe_route(p, logits.data(), bias.data(), T, ex.data(), wt.data(), s);
            for (int64_t t = 0; t < T; ++t) {
                std::vector<double> l(logits.begin() + t * p.n_expert, logits.begin() + (t + 1) * p.n_expert);
                std::vector<int> want_e;
                std::vector<double> want_w;
                ref_route(p, l, bias.data(), want_e, want_w);
                for (int64_t i = 0; i < p.n_expert_used; ++i) {
                    const size_t k = size_t(t * p.n_expert_used + i);
                    ASSERT_EQ(ex[k], want_e[size_t(i)]) << gating_name(g) << " groups=" << groups << " t=" << t;
                    EXPECT_NEAR(wt[k], want_w[size_t(i)], 1e-5 * std::max(1.0, std::fabs(want_w[size_t(i)])));
                }
            }
        }
    }
}

TEST(Moe, TiesGoToTheLowerIndex) {
    MoeScratch s;
    MoeParams p = base_params();
    p.gating = GatingFunc::sigmoid;
    p.n_expert_used = 3;
    std::vector<float> logits(8, 0.25f);
    std::vector<int32_t> ex(3);
    std::vector<float> wt(3);
    moe_route(p, logits.data(), nullptr, 1, ex.data(), wt.data(), s);
    EXPECT_EQ(ex, (std::vector<int32_t>{0, 1, 2}));
    // Groups: all equal, so the lowest two groups are kept and the choice starts at expert 0.
    p.n_group = 4;
    p.n_group_used = 2;
    moe_route(p, logits.data(), nullptr, 1, ex.data(), wt.data(), s);
    EXPECT_EQ(ex, (std::vector<int32_t>{0, 1, 2}));
    // Groups by the sum of their two best: group 3 (experts 6, 7) first, group 1 (2, 3) second; group 2
    // holds the single best expert (5) but loses with its weak partner. Experts 2 and 3 tie: 2 is taken.
    logits = {0, 0, 1, 1, 0, 3, 2, 2};
    moe_route(p, logits.data(), nullptr, 1, ex.data(), wt.data(), s);
    EXPECT_EQ(ex, (std::vector<int32_t>{6, 7, 2}));
    // The bias decides the choice, the unbiased score the weight.
    p.n_group = 1;
    p.n_expert_used = 2;
    logits.assign(8, 0.0f);
    logits[0] = 2.0f;
    const std::vector<float> bias = {0, 0, 0, 5, 0, 0, 5, 0};
    moe_route(p, logits.data(), bias.data(), 1, ex.data(), wt.data(), s);
    EXPECT_EQ(ex[0], 3);
    EXPECT_EQ(ex[1], 6);
    EXPECT_FLOAT_EQ(wt[0], 0.5f);  // sigmoid(0), unnormalised, scale 1
    EXPECT_FLOAT_EQ(wt[1], 0.5f);
}

TEST(Moe, WeightSumIsClampedBeforeNormalising) {
    MoeScratch s;
    MoeParams p = base_params();
    p.gating = GatingFunc::sigmoid;
    p.norm_weights = true;
    std::vector<float> logits(8, -30.0f);  // sigmoid ~ 9.4e-14: the sum is far below 2^-14
    std::vector<int32_t> ex(2);
    std::vector<float> wt(2);
    moe_route(p, logits.data(), nullptr, 1, ex.data(), wt.data(), s);
    const float sg = 1.0f / (1.0f + std::exp(30.0f));
    EXPECT_NEAR(wt[0], sg / kMoeWeightSumMin, 1e-6 * sg / kMoeWeightSumMin);
    EXPECT_LT(wt[0] + wt[1], 1e-6f);
}

TEST(Moe, UnroutedExpertsAreNeverRead) {
    // Every expert but 2 and 5 is NaN; the bias forces the choice of 2 and 5 for every token, so the
    // output must be finite and equal to the reference.
    std::mt19937 rng(5);
    ThreadPool pool(2);
    OpScratch op;
    MoeScratch scratch;
    for (DType type : {DType::F32, DType::Q8_0}) {
        for (int groups : {1, 4}) {
            MoeCase c;
            c.p = base_params();
            c.p.gating = GatingFunc::softmax;
            c.p.n_group = groups;
            c.p.n_group_used = groups > 1 ? 2 : 1;
            c.p.norm_weights = true;
            c.bias = true;
            c.type = type;
            c.n_ff_sh = 32;
            MoeModel m = make_model(c, rng);
            m.bias.assign(8, 0.0f);
            m.bias[2] = m.bias[5] = 100.0f;
            const int64_t D = c.p.n_embd, F = c.p.n_ff_exp;
            // NaN rows written directly (quantising NaN would convert NaN to int8): f32 NaNs, or Q8_0
            // blocks whose scale is an f16 NaN.
            const auto poison = [&](OwnedMatrix &om, int64_t r0, int64_t r1) {
                uint8_t *p = om.bytes.data() + r0 * om.m.row_bytes;
                const int64_t n_bytes = (r1 - r0) * om.m.row_bytes;
                if (type == DType::F32) {
                    const float nan = std::nanf("");
                    for (int64_t i = 0; i < n_bytes; i += 4) std::memcpy(p + i, &nan, 4);
                } else {
                    auto *b = reinterpret_cast<BlockQ8_0 *>(p);
                    for (int64_t i = 0; i < n_bytes / int64_t(sizeof(BlockQ8_0)); ++i) {
                        b[i].d = 0x7e00;
                        std::fill(std::begin(b[i].qs), std::end(b[i].qs), int8_t(1));
                    }
                }
            };
            for (int64_t e = 0; e < c.p.n_expert; ++e) {
                if (e == 2 || e == 5) continue;
                poison(m.gate, e * F, (e + 1) * F);
                poison(m.up, e * F, (e + 1) * F);
                poison(m.down, e * D, (e + 1) * D);
            }
            for (int64_t T : {1, 7, 40}) {
                const auto x = test::random_floats(rng, static_cast<size_t>(T * D));
                std::vector<float> out(x.size());
                moe_ffn(pool, op, scratch, m.p, m.w, x.data(), T, out.data());
                for (float v : out) ASSERT_TRUE(std::isfinite(v)) << dtype_name(type) << " groups=" << groups;
                // The reference reads only the chosen rows as well (its values for the NaN experts are NaN).
                const auto want = ref_moe(m, x, T);
                EXPECT_LT(max_token_rel_error(out, want, T, D), type == DType::F32 ? 2e-5 : 2.5e-2);
            }
        }
    }
}

TEST(Moe, ScratchIsReusedOnceSized) {
    std::mt19937 rng(9);
    ThreadPool pool(1);
    OpScratch op;
    MoeScratch s;
    MoeCase c;
    c.p = base_params();
    c.p.gating = GatingFunc::sigmoid;
    c.n_ff_sh = 32;
    const MoeModel m = make_model(c, rng);
    auto x = test::random_floats(rng, static_cast<size_t>(33 * c.p.n_embd));
    std::vector<float> out(x.size());
    moe_ffn(pool, op, s, m.p, m.w, x.data(), 33, out.data());
    const void *xg = s.xg.data(), *gate = s.gate.data(), *logits = s.logits.data();
    for (int64_t T : {1, 5, 33, 2}) {
        moe_ffn(pool, op, s, m.p, m.w, x.data(), T, out.data());
        EXPECT_EQ(s.xg.data(), xg);
        EXPECT_EQ(s.gate.data(), gate);
        EXPECT_EQ(s.logits.data(), logits);
    }
}

TEST(Moe, RejectsInconsistentParameters) {
    std::mt19937 rng(3);
    MoeCase c;
    c.p = base_params();
    const MoeModel m = make_model(c, rng);
    EXPECT_NO_THROW(moe_check(m.p, m.w));
    auto bad = [&](auto edit) {
        MoeParams p = m.p;
        MoeWeights w = m.w;
        edit(p, w);
        EXPECT_THROW(moe_check(p, w), Error);
    };
    bad([](MoeParams &p, MoeWeights &) { p.n_expert_used = 9; });
    bad([](MoeParams &p, MoeWeights &) { p.n_expert_used = 0; });
    bad([](MoeParams &p, MoeWeights &) { p.n_group = 3; });                      // 8 % 3
    bad([](MoeParams &p, MoeWeights &) { p.n_group = 8; });                      // groups of 1
    bad([](MoeParams &p, MoeWeights &) { p.n_group = 4, p.n_group_used = 5; });  // more than there are
    bad([](MoeParams &p, MoeWeights &) { p.n_group = 4, p.n_group_used = 1, p.n_expert_used = 3; });
    bad([](MoeParams &p, MoeWeights &) { p.gating = static_cast<GatingFunc>(7); });
    bad([](MoeParams &, MoeWeights &w) { w.down_exps.n_rows -= 1; });
    bad([](MoeParams &, MoeWeights &w) { w.router.n_cols = 32; });
    bad([](MoeParams &p, MoeWeights &) { p.n_ff_exp = 16; });
}

}  // namespace
}  // namespace sparrow
