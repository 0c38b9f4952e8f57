// Function calls in the chat formats: Python's json.dumps as the templates' tojson; calls read out of replies,
// whole and in pieces split anywhere; text that is not a call left as written; the call grammar against what the
// formats render for calls, and the renderings read back as the calls they came from.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "runtime/grammar.h"
#include "server/chat_format.h"
#include "server/tool_calls.h"

namespace sparrow::server {
namespace {

using ordered_json = nlohmann::ordered_json;

std::vector<ordered_json> tools() {
    return {ordered_json::parse(R"({"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                "metric": {"type": "boolean"}, "where": {"type": "object"}}}}})"),
            ordered_json::parse(R"({"type": "function", "function": {"name": "now"}})"),
            ordered_json::parse(R"({"type": "function", "function": {"name": "ping", "parameters": {"type": "object",
                "properties": {}}}})")};
}

// The calls and content a reply's text reads as, whole.
ToolReplyParts whole(ChatFormat f, std::string_view text) { return parse_tool_calls(f, tools(), text); }

// The same text pushed in pieces cut at `cuts` (ascending byte offsets).
ToolReplyParts pieces(ChatFormat f, std::string_view text, const std::vector<size_t> &cuts) {
    ToolCallParser p(f, tools());
    ToolReplyParts out;
    size_t at = 0;
    const auto add = [&](ToolReplyParts r) {
        out.content += r.content;
        out.calls.insert(out.calls.end(), r.calls.begin(), r.calls.end());
    };
    for (size_t cut : cuts) {
        add(p.push(text.substr(at, cut - at)));
        at = cut;
    }
    add(p.push(text.substr(at)));
    add(p.finish());
    return out;
}

void expect_same(const ToolReplyParts &a, const ToolReplyParts &b, const std::string &what) {
    EXPECT_EQ(a.content, b.content) << what;
    ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
    for (size_t i = 0; i < a.calls.size(); ++i) {
        EXPECT_EQ(a.calls[i].name, b.calls[i].name) << what;
        EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << what;
    }
}

// Every way of cutting the text in two, and byte by byte, reads as the whole text does.
void expect_split_invariant(ChatFormat f, std::string_view text) {
    const ToolReplyParts w = whole(f, text);
    for (size_t cut = 0; cut <= text.size(); ++cut)
        expect_same(pieces(f, text, {cut}), w, "cut at " + std::to_string(cut));
    std::vector<size_t> every;
    for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
    expect_same(pieces(f, text, every), w, "byte by byte");
}

// The reply's content and its calls (name, arguments).
void expect_reply(const ToolReplyParts &r, const std::string &content,
                  const std::vector<std::pair<std::string, std::string>> &calls) {
    EXPECT_EQ(r.content, content);
    ASSERT_EQ(r.calls.size(), calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(r.calls[i].name, calls[i].first);
        EXPECT_EQ(r.calls[i].arguments, calls[i].second);
    }
}

TEST(ToolCalls, PythonJsonDumps) {
    // json.dumps({"b": [1, 2.5, True, None], "a": {"x": "é\"\n\x01/"}, "e": {}, "l": []}, ensure_ascii=False)
    const ordered_json v = ordered_json::parse(R"({"b": [1, 2.5, true, null], "a": {"x": "é\"\n\u0001/"}, "e": {},
                                                   "l": [], "f": -0.001, "big": 1e+300})");
    EXPECT_EQ(
        python_json_dumps(v),
        "{\"b\": [1, 2.5, true, null], \"a\": {\"x\": \"é\\\"\\n\\u0001/\"}, \"e\": {}, \"l\": [], \"f\": -0.001, "
        "\"big\": 1e+300}");
}

