// The sampler against a plain reference (a full sort by rank, the top-k, typical, nucleus, min-p and XTC cuts on it,
// then the tempered softmax): greedy picks and their ties, the set of tokens a draw may return (exact, at the cuts'
// ties too), and the frequencies of many draws against the reference's probabilities, on logits with ties, -inf and
// NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace sparrow {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Probabilities the sampler should draw from: rank = (logit descending, id ascending; NaN as -inf); the top_k
// first; of those the smallest prefix whose probability at temperature 1 (renormalised over them) reaches top_p;
// of those the tokens whose probability is at least min_p times the best one's; then softmax(logit / temp) over the
// rest.
std::vector<double> reference_probs(const std::vector<float> &logits, const SamplerParams &p) {
    const size_t V = logits.size();
    std::vector<float> v(V);
    for (size_t i = 0; i < V; ++i) v[i] = logits[i] == logits[i] ? logits[i] : -kInf;
    std::vector<size_t> order(V);
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    size_t n = V;
    if (p.top_n_sigma > 0.0f) {  // first: the logits at least max - top_n_sigma x (deviation of the finite ones)
        double mean = 0.0, var = 0.0, count = 0.0;
        for (const float x : v) {
            if (std::isfinite(x)) mean += x, count += 1.0;
        }
        mean /= count;
        for (const float x : v) {
            if (std::isfinite(x)) var += (x - mean) * (x - mean);
        }
        const double floor = v[order[0]] - p.top_n_sigma * std::sqrt(var / count);
        while (n > 1 && !(v[order[n - 1]] >= floor)) --n;
    }
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) n = static_cast<size_t>(p.top_k);
    // The probability at temperature 1 of order[i] among order[0, n) (order[0] is the best of them).
    const auto prob = [&](size_t i) {
        double total = 0.0;
        for (size_t j = 0; j < n; ++j) total += std::exp(double(v[order[j]]) - v[order[0]]);
        return std::exp(double(v[order[i]]) - v[order[0]]) / total;
    };
    if (p.typical_p < 1.0f && n > 1) {  // by |surprisal - entropy| (ties by rank), until the mass reaches typical_p
        double entropy = 0.0;
        std::vector<double> pr(n);
        for (size_t i = 0; i < n; ++i) {
            pr[i] = prob(i);
            if (pr[i] > 0.0) entropy -= pr[i] * std::log(pr[i]);
        }
        std::vector<size_t> by(n);
        std::iota(by.begin(), by.end(), size_t(0));
        const auto dist = [&](size_t i) {
            return pr[i] > 0.0 ? std::abs(-std::log(pr[i]) - entropy) : std::numeric_limits<double>::infinity();
        };
        std::stable_sort(by.begin(), by.end(), [&](size_t a, size_t b) { return dist(a) < dist(b); });
        double cum = 0.0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            cum += pr[by[i]];
            if (cum >= p.typical_p) {
                keep = i + 1;
                break;
            }
        }
        by.resize(keep);
        std::sort(by.begin(), by.end());  // back to rank order
        std::vector<size_t> kept;
        for (size_t i : by) kept.push_back(order[i]);
        std::copy(kept.begin(), kept.end(), order.begin());
        n = keep;
    }
    if (p.top_p < 1.0f) {
        double cum = 0.0;
        for (size_t i = 0; i < n; ++i) {
            cum += prob(i);
            if (cum >= p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0.0f) {  // then only tokens at or above best + ln(min_p): a shorter prefix of the same order
        const float keep = min_p_floor(v[order[0]], p.min_p);
        while (n > 1 && !(v[order[n - 1]] >= keep)) --n;
    }
    // softmax(logit / temp) over order[first, n)
    const auto tempered = [&](size_t first) {
        std::vector<double> probs(V, 0.0);
        double total = 0.0, temp = p.temp;
        if (p.dynatemp_range > 0.0f && n - first > 1) {  // from the entropy of softmax(logit) over order[first, n)
            double z = 0.0;
            for (size_t i = first; i < n; ++i) z += std::exp(double(v[order[i]]) - v[order[first]]);
            double entropy = 0.0;
            for (size_t i = first; i < n; ++i) {
                const double q = std::exp(double(v[order[i]]) - v[order[first]]) / z;
                if (q > 0.0) entropy -= q * std::log(q);
            }
            const double lo = std::max(0.0, temp - p.dynatemp_range), hi = temp + p.dynatemp_range;
            temp = lo + (hi - lo) * std::pow(entropy / std::log(double(n - first)), double(p.dynatemp_exponent));
        }
        for (size_t i = first; i < n; ++i)
            total += probs[order[i]] = std::exp((double(v[order[i]]) - v[order[first]]) / temp);
        for (double &x : probs) x /= total;
        return probs;
    };
    std::vector<double> probs = tempered(0);
    if (p.xtc_probability > 0.0f && p.xtc_threshold <= 0.5f && n > 1) {
        // With probability xtc_probability the tokens at or above the threshold go, but the last of them.
        size_t last_above = 0;
        while (last_above + 1 < n && prob(last_above + 1) >= p.xtc_threshold) ++last_above;
        if (last_above > 0) {
            const std::vector<double> cut = tempered(last_above);
            const double q = std::min(1.0, double(p.xtc_probability));
            for (size_t i = 0; i < V; ++i) probs[i] = (1.0 - q) * probs[i] + q * cut[i];
        }
    }
    return probs;
}

std::string describe(const SamplerParams &p, size_t V) {
    return "vocab " + std::to_string(V) + " temp " + std::to_string(p.temp) + " top_k " + std::to_string(p.top_k) +
           " top_p " + std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p) + " typical_p " +
           std::to_string(p.typical_p) + " xtc " + std::to_string(p.xtc_probability) + "/" +
           std::to_string(p.xtc_threshold) + " top_n_sigma " + std::to_string(p.top_n_sigma) + " dynatemp " +
           std::to_string(p.dynatemp_range) + "^" + std::to_string(p.dynatemp_exponent);
}

