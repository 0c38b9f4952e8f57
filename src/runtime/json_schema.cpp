#include "runtime/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace sparrow {

namespace {

using json = nlohmann::json;
constexpr int32_t kNone = JsonSchemaNode::kNone;

constexpr JsonKind kKinds[kJsonKinds] = {JsonKind::object, JsonKind::array,   JsonKind::string,
                                         JsonKind::number, JsonKind::boolean, JsonKind::null};
constexpr const char *kKindNames[kJsonKinds] = {"object", "array", "string", "number", "boolean", "null"};
constexpr size_t at(JsonKind k) { return static_cast<size_t>(k); }

// Keywords that only annotate (JSON Schema 2020-12 treats format as an annotation too), and the assertions outside
// the subset, which are refused rather than silently dropped.
const std::set<std::string> kAnnotations = {
    "title",  "description", "default",          "examples",        "$schema",    "$id",         "$comment",
    "format", "deprecated",  "readOnly",         "writeOnly",       "$defs",      "definitions", "$anchor",
    "strict", "name",        "contentMediaType", "contentEncoding", "$vocabulary"};
const std::set<std::string> kUnsupported = {
    "patternProperties", "propertyNames",         "uniqueItems",  "contains",    "minContains",   "maxContains",
    "unevaluatedItems",  "unevaluatedProperties", "if",           "then",        "else",          "not",
    "dependentRequired", "dependentSchemas",      "dependencies", "$dynamicRef", "$recursiveRef", "$dynamicAnchor",
    "$recursiveAnchor",  "contentSchema"};

JsonKind kind_of(const json &v) {
    switch (v.type()) {
        case json::value_t::object: return JsonKind::object;
        case json::value_t::array: return JsonKind::array;
        case json::value_t::string: return JsonKind::string;
        case json::value_t::boolean: return JsonKind::boolean;
        case json::value_t::null: return JsonKind::null;
        default: return JsonKind::number;
    }
}

// The key as JsonPrefix reads it between the quotes: the text nlohmann writes for the string, quotes dropped.
std::string escaped_key(const std::string &key) {
    const std::string quoted = json(key).dump();
    return quoted.substr(1, quoted.size() - 2);
}

uint32_t count_bound(const json &v, const std::string &where) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
        throw_error("json_schema: %s: must be a non-negative integer", where.c_str());
    return static_cast<uint32_t>(std::min<int64_t>(v.get<int64_t>(), std::numeric_limits<uint32_t>::max()));
}

// A bound on an integer as a double, rounded into the integers and clamped to int64's range.
int64_t integer_bound(double x) {
    if (x <= -9.2e18) return std::numeric_limits<int64_t>::min();
    if (x >= 9.2e18) return std::numeric_limits<int64_t>::max();
    return static_cast<int64_t>(x);
}

