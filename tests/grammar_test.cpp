// GBNF grammars (runtime/grammar.h, runtime/grammar_constraint.h): refusals by name and place; regular grammars
// against std::regex over every short string of a small alphabet (whole texts accepted alike, and a prefix readable
// exactly when some text extends it); recursive grammars against hand-written recognisers; random walks that never
// dead-end; JSON written as a grammar against JsonPrefix byte by byte; the token mask (a trie walk) against
// per-token trials, with characters split over tokens; and mutated grammars that compile or fail cleanly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/grammar.h"
#include "runtime/grammar_constraint.h"
#include "runtime/json_prefix.h"
#include "runtime/sampler.h"

namespace sparrow {
namespace {

// `edits` random insertions, deletions or replacements of one byte of `bytes` each.
void mutate(std::string &s, const std::string &bytes, int edits, std::mt19937 &rng) {
    for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % (s.size() + 1);
        const char b = bytes[rng() % bytes.size()];
        const uint32_t kind = rng() % 3;
        if (kind == 0) {
            s.insert(at, 1, b);
        } else if (at < s.size()) {
            if (kind == 1) {
                s.erase(at, 1);
            } else {
                s[at] = b;
            }
        }
    }
}

// Reads `text` from the start; 1 whole, 0 a readable prefix, -1 refused.
int read(const Grammar &g, std::string_view text) {
    GrammarAutomaton a(g);
    GrammarCursor c;
    c.state = a.start();
    if (!c.feed(a, text)) return -1;
    return c.complete(a) ? 1 : 0;
}

std::string error_of(std::string_view text) {
    try {
        Grammar::parse(text);
    } catch (const Error &e) {
        return e.what();
    }
    return "(compiled)";
}

TEST(Grammar, RefusesBadGrammarsNamingWhatIsWrong) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"", "no rules"},
        {"item ::= \"a\"", "no 'root' rule"},
        {"root ::= item", "rule 'item' is used (line 1) but not defined"},
        {"root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive"},
        {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "left-recursive"},
        {"root ::= \"a\" root", "'root' derives no finite text"},
        {"root ::= \"abc", "line 1, column 14: unterminated string literal"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= []", "empty character class"},
        {"root ::= [z-a]", "character range out of order"},
        {"root ::= [ab", "unterminated character class"},
        {"root ::= \"a\"{3,2}", "maximum below its minimum"},
        {"root ::= \"a\"{20000}", "repetition count too large"},
        {"root ::= " + std::string(65, '(') + "\"a\"" + std::string(65, ')'), "nested too deeply"},
        {"root ::= " +
             [] {
                 std::string many;  // 200 repetitions of 10000 optional copies each: two million rules
                 for (int i = 0; i < 200; ++i) many += "\"a\"{0,10000} ";
                 return many;
             }(),
         "grammar too large"},
        {"root ::= \"a\"{2", "expected '}'"},
        {"root ::= <think> \"a\"", "token matches (<...>) need the model's vocabulary"},
        {"root ::= !<[12]>", "need the model's vocabulary"},
        {"root ::= \"a\"\nroot ::= \"b\"", "rule 'root' is defined twice"},
        {"root \"a\"", "expected '::=' after the rule name"},
        {"root ::= (\"a\" | \"b\"", "expected ')'"},
        {"root ::= \"a\" )", "expected the end of the line after the rule"},
        {"root ::= \"a\" x ::= \"b\"", "expected the end of the line before the next rule"},
        {"root ::= \"\xff\"", "invalid UTF-8"},
        {"root ::= \"\\U00110000\"", "beyond the last code point"},
        {"root ::= [\\uD800-\\uDFFF]", "'root' derives no finite text"},
        {"root ::= \"a\"\n| \"b\"", "line 2, column 1: expected a rule name"},
        {"root ::= \"a\" (\n  \"b\"\n  x ::= \"c\")", "before the next rule"},
    };
    EXPECT_NO_THROW(Grammar::parse("root ::= " + std::string(64, '(') + "\"a\"" + std::string(64, ')')));
    for (const auto &[text, want] : cases)
        EXPECT_NE(error_of(text).find(want), std::string::npos) << text << " -> " << error_of(text);
}