TEST(Sampler, GreedyTakesTheFirstLargestAndIgnoresNaN) {
    for (size_t V : {1, 7, 8, 9, 33, 1000}) {
        for (size_t at = 0; at < V; at += std::max<size_t>(1, V / 7)) {
            std::vector<float> logits(V, 0.5f);
            logits[at] = 2.0f;
            EXPECT_EQ(argmax(logits), static_cast<int32_t>(at)) << "vocab " << V;
            if (at + 1 < V) {
                logits[V - 1] = 2.0f;  // a tie later on: the lower id wins
                EXPECT_EQ(argmax(logits), static_cast<int32_t>(at)) << "vocab " << V;
            }
        }
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(argmax(std::vector<float>{nan, 1.0f, 3.0f, nan}), 2);  // a NaN first never wins
    EXPECT_EQ(argmax(std::vector<float>{nan, nan}), 0);              // nothing to compare: the first
    EXPECT_EQ(argmax(std::vector<float>{-kInf, -kInf, -kInf}), 0);
    EXPECT_EQ(argmax(std::vector<float>{-kInf, -3.0f, -kInf}), 1);
    // temperature 0 is greedy whatever the other settings
    Sampler s({0.0f, 3, 0.5f, 7});
    EXPECT_EQ(s.sample(std::vector<float>{1.0f, 5.0f, 5.0f, -1.0f}), 1);
}

// n draws land only where the reference gives a positive probability, and their frequencies match it (within five
// standard deviations of each token's count).
void check_frequencies(const std::vector<float> &logits, const SamplerParams &p, int n) {
    const auto want = reference_probs(logits, p);
    Sampler s(p);
    std::vector<int> count(logits.size(), 0);
    for (int d = 0; d < n; ++d) {
        const int32_t t = s.sample(logits);
        ASSERT_TRUE(t >= 0 && static_cast<size_t>(t) < logits.size());
        ASSERT_GT(want[static_cast<size_t>(t)], 0.0) << describe(p, logits.size()) << ": drew token " << t;
        ++count[static_cast<size_t>(t)];
    }
    for (size_t i = 0; i < logits.size(); ++i) {
        const double q = want[i], f = double(count[i]) / n;
        EXPECT_LE(std::abs(f - q), 5.0 * std::sqrt(q * (1.0 - q) / n) + 1e-12)
            << describe(p, logits.size()) << ": token " << i << " drawn " << f << ", want " << q;
    }
}

// Mirostat's distribution for one draw from mu, written out: softmax(logit / temp) over the vocabulary in rank
// order; version 2 keeps the prefix whose surprise -log2 p is at most mu (at least the best token), version 1 the
// top k, k = (e 2^mu / (1 - V^-e))^(1 / s), e = s - 1, s the least-squares slope of ln(p_i / p_i+1) on
// ln((i + 2) / (i + 1)) over the 100 best; then softmax(logit / temp) over what is kept.
std::vector<double> mirostat_reference(const std::vector<float> &logits, const SamplerParams &p, double mu) {
    const size_t V = logits.size();
    std::vector<size_t> order(V);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    std::vector<double> pr(V);
    double z = 0.0;
    for (size_t i = 0; i < V; ++i) z += pr[i] = std::exp((double(logits[order[i]]) - logits[order[0]]) / p.temp);
    for (double &x : pr) x /= z;
    size_t n = 0;
    if (p.mirostat == 2) {
        while (n < V && -std::log2(pr[n]) <= mu) ++n;
        n = std::max<size_t>(n, 1);
    } else {
        double tb = 0.0, tt = 0.0;
        for (size_t i = 0; i + 1 < std::min<size_t>(100, V); ++i) {
            const double t = std::log(double(i + 2) / double(i + 1));
            tb += t * std::log(pr[i] / pr[i + 1]);
            tt += t * t;
        }
        const double sl = tb / tt, e = sl - 1.0;
        const double k = std::pow(e * std::pow(2.0, mu) / (1.0 - std::pow(double(V), -e)), 1.0 / sl);
        n = std::isnan(k) ? V : k < 1.0 ? 1 : static_cast<size_t>(std::min(k, double(V)));
    }
    std::vector<double> probs(V, 0.0);
    double kept = 0.0;
    for (size_t i = 0; i < n; ++i) kept += pr[i];
    for (size_t i = 0; i < n; ++i) probs[order[i]] = pr[i] / kept;
    return probs;
}

// Both versions: the first draws of fresh samplers follow the reference from mu = 2 tau, and along one sampler's
// draws mu moves by eta times each draw's surprise error (the surprise under the reference), drawing only kept
// tokens; over many draws the mean surprise settles near tau.
TEST(Sampler, MirostatDrawsTrackTheTargetSurprise) {
    std::vector<float> zipf(500);  // a Zipf-like spread with some noise, distinct logits
    std::mt19937 rng(5);
    for (size_t i = 0; i < zipf.size(); ++i)
        zipf[i] = -1.2f * std::log(float(i + 1)) + 0.01f * float(rng() % 100) + 3.0f;
    std::shuffle(zipf.begin(), zipf.end(), rng);
    for (int version : {1, 2}) {
        for (float temp : {1.0f, 0.7f}) {
            for (float tau : {2.0f, 4.0f}) {
                SamplerParams p{temp, 40, 0.5f, 0};  // top-k and top-p are ignored under Mirostat
                p.mirostat = version;
                p.mirostat_tau = tau;
                p.mirostat_eta = 0.1f;
                const std::string what = "mirostat " + std::to_string(version) + " temp " + std::to_string(temp) +
                                         " tau " + std::to_string(tau);
                const std::vector<double> first = mirostat_reference(zipf, p, 2.0 * tau);
                constexpr int kDraws = 20000;
                std::vector<int> count(zipf.size(), 0);
                for (int d = 0; d < kDraws; ++d) {
                    p.seed = static_cast<uint64_t>(d);
                    Sampler fresh(p);
                    ASSERT_DOUBLE_EQ(fresh.mirostat_mu(), 2.0 * tau);
                    const int32_t t = fresh.sample(zipf);
                    ASSERT_GT(first[static_cast<size_t>(t)], 0.0) << what << ": drew token " << t;
                    ++count[static_cast<size_t>(t)];
                    if (d < 50) {
                        const double surprise = -std::log2(first[static_cast<size_t>(t)]);
                        EXPECT_NEAR(fresh.mirostat_mu(), 2.0 * tau - 0.1 * (surprise - tau), 1e-4) << what;
                    }
                }
                for (size_t i = 0; i < zipf.size(); ++i) {
                    const double q = first[i], f = double(count[i]) / kDraws;
                    EXPECT_LE(std::abs(f - q), 5.0 * std::sqrt(q * (1.0 - q) / kDraws) + 1e-12)
                        << what << ": token " << i << " drawn " << f << ", want " << q;
                }
                p.seed = 9;
                Sampler one(p);
                double total_surprise = 0.0;
                constexpr int kSteps = 3000;
                for (int d = 0; d < kSteps; ++d) {
                    const double mu = one.mirostat_mu();
                    const std::vector<double> want = mirostat_reference(zipf, p, mu);
                    const int32_t t = one.sample(zipf);
                    ASSERT_GT(want[static_cast<size_t>(t)], 0.0) << what << " step " << d;
                    const double surprise = -std::log2(want[static_cast<size_t>(t)]);
                    ASSERT_NEAR(one.mirostat_mu(), mu - 0.1 * (surprise - tau), 1e-3) << what << " step " << d;
                    total_surprise += surprise;
                }
                EXPECT_NEAR(total_surprise / kSteps, tau, 0.25 * tau) << what;
            }
        }
    }
}

TEST(Sampler, DrawsFollowTheReferenceDistribution) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // Ties at several places (the top-k and nucleus cuts fall among them), -inf and NaN entries.
    const std::vector<float> small = {1.0f, 3.0f, 3.0f, -kInf, 2.0f, 0.5f, 3.0f,  nan,   2.0f, -1.0f,
                                      0.0f, 2.0f, 1.5f, -2.0f, 2.5f, 2.5f, -kInf, 0.25f, 1.0f, 4.0f};
    for (float temp : {0.5f, 1.0f, 2.0f}) {
        for (int top_k : {0, 1, 3, 4, 8, 19, 20, 40}) {
            for (float top_p : {0.1f, 0.5f, 0.9f, 0.99f, 1.0f})
                check_frequencies(small, {temp, top_k, top_p, 11}, 20000);
        }
    }
    // min-p alone and with the other cuts: 0.3 and 0.08 keep the logits >= 3 and >= 1.5 below the maximum 4 (floors
    // 2.80 and 1.47 fall between the list's values), 0.9 the maximum alone, and 1.0 too (a logit at the floor stays).
    for (float min_p : {0.3f, 0.08f, 0.9f, 1.0f}) {
        for (int top_k : {0, 3, 8}) {
            for (float top_p : {0.5f, 0.99f, 1.0f}) check_frequencies(small, {1.0f, top_k, top_p, 13, min_p}, 20000);
        }
        check_frequencies(small, {0.5f, 0, 1.0f, 14, min_p}, 20000);
    }
    // Typical-p, alone and between top-k and the later cuts, and XTC, alone and after them (its draw mixes the
    // distribution with and without the top tokens); a threshold above 0.5 never applies.
    for (float typical : {0.2f, 0.5f, 0.9f, 0.999f}) {
        for (int top_k : {0, 8}) {
            check_frequencies(small, {1.0f, top_k, 1.0f, 21, 0.0f, typical}, 20000);
            check_frequencies(small, {0.7f, top_k, 0.9f, 22, 0.1f, typical}, 20000);
        }
    }
    // Top-n-sigma, alone and before every other cut (the list's finite logits: mean ~1.6, deviation ~1.45; 0.5 keeps
    // those >= ~3.3, 1 >= ~2.6, 2 >= ~1.1).
    for (float sigma : {0.5f, 1.0f, 2.0f}) {
        SamplerParams alone{1.0f, 0, 1.0f, 25};
        alone.top_n_sigma = sigma;
        check_frequencies(small, alone, 20000);
        SamplerParams all{0.8f, 8, 0.9f, 26, 0.05f, 0.9f, 0.5f, 0.1f};
        all.top_n_sigma = sigma;
        check_frequencies(small, all, 20000);
        all.top_k = 2;
        check_frequencies(small, all, 20000);
    }
    // Dynamic temperature over what the cuts keep (and after XTC's cut, over what it leaves).
    for (float range : {0.5f, 1.5f}) {
        for (float exponent : {0.5f, 1.0f, 2.0f}) {
            SamplerParams alone{1.0f, 0, 1.0f, 27};
            alone.dynatemp_range = range;
            alone.dynatemp_exponent = exponent;
            check_frequencies(small, alone, 20000);
            SamplerParams all{0.8f, 8, 0.95f, 28, 0.05f, 1.0f, 0.5f, 0.1f};
            all.dynatemp_range = range;
            all.dynatemp_exponent = exponent;
            check_frequencies(small, all, 20000);
        }
    }
    for (float probability : {0.3f, 1.0f}) {
        for (float threshold : {0.02f, 0.1f, 0.2f, 0.6f}) {
            check_frequencies(small, {1.0f, 0, 1.0f, 23, 0.0f, 1.0f, probability, threshold}, 20000);
            check_frequencies(small, {1.5f, 8, 0.95f, 24, 0.05f, 0.9f, probability, threshold}, 20000);
        }
    }
    // 300 tokens with values from a short list (ties everywhere): past the nucleus search's short range, so its
    // partition rounds run and their cut is checked token by token.
    std::vector<float> mid(300);
    for (size_t i = 0; i < mid.size(); ++i) mid[i] = small[(i * 7) % small.size()] + 0.1f * float(i % 3);
    for (int top_k : {0, 50, 400}) {
        for (float top_p : {0.3f, 0.9f, 1.0f}) check_frequencies(mid, {1.0f, top_k, top_p, 12}, 20000);
    }
}

