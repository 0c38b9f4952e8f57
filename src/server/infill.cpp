#include "server/infill.h"

#include <algorithm>

#include "core/error.h"
#include "gguf/gguf.h"
#include "runtime/tokenizer.h"

namespace sparrow::server {

namespace {

// A token id from the metadata key, if it is there and inside the vocabulary; else the first spelling found.
int32_t find_fim(const gguf::File &file, const Tokenizer &tok, std::initializer_list<const char *> keys,
                 std::initializer_list<std::string_view> spellings) {
    for (const char *key : keys) {
        if (!file.has(key)) continue;
        const int64_t id = file.get_int(key);
        if (id >= 0 && id < tok.n_vocab()) return static_cast<int32_t>(id);
    }
    for (const std::string_view s : spellings) {
        if (const int32_t id = tok.find_token(s); id >= 0) return id;
    }
    return -1;
}

std::vector<int32_t> plain(const Tokenizer &tok, std::string_view text) {
    return tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
}

}  // namespace

FimTokens fim_tokens(const gguf::File &file, const Tokenizer &tok) {
    FimTokens f;
    f.pre = find_fim(file, tok, {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
                     {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>"});
    f.suf = find_fim(file, tok, {"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
                     {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>"});
    f.mid = find_fim(file, tok, {"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
                     {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>"});
    f.rep = find_fim(file, tok, {"tokenizer.ggml.fim_rep_token_id"}, {"<|repo_name|>", "<repo_name>", "<reponame>"});
    f.sep = find_fim(file, tok, {"tokenizer.ggml.fim_sep_token_id"}, {"<|file_sep|>", "<file_sep>"});
    return f;
}

std::vector<int32_t> infill_prompt(const Tokenizer &tok, const FimTokens &fim, std::string_view prefix,
                                   std::string_view suffix, std::string_view prompt, std::span<const InfillChunk> extra,
                                   const InfillBudget &budget) {
    if (!fim.usable()) throw_error("infill needs the model's prefix, suffix and middle tokens");
    std::vector<int32_t> pre = plain(tok, prefix), suf = plain(tok, suffix), mid = plain(tok, prompt);
    // The end of the prefix and the start of the suffix are nearest the hole: those are kept.
    const auto n_pre = static_cast<size_t>(std::min<int64_t>(std::ssize(pre), 3 * (budget.budget / 4)));
    const auto n_suf =
        static_cast<size_t>(std::clamp<int64_t>(budget.budget / 4 - 2 - std::ssize(mid), 0, std::ssize(suf)));
    pre.erase(pre.begin(), pre.end() - static_cast<std::ptrdiff_t>(n_pre));
    suf.resize(n_suf);

    std::vector<int32_t> ext;
    if (!extra.empty()) {
        const bool repo = fim.rep >= 0 && fim.sep >= 0;
        if (repo) {
            ext.push_back(fim.rep);
            const auto name = plain(tok, "myproject\n");
            ext.insert(ext.end(), name.begin(), name.end());
        }
        for (const InfillChunk &c : extra) {
            if (repo) ext.push_back(fim.sep);
            const auto head = plain(tok, c.filename + "\n"), body = plain(tok, c.text);
            ext.insert(ext.end(), head.begin(), head.end());
            ext.insert(ext.end(), body.begin(), body.end());
        }
        // The last files are nearest the one being edited: an over-long context loses its beginning.
        const auto n_ext =
            static_cast<size_t>(std::min<int64_t>(std::ssize(ext), std::max<int64_t>(0, budget.extra_budget)));
        ext.erase(ext.begin(), ext.end() - static_cast<std::ptrdiff_t>(n_ext));
    }

    std::vector<int32_t> out;
    if (tok.add_bos() && tok.bos_id() >= 0) out.push_back(tok.bos_id());
    out.insert(out.end(), ext.begin(), ext.end());
    out.push_back(fim.pre);
    out.insert(out.end(), pre.begin(), pre.end());
    out.push_back(fim.suf);
    out.insert(out.end(), suf.begin(), suf.end());
    out.push_back(fim.mid);
    out.insert(out.end(), mid.begin(), mid.end());
    return out;
}

}  // namespace sparrow::server
