// Schema-constrained JSON: the compiler's refusals (each names what it refuses), the byte automaton against the
// whole-document check (documents generated from each schema are read whole; hand-written near misses are refused
// at the byte that breaks them), random walks through the automaton that must always reach a document the schema
// accepts (never a dead end), and sampling through JsonConstraint's mask over a toy vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "runtime/json_prefix.h"
#include "runtime/json_schema.h"
#include "runtime/sampler.h"

namespace sparrow {
namespace {

using json = nlohmann::json;

// The schemas of these tests: the structured-output shapes people use (pydantic's $defs and Optional, enums,
// nested arrays, bounded integers and strings, recursion).
const std::vector<std::string> &schemas() {
    static const std::vector<std::string> kSchemas = {
        R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": false})",
        R"({"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue", 7, null, true]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3}},
            "required": ["colour", "tags"], "additionalProperties": false})",
        R"({"$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"], "additionalProperties": false}},
            "type": "object", "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/Point"}},
            "label": {"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}]}},
            "required": ["points"]})",
        R"({"$defs": {"Node": {"type": "object", "properties": {"value": {"type": "integer", "minimum": -5,
            "maximum": 120}, "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
            "required": ["value", "next"], "additionalProperties": false}}, "$ref": "#/$defs/Node"})",
        R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer",
            "exclusiveMinimum": 10, "exclusiveMaximum": 1000}, "e": {"const": "x\"y"}},
            "required": ["ok"], "additionalProperties": {"type": ["string", "integer"]}})",
        R"({"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "maxItems": 2}, "minItems": 2})",
        R"({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object"}},
            "required": ["b"]}, "s": {"type": "string", "minLength": 3, "maxLength": 3}}, "required": ["a", "s"]})",
        R"({"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
            "t": {"type": "number", "exclusiveMinimum": -2, "exclusiveMaximum": 3}, "u": {"type": "number",
            "minimum": 10}}, "required": ["p", "t"], "additionalProperties": false})",
        R"({"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [{"type": "integer",
            "minimum": 0, "maximum": 9}, {"enum": ["x", "y"]}], "items": false, "minItems": 1},
            "old": {"type": "array", "items": [{"type": "boolean"}], "additionalItems": {"type": "null"},
            "maxItems": 3}, "a": {"type": "integer", "minimum": 0, "maximum": 5}, "b": {"type": "boolean"},
            "c": {"type": "null"}}, "required": ["pair"], "minProperties": 2, "maxProperties": 3,
            "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 3}})",
        R"({"type": "object", "properties": {"date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
            "code": {"type": "string", "pattern": "^[A-Z]{2,3}$"}, "note": {"type": "string", "pattern": "ok|fine"},
            "kind": {"enum": ["ab", "abc", "x"], "pattern": "^ab"}}, "required": ["date", "code"],
            "additionalProperties": false})",
        R"({"type": "object", "properties": {"even": {"type": "integer", "multipleOf": 2}, "step": {"type": "number",
            "multipleOf": 25, "minimum": -60, "maximum": 130}, "big": {"multipleOf": 1000000007,
            "exclusiveMinimum": 0}}, "required": ["even", "step"], "additionalProperties": false})",
    };
    return kSchemas;
}

JsonSchema compiled(const std::string &text) { return JsonSchema::compile(json::parse(text)); }

bool reads_whole(const JsonSchema &s, const std::string &text) {
    JsonPrefix p(&s);
    return p.feed(text) && p.complete();
}

// Random documents a schema accepts, walking its compiled nodes (so every kind, property and literal is reached).
class DocumentGenerator {
  public:
    DocumentGenerator(const JsonSchema &s, uint32_t seed) : s_(s), rng_(seed) {}
    json document() { return value(s_.root(), 0, /*top=*/true); }

  private:
    const JsonSchema &s_;
    std::mt19937 rng_;
    int pick(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }

