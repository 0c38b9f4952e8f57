#include "server/chat_format.h"

#include "core/error.h"
#include "runtime/tokenizer.h"
#include "server/tool_calls.h"
#include "server/tool_syntax.h"

namespace sparrow::server {

namespace {

// out += each part (g++ 12 warns falsely about chains of std::string operator+).
void append(std::string &out, std::initializer_list<std::string_view> parts) {
    for (std::string_view p : parts) out.append(p);
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// Python's str.strip() over ASCII whitespace (what the templates' .strip() does for the text we see).
std::string_view strip(std::string_view s) {
    constexpr std::string_view ws = " \t\n\r\f\v";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string_view rstrip_newlines(std::string_view s) {
    while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
    return s;
}

std::string_view lstrip_newlines(std::string_view s) {
    while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
    return s;
}

std::string normalized_role(const ChatMessage &m) {
    if (m.role == "developer") return "system";
    if (m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool") return m.role;
    throw_error("unsupported message role '%s' (expected system, user, assistant or tool)", m.role.c_str());
}

// The DeepSeek templates' DSML block of an assistant turn's calls (V3.2's function_calls; V4's tool_calls, which
// also writes a newline for a call without arguments).
void append_dsml_calls(std::string &out, const std::vector<ToolCall> &calls, bool v4) {
    append(out, {"\n\n", dsml_block_open(v4), "\n"});
    for (const ToolCall &call : calls) {
        append(out, {kDsmlInvoke, call.name, "\">\n"});
        for (const auto &[key, value] : call.arguments.items()) {
            const bool text = value.is_string();
            append(out, {kDsmlParam, key, text ? "\" string=\"true\">" : "\" string=\"false\">",
                         text ? value.get_ref<const std::string &>() : python_json_dumps(value), kDsmlParamEnd, "\n"});
        }
        if (v4 && call.arguments.empty()) out += "\n";
        append(out, {kDsmlInvokeEnd, "\n"});
    }
    out += dsml_block_close(v4);
}

// The system prompt's part that offers the tools (both DeepSeek templates): the header, each tool's "function"
// object as JSON on its own line, the footer.
std::string dsml_tools(const std::vector<nlohmann::ordered_json> &tools, std::string_view header,
                       std::string_view footer) {
    std::string out(header);
    for (const nlohmann::ordered_json &tool : tools) {
        if (tool.value("type", "") == "function") append(out, {python_json_dumps(tool.at("function")), "\n"});
    }
    return out + std::string(footer);
}

constexpr std::string_view kDeepseek3ToolsHeader =
    "## Tools\n\nYou have access to a set of tools you can use to answer the user's question.\nYou can invoke "
    "functions by writing a \"<｜DSML｜function_calls>\" block like the following as part of your reply to the "
    "user:\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n<｜DSML｜parameter "
    "name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜function_calls>\n\nString and scalar "
    "parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON "
    "format. The \"string\" attribute should be set to \"true\" for string type parameters and \"false\" for other "
    "types (numbers, booleans, arrays, objects).\n\nIf the thinking_mode is enabled, then after function results you "
    "should strongly consider outputting a thinking block. Here is an example:\n\n<｜DSML｜function_calls>\n...\n"
    "</｜DSML｜function_calls>\n\n<function_results>\n...\n</function_results>\n\n<think>...thinking about results"
    "</think>\n\nHere are the functions available in JSONSchema format:\n<functions>\n";
constexpr std::string_view kDeepseek3ToolsFooter = "</functions>\n";

constexpr std::string_view kDeepseek4ToolsHeader =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other "
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf "
    "thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with "
    "tool calls or final response.\n\n### Available Tool Schemas\n\n";
constexpr std::string_view kDeepseek4ToolsFooter =
    "\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

// Index of the last user turn, or -1.
ptrdiff_t last_user_index(const std::vector<ChatMessage> &messages) {
    ptrdiff_t last = -1;
    for (size_t i = 0; i < messages.size(); ++i) {
        if (normalized_role(messages[i]) == "user") last = static_cast<ptrdiff_t>(i);
    }
    return last;
}

// Every system message's content, joined by blank lines (both DeepSeek templates put it right after BOS).
std::string joined_system_prompt(const std::vector<ChatMessage> &messages) {
    std::string joined;
    bool first = true;
    for (const ChatMessage &m : messages) {
        if (normalized_role(m) != "system") continue;
        if (!first) joined += "\n\n";
        joined += m.content;
        first = false;
    }
    return joined;
}

// The system prompt of both DeepSeek templates: every system message joined by blank lines, then the tools.
std::string deepseek_system_prompt(const std::vector<ChatMessage> &messages, const ChatOptions &opts,
                                   std::string_view tools_header, std::string_view tools_footer) {
    std::string prompt = joined_system_prompt(messages);
    if (!opts.tools.empty()) {
        if (!prompt.empty()) prompt += "\n\n";
        prompt += dsml_tools(opts.tools, tools_header, tools_footer);
    }
    return prompt;
}

// deepseek-ai-DeepSeek-V3.2.jinja: BOS, then the system prompt (and the tools), then the turns. An assistant turn
// directly after a user turn opens with <｜Assistant｜> and the thinking block (only the closing tag when thinking
// is off or the turn precedes the last user message), after tool results with a blank line and the same block;
// it ends with its calls' DSML block and EOS. Tool turns answer the calls of the assistant turn before them in
// order: the first opens <function_results>, the one that answers the last call closes it.
std::string render_deepseek3(const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    const bool thinking = opts.enable_thinking.value_or(false);
    const ptrdiff_t last_user = last_user_index(messages);
    std::string out =
        opts.bos_text + deepseek_system_prompt(messages, opts, kDeepseek3ToolsHeader, kDeepseek3ToolsFooter);
    bool pending_assistant_marker = false, pending_tool_marker = false;
    ptrdiff_t calls_at = -1;  // the last assistant turn with calls so far
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage &m = messages[i];
        const std::string role = normalized_role(m);
        const auto think_block = [&] {
            return static_cast<ptrdiff_t>(i) > last_user && thinking
                       ? "<think>" + m.reasoning_content.value_or("") + "</think>"
                       : std::string("</think>");
        };
        if (role == "user") {
            append(out, {"<｜User｜>", m.content});
            pending_assistant_marker = true;
            pending_tool_marker = false;
        } else if (role == "assistant") {
            if (pending_assistant_marker) {
                append(out, {"<｜Assistant｜>", think_block()});
            } else if (pending_tool_marker) {
                append(out, {"\n\n", think_block()});
            }
            pending_assistant_marker = pending_tool_marker = false;
            out += m.content;
            if (!m.tool_calls.empty()) {
                append_dsml_calls(out, m.tool_calls, /*v4=*/false);
                calls_at = static_cast<ptrdiff_t>(i);
            }
            out += "<｜end▁of▁sentence｜>";
        } else if (role == "tool") {
            if (calls_at < 0) {
                throw_error("message %zu is a tool result with no assistant message of tool calls before it", i);
            }
            const size_t order = i - static_cast<size_t>(calls_at);  // 1 answers the first call
            if (order == 1) out += "\n\n<function_results>";
            append(out, {"\n<result>", m.content, "</result>"});
            if (order == messages[static_cast<size_t>(calls_at)].tool_calls.size()) {
                out += "\n</function_results>";
                pending_assistant_marker = false;
                pending_tool_marker = true;
            }
        }
    }
    if (opts.add_generation_prompt) {
        if (pending_assistant_marker) {
            out += thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜><think></think>";
        } else if (pending_tool_marker) {
            out += thinking ? "\n\n<think>" : "\n\n<think></think>";
        }
    }
    return out;
}

// deepseek-ai-DeepSeek-V4.jinja: BOS and the system prompt as in V3.2 (its own tools text); consecutive user and
// tool turns share one <｜User｜> (joined by blank lines, tool results as <tool_result>); every assistant turn opens
// with <｜Assistant｜> and keeps its thinking with thinking on when it comes after the last user or tool turn, or
// when tools are on offer or any tool turn exists; the generation prompt follows whatever came last.
std::string render_deepseek4(const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    const bool thinking = opts.enable_thinking.value_or(false);
    ptrdiff_t last_user = -1;
    bool has_tool_turns = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string role = normalized_role(messages[i]);
        if (role == "user" || role == "tool") last_user = static_cast<ptrdiff_t>(i);
        has_tool_turns = has_tool_turns || role == "tool";
    }
    std::string out =
        opts.bos_text + deepseek_system_prompt(messages, opts, kDeepseek4ToolsHeader, kDeepseek4ToolsFooter);
    bool in_user = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage &m = messages[i];
        const std::string role = normalized_role(m);
        if (role == "user" || role == "tool") {
            out += in_user ? "\n\n" : "<｜User｜>";
            in_user = true;
            if (role == "user") {
                out += m.content;
            } else {
                append(out, {"<tool_result>", m.content, "</tool_result>"});
            }
        } else if (role == "assistant") {
            in_user = false;
            out += "<｜Assistant｜>";
            const bool keep_reasoning =
                thinking && (!opts.tools.empty() || has_tool_turns || static_cast<ptrdiff_t>(i) > last_user);
            if (keep_reasoning) {
                append(out, {"<think>", m.reasoning_content.value_or(""), "</think>"});
            } else {
                out += "</think>";
            }
            out += m.content;
            if (!m.tool_calls.empty()) append_dsml_calls(out, m.tool_calls, /*v4=*/true);
            out += "<｜end▁of▁sentence｜>";
        }
    }
    if (opts.add_generation_prompt) out += thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜></think>";
    return out;
}

// GLM-4.7-Flash.jinja (HF rendering: trim_blocks, lstrip_blocks): [gMASK]<sop>, the tools in a system turn of
// their own, then each turn as its tag and text; an assistant turn carries its thinking (only after the last user
// turn) or an empty </think>, then its stripped text and its calls as <tool_call> elements. Consecutive tool turns
// share one <|observation|>. The generation prompt opens the thinking block unless thinking is disabled.
std::string render_glm(const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    const ptrdiff_t last_user = last_user_index(messages);
    std::string out = "[gMASK]<sop>";
    if (!opts.tools.empty()) {
        out +=
            "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
            "provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
        for (const nlohmann::ordered_json &tool : opts.tools) append(out, {python_json_dumps(tool), "\n"});
        out +=
            "</tools>\n\nFor each function call, output the function name and arguments within the following XML "
            "format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
            "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";
    }
    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage &m = messages[i];
        const std::string role = normalized_role(m);
        if (role == "user") {
            append(out, {"<|user|>", m.content});
        } else if (role == "system") {
            append(out, {"<|system|>", m.content});
        } else if (role == "tool") {
            if (i == 0 || normalized_role(messages[i - 1]) != "tool") out += "<|observation|>";
            append(out, {"<tool_response>", m.content, "</tool_response>"});
        } else {
            out += "<|assistant|>";
            std::string_view content = m.content;
            std::string reasoning;
            if (m.reasoning_content) {
                reasoning = *m.reasoning_content;
            } else if (contains(content, "</think>")) {
                // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
                std::string_view before = rstrip_newlines(content.substr(0, content.find("</think>")));
                const size_t open = before.rfind("<think>");
                if (open != std::string_view::npos) before = before.substr(open + 7);
                reasoning = std::string(lstrip_newlines(before));
                // content.split('</think>')[-1].lstrip('\n')
                content = lstrip_newlines(content.substr(content.rfind("</think>") + 8));
            }
            if (static_cast<ptrdiff_t>(i) > last_user && !reasoning.empty()) {
                append(out, {"<think>", strip(reasoning), "</think>"});
            } else {
                out += "</think>";
            }
            out += strip(content);
            for (const ToolCall &call : m.tool_calls) {
                append(out, {kGlmCall, call.name});
                for (const auto &[key, value] : call.arguments.items()) {
                    append(out, {kGlmKey, key, kGlmKeyEnd, kGlmValue,
                                 value.is_string() ? value.get_ref<const std::string &>() : python_json_dumps(value),
                                 kGlmValueEnd});
                }
                out += kGlmCallEnd;
            }
        }
    }
    if (opts.add_generation_prompt) {
        const bool thinking_off = opts.enable_thinking.has_value() && !*opts.enable_thinking;
        out += thinking_off ? "<|assistant|></think>" : "<|assistant|><think>";
    }
    return out;
}

// Meta's Llama-2 chat template: an optional leading system message folded into the first user turn;
// user turns as BOS "[INST] text [/INST]", assistant turns as " text EOS". No generation prompt.
std::string render_llama2(const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    if (!opts.tools.empty()) throw_error("the llama2 chat format has no tools");
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role == "tool" || !messages[i].tool_calls.empty()) {
            throw_error("the llama2 chat format has no tool calls or tool results (message %zu)", i);
        }
    }
    size_t first = 0;
    std::string system;
    bool has_system = false;
    if (!messages.empty() && normalized_role(messages[0]) == "system") {
        system = messages[0].content;
        has_system = true;
        first = 1;
    }
    // The template renders a system message only inside the first user turn: without one, nothing would be said.
    if (first == messages.size()) throw_error("the llama2 chat format needs a user message after the system message");
    std::string out;
    for (size_t i = first; i < messages.size(); ++i) {
        const std::string role = normalized_role(messages[i]);
        // As the template: turns must alternate user/other; a later system message takes an assistant's
        // place and renders nothing.
        const bool expect_user = (i - first) % 2 == 0;
        if ((role == "user") != expect_user) {
            throw_error(
                "the llama2 chat format needs roles alternating user/assistant/user/... (after an optional "
                "system message); message %zu is '%s'",
                i, messages[i].role.c_str());
        }
        std::string content = messages[i].content;
        if (i == first && has_system) {
            std::string with_system;
            append(with_system, {"<<SYS>>\n", system, "\n<</SYS>>\n\n", content});
            content = std::move(with_system);
        }
        if (role == "user") {
            append(out, {opts.bos_text, "[INST] ", strip(content), " [/INST]"});
        } else if (role == "assistant") {
            append(out, {" ", strip(content), " ", opts.eos_text});
        }
    }
    return out;
}

}  // namespace

