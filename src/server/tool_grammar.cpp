// The grammar of a reply that is function calls (tool_call_grammar in tool_calls.h): the format's tags around each
// call, the tools' names, and each parameter's value shaped by its JSON schema.
//
// A schema becomes GBNF rules for the common subset that tool definitions use: "type" (one or a list), "enum",
// "const", "anyOf" / "oneOf", "allOf" of one schema, "items" with "minItems" / "maxItems", and "properties" with
// "required". An object's properties come in the order the schema declares them, the required ones always and the
// others when the model writes them, and no key the schema does not name (as llama.cpp's schema grammars do).
// Everything else ("pattern", "format", lengths, bounds, "$ref", ...) widens to the type's or to any JSON value: a
// grammar that refused more than the schema would be wrong, one that takes a little more is only looser.
#include <algorithm>

#include "core/error.h"
#include "server/tool_calls.h"
#include "server/tool_syntax.h"

namespace sparrow::server {

namespace {

using ordered_json = nlohmann::ordered_json;

// Replies of parallel calls take at most this many, so that a model that repeats itself still ends.
constexpr int kMaxParallelCalls = 16;
// Schemas nested deeper than this are any JSON value; array bounds above kMaxBoundedItems are unbounded.
constexpr int kMaxSchemaDepth = 16;
constexpr int64_t kMaxBoundedItems = 256;

// The parts joined (g++ 12 warns falsely, -Wrestrict, about some chains of std::string operator+).
std::string cat(std::initializer_list<std::string_view> parts) {
    std::string out;
    for (std::string_view p : parts) out.append(p);
    return out;
}

// GBNF text of a literal.
std::string literal(std::string_view s) {
    std::string out = "\"";
    for (const char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else {
            out += c;
        }
    }
    return out + "\"";
}

// " ( a | b | c )" of the alternatives (one: itself).
std::string any_of(const std::vector<std::string> &alternatives) {
    if (alternatives.size() == 1) return alternatives[0];
    std::string out = "(";
    for (size_t i = 0; i < alternatives.size(); ++i) out += (i ? " | " : " ") + alternatives[i];
    return out + " )";
}

// The rules every tool grammar may use.
constexpr std::string_view kJsonRules =
    "jvalue ::= jobject | jarray | jstring | jnumber | \"true\" | \"false\" | \"null\"\n"
    "jobject ::= \"{\" jws ( jstring jws \":\" jws jvalue jws ( \",\" jws jstring jws \":\" jws jvalue jws )* )? "
    "\"}\"\n"
    "jarray ::= \"[\" jws ( jvalue jws ( \",\" jws jvalue jws )* )? \"]\"\n"
    "jstring ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    // digits past a double's 17 are noise, and a model's loop on them would never end; two exponent digits keep a
    // number within a double's range (1e838 would not read back as a number)
    "jnumber ::= jinteger ( \".\" [0-9]{1,17} )? ( [eE] [-+]? [0-9]{1,2} )?\n"
    "jinteger ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,17} )\n"
    "jboolean ::= \"true\" | \"false\"\n"
    "jws ::= [ \\t\\n]{0,16}\n"
    // raw text up to a closing tag: no "</"
    "text ::= ( [^<] | \"<\"+ [^</] )*\n";

// The GBNF rules of the JSON values schemas allow, made as they are asked for.
class SchemaRules {
  public:
    // An expression for the JSON values `schema` allows.
    std::string value(const ordered_json &schema, int depth = 0) {
        if (!schema.is_object() || depth > kMaxSchemaDepth) return "jvalue";
        if (const auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
            std::vector<std::string> alts;
            for (const ordered_json &v : *e) alts.push_back(literal(compact_json(v)));
            return any_of(alts);
        }
        if (const auto c = schema.find("const"); c != schema.end()) return literal(compact_json(*c));
        for (const char *key : {"anyOf", "oneOf"}) {
            if (const auto a = schema.find(key); a != schema.end() && a->is_array() && !a->empty()) {
                std::vector<std::string> alts;
                for (const ordered_json &s : *a) alts.push_back(value(s, depth + 1));
                return any_of(alts);
            }
        }
        if (const auto a = schema.find("allOf"); a != schema.end() && a->is_array() && a->size() == 1) {
            return value((*a)[0], depth + 1);
        }
        const auto type = schema.find("type");
        if (type != schema.end() && type->is_array() && !type->empty()) {
            std::vector<std::string> alts;
            for (const ordered_json &t : *type) {
                ordered_json one = schema;
                one["type"] = t;
                alts.push_back(value(one, depth + 1));
            }
            return any_of(alts);
        }
        const std::string t = type != schema.end() && type->is_string() ? type->get<std::string>() : "";
        if (t == "string") return "jstring";
        if (t == "integer") return "jinteger";
        if (t == "number") return "jnumber";
        if (t == "boolean") return "jboolean";
        if (t == "null") return "\"null\"";
        if (t == "array" || (t.empty() && schema.contains("items"))) return array(schema, depth);
        if (t == "object" || (t.empty() && schema.contains("properties"))) return object(schema, depth);
        return "jvalue";
    }