// Code points of a UTF-8 string (bytes that are not continuation bytes).
size_t code_points(const std::string &s) {
    return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// Whether `v` satisfies node n of `nodes` (the node's literals aside when `literals` is false); `patterns` are the
// schema's.
bool accepts(const std::vector<JsonSchemaNode> &nodes, const std::vector<JsonPattern> &patterns, int32_t n,
             const json &v, bool literals = true) {
    const JsonKind kind = kind_of(v);
    const int32_t m = nodes[static_cast<size_t>(n)].by_kind[at(kind)];
    if (m == kNone) return false;
    const JsonSchemaNode &node = nodes[static_cast<size_t>(m)];
    if (literals && !node.literals.empty()) {
        return std::find(node.literals.begin(), node.literals.end(), v.dump()) != node.literals.end();
    }
    switch (kind) {
        case JsonKind::number: {
            if (!node.integer_only) {
                if (!node.bounded) return true;
                const double x = v.get<double>();
                const auto lo = static_cast<double>(node.minimum), hi = static_cast<double>(node.maximum);
                return (node.minimum == std::numeric_limits<int64_t>::min() ||
                        (node.min_exclusive ? x > lo : x >= lo)) &&
                       (node.maximum == std::numeric_limits<int64_t>::max() || (node.max_exclusive ? x < hi : x <= hi));
            }
            if (!v.is_number_integer()) return false;
            if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
                return false;
            const int64_t x = v.get<int64_t>();
            return x >= node.minimum && x <= node.maximum && x % node.multiple_of == 0;
        }
        case JsonKind::string: {
            const std::string &text = v.get_ref<const std::string &>();
            const size_t n_chars = code_points(text);
            return n_chars >= node.min_length && n_chars <= node.max_length &&
                   (node.pattern == kNone || patterns[static_cast<size_t>(node.pattern)].matches(text));
        }
        case JsonKind::array: {
            if (v.size() < node.min_items || v.size() > node.max_items) return false;
            for (size_t i = 0; i < v.size(); ++i) {
                const int32_t item = node.item_node(static_cast<uint32_t>(i));
                if (item == kNone || !accepts(nodes, patterns, item, v[i])) return false;
            }
            return true;
        }
        case JsonKind::object: {
            uint64_t seen = 0;
            for (const auto &[key, value] : v.items()) {
                const auto it = std::find(node.keys.begin(), node.keys.end(), escaped_key(key));
                if (it != node.keys.end()) {
                    const auto i = static_cast<size_t>(it - node.keys.begin());
                    seen |= uint64_t(1) << i;
                    if (!accepts(nodes, patterns, node.key_nodes[i], value)) return false;
                } else if (node.additional == kNone || !accepts(nodes, patterns, node.additional, value)) {
                    return false;
                }
            }
            return (node.required & ~seen) == 0 && v.size() >= node.min_properties && v.size() <= node.max_properties;
        }
        default: return true;
    }
}

}  // namespace

class JsonSchemaCompiler {
  public:
    explicit JsonSchemaCompiler(const json &root) : root_(root) {
        JsonSchemaNode any;
        any.by_kind.fill(0);
        nodes_.push_back(any);
    }

    JsonSchema run() {
        refs_["#"] = kPending;
        const int32_t root = compile(root_, "#");
        refs_["#"] = root;
        link();
        prune();
        const std::array<int32_t, kJsonKinds> &top = nodes_[static_cast<size_t>(root)].by_kind;
        if (std::all_of(top.begin(), top.end(), [](int32_t g) { return g == kNone; }))
            throw_error("json_schema: no document satisfies the schema");
        bool top_ok = false;  // a number at the top has no end to tell (the text could always go on)
        for (int k = 0; k < kJsonKinds; ++k) top_ok = top_ok || (kKinds[k] != JsonKind::number && top[k] != kNone);
        if (!top_ok) throw_error("json_schema: the document may only be a number; make it an object or an array");
        JsonSchema s;
        s.nodes_ = std::move(nodes_);
        s.patterns_ = std::move(patterns_);
        s.root_ = root;
        return s;
    }

  private:
    static constexpr int32_t kPending = -2;

    int32_t add(JsonSchemaNode node) {
        nodes_.push_back(std::move(node));
        return static_cast<int32_t>(nodes_.size() - 1);
    }

    // A node whose by_kind will be the referenced node's once every schema is compiled (a $ref may point to a
    // schema still being compiled: recursion).
    int32_t reference(const std::string &ref, const std::string &where) {
        if (ref != "#" && ref.rfind("#/$defs/", 0) != 0 && ref.rfind("#/definitions/", 0) != 0)
            throw_error("json_schema: %s: $ref '%s' is not supported (only #, #/$defs/... and #/definitions/...)",
                        where.c_str(), ref.c_str());
        if (!refs_.count(ref)) {
            refs_[ref] = kPending;
            const std::string pointer = ref.substr(1);
            const json *target = nullptr;
            try {
                target = &root_.at(json::json_pointer(pointer));
            } catch (const std::exception &) {
                throw_error("json_schema: %s: $ref '%s' points to nothing", where.c_str(), ref.c_str());
            }
            refs_[ref] = compile(*target, ref);
        }
        const int32_t slot = add(JsonSchemaNode{});
        placeholders_.emplace_back(ref, slot);
        return slot;
    }