// At vocabulary sizes where the nucleus has hundreds to thousands of tokens (the quickselect's rounds, not only its
// short-range finish) and top-k keeps more than the heap's 256: every draw lies in the reference's set.
TEST(Sampler, LargeVocabulariesDrawOnlyFromTheCut) {
    std::mt19937 rng(3);
    for (float spread : {0.3f, 3.0f}) {
        for (size_t V : {4097, 20000}) {
            std::normal_distribution<float> gauss(0.0f, spread);
            std::vector<float> logits(V);
            for (float &x : logits) x = gauss(rng);
            for (size_t i = 0; i < V; i += 97) logits[i] = logits[i / 2];  // ties across the range
            for (const SamplerParams &p :
                 {SamplerParams{1.0f, 0, 0.9f, 5}, SamplerParams{0.7f, 0, 0.3f, 5}, SamplerParams{1.0f, 1000, 0.95f, 5},
                  SamplerParams{1.0f, 300, 1.0f, 5}, SamplerParams{1.0f, 0, 1.0f, 5},
                  SamplerParams{1.0f, 0, 1.0f, 5, 0.05f}, SamplerParams{1.0f, 0, 0.95f, 5, 0.2f},
                  SamplerParams{0.8f, 1000, 0.95f, 5, 0.05f}}) {
                const auto want = reference_probs(logits, p);
                const auto support = std::count_if(want.begin(), want.end(), [](double q) { return q > 0.0; });
                Sampler s(p);
                std::vector<bool> seen(V, false);
                for (int d = 0; d < 400; ++d) {
                    const int32_t t = s.sample(logits);
                    ASSERT_GT(want[static_cast<size_t>(t)], 0.0)
                        << describe(p, V) << " spread " << spread << ": drew token " << t << " outside the " << support
                        << " of the cut";
                    seen[static_cast<size_t>(t)] = true;
                }
                // Draws reach beyond the most likely one: a cut that kept too little would show here.
                const auto distinct = std::count(seen.begin(), seen.end(), true);
                EXPECT_GE(distinct, std::min<std::ptrdiff_t>(support, 5)) << describe(p, V);
            }
        }
    }
}

