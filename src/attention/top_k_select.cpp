#include "attention/top_k_select.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <optional>
#include <utility>

#include "attention/top_k_kernels.h"
#include "core/error.h"
#include "core/vectors.h"
#include "kernels/cpu/dispatch.h"

namespace sparrow::indexer {

namespace {

// top_k_kernels.h reads entries as 8-byte records: the score's bits low, the index high.
static_assert(sizeof(ScoredIndex) == 8 && offsetof(ScoredIndex, score) == 0 && offsetof(ScoredIndex, idx) == 4);

// The 64-bit key: larger means ranked earlier.
inline uint64_t rank_key(const ScoredIndex &e) {
    const float s = e.score + 0.0f;  // -0 + 0 = +0: equal scores get equal bits
    uint32_t u;
    std::memcpy(&u, &s, sizeof u);
    // Negative floats reversed below the positive ones (all bits flipped), positive ones above them (sign bit set):
    // a mask, not a branch, since a query's scores take both signs.
    u ^= (0u - (u >> 31)) | 0x80000000u;
    return (uint64_t(u) << 32) | uint64_t(0xFFFFFFFFu - static_cast<uint32_t>(e.idx));
}

constexpr int kDigitBits = 11;
constexpr uint64_t kDigitMask = (uint64_t(1) << kDigitBits) - 1;

// Below this many keys the remainder goes to nth_element: another radix pass would clear and scan 2^kDigitBits
// buckets for a handful of keys. The value is a guess, not tuned.
constexpr int64_t kSmallSelect = 48;

// The k-th largest of the unique keys keys[0, n) (1 <= k <= n); reorders keys. avx512: the passes' compaction
// with AVX-512 (the same keys kept, in the same order).
uint64_t kth_largest(uint64_t *keys, int64_t n, int64_t k, bool avx512) {
    // Bits above the highest one where the keys differ are the same in all of them: the first digit starts
    // there. Scores of one query mostly share their sign and exponent, so this skips a pass that would keep
    // nearly every key.
    uint64_t all_and = ~uint64_t(0), all_or = 0;
    for (int64_t i = 0; i < n; ++i) {
        all_and &= keys[i];
        all_or |= keys[i];
    }
    const int top = all_and == all_or ? 0 : 64 - __builtin_clzll(all_and ^ all_or);  // bits that still matter
    // Four histograms, summed after the pass: a query's scores crowd into a few buckets, and one histogram's
    // increments of the same bucket wait on each other's stores. (A pass over fewer keys than buckets uses one:
    // clearing and summing the other three would cost more.)
    constexpr size_t kBuckets = size_t(1) << kDigitBits;
    std::array<uint32_t, 4 * kBuckets> parts;
    uint32_t *hist = parts.data();
    for (int shift = top - kDigitBits;; shift -= kDigitBits) {
        if (n <= kSmallSelect) {
            std::nth_element(keys, keys + (k - 1), keys + n, [](uint64_t a, uint64_t b) { return a > b; });
            return keys[k - 1];
        }
        const int s = std::max(shift, 0);
        const bool four = n >= static_cast<int64_t>(kBuckets);
        std::fill(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(four ? 4 * kBuckets : kBuckets), 0u);
        int64_t i = 0;
        for (; four && i + 4 <= n; i += 4) {
            ++hist[(keys[i] >> s) & kDigitMask];
            ++hist[kBuckets + ((keys[i + 1] >> s) & kDigitMask)];
            ++hist[2 * kBuckets + ((keys[i + 2] >> s) & kDigitMask)];
            ++hist[3 * kBuckets + ((keys[i + 3] >> s) & kDigitMask)];
        }
        for (; i < n; ++i) ++hist[(keys[i] >> s) & kDigitMask];
        for (size_t b = 0; four && b < kBuckets; ++b)
            hist[b] += hist[kBuckets + b] + hist[2 * kBuckets + b] + hist[3 * kBuckets + b];
        // The digit, from the top, whose bucket holds the k-th key; k becomes its rank inside the bucket.
        uint64_t digit = kDigitMask;
        for (;; --digit) {
            if (hist[digit] >= k) break;
            k -= hist[digit];
        }
        if (avx512) {
            n = avx512::keep_digit(keys, n, s, kDigitMask, digit);
        } else {
            int64_t m = 0;
            for (int64_t j = 0; j < n; ++j) {
                if (((keys[j] >> s) & kDigitMask) == digit) keys[m++] = keys[j];
            }
            n = m;
        }
        if (n == 1 || s == 0) {
            SPARROW_ASSERT(n == 1 && k == 1);  // unique keys: the last digit leaves one
            return keys[0];
        }
    }
}

// Copies to out, in order, the keys of keys[0, n) within [lo, hi]; returns how many, and the count above hi in
// *n_above (avx512::keep_range without vectors, and without branches on the keys).
int64_t keep_range_scalar(const uint64_t *keys, int64_t n, uint64_t lo, uint64_t hi, uint64_t *out, int64_t *n_above) {
    int64_t m = 0, above = 0;
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t key = keys[i];
        above += key > hi;
        out[m] = key;  // kept only when inside: the next key overwrites it otherwise
        m += key >= lo && key <= hi;
    }
    *n_above = above;
    return m;
}

// Both sampled paths (sampled_kth, sampled_floor) take kSample entries at i * n / kSample. The k-th best of n sits
// near rank k * kSample / n of the sample; `bracket_ranks` widens that by about four standard deviations of the
// sample's count above the k-th (+ 8), clamped to the sample: {higher rank bound, lower rank bound}.
constexpr int64_t kSample = 512;
std::pair<int64_t, int64_t> bracket_ranks(int64_t n, int64_t k) {
    const double p = double(k) / double(n);
    const auto spread = static_cast<int64_t>(4.0 * std::sqrt(double(kSample) * p * (1.0 - p))) + 8;
    const int64_t rank = k * kSample / n;
    return {std::max<int64_t>(0, rank - spread), std::min(kSample - 1, rank + spread)};
}

// The k-th largest of the unique keys keys[0, n) found from a sample (large n): the sample's keys around rank
// k * S / n bracket it with high probability, one pass (vectors with AVX-512) copies the keys inside the bracket
// to `work` and counts those above it, and the radix select runs on the bracket alone. Returns false, having
// decided nothing, when the k-th key falls outside the bracket (the caller then selects over all n).
bool sampled_kth(const uint64_t *keys, int64_t n, int64_t k, uint64_t *work, uint64_t &kth, bool avx512) {
    if (n < 8 * kSample) return false;
    std::array<uint64_t, kSample> sample;
    for (int64_t i = 0; i < kSample; ++i) sample[static_cast<size_t>(i)] = keys[i * n / kSample];
    // The bracket's ranks in the sample (0 = largest).
    const auto [hi_rank, lo_rank] = bracket_ranks(n, k);
    const auto desc = [](uint64_t a, uint64_t b) { return a > b; };
    std::nth_element(sample.begin(), sample.begin() + hi_rank, sample.end(), desc);
    const uint64_t hi = sample[static_cast<size_t>(hi_rank)];
    std::nth_element(sample.begin() + hi_rank, sample.begin() + lo_rank, sample.end(), desc);
    const uint64_t lo = sample[static_cast<size_t>(lo_rank)];
    // hi_rank == 0: nothing above the sample's largest is known to be outside; take everything above lo.
    const uint64_t top = hi_rank == 0 ? ~uint64_t(0) : hi;
    int64_t n_above = 0;
    const int64_t n_in = avx512 ? avx512::keep_range(keys, n, lo, top, work, &n_above)
                                : keep_range_scalar(keys, n, lo, top, work, &n_above);
    if (n_above >= k || n_above + n_in < k) return false;
    kth = kth_largest(work, n_in, k - n_above, avx512);
    return true;
}

// avx512::partition_by_key without vectors: each entry goes to its group's cursor, chosen by conditional moves
// (swapping in place on a comparison that goes either way mispredicts).
int64_t partition_by_key_scalar(const uint64_t *from, const uint64_t *keys, int64_t n, int64_t k, uint64_t kth,
                                ScoredIndex *to) {
    int64_t above = 0, below = k;  // the next free places of the keys above kth and below it
    for (int64_t i = 0; i < n; ++i) {
        const bool gt = keys[i] > kth, eq = keys[i] == kth;
        std::memcpy(to + (gt ? above : (eq ? k - 1 : below)), from + i, sizeof(ScoredIndex));
        above += gt;
        below += !gt && !eq;
    }
    SPARROW_ASSERT(below == n);  // unique keys: exactly one equals kth
    return above;
}

// avx512::count_at_least and keep_at_least without vectors.
int64_t count_at_least_scalar(const ScoredIndex *e, int64_t n, float floor) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) count += e[i].score >= floor;
    return count;
}
int64_t keep_at_least_scalar(const ScoredIndex *e, int64_t n, float floor, ScoredIndex *out) {
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
        const ScoredIndex x = e[i];  // read before the write below, which may land on it (out <= e)
        out[kept] = x;
        kept += x.score >= floor;
    }
    return kept;
}

