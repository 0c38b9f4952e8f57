#include "runtime/unicode_regex.h"

#include <algorithm>

#include "core/error.h"

namespace sparrow::unicode {

bool Regex::CharClass::contains(uint32_t cp, uint8_t cls) const {
    bool hit = ((categories >> (cls & k_cls_category)) & 1u) != 0 || (space && (cls & k_cls_space) != 0);
    if (!hit && !ranges.empty()) {
        if (ranges.size() <= 8) {
            for (const auto &[lo, hi] : ranges) {
                if (cp >= lo && cp <= hi) {
                    hit = true;
                    break;
                }
            }
        } else {
            // First range whose upper bound is >= cp.
            auto it = std::lower_bound(ranges.begin(), ranges.end(), cp,
                                       [](const std::pair<uint32_t, uint32_t> &r, uint32_t c) { return r.second < c; });
            hit = it != ranges.end() && cp >= it->first;
        }
    }
    return hit != negated;
}

// Parses a pattern into a small syntax tree, then emits the instructions.
class RegexCompiler {
  public:
    RegexCompiler(Regex &re, std::string_view pattern) : re_(re) {
        for (size_t pos = 0; pos < pattern.size();) {
            const Utf8Char c = decode_utf8(pattern, pos);
            if (!c.valid) fail("invalid UTF-8");
            pat_.push_back(c.cp);
            pos += c.len;
        }
    }

    void compile() {
        const int root = parse_alt();
        if (i_ < pat_.size()) fail(pat_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
        if (nullable(root)) fail("the pattern can match the empty string");
        emit(root);
        emit_inst({Regex::Op::Match});
        re_.n_splits_ = n_splits_;
        // Lookahead bodies go after the main program; splits in them are never memoised (see Matcher::run).
        in_look_body_ = true;
        for (size_t k = 0; k < pending_looks_.size(); ++k) {
            const auto [inst, body] = pending_looks_[k];
            re_.code_[inst].x = static_cast<int32_t>(re_.code_.size());
            emit(body);
            emit_inst({Regex::Op::Match});
        }
    }

  private:
    struct Node {
        enum Kind { Empty, Char, Class, Any, Begin, End, Concat, Alt, Repeat, Look } kind = Empty;
        uint32_t cp = 0;
        int32_t cls = -1;
        int min = 0, max = 0;  // Repeat; max < 0: unbounded
        bool negate = false;   // Look
        std::vector<int> kids;
    };

    Regex &re_;
    std::vector<uint32_t> pat_;
    size_t i_ = 0;
    std::vector<Node> nodes_;
    int32_t n_splits_ = 0;
    bool in_look_body_ = false;
    std::vector<std::pair<size_t, int>> pending_looks_;  // (Look instruction, body node)

    [[noreturn]] void fail(const char *what) const {
        throw_error("regex: %s at code point %zu of pattern \"%s\"", what, i_, re_.pattern_.c_str());
    }
    bool eof() const { return i_ >= pat_.size(); }
    uint32_t peek(size_t k = 0) const { return i_ + k < pat_.size() ? pat_[i_ + k] : 0; }
    bool accept(uint32_t c) {
        if (peek() != c || eof()) return false;
        ++i_;
        return true;
    }
    int add(Node n) {
        nodes_.push_back(std::move(n));
        return static_cast<int>(nodes_.size()) - 1;
    }
    int add_class(Regex::CharClass k) {
        std::sort(k.ranges.begin(), k.ranges.end());
        std::vector<std::pair<uint32_t, uint32_t>> merged;
        for (const auto &r : k.ranges) {
            if (!merged.empty() && r.first <= merged.back().second + 1) {
                merged.back().second = std::max(merged.back().second, r.second);
            } else {
                merged.push_back(r);
            }
        }
        k.ranges = std::move(merged);
        re_.classes_.push_back(std::move(k));
        Node n;
        n.kind = Node::Class;
        n.cls = static_cast<int32_t>(re_.classes_.size()) - 1;
        return add(std::move(n));
    }

    int parse_alt() {
        std::vector<int> kids{parse_concat()};
        while (accept('|')) kids.push_back(parse_concat());
        if (kids.size() == 1) return kids[0];
        Node n;
        n.kind = Node::Alt;
        n.kids = std::move(kids);
        return add(std::move(n));
    }

    int parse_concat() {
        Node n;
        n.kind = Node::Concat;
        while (!eof() && peek() != '|' && peek() != ')') n.kids.push_back(parse_repeat());
        if (n.kids.size() == 1) return n.kids[0];
        if (n.kids.empty()) n.kind = Node::Empty;
        return add(std::move(n));
    }

    int parse_number() {
        if (peek() < '0' || peek() > '9') fail("expected a number in {}");
        int v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + static_cast<int>(pat_[i_++] - '0');
            if (v > 1000) fail("repetition count too large");
        }
        return v;
    }