// Token matches against a vocabulary: refusals, then a thinking block made of whole tokens (<think>, any token but
// </think>, </think>) before a text the characters decide, sampled through the mask with every token's trial checked.
TEST(GrammarConstraint, TokenMatches) {
    const std::vector<std::string> pieces = {"", "<think>", "</think>", "hm", "yes", "y", "es", "no", "a", "</th"};
    std::vector<uint8_t> eog(pieces.size(), 0);
    eog[0] = 1;
    const TokenLookup lookup{[&](std::string_view text) -> int32_t {
                                 for (size_t i = 0; i < pieces.size(); ++i)
                                     if (pieces[i] == text) return static_cast<int32_t>(i);
                                 return -1;
                             },
                             static_cast<int32_t>(pieces.size())};
    const auto refusal = [&](const char *text) {
        try {
            Grammar::parse(text, &lookup);
        } catch (const Error &e) {
            return std::string(e.what());
        }
        return std::string("(compiled)");
    };
    EXPECT_NE(refusal("root ::= <nope>").find("no token of the vocabulary has exactly this text"), std::string::npos);
    EXPECT_NE(refusal("root ::= <[10]>").find("token id beyond the vocabulary"), std::string::npos);
    EXPECT_NE(refusal("root ::= <[1x]>").find("must be a number"), std::string::npos);
    EXPECT_NE(refusal("root ::= <think").find("unterminated token match"), std::string::npos);
    EXPECT_NE(refusal("root ::= !\"a\"").find("expected '<' after '!'"), std::string::npos);

    const TokenTrie trie(pieces, eog);
    for (const char *text : {"root ::= <think> t </think> (\"yes\" | \"no\")\nt ::= !</think>*",
                             "root ::= <[1]> t <[2]> (\"yes\" | \"no\")\nt ::= !<[2]>*"}) {
        const auto g = std::make_shared<const Grammar>(Grammar::parse(text, &lookup));
        std::mt19937 rng(3);
        int answered = 0;
        for (int run = 0; run < 200; ++run) {
            GrammarConstraint c(g, pieces, eog, trie);
            std::vector<int32_t> ids;
            for (int step = 0; step < 30; ++step) {
                std::vector<float> logits(pieces.size(), 0.0f);
                const int64_t n = c.mask(logits);
                std::vector<int32_t> allowed;
                for (size_t t = 0; t < pieces.size(); ++t) {
                    ASSERT_EQ(c.allows(static_cast<int32_t>(t)), logits[t] == 0.0f) << text << " token " << t;
                    if (logits[t] == 0.0f) allowed.push_back(static_cast<int32_t>(t));
                }
                ASSERT_EQ(n, static_cast<int64_t>(allowed.size()));
                ASSERT_FALSE(allowed.empty());
                if (step == 0) {
                    EXPECT_EQ(allowed, std::vector<int32_t>{1});  // only the <think> token, not its text
                }
                const int32_t pick = allowed[rng() % allowed.size()];
                c.accept(pick);
                if (pick == 0) break;
                ids.push_back(pick);
            }
            if (!c.complete()) continue;
            ++answered;
            // <think>, tokens other than </think>, </think>, then yes or no spelled by any tokens.
            ASSERT_GE(ids.size(), 3u);
            EXPECT_EQ(ids[0], 1);
            const auto close = std::find(ids.begin() + 1, ids.end(), 2);
            ASSERT_NE(close, ids.end());
            std::string answer;
            for (auto it = close + 1; it != ids.end(); ++it) answer += pieces[static_cast<size_t>(*it)];
            EXPECT_TRUE(answer == "yes" || answer == "no") << answer;
        }
        EXPECT_GT(answered, 20) << text;
    }
}