    json value(int32_t n, int depth, bool top = false) {
        std::vector<int> kinds;
        for (int k = 0; k < kJsonKinds; ++k) {
            if (s_.node(n).by_kind[static_cast<size_t>(k)] == JsonSchemaNode::kNone) continue;
            if (top && k == static_cast<int>(JsonKind::number)) continue;
            kinds.push_back(k);
        }
        if (depth > 4) {  // deep down, scalars when there are any, so that recursion stops
            std::vector<int> scalars;
            for (int k : kinds)
                if (k > static_cast<int>(JsonKind::array)) scalars.push_back(k);
            if (!scalars.empty()) kinds = scalars;
        }
        EXPECT_FALSE(kinds.empty());
        const int kind = kinds[static_cast<size_t>(pick(static_cast<int>(kinds.size())))];
        const JsonSchemaNode &g = s_.node(s_.node(n).by_kind[static_cast<size_t>(kind)]);
        if (!g.literals.empty()) {
            std::vector<json> of_kind;
            for (const std::string &l : g.literals) {
                json v = json::parse(l);
                if (static_cast<int>(JsonKind::number) == kind ? v.is_number()
                                                               : v.type() == json(kind_value(kind)).type())
                    of_kind.push_back(v);
            }
            return of_kind[static_cast<size_t>(pick(static_cast<int>(of_kind.size())))];
        }
        switch (static_cast<JsonKind>(kind)) {
            case JsonKind::object: {
                // The required properties, then optional ones and other keys while maxProperties allows (and until
                // minProperties is met).
                json o = json::object();
                const auto name = [&](size_t i) {
                    std::string quoted = "\"";
                    quoted.append(g.keys[i]).push_back('"');
                    return json::parse(quoted).get<std::string>();
                };
                for (size_t i = 0; i < g.keys.size(); ++i) {
                    if (g.required >> i & 1) o[name(i)] = value(g.key_nodes[i], depth + 1);
                }
                for (size_t i = 0; i < g.keys.size() && o.size() < g.max_properties; ++i) {
                    if ((g.required >> i & 1) || g.key_nodes[i] == JsonSchemaNode::kNone) continue;
                    if (o.size() >= g.min_properties && (depth > 3 || pick(2) == 0)) continue;
                    o[name(i)] = value(g.key_nodes[i], depth + 1);
                }
                while (g.additional != JsonSchemaNode::kNone && o.size() < g.max_properties &&
                       (o.size() < g.min_properties || (depth < 3 && pick(3) == 0)))
                    o[std::string("extra_").append(std::to_string(pick(100)))] = value(g.additional, depth + 1);
                return o;
            }
            case JsonKind::array: {
                json a = json::array();
                const uint32_t most = std::min<uint32_t>(g.max_items, g.min_items + (depth > 3 ? 0 : 3));
                const uint32_t n_items =
                    g.min_items + static_cast<uint32_t>(pick(static_cast<int>(most - g.min_items) + 1));
                for (uint32_t i = 0; i < n_items; ++i) a.push_back(value(g.item_node(i), depth + 1));
                return a;
            }
            case JsonKind::string: {
                if (g.pattern != JsonSchemaNode::kNone) {
                    // A walk through the pattern's automaton over printable ASCII, stopping at a match.
                    const JsonPattern &pat = s_.pattern(g.pattern);
                    JsonPattern::States st = pat.start();
                    std::string text;
                    while (!(pat.matches(st) && (text.size() > 12 || pick(3) == 0))) {
                        std::vector<char> next;
                        for (char c = 0x20; c < 0x7F; ++c) {
                            if (!pat.step(st, static_cast<uint8_t>(c)).empty()) next.push_back(c);
                        }
                        if (next.empty()) break;  // a whole match that nothing may follow
                        const char c = next[static_cast<size_t>(pick(static_cast<int>(next.size())))];
                        st = pat.step(st, static_cast<uint8_t>(c));
                        text += c;
                    }
                    return text;
                }
                static const std::vector<std::string> kChars = {
                    "a", "Z", " ", "\"", "\\", "\n", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "{", ":"};
                const uint32_t most = std::min<uint32_t>(g.max_length, g.min_length + 6);
                const uint32_t len =
                    g.min_length + static_cast<uint32_t>(pick(static_cast<int>(most - g.min_length) + 1));
                std::string text;
                for (uint32_t i = 0; i < len; ++i)
                    text += kChars[static_cast<size_t>(pick(static_cast<int>(kChars.size())))];
                return text;
            }
            case JsonKind::number: {
                if (g.integer_only) {
                    const int64_t lo = std::max<int64_t>(g.minimum, -1000000),
                                  hi = std::min<int64_t>(g.maximum, 1000000), m = g.multiple_of;
                    // A multiple of m in [lo, hi] (the schemas here have one).
                    const int64_t first = lo / m * m < lo ? lo / m * m + m : lo / m * m;
                    return first + m * static_cast<int64_t>(rng_() % static_cast<uint64_t>((hi - first) / m + 1));
                }
                if (!g.bounded) return pick(2) ? json(pick(1000) - 500) : json((pick(100000) - 50000) / 64.0);
                // Multiples of 1/64 inside the bounds (short decimals), the ends when they are included.
                const int64_t lo = std::max<int64_t>(g.minimum, -1000), hi = std::min<int64_t>(g.maximum, 1000);
                for (;;) {
                    const double x = static_cast<double>(lo) + pick(static_cast<int>((hi - lo) * 64) + 1) / 64.0;
                    if ((x == static_cast<double>(g.minimum) && g.min_exclusive) ||
                        (x == static_cast<double>(g.maximum) && g.max_exclusive))
                        continue;
                    return pick(2) && x == std::floor(x) ? json(static_cast<int64_t>(x)) : json(x);
                }
            }
            case JsonKind::boolean: return pick(2) == 0;
            default: return nullptr;
        }
    }
    static json kind_value(int kind) {
        switch (static_cast<JsonKind>(kind)) {
            case JsonKind::object: return json::object();
            case JsonKind::array: return json::array();
            case JsonKind::string: return "";
            case JsonKind::boolean: return false;
            default: return nullptr;
        }
    }
};

