#include "runtime/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/error.h"

// The vocabulary-wide loops (the largest logit, the exponentials, the scans) are compiled for AVX-512, AVX2 and the
// baseline, and the loader picks the widest the CPU has (GCC's function multi-versioning). Their arithmetic is the
// same float and double operations in the same order on every version (this file is compiled with
// -ffp-contract=off: no FMA), so the weights and draws are the same bits whichever version runs. Measured
// (sparrow_sampler_bench, 129K vocabulary): greedy 106 -> 22 us a token, temperature 1 355 -> 92, top-k 40 with
// top-p 122 -> 38.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SPARROW_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPARROW_VECTOR_CLONES
#endif

namespace sparrow {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A logit as the sampler ranks it: NaN counts as -inf (never chosen while anything else can be).
inline float rank_value(float v) { return v == v ? v : kNegInf; }

// Elements per block where a scan over the vocabulary looks at whole blocks first (argmax, top-k's heap filter,
// Sampler::draw).
constexpr size_t kScanBlock = 64;

// The start of the first whole block of x[0, n) that holds v, or of the elements after the whole blocks.
SPARROW_VECTOR_CLONES size_t first_block_holding(const float *x, size_t n, float v) {
    size_t i = 0;
    for (; i + kScanBlock <= n; i += kScanBlock) {
        int hits = 0;  // counted, not or-ed as bools: the count vectorises at the full width
        for (size_t j = 0; j < kScanBlock; ++j) hits += x[i + j] == v ? 1 : 0;
        if (hits > 0) break;
    }
    return i;
}

// The start of the first whole block of x[from, n) (blocks of kScanBlock from `from`) with an element above v,
// or of the elements after the whole blocks. NaN is above nothing.
SPARROW_VECTOR_CLONES size_t first_block_above(const float *x, size_t n, size_t from, float v) {
    size_t i = from;
    for (; i + kScanBlock <= n; i += kScanBlock) {
        int hits = 0;
        for (size_t j = 0; j < kScanBlock; ++j) hits += x[i + j] > v ? 1 : 0;
        if (hits > 0) break;
    }
    return i;
}

// The start of the first whole block of w[0, n) whose end's running sum (in double, cum plus the block sums so far)
// passes u, or of the elements after the whole blocks; cum becomes the sum before that block. A block's sum is
// taken over four running totals (vectorised; one total would wait on each add).
SPARROW_VECTOR_CLONES size_t block_passing(const float *w, size_t n, double u, double &cum) {
    size_t i = 0;
    for (; i + kScanBlock <= n; i += kScanBlock) {
        double sums[4] = {0.0, 0.0, 0.0, 0.0};
        for (size_t j = 0; j < kScanBlock; j += 4) {
            for (size_t l = 0; l < 4; ++l) sums[l] += w[i + j + l];
        }
        const double s = (sums[0] + sums[1]) + (sums[2] + sums[3]);
        if (u < cum + s) break;
        cum += s;
    }
    return i;
}

}  // namespace

// Sixteen running maxima the compiler turns into vector max instructions (one 512-bit vector, two of 256, four of
// 128): one running best waits on each compare.
SPARROW_VECTOR_CLONES float max_logit(std::span<const float> logits) {
    constexpr size_t kLanes = 16;
    std::array<float, kLanes> lanes;
    lanes.fill(kNegInf);
    size_t i = 0;
    for (; i + kLanes <= logits.size(); i += kLanes) {
        for (size_t l = 0; l < kLanes; ++l) lanes[l] = lanes[l] < logits[i + l] ? logits[i + l] : lanes[l];
    }
    for (; i < logits.size(); ++i) lanes[0] = lanes[0] < logits[i] ? logits[i] : lanes[0];
    return *std::max_element(lanes.begin(), lanes.end());
}