// The floor gather_candidates cuts at: the sample's score at the lower end of sampled_kth's bracket around the k-th
// best of n entries, or nothing when the union is too small for a sample to pay.
std::optional<float> sampled_floor(ScoredIndex *const *parts, const int64_t *sizes, int64_t n_parts, int64_t n,
                                   int64_t k) {
    if (n < 8 * kSample || n < 4 * k) return std::nullopt;
    std::array<float, kSample> sample;
    int64_t part = 0, part_begin = 0;
    for (int64_t i = 0; i < kSample; ++i) {
        const int64_t at = i * n / kSample;  // increasing: walk the parts along
        while (at >= part_begin + sizes[part]) part_begin += sizes[part++];
        sample[static_cast<size_t>(i)] = parts[part][at - part_begin].score;
    }
    SPARROW_ASSERT(part < n_parts);
    const int64_t lo_rank = bracket_ranks(n, k).second;
    std::nth_element(sample.begin(), sample.begin() + lo_rank, sample.end(), std::greater<float>());
    return sample[static_cast<size_t>(lo_rank)];
}

}  // namespace

int64_t gather_candidates(ScoredIndex *const *parts, const int64_t *sizes, int64_t n_parts, int64_t k, ScoredIndex *dst,
                          bool avx512) {
    int64_t n = 0;
    for (int64_t p = 0; p < n_parts; ++p) n += sizes[p];
    SPARROW_ASSERT(k >= 1 && k <= n);
    std::optional<float> floor_score = sampled_floor(parts, sizes, n_parts, n, k);
    if (floor_score) {
        int64_t reach = 0;
        for (int64_t p = 0; p < n_parts; ++p)
            reach += avx512 ? avx512::count_at_least(parts[p], sizes[p], *floor_score)
                            : count_at_least_scalar(parts[p], sizes[p], *floor_score);
        if (reach < k) floor_score.reset();  // the sample misled: keep everything
    }
    int64_t m = 0;
    for (int64_t p = 0; p < n_parts; ++p) {
        if (!floor_score) {
            if (parts[p] != dst + m)
                std::memmove(dst + m, parts[p], static_cast<size_t>(sizes[p]) * sizeof(ScoredIndex));
            m += sizes[p];
        } else {
            m += avx512 ? avx512::keep_at_least(parts[p], sizes[p], *floor_score, dst + m)
                        : keep_at_least_scalar(parts[p], sizes[p], *floor_score, dst + m);
        }
    }
    return m;
}