// Every string over `alphabet` up to `max_len` characters.
void for_each_string(const std::string &alphabet, size_t max_len, const std::function<void(const std::string &)> &f) {
    std::vector<std::string> level = {""};
    f("");
    for (size_t len = 1; len <= max_len; ++len) {
        std::vector<std::string> next;
        for (const auto &s : level)
            for (const char c : alphabet) {
                next.push_back(s + c);
                f(next.back());
            }
        level = std::move(next);
    }
}

TEST(Grammar, RegularGrammarsMatchRegexOnEveryShortString) {
    struct Case {
        const char *grammar, *regex, *alphabet;
    };
    const std::vector<Case> cases = {
        {"root ::= \"a\"* \"b\"", "a*b", "ab"},
        {"root ::= (\"ab\" | \"c\")+ \".\"?", "(ab|c)+\\.?", "abc."},
        {"root ::= [a-c]{2,4} x\nx ::= \".\" | ", "[a-c]{2,4}\\.?", "abc."},
        {"root ::= \"a\"{3}", "a{3}", "ab"},
        {"root ::= \"ab\"{2,}", "(ab){2,}", "ab"},
        {"root ::= (\"a\" \"b\"?){0,3}", "(ab?){0,3}", "ab"},
        {"root ::= [^a]+ | \"a\" [^a]", "[^a]+|a[^a]", "ab."},
        {"root ::= .* \"b\"", "[\\s\\S]*b", "ab\n"},
        {"root ::= ( \"a\" | ) ( \"b\" | \"c\" \"c\" )*", "a?(b|cc)*", "abc"},
        {"# a comment\nroot ::= x (\n  \"a\" |  # inside a group\n  \"b\"\n) y\nx ::= \"c\"\ny ::= \"a\" |\n  \"b\"\n",
         "c(a|b)(a|b)", "abc"},
        {"root ::= \"\\x61\" [\\u0062-\\U00000063] \"\\\\\\\"\"", "a[b-c]\\\\\"", "abc\\\""},
        {"root ::= [a-b-]+ \"{\" [\\]\\[]", "[-ab]+\\{[\\]\\[]", "a-{[]"},
        {"root ::= \"\"{0} \"a\"{0,0} \"b\"{1,1}", "b", "ab"},
        {"root ::= (\"a\" | \"a\" | \"aa\")* \"b\"", "a*b", "ab"},
        // Repetitions of what may be empty: the repetition's rule comes back to itself through a tail call only.
        {"root ::= (\"a\"? \"b\"?)* \"c\"", "(a?b?)*c", "abc"},
        {"root ::= x* \"!\" \"\"*\nx ::= [a-b]* | \"c\"", "[abc]*!", "abc!"},
    };
    for (const auto &c : cases) {
        const Grammar g = Grammar::parse(c.grammar);
        const std::regex re(c.regex, std::regex::ECMAScript);
        // Strings up to n characters, and texts up to 4 longer for the prefixes (a prefix is readable iff some text
        // extends it; every grammar here finishes within 4 more), ~200K strings at most.
        const size_t size = std::string(c.alphabet).size();
        size_t n = 1;
        while (std::pow(static_cast<double>(size), static_cast<double>(n + 1 + 4)) <= 2e5) ++n;
        std::set<std::string> extendable;
        for_each_string(c.alphabet, n + 4, [&](const std::string &s) {
            if (std::regex_match(s, re))
                for (size_t k = 0; k <= s.size(); ++k) extendable.insert(s.substr(0, k));
        });
        for_each_string(c.alphabet, n, [&](const std::string &s) {
            const int r = read(g, s);
            const bool whole = std::regex_match(s, re);
            EXPECT_EQ(r == 1, whole) << c.grammar << " on '" << s << "'";
            EXPECT_EQ(r >= 0, extendable.count(s) != 0) << c.grammar << " on prefix '" << s << "'";
        });
    }
}