namespace {

// A beats b when its logit is larger, or equal with the lower id.
using Candidate = Sampler::Candidate;
inline bool ranks_before(const Candidate &a, const Candidate &b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Up to this many candidates are kept in a heap while scanning the logits; more are selected from a copy of all.
constexpr size_t kHeapCandidates = 256;

// w[i] = exp((logits[i] - max) * inv_temp) (0 for NaN and -inf); returns the sum. The weights first, in a loop the
// compiler vectorises, then the sum in double over four running totals (a double sum would not vectorise, and in
// one total each add waits for the one before).
SPARROW_VECTOR_CLONES double weigh(std::span<const float> logits, float max, float inv_temp, float *w) {
    const size_t n = logits.size();
    for (size_t i = 0; i < n; ++i) w[i] = exp_nonpositive((rank_value(logits[i]) - max) * inv_temp);
    double sums[4] = {0.0, 0.0, 0.0, 0.0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (size_t l = 0; l < 4; ++l) sums[l] += w[i + l];
    }
    for (; i < n; ++i) sums[0] += w[i];
    return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

}  // namespace

double sum_exp(std::span<const float> logits, float max) {
    float w[256];  // one piece's weights at a time, on the stack
    double total = 0.0;
    for (size_t i = 0; i < logits.size(); i += 256)
        total += weigh(logits.subspan(i, std::min<size_t>(256, logits.size() - i)), max, 1.0f, w);
    return total;
}

int32_t argmax(std::span<const float> logits) {
    SPARROW_ASSERT(!logits.empty());
    // The largest value, then the first index holding it: two passes at memory speed, where one pass comparing
    // with the running best's value took ~4 ns an element (134 us a token at 32K, 547 at 129K). The second pass
    // tests whole blocks for the value (a loop without an exit, which the compiler vectorises: an element at a time
    // it took ~0.8 ns an element), then finds it in its block. A best of -inf (every logit NaN or -inf) is the
    // first element whatever it holds, so it needs no search.
    const float best = max_logit(logits);
    if (best == kNegInf) return 0;
    const size_t n = logits.size();
    for (size_t i = first_block_holding(logits.data(), n, best); i < n; ++i) {
        if (logits[i] == best) return static_cast<int32_t>(i);
    }
    return 0;  // not reached: best is some logit's value
}

float min_p_floor(float max, float min_p) { return max + std::log(std::min(min_p, 1.0f)); }

Sampler::Sampler(const SamplerParams &params)
    : params_(params), rng_(params.seed), mu_(2.0 * double(params.mirostat_tau)) {}

void best_logits(std::span<const float> logits, size_t n, std::vector<Sampler::Candidate> &out) {
    n = std::min(n, logits.size());
    out.clear();
    if (n == 0) return;
    if (n > kHeapCandidates) {
        for (size_t i = 0; i < logits.size(); ++i) out.push_back({rank_value(logits[i]), static_cast<int32_t>(i), 0.0});
        std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n - 1), out.end(), ranks_before);
        out.resize(n);
        std::sort(out.begin(), out.end(), ranks_before);
        return;
    }
    // A heap of the n best so far with the worst on top; logits are visited in id order, so a later logit equal to
    // the worst never beats it (its id is larger). Most logits are turned away by the worst: whole blocks of 64 at a
    // time (first_block_above, a vector loop), where one compare per logit took ~0.7 ns each.
    size_t i = 0;
    for (; i < logits.size() && out.size() < n; ++i) {
        out.push_back({rank_value(logits[i]), static_cast<int32_t>(i), 0.0});
        std::push_heap(out.begin(), out.end(), ranks_before);
    }
    float worst = out.front().logit;
    while (i < logits.size()) {
        i = first_block_above(logits.data(), logits.size(), i, worst);
        const size_t end = std::min(logits.size(), i + kScanBlock);
        for (; i < end; ++i) {
            if (!(logits[i] > worst)) continue;  // NaN too
            std::pop_heap(out.begin(), out.end(), ranks_before);
            out.back() = {logits[i], static_cast<int32_t>(i), 0.0};
            std::push_heap(out.begin(), out.end(), ranks_before);
            worst = out.front().logit;
        }
    }
    std::sort(out.begin(), out.end(), ranks_before);
}

