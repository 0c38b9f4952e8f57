// The generation endpoints: OpenAI /v1/completions and /v1/chat/completions, llama.cpp's /completion, as one
// reply or as server-sent events.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "model/model.h"
#include "runtime/grammar.h"
#include "runtime/tokenizer.h"
#include "server/api.h"
#include "server/reasoning_split.h"
#include "server/tool_calls.h"

namespace sparrow::tools::http {

namespace {
using sparrow::server::FinishReason;
using sparrow::server::TaskChannel;
using sparrow::server::TaskUpdate;
using sparrow::server::TokenLogprob;
using sparrow::server::ToolCallParser;
using sparrow::server::ToolReplyParts;
using Clock = std::chrono::steady_clock;

// How long a stream waits for news before looking again, and how long it stays silent before it sends an
// SSE comment (which is how a client that went away while its request waited is noticed).
constexpr std::chrono::milliseconds kStreamPoll{250};
constexpr std::chrono::seconds kKeepAlive{5};
// Non-streamed replies: how long a plain reply is waited for, and how often a long one probes the client.
constexpr std::chrono::seconds kDirectReplyWait{2};
constexpr std::chrono::milliseconds kProbeInterval{500};

// llama.cpp's /completion timings: the prompt's evaluation (to the first token) and the generation after it.
json timings_json(const TaskUpdate &u) {
    const int64_t evaluated = u.n_prompt - u.n_cached;
    const double prompt_ms = 1e3 * u.prompt_seconds, predicted_ms = 1e3 * u.generation_seconds;
    return {{"prompt_n", evaluated},
            {"prompt_ms", prompt_ms},
            {"prompt_per_token_ms", evaluated > 0 ? prompt_ms / double(evaluated) : 0.0},
            {"prompt_per_second", prompt_ms > 0 ? 1e3 * double(evaluated) / prompt_ms : 0.0},
            {"predicted_n", u.n_generated},
            {"predicted_ms", predicted_ms},
            {"predicted_per_token_ms", u.n_generated > 0 ? predicted_ms / double(u.n_generated) : 0.0},
            {"predicted_per_second", predicted_ms > 0 ? 1e3 * double(u.n_generated) / predicted_ms : 0.0}};
}

json usage_json(const TaskUpdate &u) {
    return {{"prompt_tokens", u.n_prompt},
            {"completion_tokens", u.n_generated},
            {"total_tokens", u.n_prompt + u.n_generated},
            {"prompt_tokens_details", {{"cached_tokens", u.n_cached}}}};
}

// A task that ended without a result: the client's reply status and message.
int failure_status(const TaskUpdate &u) {
    if (u.request_error) return 400;
    return u.error.find("shutting down") != std::string::npos ? 503 : 500;
}
// The error code of a failed task's reply.
const char *failure_code(int status) { return status < 500 ? "invalid_request" : "server_error"; }

std::string sse(const json &j) { return "data: " + dump_json(j) + "\n\n"; }

// Refuses request fields this server cannot honour (rather than silently ignoring them).
void refuse_if_set(const json &body, const char *key, const char *why) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) return;
    if ((it->is_boolean() && !it->get<bool>()) || (it->is_number() && it->get<double>() == 0)) return;
    if (it->is_array() && it->empty()) return;
    throw ApiError(400, std::string("'") + key + "' is not supported: " + why, "unsupported_parameter");
}

// The most alternatives a request may ask for per token (OpenAI's top_logprobs limit).
constexpr int64_t kMaxTopLogprobs = 20;

// A token's bytes as OpenAI's "bytes" field: the values of its UTF-8 bytes (a token may hold part of a character).
json token_bytes(const std::string &piece) {
    json out = json::array();
    for (const unsigned char c : piece) out.push_back(int(c));
    return out;
}

