#include "runtime/grammar.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"

namespace sparrow {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// One element while parsing: a class of code points or a rule reference.
struct Symbol {
    Grammar::Kind kind = Grammar::Kind::chars;
    bool negated = false;
    std::vector<Grammar::Range> ranges;
    uint32_t rule = 0;
};
using Sequence = std::vector<Symbol>;

// Whether a class (sorted, disjoint `ranges`, or the code points outside them when `negated`) takes a code point in
// [lo, hi].
bool ranges_take_any(std::span<const Grammar::Range> ranges, bool negated, uint32_t lo, uint32_t hi) {
    if (!negated) {
        return std::any_of(ranges.begin(), ranges.end(), [&](Grammar::Range r) { return r.lo <= hi && r.hi >= lo; });
    }
    uint32_t next = lo;  // the first code point of [lo, hi] not yet known to be covered
    for (const Grammar::Range r : ranges) {
        if (r.hi < next) continue;
        if (r.lo > next) return true;
        if (r.hi >= hi) return false;
        next = r.hi + 1;
    }
    return next <= hi;
}

Symbol char_symbol(uint32_t cp) { return Symbol{Grammar::Kind::chars, false, {{cp, cp}}, 0}; }
Symbol rule_symbol(uint32_t rule) { return Symbol{Grammar::Kind::rule, false, {}, rule}; }

bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

}  // namespace

// Parses GBNF text into rules of sequences, then compiles them into Grammar's tables.
class GrammarBuilder {
  public:
    GrammarBuilder(std::string_view text, const TokenLookup *tokens) : text_(text), tokens_(tokens) {}

    Grammar build() {
        skip_space(true);
        while (pos_ < text_.size()) {
            parse_rule();
            skip_space(true);
        }
        if (rules_.empty()) throw_error("grammar: no rules");
        for (uint32_t r = 0; r < rules_.size(); ++r)
            if (!defined_[r])
                throw_error("grammar: rule '%s' is used (line %zu) but not defined", names_[r].c_str(),
                            first_use_line_[r]);
        const auto root = ids_.find("root");
        if (root == ids_.end()) throw_error("grammar: no 'root' rule");
        drop_unproductive(root->second);
        check_left_recursion();
        return compile(root->second);
    }

  private:
    std::string_view text_;
    const TokenLookup *tokens_;
    size_t pos_ = 0;
    std::vector<std::vector<Sequence>> rules_;
    std::vector<std::string> names_;
    std::vector<uint8_t> defined_;
    std::vector<size_t> first_use_line_;
    std::map<std::string, uint32_t, std::less<>> ids_;
    size_t n_symbols_ = 0;
    size_t line_ = 1, line_counted_ = 0;  // line(): the line at line_counted_
    int nesting_ = 0;                     // open groups: the parser recurses into each, so its depth is bounded
    static constexpr int kMaxNesting = 64;

    [[noreturn]] void fail(const char *what) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
            if (text_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        throw_error("grammar: line %zu, column %zu: %s", line, col, what);
    }
    // The line pos_ is on, counted on from the last call (the parser only moves forward): every rule made records
    // it, and recounting from the start each time made a long grammar's compile quadratic.
    size_t line() {
        if (pos_ < line_counted_) {  // moved back (only to report an error): count from the start
            line_ = 1;
            line_counted_ = 0;
        }
        line_ += static_cast<size_t>(std::count(text_.begin() + static_cast<std::ptrdiff_t>(line_counted_),
                                                text_.begin() + static_cast<std::ptrdiff_t>(pos_), '\n'));
        line_counted_ = pos_;
        return line_;
    }
    bool at_end() const { return pos_ >= text_.size(); }
    char peek() const { return at_end() ? '\0' : text_[pos_]; }

    // Spaces, tabs and comments; newlines too where `newlines` (between rules, inside groups, after | and ::=).
    void skip_space(bool newlines) {
        while (!at_end()) {
            const char c = text_[pos_];
            if (c == '#') {
                while (!at_end() && text_[pos_] != '\n') ++pos_;
            } else if (c == ' ' || c == '\t' || ((c == '\r' || c == '\n') && newlines)) {
                ++pos_;
            } else {
                return;
            }
        }
    }