TEST(ToolCalls, DeepseekCallsAreRead) {
    const std::string text =
        "Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Paris <b> \"x\"</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"where\" string=\"false\">{\"lat\": 1.5, \"z\": [true]}</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"metric\" string=\"false\">not json</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
    expect_reply(
        whole(ChatFormat::deepseek3, text), "Let me check.",
        {{"get_weather", R"({"city":"Paris <b> \"x\"","days":2,"where":{"lat":1.5,"z":[true]},"metric":"not json"})"},
         {"now", "{}"}});
    expect_split_invariant(ChatFormat::deepseek3, text);

    // V4 names the block tool_calls; V3.2's block name is text there.
    std::string v4 = text;
    for (size_t at; (at = v4.find("function_calls")) != std::string::npos;) v4.replace(at, 14, "tool_calls");
    const ToolReplyParts r4 = whole(ChatFormat::deepseek4, v4);
    EXPECT_EQ(r4.calls.size(), 2u);
    EXPECT_EQ(r4.content, "Let me check.");
    EXPECT_TRUE(whole(ChatFormat::deepseek4, text).calls.empty());
    EXPECT_EQ(whole(ChatFormat::deepseek4, text).content, text);
}

TEST(ToolCalls, GlmCallsAreRead) {
    // "city" is a string parameter: its digits stay text; "days" is read as JSON; a tool's unknown parameter is
    // JSON when it parses.
    const std::string text =
        "Sure.<tool_call>get_weather<arg_key>city</arg_key><arg_value>123</arg_value><arg_key>days</arg_key>"
        "<arg_value>2</arg_value><arg_key>other</arg_key><arg_value>[1, \"a\"]</arg_value></tool_call>\n"
        "<tool_call>now\n</tool_call>";
    expect_reply(whole(ChatFormat::glm, text), "Sure.",
                 {{"get_weather", R"({"city":"123","days":2,"other":[1,"a"]})"}, {"now", "{}"}});
    expect_split_invariant(ChatFormat::glm, text);
    // Text after the calls is content again.
    EXPECT_EQ(whole(ChatFormat::glm, "<tool_call>now</tool_call> and more").content, "and more");
}

TEST(ToolCalls, TextThatIsNotACallStaysAsWritten) {
    for (const ChatFormat f : {ChatFormat::deepseek3, ChatFormat::deepseek4, ChatFormat::glm}) {
        for (const std::string &text : {
                 std::string("plain text with a < and </ and trailing space \n\n"),
                 std::string("ends inside a tag <｜DSML｜function_c"),
                 std::string("ends inside a tag <tool_ca"),
                 std::string("a block that is not calls\n\n<｜DSML｜function_calls>\nhello world"),
                 std::string("unfinished\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"now\">\n<｜DSML｜param"),
                 std::string("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par"),
                 std::string("<tool_call>bad<oops></tool_call> rest"),
                 std::string("<tool_call><arg_key>k</arg_key><arg_value>v</arg_value></tool_call>"),
                 std::string("an empty block\n\n<｜DSML｜function_calls>\n</｜DSML｜function_calls> and after"),
                 std::string("<｜DSML｜tool_calls></｜DSML｜tool_calls>"),
             }) {
            const ToolReplyParts r = whole(f, text);
            EXPECT_TRUE(r.calls.empty()) << text;
            EXPECT_EQ(r.content, text) << chat_format_name(f) << ": " << text;
            expect_split_invariant(f, text);
        }
    }
    // A call made before the reply broke off stays a call; the unfinished rest is content.
    const ToolReplyParts r = whole(ChatFormat::glm, "<tool_call>now</tool_call><tool_call>get_weather<arg_key>ci");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.content, "<tool_call>get_weather<arg_key>ci");
    EXPECT_THROW(ToolCallParser(ChatFormat::llama2, tools()), Error);
}

// An assistant turn with calls as a format renders it, from after its thinking block to its end.
std::string rendered_calls(ChatFormat f, const std::vector<ToolCall> &calls) {
    ChatOptions opts;
    opts.add_generation_prompt = false;
    opts.tools = tools();
    std::vector<ChatMessage> messages = {{"user", "q"}, {"assistant", ""}};
    messages[1].tool_calls = calls;
    const std::string prompt = apply_chat_format(f, messages, opts);
    std::string text = prompt.substr(prompt.rfind("</think>") + 8);
    if (const size_t eos = text.find("<｜end▁of▁sentence｜>"); eos != std::string::npos) text.resize(eos);
    return text;
}

