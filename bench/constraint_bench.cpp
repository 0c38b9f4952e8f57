// Constrained sampling's masks over a real vocabulary (llama-bpe, 128K tokens, from ../shared/data/vocab): JSON mode
// inside a string and between values, and GBNF grammars where most tokens may come (free text), where few may (a
// digit, a keyword), and inside a JSON grammar's string. A mask is computed only when the sampler's first draw breaks
// the text (sample_constrained), so this is the worst case per token.
//
//   ./build/bench/sparrow_constraint_bench [google benchmark flags]   (run from the project root)
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "runtime/grammar_constraint.h"
#include "runtime/json_prefix.h"
#include "runtime/tokenizer.h"

namespace {

using namespace sparrow;

struct Vocab {
    JsonVocabulary json;
    std::unique_ptr<TokenTrie> trie;
};

const Vocab &vocab() {
    static const Vocab v = [] {
        Vocab out;
        const Tokenizer tok(gguf::File::open("../shared/data/vocab/ggml-vocab-llama-bpe.gguf"));
        out.json = json_vocabulary(tok);
        out.trie = std::make_unique<TokenTrie>(out.json.pieces, out.json.eog);
        return out;
    }();
    return v;
}

// range(0): 0 free text [^\n]*, 1 a number's digits, 2 one of a few keywords, 3 inside a JSON grammar's string.
void BM_GrammarMask(benchmark::State &state) {
    const Vocab &v = vocab();
    static const char *const kCases[][2] = {
        {"root ::= [^\\n]* \"\\n\"", "Once upon a time"},
        {"root ::= \"n = \" [0-9]+ \";\"", "n = 12"},
        {"root ::= (\"alpha\" | \"beta\" | \"gamma\") \" \" [a-z]+", ""},
        {"root ::= \"{\" ws (str \":\" ws str (\",\" ws str \":\" ws str)*)? \"}\"\nstr ::= \"\\\"\" "
         "([^\"\\\\\\x00-\\x1F] | "
         "\"\\\\\" [\"\\\\/bfnrt])* \"\\\"\" ws\nws ::= [ \\n]{0,20}",
         "{\"name\": \"Ada Lo"},
    };
    const auto &c = kCases[state.range(0)];
    const auto g = std::make_shared<const Grammar>(Grammar::parse(c[0]));
    GrammarConstraint constraint(g, v.json.pieces, v.json.eog, *v.trie);
    // Walk to the case's position through single-byte tokens (each byte is a token in llama-bpe's vocabulary).
    for (const char ch : std::string(c[1])) {
        for (size_t t = 0; t < v.json.pieces.size(); ++t) {
            if (v.json.pieces[t] == std::string(1, ch)) {
                constraint.accept(static_cast<int32_t>(t));
                break;
            }
        }
    }
    std::vector<float> logits(v.json.pieces.size(), 0.0f);
    int64_t allowed = 0;
    for (auto _ : state) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        allowed = constraint.mask(logits);
        benchmark::DoNotOptimize(logits.data());
    }
    state.counters["allowed"] = static_cast<double>(allowed);
}
BENCHMARK(BM_GrammarMask)->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

// range(0): 0 inside a string (plain tokens shortcut), 1 between values.
void BM_JsonMask(benchmark::State &state) {
    const Vocab &v = vocab();
    JsonConstraint constraint(v.json);
    const std::string at = state.range(0) == 0 ? "{\"name\": \"Ada Lo" : "{\"a\": 1,";
    for (const char ch : at) {
        for (size_t t = 0; t < v.json.pieces.size(); ++t) {
            if (v.json.pieces[t] == std::string(1, ch)) {
                constraint.accept(static_cast<int32_t>(t));
                break;
            }
        }
    }
    std::vector<float> logits(v.json.pieces.size(), 0.0f);
    for (auto _ : state) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        benchmark::DoNotOptimize(constraint.mask(logits));
    }
}
BENCHMARK(BM_JsonMask)->DenseRange(0, 1)->Unit(benchmark::kMillisecond);

void BM_TokenTrie(benchmark::State &state) {
    const Vocab &v = vocab();
    for (auto _ : state) {
        TokenTrie trie(v.json.pieces, v.json.eog);
        benchmark::DoNotOptimize(trie.nodes().size());
    }
    state.counters["nodes"] = static_cast<double>(v.trie->nodes().size());
}
BENCHMARK(BM_TokenTrie)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