namespace {

// Buckets of rank key below the best key: bucket b holds top - key in [b, b + 1) / kNucleusPerUnit, the last also
// everything lower (exp_nonpositive is 0 from 87.34 below the maximum on, so those masses are 0 in float).
constexpr int kNucleusBuckets = 1024;
constexpr float kNucleusPerUnit = float(kNucleusBuckets) / 88.0f;
inline int nucleus_bucket(float top, float key) {
    const float b = (top - key) * kNucleusPerUnit;  // >= 0; inf for -inf
    return b < float(kNucleusBuckets - 1) ? static_cast<int>(b) : kNucleusBuckets - 1;
}

// take_nucleus looks at buckets first from this many candidates on (typical-p's whole vocabulary, a large top-k).
constexpr size_t kBucketedNucleus = 2048;

size_t take_nucleus_select(std::span<Sampler::Candidate> c, double need);

}  // namespace

size_t Sampler::nucleus(std::span<const float> logits, float max) {
    const size_t n_vocab = logits.size();
    weights_.resize(n_vocab);
    const double total = weigh(logits, max, 1.0f, weights_.data());  // the masses at temperature 1
    const double need = params_.top_p * total;
    // Buckets of logit below the maximum, in rank order (nucleus_bucket): the mass of each, then the bucket where the
    // running mass reaches `need`. Every token of an earlier bucket is in the nucleus, and only the crossing bucket's
    // tokens need the quickselect, so the candidates are those few instead of the whole vocabulary (16 bytes each).
    buckets_.resize(n_vocab);
    for (size_t i = 0; i < n_vocab; ++i)
        buckets_[i] = static_cast<uint16_t>(nucleus_bucket(max, rank_value(logits[i])));  // NaN counts as -inf
    std::array<double, kNucleusBuckets> mass{};
    for (size_t i = 0; i < n_vocab; ++i) mass[buckets_[i]] += weights_[i];
    int cross = 0;
    double before = 0.0;  // mass of the buckets before `cross`
    while (cross < kNucleusBuckets - 1 && before + mass[static_cast<size_t>(cross)] < need)
        before += mass[static_cast<size_t>(cross++)];
    // The tokens up to the crossing bucket, the earlier buckets' (all in) moved before the crossing one's (when
    // rounding left the running mass short of `need`, cross is the last bucket and every token is a candidate).
    candidates_.clear();
    for (size_t i = 0; i < n_vocab; ++i) {
        if (buckets_[i] <= cross)
            candidates_.push_back({rank_value(logits[i]), static_cast<int32_t>(i), static_cast<double>(weights_[i])});
    }
    const auto n_in = static_cast<size_t>(
        std::partition(candidates_.begin(), candidates_.end(),
                       [&](const Candidate &c) { return buckets_[static_cast<size_t>(c.id)] < cross; }) -
        candidates_.begin());
    return n_in + take_nucleus_select(std::span<Candidate>(candidates_).subspan(n_in), need - before);
}

size_t take_nucleus(std::span<Sampler::Candidate> c, double need) {
    // Many candidates: the mass of each bucket of key, then the bucket where the running mass reaches `need`, as
    // Sampler::nucleus does over a vocabulary. Every candidate of an earlier bucket is in, and only the crossing
    // bucket's go to the quickselect (typical-p over 129K tokens: 1.7 ms a token in the quickselect alone). When
    // rounding leaves the buckets' running mass short of `need`, the quickselect takes everything.
    if (c.size() >= kBucketedNucleus) {
        float top = kNegInf;
        for (const Sampler::Candidate &x : c) top = std::max(top, x.logit);
        std::array<double, kNucleusBuckets> mass{};
        for (const Sampler::Candidate &x : c) mass[static_cast<size_t>(nucleus_bucket(top, x.logit))] += x.mass;
        int cross = 0;
        double before = 0.0;  // mass of the buckets before `cross`
        while (cross < kNucleusBuckets - 1 && before + mass[static_cast<size_t>(cross)] < need)
            before += mass[static_cast<size_t>(cross++)];
        if (std::isfinite(top) && cross < kNucleusBuckets - 1) {  // (+inf keys: the quickselect alone)
            const auto in_end = std::partition(
                c.begin(), c.end(), [&](const Sampler::Candidate &x) { return nucleus_bucket(top, x.logit) < cross; });
            const auto cross_end = std::partition(
                in_end, c.end(), [&](const Sampler::Candidate &x) { return nucleus_bucket(top, x.logit) == cross; });
            const auto n_in = static_cast<size_t>(in_end - c.begin());
            const auto n_cross = static_cast<size_t>(cross_end - in_end);
            return n_in + take_nucleus_select(c.subspan(n_in, n_cross), need - before);
        }
    }
    return take_nucleus_select(c, need);
}

