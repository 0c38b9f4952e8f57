// Tokenizers for GGUF vocabularies: SentencePiece-style BPE ("llama") and byte-level BPE ("gpt2"), behaving
// like llama.cpp's (whose outputs match the original Hugging Face / SentencePiece tokenizers on its test set).
//
// Metadata read from the GGUF (all under tokenizer.ggml.):
//   model            "llama" | "gpt2"                          pre        pre-tokenizer name (gpt2 only)
//   tokens           [string] token texts                      scores     [f32] merge priorities (llama)
//   token_type       [i32] 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
//   merges           [string] "left right", by rank (gpt2)
//   bos/eos/eot/eom/unknown/padding_token_id, add_bos_token, add_eos_token, add_space_prefix
// Malformed metadata (missing or mistyped arrays, lengths that disagree, merges of unknown tokens, token ids
// out of range) is a sparrow::Error naming the key; nothing is read out of bounds.
//
// A Tokenizer is immutable after construction: encode/decode may run concurrently from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparrow {

namespace gguf {
class File;
}

enum class TokenType : int32_t {
    UNDEFINED = 0,
    NORMAL = 1,
    UNKNOWN = 2,
    CONTROL = 3,
    USER_DEFINED = 4,
    UNUSED = 5,
    BYTE = 6,
};

enum class VocabType { SPM, BPE };

class Tokenizer {
  public:
    // Reads the vocabulary from the file's metadata (tensors are not touched). Throws sparrow::Error.
    explicit Tokenizer(const gguf::File &file);
    ~Tokenizer();
    Tokenizer(Tokenizer &&) noexcept;
    Tokenizer &operator=(Tokenizer &&) noexcept;

    // Text to token ids.
    //  add_special:   add BOS (and EOS) where the model's add_bos / add_eos flags say so.
    //  parse_special: control and unknown-type tokens written verbatim in the text (e.g. "<|im_start|>") become
    //                 those tokens. User-defined tokens are always recognised, as in the original tokenizers.
    // Special tokens are matched first, longest text first; the text between them is tokenized normally (for
    // SentencePiece vocabularies each such text gets the leading space when add_space_prefix is set).
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

    // The bytes a token stands for: byte tokens <0xNN> and byte-level BPE tokens give raw bytes, which may be a
    // part of a UTF-8 character; the concatenation of the pieces of a sequence is its text. Control and
    // unknown-type tokens give "" unless render_special. Ids out of range give "".
    std::string token_to_piece(int32_t id, bool render_special = false) const;

    // The concatenation of the pieces, except that when the vocabulary adds a space prefix (SentencePiece) the
    // leading space of the first token that is not BOS is dropped: decode(encode(s, ...)) == s for any s that
    // the vocabulary can represent. For streaming, concatenate token_to_piece() instead and use
    // utf8_complete_prefix() to hold back an incomplete character.
    std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

    int32_t n_vocab() const;
    VocabType type() const;
    const std::string &pre() const;  // pre-tokenizer name ("" for SentencePiece vocabularies)
    int32_t bos_id() const;          // -1 when the vocabulary has none
    int32_t eos_id() const;
    int32_t eot_id() const;
    int32_t unk_id() const;
    int32_t pad_id() const;
    bool add_bos() const;
    bool add_eos() const;
    bool add_space_prefix() const;
    // End of generation: EOS, EOT, EOM and the control tokens known to end a turn ("<|im_end|>", ...).
    bool is_eog(int32_t id) const;

    // Per-token data; the id must be in [0, n_vocab()) (checked: sparrow::Error otherwise).
    std::string_view token_text(int32_t id) const;
    float token_score(int32_t id) const;
    TokenType token_type(int32_t id) const;
    // The id of a token with exactly this text, or -1.
    int32_t find_token(std::string_view text) const;

    struct Impl;

  private:
    std::unique_ptr<Impl> impl_;
};

// Length of the longest prefix of `s` that does not end inside an incomplete UTF-8 sequence.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace sparrow