    uint32_t rule_id(std::string_view name) {
        if (const auto it = ids_.find(name); it != ids_.end()) return it->second;
        const auto id = static_cast<uint32_t>(rules_.size());
        ids_.emplace(std::string(name), id);
        rules_.emplace_back();
        names_.emplace_back(name);
        defined_.push_back(0);
        first_use_line_.push_back(line());
        return id;
    }
    // A rule made for a group or a repetition (its name, for messages, cannot clash with a user's).
    uint32_t new_rule(std::vector<Sequence> alternatives, const char *kind) {
        charge(2);  // the rule's entries, and its alternatives' ends (its symbols were charged as they came)
        const auto id = static_cast<uint32_t>(rules_.size());
        rules_.push_back(std::move(alternatives));
        names_.push_back(std::string(kind) + " at line " + std::to_string(line()));
        defined_.push_back(1);
        first_use_line_.push_back(line());
        return id;
    }

    std::string_view parse_name() {
        const size_t begin = pos_;
        while (!at_end() && is_name_char(text_[pos_])) ++pos_;
        if (pos_ == begin) fail("expected a rule name");
        return text_.substr(begin, pos_ - begin);
    }

    void parse_rule() {
        const std::string_view name = parse_name();
        const uint32_t id = rule_id(name);
        if (defined_[id]) fail(("rule '" + std::string(name) + "' is defined twice").c_str());
        skip_space(false);
        if (text_.substr(pos_, 3) != "::=") fail("expected '::=' after the rule name");
        pos_ += 3;
        skip_space(true);
        rules_[id] = parse_alternatives(false);
        defined_[id] = 1;
        skip_space(false);
        if (!at_end() && peek() != '\n' && peek() != '\r') fail("expected the end of the line after the rule");
    }

    std::vector<Sequence> parse_alternatives(bool nested) {
        std::vector<Sequence> alts;
        alts.push_back(parse_sequence(nested));
        while (peek() == '|') {
            ++pos_;
            skip_space(true);
            alts.push_back(parse_sequence(nested));
        }
        return alts;
    }

