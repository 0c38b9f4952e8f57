#include "runtime/json_prefix.h"

#include <algorithm>
#include <array>
#include <limits>

#include "core/error.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

namespace sparrow {

namespace {

constexpr std::string_view kLiterals[3] = {"true", "false", "null"};

bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
int hex_value(uint8_t c) { return is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10; }

// The kind of value a first byte starts, or -1.
int kind_of_first(uint8_t c) {
    switch (c) {
        case '{': return static_cast<int>(JsonKind::object);
        case '[': return static_cast<int>(JsonKind::array);
        case '"': return static_cast<int>(JsonKind::string);
        case 't':
        case 'f': return static_cast<int>(JsonKind::boolean);
        case 'n': return static_cast<int>(JsonKind::null);
        default: return c == '-' || is_digit(c) ? static_cast<int>(JsonKind::number) : -1;
    }
}

// The most digits a bounded number's text may have.
int max_digits(const JsonSchemaNode &n) {
    return n.integer_only ? JsonSchemaNode::kMaxIntegerDigits : JsonSchemaNode::kMaxBoundedDigits;
}

}  // namespace

bool JsonPrefix::feed(std::string_view bytes) {
    for (const char ch : bytes) {
        if (!byte(static_cast<uint8_t>(ch))) return false;
    }
    return true;
}

bool JsonPrefix::end_value() {
    state_ = levels_.depth == 0 ? State::done : State::after_value;
    if (levels_.depth > 0 && levels_.top().open == '[') ++levels_.top().count;
    return true;
}

bool JsonPrefix::start_schema_value(uint8_t c) {
    const int kind = kind_of_first(c);
    if (kind < 0 || (levels_.depth == 0 && kind == static_cast<int>(JsonKind::number))) return false;
    const int32_t g = schema_->node(value_node_).by_kind[static_cast<size_t>(kind)];
    if (g == JsonSchemaNode::kNone) return false;
    const JsonSchemaNode &n = schema_->node(g);
    if (!n.literals.empty()) {
        uint64_t cands = 0;
        for (size_t i = 0; i < n.literals.size(); ++i) {
            if (static_cast<uint8_t>(n.literals[i][0]) == c) cands |= uint64_t(1) << i;
        }
        if (cands == 0) return false;
        literal_value_ = true;
        lit_node_ = g;
        lit_cands_ = cands;
        lit_at_ = 1;
        return true;
    }
    switch (static_cast<JsonKind>(kind)) {
        case JsonKind::object:
        case JsonKind::array:
            if (levels_.depth == kMaxDepth) return false;
            levels_.at[levels_.depth].node = g;  // the push below sets the rest
            value_node_ = n.item_node(0);
            break;
        case JsonKind::string:
            str_min_ = n.min_length;
            str_max_ = n.max_length;
            pat_id_ = n.pattern;
            if (pat_id_ >= 0) pat_ = schema_->pattern(pat_id_).start();
            break;
        case JsonKind::number:
            num_node_ = n.bounded ? g : -1;
            num_neg_ = c == '-';
            num_digits_ = c != '-';
            num_frac_ = false;
            num_mag_ = c == '-' ? 0 : c - '0';
            num_n_ = c == '-' ? 0 : 1;
            num_k_ = 0;
            if (num_node_ >= 0 && !number_reachable()) return false;
            break;
        default: break;
    }
    return true;
}

// A byte of an enum / const value: the candidate texts that go on with it stay; a self-delimiting text (a string,
// container or literal) ends the value at its last byte, a number when the next byte continues none of them.
bool JsonPrefix::literal_byte(uint8_t c) {
    const std::vector<std::string> &texts = schema_->node(lit_node_).literals;
    uint64_t next = 0;
    bool whole = false;  // a candidate ended before c
    for (size_t i = 0; i < texts.size(); ++i) {
        if (!(lit_cands_ >> i & 1)) continue;
        if (texts[i].size() == lit_at_) {
            whole = true;
        } else if (static_cast<uint8_t>(texts[i][lit_at_]) == c) {
            next |= uint64_t(1) << i;
        }
    }
    if (next != 0) {
        lit_cands_ = next;
        ++lit_at_;
        for (size_t i = 0; i < texts.size(); ++i) {
            if ((next >> i & 1) && texts[i].size() == lit_at_ &&
                kind_of_first(static_cast<uint8_t>(texts[i][0])) != static_cast<int>(JsonKind::number)) {
                literal_value_ = false;
                return end_value();
            }
        }
        return true;
    }
    if (!whole) return false;
    literal_value_ = false;
    end_value();
    return byte(c);
}

// A byte inside an object key (before its closing quote): the properties whose escaped name goes on with it stay.
bool JsonPrefix::key_byte(uint8_t c) {
    const JsonSchemaNode &n = container();
    uint64_t next = 0;
    for (size_t i = 0; i < n.keys.size(); ++i) {
        if ((key_cands_ >> i & 1) && n.keys[i].size() > key_at_ && static_cast<uint8_t>(n.keys[i][key_at_]) == c)
            next |= uint64_t(1) << i;
    }
    key_cands_ = next;
    ++key_at_;
    return next != 0 || key_free_;
}

// The key's closing quote: a property (not written before) or, where allowed, another key.
bool JsonPrefix::close_key() {
    const JsonSchemaNode &n = container();
    key_prop_ = -1;
    for (size_t i = 0; i < n.keys.size(); ++i) {
        if ((key_cands_ >> i & 1) && n.keys[i].size() == key_at_) key_prop_ = static_cast<int32_t>(i);
    }
    if (key_prop_ >= 0) {
        if (levels_.top().seen >> key_prop_ & 1) return false;  // written already
        levels_.top().seen |= uint64_t(1) << key_prop_;
    } else if (!key_free_) {
        return false;
    }
    ++levels_.top().count;
    return true;
}

// Whether the open object may take one more key: below maxProperties, another key is allowed, or a property is left.
bool JsonPrefix::more_keys() const {
    const JsonSchemaNode &n = container();
    if (levels_.top().count >= n.max_properties) return false;
    if (n.additional != JsonSchemaNode::kNone) return true;
    for (size_t i = 0; i < n.keys.size(); ++i) {
        if (!(levels_.top().seen >> i & 1) && n.key_nodes[i] != JsonSchemaNode::kNone) return true;
    }
    return false;
}

// Whether values of magnitude [lo, hi] (each end closed or open; in units of 10^-scale; negated for a negative
// number) meet the node's bounds (an integer's always: int64's range at least).
bool JsonPrefix::number_meets(__int128 lo, bool lo_closed, __int128 hi, bool hi_closed, int scale) const {
    const JsonSchemaNode &n = schema_->node(num_node_);
    if (num_neg_) {
        const __int128 t = lo;
        lo = -hi;
        hi = -t;
        std::swap(lo_closed, hi_closed);
    }
    __int128 unit = 1;
    for (int i = 0; i < scale; ++i) unit *= 10;
    // The greater lower end and the smaller upper end, each with whether it is included.
    if (n.integer_only || n.minimum != std::numeric_limits<int64_t>::min()) {
        const __int128 b = n.minimum * unit;
        if (b > lo || (b == lo && n.min_exclusive)) {
            lo = b;
            lo_closed = !n.min_exclusive;
        }
    }
    if (n.integer_only || n.maximum != std::numeric_limits<int64_t>::max()) {
        const __int128 b = n.maximum * unit;
        if (b < hi || (b == hi && n.max_exclusive)) {
            hi = b;
            hi_closed = !n.max_exclusive;
        }
    }
    if (!(lo < hi || (lo == hi && lo_closed && hi_closed))) return false;
    if (n.multiple_of == 1) return true;
    // multipleOf (integers only, so scale is 0): some multiple among the whole numbers of the interval.
    const __int128 first = lo_closed ? lo : lo + 1, last = hi_closed ? hi : hi - 1, m = n.multiple_of;
    __int128 q = first / m * m;  // rounded towards zero: up for a negative first, down for a positive one
    if (q < first) q += m;
    return q <= last;
}

// Whether a number under a bounded node can still end within the bounds, from what is written: more integer digits
// (each one multiplies the reach by ten), a fraction, or nothing more; at most max_digits digits. The reach is
// taken as continuous while a digit may follow: an integer's bounds are whole and inclusive, so [a, b) meets them
// exactly when the whole numbers [a, b - 1] do.
bool JsonPrefix::number_reachable() const {
    const int most = max_digits(schema_->node(num_node_));
    __int128 limit = 1;
    for (int i = 0; i < most; ++i) limit *= 10;
    if (!num_digits_) return number_meets(0, true, limit, false, 0);  // just '-': (-10^most, 0]
    const __int128 s = num_mag_;
    const bool room = num_n_ < most;  // for another digit
    if (num_frac_) {                  // [s, s + 1) in units of 10^-k, or s alone
        return room ? number_meets(s, true, s + 1, false, num_k_) : number_meets(s, true, s, true, num_k_);
    }
    if (s == 0) return room ? number_meets(0, true, 1, false, 0) : number_meets(0, true, 0, true, 0);
    // d digits in all: [s 10^j, (s + 1) 10^j), whole numbers only when no digit is left for a fraction.
    __int128 base = s, span = 1;
    for (int d = num_n_; d <= most; ++d) {
        if (d < most ? number_meets(base, true, base + span, false, 0)
                     : number_meets(base, true, base + span - 1, true, 0))
            return true;
        base *= 10;
        span *= 10;
    }
    return false;
}

// A digit of a number under a bounded node (after its first character).
bool JsonPrefix::number_digit(uint8_t c) {
    if (num_n_ >= max_digits(schema_->node(num_node_))) return false;
    num_mag_ = num_mag_ * 10 + (c - '0');
    ++num_n_;
    if (num_frac_) ++num_k_;
    num_digits_ = true;
    return number_reachable();
}

// Whether a character whose code point lies in [lo, hi] can continue the string under its pattern (the first
// bytes of a UTF-8 character, or of an escape, are read).
bool JsonPrefix::pattern_range(uint32_t lo, uint32_t hi) const {
    return pat_id_ < 0 || schema_->pattern(pat_id_).can_step(pat_, lo, hi);
}

// The same inside a \u escape, from the hex digits read so far (a high surrogate's pair reaches the planes above).
bool JsonPrefix::pattern_hex() const {
    if (pat_id_ < 0) return true;
    const uint32_t rest = (uint32_t(1) << (4 * hex_left_)) - 1;  // the digits still to come
    const uint32_t lo = uint32_t(code_) << (4 * hex_left_), hi = lo | rest;
    if (pending_low_) {  // the low half: the pair's code points
        const uint32_t base = 0x10000 + ((uint32_t(high_) - 0xD800) << 10);
        return pattern_range(base + (std::max(lo, 0xDC00u) - 0xDC00), base + (std::min(hi, 0xDFFFu) - 0xDC00));
    }
    if (lo <= 0xD7FF && pattern_range(lo, std::min(hi, 0xD7FFu))) return true;
    if (hi >= 0xE000 && pattern_range(std::max(lo, 0xE000u), hi)) return true;
    if (lo <= 0xDBFF && hi >= 0xD800) {  // a high surrogate: any code point of its planes
        const uint32_t h0 = std::max(lo, 0xD800u), h1 = std::min(hi, 0xDBFFu);
        return pattern_range(0x10000 + ((h0 - 0xD800) << 10), 0x10000 + ((h1 - 0xD800) << 10) + 0x3FF);
    }
    return false;
}

// A character of a string under a pattern: the pattern's states after it, which must not be empty.
bool JsonPrefix::pattern_char(uint32_t cp) {
    if (pat_id_ < 0) return true;
    pat_ = schema_->pattern(pat_id_).step(pat_, cp);
    return !pat_.empty();
}

// The number ends here: within its bounds.
bool JsonPrefix::number_ends() {
    const bool ok = number_meets(num_mag_, true, num_mag_, true, num_frac_ ? num_k_ : 0);
    num_node_ = -1;
    return ok;
}

// The first byte of a value (whitespace handled by the caller).
bool JsonPrefix::start_value(uint8_t c) {
    if (schema_) {
        if (!start_schema_value(c)) return false;
        if (literal_value_) return true;
    } else if (levels_.depth == 0 && c != '{') {
        return false;  // the top is an object
    }
    str_chars_ = 0;
    switch (c) {
        case '{':
        case '[':
            if (levels_.depth == kMaxDepth) return false;
            {
                Level &l = levels_.at[levels_.depth++];
                l.open = static_cast<char>(c);
                l.seen = 0;
                l.count = 0;
                if (!schema_) l.node = 0;
            }
            state_ = c == '{' ? State::key_or_end : State::value_or_end;
            return true;
        case '"':
            key_string_ = false;
            state_ = State::string;
            return true;
        case '-': state_ = State::minus; return true;
        case '0': state_ = State::zero; return true;
        case 't':
        case 'f':
        case 'n':
            literal_ = c == 't' ? 0 : (c == 'f' ? 1 : 2);
            literal_at_ = 1;
            state_ = State::literal;
            return true;
        default:
            if (c >= '1' && c <= '9') {
                state_ = State::integer;
                return true;
            }
            return false;
    }
}

bool JsonPrefix::byte(uint8_t c) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') whitespace_run_ = 0;  // a run ends at anything else
    if (literal_value_) return literal_byte(c);
    if (schema_ && key_string_) {  // a byte of a key (not its closing quote) narrows the properties it may be
        const bool in_string = state_ == State::string || state_ == State::string_escape ||
                               state_ == State::string_hex || state_ == State::string_utf8;
        const bool closing = state_ == State::string && c == '"' && !pending_low_;
        if (in_string && !closing && !key_byte(c)) return false;
    }
    switch (state_) {
        case State::string:
            if (pending_low_ && c != '\\') return false;  // a high surrogate's escape wants its low half next
            if (c == '"') {
                if (key_string_) {
                    if (schema_ && !close_key()) return false;
                    state_ = State::colon;
                    return true;
                }
                if (str_chars_ < str_min_) return false;
                if (pat_id_ >= 0 && !schema_->pattern(pat_id_).matches(pat_)) return false;
                pat_id_ = -1;
                return end_value();
            }
            // A character starts here (a low surrogate's escape continues its high half's).
            if (!pending_low_) {
                if (str_chars_ >= str_max_) return false;
                ++str_chars_;
            }
            if (c == '\\') {
                state_ = State::string_escape;
                // Any character can be escaped (\u); a low surrogate's escape continues its pair.
                return pending_low_ || pattern_range(0, 0x10FFFF);
            }
            if (c < 0x20) return false;  // control characters are escaped in JSON
            if (c < 0x80) return pattern_char(c);
            // A UTF-8 lead byte (RFC 3629): its length and the range of its first continuation byte.
            utf8_min_second_ = 0x80;
            utf8_max_second_ = 0xBF;
            if (c >= 0xC2 && c <= 0xDF) {
                utf8_left_ = 1;
                utf8_cp_ = c & 0x1F;
            } else if (c >= 0xE0 && c <= 0xEF) {
                utf8_left_ = 2;
                utf8_cp_ = c & 0x0F;
                if (c == 0xE0) utf8_min_second_ = 0xA0;  // no overlong forms
                if (c == 0xED) utf8_max_second_ = 0x9F;  // no surrogates
            } else if (c >= 0xF0 && c <= 0xF4) {
                utf8_left_ = 3;
                utf8_cp_ = c & 0x07;
                if (c == 0xF0) utf8_min_second_ = 0x90;
                if (c == 0xF4) utf8_max_second_ = 0x8F;  // nothing above U+10FFFF
            } else {
                return false;
            }
            state_ = State::string_utf8;
            {  // the code points the lead byte and its first continuation byte's range allow
                const int rest = 6 * (utf8_left_ - 1);
                const uint32_t lo = (utf8_cp_ << 6 | (utf8_min_second_ & 0x3F)) << rest;
                const uint32_t hi = (utf8_cp_ << 6 | (utf8_max_second_ & 0x3F)) << rest | ((1u << rest) - 1);
                return pattern_range(lo, hi);
            }
        case State::string_utf8:
            if (c < utf8_min_second_ || c > utf8_max_second_) return false;
            utf8_min_second_ = 0x80;
            utf8_max_second_ = 0xBF;
            utf8_cp_ = utf8_cp_ << 6 | (c & 0x3F);
            if (--utf8_left_ > 0)
                return pattern_range(utf8_cp_ << (6 * utf8_left_),
                                     (utf8_cp_ << (6 * utf8_left_)) | ((1u << (6 * utf8_left_)) - 1));
            state_ = State::string;
            return pattern_char(utf8_cp_);
        case State::string_escape:
            if (pending_low_ && c != 'u') return false;
            switch (c) {
                case '"':
                case '\\':
                case '/': state_ = State::string; return pattern_char(c);
                case 'b': state_ = State::string; return pattern_char('\b');
                case 'f': state_ = State::string; return pattern_char('\f');
                case 'n': state_ = State::string; return pattern_char('\n');
                case 'r': state_ = State::string; return pattern_char('\r');
                case 't': state_ = State::string; return pattern_char('\t');
                case 'u':
                    state_ = State::string_hex;
                    hex_left_ = 4;
                    code_ = 0;
                    return pattern_hex();
                default: return false;
            }
        case State::string_hex: {
            if (!is_hex(c)) return false;
            code_ = static_cast<uint16_t>(code_ * 16 + hex_value(c));
            if (--hex_left_ > 0) return pattern_hex();
            // Surrogates come in pairs, high (D800-DBFF) then low (DC00-DFFF), as nlohmann and most parsers demand.
            const bool high = code_ >= 0xD800 && code_ <= 0xDBFF, low = code_ >= 0xDC00 && code_ <= 0xDFFF;
            if (pending_low_ != low) return false;
            pending_low_ = high;
            state_ = State::string;
            if (high) {
                high_ = code_;  // its character comes with the low half
                return true;
            }
            return pattern_char(low ? 0x10000 + ((uint32_t(high_) - 0xD800) << 10) + (code_ - 0xDC00) : code_);
        }
        case State::minus:
            if (!is_digit(c)) return false;
            if (num_node_ >= 0 && !number_digit(c)) return false;
            state_ = c == '0' ? State::zero : State::integer;
            return true;
        case State::integer:
            if (is_digit(c)) return num_node_ < 0 || number_digit(c);
            [[fallthrough]];
        case State::zero:
            if (num_node_ >= 0) {  // integers only or bounds: no exponent, a fraction only on numbers
                const JsonSchemaNode &n = schema_->node(num_node_);
                if (c == 'e' || c == 'E' || (c == '.' && n.integer_only)) return false;
                if (c == '.') {
                    if (num_n_ >= max_digits(n)) return false;  // no digit could follow
                    num_frac_ = true;
                    state_ = State::dot;
                    return number_reachable();
                }
                if (!number_ends()) return false;
                end_value();
                return byte(c);
            }
            if (c == '.') {
                state_ = State::dot;
                return true;
            }
            if (c == 'e' || c == 'E') {
                state_ = State::exponent;
                return true;
            }
            end_value();  // the number ended before c
            return byte(c);
        case State::dot:
            if (!is_digit(c)) return false;
            if (num_node_ >= 0 && !number_digit(c)) return false;
            state_ = State::fraction;
            return true;
        case State::fraction:
            if (is_digit(c)) return num_node_ < 0 || number_digit(c);
            if (c == 'e' || c == 'E') {
                if (num_node_ >= 0) return false;
                state_ = State::exponent;
                return true;
            }
            if (num_node_ >= 0 && !number_ends()) return false;
            end_value();
            return byte(c);
        case State::exponent:
            if (c == '+' || c == '-') {
                state_ = State::exponent_sign;
                return true;
            }
            [[fallthrough]];
        case State::exponent_sign:
            if (!is_digit(c)) return false;
            state_ = State::exponent_digits;
            return true;
        case State::exponent_digits:
            if (is_digit(c)) return true;
            end_value();
            return byte(c);
        case State::literal: {
            const std::string_view word = kLiterals[literal_];
            if (c != static_cast<uint8_t>(word[literal_at_])) return false;
            if (++literal_at_ < word.size()) return true;
            return end_value();
        }
        default: break;
    }
    // The structural states: whitespace, then what the state expects.
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return ++whitespace_run_ <= kMaxWhitespace;
    switch (state_) {
        case State::value: return start_value(c);
        case State::value_or_end:
            if (c == ']') {
                if (schema_ && container().min_items > 0) return false;
                --levels_.depth;
                return end_value();
            }
            if (schema_ && container().max_items == 0) return false;
            return start_value(c);
        case State::key_or_end:
            if (c == '}') {
                if (schema_ && (container().required != 0 || container().min_properties > 0)) return false;
                --levels_.depth;
                return end_value();
            }
            [[fallthrough]];
        case State::key:
            if (c != '"') return false;
            key_string_ = true;
            state_ = State::string;
            str_chars_ = 0;
            str_min_ = 0;
            str_max_ = std::numeric_limits<uint32_t>::max();
            pat_id_ = -1;
            if (schema_) {
                // The properties not written yet (and, when other keys are allowed, those written too: a repeat is
                // refused at the closing quote, while the key may still grow into another).
                // Where maxProperties leaves room only for the required properties not written yet, only they.
                const JsonSchemaNode &n = container();
                const Level &l = levels_.top();
                const uint64_t required_left = n.required & ~l.seen;
                const bool only_required =
                    l.count + static_cast<uint32_t>(__builtin_popcountll(required_left)) >= n.max_properties;
                key_free_ = n.additional != JsonSchemaNode::kNone && !only_required;
                key_cands_ = 0;
                for (size_t i = 0; i < n.keys.size(); ++i) {
                    if (n.key_nodes[i] != JsonSchemaNode::kNone && (key_free_ || !(l.seen >> i & 1)) &&
                        (!only_required || (required_left >> i & 1)))
                        key_cands_ |= uint64_t(1) << i;
                }
                key_at_ = 0;
                if (key_cands_ == 0 && !key_free_) return false;
            }
            return true;
        case State::colon:
            if (c != ':') return false;
            state_ = State::value;
            if (schema_) {
                const JsonSchemaNode &n = container();
                value_node_ = key_prop_ >= 0 ? n.key_nodes[static_cast<size_t>(key_prop_)] : n.additional;
            }
            return true;
        case State::after_value: {
            const char open = levels_.top().open;
            if (c == ',') {
                if (schema_ && open == '{' && !more_keys()) return false;
                if (schema_ && open == '[') {
                    if (levels_.top().count >= container().max_items) return false;
                    value_node_ = container().item_node(levels_.top().count);
                }
                state_ = open == '{' ? State::key : State::value;
                return true;
            }
            if ((open == '{' && c == '}') || (open == '[' && c == ']')) {
                if (schema_ && open == '{' &&
                    ((container().required & ~levels_.top().seen) != 0 ||
                     levels_.top().count < container().min_properties))
                    return false;
                if (schema_ && open == '[' && levels_.top().count < container().min_items) return false;
                --levels_.depth;
                return end_value();
            }
            return false;
        }
        default: return false;  // done: nothing but whitespace
    }
}