TEST(JsonSchema, RefusesWhatItCannotApplyNamingIt) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {R"x({"type": "string", "pattern": "(?=a)"})x", "lookarounds are not supported"},
        {R"({"type": "string", "pattern": "a", "maxLength": 3})", "beside minLength / maxLength"},
        {R"({"type": "string", "pattern": 5})", "must be a string"},
        {R"({"type": "object", "properties": {"n": {"type": "number", "minimum": 0.5}}})", "must be whole"},
        {R"({"type": "object", "properties": {"n": {"type": "number", "maximum": 1e16}}})", "below 1e15"},
        {R"({"type": "number", "multipleOf": 0.5})", "only whole numbers"},
        {R"({"type": "integer", "multipleOf": -2})", "must be a number above 0"},
        {R"({"anyOf": [{"type": "object"}, {"type": "object", "properties": {"a": {}}}]})", "both take object"},
        {R"({"$ref": "#/$defs/missing"})", "points to nothing"},
        {R"({"$ref": "http://example.com/s.json"})", "is not supported"},
        {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "'b' is not among the properties"},
        {R"({"type": "integer"})", "may only be a number"},
        {R"(false)", "no document satisfies"},
        {R"({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}},
            "required": ["a"]})",
         "no document satisfies"},
        {R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 4}},
            "required": ["a"]})",
         "no document satisfies"},
        {R"({"$defs": {"L": {"type": "object", "properties": {"next": {"$ref": "#/$defs/L"}},
            "required": ["next"]}}, "$ref": "#/$defs/L"})",
         "no document satisfies"},
        {R"({"type": "tuple"})", "unknown type 'tuple'"},
        {R"({"type": "array", "items": {"type": "string"}, "uniqueItems": true})", "'uniqueItems' is not supported"},
        {R"({"type": "array", "prefixItems": {"type": "string"}})", "must be a list of schemas"},
        {R"({"type": "array", "additionalItems": false})", "only beside a list under items"},
        {R"({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"], "maxProperties": 1})",
         "no document satisfies"},
        {R"({"type": "object", "properties": {"a": {}}, "additionalProperties": false, "minProperties": 2})",
         "no document satisfies"},
        {R"({"type": "array", "prefixItems": [{"type": "string"}], "items": false, "minItems": 2})",
         "no document satisfies"},
        {R"({"allOf": [{"type": "object"}, {"required": []}]})", "only a list of one schema"},
        {R"({"type": "object", "anyOf": [{"type": "object"}]})", "beside 'anyOf'"},
        {R"({"enum": []})", "non-empty list"},
        {R"({"type": "string", "maxLength": -1})", "non-negative integer"},
        {R"(42)", "must be an object or a boolean"},
    };
    for (const auto &[schema, message] : cases) {
        try {
            compiled(schema);
            ADD_FAILURE() << "compiled: " << schema;
        } catch (const std::exception &e) {
            EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what() << "\nwanted: " << message;
        }
    }
    json many = {{"type", "object"}, {"properties", json::object()}};
    for (int i = 0; i < 65; ++i) many["properties"][std::string("p").append(std::to_string(i))] = json::object();
    EXPECT_THROW(JsonSchema::compile(many), std::exception);
    EXPECT_NO_THROW(JsonSchema::compile(json::parse(R"({"type": "object", "title": "t", "description": "d",
        "properties": {"when": {"type": "string", "format": "date-time", "default": "x"}}})")));
}

