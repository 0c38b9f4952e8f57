#include "server/requests.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "runtime/grammar.h"
#include "runtime/json_schema.h"
#include "runtime/tokenizer.h"

namespace sparrow::tools::http {

namespace {
std::vector<int32_t> read_ids(const json &arr, const char *key, const RequestLimits &lim) {
    std::vector<int32_t> ids;
    ids.reserve(arr.size());
    for (const json &v : arr) {
        if (!v.is_number_integer()) {
            throw ApiError(400, strprintf("'%s' must be a string or an array of token ids", key), "invalid_type");
        }
        const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT32_MAX) ? -1 : v.get<int64_t>();
        if (id < 0 || id >= lim.n_vocab) {
            throw ApiError(
                400,
                strprintf("'%s' holds token id %lld, outside the vocabulary [0, %d)", key, (long long)id, lim.n_vocab),
                "invalid_value");
        }
        ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
}
}  // namespace

void check_prompt_fits(size_t n_prompt, const RequestLimits &lim) {
    if (n_prompt == 0) throw ApiError(400, "the prompt is empty", "invalid_value");
    if (static_cast<int64_t>(n_prompt) >= lim.n_ctx_per_slot) {
        throw ApiError(400,
                       strprintf("the prompt has %zu tokens; a request's context holds %lld tokens (prompt and "
                                 "completion together)",
                                 n_prompt, (long long)lim.n_ctx_per_slot),
                       "context_length_exceeded");
    }
}

std::vector<Prompt> read_prompts(const json &value, const char *key, const Tokenizer &tok, const RequestLimits &lim) {
    std::vector<Prompt> out;
    if (value.is_array() && value.size() > 1 && (value[0].is_string() || value[0].is_array())) {
        for (const json &p : value) {
            if (!p.is_string() && !(p.is_array() && !p.empty() && p[0].is_number())) {
                throw ApiError(400, strprintf("'%s' must hold strings or arrays of token ids", key), "invalid_type");
            }
            out.push_back({read_prompt(p, key, tok, lim), &p});
        }
    } else {
        out.push_back({read_prompt(value, key, tok, lim), &prompt_source(value)});
    }
    return out;
}

const json &prompt_source(const json &value) {
    return value.is_array() && value.size() == 1 && (value[0].is_string() || value[0].is_array()) ? value[0] : value;
}

std::vector<int32_t> read_prompt(const json &given, const char *key, const Tokenizer &tok, const RequestLimits &lim) {
    // One level of one-element list is unwrapped, no more: a deeper nest is a type error, not a recursion.
    const json &value = prompt_source(given);
    std::vector<int32_t> ids;
    if (value.is_string()) {
        ids = tok.encode(value.get<std::string>(), /*add_special=*/true, /*parse_special=*/true);
    } else if (value.is_array() && !value.empty() && value[0].is_number()) {
        ids = read_ids(value, key, lim);
    } else if (value.is_array() && value.size() > 1) {
        throw ApiError(400, strprintf("'%s': only one prompt per request is supported here", key), "invalid_value");
    } else if (value.is_array() && value.empty()) {
        throw ApiError(400, strprintf("'%s' is empty", key), "invalid_value");
    } else {
        throw ApiError(400, strprintf("'%s' must be a string or an array of token ids", key), "invalid_type");
    }
    check_prompt_fits(ids.size(), lim);
    return ids;
}

namespace {
// A logit_bias value: a number in [-100, 100] (OpenAI's range), or false: the token is never sampled (llama.cpp's).
float read_bias(const json &v, const std::string &where) {
    if (v.is_boolean() && !v.get<bool>()) return -std::numeric_limits<float>::infinity();
    if (!v.is_number()) {
        throw ApiError(400, strprintf("'%s' must be a number in [-100, 100] or false", where.c_str()), "invalid_type");
    }
    const double b = v.get<double>();
    if (!std::isfinite(b) || b < -100.0 || b > 100.0) {
        throw ApiError(400, strprintf("'%s' must be in [-100, 100]", where.c_str()), "invalid_value");
    }
    return static_cast<float>(b);
}

int32_t read_bias_token_id(int64_t id, const std::string &where, const RequestLimits &lim) {
    if (id < 0 || id >= lim.n_vocab) {
        throw ApiError(400,
                       strprintf("'%s' names token id %lld, outside the vocabulary [0, %d)", where.c_str(),
                                 (long long)id, lim.n_vocab),
                       "invalid_value");
    }
    return static_cast<int32_t>(id);
}
}  // namespace

std::vector<std::pair<int32_t, float>> read_logit_bias(const json &body, const Tokenizer &tok,
                                                       const RequestLimits &lim) {
    std::vector<std::pair<int32_t, float>> out;
    const auto it = body.find("logit_bias");
    if (it == body.end() || it->is_null()) return out;
    if (it->is_object()) {  // OpenAI's {"token id": bias}
        for (const auto &[key, value] : it->get_ref<const json::object_t &>()) {
            const std::string where = "logit_bias." + key;
            int64_t id = -1;
            const char *const end = key.data() + key.size();
            const auto [rest, ec] = std::from_chars(key.data(), end, id);
            if (key.empty() || ec != std::errc() || rest != end) {
                throw ApiError(400, strprintf("'logit_bias' keys must be token ids, got \"%s\"", key.c_str()),
                               "invalid_value");
            }
            out.emplace_back(read_bias_token_id(id, where, lim), read_bias(value, where));
        }
        return out;
    }
    if (!it->is_array()) {
        throw ApiError(400, "'logit_bias' must be an object of token ids to biases or a list of [token, bias] pairs",
                       "invalid_type");
    }
    size_t i = 0;
    for (const json &entry : it->get_ref<const json::array_t &>()) {  // llama.cpp's [[token id or text, bias], ...]
        const std::string where = strprintf("logit_bias[%zu]", i++);
        if (!entry.is_array() || entry.size() != 2) {
            throw ApiError(400, "'" + where + "' must be a [token id or text, bias] pair", "invalid_type");
        }
        const json::array_t &pair = entry.get_ref<const json::array_t &>();
        const json &token = pair[0];
        const float bias = read_bias(pair[1], where);
        if (token.is_string()) {  // every token of the text (no BOS) gets the bias
            for (const int32_t id : tok.encode(token.get<std::string>(), /*add_special=*/false,
                                               /*parse_special=*/false))
                out.emplace_back(id, bias);
        } else if (token.is_number_integer()) {
            const int64_t id =
                token.is_number_unsigned() && token.get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : token.get<int64_t>();
            out.emplace_back(read_bias_token_id(id, where, lim), bias);
        } else {
            throw ApiError(400, "'" + where + "' must be a [token id or text, bias] pair", "invalid_type");
        }
    }
    return out;
}

namespace {

// llama.cpp's DRY fields: dry_multiplier (0: off), dry_base, dry_allowed_length, dry_penalty_last_n (-1: the whole
// sequence) and dry_sequence_breakers (an array of strings; [] for none), within the stop strings' limits.
void read_dry(const json &body, const Tokenizer &tok, const RequestLimits &lim, LogitAdjustments &a) {
    a.dry_multiplier = static_cast<float>(get_number(body, "dry_multiplier", 0.0, 100.0).value_or(0.0));
    a.dry_base = static_cast<float>(get_number(body, "dry_base", 1.0, 100.0).value_or(1.75));
    a.dry_allowed_length = get_int(body, "dry_allowed_length", 1, lim.n_ctx_per_slot).value_or(2);
    a.dry_penalty_last_n = get_int(body, "dry_penalty_last_n", -1, lim.n_ctx_per_slot).value_or(-1);
    std::vector<std::string> breakers = default_dry_breakers();
    if (const auto it = body.find("dry_sequence_breakers"); it != body.end() && !it->is_null()) {
        if (!it->is_array()) throw ApiError(400, "'dry_sequence_breakers' must be an array of strings", "invalid_type");
        breakers.clear();
        for (const json &v : *it) {
            if (!v.is_string())
                throw ApiError(400, "'dry_sequence_breakers' must be an array of strings", "invalid_type");
            breakers.push_back(v.get<std::string>());
            if (breakers.back().empty() || breakers.back().size() > lim.max_stop_bytes) {
                throw ApiError(
                    400, strprintf("'dry_sequence_breakers' strings must hold 1 to %zu bytes", lim.max_stop_bytes),
                    "invalid_value");
            }
        }
        if (breakers.size() > lim.max_stop_strings) {
            throw ApiError(400,
                           strprintf("'dry_sequence_breakers' holds %zu strings; at most %zu are allowed",
                                     breakers.size(), lim.max_stop_strings),
                           "invalid_value");
        }
    }
    // Only a request that uses DRY pays for the pass over the vocabulary.
    if (a.dry_multiplier > 0.0f && a.dry_penalty_last_n != 0) a.dry_breakers = dry_breaker_tokens(tok, breakers);
}

}  // namespace

SamplingOptions read_sampling(const json &body, const SamplingDefaults &defaults,
                              std::initializer_list<const char *> max_tokens_keys, int64_t n_prompt,
                              const Tokenizer &tok, const RequestLimits &lim) {
    SamplingOptions s;
    s.adjust.logit_bias = read_logit_bias(body, tok, lim);
    s.params.temp = static_cast<float>(get_number(body, "temperature", 0.0, 100.0).value_or(defaults.temperature));
    s.params.top_p = static_cast<float>(get_number(body, "top_p", 0.0, 1.0).value_or(defaults.top_p));
    s.params.top_k = static_cast<int>(get_int(body, "top_k", 0, lim.n_vocab).value_or(defaults.top_k));
    s.params.min_p = static_cast<float>(get_number(body, "min_p", 0.0, 1.0).value_or(defaults.min_p));
    s.params.typical_p = static_cast<float>(get_number(body, "typical_p", 0.0, 1.0).value_or(1.0));
    s.params.xtc_probability = static_cast<float>(get_number(body, "xtc_probability", 0.0, 1.0).value_or(0.0));
    s.params.xtc_threshold = static_cast<float>(get_number(body, "xtc_threshold", 0.0, 1.0).value_or(0.1));
    s.params.top_n_sigma = static_cast<float>(get_number(body, "top_n_sigma", -1.0, 100.0).value_or(-1.0));
    s.params.dynatemp_range = static_cast<float>(get_number(body, "dynatemp_range", 0.0, 100.0).value_or(0.0));
    s.params.dynatemp_exponent = static_cast<float>(get_number(body, "dynatemp_exponent", 0.0, 100.0).value_or(1.0));
    s.adjust.repeat_penalty = static_cast<float>(get_number(body, "repeat_penalty", 0.001, 100.0).value_or(1.0));
    s.adjust.repeat_last_n = get_int(body, "repeat_last_n", -1, lim.n_ctx_per_slot).value_or(64);
    s.adjust.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
    // OpenAI's response_format: text, JSON mode (a JSON object) or a JSON schema the reply must satisfy
    // ({"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}; llama.cpp also takes the schema as
    // json_object's "schema" and as a top-level "json_schema"). A schema outside the supported subset is refused,
    // as a grammar is, since ignoring it would hand back text that breaks it.
    const auto use_schema = [&s](const nlohmann::json &schema, const char *where) {
        try {
            s.json_schema = std::make_shared<const JsonSchema>(JsonSchema::compile(schema));
        } catch (const std::exception &e) {
            throw ApiError(400, std::string("'") + where + "': " + e.what(), "invalid_value");
        }
        s.json_object = true;
    };
    if (const auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
        if (!rf->is_object()) throw ApiError(400, "'response_format' must be an object", "invalid_type");
        const std::string type = get_string(*rf, "type", "response_format").value_or("text");
        if (type == "json_object") {
            s.json_object = true;
            if (const auto sc = rf->find("schema"); sc != rf->end() && !sc->is_null())
                use_schema(*sc, "response_format");
        } else if (type == "json_schema") {
            const auto js = rf->find("json_schema");
            if (js == rf->end() || !js->is_object())
                throw ApiError(400, "'response_format': json_schema must be an object with the schema under \"schema\"",
                               "invalid_type");
            if (const auto sc = js->find("schema"); sc != js->end() && !sc->is_null()) {
                use_schema(*sc, "response_format");
            } else {
                s.json_object = true;  // no schema given: any JSON object
            }
        } else if (type != "text") {
            throw ApiError(400, "'response_format': type must be text, json_object or json_schema", "invalid_value");
        }
    }
    // llama.cpp's GBNF `grammar` (runtime/grammar.h): one constraint per request, so not beside a JSON one.
    if (const auto g = get_string(body, "grammar"); g && !g->empty()) {
        if (s.json_object)
            throw ApiError(400, "'grammar' cannot be combined with a JSON response_format", "invalid_value");
        try {
            const TokenLookup lookup{[&tok](std::string_view text) { return tok.find_token(text); }, tok.n_vocab()};
            s.grammar = std::make_shared<const Grammar>(Grammar::parse(*g, &lookup));
        } catch (const std::exception &e) {
            throw ApiError(400, std::string("'grammar': ") + e.what(), "invalid_value");
        }
    }
    if (const auto js = body.find("json_schema"); js != body.end() && !js->is_null()) {
        if (s.json_schema) throw ApiError(400, "'json_schema' given twice (with response_format too)", "invalid_value");
        if (s.grammar) throw ApiError(400, "'json_schema' cannot be combined with 'grammar'", "invalid_value");
        use_schema(*js, "json_schema");
    }
    s.params.mirostat = static_cast<int>(get_int(body, "mirostat", 0, 2).value_or(0));
    s.params.mirostat_tau = static_cast<float>(get_number(body, "mirostat_tau", 0.0, 100.0).value_or(5.0));
    s.params.mirostat_eta = static_cast<float>(get_number(body, "mirostat_eta", 0.0, 10.0).value_or(0.1));
    read_dry(body, tok, lim, s.adjust);
    s.adjust.presence_penalty = static_cast<float>(get_number(body, "presence_penalty", -2.0, 2.0).value_or(0.0));
    s.adjust.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty", -2.0, 2.0).value_or(0.0));
    const std::optional<int64_t> seed = get_int(body, "seed", INT64_MIN, INT64_MAX);
    s.params.seed = seed ? static_cast<uint64_t>(*seed) : std::random_device{}();

    const int64_t room = lim.n_ctx_per_slot - n_prompt;
    std::optional<int64_t> max_tokens;
    for (const char *key : max_tokens_keys) {
        // llama.cpp's n_predict = -1 means "until the context is full".
        const bool llama_style = std::string_view(key) == "n_predict";
        max_tokens = get_int(body, key, llama_style ? -1 : defaults.min_max_tokens, INT64_MAX);
        if (max_tokens && *max_tokens == 0 && defaults.min_max_tokens > 0) {
            throw ApiError(400, strprintf("'%s' must be at least 1", key), "invalid_value");
        }
        if (max_tokens && *max_tokens == -1) max_tokens = room;
        if (max_tokens && lim.context_shift) {
            if (*max_tokens > kMaxShiftedTokens) {
                throw ApiError(400,
                               strprintf("'%s' is %lld; with context shifts a request may generate at most %lld tokens",
                                         key, (long long)*max_tokens, (long long)kMaxShiftedTokens),
                               "invalid_value");
            }
            break;
        }
        if (max_tokens) {
            if (*max_tokens > lim.n_ctx_per_slot) {
                throw ApiError(400,
                               strprintf("'%s' is %lld; a request's context holds %lld tokens", key,
                                         (long long)*max_tokens, (long long)lim.n_ctx_per_slot),
                               "invalid_value");
            }
            if (*max_tokens > room) {
                throw ApiError(
                    400,
                    strprintf("the prompt (%lld tokens) plus '%s' (%lld) exceeds a request's context "
                              "of %lld tokens",
                              (long long)n_prompt, key, (long long)*max_tokens, (long long)lim.n_ctx_per_slot),
                    "context_length_exceeded");
            }
            break;
        }
    }
    s.max_tokens = max_tokens.value_or(std::min(room, defaults.max_tokens.value_or(room)));

    const auto stop_it = body.find("stop");
    if (stop_it != body.end() && !stop_it->is_null()) {
        const json &stop = *stop_it;
        if (stop.is_string()) {
            s.stop.push_back(stop.get<std::string>());
        } else if (stop.is_array()) {
            for (const json &v : stop) {
                if (!v.is_string())
                    throw ApiError(400, "'stop' must be a string or an array of strings", "invalid_type");
                s.stop.push_back(v.get<std::string>());
            }
        } else {
            throw ApiError(400, "'stop' must be a string or an array of strings", "invalid_type");
        }
        if (s.stop.size() > lim.max_stop_strings) {
            throw ApiError(
                400,
                strprintf("'stop' holds %zu strings; at most %zu are allowed", s.stop.size(), lim.max_stop_strings),
                "invalid_value");
        }
        for (const std::string &str : s.stop) {
            if (str.empty() || str.size() > lim.max_stop_bytes) {
                throw ApiError(400, strprintf("'stop' strings must hold 1 to %zu bytes", lim.max_stop_bytes),
                               "invalid_value");
            }
        }
    }
    return s;
}

namespace {

// A message's text: a string or an array of text parts (joined).
std::string read_content(const json &content, const std::string &where) {
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) {
        throw ApiError(400, "'" + where + "' must be a string or an array of text parts", "invalid_type");
    }
    std::string text;
    for (size_t k = 0; k < content.size(); ++k) {
        const json &part = content[k];
        const std::string part_where = strprintf("%s[%zu]", where.c_str(), k);
        if (!part.is_object() || get_string(part, "type", part_where).value_or("") != "text" ||
            !get_string(part, "text", part_where)) {
            throw ApiError(
                400, "'" + part_where + "' is not a text part: only {\"type\": \"text\", \"text\": ...} is supported",
                "invalid_value");
        }
        text += part["text"].get<std::string>();
    }
    return text;
}

// OpenAI's function names: letters, digits, '_', '-' (and '.'), at most 64. The formats write names between
// quotes and tags, so nothing else may pass.
bool valid_function_name(const std::string &name) {
    if (name.empty() || name.size() > 64) return false;
    return std::all_of(name.begin(), name.end(),
                       [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-' || c == '.'; });
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}], arguments a
// JSON object or its text (OpenAI sends text; parsed in order, as the formats write the arguments in that order).
std::vector<sparrow::server::ToolCall> read_tool_calls(const json &calls, const std::string &where) {
    if (!calls.is_array()) throw ApiError(400, "'" + where + "' must be an array", "invalid_type");
    std::vector<sparrow::server::ToolCall> out;
    for (size_t k = 0; k < calls.size(); ++k) {
        const std::string call_where = strprintf("%s[%zu]", where.c_str(), k);
        const json &call = calls[k];
        if (!call.is_object()) throw ApiError(400, "'" + call_where + "' must be an object", "invalid_type");
        if (get_string(call, "type", call_where).value_or("function") != "function") {
            throw ApiError(400, "'" + field_path(call_where, "type") + "' must be \"function\"", "invalid_value");
        }
        const auto fn = call.find("function");
        const std::string fn_where = field_path(call_where, "function");
        if (fn == call.end() || !fn->is_object()) {
            throw ApiError(400, "'" + fn_where + "' must be an object with a name and arguments", "invalid_type");
        }
        sparrow::server::ToolCall tc;
        tc.id = get_string(call, "id", call_where).value_or("");
        tc.name = get_string(*fn, "name", fn_where).value_or("");
        if (!valid_function_name(tc.name)) {
            throw ApiError(400, "'" + field_path(fn_where, "name") + "' must be 1-64 letters, digits, '_', '-' or '.'",
                           "invalid_value");
        }
        const auto args = fn->find("arguments");
        const std::string args_where = field_path(fn_where, "arguments");
        if (args == fn->end() || args->is_null()) {
            tc.arguments = nlohmann::ordered_json::object();
        } else if (args->is_string()) {
            const std::string &text = args->get_ref<const std::string &>();
            tc.arguments = text.empty() ? nlohmann::ordered_json::object()
                                        : nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
        } else {
            tc.arguments = nlohmann::ordered_json(*args);
        }
        if (!tc.arguments.is_object()) {
            throw ApiError(400, "'" + args_where + "' must be a JSON object (or its text)", "invalid_value");
        }
        out.push_back(std::move(tc));
    }
    return out;
}

}  // namespace

std::vector<ChatMessage> read_messages(const json &body) {
    const auto it = body.find("messages");
    if (it == body.end() || it->is_null()) throw ApiError(400, "'messages' is required", "missing_field");
    if (!it->is_array()) throw ApiError(400, "'messages' must be an array", "invalid_type");
    if (it->empty()) throw ApiError(400, "'messages' is empty", "invalid_value");
    std::vector<ChatMessage> out;
    for (size_t i = 0; i < it->size(); ++i) {
        const json &m = (*it)[i];
        const std::string where = strprintf("messages[%zu]", i);  // the message's path in errors
        if (!m.is_object()) throw ApiError(400, "'" + where + "' must be an object", "invalid_type");
        ChatMessage msg;
        const std::optional<std::string> role = get_string(m, "role", where);
        if (!role) throw ApiError(400, "'" + field_path(where, "role") + "' is required", "missing_field");
        if (*role != "system" && *role != "developer" && *role != "user" && *role != "assistant" && *role != "tool") {
            throw ApiError(400,
                           "'" + field_path(where, "role") + "' is '" + *role +
                               "', which is not supported (system, developer, user, assistant, tool)",
                           "invalid_value");
        }
        msg.role = *role;
        const auto content = m.find("content");
        if (content == m.end() || content->is_null()) {
            if (*role != "assistant") {
                throw ApiError(400, "'" + field_path(where, "content") + "' is required in a " + *role + " message",
                               "missing_field");
            }
        } else {
            msg.content = read_content(*content, field_path(where, "content"));
        }
        msg.reasoning_content = get_string(m, "reasoning_content", where);
        if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
            // An empty list is what several clients write back for "no tool calls".
            msg.tool_calls = read_tool_calls(*calls, field_path(where, "tool_calls"));
            if (!msg.tool_calls.empty() && *role != "assistant") {
                throw ApiError(400, "'" + field_path(where, "tool_calls") + "' belongs in an assistant message",
                               "invalid_value");
            }
        }
        out.push_back(std::move(msg));
    }
    return out;
}

