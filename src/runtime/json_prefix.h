// JSON mode (OpenAI's response_format {"type": "json_object"}): the sampler may only pick tokens that keep the
// generated text the beginning of a JSON object (RFC 8259), and may end only once the object is whole; with a
// schema ({"type": "json_schema"}, runtime/json_schema.h), the beginning of a document the schema accepts.
//
// JsonPrefix reads a text byte by byte and says whether it can still be continued into one such document; it is a
// small state (a stack of open containers with their schema nodes, and the lexical state), so checking a candidate
// token is a copy and a feed of its text. JsonConstraint applies it to a vocabulary: which tokens may
// come next.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/constraint.h"
#include "runtime/json_schema.h"

namespace sparrow {

class JsonPrefix {
  public:
    // Any JSON object, or with `schema` (which must outlive this) a document it accepts.
    explicit JsonPrefix(const JsonSchema *schema = nullptr)
        : schema_(schema), value_node_(schema ? schema->root() : 0) {}

    // Containers nested deeper than this are refused (the automaton stays finite; a model that keeps opening
    // brackets is stopped there).
    static constexpr int kMaxDepth = 32;
    // Longest run of whitespace between tokens (as llama.cpp's JSON grammar bounds it): a model cannot pad forever.
    static constexpr int kMaxWhitespace = 20;

    // Reads `bytes`; false when they cannot continue the text read so far (the state is then unspecified: check
    // on a copy).
    bool feed(std::string_view bytes);
    // A whole object has been read (only whitespace may follow it).
    bool complete() const { return state_ == State::done; }
    // Inside a string where any plain character (0x20-0x7E but '"' and '\\') is taken (with a schema: a value string
    // with no maximum length, or a key where other keys than the properties are allowed).
    bool in_plain_string() const {
        return state_ == State::string && !pending_low_ &&
               (!schema_ ||
                (key_string_ ? key_free_ : str_max_ == std::numeric_limits<uint32_t>::max() && pat_id_ < 0));
    }
    // Whether every byte of `text` is a plain character (and there is one): what in_plain_string() always takes.
    static bool plain(std::string_view text);

  private:
    enum class State : uint8_t {
        value,            // a value (at the top: an object)
        key_or_end,       // after '{': a key or '}'
        key,              // after ',' in an object: a key
        colon,            // after a key
        value_or_end,     // after '[': a value or ']'
        after_value,      // after a value inside a container: ',' or the container's close
        string,           // inside a string
        string_escape,    // after '\'
        string_hex,       // after '\u' and hex_left more hex digits to read
        string_utf8,      // inside a multi-byte UTF-8 character, utf8_left continuation bytes to read
        minus,            // a number's '-': a digit next
        zero,             // a number's leading 0: '.', 'e', or its end
        integer,          // a number's integer digits
        dot,              // a number's '.': a digit next
        fraction,         // a number's fraction digits
        exponent,         // 'e' or 'E': a sign or a digit next
        exponent_sign,    // the exponent's sign: a digit next
        exponent_digits,  // the exponent's digits
        literal,          // inside true / false / null
        done,             // the object is whole
    };
    bool byte(uint8_t c);
    bool start_value(uint8_t c);
    bool end_value();  // a value ended: after_value inside a container, done at the top
    // The schema's side (schema_ set): a value's start under value_node_, a byte of an enum / const value, of an
    // object key, whether the open object may take another key, a string's characters under a pattern, and a bounded
    // number's digits.
    bool start_schema_value(uint8_t c);
    bool literal_byte(uint8_t c);
    bool key_byte(uint8_t c);
    bool close_key();
    bool more_keys() const;
    bool pattern_char(uint32_t cp);
    bool pattern_range(uint32_t lo, uint32_t hi) const;
    bool pattern_hex() const;
    bool number_digit(uint8_t c);
    bool number_ends();
    bool number_reachable() const;
    bool number_meets(__int128 lo, bool lo_closed, __int128 hi, bool hi_closed, int scale) const;
    const JsonSchemaNode &container() const { return schema_->node(levels_.top().node); }

