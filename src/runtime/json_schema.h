// A JSON Schema compiled for constrained sampling (OpenAI's response_format {"type": "json_schema"}): a table of
// nodes that JsonPrefix consults byte by byte, so that the generated text stays the beginning of a document the
// schema accepts and can always be finished into one.
//
// The subset (what structured-output schemas use): type (one or a list), properties, required,
// additionalProperties (a boolean or a schema), minProperties, maxProperties, items, prefixItems (or draft 7's
// items list with additionalItems), minItems, maxItems, minLength, maxLength, pattern (runtime/json_pattern.h; not
// beside the length bounds), enum, const,
// anyOf / oneOf whose alternatives take different JSON types (a value's first byte tells which one applies),
// allOf of one schema, $ref into #/$defs or #/definitions (recursion included), and minimum / maximum /
// exclusiveMinimum / exclusiveMaximum on integers, and whole ones on numbers, and a whole multipleOf (numbers are
// then integers). Annotations (title, description, format, default, ...) are ignored, as JSON Schema allows.
// Assertions outside the subset (a fractional multipleOf, uniqueItems, fractional bounds on numbers, ...) are refused
// with a message naming them: a schema is never half applied.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/json_pattern.h"

namespace sparrow {

// The kinds of JSON value, as a value's first byte tells them apart.
enum class JsonKind : uint8_t { object, array, string, number, boolean, null };
constexpr int kJsonKinds = 6;

struct JsonSchemaNode {
    static constexpr int32_t kNone = -1;
    // The node that governs a value of each kind (itself, or an anyOf alternative's); kNone: the kind is refused.
    std::array<int32_t, kJsonKinds> by_kind{kNone, kNone, kNone, kNone, kNone, kNone};
    // enum / const: a value must be one of these texts byte for byte (compact JSON, as nlohmann writes it).
    std::vector<std::string> literals;
    // Numbers: integers only (no fraction or exponent), within [minimum, maximum] when bounded (integers always
    // are: int64's range at least; at most kMaxIntegerDigits digits, which reach past it). Bounded numbers that are
    // not integers only have whole bounds (exclusive ones kept as such), no exponent and at most kMaxBoundedDigits
    // digits, so that any double reads them back on the right side of a bound.
    static constexpr int kMaxBoundedDigits = 15, kMaxIntegerDigits = 19;
    bool integer_only = false;
    bool bounded = false;
    int64_t minimum = std::numeric_limits<int64_t>::min(), maximum = std::numeric_limits<int64_t>::max();
    bool min_exclusive = false, max_exclusive = false;  // numbers (not integers only)
    // Integers only: values are multiples of this (multipleOf, whole; 1: any integer).
    int64_t multiple_of = 1;
    // Objects: the properties (keys as written between the quotes, escaped as nlohmann writes them), which are
    // required (a bit per property), what other keys may hold (a node, or kNone: no other keys), and the bounds on
    // the number of keys.
    std::vector<std::string> keys;
    std::vector<int32_t> key_nodes;
    uint64_t required = 0;
    int32_t additional = 0;
    uint32_t min_properties = 0, max_properties = std::numeric_limits<uint32_t>::max();
    // Arrays: the first items' nodes (prefixItems, or draft 7's list of items), then the rest's, and the count's
    // bounds.
    std::vector<int32_t> prefix_items;
    int32_t items = 0;
    int32_t item_node(uint32_t i) const { return i < prefix_items.size() ? prefix_items[i] : items; }
    uint32_t min_items = 0, max_items = std::numeric_limits<uint32_t>::max();
    // Strings: the length's bounds in code points, and a pattern the string must match (an index into
    // JsonSchema's patterns; kNone: none; not beside length bounds).
    uint32_t min_length = 0, max_length = std::numeric_limits<uint32_t>::max();
    int32_t pattern = kNone;
};

class JsonSchema {
  public:
    // At most this many properties per object and values per enum (JsonPrefix keeps a bit for each).
    static constexpr size_t kMaxAlternatives = 64;

    // Compiles `schema`; throws (core/error.h) naming the keyword and where it sits when the schema is malformed,
    // outside the subset, or accepts no document.
    static JsonSchema compile(const nlohmann::json &schema);

    // Node 0 accepts any value; root() is the document's.
    const JsonSchemaNode &node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
    int32_t root() const { return root_; }
    size_t size() const { return nodes_.size(); }
    const JsonPattern &pattern(int32_t i) const { return patterns_[static_cast<size_t>(i)]; }

  private:
    friend class JsonSchemaCompiler;
    friend bool json_schema_accepts(const JsonSchema &schema, const nlohmann::json &document);
    std::vector<JsonSchemaNode> nodes_;
    std::vector<JsonPattern> patterns_;
    int32_t root_ = 0;
};

// Whether `document` satisfies `schema` (the same subset, checked on a whole parsed value): what the constrained
// text must parse into. For tests and for checking a finished reply.
bool json_schema_accepts(const JsonSchema &schema, const nlohmann::json &document);

}  // namespace sparrow
