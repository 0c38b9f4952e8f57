// The tags of the chat formats' function calls (tool_calls.h describes the syntax), shared by the reader of
// calls (tool_calls.cpp) and the grammar that makes a reply be calls (tool_grammar.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace sparrow::server {

inline constexpr std::string_view kDsmlInvoke = "<｜DSML｜invoke name=\"";
inline constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
inline constexpr std::string_view kDsmlParam = "<｜DSML｜parameter name=\"";
inline constexpr std::string_view kDsmlParamEnd = "</｜DSML｜parameter>";
inline constexpr std::string_view kGlmCall = "<tool_call>";
inline constexpr std::string_view kGlmCallEnd = "</tool_call>";
inline constexpr std::string_view kGlmKey = "<arg_key>";
inline constexpr std::string_view kGlmKeyEnd = "</arg_key>";
inline constexpr std::string_view kGlmValue = "<arg_value>";
inline constexpr std::string_view kGlmValueEnd = "</arg_value>";

// DeepSeek's block of calls: V3.2's function_calls, V4's tool_calls.
inline std::string_view dsml_block_open(bool v4) { return v4 ? "<｜DSML｜tool_calls>" : "<｜DSML｜function_calls>"; }
inline std::string_view dsml_block_close(bool v4) { return v4 ? "</｜DSML｜tool_calls>" : "</｜DSML｜function_calls>"; }

// A value as compact JSON (as OpenAI's arguments are written; invalid UTF-8 replaced, never thrown).
inline std::string compact_json(const nlohmann::ordered_json &v) {
    return v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// A tool's parameter schemas ("function.parameters.properties", an object), or null when it names none.
const nlohmann::ordered_json *properties_of(const nlohmann::ordered_json &tool);
// Whether a schema admits a string, and whether it admits a value that is not one (both when it does not say):
// the formats write a string value as the text itself and any other as JSON.
bool admits_string(const nlohmann::ordered_json &schema);
bool admits_non_string(const nlohmann::ordered_json &schema);

}  // namespace sparrow::server