    // A code point from a literal or class: UTF-8 text or an escape.
    uint32_t parse_char() {
        if (at_end()) fail("unexpected end of the grammar");
        const auto c = static_cast<uint8_t>(text_[pos_]);
        if (c == '\\') {
            ++pos_;
            if (at_end()) fail("unexpected end of the grammar after '\\'");
            const char e = text_[pos_++];
            switch (e) {
                case 'n': return '\n';
                case 'r': return '\r';
                case 't': return '\t';
                case '\\':
                case '"':
                case '[':
                case ']':
                case '-':
                case '^':
                case '/':
                case '.':
                case '\'': return static_cast<uint8_t>(e);
                case 'x': return parse_hex(2);
                case 'u': return parse_hex(4);
                case 'U': return parse_hex(8);
                default: --pos_; fail("unknown escape");
            }
        }
        // UTF-8 text: the grammar's own characters.
        const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || pos_ + static_cast<size_t>(len) > text_.size()) fail("invalid UTF-8");
        uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
        for (int i = 1; i < len; ++i) {
            const auto b = static_cast<uint8_t>(text_[pos_ + static_cast<size_t>(i)]);
            if ((b & 0xC0) != 0x80) fail("invalid UTF-8");
            cp = (cp << 6) | (b & 0x3F);
        }
        pos_ += static_cast<size_t>(len);
        return cp;
    }
    uint32_t parse_hex(int digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
            const char h = peek();
            const int d = h >= '0' && h <= '9'   ? h - '0'
                          : h >= 'a' && h <= 'f' ? h - 'a' + 10
                          : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                 : -1;
            if (d < 0) fail("expected a hexadecimal digit in the escape");
            v = v * 16 + static_cast<uint32_t>(d);
            ++pos_;
        }
        if (v > kMaxCodePoint) fail("escape beyond the last code point (U+10FFFF)");
        return v;
    }

    Symbol parse_class() {
        ++pos_;  // '['
        Symbol s;
        if (peek() == '^') {
            s.negated = true;
            ++pos_;
        }
        while (peek() != ']') {
            if (at_end()) fail("unterminated character class");
            const uint32_t lo = parse_char();
            uint32_t hi = lo;
            if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
                ++pos_;
                hi = parse_char();
                if (hi < lo) fail("character range out of order");
            }
            s.ranges.push_back({lo, hi});
        }
        ++pos_;
        if (s.ranges.empty() && !s.negated) fail("empty character class");
        std::sort(s.ranges.begin(), s.ranges.end(), [](auto a, auto b) { return a.lo < b.lo; });
        std::vector<Grammar::Range> merged;
        for (const auto r : s.ranges) {
            if (!merged.empty() && r.lo <= merged.back().hi + 1) {
                merged.back().hi = std::max(merged.back().hi, r.hi);
            } else {
                merged.push_back(r);
            }
        }
        s.ranges = std::move(merged);
        return s;
    }

    // <[id]>, <text> (the one token whose text is exactly "<text>"), or either after ! (any token but that one).
    Symbol parse_token() {
        Symbol s;
        s.kind = Grammar::Kind::token;
        if (peek() == '!') {
            s.negated = true;
            ++pos_;
        }
        if (peek() != '<') fail("expected '<' after '!'");
        if (!tokens_) fail("token matches (<...>) need the model's vocabulary");
        const size_t begin = pos_;
        const size_t close = text_.find('>', begin + 1);
        if (close == std::string_view::npos || text_.substr(begin, close - begin).find('\n') != std::string_view::npos)
            fail("unterminated token match (expected '>')");
        const std::string_view inner = text_.substr(begin + 1, close - begin - 1);
        int64_t id = -1;
        if (inner.size() > 2 && inner.front() == '[' && inner.back() == ']') {
            id = 0;
            for (const char d : inner.substr(1, inner.size() - 2)) {
                if (d < '0' || d > '9') fail("a token id must be a number: <[123]>");
                id = id * 10 + (d - '0');
                if (id >= tokens_->n_vocab) break;
            }
            if (id >= tokens_->n_vocab) fail("token id beyond the vocabulary");
        } else {
            id = tokens_->find(text_.substr(begin, close - begin + 1));
            if (id < 0) fail("no token of the vocabulary has exactly this text");
        }
        pos_ = close + 1;
        s.rule = static_cast<uint32_t>(id);
        return s;
    }

    uint32_t parse_count() {
        skip_space(false);
        uint64_t v = 0;
        const size_t begin = pos_;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + static_cast<uint64_t>(peek() - '0');
            if (v > Grammar::kMaxRepeat) fail("repetition count too large (at most 10000)");
            ++pos_;
        }
        if (pos_ == begin) fail("expected a number in the repetition");
        skip_space(false);
        return static_cast<uint32_t>(v);
    }

    // `item` repeated min to max times (max UINT32_MAX: unbounded), appended to `seq`.
    void repeat(Sequence &seq, Sequence item, uint32_t min, uint32_t max) {
        if (item.size() != 1) item = Sequence{rule_symbol(new_rule({std::move(item)}, "literal"))};
        const Symbol x = item[0];
        for (uint32_t i = 0; i < min; ++i) add(seq, x);
        if (max == UINT32_MAX) {  // star: r ::= x r | empty
            const uint32_t r = new_rule({}, "repetition");
            charge(2);
            rules_[r] = {Sequence{x, rule_symbol(r)}, Sequence{}};
            add(seq, rule_symbol(r));
        } else if (max > min) {  // up to max - min more, nested: o_k ::= x o_(k-1) | empty
            charge(1);
            uint32_t inner = new_rule({Sequence{x}, Sequence{}}, "optional");
            for (uint32_t k = 1; k < max - min; ++k) {
                charge(2);
                inner = new_rule({Sequence{x, rule_symbol(inner)}, Sequence{}}, "optional");
            }
            add(seq, rule_symbol(inner));
        }
    }
    void add(Sequence &seq, Symbol s) {
        charge(1);
        seq.push_back(std::move(s));
    }
    // Every symbol and rule made counts against Grammar::kMaxElements: repetitions expand, and a short text could
    // otherwise ask for millions of rules.
    void charge(size_t n) {
        n_symbols_ += n;
        if (n_symbols_ > Grammar::kMaxElements) fail("grammar too large after expanding repetitions");
    }

    Sequence parse_sequence(bool nested) {
        Sequence seq;
        for (;;) {
            skip_space(nested);
            const char c = peek();
            Sequence item;
            if (c == '"') {
                ++pos_;
                while (peek() != '"') {
                    if (at_end() || peek() == '\n') fail("unterminated string literal");
                    item.push_back(char_symbol(parse_char()));
                }
                ++pos_;
            } else if (c == '[') {
                item.push_back(parse_class());
            } else if (c == '.') {
                ++pos_;
                item.push_back(Symbol{Grammar::Kind::chars, true, {}, 0});
            } else if (c == '(') {
                if (++nesting_ > kMaxNesting) fail("groups nested too deeply (at most 64 levels)");
                ++pos_;
                skip_space(true);
                std::vector<Sequence> alts = parse_alternatives(true);
                skip_space(true);
                if (peek() != ')') fail("expected ')'");
                ++pos_;
                item.push_back(rule_symbol(new_rule(std::move(alts), "group")));
                --nesting_;
            } else if (c == '<' || c == '!') {
                item.push_back(parse_token());
            } else if (is_name_char(c)) {
                const size_t save = pos_;
                const std::string_view name = parse_name();
                // The next rule's `name ::=`: this sequence ended at the line before (only when nested can a name
                // be followed by ::= on the same logical line, which is an error below).
                size_t look = pos_;
                while (look < text_.size() && (text_[look] == ' ' || text_[look] == '\t')) ++look;
                if (text_.substr(look, 3) == "::=") {
                    pos_ = save;
                    fail("expected the end of the line before the next rule");
                }
                item.push_back(rule_symbol(rule_id(name)));
            } else {
                break;
            }
            // Postfix repetition.
            const char op = peek();
            if (op == '*') {
                ++pos_;
                repeat(seq, std::move(item), 0, UINT32_MAX);
            } else if (op == '+') {
                ++pos_;
                repeat(seq, std::move(item), 1, UINT32_MAX);
            } else if (op == '?') {
                ++pos_;
                repeat(seq, std::move(item), 0, 1);
            } else if (op == '{') {
                ++pos_;
                const uint32_t min = parse_count();
                uint32_t max = min;
                if (peek() == ',') {
                    ++pos_;
                    skip_space(false);
                    max = peek() == '}' ? UINT32_MAX : parse_count();
                }
                if (peek() != '}') fail("expected '}' closing the repetition");
                ++pos_;
                if (max < min) fail("repetition's maximum below its minimum");
                repeat(seq, std::move(item), min, max);
            } else {
                for (auto &s : item) add(seq, std::move(s));
            }
        }
        return seq;
    }

    // A class no valid code point (a surrogate is not one) can match.
    static bool empty_class(const Symbol &s) {
        return !ranges_take_any(s.ranges, s.negated, 0, 0xD7FF) &&
               !ranges_take_any(s.ranges, s.negated, 0xE000, kMaxCodePoint);
    }

    // Rules that derive some finite text (a least fixed point); alternatives using any other are dropped, so that
    // every stack the automaton builds can still finish. The root must be one of them.
    void drop_unproductive(uint32_t root) {
        std::vector<uint8_t> productive(rules_.size(), 0);
        const auto seq_ok = [&](const Sequence &s) {
            return std::all_of(s.begin(), s.end(), [&](const Symbol &x) {
                if (x.kind == Grammar::Kind::token) return true;
                return x.kind == Grammar::Kind::rule ? productive[x.rule] != 0 : !empty_class(x);
            });
        };
        for (bool changed = true; changed;) {
            changed = false;
            for (uint32_t r = 0; r < rules_.size(); ++r) {
                if (productive[r]) continue;
                if (std::any_of(rules_[r].begin(), rules_[r].end(), seq_ok)) {
                    productive[r] = 1;
                    changed = true;
                }
            }
        }
        if (!productive[root]) throw_error("grammar: 'root' derives no finite text");
        for (auto &alts : rules_) std::erase_if(alts, [&](const Sequence &s) { return !seq_ok(s); });
    }

    // Left recursion (a rule reachable from itself before any character, through rules that may be empty) would
    // make the automaton's expansion endless: refused, as llama.cpp does.
    void check_left_recursion() const {
        const size_t n = rules_.size();
        std::vector<uint8_t> nullable(n, 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                for (const auto &s : rules_[r]) {
                    if (std::all_of(s.begin(), s.end(), [&](const Symbol &x) {
                            return x.kind == Grammar::Kind::rule && nullable[x.rule];
                        })) {
                        nullable[r] = 1;
                        changed = true;
                        break;
                    }
                }
            }
        }
        // Edges r -> s: r may begin with s (what comes before s in an alternative may be empty). Coming back to a
        // rule that way is harmless when every reference on the way ends its alternative (a tail call: the
        // automaton returns straight to the caller, so x* with an x that may be empty only revisits a stack it has
        // seen), and endless otherwise: the stack would grow before any character. Such a cycle is a non-tail edge
        // inside a strongly connected component (Tarjan's, without recursion).
        struct Edge {
            uint32_t to;
            bool tail;
        };
        std::vector<std::vector<Edge>> edges(n);
        for (size_t r = 0; r < n; ++r) {
            for (const auto &seq : rules_[r]) {
                for (size_t i = 0; i < seq.size() && seq[i].kind == Grammar::Kind::rule; ++i) {
                    edges[r].push_back({seq[i].rule, i + 1 == seq.size()});
                    if (!nullable[seq[i].rule]) break;
                }
            }
        }
        constexpr uint32_t kUnvisited = UINT32_MAX;
        std::vector<uint32_t> index(n, kUnvisited), low(n, 0), component(n, kUnvisited);
        std::vector<uint8_t> on_stack(n, 0);
        std::vector<uint32_t> stack;
        std::vector<std::pair<uint32_t, size_t>> calls;  // (rule, next edge to follow)
        uint32_t counter = 0, n_components = 0;
        for (uint32_t root = 0; root < n; ++root) {
            if (index[root] != kUnvisited) continue;
            calls.emplace_back(root, 0);
            index[root] = low[root] = counter++;
            stack.push_back(root);
            on_stack[root] = 1;
            while (!calls.empty()) {
                auto &[v, next] = calls.back();
                if (next < edges[v].size()) {
                    const uint32_t w = edges[v][next++].to;
                    if (index[w] == kUnvisited) {
                        index[w] = low[w] = counter++;
                        stack.push_back(w);
                        on_stack[w] = 1;
                        calls.emplace_back(w, 0);
                    } else if (on_stack[w]) {
                        low[v] = std::min(low[v], index[w]);
                    }
                    continue;
                }
                const uint32_t done = v;
                calls.pop_back();
                if (!calls.empty()) low[calls.back().first] = std::min(low[calls.back().first], low[done]);
                if (low[done] == index[done]) {
                    for (uint32_t w = kUnvisited; w != done;) {
                        w = stack.back();
                        stack.pop_back();
                        on_stack[w] = 0;
                        component[w] = n_components;
                    }
                    ++n_components;
                }
            }
        }
        for (size_t r = 0; r < n; ++r) {
            for (const Edge &e : edges[r]) {
                if (!e.tail && component[e.to] == component[r])
                    throw_error(
                        "grammar: rule '%s' is left-recursive (it can come back to itself before any character)",
                        names_[e.to].c_str());
            }
        }
    }

    Grammar compile(uint32_t root) {
        Grammar g;
        g.root_ = root;
        g.names_ = names_;
        g.rule_alts_.push_back(0);
        for (const auto &alts : rules_) {
            for (const auto &s : alts) {
                g.alt_starts_.push_back(static_cast<uint32_t>(g.elements_.size()));
                for (const auto &x : s) {
                    Grammar::Element e;
                    e.kind = x.kind;
                    e.negated = x.negated;
                    if (x.kind == Grammar::Kind::rule || x.kind == Grammar::Kind::token) {
                        e.first = x.rule;  // the rule's index, or the token's id
                    } else {
                        e.first = static_cast<uint32_t>(g.ranges_.size());
                        e.count = static_cast<uint32_t>(x.ranges.size());
                        g.ranges_.insert(g.ranges_.end(), x.ranges.begin(), x.ranges.end());
                    }
                    g.elements_.push_back(e);
                }
                g.elements_.push_back(Grammar::Element{});
            }
            g.rule_alts_.push_back(static_cast<uint32_t>(g.alt_starts_.size()));
        }
        return g;
    }
};