bool JsonPrefix::plain(std::string_view text) {
    if (text.empty()) return false;
    for (const char ch : text) {
        const auto c = static_cast<uint8_t>(ch);
        if (c < 0x20 || c > 0x7E || c == '"' || c == '\\') return false;
    }
    return true;
}

JsonConstraint::JsonConstraint(std::span<const std::string> pieces, std::span<const uint8_t> eog,
                               std::span<const uint8_t> plain, std::string start_after,
                               std::shared_ptr<const JsonSchema> schema)
    : pieces_(pieces),
      eog_(eog),
      plain_(plain),
      schema_(std::move(schema)),
      prefix_(schema_.get()),
      gate_(std::move(start_after)) {
    if (pieces.size() != eog.size() || (!plain.empty() && plain.size() != pieces.size()))
        throw_error("json constraint: %zu pieces but %zu and %zu flags", pieces.size(), eog.size(), plain.size());
}

bool JsonConstraint::allows(int32_t token) const {
    if (token < 0 || static_cast<size_t>(token) >= pieces_.size()) return false;
    if (!gate_.open()) {
        if (eog_[static_cast<size_t>(token)]) return false;
        const std::optional<std::string> rest = gate_.after(pieces_[static_cast<size_t>(token)]);
        if (!rest) return true;
        JsonPrefix trial = prefix_;
        return trial.feed(*rest);
    }
    if (eog_[static_cast<size_t>(token)]) return prefix_.complete();
    const std::string &piece = pieces_[static_cast<size_t>(token)];
    if (piece.empty() || prefix_.complete()) return false;
    JsonPrefix trial = prefix_;
    return trial.feed(piece);
}

