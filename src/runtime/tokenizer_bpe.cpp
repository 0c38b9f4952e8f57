// Byte-level BPE ("gpt2" vocabularies), as in GPT-2 and its descendants:
//  1. the pre-tokenizer (tokenizer_pre.h) cuts the text into words;
//  2. a word starts as one symbol per byte (token texts spell bytes with the GPT-2 byte -> code point map);
//  3. repeatedly, the adjacent pair with the lowest merge rank (tokenizer.ggml.merges is ordered by priority;
//     ties: the leftmost) is merged -- a priority queue of candidate pairs, O(m log m) per word of m bytes;
//  4. each final symbol is a token (a symbol that is not one falls back to its byte tokens).
// With Llama 3's pre-tokenizer a word that is itself a token is used whole, without merging.
#include <algorithm>

#include "core/error.h"
#include "gguf/gguf.h"
#include "runtime/tokenizer_impl.h"
#include "runtime/unicode.h"

namespace sparrow {

namespace {

constexpr const char *k_key_merges = "tokenizer.ggml.merges";

struct Symbol {
    int32_t id;           // token of the symbol's bytes, -1 if they are not a token
    int32_t prev, next;   // neighbours (-1: none)
    uint32_t start, len;  // bytes of the word; len 0 once merged into the left neighbour
};

struct Candidate {
    int32_t rank;
    int32_t left, right;  // symbols
    int32_t result;       // token of the merge
    uint32_t len;         // bytes of the merge when proposed: stale if the symbols have changed since
};

// Heap order for std::push_heap / pop_heap (which pop the largest): the lowest rank, then the leftmost pair.
bool later(const Candidate &a, const Candidate &b) { return a.rank > b.rank || (a.rank == b.rank && a.left > b.left); }

}  // namespace

void Tokenizer::Impl::load_merges(const gguf::File &file) {
    const gguf::Value *v = file.find(k_key_merges);
    if (!v) throw_error("%s is missing (BPE vocabularies need their merges)", k_key_merges);
    const gguf::Array &arr = v->as_array(k_key_merges);
    if (arr.type != gguf::ValueType::STRING) {
        throw_error("%s must be an array of strings, not of %s", k_key_merges, gguf::value_type_name(arr.type));
    }
    if (arr.items.size() > size_t(INT32_MAX)) throw_error("%s has too many entries", k_key_merges);
    merges.reserve(arr.items.size());
    const std::string key = k_key_merges;
    std::string joined;
    for (size_t rank = 0; rank < arr.items.size(); ++rank) {
        const std::string &m = arr.items[rank].as_string(key);
        // "left right"; searching from 1 lets a left part start with a space
        const size_t sep = m.find(' ', 1);
        if (sep == std::string::npos) {
            throw_error("%s[%zu] = '%s' is not two tokens separated by a space", k_key_merges, rank, m.c_str());
        }
        const std::string_view left = std::string_view(m).substr(0, sep), right = std::string_view(m).substr(sep + 1);
        const int32_t l = find(left), r = find(right);
        if (l < 0 || r < 0) {
            throw_error("%s[%zu] = '%s' refers to a token that is not in the vocabulary ('%.*s')", k_key_merges, rank,
                        m.c_str(), int(l < 0 ? left.size() : right.size()), (l < 0 ? left : right).data());
        }
        joined.assign(left);
        joined.append(right);
        // The first occurrence of a pair keeps its (lower) rank.
        merges.insert(l, r, {static_cast<int32_t>(rank), find(joined)});
    }
}

void Tokenizer::Impl::bpe_tokenize(std::string_view text, std::vector<int32_t> &out) const {
    std::vector<std::pair<uint32_t, uint32_t>> words;
    pre->split(text, words);

    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
    std::string encoded;
    for (const auto &[offset, length] : words) {
        const std::string_view word = text.substr(offset, length);
        if (pre->ignore_merges()) {
            encoded.clear();
            for (char c : word) unicode::append_utf8(encoded, unicode::byte_to_codepoint(static_cast<uint8_t>(c)));
            const int32_t id = find(encoded);
            if (id >= 0) {
                out.push_back(id);
                continue;
            }
        }

        symbols.clear();
        heap.clear();
        for (uint32_t i = 0; i < word.size(); ++i) {
            const int32_t index = static_cast<int32_t>(i);
            symbols.push_back(
                {bpe_byte_token[static_cast<uint8_t>(word[i])], index - 1, i + 1 < word.size() ? index + 1 : -1, i, 1});
        }
        const auto propose = [&](int32_t left, int32_t right) {
            if (left < 0 || right < 0) return;
            const Symbol &l = symbols[size_t(left)], &r = symbols[size_t(right)];
            if (l.id < 0 || r.id < 0) return;
            const MergeTable::Merge *m = merges.find(l.id, r.id);
            if (!m) return;
            heap.push_back({m->rank, left, right, m->result, l.len + r.len});
            std::push_heap(heap.begin(), heap.end(), later);
        };
        for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) propose(i - 1, i);

        while (!heap.empty()) {
            std::pop_heap(heap.begin(), heap.end(), later);
            const Candidate c = heap.back();
            heap.pop_back();
            Symbol &l = symbols[size_t(c.left)];
            Symbol &r = symbols[size_t(c.right)];
            // Stale: one side was merged away, or grew (lengths only grow, so the sum tells).
            if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;
            l.id = c.result;
            l.len += r.len;
            r.len = 0;
            l.next = r.next;
            if (r.next >= 0) symbols[size_t(r.next)].prev = c.left;
            propose(l.prev, c.left);
            propose(c.left, l.next);
        }

        for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[size_t(i)].next) {
            const Symbol &s = symbols[size_t(i)];
            if (s.id >= 0) {
                out.push_back(s.id);
                continue;
            }
            // A merge whose result is not a token, or a byte without a token: emit the byte tokens there are.
            for (uint32_t k = s.start; k < s.start + s.len; ++k) {
                const int32_t b = bpe_byte_token[static_cast<uint8_t>(word[k])];
                if (b >= 0)
                    out.push_back(b);
                else if (unk >= 0)
                    out.push_back(unk);
            }
        }
    }
}

}  // namespace sparrow