Grammar Grammar::parse(std::string_view text, const TokenLookup *tokens) {
    return GrammarBuilder(text, tokens).build();
}

bool Grammar::matches(const Element &e, uint32_t cp) const {
    bool in = false;
    for (uint32_t i = 0; i < e.count && !in; ++i) {
        const Range r = ranges_[e.first + i];
        if (cp < r.lo) break;
        in = cp <= r.hi;
    }
    return in != e.negated;
}

bool Grammar::matches_any(const Element &e, uint32_t lo, uint32_t hi) const {
    return ranges_take_any(std::span<const Range>(ranges_).subspan(e.first, e.count), e.negated, lo, hi);
}

GrammarAutomaton::GrammarAutomaton(const Grammar &g) : g_(&g) {
    std::vector<uint32_t> tops;
    start_expansion();
    for (const uint32_t alt : g.alternatives(g.root())) expand(alt, kBottom, tops);
    start_ = intern_state(tops);
}

uint32_t GrammarAutomaton::frame(uint32_t pos, uint32_t parent) {
    const uint64_t key = (static_cast<uint64_t>(pos) << 32) | parent;
    const auto [it, fresh] = frame_ids_.try_emplace(key, static_cast<uint32_t>(frames_.size()));
    if (fresh) frames_.push_back({pos, parent, parent == kBottom ? 1 : frames_[parent].depth + 1});
    return it->second;
}

