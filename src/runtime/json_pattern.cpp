#include "runtime/json_pattern.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"

namespace sparrow {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorted, merged ranges.
Ranges normalized(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (const auto &[lo, hi] : r) {
        if (!out.empty() && lo <= out.back().second + 1) {
            out.back().second = std::max(out.back().second, hi);
        } else {
            out.emplace_back(lo, hi);
        }
    }
    return out;
}

Ranges complement(const Ranges &r) {
    Ranges n = normalized(r), out;
    uint32_t next = 0;
    for (const auto &[lo, hi] : n) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    return out;
}

const Ranges kDigits = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's white space and line terminators.
const Ranges kSpace = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kDot = complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});

// The regular expression's tree.
struct Node {
    enum class Kind { set, concat, alt, repeat } kind = Kind::concat;
    Ranges set;
    std::vector<std::unique_ptr<Node>> children;
    int min = 0, max = 0;  // repeat: max -1 for no bound
};

// Decodes one UTF-8 code point at text[at] (advancing at); invalid bytes are taken one by one.
uint32_t next_code_point(std::string_view text, size_t &at) {
    const auto c = static_cast<uint8_t>(text[at++]);
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    uint32_t cp = extra == 3 ? c & 0x07 : extra == 2 ? c & 0x0F : extra == 1 ? c & 0x1F : c;
    while (extra-- > 0 && at < text.size() && (static_cast<uint8_t>(text[at]) & 0xC0) == 0x80)
        cp = cp << 6 | (static_cast<uint8_t>(text[at++]) & 0x3F);
    return cp;
}

class Parser {
  public:
    explicit Parser(std::string_view p) : p_(p) {}

    std::unique_ptr<Node> parse() {
        auto n = alternation();
        if (at_ < p_.size()) fail("unexpected ')'");
        return n;
    }

  private:
    std::string_view p_;
    size_t at_ = 0;

    [[noreturn]] void fail(const char *what) const {
        throw_error("pattern '%.*s': %s (at %zu)", static_cast<int>(p_.size()), p_.data(), what, at_);
    }
    bool more() const { return at_ < p_.size(); }
    char peek() const { return p_[at_]; }