namespace {

size_t take_nucleus_select(std::span<Sampler::Candidate> c, double need) {
    // A quickselect on the rank order that keeps the part holding the cut: each round partitions the live range
    // around a pivot and either shrinks to the better side (when it holds the rest of the mass still wanted) or takes
    // that side whole and goes on past the pivot. Expected O(n), against sorting the nucleus, which a flat
    // distribution makes thousands of tokens long. `need` becomes the mass still wanted past c[0, lo).
    size_t lo = 0, hi = c.size();
    while (hi - lo > 32) {
        // Median of three by rank as the pivot, moved to the end of the range.
        Candidate *a = &c[lo], *b = &c[lo + (hi - lo) / 2], *e = &c[hi - 1];
        if (ranks_before(*b, *a)) std::swap(a, b);
        if (ranks_before(*e, *b)) std::swap(b, e);
        if (ranks_before(*b, *a)) std::swap(a, b);
        std::swap(*b, c[hi - 1]);
        const Candidate pivot = c[hi - 1];
        const auto mid =
            std::partition(c.begin() + static_cast<std::ptrdiff_t>(lo), c.begin() + static_cast<std::ptrdiff_t>(hi - 1),
                           [&](const Candidate &x) { return ranks_before(x, pivot); });
        const auto m = static_cast<size_t>(mid - c.begin());
        std::swap(c[m], c[hi - 1]);  // the pivot between the two sides
        double upper = 0.0;
        for (size_t i = lo; i < m; ++i) upper += c[i].mass;
        if (upper >= need) {
            hi = m;
        } else if (upper + pivot.mass >= need) {
            return m + 1;
        } else {
            need -= upper + pivot.mass;
            lo = m + 1;
        }
    }
    // A short range: in rank order, up to the candidate whose mass reaches what is still wanted.
    std::sort(c.begin() + static_cast<std::ptrdiff_t>(lo), c.begin() + static_cast<std::ptrdiff_t>(hi), ranks_before);
    double cum = 0.0;
    for (size_t i = lo; i < hi; ++i) {
        cum += c[i].mass;
        if (cum >= need) return i + 1;
    }
    return c.size();  // rounding left the sum just short: keep everything
}

}  // namespace