// Balanced parentheses (recursion that is not a tail call) and arithmetic against recognisers of their own.
TEST(Grammar, RecursiveGrammarsMatchRecognisers) {
    const Grammar parens = Grammar::parse("root ::= s\ns ::= \"(\" s \")\" s | ");
    for_each_string("()", 12, [&](const std::string &s) {
        int depth = 0, low = 0;
        for (const char c : s) {
            depth += c == '(' ? 1 : -1;
            low = std::min(low, depth);
        }
        const int r = read(parens, s);
        EXPECT_EQ(r >= 0, low >= 0) << s;
        EXPECT_EQ(r == 1, low >= 0 && depth == 0) << s;
    });

    const Grammar arith = Grammar::parse(
        "root ::= expr\n"
        "expr ::= term ((\"+\" | \"-\") term)*\n"
        "term ::= num | \"(\" expr \")\"\n"
        "num  ::= [0-9]+\n");
    // A recursive-descent reader: the length of the expr read at `i`, or npos.
    std::function<size_t(const std::string &, size_t)> expr, term;
    term = [&](const std::string &s, size_t i) -> size_t {
        if (i < s.size() && s[i] == '(') {
            const size_t e = expr(s, i + 1);
            if (e == std::string::npos || e >= s.size() || s[e] != ')') return std::string::npos;
            return e + 1;
        }
        size_t j = i;
        while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
        return j == i ? std::string::npos : j;
    };
    expr = [&](const std::string &s, size_t i) -> size_t {
        size_t j = term(s, i);
        while (j != std::string::npos && j < s.size() && (s[j] == '+' || s[j] == '-')) j = term(s, j + 1);
        return j;
    };
    int whole = 0;
    for_each_string("1(+)", 7, [&](const std::string &s) {
        const bool ok = expr(s, 0) == s.size();
        whole += ok;
        EXPECT_EQ(read(arith, s) == 1, ok) << s;
        for (size_t k = 0; ok && k < s.size(); ++k) EXPECT_GE(read(arith, s.substr(0, k)), 0) << s.substr(0, k);
    });
    EXPECT_GT(whole, 50);
}

// From any readable prefix some character continues it or the text is whole: random walks over an alphabet that
// covers the grammar never get stuck, and each ends in a whole text.
TEST(Grammar, RandomWalksNeverDeadEnd) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"root ::= s\ns ::= \"(\" s \")\" s | ", "()x"},
        {"root ::= \"[\" (v (\",\" v)*)? \"]\"\nv ::= [0-9]{1,3} | \"[\" (v (\",\" v)*)? \"]\"", "[],12x"},
        {"root ::= (\"ab\" | \"a\" \"c\"{2,3})+ \"!\"", "abc!"},
        {"root ::= x{2,5} y\nx ::= [a-b] | \"c\" x\ny ::= \"\" | \"d\"+", "abcd"},
    };
    std::mt19937 rng(7);
    for (const auto &[text, alphabet] : cases) {
        const Grammar g = Grammar::parse(text);
        GrammarAutomaton a(g);
        int whole = 0;
        for (int walk = 0; walk < 300; ++walk) {
            GrammarCursor c;
            c.state = a.start();
            std::string s;
            for (int step = 0; step < 200; ++step) {
                std::vector<char> next;
                for (const char ch : alphabet) {
                    GrammarCursor t = c;
                    if (t.feed(a, static_cast<uint8_t>(ch))) next.push_back(ch);
                }
                if (c.complete(a) && (next.empty() || rng() % 4 == 0)) {
                    ++whole;
                    break;
                }
                ASSERT_FALSE(next.empty()) << text << ": stuck after '" << s << "'";
                const char ch = next[rng() % next.size()];
                ASSERT_TRUE(c.feed(a, static_cast<uint8_t>(ch)));
                s += ch;
            }
        }
        EXPECT_GT(whole, 20) << text;
    }
}