TEST(JsonSchema, GeneratedDocumentsAreReadWholeAndEveryPrefixIsReadable) {
    for (size_t si = 0; si < schemas().size(); ++si) {
        const JsonSchema s = compiled(schemas()[si]);
        DocumentGenerator gen(s, static_cast<uint32_t>(100 + si));
        for (int d = 0; d < 200; ++d) {
            const json doc = gen.document();
            ASSERT_TRUE(json_schema_accepts(s, doc)) << "schema " << si << ": " << doc.dump();
            for (const std::string &text : {doc.dump(), doc.dump(1), doc.dump(-1, ' ', true)}) {
                JsonPrefix p(&s);
                size_t i = 0;
                for (; i < text.size(); ++i) {
                    if (!p.feed(std::string_view(text).substr(i, 1))) break;
                }
                ASSERT_EQ(i, text.size()) << "schema " << si << " refused byte " << i << " of " << text;
                EXPECT_TRUE(p.complete()) << "schema " << si << ": " << text;
            }
        }
    }
}

TEST(JsonSchema, NearMissesAreRefused) {
    // (schema index, text the schema does not accept): each must fail to read whole.
    const std::vector<std::pair<size_t, std::string>> misses = {
        {0, R"({"name": "a"})"},                                 // a required property missing
        {0, R"({"name": "a", "age": 1.5})"},                     // not an integer
        {0, R"({"name": "a", "age": 1e3})"},                     // an exponent is not an integer's form
        {0, R"({"name": "a", "age": 1, "x": 1})"},               // no other keys
        {0, R"({"name": "a", "name": "b", "age": 1})"},          // a repeated key
        {0, R"({"name": 5, "age": 1})"},                         // a number for a string
        {0, R"(["name"])"},                                      // an array for an object
        {1, R"({"colour": "pink", "tags": ["a"]})"},             // not in the enum
        {1, R"({"colour": 77, "tags": ["a"]})"},                 // 7 then more digits
        {1, R"({"colour": "red", "tags": []})"},                 // minItems 1
        {1, R"({"colour": "red", "tags": ["a","b","c","d"]})"},  // maxItems 3
        {1, R"({"colour": "red", "tags": ["abcdef"]})"},         // maxLength 5
        {1, R"({"colour": "red", "tags": ["\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"]})"},  // six code points
        {2, R"({"points": [{"x": 1}]})"},                                               // y missing
        {2, R"({"points": [], "label": "a"})"},                                         // minLength 2
        {2, R"({"points": [], "label": 3})"},                                           // neither a string nor null
        {3, R"({"value": 121, "next": null})"},                                         // above the maximum
        {3, R"({"value": -6, "next": null})"},                                          // below the minimum
        {3, R"({"value": 1, "next": {"value": 2}})"},                                   // next's next missing
        {4, R"({"ok": true, "n": 10})"},                                                // exclusiveMinimum 10
        {4, R"({"ok": true, "n": 1000})"},                                              // exclusiveMaximum 1000
        {4, R"({"ok": true, "e": "x"})"},                                               // const
        {4, R"({"ok": true, "other": false})"},             // other keys hold strings or integers
        {4, R"({"ok": true, "ok": true})"},                 // a repeated key where other keys are allowed
        {4, R"({"ok": true, "z": -9223372036854775809})"},  // integers stay within int64
        {4, R"({"ok": true, "z": 9223372036854775808})"},
        {5, R"([[1]])"},                                             // minItems 2
        {5, R"([[1, 2, 3], []])"},                                   // maxItems 2 inside
        {5, R"([[10], []])"},                                        // maximum 9
        {6, R"({"a": {}, "s": "abc"})"},                             // a's b missing
        {6, R"({"a": {"b": {}}, "s": "abcd"})"},                     // exactly 3 characters
        {7, R"({"p": 1.5, "t": 0})"},                                // above the maximum
        {7, R"({"p": 1.0000001, "t": 0})"},                          // just above it
        {7, R"({"p": -0.1, "t": 0})"},                               // below the minimum
        {7, R"({"p": 0, "t": 3})"},                                  // exclusiveMaximum 3
        {7, R"({"p": 0, "t": -2.0})"},                               // exclusiveMinimum -2
        {7, R"({"p": 0, "t": 0, "u": 9.99})"},                       // minimum 10
        {7, R"({"p": 0, "t": 0, "u": 1e3})"},                        // bounded numbers are written without an exponent
        {7, R"({"p": 0.1234567890123456, "t": 0})"},                 // 16 digits: more than a bounded number's 15
        {8, R"({"pair": [1]})"},                                     // minProperties 2
        {8, R"({"pair": [1, "x"], "a": 1, "b": true, "c": null})"},  // maxProperties 3
        {8, R"({"pair": [1, "x", 2], "a": 1})"},                     // no items past the prefix
        {8, R"({"pair": [], "a": 1})"},                              // minItems 1
        {8, R"({"pair": ["x"], "a": 1})"},                           // the first item is an integer
        {8, R"({"pair": [1, "z"], "a": 1})"},                        // the second one of the enum
        {8, R"({"pair": [1], "old": [null], "a": 1})"},              // old's first item is a boolean
        {8, R"({"pair": [1], "old": [true, 1]})"},                   // then nulls
        {8, R"({"pair": [1], "zz": 4})"},                            // other keys hold 0..3
        {8, R"({"a": 1, "b": true, "c": null})"},                    // pair is required
        {9, R"({"date": "2024-1-01", "code": "AB"})"},               // \d{2}
        {9, R"({"date": "2024-01-01", "code": "ABCD"})"},            // [A-Z]{2,3}
        {9, R"({"date": "2024-01-01", "code": "Ab"})"},
        {9, R"({"date": "2024-01-01", "code": "AB", "note": "nope"})"},  // neither ok nor fine
        {9, R"({"date": "2024-01-01", "code": "AB", "kind": "x"})"},     // an enum value the pattern refuses
        {9, R"({"date": "2024-01-01\n", "code": "AB"})"},                // $ ends the string
        {10, R"({"even": 3, "step": 0})"},                               // multipleOf 2
        {10, R"({"even": 2, "step": 130})"},                             // the maximum is no multiple of 25
        {10, R"({"even": 2, "step": 13})"},                              // nor are 13 and 130-139
        {10, R"({"even": 2, "step": -75})"},                             // below the minimum
        {10, R"({"even": 2, "step": 0, "big": 0})"},                     // exclusiveMinimum 0
        {10, R"({"even": 2, "step": 0, "big": 1000000008})"},            // multipleOf 1000000007
    };
    for (const auto &[si, text] : misses) {
        const JsonSchema s = compiled(schemas()[si]);
        // What the parsed value does not show: a repeated key (parsing keeps one), a bounded number's form.
        const bool text_only = text.find("\"name\": \"b\"") != std::string::npos ||
                               text.find("\"ok\": true, \"ok\"") != std::string::npos ||
                               text.find("1e3") != std::string::npos || text.find("0.12345678901") != std::string::npos;
        if (!text_only) {
            EXPECT_FALSE(json_schema_accepts(s, json::parse(text))) << si << ": " << text;
        }
        EXPECT_FALSE(reads_whole(s, text)) << si << ": " << text;
        // Every prefix read can still go on with something other than whitespace (or is whole): a miss is refused
        // at the byte that breaks it, never by a state with no way out.
        JsonPrefix p(&s);
        for (size_t i = 0; i < text.size() && p.feed(text.substr(i, 1)); ++i) {
            bool goes_on = p.complete();
            for (int b = 0x21; b < 256 && !goes_on; ++b) {
                JsonPrefix trial = p;
                goes_on = trial.feed(std::string(1, static_cast<char>(b)));
            }
            EXPECT_TRUE(goes_on) << si << ": dead end after " << text.substr(0, i + 1);
        }
    }
    // And their fixed forms are read.
    const std::vector<std::pair<size_t, std::string>> hits = {
        {0, R"({"age": -0, "name": "\u0041"})"},
        {1, R"({"tags": ["\u00e9\u00e9\u00e9\u00e9\u00e9"], "colour": 7})"},
        {1, R"({"colour": null, "tags": ["a", "b", "c"]})"},
        {3, R"({"value": 120, "next": {"value": -5, "next": null}})"},
        {4, R"({"ok": false, "n": 11, "e": "x\"y", "z": "s", "w": -3})"},
        {4, R"({"ok": true, "z": -9223372036854775808, "w": 9223372036854775807})"},
        {5, R"([[0, 9], []])"},
        {6, R"({"a": {"b": {"c": [1, {"d": null}]}}, "s": "\ud83d\ude00ab", "more": 1})"},
        {7, R"({"p": 1, "t": -1.99999999999999})"},
        {7, R"({"p": 1.00000000, "t": 2.9999, "u": 10})"},
        {7, R"({"p": 0.0, "t": -0, "u": 123456789012345})"},
        {7, R"({"t": 0.5, "p": -0.0})"},
        {8, R"({"pair": [1, "y"], "old": [true, null, null]})"},
        {8, R"({"pair": [0], "zz": 3})"},
        {8, R"({"b": false, "pair": [9, "x"], "c": null})"},
        {9, R"({"code": "XYZ", "date": "1999-12-31", "note": "it is fine \u00e9", "kind": "abc"})"},
        {9, R"({"date": "0000-00-00", "code": "\u0041B", "note": "\"ok\""})"},
        {10, R"({"even": -4, "step": -50})"},
        {10, R"({"even": 0, "step": 125, "big": 1000000007})"},
        {10, R"({"step": 0, "even": 9223372036854775806, "big": 9000000063})"},
    };
    for (const auto &[si, text] : hits) {
        const JsonSchema s = compiled(schemas()[si]);
        EXPECT_TRUE(json_schema_accepts(s, json::parse(text))) << si << ": " << text;
        EXPECT_TRUE(reads_whole(s, text)) << si << ": " << text;
    }
}