    int parse_repeat() {
        int atom = parse_atom();
        for (;;) {
            int min, max;
            if (accept('?')) {
                min = 0, max = 1;
            } else if (accept('*')) {
                min = 0, max = -1;
            } else if (accept('+')) {
                min = 1, max = -1;
            } else if (peek() == '{' && peek(1) >= '0' && peek(1) <= '9') {
                ++i_;
                min = max = parse_number();
                if (accept(',')) max = peek() == '}' ? -1 : parse_number();
                if (!accept('}')) fail("expected '}'");
                if (max >= 0 && max < min) fail("bad repetition range");
            } else {
                return atom;
            }
            if (peek() == '?' || peek() == '+') fail("lazy and possessive quantifiers are not supported");
            if (max < 0 && nullable(atom)) fail("unbounded repetition of something that can match empty");
            Node n;
            n.kind = Node::Repeat;
            n.min = min;
            n.max = max;
            n.kids = {atom};
            atom = add(std::move(n));
        }
    }

    uint32_t parse_hex(size_t max_digits) {
        uint32_t v = 0;
        size_t n = 0;
        const bool braced = accept('{');
        while (n < (braced ? 6 : max_digits)) {
            const uint32_t c = peek();
            int d = -1;
            if (c >= '0' && c <= '9')
                d = static_cast<int>(c - '0');
            else if (c >= 'a' && c <= 'f')
                d = static_cast<int>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                d = static_cast<int>(c - 'A' + 10);
            if (d < 0) break;
            v = v * 16 + static_cast<uint32_t>(d);
            ++i_, ++n;
        }
        if (n == 0 || (braced && !accept('}')) || v > 0x10FFFF) fail("bad hexadecimal escape");
        return v;
    }

    uint32_t parse_category() {
        if (!accept('{')) fail("expected '{' after \\p");
        std::string name;
        while (!eof() && peek() != '}') name.push_back(static_cast<char>(pat_[i_++] & 0x7f));
        if (!accept('}')) fail("expected '}' after \\p{...");
        if (name == "L") return k_mask_letter;
        if (name == "M") return k_mask_mark;
        if (name == "N") return k_mask_number;
        if (name == "P") return k_mask_punctuation;
        if (name == "S") return k_mask_symbol;
        if (name == "Z") return k_mask_separator;
        if (name == "C") return k_mask_other;
        static const char *const k_names[k_category_count] = {
            "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
            "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"};
        for (int c = 0; c < k_category_count; ++c) {
            if (name == k_names[c]) return 1u << c;
        }
        fail("unknown Unicode category");
    }

    // After a backslash: a class escape fills `k` and returns true; a character escape sets `cp`.
    bool parse_escape(Regex::CharClass &k, uint32_t &cp) {
        if (eof()) fail("trailing backslash");
        const uint32_t c = pat_[i_++];
        switch (c) {
            case 's': k.space = true; return true;
            case 'S': k.space = true, k.negated = true; return true;
            case 'd': k.ranges.push_back({'0', '9'}); return true;
            case 'D': k.ranges.push_back({'0', '9'}), k.negated = true; return true;
            case 'p': k.categories = parse_category(); return true;
            case 'P': k.categories = parse_category(), k.negated = true; return true;
            case 'r': cp = '\r'; return false;
            case 'n': cp = '\n'; return false;
            case 't': cp = '\t'; return false;
            case 'f': cp = '\f'; return false;
            case 'v': cp = '\v'; return false;
            case 'x': cp = parse_hex(2); return false;
            case 'u': cp = parse_hex(4); return false;
            default:
                if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
                    --i_;
                    fail("unsupported escape");
                }
                cp = c;  // escaped punctuation or any other character stands for itself
                return false;
        }
    }

    int parse_class() {
        Regex::CharClass k;
        k.negated = accept('^');
        bool first = true;
        while (!eof() && (peek() != ']' || first)) {
            first = false;
            uint32_t lo;
            if (accept('\\')) {
                Regex::CharClass sub;
                if (parse_escape(sub, lo)) {
                    if (sub.negated) fail("negated escapes inside [...] are not supported");
                    k.space |= sub.space;
                    k.categories |= sub.categories;
                    k.ranges.insert(k.ranges.end(), sub.ranges.begin(), sub.ranges.end());
                    continue;
                }
            } else {
                lo = pat_[i_++];
            }
            uint32_t hi = lo;
            if (peek() == '-' && peek(1) != ']' && i_ + 1 < pat_.size()) {
                ++i_;
                if (accept('\\')) {
                    Regex::CharClass sub;
                    if (parse_escape(sub, hi)) fail("a class escape cannot end a range");
                } else {
                    hi = pat_[i_++];
                }
                if (hi < lo) fail("reversed range in [...]");
            }
            k.ranges.push_back({lo, hi});
        }
        if (!accept(']')) fail("unterminated [...]");
        return add_class(std::move(k));
    }