int32_t Sampler::sample(std::span<const float> logits) {
    SPARROW_ASSERT(!logits.empty());
    if (params_.temp <= 0.0f) return argmax(logits);
    const float max = max_logit(logits);
    if (max == kNegInf) return argmax(logits);  // no finite logit: nothing to weigh
    const size_t n_vocab = logits.size();
    const bool cut_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n_vocab;
    const bool cut_p = params_.top_p < 1.0f;
    const bool cut_m = params_.min_p > 0.0f;
    const float min_logit = cut_m ? min_p_floor(max, params_.min_p) : kNegInf;  // the smallest logit min-p keeps
    // Capped: a subnormal temperature (a request's 1e-44) would make it inf in float, and 0 * inf a NaN weight for
    // the top token; at 1e30 every other token's weight is 0 already.
    const auto inv_temp = static_cast<float>(std::min(1.0 / double(params_.temp), 1e30));
    if (params_.mirostat == 1 || params_.mirostat == 2) return sample_mirostat(logits, max, inv_temp);
    if (params_.typical_p < 1.0f || params_.xtc_probability > 0.0f || params_.top_n_sigma > 0.0f ||
        params_.dynatemp_range > 0.0f)
        return sample_staged(logits, max);

    if (!cut_k && !cut_p) {
        // The whole distribution: no ranking needed, one pass of weights (min-p zeroes those below its floor) and a
        // draw.
        weights_.resize(n_vocab);
        double total = weigh(logits, max, inv_temp, weights_.data());
        if (cut_m) {
            total = 0.0;
            for (size_t i = 0; i < n_vocab; ++i) {
                if (!(logits[i] >= min_logit)) weights_[i] = 0.0f;  // NaN too
                total += weights_[i];
            }
        }
        return static_cast<int32_t>(draw(total));
    }

    size_t n = 0;
    if (cut_k) {
        // The top_k best in rank order, then the nucleus of the distribution renormalised over them: the smallest
        // prefix whose probability at temperature 1 reaches top_p.
        n = static_cast<size_t>(params_.top_k);
        best_logits(logits, n, candidates_);
        if (cut_p) {
            double mass = 0.0;
            for (Candidate &c : candidates_) {
                c.mass = exp_nonpositive(c.logit - max);
                mass += c.mass;
            }
            n = take_nucleus(candidates_, params_.top_p * mass);
        }
    } else {
        n = nucleus(logits, max);
    }
    SPARROW_ASSERT(n <= candidates_.size());
    if (cut_m) {  // min-p within the cuts: the best-ranked token (at the maximum) always stays
        n = static_cast<size_t>(std::partition(candidates_.begin(),
                                               candidates_.begin() + static_cast<std::ptrdiff_t>(n),
                                               [min_logit](const Candidate &c) { return c.logit >= min_logit; }) -
                                candidates_.begin());
    }
    // candidates_[0, n) in no particular order (take_nucleus and the min-p cut reorder): the draw does not need one.
    return draw_candidate(0, n, max, inv_temp);
}

size_t Sampler::draw_index(size_t first, size_t n, float reference, float inv_temp, double &total) {
    weights_.resize(n - first);
    total = 0.0;
    for (size_t i = first; i < n; ++i) {
        weights_[i - first] = exp_nonpositive((candidates_[i].logit - reference) * inv_temp);
        total += weights_[i - first];
    }
    return first + draw(total);
}

int32_t Sampler::draw_candidate(size_t first, size_t n, float reference, float inv_temp) {
    double total = 0.0;
    return candidates_[draw_index(first, n, reference, inv_temp, total)].id;
}

size_t Sampler::draw(double total) {
    // The first weight whose running sum passes a uniform point of [0, total); rounding can leave the point past the
    // last sum, and then the last weight that is not zero wins. Whole blocks the point lies beyond are skipped by
    // their sums (vectorised), and the running sum goes weight by weight only from the block that holds the point:
    // weight by weight all along, each add waited on the one before (~80 us a token at 129K over the full
    // distribution). A block's sum rounds differently from its weights' running sum, so a point within rounding of
    // a block's end may fall to the first weight of the next block instead of the last of this one.
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * total;
    const float *w = weights_.data();
    const size_t n = weights_.size();
    double cum = 0.0;
    for (size_t i = block_passing(w, n, u, cum); i < n; ++i) {
        if (w[i] <= 0.0f) continue;
        cum += w[i];
        if (u < cum) return i;
    }
    for (size_t j = n; j-- > 0;) {  // past the end: the last weight that is not zero
        if (w[j] > 0.0f) return j;
    }
    return 0;
}