ChatOptions chat_options_for(const Tokenizer &tok) {
    ChatOptions opts;
    if (tok.bos_id() >= 0) opts.bos_text = std::string(tok.token_text(tok.bos_id()));
    if (tok.eos_id() >= 0) opts.eos_text = std::string(tok.token_text(tok.eos_id()));
    return opts;
}

std::optional<ChatFormat> detect_chat_format(std::string_view t) {
    if (contains(t, "<｜User｜>") && contains(t, "<｜Assistant｜>")) {
        // V4 merges consecutive user turns (its state.in_user) and has drop_thinking; V3.2 has neither.
        return contains(t, "drop_thinking") || contains(t, "in_user") ? ChatFormat::deepseek4 : ChatFormat::deepseek3;
    }
    if (contains(t, "[gMASK]<sop>") || (contains(t, "<|user|>") && contains(t, "<|assistant|>"))) {
        return ChatFormat::glm;
    }
    if (contains(t, "[INST]") && contains(t, "[/INST]")) return ChatFormat::llama2;
    return std::nullopt;
}

ChatFormat chat_format_from_name(std::string_view name) {
    if (name == "deepseek3" || name == "deepseek-v3.2") return ChatFormat::deepseek3;
    if (name == "deepseek4" || name == "deepseek-v4") return ChatFormat::deepseek4;
    if (name == "glm" || name == "glm-5" || name == "glm4") return ChatFormat::glm;
    if (name == "llama2") return ChatFormat::llama2;
    throw_error("unknown chat format '%.*s' (expected deepseek3, deepseek4, glm or llama2)", (int)name.size(),
                name.data());
}

const char *chat_format_name(ChatFormat f) {
    switch (f) {
        case ChatFormat::deepseek3: return "deepseek3";
        case ChatFormat::deepseek4: return "deepseek4";
        case ChatFormat::glm: return "glm";
        case ChatFormat::llama2: return "llama2";
    }
    return "?";
}

bool chat_format_has_tools(ChatFormat f) { return f != ChatFormat::llama2; }

std::string apply_chat_format(ChatFormat f, const std::vector<ChatMessage> &messages, const ChatOptions &opts) {
    switch (f) {
        case ChatFormat::deepseek3: return render_deepseek3(messages, opts);
        case ChatFormat::deepseek4: return render_deepseek4(messages, opts);
        case ChatFormat::glm: return render_glm(messages, opts);
        case ChatFormat::llama2: return render_llama2(messages, opts);
    }
    throw_error("unknown chat format");
}

}  // namespace sparrow::server