// Code points beyond ASCII, whole or byte by byte, in classes, negated classes and literals; bytes that are not
// UTF-8 are refused; a partial character is readable only if some code point it may become is allowed.
TEST(Grammar, ReadsUtf8ByteByByte) {
    const Grammar g = Grammar::parse("root ::= [ぁ-ゟ]+ \"é\" [^a-z]");
    EXPECT_EQ(read(g, "あいé1"), 1);
    EXPECT_EQ(read(g, "あいé"), 0);
    EXPECT_EQ(read(g, "\xE3"), 0);       // あ's first byte: it may still become one
    EXPECT_EQ(read(g, "\xE4"), -1);      // a lead byte of U+4000-U+4FFF: none is in the class
    EXPECT_EQ(read(g, "\xE3\x81"), 0);   // U+3040-U+307F
    EXPECT_EQ(read(g, "\xE3\x80"), -1);  // U+3000-U+303F
    EXPECT_EQ(read(g, "あa"), -1);
    EXPECT_EQ(read(g, "あ\x80"), -1);               // a stray continuation byte
    EXPECT_EQ(read(g, "あé\xC0\x80"), -1);          // an overlong NUL
    EXPECT_EQ(read(g, "あé\xED\xA0\x80"), -1);      // a surrogate
    EXPECT_EQ(read(g, "あé\xF4\x90\x80\x80"), -1);  // beyond U+10FFFF
    EXPECT_EQ(read(g, "あé\xF0\x9F\x98\x80"), 1);   // U+1F600
    // A partial character against a negated class: refused only when the class excludes every code point it may
    // still become.
    const Grammar not_latin = Grammar::parse("root ::= [^a-z\u00E9] | [^\u0080-\u00FF] \"!\"");
    EXPECT_EQ(read(not_latin, "\xC3"), 0);       // U+00C0-U+00FF: only é is excluded from the first class
    EXPECT_EQ(read(not_latin, "\xC3\xA9"), -1);  // é
    EXPECT_EQ(read(not_latin, "\xC3\xA8"), 1);   // è
    const Grammar not_high = Grammar::parse("root ::= [^\u0080-\u00FF]");
    EXPECT_EQ(read(not_high, "\xC3"), -1);
    EXPECT_EQ(read(not_high, "\xC4"), 0);
    // A class holding a surrogate beside a valid code point: ED (U+D000-U+DFFF) leads only to surrogates the class
    // holds and to code points it does not, so it is refused rather than left as a dead end.
    const Grammar with_surrogate = Grammar::parse("root ::= [A\\uDC00]");
    EXPECT_EQ(read(with_surrogate, "A"), 1);
    EXPECT_EQ(read(with_surrogate, "\xED"), -1);
    const Grammar any = Grammar::parse("root ::= . .");
    EXPECT_EQ(read(any, "\n\xF0\x9F\x98\x80"), 1);
    EXPECT_EQ(read(any, "abc"), -1);
}

