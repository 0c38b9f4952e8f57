// Pre-tokenizers of byte-level BPE vocabularies. `tokenizer.ggml.pre` names how the original (Hugging Face)
// tokenizer cuts text into words before BPE merges run inside each word: a sequence of regexes, each one
// splitting every piece left by the previous one into its matches and the gaps between them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/unicode_regex.h"

namespace sparrow {

class PreTokenizer {
  public:
    // The pre-tokenizer for a `tokenizer.ggml.pre` value ("" means "default"). Throws sparrow::Error for an
    // unknown name, listing the known ones.
    static PreTokenizer for_name(const std::string &pre);

    // Appends the pieces of `text` as byte ranges {offset, length}, in order; together they tile `text`.
    void split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>> &pieces) const;

    const std::string &name() const { return name_; }
    // Whether a word that is itself a token skips the merges (Llama 3's tokenizer does this).
    bool ignore_merges() const { return ignore_merges_; }
    // Whether the model family adds BOS by default (tokenizer.ggml.add_bos_token, when present, wins).
    bool add_bos_default() const { return add_bos_default_; }

    // The names accepted by for_name, comma-separated (for error messages and docs).
    static std::string known_names();

  private:
    std::string name_;
    std::vector<unicode::Regex> regexes_;
    bool ignore_merges_ = false;
    bool add_bos_default_ = false;
};

}  // namespace sparrow