// Random walks, byte by byte, through what the automaton allows: every walk must find an allowed byte at every
// step, and a walk that ends must end in a document the schema accepts. Bytes that close things are preferred as
// the text grows, so that walks end; an object that needs a property while other keys are allowed rarely gets it
// by chance (such walks are cut at 1500 bytes), so the schemas whose objects are closed must end most walks.
TEST(JsonSchema, RandomWalksNeverDeadEndAndEndInAcceptedDocuments) {
    for (size_t si = 0; si < schemas().size(); ++si) {
        const JsonSchema s = compiled(schemas()[si]);
        std::mt19937 rng(static_cast<uint32_t>(7 + si));
        int ended = 0;
        const int n_walks = 60;
        for (int walk = 0; walk < n_walks; ++walk) {
            JsonPrefix p(&s);
            std::string text;
            while (!p.complete() && text.size() < 1500) {
                std::vector<std::pair<uint8_t, double>> allowed;
                double total = 0.0;
                for (int b = 1; b < 256; ++b) {
                    JsonPrefix trial = p;
                    if (!trial.feed(std::string(1, static_cast<char>(b)))) continue;
                    double w = 1.0;
                    const bool closer = b == '}' || b == ']' || b == '"' || b == ':';
                    const bool opener = b == '{' || b == '[' || b == ',';
                    if (text.size() > 40 && closer) w = 400.0;
                    if (text.size() > 40 && opener) w = 0.05;
                    if (b == ' ' || b == '\n' || b == '\t' || b == '\r') w = 0.2;
                    allowed.emplace_back(static_cast<uint8_t>(b), w);
                    total += w;
                }
                ASSERT_FALSE(allowed.empty()) << "schema " << si << " dead end after: " << text;
                double r = std::uniform_real_distribution<double>(0.0, total)(rng);
                uint8_t chosen = allowed.back().first;
                for (const auto &[b, w] : allowed) {
                    if ((r -= w) <= 0.0) {
                        chosen = b;
                        break;
                    }
                }
                text += static_cast<char>(chosen);
                ASSERT_TRUE(p.feed(std::string(1, static_cast<char>(chosen))));
            }
            if (!p.complete()) continue;
            ++ended;
            json doc;
            ASSERT_NO_THROW(doc = json::parse(text)) << text;
            EXPECT_TRUE(json_schema_accepts(s, doc)) << "schema " << si << ": " << text;
        }
        const bool closed = si == 0 || si == 1 || si == 3 || si == 5 || si == 7;
        if (closed) {
            EXPECT_GT(ended, n_walks / 2) << "schema " << si;
        }
    }
}

