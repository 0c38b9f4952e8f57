// A small byte-level BPE vocabulary (GGUF tokenizer model "gpt2", pre-tokenizer "default") for synthetic
// models: the 256 byte tokens in GPT-2's byte-to-unicode spelling, merges learned by plain BPE training on
// a built-in English text, then the special tokens. Deterministic: the same n_vocab gives the same vocab.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/synthetic.h"

namespace sparrow {

namespace {

// Training text for the merges (written for this purpose): common English words and punctuation.
constexpr const char *kCorpus =
    "Once upon a time there was a little girl who lived in a village near the forest. Every day she "
    "walked to the river to play with her friends, and every evening she came home to her mother and "
    "father. One day the girl saw a small bird sitting on a branch. The bird was sad because it could "
    "not fly. The girl wanted to help the bird, so she took it home and gave it some water and food. "
    "The next morning the bird was happy and strong. It sang a song and flew over the house. The girl "
    "smiled and said, \"Thank you for the song!\" From that day on, the bird came back to visit her "
    "every morning. They were the best of friends, and they lived happily in the village by the forest. "
    "The model reads the numbers 0 1 2 3 4 5 6 7 8 9 and 10, 100, 2024; it writes code like x = y + 1; "
    "if (a < b) { return a; } else { return b; } and lists: apples, oranges, bread, milk, and tea.\n";

// GPT-2's reversible map from bytes to printable unicode code points.
std::vector<std::string> byte_to_unicode() {
    std::vector<int> code(256, -1);
    for (int b = 33; b <= 126; ++b) code[b] = b;
    for (int b = 161; b <= 172; ++b) code[b] = b;
    for (int b = 174; b <= 255; ++b) code[b] = b;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
        if (code[b] < 0) code[b] = next++;
    }
    std::vector<std::string> out(256);
    for (int b = 0; b < 256; ++b) {
        const int cp = code[b];
        if (cp < 0x80) {
            out[b] = std::string(1, static_cast<char>(cp));
        } else {  // two-byte UTF-8 (all code points here are below 0x800)
            out[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
        }
    }
    return out;
}

// Words as GPT-2 pre-tokenises plain prose: a run of letters/digits with its leading space, or one other
// byte.
std::vector<std::string> split_words(const std::string &text) {
    std::vector<std::string> words;
    std::string cur;
    const auto is_word = [](unsigned char c) { return std::isalnum(c) != 0; };
    for (size_t i = 0; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (is_word(c)) {
            cur += static_cast<char>(c);
            continue;
        }
        if (!cur.empty()) words.push_back(cur), cur.clear();
        if (c == ' ' && i + 1 < text.size() && is_word(static_cast<unsigned char>(text[i + 1]))) {
            cur = " ";
        } else {
            words.emplace_back(1, static_cast<char>(c));
        }
    }
    if (!cur.empty()) words.push_back(cur);
    return words;
}

}  // namespace

SyntheticVocab make_synthetic_vocab(int64_t n_vocab, bool fim) {
    std::vector<std::string> special = {"<|bos|>", "<|eos|>"};
    if (fim) special.insert(special.end(), {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"});
    const int64_t n_min = 256 + static_cast<int64_t>(special.size());
    if (n_vocab < n_min) throw_error("a byte-level vocabulary needs at least %lld tokens", (long long)n_min);

    SyntheticVocab v;
    const auto b2u = byte_to_unicode();
    for (const auto &s : b2u) v.tokens.push_back(s), v.token_types.push_back(1);  // 1 = normal

    // BPE training: each distinct word is a sequence of symbols with a count; merge the most frequent
    // adjacent pair (ties: the lexicographically smallest pair) until the vocabulary is full.
    std::map<std::vector<std::string>, int64_t> words;
    for (const auto &w : split_words(kCorpus)) {
        std::vector<std::string> symbols;
        for (unsigned char c : w) symbols.push_back(b2u[c]);
        ++words[symbols];
    }
    while (static_cast<int64_t>(v.tokens.size()) + static_cast<int64_t>(special.size()) < n_vocab) {
        std::map<std::pair<std::string, std::string>, int64_t> pairs;
        for (const auto &[symbols, count] : words) {
            for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += count;
        }
        if (pairs.empty()) break;  // the corpus is fully merged: pad with unused filler tokens below
        auto best = pairs.begin();
        for (auto it = pairs.begin(); it != pairs.end(); ++it) {
            if (it->second > best->second) best = it;
        }
        const auto [a, b] = best->first;
        v.merges.push_back(a + " " + b);
        v.tokens.push_back(a + b);
        v.token_types.push_back(1);
        std::map<std::vector<std::string>, int64_t> merged;
        for (const auto &[symbols, count] : words) {
            std::vector<std::string> out;
            for (size_t i = 0; i < symbols.size(); ++i) {
                if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
                    out.push_back(a + b);
                    ++i;
                } else {
                    out.push_back(symbols[i]);
                }
            }
            merged[out] += count;
        }
        words = std::move(merged);
    }
    // Filler tokens, if the corpus ran out of pairs: user-defined (type 4) so that no merge produces them.
    for (int64_t i = 0; static_cast<int64_t>(v.tokens.size()) + static_cast<int64_t>(special.size()) < n_vocab; ++i) {
        v.tokens.push_back("<|unused" + std::to_string(i) + "|>");
        v.token_types.push_back(4);
    }
    v.bos_id = static_cast<int32_t>(v.tokens.size());
    v.eos_id = v.bos_id + 1;
    for (const auto &s : special) v.tokens.push_back(s), v.token_types.push_back(3);  // 3 = control
    return v;
}

}  // namespace sparrow
