// libFuzzer entry point for function calls (server/tool_calls.h): the tools a client offers (JSON, whose schemas
// shape a grammar) and the reply text the calls are read from. An input is a format byte, the tools' JSON, a NUL,
// then the reply. Invariants: the grammar of any tools either compiles or the tools are refused with
// sparrow::Error; a reply read in pieces (cut where the input's last bytes say) reads as the whole does; a reply
// with no calls is all content, as written; every call's arguments are a JSON object.
//
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSPARROW_FUZZ=ON && ninja -C build-fuzz tool_calls_fuzzer
//   mkdir -p /tmp/tools-corpus && ./build-fuzz/fuzz/tool_calls_fuzzer -dict=fuzz/tool_calls.dict /tmp/tools-corpus
//
// tests/tool_calls_test.cpp holds the deterministic tests; this one is for long runs by hand (its replay runs in
// CTest).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "runtime/grammar.h"
#include "server/tool_calls.h"

namespace {

using ordered_json = nlohmann::ordered_json;

[[noreturn]] void fail(const char *what) {
    std::fprintf(stderr, "tool_calls_fuzzer: invariant broken: %s\n", what);
    __builtin_trap();  // libFuzzer reports the crash and saves the input that caused it
}

// The tools of the JSON as the server keeps them (an array of {"type": "function", "function": {"name": ...}}
// with string names); empty when the JSON is not that.
std::vector<ordered_json> offered_tools(std::string_view text) {
    const ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    std::vector<ordered_json> tools;
    if (!j.is_array()) return tools;
    for (const ordered_json &t : j) {
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) return {};
        const ordered_json &fn = t["function"];
        if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) return {};
        if (fn.contains("parameters") && !fn["parameters"].is_object()) return {};
        tools.push_back(t);
    }
    return tools;
}

bool same(const sparrow::server::ToolReplyParts &a, const sparrow::server::ToolReplyParts &b) {
    if (a.content != b.content || a.calls.size() != b.calls.size()) return false;
    for (size_t i = 0; i < a.calls.size(); ++i) {
        if (a.calls[i].name != b.calls[i].name || a.calls[i].arguments != b.calls[i].arguments) return false;
    }
    return true;
}

}  // namespace

std::vector<std::vector<uint8_t>> fuzz_builtin_inputs() {
    const char *weather =
        R"([{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "required": ["c"],
            "properties": {"c": {"type": "string", "enum": ["a", "b"]}, "n": {"anyOf": [{"type": "integer"},
            {"type": "array", "items": {"type": "number"}, "maxItems": 2}]}}}}}, {"type": "function",
            "function": {"name": "now"}}])";
    const std::pair<char, std::string> cases[] = {
        {0, std::string(weather) + '\0' +
                "Hi\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"w\">\n<｜DSML｜parameter name=\"c\" "
                "string=\"true\">a</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>\x05\x20"},
        {1, std::string(weather) + '\0' + "<｜DSML｜tool_calls></｜DSML｜tool_calls>x"},
        {2, std::string(weather) + '\0' +
                "a<tool_call>w<arg_key>n</arg_key><arg_value>[1, 2.5]</arg_value></tool_call><tool_call>now"},
        {2, std::string("[{\"type\": \"function\", \"function\": {\"name\": \"x\", \"parameters\": {\"properties\": "
                        "{\"k\": {\"type\": [\"string\", \"null\"], \"minItems\": -3}}}}}]") +
                '\0' + "<tool_call>x<arg_key>k</arg_key><arg_value>null</arg_value></tool_call>"},
        {0, std::string("not json") + '\0' + "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"\">"},
    };
    std::vector<std::vector<uint8_t>> inputs;
    for (const auto &[format, rest] : cases) {
        std::vector<uint8_t> in = {static_cast<uint8_t>(format)};
        in.insert(in.end(), rest.begin(), rest.end());
        inputs.push_back(std::move(in));
    }
    return inputs;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace sparrow::server;
    if (size < 1) return 0;
    const ChatFormat formats[] = {ChatFormat::deepseek3, ChatFormat::deepseek4, ChatFormat::glm};
    const ChatFormat format = formats[data[0] % 3];
    const std::string_view input(reinterpret_cast<const char *>(data + 1), size - 1);
    const size_t split = input.find('\0');
    const std::string_view tools_text = input.substr(0, split);
    const std::string_view reply = split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
    const std::vector<ordered_json> tools = offered_tools(tools_text);

    if (!tools.empty()) {
        for (const bool parallel : {true, false}) {
            try {
                (void)sparrow::Grammar::parse(tool_call_grammar(format, tools, "", parallel));
            } catch (const sparrow::Error &) {
                // refused (a grammar past the element limit): the server answers 400
            }
        }
    }

    const ToolReplyParts whole = parse_tool_calls(format, tools, reply);
    // Two cuts from the reply's last bytes (they are part of the reply too).
    const size_t n = reply.size();
    const size_t a = n ? static_cast<uint8_t>(reply[n - 1]) * n / 256 : 0;
    const size_t b = n > 1 ? a + (n - a) * static_cast<uint8_t>(reply[n - 2]) / 256 : a;
    ToolCallParser parser(format, tools);
    ToolReplyParts pieces;
    for (const std::string_view piece : {reply.substr(0, a), reply.substr(a, b - a), reply.substr(b)}) {
        ToolReplyParts r = parser.push(piece);
        pieces.content += r.content;
        pieces.calls.insert(pieces.calls.end(), r.calls.begin(), r.calls.end());
    }
    ToolReplyParts r = parser.finish();
    pieces.content += r.content;
    pieces.calls.insert(pieces.calls.end(), r.calls.begin(), r.calls.end());
    if (!same(whole, pieces)) fail("a reply read in pieces differs from the whole");
    if (whole.calls.empty() && whole.content != reply) fail("a reply with no calls is not all content");
    for (const ParsedToolCall &call : whole.calls) {
        if (call.name.empty()) fail("a call without a name");
        const ordered_json args = ordered_json::parse(call.arguments, nullptr, false);
        if (!args.is_object()) fail("a call's arguments are not a JSON object");
    }
    return 0;
}