TEST(JsonSchema, SamplingThroughTheMaskEndsInAcceptedDocuments) {
    // A toy vocabulary: JSON punctuation, a few words and digits, property names whole and in parts, and an end.
    std::vector<std::string> pieces = {
        "{",      "}",     "[",     "]",     ",",      ":",   "\"",   " ",   "\n",        "a",      "b",    "ab",
        "red",    "e",     "green", "x",     "y",      "0",   "1",    "7",   "9",         "12",     "-",    ".",
        "5",      "null",  "true",  "false", "\"name", "\":", "name", "age", "\"age\": ", "colour", "tags", "\\\"",
        "points", "label", "value", "next",  "ok",     "n",   "s",    "\"}", "\"]",       "é"};
    for (char c = 'a'; c <= 'z'; ++c) pieces.emplace_back(1, c);  // every key can be finished letter by letter
    for (char c = 'A'; c <= 'Z'; ++c) pieces.emplace_back(1, c);  // and every pattern's letters and digits written
    for (char c = '0'; c <= '9'; ++c) pieces.emplace_back(1, c);
    pieces.emplace_back("");  // the end of generation
    std::vector<uint8_t> eog(pieces.size(), 0);
    eog[pieces.size() - 1] = 1;
    std::vector<uint8_t> plain(pieces.size());  // the mask's shortcut inside strings, checked against trials below
    for (size_t i = 0; i < pieces.size(); ++i) plain[i] = !eog[i] && JsonPrefix::plain(pieces[i]) ? 1 : 0;
    for (size_t si = 0; si < schemas().size(); ++si) {
        const auto schema = std::make_shared<const JsonSchema>(compiled(schemas()[si]));
        int n_ended = 0;
        for (uint32_t seed = 0; seed < 30; ++seed) {
            SamplerParams sp;
            sp.temp = 1.0f;
            sp.top_k = 0;
            sp.top_p = 1.0f;
            sp.seed = seed;
            Sampler sampler(sp);
            JsonConstraint constraint(pieces, eog, plain, {}, schema);
            std::vector<float> scratch;
            std::string text;
            std::mt19937 rng(seed);
            bool ended = false;
            for (int step = 0; step < 1500 && !ended; ++step) {
                // Logits that favour closing as the text grows (a model that finishes its reply).
                std::vector<float> logits(pieces.size());
                for (size_t i = 0; i < pieces.size(); ++i) {
                    logits[i] = std::normal_distribution<float>(0.0f, 1.0f)(rng);
                    const std::string &t = pieces[i];
                    if (text.size() > 30 && (t == "}" || t == "]" || t == "\"" || t == "\"}" || t == "\"]" || eog[i]))
                        logits[i] += 6.0f;
                    if (t == "points" || t == "value" || t == "next" || t == "ok" || t == "a" || t == "b" || t == "s" ||
                        t == "tags" || t == "colour" || t == "name" || t == "age" || t == "null")
                        logits[i] += 3.0f;  // the schemas' names, which a model asked for them would write
                }
                std::vector<float> masked(pieces.size(), 0.0f);
                constraint.mask(masked);
                for (size_t i = 0; i < pieces.size(); ++i) {
                    ASSERT_EQ(masked[i] == 0.0f, constraint.allows(static_cast<int32_t>(i)))
                        << "schema " << si << ": the mask and a trial differ on '" << pieces[i] << "' after " << text;
                }
                const int32_t token = sample_constrained(sampler, logits, constraint, scratch);
                ASSERT_GE(token, 0) << "schema " << si << " dead end after: " << text;
                if (eog[static_cast<size_t>(token)]) {
                    ended = true;
                } else {
                    text += pieces[static_cast<size_t>(token)];
                }
            }
            if (!ended) continue;
            ++n_ended;
            EXPECT_TRUE(json_schema_accepts(*schema, json::parse(text))) << "schema " << si << ": " << text;
        }
        const bool closed = si == 0 || si == 1 || si == 3 || si == 5 || si == 7;  // as in the random walks
        if (closed) {
            EXPECT_GT(n_ended, 15) << "schema " << si;
        }
    }
}