// JSON objects written as a grammar read byte by byte like JsonPrefix (another automaton, written for JSON alone)
// on mutated documents: the same prefixes readable, the same texts whole. Whitespace and \u escapes are left out of
// the texts compared (JsonPrefix bounds whitespace runs and pairs surrogate escapes; the grammar here does not).
TEST(Grammar, JsonGrammarAgreesWithJsonPrefix) {
    const Grammar g = Grammar::parse(R"(
root   ::= object ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n\r]*
)");
    const std::vector<std::string> docs = {
        R"({"a":1,"b":[true,false,null],"c":{"d":"e\n\"f"},"g":-0.5e+3})",
        R"({"x":[[],{},[1,[2,{"y":"é"}]]],"z":12.25E-2,"w":"\/\\\b"})",
        R"({})",
    };
    std::mt19937 rng(3);
    const std::string bytes = "{}[]\":,.-+eE0123456789tfnrua\\/bx\xC3\xA9";
    int compared = 0, whole = 0;
    for (int trial = 0; trial < 20000; ++trial) {
        std::string s = docs[rng() % docs.size()];
        mutate(s, bytes, static_cast<int>(rng() % 3), rng);
        if (s.find("\\u") != std::string::npos) continue;
        ++compared;
        GrammarAutomaton a(g);
        GrammarCursor c;
        c.state = a.start();
        JsonPrefix p;
        for (size_t i = 0; i < s.size(); ++i) {
            const bool jp = p.feed(std::string_view(s).substr(i, 1));
            const bool gp = c.feed(a, static_cast<uint8_t>(s[i]));
            ASSERT_EQ(jp, gp) << "'" << s << "' at byte " << i;
            if (!jp) break;
            if (i + 1 == s.size()) {
                EXPECT_EQ(p.complete(), c.complete(a)) << s;
                whole += p.complete();
            }
        }
    }
    EXPECT_GT(compared, 15000);
    EXPECT_GT(whole, 2000);
}

// An alternative that can never finish (its rule derives no finite text) is dropped: the matcher never enters it.
TEST(Grammar, DropsAlternativesThatCannotFinish) {
    const Grammar g = Grammar::parse("root ::= \"a\" | \"b\" x | y\nx ::= \"c\" x\ny ::= \"d\" x | \"e\"");
    EXPECT_EQ(read(g, "a"), 1);
    EXPECT_EQ(read(g, "e"), 1);
    EXPECT_EQ(read(g, "b"), -1);
    EXPECT_EQ(read(g, "d"), -1);
}

// Deep recursion stops at the automaton's depth bound without failing, and a state keeps a bounded set of stacks.
TEST(Grammar, StaysBoundedOnDeepAndAmbiguousInput) {
    const Grammar parens = Grammar::parse("root ::= s\ns ::= \"(\" s \")\" | \"x\"");
    GrammarAutomaton a(parens);
    GrammarCursor c;
    c.state = a.start();
    size_t opened = 0;
    for (GrammarCursor t = c; opened < 5000 && t.feed(a, static_cast<uint8_t>('(')); ++opened) c = t;
    EXPECT_GE(opened, GrammarAutomaton::kMaxDepth - 2);
    EXPECT_LT(opened, 5000u);
    EXPECT_TRUE(c.feed(a, std::string_view("x")));  // the innermost may still close

    // Right recursion (a reference that ends its alternative, as in x*'s rule) returns straight to its caller: it
    // does not deepen the stack, so lists far longer than the depth bound are read.
    const Grammar list = Grammar::parse("root ::= x\nx ::= \"a\" x | \"b\"");
    EXPECT_EQ(read(list, std::string(3 * GrammarAutomaton::kMaxDepth, 'a') + "b"), 1);

    const Grammar ambiguous = Grammar::parse("root ::= x*\nx ::= \"a\" y | \"a\"\ny ::= \"a\"? | \"a\" \"a\"");
    GrammarAutomaton b(ambiguous);
    GrammarCursor d;
    d.state = b.start();
    for (int i = 0; i < 2000; ++i) ASSERT_TRUE(d.feed(b, static_cast<uint8_t>('a')));
    EXPECT_TRUE(d.complete(b));
}

// compact() drops the caches but the current state: what may follow is unchanged.
TEST(Grammar, CompactKeepsTheCurrentState) {
    const Grammar g = Grammar::parse("root ::= s \"!\"\ns ::= \"(\" s \")\" s | [a-c]*");
    GrammarAutomaton a(g), fresh(g);
    GrammarCursor c, f;
    c.state = a.start();
    f.state = fresh.start();
    ASSERT_TRUE(c.feed(a, std::string_view("((ab)(c)")));
    ASSERT_TRUE(f.feed(fresh, std::string_view("((ab)(c)")));
    c.state = a.compact(c.state);
    for (const std::string rest : {"))!", ")!", "a))!", "!", ")))!", "d"}) {
        GrammarCursor x = c, y = f;
        const bool ok = x.feed(a, std::string_view(rest));
        EXPECT_EQ(ok, y.feed(fresh, std::string_view(rest))) << rest;
        if (ok) {
            EXPECT_EQ(x.complete(a), y.complete(fresh)) << rest;
        }
    }
}