// Top-k's ties go to the lower ids, on both of its paths (a heap up to 256 candidates, a selection above).
TEST(Sampler, TopKTiesGoToTheLowerIds) {
    for (auto [V, k] : {std::pair<size_t, int>{10, 2}, {2000, 300}}) {
        std::vector<float> logits(V, 5.0f);
        Sampler s({100.0f, k, 1.0f, 4});  // a high temperature: every kept token is drawn now and then
        std::vector<bool> seen(V, false);
        for (int d = 0; d < 20 * k; ++d) {
            const int32_t t = s.sample(logits);
            ASSERT_LT(t, k) << "vocab " << V << " top_k " << k << ": drew token " << t;
            seen[static_cast<size_t>(t)] = true;
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), true), k) << "vocab " << V << " top_k " << k;
    }
}

// The nucleus search against a sort, on random candidates with many ties and zero masses, at sizes on both sides
// of its short-range finish, for wanted masses from none to more than all: the same set.
TEST(Sampler, NucleusSearchMatchesASortedPrefix) {
    std::mt19937 rng(8);
    // (From 2048 candidates the search looks at buckets of key first: 3001 and 9000 take that path.)
    for (size_t n : {1, 2, 31, 32, 33, 34, 100, 257, 1000, 2047, 3001, 9000}) {
        for (int distinct : {1, 3, 40, 100000}) {
            for (int rep = 0; rep < 20; ++rep) {
                std::vector<Sampler::Candidate> c(n);
                std::vector<int32_t> ids(n);
                std::iota(ids.begin(), ids.end(), 0);
                std::shuffle(ids.begin(), ids.end(), rng);  // the search must not rely on the input order
                double total = 0.0;
                for (size_t i = 0; i < n; ++i) {
                    const int level = static_cast<int>(rng() % static_cast<unsigned>(distinct));
                    const float logit = level == 0 && distinct > 2 ? -kInf : -0.01f * float(level);
                    c[i] = {logit, ids[i], logit == -kInf ? 0.0 : std::exp(double(logit))};
                    total += c[i].mass;
                }
                std::vector<Sampler::Candidate> sorted = c;
                std::sort(sorted.begin(), sorted.end(), [](const Sampler::Candidate &a, const Sampler::Candidate &b) {
                    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
                });
                // (Not exactly 1: the sums run in another order, and need == total would then compare rounding.)
                for (double frac : {0.0, 1e-9, 0.3, 0.5, 0.9, 0.999, 0.99999, 1.5}) {
                    const double need = frac * total;
                    size_t want = n;
                    double cum = 0.0;
                    for (size_t i = 0; i < n; ++i) {
                        cum += sorted[i].mass;
                        if (cum >= need) {
                            want = i + 1;
                            break;
                        }
                    }
                    std::vector<Sampler::Candidate> work = c;
                    const size_t got = take_nucleus(work, need);
                    ASSERT_EQ(got, want) << "n " << n << " distinct " << distinct << " frac " << frac;
                    std::vector<int32_t> a, b;
                    for (size_t i = 0; i < got; ++i) {
                        a.push_back(work[i].id);
                        b.push_back(sorted[i].id);
                    }
                    std::sort(a.begin(), a.end());
                    std::sort(b.begin(), b.end());
                    ASSERT_EQ(a, b) << "n " << n << " distinct " << distinct << " frac " << frac;
                }
            }
        }
    }
}

