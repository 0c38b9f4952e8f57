// JSON Schema's "pattern" (an ECMAScript regular expression that must match somewhere in the string, unless
// anchored with ^ and $) as a small automaton over code points, for constrained sampling: the set of states a
// prefix of the string can be in, kept to the states from which the pattern can still match, so that an empty set
// means no continuation of the string can match.
//
// The subset: literals (UTF-8), '.', classes [...] with ranges and negation, \d \D \w \W \s \S, escapes (\n \t \r
// \f \v \0 \xHH \uHHHH and escaped punctuation), groups ( ) and (?: ), alternation |, the quantifiers * + ? {n}
// {n,} {n,m} (lazy forms match the same strings), ^ at the start and $ at the end. Lookarounds, backreferences,
// word boundaries and anchors elsewhere are refused, as are patterns needing more than kMaxStates states.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace sparrow {

class JsonPattern {
  public:
    static constexpr int kMaxStates = 128;
    // A set of automaton states (bit s: state s).
    struct States {
        uint64_t w[2] = {0, 0};
        bool empty() const { return (w[0] | w[1]) == 0; }
        bool has(int s) const { return (w[s >> 6] >> (s & 63)) & 1; }
        void add(int s) { w[s >> 6] |= uint64_t(1) << (s & 63); }
    };

    // Compiles `pattern`; throws (core/error.h) naming what is not supported.
    static JsonPattern compile(std::string_view pattern);

    // Before any character.
    States start() const { return start_; }
    // The states after code point `cp` (empty: no continuation can match).
    States step(const States &from, uint32_t cp) const;
    // Whether some code point in [lo, hi] can follow (a character whose first bytes or digits are read so far).
    bool can_step(const States &from, uint32_t lo, uint32_t hi) const;
    // Whether the string read so far matches.
    bool matches(const States &s) const { return ((s.w[0] & accept_.w[0]) | (s.w[1] & accept_.w[1])) != 0; }
    // Whether a whole UTF-8 string matches (tests and whole-document checks).
    bool matches(std::string_view utf8) const;

  private:
    friend class JsonPatternCompiler;
    // Per state, its moves: code point ranges [lo, hi] and the states they lead to (closed over empty moves, and
    // kept to live states: those from which an accepting state can be reached).
    struct Move {
        uint32_t lo, hi;
        int to;
    };
    std::vector<std::vector<Move>> moves_;
    States start_, accept_;
};

}  // namespace sparrow
