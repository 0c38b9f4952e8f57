// GBNF grammars (llama.cpp's `grammar` request field and `--grammar` flag): the reply must be a text the grammar's
// `root` rule derives.
//
// Grammar compiles the text into a table of elements: each rule is a list of alternatives, each alternative a run of
// elements (a character class over code points, or a reference to a rule) closed by an `end` element. Groups and
// repetitions become rules of their own (x* is r ::= x r | empty, x{2,4} is x x (x (x)?)?). Alternatives that can
// derive no finite text are dropped when compiling, so every prefix the matcher allows can be finished.
//
// GrammarAutomaton reads code points. Its state is a set of stacks (a pushdown automaton's: each stack is where the
// parse stands in its rule, with the places to return to below it), kept as interned frames so that equal stacks are
// one number; sets of stacks are interned too and each (state, code point) step is cached, which makes it a DFA
// built lazily: after the first few tokens most steps are one lookup.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sparrow {

// What a grammar's token matches (<think>, <[12]>) are resolved against: a token's id from its exact text (-1: none)
// and the vocabulary's size.
struct TokenLookup {
    std::function<int32_t(std::string_view)> find;
    int32_t n_vocab = 0;
};

class Grammar {
  public:
    // Compiles GBNF text (rules `name ::= alternatives`, "literals" with \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH
    // escapes, [classes] and [^negated] ones, `.` for any character, ( groups ), * + ? {m} {m,} {m,n}, # comments,
    // and token matches: <[id]>, <text> for the one token with exactly that text, !<...> for any token but that one);
    // throws Error naming the line and column of what is wrong, a rule used but not defined, left recursion, a root
    // that derives no finite text, or a token match without `tokens` or not in them.
    static Grammar parse(std::string_view text, const TokenLookup *tokens = nullptr);

    // token: a whole token, first its id (negated: any token but that one).
    enum class Kind : uint8_t { end, chars, rule, token };
    struct Range {
        uint32_t lo, hi;  // inclusive code points
    };
    struct Element {
        Kind kind = Kind::end;
        bool negated = false;  // chars: matches the code points outside its ranges; token: any token but `first`
        uint32_t first = 0;    // chars: the first of its ranges (sorted, disjoint); rule: the rule's index; token: id
        uint32_t count = 0;    // chars: how many ranges
    };

    std::span<const Element> elements() const { return elements_; }
    // Index in elements() of the first element of each of the rule's alternatives.
    std::span<const uint32_t> alternatives(uint32_t rule) const {
        return std::span<const uint32_t>(alt_starts_)
            .subspan(rule_alts_[rule], rule_alts_[rule + 1] - rule_alts_[rule]);
    }
    uint32_t root() const { return root_; }
    size_t n_rules() const { return rule_alts_.size() - 1; }
    const std::string &rule_name(uint32_t rule) const { return names_[rule]; }

    // Whether a chars element takes code point `cp`, or some code point in [lo, hi].
    bool matches(const Element &e, uint32_t cp) const;
    bool matches_any(const Element &e, uint32_t lo, uint32_t hi) const;

    // Limits: elements after repetitions are expanded, and a repetition's count.
    static constexpr size_t kMaxElements = size_t{1} << 18;
    static constexpr uint32_t kMaxRepeat = 10000;

  private:
    friend class GrammarBuilder;
    std::vector<Element> elements_;
    std::vector<Range> ranges_;
    std::vector<uint32_t> alt_starts_;
    std::vector<uint32_t> rule_alts_;  // rule r's alternatives are alt_starts_[rule_alts_[r] .. rule_alts_[r + 1])
    std::vector<std::string> names_;
    uint32_t root_ = 0;
};

// Code-point matching over a Grammar (which must outlive it). States are small integers; kDead is no state.
class GrammarAutomaton {
  public:
    explicit GrammarAutomaton(const Grammar &g);

    static constexpr uint32_t kDead = UINT32_MAX;
    // Stacks nested deeper than this (recursion that is not a tail call) are not followed, a state keeps at most
    // kMaxStacks stacks and a step expands at most kMaxExpansion (element, stack) pairs (an ambiguous grammar's
    // parses are cut to the first ones): the automaton's time and memory per step stay bounded.
    static constexpr uint32_t kMaxDepth = 1024;
    static constexpr size_t kMaxStacks = 1024;
    static constexpr size_t kMaxExpansion = size_t{1} << 15;