// exp_nonpositive against exp in double over its whole range: relative error below 3e-7 (2.5 ulp) down to
// -126 ln 2, 0 below it and at -inf; and sum_exp.
TEST(Sampler, ExpNonPositiveIsAccurate) {
    double worst = 0.0;
    for (int i = 0; i <= 2000000; ++i) {
        const float x = -87.3365f * float(i) / 2000000.0f;
        const double want = std::exp(double(x)), got = exp_nonpositive(x);
        worst = std::max(worst, std::abs(got - want) / want);
    }
    EXPECT_LT(worst, 3e-7);
    EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
    EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
    EXPECT_EQ(exp_nonpositive(-kInf), 0.0f);
    EXPECT_EQ(exp_nonpositive(-1000.0f), 0.0f);
    EXPECT_EQ(exp_nonpositive(-87.34f), 0.0f);
    std::vector<float> logits = {1.0f, -kInf, 0.5f, std::numeric_limits<float>::quiet_NaN(), 1.0f};
    for (int i = 0; i < 700; ++i) logits.push_back(-0.01f * float(i));  // past one 256-element piece
    double want = 0.0;
    for (const float v : logits) {
        if (v == v && v != -kInf) want += std::exp(double(v) - 1.0);
    }
    EXPECT_EQ(max_logit(logits), 1.0f);
    EXPECT_NEAR(sum_exp(logits, 1.0f), want, 1e-6 * want);
}

