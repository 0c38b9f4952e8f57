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

}  // namespace

bool JsonPrefix::feed(std::string_view bytes) {
    for (const char ch : bytes) {
        if (!byte(static_cast<uint8_t>(ch))) return false;
    }
    return true;
}

bool JsonPrefix::end_value() {
    state_ = depth_ == 0 ? State::done : State::after_value;
    return true;
}

// The first byte of a value (whitespace handled by the caller).
bool JsonPrefix::start_value(uint8_t c) {
    if (depth_ == 0 && c != '{') return false;  // the top is an object
    switch (c) {
        case '{':
        case '[':
            if (depth_ == kMaxDepth) return false;
            stack_[depth_++] = static_cast<char>(c);
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
    switch (state_) {
        case State::string:
            if (pending_low_ && c != '\\') return false;  // a high surrogate's escape wants its low half next
            if (c == '"') {
                if (key_string_) {
                    state_ = State::colon;
                    return true;
                }
                return end_value();
            }
            if (c == '\\') {
                state_ = State::string_escape;
                return true;
            }
            if (c < 0x20) return false;  // control characters are escaped in JSON
            if (c < 0x80) return true;
            // A UTF-8 lead byte (RFC 3629): its length and the range of its first continuation byte.
            utf8_min_second_ = 0x80;
            utf8_max_second_ = 0xBF;
            if (c >= 0xC2 && c <= 0xDF) {
                utf8_left_ = 1;
            } else if (c >= 0xE0 && c <= 0xEF) {
                utf8_left_ = 2;
                if (c == 0xE0) utf8_min_second_ = 0xA0;  // no overlong forms
                if (c == 0xED) utf8_max_second_ = 0x9F;  // no surrogates
            } else if (c >= 0xF0 && c <= 0xF4) {
                utf8_left_ = 3;
                if (c == 0xF0) utf8_min_second_ = 0x90;
                if (c == 0xF4) utf8_max_second_ = 0x8F;  // nothing above U+10FFFF
            } else {
                return false;
            }
            state_ = State::string_utf8;
            return true;
        case State::string_utf8:
            if (c < utf8_min_second_ || c > utf8_max_second_) return false;
            utf8_min_second_ = 0x80;
            utf8_max_second_ = 0xBF;
            if (--utf8_left_ == 0) state_ = State::string;
            return true;
        case State::string_escape:
            if (pending_low_ && c != 'u') return false;
            switch (c) {
                case '"':
                case '\\':
                case '/':
                case 'b':
                case 'f':
                case 'n':
                case 'r':
                case 't': state_ = State::string; return true;
                case 'u':
                    state_ = State::string_hex;
                    hex_left_ = 4;
                    code_ = 0;
                    return true;
                default: return false;
            }
        case State::string_hex: {
            if (!is_hex(c)) return false;
            code_ = static_cast<uint16_t>(code_ * 16 + hex_value(c));
            if (--hex_left_ > 0) return true;
            // Surrogates come in pairs, high (D800-DBFF) then low (DC00-DFFF), as nlohmann and most parsers demand.
            const bool high = code_ >= 0xD800 && code_ <= 0xDBFF, low = code_ >= 0xDC00 && code_ <= 0xDFFF;
            if (pending_low_ != low) return false;
            pending_low_ = high;
            state_ = State::string;
            return true;
        }
        case State::minus:
            if (c == '0') {
                state_ = State::zero;
                return true;
            }
            if (c >= '1' && c <= '9') {
                state_ = State::integer;
                return true;
            }
            return false;
        case State::integer:
            if (is_digit(c)) return true;
            [[fallthrough]];
        case State::zero:
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
            state_ = State::fraction;
            return true;
        case State::fraction:
            if (is_digit(c)) return true;
            if (c == 'e' || c == 'E') {
                state_ = State::exponent;
                return true;
            }
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
                --depth_;
                return end_value();
            }
            return start_value(c);
        case State::key_or_end:
            if (c == '}') {
                --depth_;
                return end_value();
            }
            [[fallthrough]];
        case State::key:
            if (c != '"') return false;
            key_string_ = true;
            state_ = State::string;
            return true;
        case State::colon:
            if (c != ':') return false;
            state_ = State::value;
            return true;
        case State::after_value: {
            const char open = stack_[depth_ - 1];
            if (c == ',') {
                state_ = open == '{' ? State::key : State::value;
                return true;
            }
            if ((open == '{' && c == '}') || (open == '[' && c == ']')) {
                --depth_;
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
                               std::span<const uint8_t> plain, std::string start_after)
    : pieces_(pieces), eog_(eog), plain_(plain), start_after_(std::move(start_after)), started_(start_after_.empty()) {
    if (pieces.size() != eog.size() || (!plain.empty() && plain.size() != pieces.size()))
        throw_error("json constraint: %zu pieces but %zu and %zu flags", pieces.size(), eog.size(), plain.size());
}

size_t JsonConstraint::start_end(std::string_view text) const {
    const size_t at = text.find(start_after_);
    return at == std::string_view::npos ? at : at + start_after_.size();
}

bool JsonConstraint::allows(int32_t token) const {
    if (token < 0 || static_cast<size_t>(token) >= pieces_.size()) return false;
    if (!started_) {
        if (eog_[static_cast<size_t>(token)]) return false;
        const std::string text = tail_ + pieces_[static_cast<size_t>(token)];
        const size_t end = start_end(text);
        if (end == std::string::npos) return true;
        JsonPrefix trial = prefix_;
        return trial.feed(std::string_view(text).substr(end));
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
    const bool shortcuts = started_ && !prefix_.complete();
    for (int b = 0; shortcuts && b < 256; ++b) {
        JsonPrefix trial = prefix_;
        first_ok[static_cast<size_t>(b)] = trial.feed(std::string_view(reinterpret_cast<const char *>(&b), 1));
    }
    const bool plain_ok = shortcuts && !plain_.empty() && prefix_.in_plain_string();
    int64_t n = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
        bool ok = false;
        if (i < pieces_.size()) {
            const std::string &piece = pieces_[i];
            if (!shortcuts || eog_[i] || piece.empty()) {
                ok = allows(static_cast<int32_t>(i));
            } else if (plain_ok && plain_[i]) {
                ok = true;
            } else {
                ok = first_ok[static_cast<uint8_t>(piece[0])] && allows(static_cast<int32_t>(i));
            }
        }
        if (ok) {
            n += logits[i] > -std::numeric_limits<float>::infinity() ? 1 : 0;
        } else {
            logits[i] = -std::numeric_limits<float>::infinity();
        }
    }
    return n;
}

void JsonConstraint::accept(int32_t token) {
    SPARROW_ASSERT(allows(token));
    const std::string &piece = pieces_[static_cast<size_t>(token)];
    if (!started_) {
        const std::string text = tail_ + piece;
        const size_t end = start_end(text);
        if (end == std::string::npos) {
            tail_ = text.substr(text.size() - std::min(text.size(), start_after_.size() - 1));
            return;
        }
        started_ = true;
        tail_.clear();
        prefix_.feed(std::string_view(text).substr(end));
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

int32_t sample_json(Sampler &sampler, std::span<const float> logits, JsonConstraint &json,
                    std::vector<float> &scratch) {
    int32_t token = sampler.sample(logits);
    if (!json.allows(token)) {
        scratch.assign(logits.begin(), logits.end());
        if (json.mask(scratch) == 0) return -1;
        token = sampler.sample(scratch);
        if (!json.allows(token)) token = argmax(scratch);  // a cut left only masked tokens to draw: the best allowed
    }
    json.accept(token);
    return token;
}

}  // namespace sparrow