bool grammar_takes(const std::string &grammar, const std::string &text) {
    const Grammar g = Grammar::parse(grammar);
    GrammarAutomaton a(g);
    GrammarCursor c;
    c.state = a.start();
    return c.feed(a, text) && c.complete(a);
}

TEST(ToolCalls, GrammarTakesWhatTheFormatsRenderAndTheParserReadsItBack) {
    const std::vector<ToolCall> calls = {
        {"c1", "get_weather", ordered_json::parse(R"({"city": "Pa<ri>s", "days": -3, "metric": false,
                                                      "where": {"a": [1, 2.25e-3, "x"]}})")},
        {"c2", "now", ordered_json::object()},
        {"c3", "ping", ordered_json::object()},
    };
    for (const ChatFormat f : {ChatFormat::deepseek3, ChatFormat::deepseek4, ChatFormat::glm}) {
        SCOPED_TRACE(chat_format_name(f));
        const std::string both = rendered_calls(f, calls), one = rendered_calls(f, {calls[0]});
        EXPECT_TRUE(grammar_takes(tool_call_grammar(f, tools(), "", true), both)) << both;
        EXPECT_TRUE(grammar_takes(tool_call_grammar(f, tools(), "", false), one)) << one;
        EXPECT_FALSE(grammar_takes(tool_call_grammar(f, tools(), "", false), both));  // one call only
        EXPECT_TRUE(grammar_takes(tool_call_grammar(f, tools(), "get_weather", true), one));
        EXPECT_FALSE(grammar_takes(tool_call_grammar(f, tools(), "now", true), one));  // another tool
        EXPECT_THROW(tool_call_grammar(f, tools(), "missing", true), Error);
        // A value of the wrong type: days must be an integer.
        std::string wrong = one;
        const size_t at = wrong.find("-3");
        ASSERT_NE(at, std::string::npos);
        wrong.replace(at, 2, "\"three\"");
        EXPECT_FALSE(grammar_takes(tool_call_grammar(f, tools(), "", true), wrong)) << wrong;
        // Read back: the calls rendered, in order, with their arguments in order.
        const ToolReplyParts r = whole(f, both);
        EXPECT_EQ(r.content, "");
        ASSERT_EQ(r.calls.size(), calls.size());
        for (size_t i = 0; i < calls.size(); ++i) {
            EXPECT_EQ(r.calls[i].name, calls[i].name);
            EXPECT_EQ(r.calls[i].arguments, calls[i].arguments.dump());
        }
    }
    EXPECT_THROW(tool_call_grammar(ChatFormat::llama2, tools(), "", true), Error);
}

