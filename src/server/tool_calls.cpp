#include "server/tool_calls.h"

#include <algorithm>

#include "core/error.h"
#include "server/stop_strings.h"
#include "server/tool_syntax.h"

namespace sparrow::server {

namespace {

using ordered_json = nlohmann::ordered_json;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

void skip_space(std::string_view &s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
}

// Takes `prefix` off the front of s when it is there.
bool eat(std::string_view &s, std::string_view prefix) {
    if (!s.starts_with(prefix)) return false;
    s.remove_prefix(prefix.size());
    return true;
}

// The text of s up to `end` (taken off s with `end`), or false when s has no `end`.
bool take_until(std::string_view &s, std::string_view end, std::string_view &before) {
    const size_t at = s.find(end);
    if (at == std::string_view::npos) return false;
    before = s.substr(0, at);
    s.remove_prefix(at + end.size());
    return true;
}

// The block's opening text: DeepSeek's block tag; GLM's first call (which stays part of the block's text).
std::string_view block_open(ChatFormat f) {
    return f == ChatFormat::glm ? kGlmCall : dsml_block_open(f == ChatFormat::deepseek4);
}

std::string_view block_close(ChatFormat f) { return dsml_block_close(f == ChatFormat::deepseek4); }

// A value as JSON when it parses as such, else as the text itself.
ordered_json json_or_text(std::string_view value) {
    ordered_json parsed = ordered_json::parse(value, nullptr, /*allow_exceptions=*/false);
    return parsed.is_discarded() ? ordered_json(std::string(value)) : parsed;
}

// The body of one DSML invoke (after `name="`, up to its closing tag): NAME">, then parameters.
bool parse_dsml_invoke(std::string_view s, ParsedToolCall &call) {
    std::string_view name;
    if (!take_until(s, "\">", name) || trim(name).empty() || name.find('"') != std::string_view::npos) return false;
    ordered_json args = ordered_json::object();
    for (;;) {
        skip_space(s);
        if (s.empty()) break;
        std::string_view key, value;
        if (!eat(s, kDsmlParam) || !take_until(s, "\"", key)) return false;
        // string="true": the text itself; string="false" (or no attribute): JSON, or the text if it is not JSON
        const bool is_string = eat(s, " string=\"true\"");
        if (!is_string) (void)eat(s, " string=\"false\"");
        if (!eat(s, ">") || !take_until(s, kDsmlParamEnd, value)) return false;
        args[std::string(key)] = is_string ? ordered_json(std::string(value)) : json_or_text(value);
    }
    call.name = std::string(trim(name));
    call.arguments = compact_json(args);
    return true;
}

// The body of one GLM call (between <tool_call> and </tool_call>): NAME, then <arg_key>/<arg_value> pairs.
bool parse_glm_call(std::string_view s,
                    const std::vector<std::pair<std::string, std::vector<std::string>>> &text_params,
                    ParsedToolCall &call) {
    const size_t first = s.find(kGlmKey);
    const std::string_view name = trim(s.substr(0, first));
    if (name.empty() || name.find('<') != std::string_view::npos) return false;
    s.remove_prefix(first == std::string_view::npos ? s.size() : first);
    const std::vector<std::string> *strings = nullptr;
    for (const auto &[tool, params] : text_params) {
        if (tool == name) strings = &params;
    }
    ordered_json args = ordered_json::object();
    for (;;) {
        skip_space(s);
        if (s.empty()) break;
        std::string_view key, value;
        if (!eat(s, kGlmKey) || !take_until(s, kGlmKeyEnd, key)) return false;
        skip_space(s);
        if (!eat(s, kGlmValue) || !take_until(s, kGlmValueEnd, value)) return false;
        const std::string k(trim(key));
        const bool text = strings && std::find(strings->begin(), strings->end(), k) != strings->end();
        args[k] = text ? ordered_json(std::string(value)) : json_or_text(value);
    }
    call.name = std::string(name);
    call.arguments = compact_json(args);
    return true;
}

// Whether s is a proper beginning of `marker`.
bool begins(std::string_view s, std::string_view marker) { return s.size() < marker.size() && marker.starts_with(s); }

constexpr int kMaxAdmitsDepth = 16;

// Whether `schema` admits a string (want_string) or a value that is not one; anything it does not restrict counts.
bool admits(const ordered_json &schema, bool want_string, int depth) {
    if (!schema.is_object() || depth > kMaxAdmitsDepth) return true;
    if (const auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
        return std::any_of(e->begin(), e->end(), [&](const ordered_json &v) { return v.is_string() == want_string; });
    }
    if (const auto c = schema.find("const"); c != schema.end()) return c->is_string() == want_string;
    for (const char *key : {"anyOf", "oneOf"}) {
        if (const auto a = schema.find(key); a != schema.end() && a->is_array() && !a->empty()) {
            return std::any_of(a->begin(), a->end(),
                               [&](const ordered_json &s) { return admits(s, want_string, depth + 1); });
        }
    }
    if (const auto a = schema.find("allOf"); a != schema.end() && a->is_array() && a->size() == 1) {
        return admits((*a)[0], want_string, depth + 1);
    }
    const auto type = schema.find("type");
    if (type != schema.end() && type->is_string()) return (*type == "string") == want_string;
    if (type != schema.end() && type->is_array()) {
        return std::any_of(type->begin(), type->end(),
                           [&](const ordered_json &t) { return (t == "string") == want_string; });
    }
    return !want_string || !(schema.contains("properties") || schema.contains("items"));
}

}  // namespace

const ordered_json *properties_of(const ordered_json &tool) {
    const ordered_json &fn = tool.at("function");
    const auto params = fn.find("parameters");
    if (params == fn.end() || !params->is_object()) return nullptr;
    const auto props = params->find("properties");
    return props != params->end() && props->is_object() ? &*props : nullptr;
}

bool admits_string(const ordered_json &schema) { return admits(schema, true, 0); }
bool admits_non_string(const ordered_json &schema) { return admits(schema, false, 0); }

std::string python_json_dumps(const ordered_json &v) {
    if (v.is_object()) {
        std::string out = "{";
        bool first = true;
        for (const auto &[key, value] : v.items()) {
            if (!first) out += ", ";
            first = false;
            out += compact_json(ordered_json(key)) + ": " + python_json_dumps(value);
        }
        return out + "}";
    }
    if (v.is_array()) {
        std::string out = "[";
        for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_json_dumps(v[i]);
        return out + "]";
    }
    return compact_json(v);
}

ToolCallParser::ToolCallParser(ChatFormat format, const std::vector<ordered_json> &tools) : format_(format) {
    if (format == ChatFormat::llama2) throw_error("the llama2 chat format has no tool calls");
    for (const ordered_json &tool : tools) {
        const ordered_json *props = properties_of(tool);
        std::vector<std::string> strings;
        if (props) {
            for (const auto &[name, schema] : props->items()) {
                if (!admits_non_string(schema)) strings.push_back(name);  // only a string: the text as written
            }
        }
        string_params_.emplace_back(tool.at("function").at("name").get<std::string>(), std::move(strings));
    }
}

bool ToolCallParser::take_calls(ToolReplyParts &out) {
    for (;;) {
        std::string_view s = held_;
        skip_space(s);
        ParsedToolCall call;
        if (format_ == ChatFormat::glm) {
            if (begins(s, kGlmCall)) return true;  // wait for more (or only whitespace so far)
            if (!eat(s, kGlmCall)) {
                state_ = State::after_block;  // text after the calls is content again
                held_ = std::string(s);
                return true;
            }
            std::string_view body;
            if (!call_end(s, kGlmCallEnd, body)) return true;
            if (!parse_glm_call(body, string_params_, call)) return false;
        } else {
            if (begins(s, kDsmlInvoke) || begins(s, block_close(format_))) return true;
            if (eat(s, block_close(format_))) {
                if (!block_text_.empty()) return false;  // a block with no call in it is text, as written
                state_ = State::after_block;
                held_ = std::string(s);
                return true;
            }
            if (!eat(s, kDsmlInvoke)) return false;  // text in the block that is not a call
            std::string_view body;
            if (!call_end(s, kDsmlInvokeEnd, body)) return true;
            if (!parse_dsml_invoke(body, call)) return false;
        }
        out.calls.push_back(std::move(call));
        held_ = std::string(s);
        spacing_.clear();
        block_text_.clear();
    }
}

bool ToolCallParser::call_end(std::string_view &s, std::string_view end, std::string_view &body) {
    const size_t begin = held_.size() - s.size();  // where s starts in held_
    const size_t at = held_.find(end, std::max(begin, searched_));
    if (at == std::string::npos) {
        // The tag may still end across this piece and the next: its first bytes are searched again.
        searched_ = std::max(begin, held_.size() - std::min(held_.size(), end.size() - 1));
        return false;
    }
    searched_ = 0;  // held_ is cut at the call's end next
    body = std::string_view(held_).substr(begin, at - begin);
    s = std::string_view(held_).substr(at + end.size());
    return true;
}

ToolReplyParts ToolCallParser::push(std::string_view text) {
    ToolReplyParts out;
    held_ += text;
    if (state_ == State::content) {
        const std::string_view open = block_open(format_);
        const size_t at = held_.find(open);
        if (at == std::string::npos) {
            // Send all but a possible start of the block and the whitespace before it.
            size_t keep = held_.size() - marker_prefix_at_end(held_, open);
            while (keep > 0 && is_space(held_[keep - 1])) --keep;
            out.content = held_.substr(0, keep);
            held_.erase(0, keep);
            return out;
        }
        size_t end = at;
        while (end > 0 && is_space(held_[end - 1])) --end;
        out.content = held_.substr(0, end);
        spacing_ = held_.substr(end, at - end);
        // DeepSeek's block tag is read here; GLM's first <tool_call> is the first call's own tag.
        const size_t body = format_ == ChatFormat::glm ? at : at + open.size();
        block_text_ = held_.substr(at, body - at);
        held_.erase(0, body);
        state_ = State::block;
    }
    if (state_ == State::block && !take_calls(out)) {
        // Not a call: what the block held is content after all, and so is the rest of the reply.
        out.content += spacing_ + block_text_ + held_;
        spacing_.clear();
        block_text_.clear();
        held_.clear();
        state_ = State::after_block;
        return out;
    }
    if (state_ == State::after_block) {
        out.content += held_;
        held_.clear();
    }
    return out;
}

ToolReplyParts ToolCallParser::finish() {
    ToolReplyParts out;
    // Content: the whitespace or partial tag held back. A block: its unfinished part, as written.
    // Only whitespace after the last call (a DeepSeek block whose closing tag never came) is dropped.
    out.content = state_ != State::block                       ? held_
                  : block_text_.empty() && trim(held_).empty() ? std::string()
                                                               : spacing_ + block_text_ + held_;
    held_.clear();
    spacing_.clear();
    block_text_.clear();
    return out;
}

ToolReplyParts parse_tool_calls(ChatFormat format, const std::vector<ordered_json> &tools, std::string_view text) {
    ToolCallParser parser(format, tools);
    ToolReplyParts out = parser.push(text);
    ToolReplyParts rest = parser.finish();
    out.content += rest.content;
    out.calls.insert(out.calls.end(), rest.calls.begin(), rest.calls.end());
    return out;
}

}  // namespace sparrow::server