void GrammarAutomaton::expand(uint32_t pos, uint32_t parent, std::vector<uint32_t> &out) {
    const auto elements = g_->elements();
    work_.clear();
    work_.emplace_back(pos, parent);
    while (!work_.empty() && budget_ > 0) {
        const auto [p, up] = work_.back();
        work_.pop_back();
        // An element over a given stack expands the same way each time: once per step is enough (paths through
        // rules that may be empty would otherwise multiply).
        if (!seen_.try_emplace((static_cast<uint64_t>(p) << 32) | up, 1).second) continue;
        --budget_;
        const Grammar::Element &e = elements[p];
        if (e.kind == Grammar::Kind::chars || e.kind == Grammar::Kind::token) {
            out.push_back(frame(p, up));
        } else if (e.kind == Grammar::Kind::end) {
            if (up == kBottom) {
                out.push_back(kAccept);
            } else {
                work_.emplace_back(frames_[up].pos, frames_[up].parent);
            }
        } else {
            // A reference: its alternatives over the place to return to; a reference that ends its alternative
            // returns straight to `up` (a tail call: right recursion does not deepen the stack).
            uint32_t ret = up;
            if (elements[p + 1].kind != Grammar::Kind::end) {
                if (up != kBottom && frames_[up].depth >= kMaxDepth) continue;
                ret = frame(p + 1, up);
            }
            for (const uint32_t alt : g_->alternatives(e.first)) work_.emplace_back(alt, ret);
        }
    }
}

