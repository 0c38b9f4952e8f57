// JSON mode's automaton against nlohmann's parser: on generated documents and on mutations of them, a text is read
// whole and complete exactly when nlohmann accepts it as one object (within the automaton's nesting and whitespace
// bounds), and every prefix of an accepted text is readable. Then the constraint over a toy vocabulary: sampling
// through its mask only ever produces prefixes of an object and ends only on a whole one.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/json_prefix.h"

namespace sparrow {
namespace {

bool reads_whole(const std::string &text) {
    JsonPrefix p;
    return p.feed(text) && p.complete();
}

// Random JSON text: an object at the top, nested values of every kind, strings with escapes, surrogate pairs and
// multi-byte UTF-8, numbers in every form, whitespace runs of up to 3 between tokens.
class Generator {
  public:
    explicit Generator(uint32_t seed) : rng_(seed) {}
    std::string document() {
        std::string out = ws();
        object(out, 0);
        return out + ws();
    }

  private:
    std::mt19937 rng_;
    int pick(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }
    std::string ws() {
        static const char kWs[] = {' ', '\t', '\n', '\r'};
        std::string s;
        for (int i = pick(4); i > 0; --i) s += kWs[pick(4)];
        return s;
    }
    void string(std::string &out) {
        static const std::vector<std::string> kParts = {"a",
                                                        "Z",
                                                        " ",
                                                        "\\\"",
                                                        "\\\\",
                                                        "\\/",
                                                        "\\n",
                                                        "\\t",
                                                        "\\u00e9",
                                                        "\\ud83d\\ude00",
                                                        "\xc3\xa9",
                                                        "\xe2\x82\xac",
                                                        "\xf0\x9f\x98\x80",
                                                        "{",
                                                        "]",
                                                        ":",
                                                        ","};
        out += '"';
        for (int i = pick(5); i > 0; --i) out += kParts[static_cast<size_t>(pick(static_cast<int>(kParts.size())))];
        out += '"';
    }
    void number(std::string &out) {
        static const std::vector<std::string> kNumbers = {"0",      "-0",   "7",     "-12",   "3.25",
                                                          "0.5e10", "1E+2", "-4e-3", "100.0", "6.02E23"};
        out += kNumbers[static_cast<size_t>(pick(static_cast<int>(kNumbers.size())))];
    }
    void value(std::string &out, int depth) {
        switch (depth < 5 ? pick(7) : 2 + pick(5)) {
            case 0: object(out, depth + 1); break;
            case 1: array(out, depth + 1); break;
            case 2: string(out); break;
            case 3: number(out); break;
            case 4: out += "true"; break;
            case 5: out += "false"; break;
            default: out += "null"; break;
        }
    }
    void object(std::string &out, int depth) {
        out += '{';
        const int n = pick(4);
        for (int i = 0; i < n; ++i) {
            if (i > 0) out += ',';
            out += ws();
            string(out);
            out += ws() + ':' + ws();
            value(out, depth);
            out += ws();
        }
        if (n == 0) out += ws();
        out += '}';
    }
    void array(std::string &out, int depth) {
        out += '[';
        const int n = pick(4);
        for (int i = 0; i < n; ++i) {
            if (i > 0) out += ',';
            out += ws();
            value(out, depth);
            out += ws();
        }
        if (n == 0) out += ws();
        out += ']';
    }
};

bool nlohmann_object(const std::string &text) {
    if (!nlohmann::json::accept(text)) return false;
    return nlohmann::json::parse(text).is_object();
}

// Whether nlohmann refuses `text` only for a number beyond double's range (valid JSON, which the automaton reads).
bool number_overflow(const std::string &text) {
    try {
        const nlohmann::json parsed = nlohmann::json::parse(text);
        (void)parsed;
    } catch (const nlohmann::json::out_of_range &) {
        return true;
    } catch (const nlohmann::json::exception &) {}
    return false;
}

TEST(JsonPrefix, AcceptsWhatNlohmannAcceptsAndEveryPrefixOfIt) {
    Generator gen(1);
    for (int d = 0; d < 2000; ++d) {
        const std::string doc = gen.document();
        ASSERT_TRUE(nlohmann_object(doc)) << doc;
        JsonPrefix p;
        for (size_t i = 0; i < doc.size(); ++i) ASSERT_TRUE(p.feed(doc.substr(i, 1))) << "byte " << i << " of " << doc;
        EXPECT_TRUE(p.complete()) << doc;
        EXPECT_TRUE(reads_whole(doc)) << doc;
    }
}

TEST(JsonPrefix, MutationsAgreeWithNlohmann) {
    Generator gen(2);
    std::mt19937 rng(3);
    static const std::string kBytes = "{}[]\":,\\ \n-+.0123456789eEtrufalsnu\x01\x80\xbf\xc3\xe2\xed\xf0\xf4\xff";
    int whole = 0;
    for (int d = 0; d < 20000; ++d) {
        std::string text = gen.document();
        for (int m = 1 + static_cast<int>(rng() % 3); m > 0 && !text.empty(); --m) {
            const size_t at = rng() % text.size();
            const char b = kBytes[rng() % kBytes.size()];
            switch (rng() % 3) {
                case 0: text.erase(at, 1); break;
                case 1: text.insert(at, 1, b); break;
                default: text[at] = b; break;
            }
        }
        if (number_overflow(text)) continue;
        const bool want = nlohmann_object(text);
        ASSERT_EQ(reads_whole(text), want)
            << (want ? "nlohmann accepts " : "nlohmann refuses ")
            << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        whole += want ? 1 : 0;
    }
    EXPECT_GT(whole, 1000);  // the mutations leave some documents whole, and break most
}

TEST(JsonPrefix, RefusesWhatAnObjectCannotBecome) {
    for (const std::string bad : {"[1]",
                                  "\"a\"",
                                  "1",
                                  "true",
                                  "{,",
                                  "{\"a\" 1}",
                                  "{\"a\":}",
                                  "{\"a\":1,}",
                                  "{\"a\":01}",
                                  "{\"a\":1.}",
                                  "{\"a\":.5}",
                                  "{\"a\":+1}",
                                  "{\"a\":tru}",
                                  "{\"a\":\"\x01\"}",
                                  "{\"a\":\"\\x\"}",
                                  "{\"a\":\"\\ud800\"}",
                                  "{\"a\":\"\\udc00\"}",
                                  "{\"a\":\"\xc0\x80\"}",
                                  "{\"a\":\"\xed\xa0\x80\"}",
                                  "{} {}",
                                  "{}x",
                                  "{\"a\":1]",
                                  "{\"a\":[1}"}) {
        EXPECT_FALSE(reads_whole(bad)) << bad;
    }
    // Prefixes that are not whole yet: readable, not complete.
    for (const std::string part : {"", "  ", "{", "{\"a", "{\"a\":", "{\"a\":-", "{\"a\":1", "{\"a\":[", "{\"a\":tr",
                                   "{\"a\":\"\\u00", "{\"a\":\"\xe2\x82"}) {
        JsonPrefix p;
        EXPECT_TRUE(p.feed(part)) << part;
        EXPECT_FALSE(p.complete()) << part;
    }
    // Nesting and whitespace are bounded.
    std::string deep = "{\"a\":";
    for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += '[';
    JsonPrefix p;
    EXPECT_TRUE(p.feed(deep));
    EXPECT_FALSE(JsonPrefix(p).feed("["));
    EXPECT_TRUE(JsonPrefix(p).feed("1"));
    EXPECT_TRUE(reads_whole("{" + std::string(JsonPrefix::kMaxWhitespace, ' ') + "}"));
    EXPECT_FALSE(reads_whole("{" + std::string(JsonPrefix::kMaxWhitespace + 1, ' ') + "}"));
}

// Greedy picks of random logits through the mask over a toy vocabulary (token 0 ends generation; one token is
// empty, which never comes): every step's text is an object's beginning, and an end comes only after a whole one.
TEST(JsonConstraint, SamplingThroughTheMaskMakesObjects) {
    const std::vector<std::string> pieces = {"",   "",    "{",  "}",  "[",      "]",    "\"k\"", ":", ",",
                                             " ",  "1",   "-",  ".5", "true",   "nul",  "l",     "x", "\"",
                                             "ab", "\\n", "{}", "e3", "\"a\":", "\xc3", "\xa9"};
    std::vector<uint8_t> eog = {1};  // token 0
    eog.resize(pieces.size(), 0);
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    int ended = 0;
    for (int run = 0; run < 300; ++run) {
        JsonConstraint c(pieces, eog);
        std::string text;
        for (int step = 0; step < 200; ++step) {
            std::vector<float> logits(pieces.size());
            for (float &l : logits) l = u(rng);
            const int64_t n = c.mask(logits);
            ASSERT_GT(n, 0) << "nothing may follow " << text;
            const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
            ASSERT_TRUE(c.allows(best));
            EXPECT_NE(best, 1) << "an empty token was allowed";
            c.accept(best);
            if (best == 0) {
                EXPECT_TRUE(nlohmann_object(text)) << text;
                ++ended;
                break;
            }
            text += pieces[static_cast<size_t>(best)];
            JsonPrefix check;
            ASSERT_TRUE(check.feed(text)) << text;
        }
    }
    EXPECT_GT(ended, 30);  // some runs reach a whole object and end there
}

// JSON mode after a thinking block: before "</think>" any token may come but an end of generation (and one that
// ends the block with bytes that cannot begin an object); after its first occurrence the text is an object's
// beginning, and generation ends only on a whole one. The block's end comes whole or split over tokens.
TEST(JsonConstraint, AnObjectAfterTheThinkingBlock) {
    const std::vector<std::string> pieces = {"",   "</think>", "</th", "ink>", "</think>{",  "</think>x", "think",
                                             "<",  "/",        "{",    "}",    "\"k\":",     "1",         " ",
                                             "ab", ">",        "\"",   ",",    "</think>\n", ":"};
    std::vector<uint8_t> eog = {1};
    eog.resize(pieces.size(), 0);
    std::mt19937 rng(8);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    int objects = 0;
    for (int run = 0; run < 400; ++run) {
        JsonConstraint c(pieces, eog, {}, "</think>");
        std::string text;
        for (int step = 0; step < 120; ++step) {
            std::vector<float> logits(pieces.size());
            for (float &l : logits) l = u(rng);
            ASSERT_GT(c.mask(logits), 0) << text;
            const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
            const size_t end = text.find("</think>");
            if (end == std::string::npos) {
                EXPECT_NE(best, 0) << "an end before the thinking block closed: " << text;
            }
            c.accept(best);
            if (best == 0) {
                ASSERT_NE(end, std::string::npos);
                EXPECT_TRUE(nlohmann_object(text.substr(end + 8))) << text;
                ++objects;
                break;
            }
            text += pieces[static_cast<size_t>(best)];
            const size_t now = text.find("</think>");
            if (now != std::string::npos) {
                JsonPrefix check;
                ASSERT_TRUE(check.feed(text.substr(now + 8))) << text;
            }
        }
    }
    EXPECT_GT(objects, 20);
    // A token that closes the block and goes on with what cannot begin an object is refused; one that goes on with
    // the object's first bytes is taken.
    JsonConstraint c(pieces, eog, {}, "</think>");
    EXPECT_FALSE(c.allows(5));  // "</think>x"
    EXPECT_TRUE(c.allows(4));   // "</think>{"
    EXPECT_FALSE(c.allows(0));  // no end yet
    c.accept(2);                // "</th"
    EXPECT_TRUE(c.allows(9));   // "{" is still thinking text
    EXPECT_TRUE(c.allows(3));   // "ink>" ends the block across tokens
    c.accept(3);
    EXPECT_FALSE(c.allows(14));  // "ab": the object must begin now
    EXPECT_TRUE(c.allows(9));    // "{"
    EXPECT_FALSE(c.allows(0));   // and no end before it is whole
}

// The plain-string shortcut of the mask (tokens of plain characters taken inside a string without a trial) allows
// exactly what a trial of each token allows, in every state that prefixes of generated documents reach.
TEST(JsonConstraint, PlainShortcutAllowsWhatTrialsAllow) {
    Generator gen(5);
    std::mt19937 rng(6);
    static const std::string kChars = "ab {}[]\":,\\-.0123456789etrufalsn\x7f\x01\xc3\xa9\t\n";
    JsonVocabulary v;
    v.pieces = {"", "\"", "{", "}", "abc", "a b", "x\"", "\\n", "\xc3\xa9", "~!", "\x7f"};
    for (int i = 0; i < 300; ++i) {
        std::string p;
        for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n) p += kChars[rng() % kChars.size()];
        v.pieces.push_back(p);
    }
    v.eog.assign(v.pieces.size(), 0);
    v.eog[0] = 1;
    for (size_t i = 0; i < v.pieces.size(); ++i) v.plain.push_back(!v.eog[i] && JsonPrefix::plain(v.pieces[i]));
    EXPECT_TRUE(JsonPrefix::plain("abc") && JsonPrefix::plain("~!") && !JsonPrefix::plain("x\"") &&
                !JsonPrefix::plain("\x7f") && !JsonPrefix::plain(""));
    int in_string = 0;
    for (int d = 0; d < 300; ++d) {
        const std::string doc = gen.document();
        const size_t cut = rng() % (doc.size() + 1);
        // The cut's state, reached through one more token holding the whole prefix (with and without the flags).
        JsonPrefix state;
        ASSERT_TRUE(state.feed(doc.substr(0, cut)));
        std::vector<std::string> pieces = v.pieces;
        pieces.push_back(doc.substr(0, cut));
        std::vector<uint8_t> eog = v.eog, plain = v.plain;
        eog.push_back(0);
        plain.push_back(0);
        JsonConstraint a(pieces, eog, plain), b(pieces, eog);
        if (cut > 0) {
            a.accept(static_cast<int32_t>(pieces.size() - 1));
            b.accept(static_cast<int32_t>(pieces.size() - 1));
        }
        in_string += state.in_plain_string() ? 1 : 0;
        std::vector<float> la(pieces.size(), 0.0f), lb(pieces.size(), 0.0f);
        EXPECT_EQ(a.mask(la), b.mask(lb)) << doc.substr(0, cut);
        EXPECT_EQ(la, lb) << doc.substr(0, cut);
    }
    EXPECT_GT(in_string, 10);  // the cuts land inside strings often enough
}

}  // namespace
}  // namespace sparrow