    static std::unique_ptr<Node> set_node(Ranges r) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::set;
        n->set = normalized(std::move(r));
        return n;
    }

    std::unique_ptr<Node> alternation() {
        auto first = concatenation();
        if (!more() || peek() != '|') return first;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::alt;
        n->children.push_back(std::move(first));
        while (more() && peek() == '|') {
            ++at_;
            n->children.push_back(concatenation());
        }
        return n;
    }

    std::unique_ptr<Node> concatenation() {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::concat;
        while (more() && peek() != '|' && peek() != ')') n->children.push_back(repetition());
        return n;
    }

    // A decimal count in a quantifier, or -1 when there is none at at_.
    int count() {
        if (!more() || peek() < '0' || peek() > '9') return -1;
        int v = 0;
        while (more() && peek() >= '0' && peek() <= '9') {
            v = v * 10 + (peek() - '0');
            if (v > 1000) fail("a count above 1000");
            ++at_;
        }
        return v;
    }

    std::unique_ptr<Node> repetition() {
        auto atom_node = atom();
        for (;;) {
            if (!more()) return atom_node;
            int lo = -1, hi = -1;
            const char c = peek();
            if (c == '*' || c == '+' || c == '?') {
                ++at_;
                lo = c == '+' ? 1 : 0;
                hi = c == '?' ? 1 : -1;
            } else if (c == '{') {
                const size_t start = at_++;
                lo = count();
                hi = lo;
                if (lo >= 0 && more() && peek() == ',') {
                    ++at_;
                    hi = count();  // -1: no bound
                }
                if (lo < 0 || !more() || peek() != '}') {  // not a quantifier: a literal '{'
                    at_ = start;
                    return atom_node;
                }
                ++at_;
                if (hi >= 0 && hi < lo) fail("a quantifier {n,m} with m < n");
            } else {
                return atom_node;
            }
            if (more() && peek() == '?') ++at_;  // lazy: matches the same strings
            auto r = std::make_unique<Node>();
            r->kind = Node::Kind::repeat;
            r->min = lo;
            r->max = hi;
            r->children.push_back(std::move(atom_node));
            atom_node = std::move(r);
        }
    }

    std::unique_ptr<Node> atom() {
        const char c = peek();
        if (c == '(') {
            ++at_;
            if (more() && peek() == '?') {
                if (p_.substr(at_, 2) == "?:") {
                    at_ += 2;
                } else if (p_.substr(at_, 2) == "?<" && p_.substr(at_, 3) != "?<=" && p_.substr(at_, 3) != "?<!") {
                    const size_t close = p_.find('>', at_);  // a named group: a group
                    if (close == std::string_view::npos) fail("an unclosed group name");
                    at_ = close + 1;
                } else {
                    fail("lookarounds are not supported");
                }
            }
            auto inner = alternation();
            if (!more() || peek() != ')') fail("an unclosed group");
            ++at_;
            return inner;
        }
        if (c == '[') return set_node(char_class());
        if (c == '.') {
            ++at_;
            return set_node(kDot);
        }
        if (c == '^' || c == '$') fail("anchors are supported only at the start (^) and the end ($)");
        if (c == '*' || c == '+' || c == '?') fail("a quantifier with nothing to repeat");
        if (c == '\\') return set_node(escape(/*in_class=*/false));
        return set_node(single(next_code_point(p_, at_)));
    }

    static Ranges single(uint32_t cp) { return {{cp, cp}}; }

    // After '\': a class escape or one character.
    Ranges escape(bool in_class) {
        ++at_;
        if (!more()) fail("a '\\' at the end");
        const char c = p_[at_];
        switch (c) {
            case 'd': ++at_; return kDigits;
            case 'D': ++at_; return complement(kDigits);
            case 'w': ++at_; return kWord;
            case 'W': ++at_; return complement(kWord);
            case 's': ++at_; return kSpace;
            case 'S': ++at_; return complement(kSpace);
            case 'n': ++at_; return single('\n');
            case 't': ++at_; return single('\t');
            case 'r': ++at_; return single('\r');
            case 'f': ++at_; return single('\f');
            case 'v': ++at_; return single('\v');
            case '0': ++at_; return single(0);
            case 'b':
                if (in_class) {
                    ++at_;
                    return single('\b');
                }
                fail("word boundaries are not supported");
            case 'B': fail("word boundaries are not supported");
            case 'x':
            case 'u': {
                ++at_;
                const int digits = c == 'x' ? 2 : 4;
                uint32_t cp = hex(digits);
                if (cp >= 0xD800 && cp <= 0xDBFF && p_.substr(at_, 2) == "\\u") {  // a surrogate pair
                    at_ += 2;
                    const uint32_t low = hex(4);
                    if (low < 0xDC00 || low > 0xDFFF) fail("a high surrogate without its low half");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                }
                return single(cp);
            }
            default:
                if (c >= '1' && c <= '9') fail("backreferences are not supported");
                if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
                    fail("this escape is not supported (\\p, \\c, \\k, ...)");
                return single(next_code_point(p_, at_));  // escaped punctuation: itself
        }
    }

    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
            if (!more()) fail("a short \\x or \\u escape");
            const char h = p_[at_++];
            const int d = h >= '0' && h <= '9'                     ? h - '0'
                          : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10
                                                                   : -1;
            if (d < 0) fail("a bad hex digit");
            v = v * 16 + static_cast<uint32_t>(d);
        }
        return v;
    }

    Ranges char_class() {
        ++at_;  // '['
        bool negate = false;
        if (more() && peek() == '^') {
            negate = true;
            ++at_;
        }
        Ranges r;
        while (more() && peek() != ']') {
            Ranges item = peek() == '\\' ? escape(/*in_class=*/true) : single(next_code_point(p_, at_));
            // A range a-b between two single characters (a '-' before ']' is itself).
            if (item.size() == 1 && item[0].first == item[0].second && more() && peek() == '-' && at_ + 1 < p_.size() &&
                p_[at_ + 1] != ']') {
                ++at_;
                const Ranges to = peek() == '\\' ? escape(/*in_class=*/true) : single(next_code_point(p_, at_));
                if (to.size() != 1 || to[0].first != to[0].second) fail("a range to a class escape");
                if (to[0].first < item[0].first) fail("a range out of order");
                item[0].second = to[0].first;
            }
            r.insert(r.end(), item.begin(), item.end());
        }
        if (!more()) fail("an unclosed '['");
        ++at_;
        return negate ? complement(r) : normalized(r);
    }
};

}  // namespace