    State state_ = State::value;
    bool key_string_ = false;  // the string being read is an object key
    uint8_t hex_left_ = 0, utf8_left_ = 0;
    uint16_t code_ = 0;         // the \u escape's value so far
    bool pending_low_ = false;  // a high surrogate's escape was read: its low half must follow
    uint8_t utf8_min_second_ = 0x80, utf8_max_second_ = 0xBF;  // the range the next continuation byte must be in
    uint8_t literal_ = 0, literal_at_ = 0;                     // which of true / false / null, and bytes matched
    uint8_t whitespace_run_ = 0;
    // One open container: '{' or '[', its schema node, and the properties written (objects, a bit each) or the items
    // written (arrays).
    struct Level {
        char open;
        int32_t node;
        uint64_t seen;
        uint32_t count;
    };
    // The open containers, copied only as deep as they go: a trial copies the whole state once per candidate token
    // (a mask over a 128K vocabulary copied ~700 bytes 40K times inside a string when all 32 levels were copied).
    struct Levels {
        int depth = 0;
        Level at[kMaxDepth];  // [0, depth) are set
        Levels() = default;
        Levels(const Levels &o) : depth(o.depth) { std::copy_n(o.at, depth, at); }
        Levels &operator=(const Levels &o) {
            depth = o.depth;
            std::copy_n(o.at, depth, at);
            return *this;
        }
        Level &top() { return at[depth - 1]; }
        const Level &top() const { return at[depth - 1]; }
    };
    Levels levels_;

    const JsonSchema *schema_ = nullptr;
    int32_t value_node_ = 0;  // the schema node of the next value to start
    // The string being read: code points so far and the bounds (keys: none); with a pattern (pat_id_ >= 0), the
    // states its characters so far leave it in, each character decoded from its UTF-8 bytes (utf8_cp_) or escape
    // (a surrogate pair's high half kept in high_).
    uint32_t str_chars_ = 0, str_min_ = 0, str_max_ = std::numeric_limits<uint32_t>::max();
    int32_t pat_id_ = -1;
    JsonPattern::States pat_;
    uint32_t utf8_cp_ = 0;
    uint16_t high_ = 0;
    // The key being read: the properties it may still be (a bit each), bytes read, whether other keys are allowed;
    // once closed, its property (-1: another key).
    uint64_t key_cands_ = 0;
    uint32_t key_at_ = 0;
    bool key_free_ = false;
    int32_t key_prop_ = -1;
    // An enum / const value being read: its node, the texts it may still be, bytes read.
    bool literal_value_ = false;
    int32_t lit_node_ = 0;
    uint64_t lit_cands_ = 0;
    uint32_t lit_at_ = 0;
    // A number under a bounded node (num_node_ >= 0; every integer_only one is): its sign, its digits so far as one
    // integer (the fraction's too), how many, and after a '.' how many of them are the fraction's.
    int32_t num_node_ = -1;
    bool num_neg_ = false, num_digits_ = false, num_frac_ = false;
    uint64_t num_mag_ = 0;
    int num_n_ = 0, num_k_ = 0;
};

class Tokenizer;

// What a JsonConstraint reads of a vocabulary: each token's text and whether it ends generation.
struct JsonVocabulary {
    std::vector<std::string> pieces;
    std::vector<uint8_t> eog;
    std::vector<uint8_t> plain;  // JsonPrefix::plain(piece): taken inside a string without a trial
};
JsonVocabulary json_vocabulary(const Tokenizer &tok);

// A JsonPrefix over a vocabulary: pieces[id] is each token's text, eog[id] whether it ends generation, and plain[id]
// (optional: empty for none) whether JsonPrefix::plain(pieces[id]); all must outlive the constraint.
//
// With `start_after` (a thinking model's "</think>"), the object begins after the first occurrence of that text
// (StartGate, runtime/constraint.h).
class JsonConstraint final : public TokenConstraint {
  public:
    // With `schema`, the document is one the schema accepts (the constraint keeps it alive).
    JsonConstraint(std::span<const std::string> pieces, std::span<const uint8_t> eog,
                   std::span<const uint8_t> plain = {}, std::string start_after = {},
                   std::shared_ptr<const JsonSchema> schema = nullptr);
    explicit JsonConstraint(const JsonVocabulary &v, std::string start_after = {},
                            std::shared_ptr<const JsonSchema> schema = nullptr)
        : JsonConstraint(v.pieces, v.eog, v.plain, std::move(start_after), std::move(schema)) {}
    // End-of-generation tokens once the object is whole, and before that tokens whose text (not empty) continues it.
    bool allows(int32_t token) const override;
    int64_t mask(std::span<float> logits) const override;
    void accept(int32_t token) override;
    bool complete() const override { return prefix_.complete(); }

  private:
    std::span<const std::string> pieces_;
    std::span<const uint8_t> eog_, plain_;
    std::shared_ptr<const JsonSchema> schema_;
    JsonPrefix prefix_;
    StartGate gate_;
};

}  // namespace sparrow