// The vocabulary-wide loops scan whole blocks first (argmax 64 logits, top-k's filter 64, the draw 64 weights): the
// largest logit at every position around the blocks' edges and in the tail after the last whole block, with an
// equal one later (the lower id wins), NaN-only blocks before it, and vocabularies of every size around a block.
TEST(Sampler, GreedyFindsTheFirstLargestAcrossBlocks) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t V : {63, 64, 65, 127, 128, 129, 200, 4099}) {
        for (size_t at : {size_t(0), size_t(1), size_t(62), size_t(63), size_t(64), size_t(65), size_t(127),
                          size_t(128), V - 2, V - 1}) {
            if (at >= V) continue;
            std::vector<float> logits(V, -1.0f);
            for (size_t i = 0; i < std::min<size_t>(at, 64); ++i) logits[i] = nan;  // a block of NaN first
            logits[at] = 3.0f;
            EXPECT_EQ(argmax(logits), static_cast<int32_t>(at)) << "vocab " << V << " at " << at;
            if (at + 1 < V) {
                logits[V - 1] = 3.0f;
                EXPECT_EQ(argmax(logits), static_cast<int32_t>(at)) << "vocab " << V << " at " << at << ", tie last";
            }
            logits[at] = kInf;  // +inf is a logit like any other
            EXPECT_EQ(argmax(logits), static_cast<int32_t>(at)) << "vocab " << V << " at " << at << ", +inf";
        }
        std::vector<float> all_nan(V, nan);
        EXPECT_EQ(argmax(all_nan), 0) << "vocab " << V;
        all_nan[V - 1] = -kInf;
        EXPECT_EQ(argmax(all_nan), 0) << "vocab " << V;  // nothing above -inf: the first
    }
}

