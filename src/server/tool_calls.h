// Function calling in the chat formats that have it (DeepSeek-V3.2's and V4's DSML blocks, GLM's <tool_call>
// elements): the calls a reply makes are read out of its text, whole or as it streams, and a grammar can make a
// reply be calls (OpenAI's tool_choice "required" or a named function).
//
// DeepSeek (../shared/data/templates/deepseek-ai-DeepSeek-V3.2.jinja; V4 names the block tool_calls):
//   <content>\n\n<｜DSML｜function_calls>\n
//   <｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>\n...
//   </｜DSML｜invoke>\n...</｜DSML｜function_calls>
// a value is the string itself (string="true") or JSON.
// GLM (GLM-4.7-Flash.jinja): <content><tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...
// </tool_call>..., a value is the string itself or JSON; which one is told by the tool's parameter schema (a
// parameter of type "string" is text, anything else is read as JSON when it parses).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/chat_format.h"

namespace sparrow::server {

// What the templates' tojson writes: Python's json.dumps(v, ensure_ascii=False) with HF's defaults (keys in the
// order given, ", " between items and ": " after keys).
std::string python_json_dumps(const nlohmann::ordered_json &v);

struct ParsedToolCall {
    std::string name;
    std::string arguments;  // a JSON object's text, compact, parameters in the order the reply gave them
};

struct ToolReplyParts {
    std::string content;                // text to send as the reply's content
    std::vector<ParsedToolCall> calls;  // calls completed by this piece
};

// Reads a reply's calls as its text arrives. Text before the first call is content (the whitespace that
// separates it from the calls is dropped); a call is handed out when its closing tag has come. Text that might
// begin a block of calls is held back until the next piece shows. A block that never completes (the reply was
// cut short, or the model wrote something that is not a call) comes back as content, as written.
class ToolCallParser {
  public:
    // `tools`: the tools on offer ({"type": "function", "function": {...}}), for the types of GLM's parameters.
    ToolCallParser(ChatFormat format, const std::vector<nlohmann::ordered_json> &tools);

    ToolReplyParts push(std::string_view text);
    // The reply ended: what was held back.
    ToolReplyParts finish();

  private:
    enum class State { content, block, after_block };
    // Takes what it can of the block's text in held_; returns false when that text is not a call.
    bool take_calls(ToolReplyParts &out);
    // The call in progress in held_ (s, a view of its end, begins inside the call) up to its closing tag `end`:
    // true with its body before the tag (s moves past the tag), or false while the tag has not come. Each push
    // searches only what it added, so a long argument streamed in small pieces is read in linear time.
    bool call_end(std::string_view &s, std::string_view end, std::string_view &body);

    ChatFormat format_;
    std::vector<std::pair<std::string, std::vector<std::string>>> string_params_;  // GLM: tool -> its text params
    State state_ = State::content;
    std::string held_;        // content: a possible start of a block (and the whitespace before it); block: unread text
    std::string spacing_;     // the whitespace between the content and the block (content again if the block fails)
    std::string block_text_;  // the block as written so far (content again if it fails)
    size_t searched_ = 0;     // held_'s first bytes that hold no closing tag of the call in progress
};

// The whole reply at once (what a stream of any pieces gives, joined).
ToolReplyParts parse_tool_calls(ChatFormat format, const std::vector<nlohmann::ordered_json> &tools,
                                std::string_view text);

// A GBNF grammar (runtime/grammar.h) for a reply that is one call (parallel false) or 1-16, of the tools on offer or
// only of `only` when it is not empty, in the format's syntax: each tool's parameters in the order its JSON schema
// declares them (the required ones always), string ones as text, the others as JSON values of their schemas (any
// names and values when the tool declares no properties). tool_grammar.cpp says which schema keywords shape them.
std::string tool_call_grammar(ChatFormat format, const std::vector<nlohmann::ordered_json> &tools,
                              const std::string &only, bool parallel);

}  // namespace sparrow::server
