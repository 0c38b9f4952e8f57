// A small regex engine for the pre-tokenizer patterns of BPE vocabularies (std::regex knows no \p{..}).
//
// Supported syntax: literals (UTF-8 or \x{HHHH}), '.', character classes [...] / [^...] with ranges and the
// escapes below, \s \S \d \D, \p{X} \P{X} for the general categories L N P S M Z C and the two-letter ones
// (Lu, Nd, ...), \r \n \t \f \v, escaped punctuation, groups (...) and (?:...) (nothing is captured),
// lookaheads (?=...) (?!...), alternation, greedy quantifiers ? * + {n} {n,} {n,m}, and the anchors ^ $ (at the
// ends of the text being split). Semantics follow ECMAScript/Perl: leftmost match, alternatives tried in order.
// \s is the Unicode White_Space property and \d is ASCII 0-9 (as std::regex in the C locale has it).
//
// Matching is a backtracking machine over compiled instructions with a visited bit per (split instruction,
// position), kept for the whole text being split. A pattern that cannot match the empty string never needs to
// revisit a state that failed before, even from a later start position, so splitting a text of n code points
// costs O(n * number of split instructions) at worst: no quadratic blow-up on long runs of spaces or letters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/unicode.h"

namespace sparrow::unicode {

class Regex {
  public:
    // Throws sparrow::Error on a syntax error or on a pattern that can match the empty string.
    explicit Regex(std::string_view pattern);

    // Splits code points [begin, end) of `text` into the matches of the pattern and the gaps between them
    // (both kept, in order, as by a regex split with "isolated" behaviour): appends the end index of each piece
    // to `piece_ends`. The text outside [begin, end) is invisible to the match ($ and lookaheads stop at end).
    void split(const CodepointText &text, uint32_t begin, uint32_t end, std::vector<uint32_t> &piece_ends) const;

    const std::string &pattern() const { return pattern_; }

    enum class Op : uint8_t { Char, Class, Any, Split, Jmp, AssertBegin, AssertEnd, Look, Match };
    struct Inst {
        Op op = Op::Match;
        bool negate = false;  // Look: negative lookahead
        int32_t x = 0;        // Char: code point; Class: class index; Split/Jmp: preferred target; Look: body start
        int32_t y = 0;        // Split: the alternative target
        int32_t split_index = -1;  // Split: row of the visited bitmap
    };
    struct CharClass {
        bool negated = false;
        bool space = false;                                 // contains White_Space (\s)
        uint32_t categories = 0;                            // bit per unicode::Category
        std::vector<std::pair<uint32_t, uint32_t>> ranges;  // sorted, disjoint, inclusive
        bool contains(uint32_t cp, uint8_t cls) const;
    };

  private:
    struct Matcher;
    std::string pattern_;
    std::vector<Inst> code_;  // main program from 0; lookahead bodies follow, each ending with Match
    std::vector<CharClass> classes_;
    int32_t n_splits_ = 0;
    friend class RegexCompiler;
};

}  // namespace sparrow::unicode