    uint32_t start() const { return start_; }
    // The state after a whole token matched by a token element, or kDead when none takes it.
    uint32_t step_token(uint32_t state, int32_t token);
    // The state holding both states' stacks (either may be kDead).
    uint32_t merge(uint32_t a, uint32_t b);
    // Calls f(id, negated) for each token element a stack of `state` waits on.
    template <class F>
    void for_each_token_element(uint32_t state, F &&f) const {
        for (const uint32_t top : states_[state]) {
            if (top == kAccept) continue;
            const Grammar::Element &e = g_->elements()[frames_[top].pos];
            if (e.kind == Grammar::Kind::token) f(static_cast<int32_t>(e.first), e.negated);
        }
    }
    // Some stack waits on a token element.
    bool waits_on_tokens(uint32_t state) const { return has_token_tops_[state] != 0; }
    // The state after `cp`, or kDead when no stack takes it.
    uint32_t step(uint32_t state, uint32_t cp) {
        const size_t at = static_cast<size_t>(state) * 128 + cp;
        if (cp < 128 && at < ascii_steps_.size() && ascii_steps_[at] != kUnknown) return ascii_steps_[at];
        return step_uncached(state, cp);
    }
    // The text read so far is a whole derivation of root.
    bool accepting(uint32_t state) const { return accepting_[state] != 0; }
    // Some stack takes a code point in [lo, hi] (the code points a partial UTF-8 sequence may still become).
    bool takes_any(uint32_t state, uint32_t lo, uint32_t hi) const;
    // How much the caches hold; compact() drops them all but `keep`'s stacks and returns keep's new number.
    size_t cached() const {
        return frames_.size() + steps_.size() + token_steps_.size() + ascii_steps_.size() / 16 + subset_bytes_ / 16;
    }
    uint32_t compact(uint32_t keep);
    static constexpr size_t kMaxCached = size_t{1} << 19;

  private:
    struct Frame {
        uint32_t pos;     // elements() index: a chars element (a stack's top) or where to go on return
        uint32_t parent;  // the frame below, or kBottom
        uint32_t depth;
    };
    static constexpr uint32_t kBottom = UINT32_MAX;
    static constexpr uint32_t kAccept = UINT32_MAX - 1;  // a stack that has derived all of root (in a state's set)

    uint32_t frame(uint32_t pos, uint32_t parent);
    // Adds to `out` the stacks (top frames at chars elements, or kAccept) that `pos` over `parent` stands for; the
    // expansions of one step share start_expansion()'s memory of what was expanded and its budget.
    void start_expansion() {
        seen_.clear();
        budget_ = kMaxExpansion;
    }
    void expand(uint32_t pos, uint32_t parent, std::vector<uint32_t> &out);
    uint32_t intern_state(std::vector<uint32_t> &tops);
    uint32_t copy_frame(const std::vector<Frame> &from, uint32_t id);

    const Grammar *g_;
    std::vector<Frame> frames_;
    std::unordered_map<uint64_t, uint32_t> frame_ids_;  // (pos, parent) -> frame
    std::vector<std::vector<uint32_t>> states_;         // sorted top frames of each state
    std::vector<uint8_t> accepting_;
    std::vector<uint8_t> has_token_tops_;
    std::unordered_map<std::string, uint32_t> state_ids_;  // a state's tops as bytes -> state
    std::unordered_map<uint64_t, uint32_t> steps_;         // (state, code point) -> state, beyond ASCII
    std::unordered_map<uint64_t, uint32_t> token_steps_;   // (state, token) -> state
    // (state, the stacks that take a code point) -> state: one expansion for all the code points they take
    std::unordered_map<std::string, uint32_t> subset_steps_;
    size_t subset_bytes_ = 0;
    // ASCII steps (most of a vocabulary's bytes) in a table: state * 128 + code point -> state, kUnknown before the
    // first.
    std::vector<uint32_t> ascii_steps_;
    static constexpr uint32_t kUnknown = UINT32_MAX - 1;
    uint32_t step_uncached(uint32_t state, uint32_t cp);
    uint32_t compute_step(uint32_t state, uint32_t cp);
    uint32_t start_ = kDead;
    // expand()'s scratch: the (pos, parent) pairs seen in one expansion, and its work list.
    std::unordered_map<uint64_t, uint8_t> seen_;
    std::vector<std::pair<uint32_t, uint32_t>> work_;
    size_t budget_ = 0;
};

// A UTF-8 reader for GrammarAutomaton: where the text stands, including a code point whose bytes are not all in.
struct GrammarCursor {
    uint32_t state = GrammarAutomaton::kDead;
    uint32_t partial = 0;  // the bits of the code point read so far
    uint8_t need = 0;      // continuation bytes still to come
    uint8_t length = 0;    // the code point's length in bytes
    // Reads one byte; false when it cannot continue the text (invalid UTF-8, or nothing in the grammar takes it).
    bool feed(GrammarAutomaton &a, uint8_t byte) {
        if (byte < 0x80 && need == 0 && state != GrammarAutomaton::kDead) {
            state = a.step(state, byte);
            return state != GrammarAutomaton::kDead;
        }
        return feed_multibyte(a, byte);
    }
    bool feed(GrammarAutomaton &a, std::string_view bytes) {
        for (const char c : bytes)
            if (!feed(a, static_cast<uint8_t>(c))) return false;
        return true;
    }
    bool feed_multibyte(GrammarAutomaton &a, uint8_t byte);
    bool complete(const GrammarAutomaton &a) const {
        return need == 0 && state != GrammarAutomaton::kDead && a.accepting(state);
    }
};

}  // namespace sparrow