    // An expression for a string value written as its text (DeepSeek's string="true", GLM's values): the strings the
    // schema lists (enum, const, through anyOf / oneOf), else any text.
    static std::string text(const ordered_json &schema) {
        std::vector<std::string> strings;
        if (!listed_strings(schema, strings, 0) || strings.empty()) return "text";
        std::vector<std::string> alts;
        for (const std::string &str : strings) alts.push_back(literal(str));
        return any_of(alts);
    }

    // A new rule for `body`; returns its name.
    std::string add(const std::string &body) {
        const std::string name = cat({"s", std::to_string(next_++)});
        rules_ += cat({name, " ::= ", body, "\n"});
        return name;
    }

    const std::string &rules() const { return rules_; }

  private:
    // Adds the strings `schema` allows to `out` when it lists them all; false when any string may do.
    static bool listed_strings(const ordered_json &schema, std::vector<std::string> &out, int depth) {
        if (!schema.is_object() || depth > kMaxSchemaDepth) return false;
        if (const auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
            for (const ordered_json &v : *e) {
                if (v.is_string()) out.push_back(v.get<std::string>());
            }
            return true;
        }
        if (const auto c = schema.find("const"); c != schema.end()) {
            if (c->is_string()) out.push_back(c->get<std::string>());
            return true;
        }
        for (const char *key : {"anyOf", "oneOf"}) {
            if (const auto a = schema.find(key); a != schema.end() && a->is_array() && !a->empty()) {
                for (const ordered_json &alt : *a) {
                    if (admits_string(alt) && !listed_strings(alt, out, depth + 1)) return false;
                }
                return true;
            }
        }
        if (const auto a = schema.find("allOf"); a != schema.end() && a->is_array() && a->size() == 1) {
            return listed_strings((*a)[0], out, depth + 1);
        }
        return !admits_string(schema);  // a type without strings lists none; any other takes any string
    }

    // "[" items "]" with minItems..maxItems items.
    std::string array(const ordered_json &schema, int depth) {
        const auto items = schema.find("items");
        const std::string item = items != schema.end() ? value(*items, depth + 1) : "jvalue";
        const auto bound = [&](const char *key, int64_t fallback) {
            const auto b = schema.find(key);
            return b != schema.end() && b->is_number_integer() ? std::max<int64_t>(0, b->get<int64_t>()) : fallback;
        };
        const int64_t lo = bound("minItems", 0), hi = bound("maxItems", -1);
        const bool bounded = hi >= 0 && hi <= kMaxBoundedItems;
        if (bounded && (hi == 0 || lo > hi)) return add(literal("[") + " jws " + literal("]"));
        const std::string more = "( " + literal(",") + " jws " + item + " jws )";
        const std::string tail =
            bounded ? more + "{" + std::to_string(std::max<int64_t>(lo, 1) - 1) + "," + std::to_string(hi - 1) + "}"
            : lo > 1 && lo <= kMaxBoundedItems ? more + "{" + std::to_string(lo - 1) + ",}"
                                               : more + "*";
        const std::string list = item + " jws " + tail;
        return add(literal("[") + " jws " + (lo == 0 ? "( " + list + " )?" : list) + " " + literal("]"));
    }

    // "{" the declared properties in order, the required ones always, "}". Two rules per property i: the rest of
    // the object from i before anything was written (no comma first) and after (a comma before each).
    std::string object(const ordered_json &schema, int depth) {
        const auto props = schema.find("properties");
        if (props == schema.end() || !props->is_object() || props->empty()) return "jobject";
        std::vector<std::string> required;
        if (const auto r = schema.find("required"); r != schema.end() && r->is_array()) {
            for (const ordered_json &name : *r) {
                if (name.is_string()) required.push_back(name.get<std::string>());
            }
        }
        std::vector<std::pair<std::string, bool>> members;  // "key": value, and whether it is required
        for (const auto &[key, sub] : props->items()) {
            members.emplace_back(literal(compact_json(ordered_json(key))) + " jws " + literal(":") + " jws " +
                                     value(sub, depth + 1) + " jws",
                                 std::find(required.begin(), required.end(), key) != required.end());
        }
        std::string first, rest;  // from member i on: before any member was written, after one was
        for (size_t i = members.size(); i-- > 0;) {
            const auto &[member, needed] = members[i];
            const std::string after = rest.empty() ? "" : " " + rest;
            const std::string next_rest = needed ? literal(",") + " jws " + member + after
                                                 : "( " + literal(",") + " jws " + member + " )?" + after;
            const std::string next_first =
                needed ? member + after : "( " + member + after + (first.empty() ? " )?" : " | " + first + " )");
            rest = add(next_rest);
            first = add(next_first);
        }
        return add(literal("{") + " jws " + first + " " + literal("}"));
    }

