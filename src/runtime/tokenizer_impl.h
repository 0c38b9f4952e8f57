// Internal state of a Tokenizer, shared by tokenizer.cpp (loading, special tokens, decoding),
// tokenizer_spm.cpp and tokenizer_bpe.cpp (the two merge algorithms).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer.h"
#include "runtime/tokenizer_hash.h"
#include "runtime/tokenizer_pre.h"

namespace sparrow {

struct Tokenizer::Impl {
    VocabType type = VocabType::SPM;
    std::string pre_name;

    // Token texts live in one arena: token i is arena[offsets[i], offsets[i+1]).
    std::string arena;
    std::vector<uint32_t> offsets;
    std::vector<float> scores;
    std::vector<TokenType> types;
    TokenTextIndex text_to_id;  // the first id wins when texts repeat; empty texts are not indexed

    int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
    bool add_bos = false, add_eos = false, add_space_prefix = false;
    std::vector<uint8_t> eog;  // per token: ends generation

    // Tokens matched verbatim before tokenization (control, user-defined, unknown types), longest text first.
    std::vector<int32_t> special_tokens;

    // SentencePiece: the token of each byte for byte fallback (<0xNN>, else the one-byte text, else unk; -1).
    std::array<int32_t, 256> spm_byte_token{};

    // Byte-level BPE: token of each raw byte (the text of its mapped code point), merges by token pair, the
    // pre-tokenizer.
    std::array<int32_t, 256> bpe_byte_token{};
    MergeTable merges;
    std::optional<PreTokenizer> pre;

    // token_to_piece with render_special, for every token: piece i is piece_arena[piece_offsets[i], [i+1]).
    // piece_hidden: control / unknown tokens, shown only with render_special.
    std::string piece_arena;
    std::vector<uint32_t> piece_offsets;
    std::vector<uint8_t> piece_hidden;

    int32_t n_vocab() const { return static_cast<int32_t>(types.size()); }
    std::string_view text(int32_t id) const {
        return std::string_view(arena).substr(offsets[size_t(id)], offsets[size_t(id) + 1] - offsets[size_t(id)]);
    }
    std::string_view piece(int32_t id) const {
        return std::string_view(piece_arena)
            .substr(piece_offsets[size_t(id)], piece_offsets[size_t(id) + 1] - piece_offsets[size_t(id)]);
    }
    int32_t find(std::string_view s) const {
        return text_to_id.find(s, [this](int32_t id) { return text(id); });
    }

    // Tokenizes one run of plain text (no special tokens in it), appending ids.
    void spm_tokenize(std::string_view text, bool space_prefix, std::vector<int32_t> &out) const;
    void bpe_tokenize(std::string_view text, std::vector<int32_t> &out) const;
    // Loads tokenizer.ggml.merges (byte-level BPE); throws sparrow::Error on a malformed list.
    void load_merges(const gguf::File &file);

    // SentencePiece merging (tokenizer_spm.cpp): symbols of the escaped text and candidate merges.
    struct SpmSymbol {
        int32_t prev, next;   // neighbours in the current segmentation (-1: none)
        uint32_t start, len;  // bytes of the text; len 0 once merged into the left neighbour
    };
    struct SpmCandidate {
        float score;          // score of the merged token
        int32_t left, right;  // symbols
        uint32_t len;         // bytes of the merge when proposed: stale if the symbols have changed since
    };
    // Heap order for std::push_heap / pop_heap (which pop the largest): the highest score, then the leftmost.
    static bool before(const SpmCandidate &a, const SpmCandidate &b) {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
    // Set at load: no token contains a word start ("▁" after another character), so words merge separately.
    bool spm_split_words = false;
    void spm_merge(std::string_view text, std::vector<SpmSymbol> &symbols, std::vector<SpmCandidate> &heap,
                   std::vector<int32_t> &out) const;
};

// Whether some token of a SentencePiece vocabulary spans a word start (tokenizer_spm.cpp).
bool spm_tokens_cross_words(const Tokenizer::Impl &im);

}  // namespace sparrow