// The NFA: Thompson's construction from the tree (states with empty moves and moves on ranges), then the empty
// moves closed over into the states that ranges lead to (and the start).
class JsonPatternCompiler {
  public:
    JsonPattern run(const Node &root) {
        const int start = new_state(), end = new_state();
        build(root, start, end);
        // The kept states: the start and every target of a range move.
        std::vector<int> index(states_.size(), -1);
        std::vector<int> kept = {start};
        index[static_cast<size_t>(start)] = 0;
        for (const State &s : states_) {
            for (const auto &m : s.moves) {
                if (index[static_cast<size_t>(m.to)] < 0) {
                    index[static_cast<size_t>(m.to)] = static_cast<int>(kept.size());
                    kept.push_back(m.to);
                }
            }
        }
        if (kept.size() > JsonPattern::kMaxStates)
            throw_error("pattern: more than %d states (a simpler pattern, or smaller counts)", JsonPattern::kMaxStates);
        JsonPattern p;
        p.moves_.resize(kept.size());
        for (size_t k = 0; k < kept.size(); ++k) {
            for (int s : closure(kept[k])) {
                if (s == end) p.accept_.add(static_cast<int>(k));
                for (const auto &m : states_[static_cast<size_t>(s)].moves) {
                    for (const auto &[lo, hi] : m.ranges)
                        p.moves_[k].push_back({lo, hi, index[static_cast<size_t>(m.to)]});
                }
            }
        }
        // Live states: those from which an accepting state can be reached; moves to others are dropped.
        std::vector<bool> live(kept.size(), false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t k = 0; k < kept.size(); ++k) {
                if (live[k]) continue;
                const bool l = p.accept_.has(static_cast<int>(k)) ||
                               std::any_of(p.moves_[k].begin(), p.moves_[k].end(),
                                           [&](const JsonPattern::Move &m) { return live[static_cast<size_t>(m.to)]; });
                if (l) live[k] = changed = true;
            }
        }
        if (!live[0]) throw_error("pattern: no string matches it");
        for (auto &moves : p.moves_) {
            std::erase_if(moves, [&](const JsonPattern::Move &m) { return !live[static_cast<size_t>(m.to)]; });
        }
        p.start_.add(0);
        return p;
    }

  private:
    struct State {
        std::vector<int> empty;  // empty moves
        struct RangeMove {
            Ranges ranges;
            int to;
        };
        std::vector<RangeMove> moves;
    };
    std::vector<State> states_;

    int new_state() {
        if (states_.size() >= 4096) throw_error("pattern: too large (a simpler pattern, or smaller counts)");
        states_.emplace_back();
        return static_cast<int>(states_.size() - 1);
    }

    // Adds the states and moves that take `from` to `to` over strings n matches.
    void build(const Node &n, int from, int to) {
        switch (n.kind) {
            case Node::Kind::set:
                if (!n.set.empty())
                    states_[static_cast<size_t>(from)].moves.push_back({n.set, to});  // [] takes nothing
                return;
            case Node::Kind::concat: {
                int at = from;
                for (size_t i = 0; i < n.children.size(); ++i) {
                    const int next = i + 1 == n.children.size() ? to : new_state();
                    build(*n.children[i], at, next);
                    at = next;
                }
                if (n.children.empty()) states_[static_cast<size_t>(from)].empty.push_back(to);
                return;
            }
            case Node::Kind::alt:
                for (const auto &c : n.children) build(*c, from, to);
                return;
            case Node::Kind::repeat: {
                int at = from;
                for (int i = 0; i < n.min; ++i) {  // the required copies
                    const int next = new_state();
                    build(*n.children[0], at, next);
                    at = next;
                }
                if (n.max < 0) {  // then any number more: a loop through one state
                    const int loop = new_state();
                    states_[static_cast<size_t>(at)].empty.push_back(loop);
                    build(*n.children[0], loop, loop);
                    states_[static_cast<size_t>(loop)].empty.push_back(to);
                    return;
                }
                for (int i = n.min; i < n.max; ++i) {  // then optional copies, each of which may end it
                    states_[static_cast<size_t>(at)].empty.push_back(to);
                    const int next = new_state();
                    build(*n.children[0], at, next);
                    at = next;
                }
                states_[static_cast<size_t>(at)].empty.push_back(to);
                return;
            }
        }
    }

    std::vector<int> closure(int s) const {
        std::vector<int> out = {s};
        std::vector<bool> seen(states_.size(), false);
        seen[static_cast<size_t>(s)] = true;
        for (size_t i = 0; i < out.size(); ++i) {
            for (int t : states_[static_cast<size_t>(out[i])].empty) {
                if (!seen[static_cast<size_t>(t)]) {
                    seen[static_cast<size_t>(t)] = true;
                    out.push_back(t);
                }
            }
        }
        return out;
    }
};