uint32_t GrammarAutomaton::intern_state(std::vector<uint32_t> &tops) {
    if (tops.empty()) return kDead;
    std::sort(tops.begin(), tops.end());
    tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
    if (tops.size() > kMaxStacks) {
        // Keep the accepting mark (it sorts last) among the first stacks.
        const bool accept = tops.back() == kAccept;
        tops.resize(kMaxStacks);
        if (accept) tops.back() = kAccept;
    }
    std::string key(reinterpret_cast<const char *>(tops.data()), tops.size() * sizeof(uint32_t));
    const auto [it, fresh] = state_ids_.try_emplace(std::move(key), static_cast<uint32_t>(states_.size()));
    if (fresh) {
        accepting_.push_back(tops.back() == kAccept ? 1 : 0);
        const auto elements = g_->elements();
        has_token_tops_.push_back(std::any_of(tops.begin(), tops.end(), [&](uint32_t t) {
            return t != kAccept && elements[frames_[t].pos].kind == Grammar::Kind::token;
        }));
        states_.push_back(tops);
    }
    return it->second;
}

uint32_t GrammarAutomaton::step_uncached(uint32_t state, uint32_t cp) {
    if (cp < 128) {
        const size_t at = static_cast<size_t>(state) * 128 + cp;
        if (ascii_steps_.size() <= at) ascii_steps_.resize((static_cast<size_t>(state) + 1) * 128, kUnknown);
        uint32_t &next = ascii_steps_[at];
        if (next == kUnknown) {
            const uint32_t computed = compute_step(state, cp);
            ascii_steps_[at] = computed;  // `next` may dangle: computing can grow the table
            return computed;
        }
        return next;
    }
    const uint64_t key = (static_cast<uint64_t>(state) << 21) | cp;
    if (const auto it = steps_.find(key); it != steps_.end()) return it->second;
    const uint32_t next = compute_step(state, cp);
    steps_.emplace(key, next);
    return next;
}