    // Placeholders ($ref) take their target's kinds and anyOf nodes their alternatives', repeated until nothing
    // changes: either may stand for the other (recursion), and entries only ever go from kNone to a node. Then the
    // alternatives must not overlap.
    void link() {
        for (bool changed = true; changed;) {
            changed = false;
            const auto update = [&](int32_t slot, const std::array<int32_t, kJsonKinds> &kinds) {
                std::array<int32_t, kJsonKinds> &mine = nodes_[static_cast<size_t>(slot)].by_kind;
                for (int k = 0; k < kJsonKinds; ++k) {
                    if (mine[k] == kNone && kinds[k] != kNone) {
                        mine[k] = kinds[k];
                        changed = true;
                    }
                }
            };
            for (const auto &[ref, slot] : placeholders_)
                update(slot, nodes_[static_cast<size_t>(refs_.at(ref))].by_kind);
            for (const Merge &m : merges_) {
                for (int32_t alt : m.alternatives) update(m.slot, nodes_[static_cast<size_t>(alt)].by_kind);
            }
        }
        for (const Merge &m : merges_) {
            for (int k = 0; k < kJsonKinds; ++k) {
                int owner = -1;
                for (size_t i = 0; i < m.alternatives.size(); ++i) {
                    const int32_t g = nodes_[static_cast<size_t>(m.alternatives[i])].by_kind[k];
                    if (g == kNone) continue;
                    if (owner >= 0 &&
                        nodes_[static_cast<size_t>(m.alternatives[static_cast<size_t>(owner)])].by_kind[k] != g)
                        throw_error(
                            "json_schema: %s: alternatives %d and %zu both take %s values (not supported: "
                            "the first byte of a value must tell which alternative applies)",
                            m.where.c_str(), owner, i, kKindNames[k]);
                    owner = static_cast<int>(i);
                }
            }
        }
    }

    int32_t compile(const json &s, const std::string &where) {
        // Schemas nest no deeper than this (the compiler recurses; documents nest at most JsonPrefix::kMaxDepth).
        constexpr int kMaxNesting = 64;
        struct Nesting {
            int &depth;
            explicit Nesting(int &d) : depth(++d) {}
            ~Nesting() { --depth; }
        } nesting(nesting_);
        if (nesting_ > kMaxNesting)
            throw_error("json_schema: %s: schemas nested deeper than %d", where.c_str(), kMaxNesting);
        if (s.is_boolean()) {
            return s.get<bool>() ? 0 : add(JsonSchemaNode{});
        }
        if (!s.is_object()) throw_error("json_schema: %s: a schema must be an object or a boolean", where.c_str());
        std::vector<std::string> assertions;  // the keywords that constrain, beside the annotations
        for (const auto &[key, value] : s.items()) {
            if (kUnsupported.count(key)) {
                throw_error("json_schema: %s: '%s' is not supported", where.c_str(), key.c_str());
            }
            if (!kAnnotations.count(key)) assertions.push_back(key);
        }
        const auto only = [&](const char *keyword) {
            for (const std::string &a : assertions) {
                if (a != keyword)
                    throw_error("json_schema: %s: '%s' beside '%s' is not supported", where.c_str(), a.c_str(),
                                keyword);
            }
        };
        if (s.contains("$ref")) {
            only("$ref");
            if (!s["$ref"].is_string()) throw_error("json_schema: %s/$ref: must be a string", where.c_str());
            return reference(s["$ref"].get<std::string>(), where);
        }
        for (const char *keyword : {"anyOf", "oneOf"}) {
            if (s.contains(keyword)) {
                only(keyword);
                return alternatives(s[keyword], where + "/" + keyword);
            }
        }
        if (s.contains("allOf")) {
            only("allOf");
            const json &all = s["allOf"];
            if (!all.is_array() || all.size() != 1)
                throw_error("json_schema: %s/allOf: only a list of one schema is supported", where.c_str());
            return compile(all[0], where + "/allOf/0");
        }
        return plain(s, where);
    }