// The "logprobs" of a completion choice: {"tokens", "token_logprobs", "top_logprobs" (one {token: logprob}
// object per token), "text_offset" (bytes)}. `first`: an echoed prompt's first token, which has no log
// probability (null); `offset`: where the entries' text starts in the reply's text (advanced past it).
json completion_logprobs(const Tokenizer &tok, std::optional<int32_t> first, const std::vector<TokenLogprob> &lps,
                         size_t &offset) {
    json tokens = json::array(), logprobs = json::array(), top = json::array(), offsets = json::array();
    const auto add = [&](int32_t id, json logprob, json alternatives) {
        const std::string piece = tok.token_to_piece(id);
        tokens.push_back(piece);
        logprobs.push_back(std::move(logprob));
        top.push_back(std::move(alternatives));
        offsets.push_back(offset);
        offset += piece.size();
    };
    if (first) add(*first, nullptr, nullptr);
    for (const TokenLogprob &lp : lps) {
        json alternatives = json::object();
        for (const auto &[id, value] : lp.top) alternatives[tok.token_to_piece(id)] = value;
        add(lp.id, lp.logprob, std::move(alternatives));
    }
    return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

// The "logprobs" of a chat choice: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal"}.
json chat_logprobs(const Tokenizer &tok, const std::vector<TokenLogprob> &lps) {
    json content = json::array();
    for (const TokenLogprob &lp : lps) {
        const std::string piece = tok.token_to_piece(lp.id);
        json top = json::array();
        for (const auto &[id, value] : lp.top) {
            const std::string alt = tok.token_to_piece(id);
            top.push_back({{"token", alt}, {"logprob", value}, {"bytes", token_bytes(alt)}});
        }
        content.push_back(
            {{"token", piece}, {"logprob", lp.logprob}, {"bytes", token_bytes(piece)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
}

// llama.cpp's /completion "completion_probabilities" (with n_probs): [{"id", "token", "bytes", "logprob",
// "top_logprobs": [{"id", "token", "bytes", "logprob"}]}].
json llama_probabilities(const Tokenizer &tok, const std::vector<TokenLogprob> &lps) {
    const auto entry = [&](int32_t id, float logprob) {
        const std::string piece = tok.token_to_piece(id);
        return json{{"id", id}, {"token", piece}, {"bytes", token_bytes(piece)}, {"logprob", logprob}};
    };
    json out = json::array();
    for (const TokenLogprob &lp : lps) {
        json e = entry(lp.id, lp.logprob);
        e["top_logprobs"] = json::array();
        for (const auto &[id, value] : lp.top) e["top_logprobs"].push_back(entry(id, value));
        out.push_back(std::move(e));
    }
    return out;
}

// stream_options.include_usage (an object or null).
bool read_include_usage(const json &body) {
    const auto so = body.find("stream_options");
    if (so == body.end() || so->is_null()) return false;
    if (!so->is_object()) throw ApiError(400, "'stream_options' must be an object", "invalid_type");
    return get_bool(*so, "include_usage", "stream_options").value_or(false);
}

// What a reply, streamed or not, knows of its request (set once, in generate()): one task per choice (`n`).
struct ReplyInfo {
    std::vector<std::shared_ptr<TaskChannel>> channels;
    const Tokenizer *tokenizer = nullptr;
    Dialect dialect = Dialect::completion;
    std::string id;
    std::string model;
    int64_t created = 0;
    bool logprobs = false;  // the request asked for log probabilities
    // Per choice: completions' echo, the prompt text it starts with; and its prompt's first token (echo with
    // logprobs: no log probability).
    std::vector<std::optional<std::string>> echo;
    std::vector<int32_t> first_prompt_token;
    size_t per_prompt = 1;         // choices of each prompt (choice k reads prompt k / per_prompt)
    bool split_reasoning = false;  // chat: the reply's reasoning goes to reasoning_content (ReasoningSplitter)
    ReplyTools tools;              // chat: the tools on offer, whose calls are read out of the reply

    void cancel_all() const {
        for (const auto &c : channels) c->cancel();
    }
};

// A new call id: "call_" and 24 random letters and digits (clients match tool results to calls by it).
std::string new_call_id() {
    constexpr std::string_view kChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::random_device rd;
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kChars[rd() % kChars.size()];
    return id;
}

// An OpenAI tool call object (with its "index" when streamed).
json tool_call_json(const sparrow::server::ParsedToolCall &call, std::optional<size_t> index) {
    json out = {{"id", new_call_id()},
                {"type", "function"},
                {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
    if (index) out["index"] = *index;
    return out;
}

// The finish reason of a chat choice that made `n_calls` calls: "tool_calls" when it ended by itself after them.
const char *chat_finish_reason(FinishReason finish, size_t n_calls) {
    return n_calls > 0 && finish == FinishReason::stop ? "tool_calls" : sparrow::server::finish_reason_name(finish);
}

// A request's usage from its choices' last updates: each prompt once (its per_prompt choices share it), the
// completion tokens of them all.
json usage_of(const std::vector<const TaskUpdate *> &last, size_t per_prompt) {
    TaskUpdate u;
    for (size_t k = 0; k < last.size(); ++k) {
        if (k % per_prompt == 0) {
            u.n_prompt += last[k]->n_prompt;
            u.n_cached += last[k]->n_cached;
        }
        u.n_generated += last[k]->n_generated;
    }
    return usage_json(u);
}

bool failed(const TaskUpdate &u) {
    return u.done && (u.finish == FinishReason::error || u.finish == FinishReason::cancelled);
}

// Waits for news of the choices not done yet (choices[k].last.done tells): up to `timeout` for the first of them,
// then a look at the others (their tokens come from the same scheduler steps). take(k, update) receives each.
template <typename Choice, typename Take>
void wait_choices(const ReplyInfo &info, const std::vector<Choice> &choices, std::chrono::milliseconds timeout,
                  const Take &take) {
    bool waited = false;
    for (size_t k = 0; k < info.channels.size(); ++k) {
        if (choices[k].last.done) continue;
        take(k, info.channels[k]->wait(waited ? std::chrono::milliseconds(0) : timeout));
        waited = true;
    }
}

// One choice of a streamed reply.
struct StreamChoice {
    sparrow::server::ReasoningSplitter reasoning;  // split_reasoning: where the text goes
    std::optional<ToolCallParser> tool_parser;     // tools on offer: the content's calls
    size_t n_calls = 0;                            // calls sent
    size_t text_offset = 0;                        // completions: bytes of text sent so far (logprobs' text_offset)
    bool sent_role = false;
    bool echo_sent = false;
    TaskUpdate last;  // the latest update (counters, done)
};

// What one streamed request needs between calls of httplib's content provider.
struct StreamState : ReplyInfo {
    std::vector<StreamChoice> choices;
    bool include_usage = false;
    bool finished = false;
    Clock::time_point last_write = Clock::now();
};

// A streamed chat delta's content and calls from `parts` (calls past the first dropped when parallel calls are off).
void add_tool_parts(const StreamState &st, StreamChoice &c, ToolReplyParts parts, json &delta) {
    if (!parts.content.empty()) delta["content"] = delta.value("content", "") + parts.content;
    for (const sparrow::server::ParsedToolCall &call : parts.calls) {
        if (!st.tools.parallel && c.n_calls > 0) break;
        if (!delta.contains("tool_calls")) delta["tool_calls"] = json::array();
        delta["tool_calls"].push_back(tool_call_json(call, c.n_calls++));
    }
}

// Text of a chat choice's content into its delta: through the choice's call parser when tools are on offer.
void add_content(const StreamState &st, StreamChoice &c, const std::string &text, json &delta) {
    if (st.tools.format && !c.tool_parser) c.tool_parser.emplace(*st.tools.format, st.tools.tools);
    if (c.tool_parser) {
        add_tool_parts(st, c, c.tool_parser->push(text), delta);
    } else if (!text.empty()) {
        delta["content"] = text;
    }
}

// The SSE events of update u of choice k (its tokens, and its end: the last choice to end also carries the
// request's usage). A choice that failed ends the stream with an error event.
std::string choice_events(StreamState &st, size_t k, const TaskUpdate &u) {
    const Dialect d = st.dialect;
    StreamChoice &c = st.choices[k];
    // An OpenAI chunk around one choice.
    const auto chunk = [&](json choice_fields, const char *finish) {
        json choice = {{"index", k}, {"logprobs", nullptr}, {"finish_reason", finish ? json(finish) : json()}};
        if (choice_fields.is_object()) choice.update(choice_fields);
        json event = {{"id", st.id},
                      {"object", d == Dialect::chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", st.created},
                      {"model", st.model},
                      {"choices", json::array({choice})}};
        if (st.include_usage) event["usage"] = nullptr;
        return event;
    };
    std::string out;
    if (d == Dialect::chat && !c.sent_role) {
        out += sse(chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}}, nullptr));
        c.sent_role = true;
    }
    // The echoed prompt goes first (and once), with its tokens' log probabilities when asked for (they come
    // when the prompt has been evaluated).
    const std::optional<std::string> &echo = k < st.echo.size() ? st.echo[k] : std::nullopt;
    if (echo && !c.echo_sent && (!st.logprobs || u.prompt_logprobs || u.done)) {
        json fields = {{"text", *echo}};
        if (st.logprobs) {
            fields["logprobs"] =
                completion_logprobs(*st.tokenizer, st.first_prompt_token[k],
                                    u.prompt_logprobs.value_or(std::vector<TokenLogprob>{}), c.text_offset);
        }
        out += sse(chunk(fields, nullptr));
        c.echo_sent = true;
    }
    if (!u.text.empty() || (st.logprobs && !u.logprobs.empty())) {
        if (d == Dialect::llama) {
            json event = {{"content", u.text}, {"stop", false}, {"tokens_predicted", u.n_generated}};
            if (st.logprobs) event["completion_probabilities"] = llama_probabilities(*st.tokenizer, u.logprobs);
            out += sse(event);
        } else if (d == Dialect::chat) {
            json delta = json::object();
            if (st.split_reasoning) {
                const sparrow::server::ReasoningParts parts = c.reasoning.push(u.text);
                if (!parts.reasoning.empty()) delta["reasoning_content"] = parts.reasoning;
                add_content(st, c, parts.content, delta);
            } else {
                add_content(st, c, u.text, delta);
            }
            if (!delta.empty() || st.logprobs) {
                json fields = {{"delta", std::move(delta)}};
                if (st.logprobs) fields["logprobs"] = chat_logprobs(*st.tokenizer, u.logprobs);
                out += sse(chunk(fields, nullptr));
            }
        } else {
            json fields = {{"text", u.text}};
            if (st.logprobs) {
                fields["logprobs"] = completion_logprobs(*st.tokenizer, std::nullopt, u.logprobs, c.text_offset);
            }
            out += sse(chunk(fields, nullptr));
        }
    }
    if (!u.done) return out;
    if (failed(u)) {
        st.finished = true;
        const int status = failure_status(u);
        return out +
               sse(error_body(status, u.error.empty() ? "the request was cancelled" : u.error, failure_code(status)));
    }
    if (d == Dialect::chat) {
        // What the splitters held back: an unfinished thinking tag is reasoning, an unfinished call is content.
        json delta = json::object();
        if (st.split_reasoning) {
            const sparrow::server::ReasoningParts rest = c.reasoning.finish();
            if (!rest.reasoning.empty()) delta["reasoning_content"] = rest.reasoning;
            add_content(st, c, rest.content, delta);
        }
        if (c.tool_parser) add_tool_parts(st, c, c.tool_parser->finish(), delta);
        if (!delta.empty()) out += sse(chunk({{"delta", std::move(delta)}}, nullptr));
    }
    const char *finish =
        d == Dialect::chat ? chat_finish_reason(u.finish, c.n_calls) : sparrow::server::finish_reason_name(u.finish);
    if (d == Dialect::llama) {
        return out + sse({{"content", ""},
                          {"stop", true},
                          {"model", st.model},
                          {"finish_reason", finish},
                          {"tokens_predicted", u.n_generated},
                          {"tokens_evaluated", u.n_prompt},
                          {"tokens_cached", u.n_cached},
                          {"id_slot", u.id_slot},
                          {"timings", timings_json(u)}});
    }
    json last = chunk(d == Dialect::chat ? json{{"delta", json::object()}} : json{{"text", ""}}, finish);
    std::vector<const TaskUpdate *> ends;
    for (const StreamChoice &other : st.choices) {
        if (other.last.done) ends.push_back(&other.last);
    }
    if (ends.size() == st.choices.size()) {
        // With stream_options.include_usage, OpenAI's shape: usage null on every chunk but one more, with no
        // choices, before [DONE] (a client that adds up usage per chunk, as LangChain does, counts it once).
        // Without it, the last chunk carries the usage, as llama.cpp's server sends it.
        if (!st.include_usage) {
            last["usage"] = usage_of(ends, st.per_prompt);
            return out + sse(last);
        }
        last["usage"] = nullptr;
        out += sse(last);
        json usage = chunk(json::object(), nullptr);
        usage["choices"] = json::array();
        usage["usage"] = usage_of(ends, st.per_prompt);
        return out + sse(usage);
    }
    if (st.include_usage) last["usage"] = nullptr;
    return out + sse(last);
}

// One call of httplib's content provider: waits a little for the choices, writes what they produced as SSE
// events. Returns false when the client is gone.
bool stream_step(StreamState &st, httplib::DataSink &sink) {
    if (st.finished) {
        sink.done();
        return true;
    }
    std::string out;
    wait_choices(st, st.choices, kStreamPoll, [&](size_t k, const TaskUpdate &u) {
        if (st.finished) return;  // a choice failed: the stream ends with its error
        st.choices[k].last = u;
        out += choice_events(st, k, u);
    });
    bool all_done = st.finished;
    if (!all_done) {
        all_done = std::all_of(st.choices.begin(), st.choices.end(), [](const StreamChoice &c) { return c.last.done; });
    }
    if (all_done) {
        st.cancel_all();  // after a failure, the other choices stop too
        if (st.dialect != Dialect::llama) out += "data: [DONE]\n\n";
    }
    const auto now = Clock::now();
    if (out.empty() && now - st.last_write > kKeepAlive) out = ": keep-alive\n\n";
    if (!out.empty()) {
        if (!sink.write(out.data(), out.size())) return false;  // the client is gone: the releaser cancels
        st.last_write = now;
    }
    if (all_done) {
        st.finished = true;
        sink.done();
    }
    return true;
}

// One choice of a non-streamed reply in the making.
struct PendingChoice {
    std::string text;                           // generated so far
    std::vector<TokenLogprob> token_logprobs;   // with logprobs: of the tokens of `text`
    std::vector<TokenLogprob> prompt_logprobs;  // echo with logprobs: prompt tokens 1, 2, ...
    TaskUpdate last;                            // the latest update (counters, done)

    // Adds an update's text and log probabilities.
    void take(const TaskUpdate &u) {
        text += u.text;
        token_logprobs.insert(token_logprobs.end(), u.logprobs.begin(), u.logprobs.end());
        if (u.prompt_logprobs) prompt_logprobs = *u.prompt_logprobs;
        last = u;
    }
};

// A non-streamed reply in the making.
struct PendingReply : ReplyInfo {
    std::vector<PendingChoice> choices;
    Clock::time_point last_write = Clock::now();

    // Done when every choice is, or when one failed.
    bool done() const {
        bool all = true;
        for (const PendingChoice &c : choices) {
            if (failed(c.last)) return true;
            all = all && c.last.done;
        }
        return all;
    }
    // Waits up to `timeout` for news of the choices.
    void wait(std::chrono::milliseconds timeout) {
        wait_choices(*this, choices, timeout, [&](size_t k, const TaskUpdate &u) { choices[k].take(u); });
    }
};

// The whole reply of a finished request: (status, body).
std::pair<int, json> final_reply(const PendingReply &r) {
    for (const PendingChoice &c : r.choices) {
        if (failed(c.last)) {
            const int status = failure_status(c.last);
            return {status, error_body(status, c.last.error.empty() ? "the request was cancelled" : c.last.error,
                                       failure_code(status))};
        }
    }
    if (r.dialect == Dialect::llama) {
        const PendingChoice &c = r.choices.front();
        const TaskUpdate &u = c.last;
        json body = {{"content", c.text},
                     {"model", r.model},
                     {"stop", true},
                     {"finish_reason", sparrow::server::finish_reason_name(u.finish)},
                     {"tokens_predicted", u.n_generated},
                     {"tokens_evaluated", u.n_prompt},
                     {"tokens_cached", u.n_cached},
                     {"id_slot", u.id_slot},
                     {"timings", timings_json(u)}};
        if (r.logprobs) body["completion_probabilities"] = llama_probabilities(*r.tokenizer, c.token_logprobs);
        return {200, body};
    }
    json choices = json::array();
    std::vector<const TaskUpdate *> ends;
    for (size_t k = 0; k < r.choices.size(); ++k) {
        const PendingChoice &c = r.choices[k];
        ends.push_back(&c.last);
        json choice = {
            {"index", k}, {"logprobs", nullptr}, {"finish_reason", sparrow::server::finish_reason_name(c.last.finish)}};
        if (r.dialect == Dialect::chat) {
            std::string content = c.text;
            choice["message"] = {{"role", "assistant"}};
            if (r.split_reasoning) {
                sparrow::server::ReasoningParts parts = sparrow::server::split_reasoning(c.text);
                content = std::move(parts.content);
                choice["message"]["reasoning_content"] = std::move(parts.reasoning);
            }
            choice["message"]["content"] = content;
            if (r.tools.format) {
                ToolReplyParts parts = sparrow::server::parse_tool_calls(*r.tools.format, r.tools.tools, content);
                if (!r.tools.parallel && parts.calls.size() > 1) parts.calls.resize(1);
                if (!parts.calls.empty()) {
                    json calls = json::array();
                    for (const sparrow::server::ParsedToolCall &call : parts.calls)
                        calls.push_back(tool_call_json(call, std::nullopt));
                    // OpenAI's shape: content null when the reply is only calls
                    choice["message"]["content"] = parts.content.empty() ? json() : json(parts.content);
                    choice["message"]["tool_calls"] = std::move(calls);
                    choice["finish_reason"] = chat_finish_reason(c.last.finish, parts.calls.size());
                }
            }
            if (r.logprobs) choice["logprobs"] = chat_logprobs(*r.tokenizer, c.token_logprobs);
        } else {
            const std::optional<std::string> &echo = k < r.echo.size() ? r.echo[k] : std::nullopt;
            choice["text"] = echo.value_or("") + c.text;
            if (r.logprobs) {  // an echoed prompt's entries first
                std::vector<TokenLogprob> entries = echo ? c.prompt_logprobs : std::vector<TokenLogprob>{};
                entries.insert(entries.end(), c.token_logprobs.begin(), c.token_logprobs.end());
                size_t offset = 0;
                choice["logprobs"] = completion_logprobs(
                    *r.tokenizer, echo ? std::optional<int32_t>(r.first_prompt_token[k]) : std::nullopt, entries,
                    offset);
            }
        }
        choices.push_back(std::move(choice));
    }
    return {200,
            {{"id", r.id},
             {"object", r.dialect == Dialect::chat ? "chat.completion" : "text_completion"},
             {"created", r.created},
             {"model", r.model},
             {"choices", std::move(choices)},
             {"usage", usage_of(ends, r.per_prompt)}}};
}

// One call of the content provider of a long non-streamed reply: the reply when the request is done, else a
// space now and then. Returns false when the client is gone.
bool pending_step(PendingReply &r, httplib::DataSink &sink) {
    if (r.done()) {
        sink.done();
        return true;
    }
    r.wait(kStreamPoll);
    std::string out;
    const bool done = r.done();
    if (done) {
        r.cancel_all();                          // after a failure, the other choices stop too
        out = dump_json(final_reply(r).second);  // a failure after the 200 went out is told in the body
    } else if (Clock::now() - r.last_write >= kProbeInterval) {
        out = " ";
    }
    if (!out.empty()) {
        if (!sink.write(out.data(), out.size())) return false;
        r.last_write = Clock::now();
    }
    if (done) sink.done();
    return true;
}

// llama.cpp's n_keep: the prompt tokens a context shift keeps after a BOS (-1: all of them).
int64_t read_n_keep(const json &body) { return get_int(body, "n_keep", -1, INT32_MAX).value_or(0); }

// The most choices one request may ask for (`n`).
constexpr int64_t kMaxChoices = 16;

// The request's `n` choices of one task: copies that differ in their sampling seed (seed, seed + 1, ...), so
// that sampled choices differ and greedy ones agree. They are queued together (so they read the prompt once),
// hence no more than the queue holds.
std::vector<Task> choices(const json &body, Task task, int64_t max_queue) {
    const int64_t n = get_int(body, "n", 1, kMaxChoices).value_or(1);
    if (n > max_queue) {
        throw ApiError(400,
                       strprintf("'n' is %lld; this server queues at most %lld tasks at a time (--max-queue)",
                                 (long long)n, (long long)max_queue),
                       "invalid_value");
    }
    std::vector<Task> tasks(static_cast<size_t>(n), task);
    for (int64_t k = 0; k < n; ++k)
        tasks[static_cast<size_t>(k)].sampling.params.seed = task.sampling.params.seed + uint64_t(k);
    return tasks;
}

}  // namespace

int Api::read_id_slot(const json &body) const {
    return static_cast<int>(get_int(body, "id_slot", -1, scheduler_.n_slots() - 1).value_or(-1));
}

void Api::completions(const httplib::Request &req, httplib::Response &res) {
    const json body = parse_body(req);
    check_model(body);
    refuse_if_set(body, "suffix", "no insertion mode");
    (void)get_int(body, "best_of", 1, 1);  // one candidate per request
    const auto prompt = body.find("prompt");
    if (prompt == body.end() || prompt->is_null()) throw ApiError(400, "'prompt' is required", "missing_field");
    const std::vector<Prompt> prompts = read_prompts(*prompt, "prompt", tokenizer_, limits_);
    // echo: the reply's text starts with the prompt (as sent, or its token ids' text); then max_tokens may be
    // 0, which only scores the prompt
    const bool echo = get_bool(body, "echo").value_or(false);
    const int64_t n = get_int(body, "n", 1, kMaxChoices).value_or(1);
    if (static_cast<int64_t>(prompts.size()) * n > scheduler_.max_queue()) {
        throw ApiError(400,
                       strprintf("%zu prompts x 'n' %lld choices; this server queues at most %lld tasks at a time "
                                 "(--max-queue)",
                                 prompts.size(), (long long)n, (long long)scheduler_.max_queue()),
                       "invalid_value");
    }
    std::vector<Task> tasks;
    std::vector<std::optional<std::string>> echo_texts;
    for (size_t i = 0; i < prompts.size(); ++i) {
        Task task;
        task.prompt = prompts[i].ids;
        task.sampling = read_sampling(
            body, {.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .max_tokens = 16, .min_max_tokens = echo ? 0 : 1},
            {"max_tokens"}, static_cast<int64_t>(task.prompt.size()), tokenizer_, limits_);
        // logprobs: null (none) or N, the alternatives reported per token with each token's own log probability
        task.sampling.logprobs = static_cast<int>(get_int(body, "logprobs", 0, kMaxTopLogprobs).value_or(-1));
        task.prompt_logprobs = echo && task.sampling.logprobs >= 0;
        task.id_slot = read_id_slot(body);
        task.n_keep = read_n_keep(body);
        std::optional<std::string> echo_text;
        if (echo) {
            const json &source = *prompts[i].source;
            echo_text = source.is_string() ? source.get<std::string>() : tokenizer_.decode(task.prompt);
        }
        for (Task &t : choices(body, std::move(task), scheduler_.max_queue())) {
            tasks.push_back(std::move(t));
            echo_texts.push_back(echo_text);
        }
    }
    const bool stream = get_bool(body, "stream").value_or(false);
    const bool include_usage = read_include_usage(body);
    generate(res, std::move(tasks), Dialect::completion, stream, include_usage,
             echo ? std::move(echo_texts) : std::vector<std::optional<std::string>>{}, static_cast<size_t>(n));
}

void Api::chat_completions(const httplib::Request &req, httplib::Response &res) {
    const json body = parse_body(req);
    check_model(body);
    // OpenAI's deprecated function calling: refused by name rather than ignored (the model would not see them).
    refuse_if_set(body, "functions", "it is OpenAI's deprecated form of 'tools'; send 'tools'");
    refuse_if_set(body, "function_call", "it is OpenAI's deprecated form of 'tool_choice'; send 'tool_choice'");
    ToolRequest tools = read_tool_request(body, req.body);
    // logprobs: true reports each token's log probability, with top_logprobs alternatives per token
    const bool logprobs = get_bool(body, "logprobs").value_or(false);
    const std::optional<int64_t> top_logprobs = get_int(body, "top_logprobs", 0, kMaxTopLogprobs);
    if (top_logprobs && !logprobs) throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "invalid_value");
    const std::string text = render_chat(body, tools.tools);
    Task task;
    task.prompt = tokenizer_.encode(text, /*add_special=*/false, /*parse_special=*/true);
    check_prompt_fits(task.prompt.size(), limits_);
    task.sampling = read_sampling(body, {}, {"max_completion_tokens", "max_tokens"},
                                  static_cast<int64_t>(task.prompt.size()), tokenizer_, limits_);
    if (logprobs) task.sampling.logprobs = static_cast<int>(top_logprobs.value_or(0));
    // tool_choice "required" or a function: the reply is calls, in the format's syntax (a grammar).
    if (tools.choice == ToolRequest::Choice::required) {
        if (task.sampling.json_object || task.sampling.grammar) {
            throw ApiError(400, "'tool_choice' that requires a call cannot be combined with response_format or grammar",
                           "invalid_value");
        }
        try {
            const std::string grammar =
                sparrow::server::tool_call_grammar(config_.chat_format, tools.tools, tools.only, tools.parallel);
            const TokenLookup lookup{[this](std::string_view t) { return tokenizer_.find_token(t); },
                                     tokenizer_.n_vocab()};
            task.sampling.grammar = std::make_shared<const Grammar>(Grammar::parse(grammar, &lookup));
        } catch (const sparrow::Error &e) {  // schemas past the grammar's limits
            throw ApiError(400, std::string("'tools': the calls' grammar: ") + e.what(), "invalid_value");
        }
    }
    // JSON mode or a grammar after an opened thinking block: the reasoning is free and the constrained text comes
    // after its end, so that it is the reply's content.
    if ((task.sampling.json_object || task.sampling.grammar) && text.ends_with("<think>"))
        task.sampling.constraint_after = "</think>";
    task.id_slot = read_id_slot(body);
    task.n_keep = read_n_keep(body);
    const bool stream = get_bool(body, "stream").value_or(false);
    const bool include_usage = read_include_usage(body);
    ReplyTools reply_tools;
    if (!tools.tools.empty()) {
        reply_tools =
            ReplyTools{.format = config_.chat_format, .tools = std::move(tools.tools), .parallel = tools.parallel};
    }
    generate(res, choices(body, std::move(task), scheduler_.max_queue()), Dialect::chat, stream, include_usage, {}, 0,
             // the rendered prompt says whether it opened a thinking block (every format's closed one ends "</think>")
             config_.split_reasoning && text.ends_with("<think>"), std::move(reply_tools));
}

std::string Api::render_chat(const json &body, const std::vector<nlohmann::ordered_json> &tools) const {
    sparrow::server::ChatOptions opts = sparrow::server::chat_options_for(tokenizer_);
    if (const auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
        if (!kw->is_object()) throw ApiError(400, "'chat_template_kwargs' must be an object", "invalid_type");
        opts.enable_thinking = get_bool(*kw, "enable_thinking", "chat_template_kwargs");
        if (!opts.enable_thinking) opts.enable_thinking = get_bool(*kw, "thinking", "chat_template_kwargs");
    }
    if (!tools.empty() && !sparrow::server::chat_format_has_tools(config_.chat_format)) {
        throw ApiError(400,
                       std::string("'tools': the chat format '") +
                           sparrow::server::chat_format_name(config_.chat_format) + "' has no tool calling",
                       "unsupported_parameter");
    }
    opts.tools = tools;
    return sparrow::server::apply_chat_format(config_.chat_format, read_messages(body), opts);
}

void Api::apply_template(const httplib::Request &req, httplib::Response &res) {
    const json body = parse_body(req);
    send_json(res, {{"prompt", render_chat(body, read_tool_request(body, req.body).tools)}});
}

void Api::completion(const httplib::Request &req, httplib::Response &res) {
    const json body = parse_body(req);
    check_model(body);
    const auto prompt = body.find("prompt");
    if (prompt == body.end() || prompt->is_null()) throw ApiError(400, "'prompt' is required", "missing_field");
    generate_llama(res, body, read_prompt(*prompt, "prompt", tokenizer_, limits_));
}

void Api::generate_llama(httplib::Response &res, const json &body, std::vector<int32_t> prompt) {
    (void)get_int(body, "n", 1, 1);  // one completion per request here
    Task task;
    task.prompt = std::move(prompt);
    // n_predict 0 only evaluates the prompt (llama.cpp's; clients use it to fill the prompt cache).
    task.sampling = read_sampling(body, kLlamaCompletionDefaults, {"n_predict", "max_tokens"},
                                  static_cast<int64_t>(task.prompt.size()), tokenizer_, limits_);
    // n_probs: the log probability of each generated token and of the n_probs most likely ones (llama.cpp's)
    if (const auto n_probs = get_int(body, "n_probs", 0, kMaxTopLogprobs); n_probs && *n_probs > 0) {
        task.sampling.logprobs = static_cast<int>(*n_probs);
    }
    task.id_slot = read_id_slot(body);
    task.n_keep = read_n_keep(body);
    std::vector<Task> one;
    one.push_back(std::move(task));
    generate(res, std::move(one), Dialect::llama, get_bool(body, "stream").value_or(false), false);
}

// llama.cpp's /infill: input_prefix and input_suffix around the hole, prompt (text after the middle token),
// input_extra ([{"filename", "text"}], other files of the project), and /completion's other fields. The prompt's
// parts are cut to fit (sparrow::server::infill_prompt): half the slot's context for prefix, suffix and prompt, a
// quarter for the other files, the rest for the reply.
void Api::infill(const httplib::Request &req, httplib::Response &res) {
    const json body = parse_body(req);
    check_model(body);
    if (!fim_.usable()) {
        throw ApiError(501, "infill needs fill-in-the-middle tokens (prefix, suffix, middle), which this model lacks",
                       "not_supported");
    }
    const auto text = [&](const char *key) { return get_string(body, key).value_or(std::string()); };
    std::vector<sparrow::server::InfillChunk> extra;
    if (const auto it = body.find("input_extra"); it != body.end() && !it->is_null()) {
        if (!it->is_array()) throw ApiError(400, "'input_extra' must be an array of objects", "invalid_type");
        for (const json &chunk : *it) {
            if (!chunk.is_object()) throw ApiError(400, "'input_extra' must be an array of objects", "invalid_type");
            extra.push_back({get_string(chunk, "filename", "input_extra").value_or(std::string()),
                             get_string(chunk, "text", "input_extra").value_or(std::string())});
        }
    }
    generate_llama(res, body,
                   sparrow::server::infill_prompt(
                       tokenizer_, fim_, text("input_prefix"), text("input_suffix"), text("prompt"), extra,
                       {.budget = limits_.n_ctx_per_slot / 2, .extra_budget = limits_.n_ctx_per_slot / 4}));
}

void Api::generate(httplib::Response &res, std::vector<Task> tasks, Dialect dialect, bool stream, bool include_usage,
                   std::vector<std::optional<std::string>> echo, size_t per_prompt, bool split_reasoning,
                   ReplyTools tools) {
    if (tasks.size() > 1 && tasks.front().id_slot >= 0) {
        throw ApiError(400, "'id_slot' runs one completion in one slot: it needs one prompt and 'n' 1",
                       "invalid_value");
    }
    std::vector<int32_t> first_tokens;
    for (const Task &t : tasks) first_tokens.push_back(t.prompt.front());  // prompts are never empty
    const uint64_t n = next_id_.fetch_add(1);
    ReplyInfo info{.channels = {},
                   .tokenizer = &tokenizer_,
                   .dialect = dialect,
                   .id = (dialect == Dialect::chat ? "chatcmpl-" : "cmpl-") + std::to_string(n),
                   .model = config_.model_id,
                   .created = unix_time(),
                   .logprobs = tasks.front().sampling.logprobs >= 0,
                   .echo = std::move(echo),
                   .first_prompt_token = std::move(first_tokens),
                   .per_prompt = per_prompt > 0 ? per_prompt : tasks.size(),
                   .split_reasoning = split_reasoning,
                   .tools = std::move(tools)};
    const size_t n_choices = tasks.size();
    info.channels = submit_all(std::move(tasks));

    if (!stream) {
        // Short requests get a plain reply. A request still running after kDirectReplyWait is answered
        // through a chunked reply that sends a space (leading whitespace is valid JSON) every kProbeInterval
        // while it waits: a client that went away makes such a write fail, which cancels its request.
        auto st = std::make_shared<PendingReply>();
        static_cast<ReplyInfo &>(*st) = std::move(info);
        st->choices.resize(n_choices);
        const auto deadline = Clock::now() + kDirectReplyWait;
        while (!st->done() && Clock::now() < deadline) {
            st->wait(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
        }
        if (st->done()) {
            st->cancel_all();  // after a failure, the other choices stop too
            const auto [status, body] = final_reply(*st);
            send_json(res, body, status);
            return;
        }
        const auto provider = [st](size_t, httplib::DataSink &sink) -> bool {
            try {
                return pending_step(*st, sink);
            } catch (const std::exception &e) {
                std::fprintf(stderr, "serve: reply %s failed: %s\n", st->id.c_str(), e.what());
                return false;
            }
        };
        res.status = 200;
        res.set_chunked_content_provider("application/json", provider, [st](bool) { st->cancel_all(); });
        return;
    }

    auto st = std::make_shared<StreamState>();
    static_cast<ReplyInfo &>(*st) = std::move(info);
    st->choices.resize(n_choices);
    st->include_usage = include_usage;
    const auto provider = [st](size_t, httplib::DataSink &sink) -> bool {
        // An exception must not escape into httplib's thread: it ends this response (and the releaser
        // cancels the tasks).
        try {
            return stream_step(*st, sink);
        } catch (const std::exception &e) {
            std::fprintf(stderr, "serve: stream %s failed: %s\n", st->id.c_str(), e.what());
            return false;
        }
    };
    res.status = 200;
    res.set_chunked_content_provider("text/event-stream", provider, [st](bool) { st->cancel_all(); });
    res.set_header("Cache-Control", "no-cache");
}

}  // namespace sparrow::tools::http