namespace {

// The pattern's top-level alternatives (split at '|' outside groups, classes and escapes): ^ and $ anchor only the
// alternative they begin or end (ECMAScript: "^a|b" is "(^a)|(b)").
std::vector<std::string_view> top_level_alternatives(std::string_view p) {
    std::vector<std::string_view> out;
    int depth = 0;
    bool in_class = false;
    size_t start = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\') {
            ++i;  // the escaped character
        } else if (in_class) {
            in_class = c != ']';
        } else if (c == '[') {
            in_class = true;
        } else if (c == '(') {
            ++depth;
        } else if (c == ')') {
            --depth;
        } else if (c == '|' && depth == 0) {
            out.push_back(p.substr(start, i - start));
            start = i + 1;
        }
    }
    out.push_back(p.substr(start));
    return out;
}

std::unique_ptr<Node> any_string() {
    auto r = std::make_unique<Node>();
    r->kind = Node::Kind::repeat;
    r->min = 0;
    r->max = -1;
    auto any = std::make_unique<Node>();
    any->kind = Node::Kind::set;
    any->set = {{0, kMaxCodePoint}};
    r->children.push_back(std::move(any));
    return r;
}

}  // namespace

JsonPattern JsonPattern::compile(std::string_view pattern) {
    // JSON Schema's patterns match anywhere unless anchored: each top-level alternative gets an implicit any-string
    // before it (without ^) and after it (without $; an escaped "\$" is a literal).
    Node root;
    root.kind = Node::Kind::alt;
    for (std::string_view alt : top_level_alternatives(pattern)) {
        const bool anchored_start = !alt.empty() && alt.front() == '^';
        if (anchored_start) alt.remove_prefix(1);
        size_t backslashes = 0;
        for (size_t i = alt.size(); i >= 2 && alt[i - 2] == '\\'; --i) ++backslashes;
        const bool anchored_end = !alt.empty() && alt.back() == '$' && backslashes % 2 == 0;
        if (anchored_end) alt.remove_suffix(1);
        auto one = std::make_unique<Node>();
        one->kind = Node::Kind::concat;
        if (!anchored_start) one->children.push_back(any_string());
        one->children.push_back(Parser(alt).parse());
        if (!anchored_end) one->children.push_back(any_string());
        root.children.push_back(std::move(one));
    }
    return JsonPatternCompiler().run(root);
}

JsonPattern::States JsonPattern::step(const States &from, uint32_t cp) const {
    States out;
    for (size_t k = 0; k < moves_.size(); ++k) {
        if (!from.has(static_cast<int>(k))) continue;
        for (const Move &m : moves_[k]) {
            if (cp >= m.lo && cp <= m.hi) out.add(m.to);
        }
    }
    return out;
}

bool JsonPattern::can_step(const States &from, uint32_t lo, uint32_t hi) const {
    for (size_t k = 0; k < moves_.size(); ++k) {
        if (!from.has(static_cast<int>(k))) continue;
        for (const Move &m : moves_[k]) {
            if (m.lo <= hi && m.hi >= lo) return true;
        }
    }
    return false;
}

bool JsonPattern::matches(std::string_view utf8) const {
    States s = start_;
    for (size_t at = 0; at < utf8.size() && !s.empty();) s = step(s, next_code_point(utf8, at));
    return matches(s);
}

}  // namespace sparrow