uint32_t GrammarAutomaton::compute_step(uint32_t state, uint32_t cp) {
    // The next state depends only on which stacks take `cp`: code points that the same stacks take (every
    // character a `.` or a wide class takes) share one expansion, the costly part of a step.
    const auto elements = g_->elements();
    std::string matched(reinterpret_cast<const char *>(&state), sizeof(state));
    for (const uint32_t top : states_[state]) {
        if (top == kAccept) continue;
        const Grammar::Element &e = elements[frames_[top].pos];
        if (e.kind == Grammar::Kind::chars && g_->matches(e, cp))
            matched.append(reinterpret_cast<const char *>(&top), sizeof(top));
    }
    if (matched.size() == sizeof(state)) return kDead;
    if (const auto it = subset_steps_.find(matched); it != subset_steps_.end()) return it->second;
    std::vector<uint32_t> tops;
    start_expansion();
    for (size_t at = sizeof(state); at < matched.size(); at += sizeof(uint32_t)) {
        uint32_t top = 0;
        std::memcpy(&top, matched.data() + at, sizeof(top));
        expand(frames_[top].pos + 1, frames_[top].parent, tops);
    }
    const uint32_t next = intern_state(tops);
    subset_bytes_ += matched.size();
    subset_steps_.emplace(std::move(matched), next);
    return next;
}

uint32_t GrammarAutomaton::step_token(uint32_t state, int32_t token) {
    if (!has_token_tops_[state]) return kDead;
    const uint64_t key = (static_cast<uint64_t>(state) << 32) | static_cast<uint32_t>(token);
    if (const auto it = token_steps_.find(key); it != token_steps_.end()) return it->second;
    const auto elements = g_->elements();
    std::vector<uint32_t> tops;
    start_expansion();
    for (const uint32_t top : states_[state]) {
        if (top == kAccept) continue;
        const Frame f = frames_[top];
        const Grammar::Element &e = elements[f.pos];
        if (e.kind == Grammar::Kind::token && (e.first == static_cast<uint32_t>(token)) != e.negated)
            expand(f.pos + 1, f.parent, tops);
    }
    const uint32_t next = intern_state(tops);
    token_steps_.emplace(key, next);
    return next;
}