int64_t JsonConstraint::mask(std::span<float> logits) const {
    // Once the object has begun, two shortcuts before a token's own trial: the bytes that may come next are tried once
    // each, and a token whose first byte is not one of them is out (between values only a few bytes may come; 129K
    // tokens took 1.3 ms a mask without this); inside a string, tokens of plain characters (most of a vocabulary) are
    // in (129K tokens: 2.8 ms a mask with a trial each).
    std::array<bool, 256> first_ok{};
    const bool shortcuts = gate_.open() && !prefix_.complete();
    for (int b = 0; shortcuts && b < 256; ++b) {
        JsonPrefix trial = prefix_;
        first_ok[static_cast<size_t>(b)] = trial.feed(std::string_view(reinterpret_cast<const char *>(&b), 1));
    }
    const bool plain_ok = shortcuts && !plain_.empty() && prefix_.in_plain_string();
    return keep_allowed(logits, [&](size_t i) {
        if (i >= pieces_.size()) return false;
        const std::string &piece = pieces_[i];
        if (!shortcuts || eog_[i] || piece.empty()) return allows(static_cast<int32_t>(i));
        if (plain_ok && plain_[i]) return true;
        return first_ok[static_cast<uint8_t>(piece[0])] && allows(static_cast<int32_t>(i));
    });
}

void JsonConstraint::accept(int32_t token) {
    SPARROW_ASSERT(allows(token));
    const std::string &piece = pieces_[static_cast<size_t>(token)];
    if (!gate_.open()) {
        if (const std::optional<std::string> rest = gate_.pass(piece)) prefix_.feed(*rest);
        return;
    }
    if (!eog_[static_cast<size_t>(token)]) prefix_.feed(piece);
}

JsonVocabulary json_vocabulary(const Tokenizer &tok) {
    JsonVocabulary v;
    const int32_t n_vocab = tok.n_vocab();
    v.pieces.resize(static_cast<size_t>(n_vocab));
    v.eog.resize(static_cast<size_t>(n_vocab));
    for (int32_t id = 0; id < n_vocab; ++id) {
        v.pieces[static_cast<size_t>(id)] = tok.token_to_piece(id);
        v.eog[static_cast<size_t>(id)] = tok.is_eog(id) ? 1 : 0;
    }
    v.plain.resize(static_cast<size_t>(n_vocab));
    for (size_t i = 0; i < v.pieces.size(); ++i) v.plain[i] = !v.eog[i] && JsonPrefix::plain(v.pieces[i]) ? 1 : 0;
    return v;
}

}  // namespace sparrow