ToolRequest read_tool_request(const json &body, const std::string &raw_body) {
    ToolRequest out;
    if (const auto p = get_bool(body, "parallel_tool_calls")) out.parallel = *p;
    const auto tools = body.find("tools");
    const bool offered = tools != body.end() && !tools->is_null() && !(tools->is_array() && tools->empty());
    if (offered) {
        if (!tools->is_array()) throw ApiError(400, "'tools' must be an array", "invalid_type");
        // The tools again in the client's key order (json sorts keys; the formats write them as sent). Each is
        // checked as it will be used, in that order.
        const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(raw_body).at("tools");
        for (size_t k = 0; k < ordered.size(); ++k) {
            const std::string where = strprintf("tools[%zu]", k);
            const json tool(ordered[k]);
            if (!tool.is_object() || get_string(tool, "type", where).value_or("") != "function") {
                throw ApiError(400, "'" + where + "' must be {\"type\": \"function\", \"function\": {...}}",
                               "invalid_value");
            }
            const auto fn = tool.find("function");
            if (fn == tool.end() || !fn->is_object()) {
                throw ApiError(400, "'" + field_path(where, "function") + "' must be an object", "invalid_type");
            }
            const std::string fn_where = field_path(where, "function");
            const std::string name = get_string(*fn, "name", fn_where).value_or("");
            if (!valid_function_name(name)) {
                throw ApiError(400,
                               "'" + field_path(fn_where, "name") + "' must be 1-64 letters, digits, '_', '-' or '.'",
                               "invalid_value");
            }
            (void)get_string(*fn, "description", fn_where);
            if (const auto params = fn->find("parameters"); params != fn->end() && !params->is_object()) {
                throw ApiError(400, "'" + field_path(fn_where, "parameters") + "' must be a JSON schema object",
                               "invalid_type");
            }
            for (const nlohmann::ordered_json &other : out.tools) {
                if (other["function"]["name"] == name) {
                    throw ApiError(400, "'" + where + "': a second tool named '" + name + "'", "invalid_value");
                }
            }
            out.tools.push_back(ordered[k]);
        }
    }
    const auto choice = body.find("tool_choice");
    if (choice == body.end() || choice->is_null()) {
        // auto, the default
    } else if (choice->is_string()) {
        const std::string c = choice->get<std::string>();
        if (c == "none") {
            out.choice = ToolRequest::Choice::none;
        } else if (c == "auto") {
            out.choice = ToolRequest::Choice::automatic;
        } else if (c == "required") {
            out.choice = ToolRequest::Choice::required;
        } else {
            throw ApiError(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or a function",
                           "invalid_value");
        }
    } else if (choice->is_object()) {
        const auto fn = choice->find("function");
        const std::optional<std::string> name =
            fn != choice->end() && fn->is_object() ? get_string(*fn, "name", "tool_choice.function") : std::nullopt;
        if (get_string(*choice, "type", "tool_choice").value_or("") != "function" || !name) {
            throw ApiError(400, "'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                           "invalid_value");
        }
        out.choice = ToolRequest::Choice::required;
        out.only = *name;
        const bool known = std::any_of(out.tools.begin(), out.tools.end(),
                                       [&](const nlohmann::ordered_json &t) { return t["function"]["name"] == *name; });
        if (!known)
            throw ApiError(400, "'tool_choice' names '" + *name + "', which is not in 'tools'", "invalid_value");
    } else {
        throw ApiError(400, "'tool_choice' must be a string or an object", "invalid_type");
    }
    if (out.choice == ToolRequest::Choice::required && out.tools.empty()) {
        throw ApiError(400, "'tool_choice' asks for a tool call, but 'tools' offers none", "invalid_value");
    }
    if (out.choice == ToolRequest::Choice::none) out.tools.clear();  // nothing to call: nothing offered
    return out;
}

}  // namespace sparrow::tools::http