// Parameter values shaped by their schemas: enums, consts, nested objects with required properties in order,
// arrays with bounds, anyOf and type lists.
TEST(ToolCalls, GrammarFollowsTheParameterSchemas) {
    const std::vector<ordered_json> book = {ordered_json::parse(R"({"type": "function", "function": {
        "name": "book", "parameters": {"type": "object", "required": ["room", "guests"], "properties": {
            "room": {"type": "string", "enum": ["red", "blue"]},
            "guests": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object",
                "required": ["name"], "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}},
            "when": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "mode": {"const": "fast"},
            "n": {"type": ["integer", "null"]}}}}})")};
    const auto call = [](const char *args) { return std::vector<ToolCall>{{"c", "book", ordered_json::parse(args)}}; };
    const std::vector<std::pair<const char *, bool>> cases = {
        {R"({"room": "red", "guests": [{"name": "a", "age": 3}, {"name": "b"}], "when": null, "mode": "fast",
            "n": 5})",
         true},
        {R"({"room": "blue", "guests": [{"name": "x"}]})", true},
        {R"({"room": "red", "guests": [{"name": "x"}], "when": "noon", "n": null})", true},
        {R"({"room": "red"})", false},                               // guests is required
        {R"({"room": "green", "guests": [{"name": "x"}]})", false},  // not in the enum
        {R"({"room": "red", "guests": []})", false},                 // minItems 1
        {R"({"room": "red", "guests": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}]})", false},
        {R"({"room": "red", "guests": [{"age": 3}]})", false},                     // a guest's name is required
        {R"({"room": "red", "guests": [{"name": "a", "pet": "cat"}]})", false},    // a key the schema does not name
        {R"({"room": "red", "guests": [{"name": "x"}], "n": "5"})", false},        // an integer or null
        {R"({"room": "red", "guests": [{"name": "x"}], "mode": "slow"})", false},  // the const
        {R"({"guests": [{"name": "x"}], "room": "red"})", false},                  // the declared order
    };
    for (const ChatFormat f : {ChatFormat::deepseek3, ChatFormat::deepseek4, ChatFormat::glm}) {
        SCOPED_TRACE(chat_format_name(f));
        const std::string grammar = tool_call_grammar(f, book, "", true);
        for (const auto &[args, ok] : cases) {
            ChatOptions opts;
            opts.add_generation_prompt = false;
            std::vector<ChatMessage> messages = {{"user", "q"}, {"assistant", ""}};
            messages[1].tool_calls = call(args);
            const std::string prompt = apply_chat_format(f, messages, opts);
            std::string text = prompt.substr(prompt.rfind("</think>") + 8);
            if (const size_t eos = text.find("<｜end▁of▁sentence｜>"); eos != std::string::npos) text.resize(eos);
            // GLM writes a string as its text: "5" reads as the integer 5 there.
            const bool expected =
                ok || (f == ChatFormat::glm && std::string_view(args).find("\"5\"") != std::string_view::npos);
            EXPECT_EQ(grammar_takes(grammar, text), expected) << args << "\n" << text;
        }
    }
}

// A random parameter schema of the subset the grammar shapes (strings drawn from a pool that never reads as JSON).
ordered_json random_schema(std::mt19937 &rng, int depth) {
    const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    const std::vector<std::string> words = {"red", "blue", "x y", "é<b>", "a\"q", "line\nbreak"};
    switch (pick(depth >= 2 ? 7 : 10)) {
        case 0: return {{"type", "string"}};
        case 1: return {{"type", "integer"}};
        case 2: return {{"type", "number"}};
        case 3: return {{"type", "boolean"}};
        case 4: return {{"enum", {words[pick(6)], words[pick(6)], pick(50)}}};
        case 5: return {{"const", pick(2) ? ordered_json(words[pick(6)]) : ordered_json(pick(9))}};
        case 6: return {{"type", ordered_json::array({"integer", "null"})}};
        case 7: return {{"anyOf", {random_schema(rng, depth + 1), random_schema(rng, depth + 1)}}};
        case 8: {
            ordered_json a = {{"type", "array"}, {"items", random_schema(rng, depth + 1)}};
            if (pick(2)) a["minItems"] = pick(3);
            if (pick(2)) a["maxItems"] = a.value("minItems", 0) + pick(3);
            return a;
        }
        default: {
            ordered_json o = {{"type", "object"}, {"properties", ordered_json::object()}};
            ordered_json required = ordered_json::array();
            for (int i = 0, n = pick(4); i < n; ++i) {
                const std::string key = "k" + std::to_string(i);
                o["properties"][key] = random_schema(rng, depth + 1);
                if (pick(2)) required.push_back(key);
            }
            o["required"] = required;
            return o;
        }
    }
}

// Whether v satisfies a schema of random_schema's subset.
bool satisfies(const ordered_json &s, const ordered_json &v) {
    if (const auto e = s.find("enum"); e != s.end()) return std::find(e->begin(), e->end(), v) != e->end();
    if (const auto c = s.find("const"); c != s.end()) return *c == v;
    if (const auto a = s.find("anyOf"); a != s.end()) {
        return std::any_of(a->begin(), a->end(), [&](const ordered_json &alt) { return satisfies(alt, v); });
    }
    const ordered_json &t = s.at("type");
    if (t.is_array()) return v.is_null() || v.is_number_integer();
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer();
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "array") {
        if (!v.is_array() || v.size() < s.value("minItems", size_t{0}) || v.size() > s.value("maxItems", size_t{99}))
            return false;
        return std::all_of(v.begin(), v.end(),
                           [&](const ordered_json &item) { return satisfies(s.at("items"), item); });
    }
    if (!v.is_object()) return false;
    const ordered_json &props = s.at("properties");
    for (const auto &[key, value] : v.items()) {
        if (!props.contains(key) || !satisfies(props.at(key), value)) return false;
    }
    for (const ordered_json &key : s.value("required", ordered_json::array()))
        if (!v.contains(key.get<std::string>())) return false;
    return true;
}

