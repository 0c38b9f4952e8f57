#include "runtime/tokenizer_pre.h"

#include "core/error.h"

namespace sparrow {

namespace {

// The regexes are those of each model's tokenizer.json pre-tokenizer (as llama.cpp also lists them), written in
// the dialect of unicode_regex.h; case-insensitive groups (?i:'s|...) are spelled out as '[sS]... .

// GPT-2: contractions, words, numbers, other symbols, each with an optional leading space; runs of spaces give
// all but their last space to the run (the last one starts the next word).
constexpr const char *k_gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Llama 3 (and DBRX, Smaug): like GPT-2 but case-insensitive contractions, a word may take one leading
// non-letter non-digit (not a newline), digits in groups of up to three, newlines kept with the symbols before
// them, and runs of whitespace ending in newlines kept together.
constexpr const char *k_llama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2 (and StableLM2): Llama 3's pattern with single digits.
constexpr const char *k_qwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o / Llama 4 (o200k): words split at case changes, contractions attached to the word.
constexpr const char *k_gpt4o = R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
                                R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
                                R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
                                R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
                                R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Tekken (Mistral NeMo and later): the o200k shape without contractions, single digits.
constexpr const char *k_tekken = R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
                                 R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
                                 R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// CJK ideographs U+4E00..U+9FA5, U+0800..U+4E00 (sic: the original range covers most of the BMP below the
// ideographs) and Hangul U+AC00..U+D7FF, as DeepSeek LLM and DeepSeek Coder split them.
constexpr const char *k_deepseek_cjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// DeepSeek LLM's letter class: the cased letters of the original pattern, listed by code point (several of
// its characters are canonical singletons that text tools silently normalise, e.g. U+212A KELVIN SIGN).
constexpr const char *k_deepseek_llm_letters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C})"
    R"(\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5})"
    R"(\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B})"
    R"(\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45})"
    R"(\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4})"
    R"(\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB})"
    R"(\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115})"
    R"(\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139})"
    R"(\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}-\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}-\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB})"
    R"(\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";

struct PreDef {
    const char *names;  // space-separated aliases
    std::vector<const char *> regexes;
    bool ignore_merges;
    bool add_bos;
};

const std::vector<PreDef> &pre_defs() {
    static const std::vector<PreDef> k_defs = {
        // What llama.cpp uses when a BPE vocabulary names no (or the "default") pre-tokenizer.
        {"default", {R"([\p{P}\$\+<=>\^~\|]+)", k_gpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}, false, false},
        {"gpt-2 phi-2 mpt olmo jais gigachat jina-es jina-de jina-v2-es jina-v2-de exaone4", {k_gpt2}, false, false},
        {"llama3 llama-v3 llama-bpe falcon3 pixtral", {k_llama3}, true, true},
        {"dbrx smaug-bpe", {k_llama3}, false, false},
        {"glm4 chatglm-bpe", {k_llama3}, false, false},
        {"qwen2 stablelm2 deepseek-r1-qwen megrez hunyuan", {k_qwen2}, false, false},
        {"starcoder refact command-r smollm codeshell exaone minerva-7b", {R"(\p{N})", k_gpt2}, false, false},
        {"deepseek-llm",
         {R"([\r\n])", k_deepseek_llm_letters,
          R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)",
          k_deepseek_cjk, R"(\p{N}+)"},
         false,
         false},
        {"deepseek-coder", {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", k_deepseek_cjk, R"(\p{N})"}, false, false},
        // DeepSeek V3 / V3.2 (and R1): digits in groups of three, CJK ideographs and kana kept apart, then
        // words that may start with one ASCII punctuation character.
        {"deepseek-v3",
         {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
          R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
          R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
         false,
         false},
        {"gpt-4o llama4", {k_gpt4o}, false, false},
        {"tekken", {k_tekken}, true, true},
    };
    return k_defs;
}

bool has_name(const char *names, const std::string &name) {
    const std::string_view all(names);
    size_t pos = 0;
    while (pos < all.size()) {
        size_t end = all.find(' ', pos);
        if (end == std::string_view::npos) end = all.size();
        if (all.substr(pos, end - pos) == name) return true;
        pos = end + 1;
    }
    return false;
}

}  // namespace

std::string PreTokenizer::known_names() {
    std::string out;
    for (const PreDef &d : pre_defs()) {
        std::string names = d.names;
        for (char &c : names) c = c == ' ' ? ',' : c;
        out += (out.empty() ? "" : ",") + names;
    }
    return out;
}

PreTokenizer PreTokenizer::for_name(const std::string &pre) {
    const std::string name = pre.empty() ? "default" : pre;
    for (const PreDef &d : pre_defs()) {
        if (!has_name(d.names, name)) continue;
        PreTokenizer p;
        p.name_ = name;
        for (const char *re : d.regexes) p.regexes_.emplace_back(re);
        p.ignore_merges_ = d.ignore_merges;
        p.add_bos_default_ = d.add_bos;
        return p;
    }
    throw_error("unknown BPE pre-tokenizer '%s' (tokenizer.ggml.pre); known: %s", name.c_str(), known_names().c_str());
}

void PreTokenizer::split(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>> &pieces) const {
    const unicode::CodepointText t = unicode::prepare_text(text);
    // Piece boundaries as code point indices (each entry is the end of a piece); every regex refines them.
    std::vector<uint32_t> ends{static_cast<uint32_t>(t.size())}, next;
    for (const unicode::Regex &re : regexes_) {
        next.clear();
        uint32_t begin = 0;
        for (uint32_t end : ends) {
            re.split(t, begin, end, next);
            begin = end;
        }
        ends.swap(next);
    }
    uint32_t begin = 0;
    for (uint32_t end : ends) {
        if (end > begin) pieces.emplace_back(t.offsets[begin], t.offsets[end] - t.offsets[begin]);
        begin = end;
    }
}

}  // namespace sparrow