// A toy vocabulary with characters split over tokens: the trie walk's mask equals a trial of every token, and
// sampling through it gives texts the grammar derives, ended only when whole.
TEST(GrammarConstraint, MaskMatchesTrialsAndSamplingEndsWhole) {
    const std::vector<std::string> pieces = {"",     "",   "あ",   "\xE3", "\x81\x84", "\x81",   "\x84", "い",
                                             ",",    " ",  "あい", "、",   "a",        ", ",     "。",   "\n",
                                             "い。", "ab", "x",    "\x82", "\xE3\x80", "\x82\n", "いあ", "\x80"};
    std::vector<uint8_t> eog(pieces.size(), 0);
    eog[0] = 1;
    const TokenTrie trie(pieces, eog);
    const auto g = std::make_shared<const Grammar>(
        Grammar::parse("root ::= item (\", \" item)* \"。\" \"\\n\"?\nitem ::= [あ-い]{1,3} | \"a\" \"b\"?"));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    int ended = 0;
    for (int run = 0; run < 300; ++run) {
        GrammarConstraint c(g, pieces, eog, trie);
        std::string text;
        for (int step = 0; step < 60; ++step) {
            std::vector<float> logits(pieces.size());
            for (float &l : logits) l = u(rng);
            std::vector<float> masked = logits;
            const int64_t n = c.mask(masked);
            for (size_t t = 0; t < pieces.size(); ++t)
                ASSERT_EQ(c.allows(static_cast<int32_t>(t)), masked[t] > -1e30f) << "token " << t << " after " << text;
            ASSERT_GT(n, 0) << "nothing may follow '" << text << "'";
            EXPECT_FALSE(c.allows(1)) << "an empty token was allowed";
            const auto best = static_cast<int32_t>(std::max_element(masked.begin(), masked.end()) - masked.begin());
            c.accept(best);
            if (best == 0) {
                EXPECT_EQ(read(*g, text), 1) << text;
                ++ended;
                break;
            }
            text += pieces[static_cast<size_t>(best)];
            ASSERT_GE(read(*g, text), 0) << text;
        }
    }
    EXPECT_GT(ended, 100);
}

// sample_constrained with a grammar after a thinking block: anything (but an end) before "</think>", then the
// grammar's text, and the block's end may come split over tokens.
TEST(GrammarConstraint, AfterTheThinkingBlock) {
    const std::vector<std::string> pieces = {"",    "</think>", "</th", "ink>", "</think>yes", "</think>x", "hm",
                                             "yes", "no",       "\n",   "y",    "es",          "</think>\n"};
    std::vector<uint8_t> eog(pieces.size(), 0);
    eog[0] = 1;
    const TokenTrie trie(pieces, eog);
    const auto g = std::make_shared<const Grammar>(Grammar::parse("root ::= \"\\n\"? (\"yes\" | \"no\")"));
    SamplerParams params;
    params.temp = 1.0f;
    int answered = 0;
    for (int run = 0; run < 200; ++run) {
        params.seed = static_cast<uint64_t>(run);
        Sampler sampler(params);
        GrammarConstraint c(g, pieces, eog, trie, "</think>");
        std::vector<float> logits = {2.0f}, scratch;  // the model would rather stop
        logits.resize(pieces.size(), 0.0f);
        std::string text;
        for (int step = 0; step < 40; ++step) {
            const int32_t t = sample_constrained(sampler, logits, c, scratch);
            ASSERT_GE(t, 0);
            if (t == 0) break;
            text += pieces[static_cast<size_t>(t)];
        }
        const size_t at = text.find("</think>");
        ASSERT_NE(at, std::string::npos) << text;
        const std::string reply = text.substr(at + 8);
        if (c.complete()) {
            EXPECT_EQ(read(*g, reply), 1) << text;
            ++answered;
        } else {
            EXPECT_GE(read(*g, reply), 0) << text;
        }
    }
    EXPECT_GT(answered, 50);
}

