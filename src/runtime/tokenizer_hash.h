// Flat open-addressing tables for the tokenizers' hot lookups: token text -> id (every candidate merge of the
// SentencePiece tokenizer asks it) and (left id, right id) -> merge (byte-level BPE). std::unordered_map puts
// each entry in its own heap node; these keep everything in one array (linear probing, load <= 1/2), which
// makes lookups and loading several times faster and leaves nothing to free one by one.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace sparrow {

inline uint64_t hash_bytes(std::string_view s) {
    // FNV-1a, then a final mix so that the low bits (the slot index) depend on every byte.
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

inline size_t table_capacity(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

// Maps token texts to ids. Texts are not stored: `text_of(id)` gives them back (from the vocabulary arena).
class TokenTextIndex {
  public:
    void reserve(size_t n) { slots_.assign(table_capacity(n), Slot{}); }

    // Adds id under `text` unless the text is already present (the first id wins). reserve() first.
    template <typename TextOf>
    void insert(std::string_view text, int32_t id, const TextOf &text_of) {
        const uint64_t h = hash_bytes(text);
        for (size_t i = h & mask();; i = (i + 1) & mask()) {
            Slot &s = slots_[i];
            if (s.id_plus_1 == 0) {
                s = {uint32_t(id) + 1, uint32_t(h >> 32)};
                return;
            }
            if (s.hash_hi == uint32_t(h >> 32) && text_of(int32_t(s.id_plus_1 - 1)) == text) return;
        }
    }

    template <typename TextOf>
    int32_t find(std::string_view text, const TextOf &text_of) const {
        if (slots_.empty()) return -1;
        const uint64_t h = hash_bytes(text);
        for (size_t i = h & mask();; i = (i + 1) & mask()) {
            const Slot &s = slots_[i];
            if (s.id_plus_1 == 0) return -1;
            if (s.hash_hi == uint32_t(h >> 32) && text_of(int32_t(s.id_plus_1 - 1)) == text) {
                return int32_t(s.id_plus_1 - 1);
            }
        }
    }

  private:
    struct Slot {
        uint32_t id_plus_1 = 0;  // 0: empty
        uint32_t hash_hi = 0;    // upper hash bits: most mismatches are rejected without touching the text
    };
    std::vector<Slot> slots_;
    size_t mask() const { return slots_.size() - 1; }
};

// Maps a pair of token ids to the merge of byte-level BPE: its rank and the token it forms.
class MergeTable {
  public:
    struct Merge {
        int32_t rank;
        int32_t result;  // token id of the concatenation, -1 when it is not a token
    };

    void reserve(size_t n) { slots_.assign(table_capacity(n), Slot{}); }
    size_t size() const { return size_; }

    // Adds a merge unless the pair is present (the first, lower rank wins). reserve() first.
    void insert(int32_t left, int32_t right, Merge m) {
        const uint64_t key = make_key(left, right);
        for (size_t i = slot_of(key);; i = (i + 1) & mask()) {
            Slot &s = slots_[i];
            if (s.key == k_empty) {
                s = {key, m};
                ++size_;
                return;
            }
            if (s.key == key) return;
        }
    }

    const Merge *find(int32_t left, int32_t right) const {
        if (slots_.empty()) return nullptr;
        const uint64_t key = make_key(left, right);
        for (size_t i = slot_of(key);; i = (i + 1) & mask()) {
            const Slot &s = slots_[i];
            if (s.key == key) return &s.merge;
            if (s.key == k_empty) return nullptr;
        }
    }

  private:
    static constexpr uint64_t k_empty = ~uint64_t(0);  // ids are < 2^31, so no pair has this key
    struct Slot {
        uint64_t key = k_empty;
        Merge merge{};
    };
    std::vector<Slot> slots_;
    size_t size_ = 0;

    static uint64_t make_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }
    size_t mask() const { return slots_.size() - 1; }
    size_t slot_of(uint64_t key) const { return size_t((key * 0x9e3779b97f4a7c15ull) >> 20) & mask(); }
};

}  // namespace sparrow