void select_best(ScoredIndex *e, int64_t n, int64_t k, std::vector<uint64_t> &scratch) {
    select_best(e, n, k, scratch, cpu::kernels().isa == cpu::Isa::avx512);
}

void select_best(ScoredIndex *e, int64_t n, int64_t k, std::vector<uint64_t> &scratch, bool avx512) {
    SPARROW_ASSERT(k >= 1 && k <= n);
    if (k == n) {
        // Still put the k-th best last among the first k.
        int64_t worst = 0;
        for (int64_t i = 1; i < n; ++i) worst = ranks_before(e[worst], e[i]) ? i : worst;
        std::swap(e[worst], e[n - 1]);
        return;
    }
    // Out of place: the keys, a copy the radix passes reorder, and the entries as they came. Without AVX-512 the
    // same steps run as scalar loops (AVX2 and scalar levels): 16384 -> 2320 on the Zen 5 VM took 44 us with the
    // radix select over all keys and a partition by swaps, 39 with the sample and the partition below; a fast
    // decode call's merge at 16K in the model (SPARROW_ISA=avx2, two alternating pairs) 92 / 80 -> 74 / 73 ms over
    // the run's calls.
    grow_to(scratch, 3 * n);
    uint64_t *keys = scratch.data(), *work = keys + n, *entries = work + n;
    if (avx512) {
        avx512::rank_keys(e, n, keys);
    } else {
        for (int64_t i = 0; i < n; ++i) keys[i] = rank_key(e[i]);
    }
    std::memcpy(entries, e, static_cast<size_t>(n) * sizeof(ScoredIndex));
    uint64_t kth = 0;
    if (!sampled_kth(keys, n, k, work, kth, avx512)) {
        // A copy for the radix passes to reorder. (rank_keys storing each key twice instead ran 20-30% slower:
        // 50-61 against 65-73 us at 16384, five alternating pairs.)
        std::memcpy(work, keys, static_cast<size_t>(n) * sizeof(uint64_t));
        kth = kth_largest(work, n, k, avx512);
    }
    const int64_t above = avx512 ? avx512::partition_by_key(entries, keys, n, k, kth, e)
                                 : partition_by_key_scalar(entries, keys, n, k, kth, e);
    SPARROW_ASSERT(above == k - 1);
}

void indices_in_order(const ScoredIndex *e, int64_t n, int64_t bound, int32_t *out, std::vector<uint64_t> &scratch) {
    const size_t words = static_cast<size_t>((bound + 63) / 64);
    if (scratch.size() < words) scratch.resize(words);
    uint64_t *bits = scratch.data();
    std::fill(bits, bits + words, uint64_t(0));
    for (int64_t i = 0; i < n; ++i) {
        const auto v = static_cast<uint64_t>(e[i].idx);
        SPARROW_ASSERT(e[i].idx >= 0 && e[i].idx < bound);
        bits[v / 64] |= uint64_t(1) << (v % 64);
    }
    int64_t o = 0;
    for (size_t w = 0; w < words; ++w) {
        for (uint64_t b = bits[w]; b != 0; b &= b - 1) out[o++] = static_cast<int32_t>(w * 64 + __builtin_ctzll(b));
    }
    SPARROW_ASSERT(o == n);  // indices were unique
}

}  // namespace sparrow::indexer