    std::string rules_;
    int next_ = 0;
};

}  // namespace

std::string tool_call_grammar(ChatFormat format, const std::vector<ordered_json> &tools, const std::string &only,
                              bool parallel) {
    if (format == ChatFormat::llama2) throw_error("the llama2 chat format has no tool calls");
    const bool dsml = format != ChatFormat::glm, v4 = format == ChatFormat::deepseek4;
    SchemaRules schema_rules;
    std::vector<std::string> calls;
    for (const ordered_json &tool : tools) {
        const std::string name = tool.at("function").at("name").get<std::string>();
        if (!only.empty() && name != only) continue;
        // The parameters: those the schema declares in its order (required ones always), or any names.
        std::string params;
        if (const ordered_json *props = properties_of(tool)) {
            const ordered_json &schema = tool["function"]["parameters"];
            const auto required = schema.find("required");
            for (const auto &[key, sub] : props->items()) {
                // A string is written as itself (DeepSeek: string="true"), anything else as JSON.
                std::vector<std::string> values;
                if (admits_string(sub)) {
                    values.push_back(dsml ? cat({literal("true\">"), " ", schema_rules.text(sub)})
                                          : schema_rules.text(sub));
                }
                if (admits_non_string(sub)) {
                    values.push_back(dsml ? cat({literal("false\">"), " ", schema_rules.value(sub)})
                                          : schema_rules.value(sub));
                }
                if (values.empty()) continue;  // a schema no value satisfies: the parameter cannot be written
                const std::string param = dsml ? cat({literal(cat({kDsmlParam, key, "\" string=\""})), " ",
                                                      any_of(values), " ", literal(cat({kDsmlParamEnd, "\n"}))})
                                               : cat({literal(cat({kGlmKey, key, kGlmKeyEnd, kGlmValue})), " ",
                                                      any_of(values), " ", literal(kGlmValueEnd)});
                const bool needed = required != schema.end() && required->is_array() &&
                                    std::find(required->begin(), required->end(), key) != required->end();
                params += cat({" ", schema_rules.add(param), needed ? "" : "?"});
            }
        } else if (dsml) {
            params = cat({" ",
                          schema_rules.add(cat({literal(kDsmlParam), " [^\"<\\n]+ ", literal("\" string=\""), " ( ",
                                                literal("true\">"), " text | ", literal("false\">"), " jvalue ) ",
                                                literal(cat({kDsmlParamEnd, "\n"}))})),
                          "*"});
        } else {
            params = cat({" ",
                          schema_rules.add(cat({literal(kGlmKey), " [^<]+ ", literal(cat({kGlmKeyEnd, kGlmValue})),
                                                " text ", literal(kGlmValueEnd)})),
                          "*"});
        }
        // V4 writes a newline where a call has no arguments.
        if (v4) params = params.empty() ? cat({" ", literal("\n")}) : cat({" (", params, " | ", literal("\n"), " )"});
        calls.push_back(schema_rules.add(
            dsml ? cat({literal(cat({kDsmlInvoke, name, "\">\n"})), params, " ", literal(cat({kDsmlInvokeEnd, "\n"}))})
                 : cat({literal(cat({kGlmCall, name})), params, " ", literal(kGlmCallEnd)})));
    }
    if (calls.empty()) throw_error("no tool named '%s' is on offer", only.c_str());
    const std::string repeat = parallel ? "{1," + std::to_string(kMaxParallelCalls) + "}" : "";
    const std::string root = dsml ? "root ::= " + literal("\n\n" + std::string(dsml_block_open(v4)) + "\n") + " " +
                                        any_of(calls) + repeat + " " + literal(dsml_block_close(v4)) + "\n"
                                  : "root ::= " + any_of(calls) + repeat + "\n";
    return root + schema_rules.rules() + std::string(kJsonRules);
}

}  // namespace sparrow::server