uint32_t GrammarAutomaton::merge(uint32_t a, uint32_t b) {
    if (a == kDead || a == b) return b;
    if (b == kDead) return a;
    std::vector<uint32_t> tops = states_[a];
    tops.insert(tops.end(), states_[b].begin(), states_[b].end());
    return intern_state(tops);
}

bool GrammarAutomaton::takes_any(uint32_t state, uint32_t lo, uint32_t hi) const {
    const auto elements = g_->elements();
    for (const uint32_t top : states_[state])
        if (top != kAccept && elements[frames_[top].pos].kind == Grammar::Kind::chars &&
            g_->matches_any(elements[frames_[top].pos], lo, hi))
            return true;
    return false;
}

uint32_t GrammarAutomaton::copy_frame(const std::vector<Frame> &from, uint32_t id) {
    if (id == kBottom) return kBottom;
    const uint32_t parent = copy_frame(from, from[id].parent);
    return frame(from[id].pos, parent);
}

uint32_t GrammarAutomaton::compact(uint32_t keep) {
    const std::vector<Frame> old_frames = std::move(frames_);
    std::vector<uint32_t> old_tops = keep == kDead ? std::vector<uint32_t>{} : states_[keep];
    frames_.clear();
    frame_ids_.clear();
    states_.clear();
    accepting_.clear();
    has_token_tops_.clear();
    state_ids_.clear();
    token_steps_.clear();
    subset_steps_.clear();
    subset_bytes_ = 0;
    steps_.clear();
    ascii_steps_.clear();
    std::vector<uint32_t> tops;
    for (const uint32_t top : old_tops) tops.push_back(top == kAccept ? kAccept : copy_frame(old_frames, top));
    std::vector<uint32_t> start_tops;
    start_expansion();
    for (const uint32_t alt : g_->alternatives(g_->root())) expand(alt, kBottom, start_tops);
    start_ = intern_state(start_tops);
    return intern_state(tops);
}

bool GrammarCursor::feed_multibyte(GrammarAutomaton &a, uint8_t byte) {
    if (state == GrammarAutomaton::kDead) return false;
    if (need == 0) {
        if (byte < 0x80) {
            state = a.step(state, byte);
            return state != GrammarAutomaton::kDead;
        }
        if (byte >= 0xC2 && byte <= 0xDF) {
            length = 2;
        } else if (byte >= 0xE0 && byte <= 0xEF) {
            length = 3;
        } else if (byte >= 0xF0 && byte <= 0xF4) {
            length = 4;
        } else {
            return false;  // a continuation byte, an overlong lead or beyond U+10FFFF
        }
        partial = byte & (0x7Fu >> length);
        need = static_cast<uint8_t>(length - 1);
    } else {
        if ((byte & 0xC0) != 0x80) return false;
        partial = (partial << 6) | (byte & 0x3Fu);
        --need;
    }
    // The code points this sequence may still become: [lo, hi] within its length's valid range.
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    const uint32_t shift = 6u * need;
    const uint32_t lo = std::max(partial << shift, kMin[length]);
    const uint32_t hi = std::min(partial << shift | ((1u << shift) - 1), kMaxCodePoint);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;  // overlong, too large, or a surrogate
    // Surrogates are not code points UTF-8 may carry: only the valid parts of [lo, hi] count.
    if (need > 0)
        return (lo < 0xD800 && a.takes_any(state, lo, std::min(hi, 0xD7FFu))) ||
               (hi > 0xDFFF && a.takes_any(state, std::max(lo, 0xE000u), hi));
    state = a.step(state, partial);
    return state != GrammarAutomaton::kDead;
}

}  // namespace sparrow
