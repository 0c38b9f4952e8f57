// libFuzzer entry point for GBNF grammars (runtime/grammar.h, runtime/grammar_constraint.h). An input is a grammar's
// text, then a NUL, then bytes to read with it. Every grammar must compile or throw sparrow::Error; for one that
// compiles, every prefix the automaton reads must be whole or continue with some byte (no dead ends), and a token
// mask over a small vocabulary must equal per-token trials at each step.
//
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSPARROW_FUZZ=ON && ninja -C build-fuzz grammar_fuzzer
//   mkdir -p /tmp/grammar-corpus && ./build-fuzz/fuzz/grammar_fuzzer -dict=fuzz/grammar.dict /tmp/grammar-corpus
//
// tests/grammar_test.cpp holds the deterministic tests; this one is for long runs by hand (its replay runs in CTest).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "runtime/grammar.h"
#include "runtime/grammar_constraint.h"

namespace {

[[noreturn]] void fail(const char *what) {
    std::fprintf(stderr, "grammar_fuzzer: invariant broken: %s\n", what);
    __builtin_trap();  // libFuzzer reports the crash and saves the input that caused it
}

// Some byte or a token element continues the text, or it is whole.
bool live(sparrow::GrammarAutomaton &a, const sparrow::GrammarCursor &c) {
    if (c.complete(a) || (c.need == 0 && a.waits_on_tokens(c.state))) return true;
    for (int b = 0; b < 256; ++b) {
        sparrow::GrammarCursor t = c;
        if (t.feed(a, static_cast<uint8_t>(b))) return true;
    }
    return false;
}

struct Vocabulary {
    std::vector<std::string> pieces;
    std::vector<uint8_t> eog;
    std::unique_ptr<sparrow::TokenTrie> trie;
};

// Token 0 ends generation; then every byte alone and a few longer texts (UTF-8 whole and split).
const Vocabulary &vocabulary() {
    static const Vocabulary v = [] {
        Vocabulary out;
        out.pieces.emplace_back();
        for (int b = 1; b < 256; ++b) out.pieces.emplace_back(1, static_cast<char>(b));
        for (const char *more : {"ab", "()", "\xC3\xA9", "\xE3\x81", "\x82\x83", "\"a\"", "0,1", "  ", "\n\n", "{}",
                                 "<think>", "</think>"})
            out.pieces.emplace_back(more);
        out.eog.assign(out.pieces.size(), 0);
        out.eog[0] = 1;
        out.trie = std::make_unique<sparrow::TokenTrie>(out.pieces, out.eog);
        return out;
    }();
    return v;
}

}  // namespace

// For fuzz/replay_main.cpp: grammars that compile, each with text to read, and ones that do not.
std::vector<std::vector<uint8_t>> fuzz_builtin_inputs() {
    const std::pair<const char *, const char *> cases[] = {
        {"root ::= s\ns ::= \"(\" s \")\" s | ", "(()())("},
        {"root ::= [\\u00e0-\\u00ff]+ \"!\"?", "\xC3\xA0\xC3"},
        {"root ::= (\"a\" | [b-d]{1,3} x)* \"!\"\nx ::= [^x] # c", "abx!"},
        {"root ::= [A\\uDC00] .", "A\xED"},
        {"root ::= <think> !</think>* </think> \"ab\" | <[98]> .", "b"},
        {"root ::= root \"a\"", ""},
        {"root ::= (((\"a\"", ""},
        {"", ""},
    };
    std::vector<std::vector<uint8_t>> inputs;
    for (const auto &[grammar, text] : cases) {
        std::vector<uint8_t> in(grammar, grammar + std::strlen(grammar));
        in.push_back(0);
        in.insert(in.end(), text, text + std::strlen(text));
        inputs.push_back(std::move(in));
    }
    return inputs;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace sparrow;
    const std::string_view input(reinterpret_cast<const char *>(data), size);
    const size_t split = input.find('\0');
    const std::string_view text = input.substr(0, split);
    const std::string_view bytes = split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
    const Vocabulary &v = vocabulary();
    const TokenLookup lookup{[&v](std::string_view t) -> int32_t {
                                 for (size_t i = 0; i < v.pieces.size(); ++i)
                                     if (v.pieces[i] == t) return static_cast<int32_t>(i);
                                 return -1;
                             },
                             static_cast<int32_t>(v.pieces.size())};
    std::shared_ptr<const Grammar> g;
    try {
        g = std::make_shared<const Grammar>(Grammar::parse(text, &lookup));
    } catch (const Error &) {
        return 0;
    }
    GrammarAutomaton a(*g);
    GrammarCursor c;
    c.state = a.start();
    if (!live(a, c)) fail("the start is a dead end");
    for (const char ch : bytes.substr(0, 64)) {
        GrammarCursor t = c;
        if (!t.feed(a, static_cast<uint8_t>(ch))) continue;
        c = t;
        if (!live(a, c)) fail("a prefix the automaton read is a dead end");
    }

    GrammarConstraint constraint(g, v.pieces, v.eog, *v.trie);
    std::vector<float> logits(v.pieces.size());
    for (size_t step = 0; step < 6; ++step) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const int64_t n = constraint.mask(logits);
        int64_t counted = 0;
        int32_t pick = -1;
        for (size_t t = 0; t < logits.size(); ++t) {
            const bool masked_in = logits[t] == 0.0f;
            if (masked_in != constraint.allows(static_cast<int32_t>(t))) fail("the mask differs from a trial");
            if (!masked_in) continue;
            ++counted;
            // The input's next bytes choose among the allowed tokens.
            if (pick < 0 || (step < bytes.size() && t % 7 == static_cast<uint8_t>(bytes[step]) % 7))
                pick = static_cast<int32_t>(t);
        }
        if (counted != n) fail("the mask's count is wrong");
        if (pick <= 0) break;
        constraint.accept(pick);
    }
    return 0;
}