    int parse_atom() {
        if (eof()) fail("unexpected end");
        const uint32_t c = pat_[i_++];
        Node n;
        switch (c) {
            case '(': {
                if (accept('?')) {
                    if (accept(':')) {
                        // plain group
                    } else if (accept('=') || accept('!')) {
                        n.kind = Node::Look;
                        n.negate = pat_[i_ - 1] == '!';
                    } else {
                        fail("unsupported group (only (?:, (?= and (?! are)");
                    }
                }
                const int inner = parse_alt();
                if (!accept(')')) fail("missing ')'");
                if (n.kind != Node::Look) return inner;
                n.kids = {inner};
                return add(std::move(n));
            }
            case '[': return parse_class();
            case '.': n.kind = Node::Any; return add(std::move(n));
            case '^': n.kind = Node::Begin; return add(std::move(n));
            case '$': n.kind = Node::End; return add(std::move(n));
            case '*':
            case '+':
            case '?':
            case '{': --i_; fail("nothing to repeat");
            case '\\': {
                Regex::CharClass k;
                uint32_t cp = 0;
                if (parse_escape(k, cp)) return add_class(std::move(k));
                n.kind = Node::Char;
                n.cp = cp;
                return add(std::move(n));
            }
            default:
                n.kind = Node::Char;
                n.cp = c;
                return add(std::move(n));
        }
    }

    bool nullable(int id) const {
        const Node &n = nodes_[static_cast<size_t>(id)];
        switch (n.kind) {
            case Node::Char:
            case Node::Class:
            case Node::Any: return false;
            case Node::Concat: return std::all_of(n.kids.begin(), n.kids.end(), [&](int k) { return nullable(k); });
            case Node::Alt: return std::any_of(n.kids.begin(), n.kids.end(), [&](int k) { return nullable(k); });
            case Node::Repeat: return n.min == 0 || nullable(n.kids[0]);
            default:  // Empty, assertions
                return true;
        }
    }

    int32_t pc() const { return static_cast<int32_t>(re_.code_.size()); }
    size_t emit_inst(Regex::Inst inst) {
        re_.code_.push_back(inst);
        return re_.code_.size() - 1;
    }
    size_t emit_split(int32_t x, int32_t y) {
        Regex::Inst inst{Regex::Op::Split};
        inst.x = x;
        inst.y = y;
        inst.split_index = in_look_body_ ? -1 : n_splits_++;
        return emit_inst(inst);
    }

    void emit(int id) {
        const Node n = nodes_[static_cast<size_t>(id)];  // copy: emit() may not add nodes, but keep it simple
        switch (n.kind) {
            case Node::Empty: break;
            case Node::Char: {
                Regex::Inst inst{Regex::Op::Char};
                inst.x = static_cast<int32_t>(n.cp);
                emit_inst(inst);
                break;
            }
            case Node::Class: {
                Regex::Inst inst{Regex::Op::Class};
                inst.x = n.cls;
                emit_inst(inst);
                break;
            }
            case Node::Any: emit_inst({Regex::Op::Any}); break;
            case Node::Begin: emit_inst({Regex::Op::AssertBegin}); break;
            case Node::End: emit_inst({Regex::Op::AssertEnd}); break;
            case Node::Concat:
                for (int k : n.kids) emit(k);
                break;
            case Node::Alt: {
                // split(L1, next); L1: a; jmp end; next: split(L2, next2); ...; last; end:
                std::vector<size_t> jumps;
                for (size_t k = 0; k + 1 < n.kids.size(); ++k) {
                    const size_t split = emit_split(pc() + 1, 0);
                    emit(n.kids[k]);
                    jumps.push_back(emit_inst({Regex::Op::Jmp}));
                    re_.code_[split].y = pc();
                }
                emit(n.kids.back());
                for (size_t j : jumps) re_.code_[j].x = pc();
                break;
            }
            case Node::Repeat: {
                const int kid = n.kids[0];
                if (n.max < 0) {
                    for (int r = 0; r + 1 < n.min; ++r) emit(kid);
                    if (n.min >= 1) {
                        const int32_t body = pc();  // body; split(body, out)
                        emit(kid);
                        emit_split(body, pc() + 1);
                    } else {
                        const size_t split = emit_split(pc() + 1, 0);  // L: split(body, out); body; jmp L
                        emit(kid);
                        Regex::Inst jmp{Regex::Op::Jmp};
                        jmp.x = static_cast<int32_t>(split);
                        emit_inst(jmp);
                        re_.code_[split].y = pc();
                    }
                } else {
                    for (int r = 0; r < n.min; ++r) emit(kid);
                    // Nested optionals a(a(a)?)?: once one is skipped, so are the rest.
                    std::vector<size_t> splits;
                    for (int r = n.min; r < n.max; ++r) {
                        splits.push_back(emit_split(pc() + 1, 0));
                        emit(kid);
                    }
                    for (size_t s : splits) re_.code_[s].y = pc();
                }
                break;
            }
            case Node::Look: {
                Regex::Inst inst{Regex::Op::Look};
                inst.negate = n.negate;
                pending_looks_.push_back({emit_inst(inst), n.kids[0]});
                break;
            }
        }
    }
};