int32_t Sampler::sample_staged(std::span<const float> logits, float max) {
    // Top-n-sigma's floor first: max minus top_n_sigma population deviations of the whole vocabulary's finite
    // logits (-inf: no cut). A floor commutes with top-k's selection, so it is applied to top-k's tokens, or while
    // the vocabulary's candidates are gathered.
    float sigma_floor = kNegInf;
    if (params_.top_n_sigma > 0.0f) {
        double sum = 0.0, sum_sq = 0.0;
        size_t count = 0;
        for (const float l : logits) {
            if (!std::isfinite(l)) continue;
            sum += l;
            ++count;
        }
        const double mean = count > 0 ? sum / double(count) : 0.0;
        for (const float l : logits) {
            if (std::isfinite(l)) sum_sq += (double(l) - mean) * (double(l) - mean);
        }
        const double sigma = count > 0 ? std::sqrt(sum_sq / double(count)) : 0.0;
        sigma_floor = static_cast<float>(double(max) - double(params_.top_n_sigma) * sigma);
    }
    // The candidates with their masses at temperature 1 relative to max: top-k's, else the whole vocabulary (above
    // the floor). Every cut below works on candidates_[0, n) in no particular order: selections and partitions, no
    // sort of the vocabulary (a sort of 129K tokens took 27 ms).
    const size_t n_vocab = logits.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n_vocab) {
        best_logits(logits, static_cast<size_t>(params_.top_k), candidates_);
        if (sigma_floor > kNegInf) {
            candidates_.erase(std::partition(candidates_.begin(), candidates_.end(),
                                             [sigma_floor](const Candidate &c) { return c.logit >= sigma_floor; }),
                              candidates_.end());
        }
        for (Candidate &c : candidates_) c.mass = exp_nonpositive(c.logit - max);
    } else if (sigma_floor > kNegInf) {
        candidates_.clear();
        for (size_t i = 0; i < n_vocab; ++i) {
            const float l = rank_value(logits[i]);
            if (l >= sigma_floor) candidates_.push_back({l, static_cast<int32_t>(i), exp_nonpositive(l - max)});
        }
    } else {
        weights_.resize(n_vocab);
        weigh(logits, max, 1.0f, weights_.data());
        candidates_.clear();
        for (size_t i = 0; i < n_vocab; ++i)
            candidates_.push_back({rank_value(logits[i]), static_cast<int32_t>(i), static_cast<double>(weights_[i])});
    }
    size_t n = candidates_.size();
    const auto kept = [&] { return std::span<Candidate>(candidates_).first(n); };
    const auto mass_of_kept = [&] {
        double total = 0.0;
        for (const Candidate &c : kept()) total += c.mass;
        return total;
    };
    if (params_.typical_p < 1.0f && n > 1) {
        // With p = mass / Z, the surprisal -ln p = ln Z - (logit - max), so its distance from the entropy H is
        // |logit - center| with center = max + ln Z - H: the typical set is the tokens nearest the center, fewest
        // first, until their probability reaches typical_p. A nucleus selection on that key, held in the logit
        // field meanwhile.
        const double z = mass_of_kept();
        double weighted = 0.0;  // sum of mass * (logit - max)
        for (const Candidate &c : kept()) {
            if (c.mass > 0.0) weighted += c.mass * (double(c.logit) - max);
        }
        const double center = max + weighted / z;  // max + ln Z - H, where H = ln Z - weighted / Z
        for (Candidate &c : kept()) {
            c.logit = c.mass > 0.0 ? static_cast<float>(-std::abs(double(c.logit) - center)) : kNegInf;
        }
        n = take_nucleus(kept(), params_.typical_p * z);
        for (Candidate &c : kept()) c.logit = rank_value(logits[static_cast<size_t>(c.id)]);
    }
    if (params_.top_p < 1.0f && n > 1) n = take_nucleus(kept(), params_.top_p * mass_of_kept());
    if (params_.min_p > 0.0f) {  // at least min_p times as likely as the best token left
        float best = kNegInf;
        for (const Candidate &c : kept()) best = std::max(best, c.logit);
        const float min_floor = min_p_floor(best, params_.min_p);
        n = static_cast<size_t>(std::partition(kept().begin(), kept().end(),
                                               [min_floor](const Candidate &c) { return c.logit >= min_floor; }) -
                                kept().begin());
    }
    size_t first = 0;
    if (params_.xtc_probability > 0.0f && params_.xtc_threshold <= 0.5f && n > 1) {
        // One uniform draw decides (taken whether or not it then applies, so that the stream of draws does not
        // depend on the distribution); then every token at or above the threshold goes but the least likely of them.
        const double chance = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
        if (chance < params_.xtc_probability) {
            const double need = params_.xtc_threshold * mass_of_kept();
            const auto above = static_cast<size_t>(
                std::partition(kept().begin(), kept().end(), [need](const Candidate &c) { return c.mass >= need; }) -
                kept().begin());
            if (above > 1) {
                std::sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(above), ranks_before);
                first = above - 1;
            }
        }
    }
    float best = kNegInf;  // the tempered weights relative to the best token left (all of them may be far below max)
    for (size_t i = first; i < n; ++i) best = std::max(best, candidates_[i].logit);
    double temp = params_.temp;
    if (params_.dynatemp_range > 0.0f && n - first > 1) {
        // The kept tokens' entropy at temperature 1 over its maximum, ln(count), sets the temperature in the range.
        double z = 0.0, weighted = 0.0;  // sum of mass and of mass * (logit - best), masses relative to best
        for (size_t i = first; i < n; ++i) {
            const double m = exp_nonpositive(candidates_[i].logit - best);
            z += m;
            if (m > 0.0) weighted += m * (double(candidates_[i].logit) - best);
        }
        const double entropy = std::log(z) - weighted / z, normalised = entropy / std::log(double(n - first));
        const double lo = std::max(0.0, temp - params_.dynatemp_range), hi = temp + params_.dynatemp_range;
        temp = lo + (hi - lo) * std::pow(std::clamp(normalised, 0.0, 1.0), double(params_.dynatemp_exponent));
    }
    // Capped: a temperature at or near 0 draws the best token.
    return draw_candidate(first, n, best, static_cast<float>(std::min(1.0 / temp, 1e30)));
}

