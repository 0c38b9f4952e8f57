// SentencePiece-style BPE ("llama" vocabularies), as llama.cpp's SPM tokenizer does it:
//  1. spaces become U+2581 "▁" (and one is prepended when the caller asks for the space prefix);
//  2. the text starts as one symbol per UTF-8 character (a malformed byte is a symbol of its own);
//  3. repeatedly, of all adjacent pairs whose concatenation is a token, the one whose token has the highest
//     score is merged (ties: the leftmost) -- a priority queue of candidate pairs, so O(n log n) overall;
//  4. each final symbol is its token, or, for a character that is not a token, one byte token <0xNN> per byte.
#include <algorithm>

#include "core/error.h"
#include "runtime/tokenizer_impl.h"
#include "runtime/unicode.h"

namespace sparrow {

namespace {

constexpr std::string_view k_space = "\xe2\x96\x81";  // U+2581, what spaces become

// Whether a "▁" at byte `i` of `s` follows a character other than "▁" (a word start inside the text).
bool is_word_start(std::string_view s, size_t i) {
    return i > 0 && s.compare(i, 3, k_space) == 0 && (i < 3 || s.compare(i - 3, 3, k_space) != 0);
}

}  // namespace

bool spm_tokens_cross_words(const Tokenizer::Impl &im) {
    for (int32_t id = 0; id < im.n_vocab(); ++id) {
        const std::string_view t = im.text(id);
        for (size_t i = t.find(k_space, 1); i != std::string_view::npos; i = t.find(k_space, i + 1)) {
            if (is_word_start(t, i)) return true;
        }
    }
    return false;
}

void Tokenizer::Impl::spm_tokenize(std::string_view raw, bool space_prefix, std::vector<int32_t> &out) const {
    std::string text;
    text.reserve(raw.size() + raw.size() / 4 + 3);
    if (space_prefix) text += k_space;
    for (char c : raw) {
        if (c == ' ')
            text += k_space;
        else
            text.push_back(c);
    }

    // Merges never cross a word start when no token contains one, so words can be merged one at a time:
    // the same result (merge order within a word is unchanged), with small queues instead of one over the
    // whole text.
    std::vector<SpmSymbol> symbols;
    std::vector<SpmCandidate> heap;
    size_t begin = 0;
    if (spm_split_words) {
        for (size_t i = text.find(k_space, 1); i != std::string::npos; i = text.find(k_space, i + 1)) {
            if (!is_word_start(text, i)) continue;
            spm_merge(std::string_view(text).substr(begin, i - begin), symbols, heap, out);
            begin = i;
        }
    }
    spm_merge(std::string_view(text).substr(begin), symbols, heap, out);
}

void Tokenizer::Impl::spm_merge(std::string_view text, std::vector<SpmSymbol> &symbols, std::vector<SpmCandidate> &heap,
                                std::vector<int32_t> &out) const {
    if (text.empty()) return;
    symbols.clear();
    heap.clear();
    for (uint32_t pos = 0; pos < text.size();) {
        // One symbol per character; a malformed byte is a symbol of its own (stepping by the lead byte alone,
        // as llama.cpp does, would let a stray 0xFF swallow the next three bytes, "▁" included, and the
        // byte fallback would then give back "▁" instead of the space). Same result on valid UTF-8.
        const uint32_t len = unicode::decode_utf8(text, pos).len;
        const int32_t index = static_cast<int32_t>(symbols.size());
        symbols.push_back({index - 1, pos + len < text.size() ? index + 1 : -1, pos, len});
        pos += len;
    }

    const auto propose = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const SpmSymbol &l = symbols[size_t(left)];
        const uint32_t len = l.len + symbols[size_t(right)].len;
        const int32_t id = find(text.substr(l.start, len));
        if (id < 0) return;
        heap.push_back({scores[size_t(id)], left, right, len});
        std::push_heap(heap.begin(), heap.end(), before);
    };
    for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) propose(i - 1, i);

    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), before);
        const SpmCandidate c = heap.back();
        heap.pop_back();
        SpmSymbol &l = symbols[size_t(c.left)];
        SpmSymbol &r = symbols[size_t(c.right)];
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
        const SpmSymbol &s = symbols[size_t(i)];
        const std::string_view piece = text.substr(s.start, s.len);
        const int32_t id = find(piece);
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        // Only single characters can be missing (merges always form tokens): fall back to bytes.
        for (char ch : piece) {
            const int32_t b = spm_byte_token[static_cast<uint8_t>(ch)];
            if (b < 0) {
                throw_error(
                    "tokenize: byte 0x%02X cannot be encoded: the vocabulary has no byte token <0x%02X> "
                    "and no unknown token",
                    unsigned(uint8_t(ch)), unsigned(uint8_t(ch)));
            }
            out.push_back(b);
        }
    }
}

}  // namespace sparrow