// best_logits (top-k's selection) against a full sort by rank, on logits with ties, NaN and -inf, for vocabularies
// around its filter's block of 64 and k on both sides of its heap's 256.
TEST(Sampler, BestLogitsMatchAFullSort) {
    std::mt19937 rng(12);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t V : {1, 15, 63, 64, 65, 130, 1000, 20001}) {
        std::vector<float> logits(V);
        std::normal_distribution<float> gauss(0.0f, 2.0f);
        for (float &x : logits) x = std::round(gauss(rng) * 8.0f) / 8.0f;  // many ties
        for (size_t i = 3; i < V; i += 41) logits[i] = nan;
        for (size_t i = 5; i < V; i += 53) logits[i] = -kInf;
        if (V > 100) logits[V - 1] = 100.0f;  // the best in the tail after the whole blocks
        std::vector<int32_t> order(V);
        std::iota(order.begin(), order.end(), 0);
        const auto rank = [&](int32_t i) { return logits[i] == logits[i] ? logits[i] : -kInf; };
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return rank(a) > rank(b); });
        for (size_t k : {1, 5, 40, 256, 300}) {
            std::vector<Sampler::Candidate> got;
            best_logits(logits, k, got);
            const size_t want_n = std::min(k, V);
            ASSERT_EQ(got.size(), want_n) << "vocab " << V << " k " << k;
            for (size_t j = 0; j < want_n; ++j) {
                EXPECT_EQ(got[j].id, order[j]) << "vocab " << V << " k " << k << " rank " << j;
                EXPECT_EQ(got[j].logit, rank(order[j])) << "vocab " << V << " k " << k << " rank " << j;
            }
        }
    }
}

// Draws over the whole distribution land only on the tokens with weight, wherever they sit against the draw's
// blocks of 64 (the first, around an edge, alone in the tail after the last whole block), and each of two is drawn.
TEST(Sampler, DrawsFindTheWeightsAcrossBlocks) {
    for (size_t V : {64, 65, 200, 4099}) {
        for (auto [a, b] : {std::pair<size_t, size_t>{0, 1}, {63, 64}, {V - 2, V - 1}, {1, V - 1}}) {
            if (b >= V) continue;
            std::vector<float> logits(V, -kInf);
            logits[a] = 0.0f;
            logits[b] = 0.5f;
            Sampler s({1.0f, 0, 1.0f, 11});
            int n_a = 0, n_b = 0;
            for (int d = 0; d < 200; ++d) {
                const int32_t t = s.sample(logits);
                ASSERT_TRUE(t == static_cast<int32_t>(a) || t == static_cast<int32_t>(b))
                    << "vocab " << V << " weights at " << a << ", " << b << ": drew " << t;
                (t == static_cast<int32_t>(a) ? n_a : n_b) += 1;
            }
            EXPECT_GT(n_a, 20) << "vocab " << V << " at " << a;  // p = 0.38 and 0.62
            EXPECT_GT(n_b, 20) << "vocab " << V << " at " << b;
        }
    }
}