// Mutated grammars compile or throw Error; those that compile read random text without failing, and masks over a
// small vocabulary agree with per-token trials.
TEST(Grammar, MutatedGrammarsCompileOrFailCleanly) {
    const std::vector<std::string> seeds = {
        "root ::= (\"a\" | [b-d]+ x)* \"!\"\nx ::= \"\\n\"? [^x]{1,3} # c",
        "root ::= s\ns ::= \"(\" s \")\" s | ",
        "root ::= \"{\" ws (k \":\" v (\",\" k \":\" v)*)? \"}\"\nk ::= \"\\\"\" [a-z]+ \"\\\"\"\nv ::= [0-9]+ | k\nws "
        "::= [ ]*",
    };
    const std::string bytes = "()[]{}|*+?.\"\\:= -^#\nabxroot0123,\xC3\xA9<!";
    // A vocabulary of every byte above (é's two alone) and a few longer texts; token 0 ends generation.
    std::vector<std::string> pieces = {""};
    for (const char b : bytes) pieces.emplace_back(1, b);
    for (const char *more : {"ab", "()", "\xC3\xA9", "\"a", "0,", "root", "\n\n", "a!", "((", "\xC3\xA9x"})
        pieces.emplace_back(more);
    std::vector<uint8_t> eog(pieces.size(), 0);
    eog[0] = 1;
    const TokenTrie trie(pieces, eog);
    std::mt19937 rng(11);
    int compiled = 0, walked = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        std::string s = seeds[rng() % seeds.size()];
        mutate(s, bytes, 1 + static_cast<int>(rng() % 4), rng);
        try {
            const Grammar g = Grammar::parse(s);
            ++compiled;
            GrammarAutomaton a(g);
            GrammarCursor c;
            c.state = a.start();
            for (int i = 0; i < 50; ++i) {
                GrammarCursor t = c;
                if (t.feed(a, static_cast<uint8_t>(bytes[rng() % bytes.size()]))) c = t;
            }
            if (compiled % 4 != 0) continue;
            // Through a constraint: the trie's mask equals per-token trials at each step, and what it lets through
            // stays readable.
            const auto shared = std::make_shared<const Grammar>(g);
            GrammarConstraint gc(shared, pieces, eog, trie);
            std::string text;
            for (int step = 0; step < 12; ++step) {
                std::vector<float> logits(pieces.size(), 0.0f);
                const int64_t n = gc.mask(logits);
                std::vector<int32_t> allowed;
                for (size_t t = 0; t < pieces.size(); ++t) {
                    const bool ok = logits[t] > -1e30f;
                    ASSERT_EQ(gc.allows(static_cast<int32_t>(t)), ok) << s << "\ntoken " << t << " after " << text;
                    if (ok) allowed.push_back(static_cast<int32_t>(t));
                }
                ASSERT_EQ(n, static_cast<int64_t>(allowed.size()));
                if (allowed.empty()) break;
                const int32_t pick = allowed[rng() % allowed.size()];
                gc.accept(pick);
                if (pick == 0) {
                    EXPECT_EQ(read(g, text), 1) << s << "\n" << text;
                    break;
                }
                text += pieces[static_cast<size_t>(pick)];
                ASSERT_GE(read(g, text), 0) << s << "\n" << text;
                ++walked;
            }
        } catch (const Error &) {}
    }
    EXPECT_GT(compiled, 300);
    EXPECT_GT(walked, 500);
}

}  // namespace
}  // namespace sparrow
