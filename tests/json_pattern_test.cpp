// JSON Schema patterns against std::regex (ECMAScript, search semantics) on random ASCII strings: the automaton
// matches exactly the strings std::regex_search finds a match in; a prefix's state set is empty only when no
// extension of it matches (checked by extending); refusals name what they refuse; code points beyond ASCII.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "runtime/json_pattern.h"

namespace sparrow {
namespace {

const std::vector<std::string> kPatterns = {
    "^[A-Z]{3}$",
    "^\\d{4}-\\d{2}-\\d{2}$",
    "ab|cd",
    "^(ab|a)*c?$",
    "^a+b*$",
    "x.y",
    "^[^a-c]*$",
    "^\\w+@\\w+\\.(com|org)$",
    "^(?:-?\\d+)(\\.\\d{1,2})?$",
    "\\s",
    "^$",
    "^.{2,4}$",
    "^[a-c-]+$",
    "a{2,}",
    "^(a|b){0,3}c$",
    "^\\S+\\s\\S+$",
    "^[\\d.]+$",
    "^\\(\\d\\)$",
    "1\\.5",
    "^(\\d{2})x$",
    "^a{3}b?$",
    "^[A-Za-z_][A-Za-z0-9_]*$",
    "e$",
    "^\\x41\\u0042$",
    "^[\\-+]?\\d*$",
};

std::string random_string(std::mt19937 &rng) {
    static const std::string kAlphabet = "abcxyzABC019-.@ _e()\n+";
    std::string s;
    const int n = static_cast<int>(rng() % 11);
    for (int i = 0; i < n; ++i) s += kAlphabet[rng() % kAlphabet.size()];
    return s;
}

TEST(JsonPattern, MatchesWhatStdRegexSearchMatches) {
    std::mt19937 rng(5);
    for (const std::string &pattern : kPatterns) {
        const JsonPattern p = JsonPattern::compile(pattern);
        const std::regex re(pattern, std::regex::ECMAScript);
        for (int i = 0; i < 3000; ++i) {
            // Mostly random strings; some built to match (the tests' patterns are short).
            std::string s = random_string(rng);
            const bool expect = std::regex_search(s, re);
            ASSERT_EQ(p.matches(s), expect) << pattern << " on '" << s << "'";
            // A prefix's states are empty only when no extension can match: check the extensions of length <= 2.
            JsonPattern::States st = p.start();
            for (size_t k = 0; k <= s.size(); ++k) {
                if (st.empty()) {
                    const std::string head = s.substr(0, k);
                    for (const char a : std::string("abcxyzABC019-.@ _e()\n+")) {
                        EXPECT_FALSE(std::regex_search(head + a, re)) << pattern << ": '" << head << a << "'";
                    }
                    break;
                }
                if (k < s.size()) st = p.step(st, static_cast<uint8_t>(s[k]));
            }
        }
    }
}

TEST(JsonPattern, CodePointsAndRefusals) {
    const JsonPattern p = JsonPattern::compile("^.\\u00e9[\\u4e00-\\u9fff]+$");
    EXPECT_TRUE(p.matches("x\xc3\xa9\xe4\xb8\xad\xe6\x96\x87"));  // xé中文
    EXPECT_FALSE(p.matches("x\xc3\xa9"));
    EXPECT_FALSE(p.matches("\n\xc3\xa9\xe4\xb8\xad"));                       // '.' takes no line terminator
    EXPECT_TRUE(JsonPattern::compile("^(?<year>\\d{2})x$").matches("12x"));  // a named group is a group
    const JsonPattern emoji = JsonPattern::compile("^\\ud83d\\ude00{2}$");
    EXPECT_TRUE(emoji.matches("\xf0\x9f\x98\x80\xf0\x9f\x98\x80"));
    for (const auto &[pattern, words] : std::vector<std::pair<std::string, std::string>>{
             {"a(?=b)", "lookarounds"},
             {"(a)\\1", "backreferences"},
             {"\\bword", "word boundaries"},
             {"a^b", "anchors"},
             {"[a-", "unclosed"},
             {"(ab", "unclosed group"},
             {"a{3,2}", "m < n"},
             {"\\p{L}", "not supported"},
             {"*a", "nothing to repeat"},
             {"(a{30}){30}", "states"},
             {"[^\\s\\S]", "no string matches"},
         }) {
        try {
            JsonPattern::compile(pattern);
            ADD_FAILURE() << "compiled: " << pattern;
        } catch (const std::exception &e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << pattern << ": " << e.what();
        }
    }
}

// Random patterns from the subset's pieces: each compiles or is refused with a message (never a crash or hang);
// what compiles and std::regex also takes matches the same random strings.
TEST(JsonPattern, RandomPatternsAgreeWithStdRegexOrAreRefused) {
    static const std::vector<std::string> kPieces = {"a",   "b",    "x",    "1",      "-",     ".",      "\\d", "\\w",
                                                     "\\s", "[ab]", "[^a]", "[a-c1]", "(",     ")",      "(?:", "|",
                                                     "*",   "+",    "?",    "{2}",    "{1,3}", "{0,}",   "^",   "$",
                                                     "\\.", "\\(",  "{",    "}",      "]",     "\\u0061"};
    std::mt19937 rng(9);
    int compared = 0, refused = 0;
    for (int round = 0; round < 3000; ++round) {
        std::string pattern;
        for (int n = 1 + static_cast<int>(rng() % 7); n > 0; --n) pattern += kPieces[rng() % kPieces.size()];
        std::optional<JsonPattern> p;
        try {
            p.emplace(JsonPattern::compile(pattern));
        } catch (const std::exception &e) {
            EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos) << e.what();
            ++refused;
            continue;
        }
        std::optional<std::regex> re;
        try {
            re.emplace(pattern, std::regex::ECMAScript);
        } catch (const std::regex_error &) {
            continue;  // std::regex refuses some of what ECMAScript's Annex B takes (a lone '{', ']')
        }
        ++compared;
        for (int i = 0; i < 200; ++i) {
            const std::string s = random_string(rng);
            ASSERT_EQ(p->matches(s), std::regex_search(s, *re)) << pattern << " on '" << s << "'";
        }
    }
    EXPECT_GT(compared, 500);
    EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace sparrow