// Random walks through tool-call grammars of random tools, each step a character the grammar takes (values lean
// towards their ends): every whole text reads back as calls of offered tools whose arguments satisfy the schemas.
TEST(ToolCalls, WhatTheGrammarAllowsReadsBackAsValidCalls) {
    std::mt19937 rng(20261208);
    std::vector<std::string> alphabet = {"｜", "▁", "é"};
    for (char c = ' '; c <= '~'; ++c) alphabet.emplace_back(1, c);
    alphabet.emplace_back("\n");
    int whole = 0;
    for (int round = 0; round < 24; ++round) {
        std::vector<ordered_json> offered;
        for (int t = 0, n = 1 + static_cast<int>(rng() % 3); t < n; ++t) {
            ordered_json fn = {{"name", "tool_" + std::to_string(t)}};
            if (rng() % 4 != 0) {
                ordered_json params = random_schema(rng, 0);
                if (!params.contains("type") || params["type"] != "object")
                    params = {{"type", "object"}, {"properties", {{"p", params}}}};
                fn["parameters"] = params;
            }
            offered.push_back({{"type", "function"}, {"function", fn}});
        }
        for (const ChatFormat f : {ChatFormat::deepseek3, ChatFormat::deepseek4, ChatFormat::glm}) {
            const Grammar g = Grammar::parse(tool_call_grammar(f, offered, "", true));
            GrammarAutomaton a(g);
            for (int walk = 0; walk < 6; ++walk) {
                GrammarCursor c;
                c.state = a.start();
                std::string text;
                bool done = false;
                for (int step = 0; step < 4000 && !done; ++step) {
                    std::vector<const std::string *> next;
                    for (const std::string &piece : alphabet) {
                        GrammarCursor t = c;
                        if (t.feed(a, piece)) next.push_back(&piece);
                    }
                    if (c.complete(a) && (next.empty() || rng() % 3 == 0)) {
                        done = true;
                        break;
                    }
                    ASSERT_FALSE(next.empty()) << "stuck after " << text;
                    // Closing characters come sooner than chance would bring them.
                    const std::string *piece = next[rng() % next.size()];
                    for (const std::string *p : next) {
                        if ((*p == "<" || *p == "\"" || *p == "]" || *p == "}") && rng() % 2 == 0) piece = p;
                    }
                    ASSERT_TRUE(c.feed(a, *piece));
                    text += *piece;
                }
                if (!done) continue;
                ++whole;
                const ToolReplyParts r = parse_tool_calls(f, offered, text);
                EXPECT_EQ(r.content, "") << text;
                ASSERT_FALSE(r.calls.empty()) << text;
                for (const ParsedToolCall &call : r.calls) {
                    const auto tool = std::find_if(offered.begin(), offered.end(), [&](const ordered_json &o) {
                        return o["function"]["name"] == call.name;
                    });
                    ASSERT_NE(tool, offered.end()) << call.name;
                    const ordered_json args = ordered_json::parse(call.arguments);
                    const ordered_json &fn = (*tool)["function"];
                    if (fn.contains("parameters")) {
                        EXPECT_TRUE(satisfies(fn["parameters"], args)) << chat_format_name(f) << "\n"
                                                                       << fn["parameters"].dump() << "\n"
                                                                       << call.arguments << "\n"
                                                                       << text;
                    }
                }
            }
        }
    }
    EXPECT_GT(whole, 200);
}

}  // namespace
}  // namespace sparrow::server