    // anyOf / oneOf: each kind of value goes to the one alternative that takes it (linked once all is compiled).
    int32_t alternatives(const json &list, const std::string &where) {
        if (!list.is_array() || list.empty())
            throw_error("json_schema: %s: must be a non-empty list of schemas", where.c_str());
        Merge m{add(JsonSchemaNode{}), {}, where};
        for (size_t i = 0; i < list.size(); ++i)
            m.alternatives.push_back(compile(list[i], where + "/" + std::to_string(i)));
        merges_.push_back(std::move(m));
        return merges_.back().slot;
    }

    int32_t plain(const json &s, const std::string &where) {
        JsonSchemaNode node;
        std::array<bool, kJsonKinds> allowed{};
        bool integer = false, number = false;
        if (const auto t = s.find("type"); t != s.end()) {
            std::vector<std::string> names;
            if (t->is_string()) {
                names.push_back(t->get<std::string>());
            } else if (t->is_array()) {
                for (const json &n : *t) {
                    if (!n.is_string()) throw_error("json_schema: %s/type: must list type names", where.c_str());
                    names.push_back(n.get<std::string>());
                }
            } else {
                throw_error("json_schema: %s/type: must be a type name or a list of them", where.c_str());
            }
            for (const std::string &name : names) {
                if (name == "integer") {
                    integer = true;
                } else if (name == "number") {
                    number = true;
                } else {
                    const auto k = std::find(std::begin(kKindNames), std::end(kKindNames), name);
                    if (k == std::end(kKindNames))
                        throw_error("json_schema: %s/type: unknown type '%s'", where.c_str(), name.c_str());
                    allowed[static_cast<size_t>(k - std::begin(kKindNames))] = true;
                }
            }
            allowed[at(JsonKind::number)] = integer || number;
        } else {
            allowed.fill(true);
            number = true;
        }
        node.integer_only = integer && !number;
        // multipleOf: whole ones, on integers (a number that is a whole multiple of a whole number is an integer, so
        // numbers are written as integers then).
        if (const auto m = s.find("multipleOf"); m != s.end()) {
            if (!m->is_number() || m->get<double>() <= 0)
                throw_error("json_schema: %s/multipleOf: must be a number above 0", where.c_str());
            const double x = m->get<double>();
            if (std::floor(x) != x || x > 4.6e18)
                throw_error("json_schema: %s/multipleOf: only whole numbers (below 2^62) are supported, not %g",
                            where.c_str(), x);
            node.multiple_of = static_cast<int64_t>(x);
            if (allowed[at(JsonKind::number)]) node.integer_only = true;
        }
        const int32_t self = static_cast<int32_t>(nodes_.size());  // this node's index once added
        // Numbers' bounds: any on integers (rounded into them); whole ones below 1e15 on other numbers, whose text
        // then has no exponent and at most 15 digits (JsonPrefix tests a prefix's reach exactly in decimal).
        for (const char *keyword : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
            const auto b = s.find(keyword);
            if (b == s.end()) continue;
            if (!b->is_number()) throw_error("json_schema: %s/%s: must be a number", where.c_str(), keyword);
            const double x = b->get<double>();
            const std::string k = keyword;
            const bool lower = k == "minimum" || k == "exclusiveMinimum", exclusive = k.rfind("exclusive", 0) == 0;
            node.bounded = true;
            if (node.integer_only) {
                if (k == "minimum") node.minimum = std::max(node.minimum, integer_bound(std::ceil(x)));
                if (k == "exclusiveMinimum") node.minimum = std::max(node.minimum, integer_bound(std::floor(x) + 1));
                if (k == "maximum") node.maximum = std::min(node.maximum, integer_bound(std::floor(x)));
                if (k == "exclusiveMaximum") node.maximum = std::min(node.maximum, integer_bound(std::ceil(x) - 1));
                continue;
            }
            if (std::floor(x) != x || std::fabs(x) >= 1e15)
                throw_error("json_schema: %s/%s: bounds on numbers must be whole and below 1e15 (integers take any)",
                            where.c_str(), keyword);
            const auto v = static_cast<int64_t>(x);
            // The stricter of two bounds on one side (at the same value, the exclusive one).
            if (lower && (v > node.minimum || (v == node.minimum && exclusive))) {
                node.minimum = v;
                node.min_exclusive = exclusive;
            }
            if (!lower && (v < node.maximum || (v == node.maximum && exclusive))) {
                node.maximum = v;
                node.max_exclusive = exclusive;
            }
        }
        if (!node.integer_only && node.bounded &&
            (node.minimum > node.maximum ||
             (node.minimum == node.maximum && (node.min_exclusive || node.max_exclusive))))
            allowed[at(JsonKind::number)] = false;
        // Integers stay within 64 bits even unbounded: what parsers (nlohmann, JavaScript's near 2^53 aside) read
        // back as integers.
        if (node.integer_only) node.bounded = true;
        if (node.integer_only && node.minimum > node.maximum) allowed[at(JsonKind::number)] = false;
        if (const auto v = s.find("minLength"); v != s.end()) node.min_length = count_bound(*v, where + "/minLength");
        if (const auto v = s.find("maxLength"); v != s.end()) node.max_length = count_bound(*v, where + "/maxLength");
        if (node.min_length > node.max_length) allowed[at(JsonKind::string)] = false;
        if (const auto v = s.find("pattern"); v != s.end()) {
            if (!v->is_string()) throw_error("json_schema: %s/pattern: must be a string", where.c_str());
            if (s.contains("minLength") || s.contains("maxLength"))
                throw_error("json_schema: %s/pattern: beside minLength / maxLength is not supported", where.c_str());
            try {
                patterns_.push_back(JsonPattern::compile(v->get<std::string>()));
            } catch (const std::exception &e) {
                throw_error("json_schema: %s/pattern: %s", where.c_str(), e.what());
            }
            node.pattern = static_cast<int32_t>(patterns_.size() - 1);
        }
        if (const auto v = s.find("minItems"); v != s.end()) node.min_items = count_bound(*v, where + "/minItems");
        if (const auto v = s.find("maxItems"); v != s.end()) node.max_items = count_bound(*v, where + "/maxItems");
        if (node.min_items > node.max_items) allowed[at(JsonKind::array)] = false;
        if (const auto v = s.find("minProperties"); v != s.end())
            node.min_properties = count_bound(*v, where + "/minProperties");
        if (const auto v = s.find("maxProperties"); v != s.end())
            node.max_properties = count_bound(*v, where + "/maxProperties");
        nodes_.push_back(node);  // reserved: the subschemas below refer to it by index only through by_kind
        // Tuples: prefixItems with items for the rest (2020-12), or a list under items with additionalItems (draft 7).
        const auto items = s.find("items");
        const bool draft7_tuple = items != s.end() && items->is_array();
        const auto prefix = draft7_tuple ? items : s.find("prefixItems");
        if (prefix != s.end()) {
            const std::string at_prefix = where + (draft7_tuple ? "/items" : "/prefixItems");
            if (!prefix->is_array()) throw_error("json_schema: %s: must be a list of schemas", at_prefix.c_str());
            for (size_t i = 0; i < prefix->size(); ++i) {
                const int32_t n = compile((*prefix)[i], at_prefix + "/" + std::to_string(i));
                nodes_[static_cast<size_t>(self)].prefix_items.push_back(n);
            }
        }
        const auto rest = draft7_tuple ? s.find("additionalItems") : items;
        if (rest != s.end()) {
            const int32_t n = rest->is_boolean()
                                  ? (rest->get<bool>() ? 0 : kNone)
                                  : compile(*rest, where + (draft7_tuple ? "/additionalItems" : "/items"));
            nodes_[static_cast<size_t>(self)].items = n;
        }
        if (s.contains("additionalItems") && !draft7_tuple)
            throw_error("json_schema: %s/additionalItems: only beside a list under items", where.c_str());
        if (const auto v = s.find("properties"); v != s.end()) {
            if (!v->is_object()) throw_error("json_schema: %s/properties: must be an object", where.c_str());
            if (v->size() > JsonSchema::kMaxAlternatives)
                throw_error("json_schema: %s/properties: more than %zu properties", where.c_str(),
                            JsonSchema::kMaxAlternatives);
            for (const auto &[key, sub] : v->items()) {
                const int32_t n = compile(sub, where + "/properties/" + key);
                nodes_[static_cast<size_t>(self)].keys.push_back(escaped_key(key));
                nodes_[static_cast<size_t>(self)].key_nodes.push_back(n);
            }
        }
        if (const auto v = s.find("additionalProperties"); v != s.end()) {
            const int32_t n =
                v->is_boolean() ? (v->get<bool>() ? 0 : kNone) : compile(*v, where + "/additionalProperties");
            nodes_[static_cast<size_t>(self)].additional = n;
        }
        if (const auto v = s.find("required"); v != s.end()) {
            if (!v->is_array()) throw_error("json_schema: %s/required: must be a list of names", where.c_str());
            JsonSchemaNode &me = nodes_[static_cast<size_t>(self)];
            for (const json &name : *v) {
                if (!name.is_string()) throw_error("json_schema: %s/required: must be a list of names", where.c_str());
                const auto it = std::find(me.keys.begin(), me.keys.end(), escaped_key(name.get<std::string>()));
                if (it == me.keys.end())
                    throw_error("json_schema: %s/required: '%s' is not among the properties (not supported)",
                                where.c_str(), name.get<std::string>().c_str());
                me.required |= uint64_t(1) << (it - me.keys.begin());
            }
        }
        JsonSchemaNode &me = nodes_[static_cast<size_t>(self)];
        for (int k = 0; k < kJsonKinds; ++k) me.by_kind[k] = allowed[k] ? self : kNone;
        std::vector<json> values;
        if (const auto v = s.find("enum"); v != s.end()) {
            if (!v->is_array() || v->empty())
                throw_error("json_schema: %s/enum: must be a non-empty list", where.c_str());
            values.assign(v->begin(), v->end());
        }
        if (const auto v = s.find("const"); v != s.end()) {
            if (s.contains("enum"))
                throw_error("json_schema: %s: enum and const together are not supported", where.c_str());
            values.push_back(*v);
        }
        if (!values.empty()) {
            if (values.size() > JsonSchema::kMaxAlternatives)
                throw_error("json_schema: %s/enum: more than %zu values", where.c_str(), JsonSchema::kMaxAlternatives);
            // The values the node's other keywords accept, each as the text the model must write; the node then
            // takes the kinds they have.
            std::array<bool, kJsonKinds> kinds{};
            std::vector<std::string> literals;
            for (const json &value : values) {
                if (!accepts(nodes_, patterns_, self, value, /*literals=*/false)) continue;
                literals.push_back(value.dump());
                kinds[at(kind_of(value))] = true;
            }
            JsonSchemaNode &n = nodes_[static_cast<size_t>(self)];
            n.literals = std::move(literals);
            for (int k = 0; k < kJsonKinds; ++k) n.by_kind[k] = kinds[k] ? self : kNone;
        }
        return self;
    }