// The sampler's loops run in whichever of their AVX-512, AVX2 or baseline versions the CPU takes; all must give the
// baseline's bits. sum_exp written out here (this file is compiled for the baseline): its pieces of 256, four
// running totals in each, in the same order. Equal, not near: an FMA in a wider version would show.
TEST(Sampler, VectorLoopsGiveTheBaselineBits) {
    std::mt19937 rng(13);
    std::normal_distribution<float> gauss(0.0f, 3.0f);
    for (size_t V : {1, 7, 255, 256, 1000, 32000}) {
        std::vector<float> logits(V);
        for (float &x : logits) x = gauss(rng);
        if (V > 1) logits[V / 2] = -kInf;
        const float max = max_logit(logits);
        double want = 0.0;
        for (size_t p0 = 0; p0 < V; p0 += 256) {
            const size_t n = std::min<size_t>(256, V - p0);
            double sums[4] = {0.0, 0.0, 0.0, 0.0};
            size_t i = 0;
            for (; i + 4 <= n; i += 4) {
                for (size_t l = 0; l < 4; ++l) sums[l] += exp_nonpositive((logits[p0 + i + l] - max) * 1.0f);
            }
            for (; i < n; ++i) sums[0] += exp_nonpositive((logits[p0 + i] - max) * 1.0f);
            want += (sums[0] + sums[1]) + (sums[2] + sums[3]);
        }
        EXPECT_EQ(sum_exp(logits, max), want) << "vocab " << V;
        EXPECT_EQ(max, *std::max_element(logits.begin(), logits.end())) << "vocab " << V;
    }
}

TEST(Sampler, SeedsRepeatAndDiffer) {
    std::vector<float> logits(500);
    std::mt19937 rng(9);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    for (float &x : logits) x = gauss(rng);
    for (const SamplerParams &base :
         {SamplerParams{1.0f, 0, 1.0f, 0}, SamplerParams{0.8f, 40, 0.95f, 0}, SamplerParams{1.0f, 0, 0.9f, 0}}) {
        auto run = [&](uint64_t seed) {
            SamplerParams p = base;
            p.seed = seed;
            Sampler s(p);
            std::vector<int32_t> out;
            for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
            return out;
        };
        EXPECT_EQ(run(1), run(1));
        EXPECT_NE(run(1), run(2));
    }
    // Nothing finite to weigh: the greedy answer rather than a division by zero.
    Sampler s({1.0f, 0, 0.9f, 1});
    EXPECT_EQ(s.sample(std::vector<float>{-kInf, -kInf}), 0);
    // A subnormal temperature (1 / temp is inf in float): the top tokens, on every path, with weights that are not
    // NaN: two tied at the top are each drawn (a NaN weight made the draw return the last one it did not skip).
    for (const SamplerParams &p :
         {SamplerParams{1e-44f, 0, 1.0f, 1}, SamplerParams{1e-44f, 3, 1.0f, 1}, SamplerParams{1e-44f, 0, 0.9f, 1}}) {
        Sampler tiny(p);
        std::vector<int> count(5, 0);
        for (int i = 0; i < 200; ++i)
            ++count[static_cast<size_t>(tiny.sample(std::vector<float>{0.5f, 2.0f, 1.0f, 1.999f, 2.0f}))];
        EXPECT_EQ(count[1] + count[4], 200) << "top_k " << p.top_k << " top_p " << p.top_p;
        EXPECT_GT(count[1], 50) << "top_k " << p.top_k << " top_p " << p.top_p;
        EXPECT_GT(count[4], 50) << "top_k " << p.top_k << " top_p " << p.top_p;
    }
}

}  // namespace
}  // namespace sparrow