int32_t Sampler::sample_mirostat(std::span<const float> logits, float max, float inv_temp) {
    const size_t n_vocab = logits.size();
    if (params_.mirostat == 2) {
        // -log2 p <= mu, with p = exp((logit - max) * inv_temp) / z: a floor on the tempered logit, no ranking.
        weights_.resize(n_vocab);
        const double z = weigh(logits, max, inv_temp, weights_.data());
        const double floor = std::log(z) - mu_ * std::numbers::ln2;
        candidates_.clear();
        for (size_t i = 0; i < n_vocab; ++i) {
            const float l = rank_value(logits[i]);
            if ((double(l) - max) * inv_temp >= floor) candidates_.push_back({l, static_cast<int32_t>(i), 0.0});
        }
        if (candidates_.empty()) best_logits(logits, 1, candidates_);  // mu below every surprise: the best token
    } else {
        // Zipf's exponent s from the best m = 100 tokens' successive probability ratios (least squares through 0 of
        // ln(p_i / p_i+1) on ln((i + 2) / (i + 1))), then k = (e 2^mu / (1 - N^-e))^(1 / s) with e = s - 1.
        constexpr size_t kZipfTokens = 100;
        best_logits(logits, kZipfTokens, candidates_);
        double sum_tb = 0.0, sum_tt = 0.0;
        for (size_t i = 0; i + 1 < candidates_.size() && std::isfinite(candidates_[i + 1].logit); ++i) {
            const double t = std::log(double(i + 2) / double(i + 1));
            sum_tb += t * (double(candidates_[i].logit) - candidates_[i + 1].logit) * inv_temp;
            sum_tt += t * t;
        }
        const double s = sum_tt > 0.0 ? sum_tb / sum_tt : 0.0, e = s - 1.0;
        const double k = std::pow(e * std::exp2(mu_) / (1.0 - std::pow(double(n_vocab), -e)), 1.0 / s);
        // At least one token (as llama.cpp's sampler API); a degenerate estimate (s = 0 or e = 0: a NaN) keeps all.
        const size_t top = std::isnan(k) ? n_vocab : k < 1.0 ? 1 : static_cast<size_t>(std::min(k, double(n_vocab)));
        best_logits(logits, top, candidates_);
    }
    // The draw at the temperature over the kept tokens, and the surprise of the drawn one among them.
    float best = kNegInf;
    for (const Candidate &c : candidates_) best = std::max(best, c.logit);
    double total = 0.0;
    const size_t at = draw_index(0, candidates_.size(), best, inv_temp, total);
    const double surprise = -std::log2(double(weights_[at]) / total);
    mu_ -= double(params_.mirostat_eta) * (surprise - double(params_.mirostat_tau));
    return candidates_[at].id;
}

}  // namespace sparrow
