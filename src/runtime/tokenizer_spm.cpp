// SentencePiece-style BPE ("llama" vocabularies), as llama.cpp's SPM tokenizer does it:
//  1. spaces become U+2581 "▁" (and one is prepended when the caller asks for the space prefix);
//  2. the text starts as one symbol per UTF-8 character;
//  3. repeatedly, of all adjacent pairs whose concatenation is a token, the one whose token has the highest
//     score is merged (ties: the leftmost) -- a priority queue of candidate pairs, so O(n log n) overall;
//  4. each final symbol is its token, or, for a character that is not a token, one byte token <0xNN> per byte.
#include <algorithm>
#include <queue>

#include "core/error.h"
#include "runtime/tokenizer_impl.h"
#include "runtime/unicode.h"

namespace sparrow {

namespace {

struct Symbol {
    int32_t prev, next;   // neighbours in the current segmentation (-1: none)
    uint32_t start, len;  // bytes of the escaped text; len 0 once merged into its left neighbour
};

struct Candidate {
    float score;           // score of the merged token
    int32_t left, right;   // symbols
    uint32_t len;          // bytes of the merge when proposed: stale if the symbols have changed since
};

struct CandidateOrder {
    // priority_queue pops the largest: the highest score, then the leftmost pair.
    bool operator()(const Candidate &a, const Candidate &b) const {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
};

}  // namespace

void Tokenizer::Impl::spm_tokenize(std::string_view raw, bool space_prefix, std::vector<int32_t> &out) const {
    static constexpr std::string_view k_space = "\xe2\x96\x81";  // U+2581
    std::string text;
    text.reserve(raw.size() + raw.size() / 4 + 3);
    if (space_prefix) text += k_space;
    for (char c : raw) {
        if (c == ' ') text += k_space;
        else text.push_back(c);
    }
    if (text.empty()) return;

    std::vector<Symbol> symbols;
    symbols.reserve(text.size());
    for (uint32_t pos = 0; pos < text.size();) {
        const uint32_t len = static_cast<uint32_t>(
            std::min(unicode::utf8_len_from_lead(static_cast<uint8_t>(text[pos])), text.size() - pos));
        const int32_t index = static_cast<int32_t>(symbols.size());
        symbols.push_back({index - 1, pos + len < text.size() ? index + 1 : -1, pos, len});
        pos += len;
    }

    std::vector<Candidate> storage;
    storage.reserve(symbols.size());
    std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> queue(CandidateOrder{}, std::move(storage));
    const auto propose = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const Symbol &l = symbols[size_t(left)];
        const uint32_t len = l.len + symbols[size_t(right)].len;
        const int32_t id = find(std::string_view(text).substr(l.start, len));
        if (id < 0) return;
        queue.push({scores[size_t(id)], left, right, len});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) propose(i - 1, i);

    while (!queue.empty()) {
        const Candidate c = queue.top();
        queue.pop();
        Symbol &l = symbols[size_t(c.left)];
        Symbol &r = symbols[size_t(c.right)];
        // Stale: one side was merged away, or grew (lengths only grow, so the sum tells).
        if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) symbols[size_t(r.next)].prev = c.left;
        propose(l.prev, c.left);
        propose(c.left, l.next);
    }

    for (int32_t i = 0; i != -1; i = symbols[size_t(i)].next) {
        const Symbol &s = symbols[size_t(i)];
        const std::string_view piece = std::string_view(text).substr(s.start, s.len);
        const int32_t id = find(piece);
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        // Only single characters can be missing (merges always form tokens): fall back to bytes.
        for (char ch : piece) {
            const int32_t b = spm_byte_token[static_cast<uint8_t>(ch)];
            if (b < 0) {
                throw_error("tokenize: byte 0x%02X cannot be encoded: the vocabulary has no byte token <0x%02X> "
                            "and no unknown token", unsigned(uint8_t(ch)), unsigned(uint8_t(ch)));
            }
            out.push_back(b);
        }
    }
}

}  // namespace sparrow