Regex::Regex(std::string_view pattern) : pattern_(pattern) { RegexCompiler(*this, pattern).compile(); }

struct Regex::Matcher {
    const Regex &re;
    const CodepointText &t;
    uint32_t begin, end;
    size_t width;                                     // positions begin..end inclusive
    std::vector<uint64_t> visited;                    // bit (split_index * width + pos - begin)
    std::vector<std::pair<int32_t, uint32_t>> stack;  // pending alternatives (pc, pos)

    Matcher(const Regex &r, const CodepointText &text, uint32_t b, uint32_t e)
        : re(r), t(text), begin(b), end(e), width(size_t(e - b) + 1) {
        visited.assign((size_t(re.n_splits_) * width + 63) / 64, 0);
    }

    // Runs the program from `pc0` at `pos0`; returns the end of the first match in priority order, or -1.
    // `memo` marks each (split, position) on first visit and abandons later visits: valid across start
    // positions for the main program (see the header). Lookahead bodies run without it.
    int64_t run(int32_t pc0, uint32_t pos0, bool memo) {
        const size_t base = stack.size();
        stack.emplace_back(pc0, pos0);
        const std::vector<Inst> &code = re.code_;
        while (stack.size() > base) {
            auto [pc, pos] = stack.back();
            stack.pop_back();
            for (bool ok = true; ok;) {
                const Inst &in = code[static_cast<size_t>(pc)];
                switch (in.op) {
                    case Op::Char:
                        ok = pos < end && t.cps[pos] == static_cast<uint32_t>(in.x);
                        ++pos, ++pc;
                        break;
                    case Op::Class:
                        ok = pos < end && re.classes_[static_cast<size_t>(in.x)].contains(t.cps[pos], t.cls[pos]);
                        ++pos, ++pc;
                        break;
                    case Op::Any:
                        ok = pos < end && t.cps[pos] != '\n' && t.cps[pos] != '\r';
                        ++pos, ++pc;
                        break;
                    case Op::Split:
                        if (memo && in.split_index >= 0) {
                            const size_t bit = size_t(in.split_index) * width + (pos - begin);
                            const uint64_t mask = uint64_t(1) << (bit & 63);
                            if (visited[bit >> 6] & mask) {
                                ok = false;
                                break;
                            }
                            visited[bit >> 6] |= mask;
                        }
                        stack.emplace_back(in.y, pos);
                        pc = in.x;
                        break;
                    case Op::Jmp: pc = in.x; break;
                    case Op::AssertBegin:
                        ok = pos == begin;
                        ++pc;
                        break;
                    case Op::AssertEnd:
                        ok = pos == end;
                        ++pc;
                        break;
                    case Op::Look:
                        ok = (run(in.x, pos, false) >= 0) != in.negate;
                        ++pc;
                        break;
                    case Op::Match: stack.resize(base); return pos;
                }
            }
        }
        return -1;
    }
};

void Regex::split(const CodepointText &text, uint32_t begin, uint32_t end, std::vector<uint32_t> &piece_ends) const {
    SPARROW_ASSERT(begin <= end && end <= text.size());
    if (begin == end) return;
    Matcher m(*this, text, begin, end);
    uint32_t pos = begin, gap = begin;
    while (pos < end) {
        uint32_t start = pos;
        int64_t match_end = -1;
        for (; start < end; ++start) {
            match_end = m.run(0, start, true);
            if (match_end > start) break;  // never empty: such patterns are rejected
        }
        if (match_end <= static_cast<int64_t>(start)) break;
        if (start > gap) piece_ends.push_back(start);
        piece_ends.push_back(static_cast<uint32_t>(match_end));
        pos = gap = static_cast<uint32_t>(match_end);
    }
    if (gap < end) piece_ends.push_back(end);
}

}  // namespace sparrow::unicode