    // Kinds that no finite document satisfies are taken away (a required property whose schema accepts nothing,
    // an array that needs items no schema allows, recursion with no way out), and so are the paths into them, so
    // that JsonPrefix never starts what cannot be finished. A least fixed point: a (node, kind) is satisfiable when
    // its requirements are, with nothing assumed at first.
    void prune() {
        const size_t n = nodes_.size();
        std::vector<std::array<bool, kJsonKinds>> sat(n);
        const auto node_sat = [&](int32_t m) {
            if (m == kNone) return false;
            for (int k = 0; k < kJsonKinds; ++k) {
                const int32_t g = nodes_[static_cast<size_t>(m)].by_kind[k];
                if (g != kNone && sat[static_cast<size_t>(g)][k]) return true;
            }
            return false;
        };
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t i = 0; i < n; ++i) {
                const JsonSchemaNode &node = nodes_[i];
                for (int k = 0; k < kJsonKinds; ++k) {
                    if (sat[i][k]) continue;
                    // A node with literals is asked only for its literals' kinds (by_kind), each a whole value.
                    bool ok = true;
                    const bool literal = !node.literals.empty();
                    if (!literal && kKinds[k] == JsonKind::object) {
                        // The required properties, and enough keys for minProperties within maxProperties.
                        uint32_t n_required = 0, n_possible = 0;
                        for (size_t p = 0; p < node.keys.size(); ++p) {
                            const bool possible = node_sat(node.key_nodes[p]);
                            n_possible += possible ? 1 : 0;
                            if (node.required >> p & 1) {
                                ++n_required;
                                if (!possible) ok = false;
                            }
                        }
                        if (n_required > node.max_properties || node.min_properties > node.max_properties) ok = false;
                        if (!node_sat(node.additional) && n_possible < node.min_properties) ok = false;
                    } else if (!literal && kKinds[k] == JsonKind::array) {
                        for (uint32_t item = 0; item < node.min_items && ok; ++item) {
                            ok = node_sat(node.item_node(item));
                            if (item >= node.prefix_items.size()) break;  // the rest share one node
                        }
                    }
                    if (ok) {
                        sat[i][k] = true;
                        changed = true;
                    }
                }
            }
        }
        for (size_t i = 0; i < n; ++i) {
            JsonSchemaNode &node = nodes_[i];
            for (int k = 0; k < kJsonKinds; ++k) {
                const int32_t g = node.by_kind[k];
                if (g != kNone && !sat[static_cast<size_t>(g)][k]) node.by_kind[k] = kNone;
            }
        }
        // Optional properties, other keys and items whose schema accepts nothing may not be started either.
        for (size_t i = 0; i < n; ++i) {
            JsonSchemaNode &node = nodes_[i];
            for (size_t p = 0; p < node.keys.size(); ++p) {
                if (!node_sat(node.key_nodes[p])) node.key_nodes[p] = kNone;
            }
            if (!node_sat(node.additional)) node.additional = kNone;
            // An array ends before the first item no document satisfies.
            for (size_t j = 0; j < node.prefix_items.size(); ++j) {
                if (!node_sat(node.prefix_items[j])) {
                    node.max_items = std::min<uint32_t>(node.max_items, static_cast<uint32_t>(j));
                    break;
                }
            }
            if (!node_sat(node.items)) {
                node.items = kNone;
                node.max_items = std::min<uint32_t>(node.max_items, static_cast<uint32_t>(node.prefix_items.size()));
            }
        }
    }

    const json &root_;
    int nesting_ = 0;  // compile()'s recursion depth
    std::vector<JsonSchemaNode> nodes_;
    std::vector<JsonPattern> patterns_;
    std::map<std::string, int32_t> refs_;                        // $ref -> its compiled node (kPending: compiling)
    std::vector<std::pair<std::string, int32_t>> placeholders_;  // ($ref, the node standing for it)
    struct Merge {
        int32_t slot;                       // the anyOf / oneOf node
        std::vector<int32_t> alternatives;  // its alternatives' nodes
        std::string where;
    };
    std::vector<Merge> merges_;
};

JsonSchema JsonSchema::compile(const nlohmann::json &schema) { return JsonSchemaCompiler(schema).run(); }

bool json_schema_accepts(const JsonSchema &schema, const nlohmann::json &document) {
    return accepts(schema.nodes_, schema.patterns_, schema.root(), document);
}

}  // namespace sparrow
