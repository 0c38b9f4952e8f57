#include "runtime/tokenizer.h"

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "gguf/gguf.h"
#include "runtime/tokenizer_impl.h"
#include "runtime/unicode.h"

namespace sparrow {

namespace {

constexpr const char *k_key_model = "tokenizer.ggml.model";
constexpr const char *k_key_pre = "tokenizer.ggml.pre";
constexpr const char *k_key_tokens = "tokenizer.ggml.tokens";
constexpr const char *k_key_scores = "tokenizer.ggml.scores";
constexpr const char *k_key_types = "tokenizer.ggml.token_type";

// Texts of tokens that end a turn in common chat formats. llama.cpp finds end-of-generation tokens the same
// way, since converters do not always record them in the metadata. The order is the preference for EOT.
const std::vector<std::string_view> &eog_texts() {
    static const std::vector<std::string_view> k_texts = {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "<\xef\xbd\x9c"
        "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",  // <｜end▁of▁sentence｜>
        "<end_of_utterance>",
        "<|eom_id|>",
        "<|return|>",
        "<|call|>",
    };
    return k_texts;
}

const gguf::Array &require_array(const gguf::File &file, const char *key, gguf::ValueType elem, const char *elem_name) {
    const gguf::Value *v = file.find(key);
    if (!v) throw_error("%s is missing: the file has no usable vocabulary", key);
    const gguf::Array &arr = v->as_array(key);
    if (arr.type != elem)
        throw_error("%s must be an array of %s, not of %s", key, elem_name, gguf::value_type_name(arr.type));
    return arr;
}

// A special token id from the metadata. Negative values and 0xFFFFFFFF (what converters write for "none")
// mean none; other values must be in range. Without the key, `fallback` is used when it is in range.
int32_t read_token_id(const gguf::File &file, const char *key, int32_t fallback, int32_t n_vocab) {
    const gguf::Value *v = file.find(key);
    if (!v) return fallback >= 0 && fallback < n_vocab ? fallback : -1;
    const int64_t id = v->as_int(key);
    if (id < 0 || id == int64_t(UINT32_MAX)) return -1;
    if (id >= n_vocab) {
        throw_error("%s = %lld is out of range: the vocabulary has %d tokens", key, static_cast<long long>(id),
                    n_vocab);
    }
    return static_cast<int32_t>(id);
}

bool parse_byte_token(std::string_view text, uint8_t &byte) {
    // "<0xNN>" with two hexadecimal digits
    if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return false;
    int v = 0;
    for (size_t i = 3; i < 5; ++i) {
        const char c = text[i];
        int d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else
            return false;
        v = v * 16 + d;
    }
    byte = static_cast<uint8_t>(v);
    return true;
}

}  // namespace

namespace {

void build_pieces(Tokenizer::Impl &im) {
    const int32_t n = im.n_vocab();
    im.piece_offsets.reserve(size_t(n) + 1);
    im.piece_hidden.resize(size_t(n));
    im.piece_arena.reserve(im.arena.size());
    for (int32_t id = 0; id < n; ++id) {
        im.piece_offsets.push_back(static_cast<uint32_t>(im.piece_arena.size()));
        const std::string_view text = im.text(id);
        uint8_t byte = 0;
        switch (im.types[size_t(id)]) {
            case TokenType::CONTROL:
            case TokenType::UNKNOWN:
                im.piece_hidden[size_t(id)] = 1;
                im.piece_arena += text;
                break;
            case TokenType::USER_DEFINED: im.piece_arena += text; break;
            case TokenType::BYTE:
                if (parse_byte_token(text, byte))
                    im.piece_arena.push_back(static_cast<char>(byte));
                else
                    im.piece_arena += text;
                break;
            case TokenType::NORMAL:
                if (im.type == VocabType::SPM) {
                    // "\xe2\x96\x81" (U+2581) stands for a space
                    for (size_t i = 0; i < text.size(); ++i) {
                        if (text.compare(i, 3, "\xe2\x96\x81") == 0) {
                            im.piece_arena.push_back(' ');
                            i += 2;
                        } else {
                            im.piece_arena.push_back(text[i]);
                        }
                    }
                } else {
                    // byte-level BPE: each code point stands for one byte
                    for (size_t i = 0; i < text.size();) {
                        const unicode::Utf8Char c = unicode::decode_utf8(text, i);
                        const int b = c.valid ? unicode::byte_from_codepoint(c.cp) : -1;
                        if (b >= 0)
                            im.piece_arena.push_back(static_cast<char>(b));
                        else
                            im.piece_arena.append(text.substr(i, c.len));  // not a mapped code point: keep it
                        i += c.len;
                    }
                }
                break;
            case TokenType::UNUSED:
            case TokenType::UNDEFINED: break;  // these have no text to show (as in llama.cpp)
        }
    }
    im.piece_offsets.push_back(static_cast<uint32_t>(im.piece_arena.size()));
}

}  // namespace

Tokenizer::Tokenizer(const gguf::File &file) {
    impl_ = std::make_unique<Impl>();
    Impl &im = *impl_;

    // --- model type --------------------------------------------------------------------------------------
    if (!file.has(k_key_model)) throw_error("%s is missing: the file has no vocabulary", k_key_model);
    const std::string model = file.get_string(k_key_model);
    if (model == "llama") {
        im.type = VocabType::SPM;
    } else if (model == "gpt2") {
        im.type = VocabType::BPE;
    } else {
        throw_error("unsupported tokenizer model '%s' (%s); supported: llama (SentencePiece), gpt2 (byte-level BPE)",
                    model.c_str(), k_key_model);
    }
    im.pre_name = file.get_string(k_key_pre, std::string());

    // --- tokens, scores, types ---------------------------------------------------------------------------
    const gguf::Array &tokens = require_array(file, k_key_tokens, gguf::ValueType::STRING, "strings");
    const std::string key_tokens = k_key_tokens, key_scores = k_key_scores, key_types = k_key_types;
    if (tokens.items.empty()) throw_error("%s is empty", k_key_tokens);
    if (tokens.items.size() > size_t(INT32_MAX)) throw_error("%s has too many tokens", k_key_tokens);
    const int32_t n = static_cast<int32_t>(tokens.items.size());
    im.offsets.reserve(size_t(n) + 1);
    for (const gguf::Value &t : tokens.items) {
        im.offsets.push_back(static_cast<uint32_t>(im.arena.size()));
        im.arena += t.as_string(key_tokens);
        if (im.arena.size() > UINT32_MAX) throw_error("%s: token texts too long", k_key_tokens);
    }
    im.offsets.push_back(static_cast<uint32_t>(im.arena.size()));

    im.scores.assign(size_t(n), 0.0f);
    if (file.has(k_key_scores)) {
        const gguf::Array &scores = file.find(k_key_scores)->as_array(k_key_scores);
        if (scores.items.size() != size_t(n)) {
            throw_error("%s has %zu entries but %s has %d", k_key_scores, scores.items.size(), k_key_tokens, n);
        }
        for (int32_t i = 0; i < n; ++i)
            im.scores[size_t(i)] = static_cast<float>(scores.items[size_t(i)].as_double(key_scores));
    }
    im.types.assign(size_t(n), TokenType::NORMAL);
    if (file.has(k_key_types)) {
        const gguf::Array &types = file.find(k_key_types)->as_array(k_key_types);
        if (types.items.size() != size_t(n)) {
            throw_error("%s has %zu entries but %s has %d", k_key_types, types.items.size(), k_key_tokens, n);
        }
        for (int32_t i = 0; i < n; ++i) {
            const int64_t t = types.items[size_t(i)].as_int(key_types);
            im.types[size_t(i)] = t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::UNDEFINED;
        }
    }

    // Empty texts (which converters sometimes leave for unused slots) are never looked up or matched.
    im.text_to_id.reserve(size_t(n));
    const auto text_of = [&im](int32_t id) { return im.text(id); };
    for (int32_t i = 0; i < n; ++i) {
        if (!im.text(i).empty()) im.text_to_id.insert(im.text(i), i, text_of);
    }

    // --- special ids and flags ---------------------------------------------------------------------------
    const bool spm = im.type == VocabType::SPM;
    im.bos = read_token_id(file, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n);
    im.eos = read_token_id(file, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n);
    im.unk = read_token_id(file, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
    im.pad = read_token_id(file, "tokenizer.ggml.padding_token_id", -1, n);
    im.eot = read_token_id(file, "tokenizer.ggml.eot_token_id", -1, n);
    im.eom = read_token_id(file, "tokenizer.ggml.eom_token_id", -1, n);
    read_token_id(file, "tokenizer.ggml.seperator_token_id", -1, n);  // validated only
    read_token_id(file, "tokenizer.ggml.separator_token_id", -1, n);

    if (!spm) im.pre.emplace(PreTokenizer::for_name(im.pre_name));
    im.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix", spm);
    im.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", spm || im.pre->add_bos_default());
    im.add_eos = file.get_bool("tokenizer.ggml.add_eos_token", false);
    if (im.bos < 0) im.add_bos = false;  // nothing to add
    if (im.eos < 0) im.add_eos = false;

    // End of generation: EOS, EOT, EOM and tokens known by their text. Those are control tokens whatever
    // their recorded type (llama.cpp corrects the type the same way).
    im.eog.assign(size_t(n), 0);
    for (std::string_view t : eog_texts()) {
        const int32_t id = im.find(t);
        if (id < 0) continue;
        if (im.eot < 0 && t != "<|eom_id|>" && t != "<|return|>" && t != "<|call|>") im.eot = id;
        if (im.eom < 0 && t == "<|eom_id|>") im.eom = id;
        im.eog[size_t(id)] = 1;
        im.types[size_t(id)] = TokenType::CONTROL;
    }
    for (int32_t id : {im.eos, im.eot, im.eom}) {
        if (id >= 0) im.eog[size_t(id)] = 1;
    }

    // --- per-model tables --------------------------------------------------------------------------------
    if (spm) {
        static const char k_hex[] = "0123456789ABCDEF";
        for (int b = 0; b < 256; ++b) {
            const char name[6] = {'<', '0', 'x', k_hex[b >> 4], k_hex[b & 15], '>'};
            int32_t id = im.find(std::string_view(name, 6));
            if (id < 0) {
                const char raw = static_cast<char>(b);
                id = im.find(std::string_view(&raw, 1));
            }
            im.spm_byte_token[size_t(b)] = id >= 0 ? id : im.unk;
        }
        im.spm_split_words = !spm_tokens_cross_words(im);
    } else {
        for (int b = 0; b < 256; ++b) {
            std::string s;
            unicode::append_utf8(s, unicode::byte_to_codepoint(static_cast<uint8_t>(b)));
            im.bpe_byte_token[size_t(b)] = im.find(s);
        }
        im.load_merges(file);
    }

    // Tokens matched verbatim in the text, longest first (ties by id, for determinism).
    for (int32_t id = 0; id < n; ++id) {
        const TokenType t = im.types[size_t(id)];
        if ((t == TokenType::CONTROL || t == TokenType::USER_DEFINED || t == TokenType::UNKNOWN) &&
            !im.text(id).empty()) {
            im.special_tokens.push_back(id);
        }
    }
    std::stable_sort(im.special_tokens.begin(), im.special_tokens.end(),
                     [&](int32_t a, int32_t b) { return im.text(a).size() > im.text(b).size(); });

    build_pieces(im);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer &&) noexcept = default;
Tokenizer &Tokenizer::operator=(Tokenizer &&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
    const Impl &im = *impl_;
    if (text.size() >= UINT32_MAX) throw_error("tokenize: text of %zu bytes is too long", text.size());

    // Fragments: runs of plain text and special tokens. Each special token, longest first, is cut out of
    // every plain fragment where it occurs.
    struct Fragment {
        int32_t token;  // -1: plain text
        uint32_t offset, length;
    };
    std::vector<Fragment> frags, next;
    if (!text.empty()) frags.push_back({-1, 0, static_cast<uint32_t>(text.size())});
    for (int32_t id : im.special_tokens) {
        // Control and unknown tokens only when asked; user-defined ones always (as Hugging Face does).
        if (!parse_special && im.types[size_t(id)] != TokenType::USER_DEFINED) continue;
        const std::string_view tok = im.text(id);
        if (text.find(tok) == std::string_view::npos) continue;  // cheap rejection over the whole text
        next.clear();
        for (const Fragment &f : frags) {
            if (f.token >= 0) {
                next.push_back(f);
                continue;
            }
            const std::string_view sub = text.substr(f.offset, f.length);
            size_t pos = 0;
            for (size_t hit; (hit = sub.find(tok, pos)) != std::string_view::npos; pos = hit + tok.size()) {
                if (hit > pos) next.push_back({-1, f.offset + uint32_t(pos), uint32_t(hit - pos)});
                next.push_back({id, 0, 0});
            }
            if (pos < sub.size()) next.push_back({-1, f.offset + uint32_t(pos), uint32_t(sub.size() - pos)});
        }
        frags.swap(next);
    }

    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_special && im.add_bos) out.push_back(im.bos);
    // SentencePiece: every plain fragment that starts the text or follows a special token gets the space prefix.
    bool prev_special = true;
    for (const Fragment &f : frags) {
        if (f.token >= 0) {
            out.push_back(f.token);
            prev_special = true;
            continue;
        }
        const std::string_view sub = text.substr(f.offset, f.length);
        if (im.type == VocabType::SPM) {
            im.spm_tokenize(sub, im.add_space_prefix && prev_special, out);
        } else {
            im.bpe_tokenize(sub, out);
        }
        prev_special = false;
    }
    if (add_special && im.add_eos) out.push_back(im.eos);
    return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
    const Impl &im = *impl_;
    if (id < 0 || id >= im.n_vocab()) return {};
    if (im.piece_hidden[size_t(id)] && !render_special) return {};
    return std::string(im.piece(id));
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
    const Impl &im = *impl_;
    std::string out;
    bool strip_space = im.add_space_prefix;  // pending until the first token that is not BOS
    for (int32_t id : ids) {
        if (id < 0 || id >= im.n_vocab()) continue;
        std::string_view piece = im.piece(id);
        if (im.piece_hidden[size_t(id)] && !render_special) piece = {};
        if (id == im.bos && strip_space) {
            out += piece;
            continue;
        }
        if (strip_space && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
        strip_space = false;
        out += piece;
    }
    return out;
}

int32_t Tokenizer::n_vocab() const { return impl_->n_vocab(); }
VocabType Tokenizer::type() const { return impl_->type; }
const std::string &Tokenizer::pre() const { return impl_->pre_name; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::eot_id() const { return impl_->eot; }
int32_t Tokenizer::unk_id() const { return impl_->unk; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
bool Tokenizer::add_space_prefix() const { return impl_->add_space_prefix; }
bool Tokenizer::is_eog(int32_t id) const { return id >= 0 && id < impl_->n_vocab() && impl_->eog[size_t(id)] != 0; }

namespace {
void check_id(const Tokenizer::Impl &im, int32_t id) {
    if (id < 0 || id >= im.n_vocab()) throw_error("token id %d is out of range [0, %d)", id, im.n_vocab());
}
}  // namespace

std::string_view Tokenizer::token_text(int32_t id) const {
    check_id(*impl_, id);
    return impl_->text(id);
}
float Tokenizer::token_score(int32_t id) const {
    check_id(*impl_, id);
    return impl_->scores[size_t(id)];
}
TokenType Tokenizer::token_type(int32_t id) const {
    check_id(*impl_, id);
    return impl_->types[size_t(id)];
}
int32_t Tokenizer::find_token(std::string_view text) const { return impl_->find(text); }

size_t utf8_complete_prefix(std::string_view s) { return unicode::utf8_complete_prefix(s); }

}  // namespace sparrow
