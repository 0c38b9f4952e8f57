// Vector pieces of the indexer's top-k radix select (top_k_select.cpp), for the ISA files: plain pointers and
// integers only (this header is included by *_avx512.cpp files; see the ODR rule in kernels_avx2.cpp).
//
// Entries are the 8-byte records of ScoredIndex: a float score (finite or -inf) in the low 4 bytes and an
// int32 index (>= 0) in the high 4. A key orders entries as the indexer's ranking rule does (top_k_select.h):
//   key = (monotonic bits of score + 0.0f) << 32 | (0xFFFFFFFF - idx).
#pragma once

#include <cstdint>

namespace sparrow::indexer::avx512 {

// keys[i] = the rank key of entry i, i < n.
void rank_keys(const void *entries, int64_t n, uint64_t *keys);

// Keeps, in order and in place, the keys k with ((k >> shift) & digit_mask) == digit; returns how many.
int64_t keep_digit(uint64_t *keys, int64_t n, int shift, uint64_t digit_mask, uint64_t digit);

// Copies to out, in order, the keys k of keys[0, n) with lo <= k <= hi; returns how many, and the number of keys
// above hi in *n_above.
int64_t keep_range(const uint64_t *keys, int64_t n, uint64_t lo, uint64_t hi, uint64_t *out, int64_t *n_above);

// Writes the n entries of `from` (whose keys are keys[0, n)) to `to`: those above kth from to[0] on, the one equal
// to kth at to[k - 1], those below from to[k] on, each group in input order. Returns the count above kth.
int64_t partition_by_key(const void *from, const uint64_t *keys, int64_t n, int64_t k, uint64_t kth, void *to);

// Counts the entries of entries[0, n) whose score is >= floor.
int64_t count_at_least(const void *entries, int64_t n, float floor);

// Copies to out, in order, the entries of entries[0, n) whose score is >= floor; returns how many. out may be
// entries itself or lie below it (each block of eight is loaded before anything is written over it).
int64_t keep_at_least(const void *entries, int64_t n, float floor, void *out);

}  // namespace sparrow::indexer::avx512