// The compiler against hostile input: schemas mutated at random (values swapped for others of any type, keywords
// added with odd values, $refs and anyOfs sprinkled in) must compile or throw, never crash or hang; what compiles
// must walk without dead ends into documents its nodes accept. Nesting past the bound is refused.
TEST(JsonSchema, MutatedSchemasCompileOrFailCleanly) {
    std::mt19937 rng(11);
    const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
    const std::vector<json> values = {json::object(),
                                      json::array(),
                                      "x",
                                      5,
                                      -1,
                                      0,
                                      2.5,
                                      true,
                                      false,
                                      nullptr,
                                      json::parse(R"({"type": "weird"})"),
                                      json::parse(R"({"$ref": "#"})"),
                                      json::parse(R"({"anyOf": [{"type": "string"}, {"type": "null"}]})"),
                                      json::parse(R"({"enum": [1, "a", null, [1], {"k": 2}]})"),
                                      json::parse(R"(["string", "integer"])"),
                                      json::parse(R"(["a", "b"])")};
    const std::vector<std::string> keywords = {"type",
                                               "properties",
                                               "items",
                                               "enum",
                                               "const",
                                               "required",
                                               "minItems",
                                               "maxItems",
                                               "minLength",
                                               "maxLength",
                                               "minimum",
                                               "maximum",
                                               "$ref",
                                               "anyOf",
                                               "oneOf",
                                               "allOf",
                                               "additionalProperties",
                                               "$defs",
                                               "pattern",
                                               "title"};
    int compiled_ok = 0, refused = 0;
    for (int round = 0; round < 1500; ++round) {
        json schema = json::parse(schemas()[static_cast<size_t>(pick(static_cast<int>(schemas().size())))]);
        for (int m = 1 + pick(4); m > 0; --m) {
            // A random object node of the schema tree: walk down a few steps.
            json *node = &schema;
            for (int d = pick(5); d > 0; --d) {
                if (!node->is_structured() || node->empty()) break;
                auto it = node->begin();
                std::advance(it, pick(static_cast<int>(node->size())));
                node = &*it;
            }
            if (node->is_object() && pick(2) == 0) {
                (*node)[keywords[static_cast<size_t>(pick(static_cast<int>(keywords.size())))]] =
                    values[static_cast<size_t>(pick(static_cast<int>(values.size())))];
            } else {
                *node = values[static_cast<size_t>(pick(static_cast<int>(values.size())))];
            }
        }
        std::optional<JsonSchema> s;
        try {
            s.emplace(JsonSchema::compile(schema));
        } catch (const std::exception &e) {
            EXPECT_NE(std::string(e.what()).find("json_schema"), std::string::npos) << e.what();
            ++refused;
            continue;
        }
        ++compiled_ok;
        JsonPrefix p(&*s);
        std::string text;
        while (!p.complete() && text.size() < 300) {
            std::vector<uint8_t> allowed;
            for (int b = 1; b < 256; ++b) {
                JsonPrefix trial = p;
                if (trial.feed(std::string(1, static_cast<char>(b)))) allowed.push_back(static_cast<uint8_t>(b));
            }
            ASSERT_FALSE(allowed.empty()) << schema.dump() << "\ndead end after: " << text;
            // Closers first once the text is long, so that some walks end.
            uint8_t b = allowed[static_cast<size_t>(pick(static_cast<int>(allowed.size())))];
            if (text.size() > 30) {
                for (const uint8_t c : allowed) {
                    if (c == '}' || c == ']' || c == '"') b = c;
                }
            }
            text += static_cast<char>(b);
            ASSERT_TRUE(p.feed(std::string(1, static_cast<char>(b))));
        }
        if (!p.complete()) continue;
        json doc;
        try {
            doc = json::parse(text);
        } catch (const json::out_of_range &) {
            continue;  // a number beyond a double's range (an unbounded number's exponent): valid JSON, not parsed
        }
        EXPECT_TRUE(json_schema_accepts(*s, doc)) << schema.dump() << "\n" << text;
    }
    EXPECT_GT(compiled_ok, 100);
    EXPECT_GT(refused, 100);
    json deep = json::object();
    json *at = &deep;
    for (int i = 0; i < 200; ++i) at = &((*at)["items"] = json::object());
    try {
        JsonSchema::compile(deep);
        ADD_FAILURE() << "a schema nested 200 deep compiled";
    } catch (const std::exception &e) {
        EXPECT_NE(std::string(e.what()).find("nested deeper"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace sparrow
