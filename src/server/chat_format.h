// Chat prompt formats built in for the model families sparrow serves, reproducing what their Jinja chat
// templates (../shared/data/templates) render for system, user, assistant and tool turns, the tools on offer and
// the generation prompt. No template engine: a GGUF's tokenizer.chat_template is recognised by distinctive
// substrings. Tool definitions and call arguments keep the client's key order (nlohmann's ordered_json), since the
// templates' tojson writes them in that order.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sparrow {
class Tokenizer;
}  // namespace sparrow

namespace sparrow::server {

enum class ChatFormat {
    deepseek3,  // DeepSeek-V3.2: <｜User｜> / <｜Assistant｜> turns, thinking off by default
    deepseek4,  // DeepSeek-V4: as V3.2, but consecutive user turns merge and the prompt opens with </think>
    glm,        // GLM-4.5 .. GLM-5: [gMASK]<sop>, <|system|> / <|user|> / <|assistant|>, thinking on by default
    llama2,     // Llama-2 chat: <s>[INST] <<SYS>> ... <</SYS>> user [/INST] assistant </s>
};

// One function call of an assistant turn, as the client sends it back with the conversation.
struct ToolCall {
    std::string id;                    // the client's call id (the built-in formats do not render it)
    std::string name;                  // the function's name
    nlohmann::ordered_json arguments;  // an object: parameter name -> value
};

struct ChatMessage {
    std::string role;     // "system", "user", "assistant" or "tool" ("developer" is treated as "system")
    std::string content;  // text (the server joins a content array's text parts)
    std::optional<std::string> reasoning_content = std::nullopt;  // an assistant turn's thinking, when sent
    std::vector<ToolCall> tool_calls = {};                        // an assistant turn's function calls
};

struct ChatOptions {
    bool add_generation_prompt = true;
    std::optional<bool> enable_thinking;  // unset: the template's default (deepseek3/4 off, glm on)
    std::string bos_text;                 // the vocabulary's BOS token text ("" when it has none)
    std::string eos_text;                 // the vocabulary's EOS token text
    // The tools on offer, each {"type": "function", "function": {"name", "description", "parameters"}} as sent.
    std::vector<nlohmann::ordered_json> tools;
};

// Options with the vocabulary's BOS and EOS token texts (the rest at their defaults).
ChatOptions chat_options_for(const Tokenizer &tok);

// Recognises a chat template's family; nullopt when it is none of the built-in ones.
std::optional<ChatFormat> detect_chat_format(std::string_view jinja_template);
// "deepseek3" (also "deepseek-v3.2"), "deepseek4" (also "deepseek-v4"), "glm" (also "glm-5", "glm4"), "llama2";
// throws sparrow::Error otherwise.
ChatFormat chat_format_from_name(std::string_view name);
const char *chat_format_name(ChatFormat f);

// Whether the format can offer tools and render calls and their results (every built-in one but llama2).
bool chat_format_has_tools(ChatFormat f);

// The prompt text for the conversation. Throws sparrow::Error for a conversation the format cannot express
// (an unknown role; llama2: roles that do not alternate user/assistant after an optional system message, tools,
// tool calls or tool turns; DeepSeek-V3.2: a tool turn with no assistant turn of calls before it).
std::string apply_chat_format(ChatFormat f, const std::vector<ChatMessage> &messages, const ChatOptions &opts);

}  // namespace sparrow::server
