// Reading the generation and embedding requests: prompts, sampling parameters and chat messages, validated
// against the model (vocabulary, per-slot context) with an ApiError for anything out of bounds.
#pragma once

#include <vector>

#include "server/api_common.h"
#include "server/chat_format.h"
#include "server/scheduler.h"

namespace sparrow {
class Tokenizer;
}

namespace sparrow::tools::http {

using sparrow::server::ChatMessage;
using sparrow::server::SamplingOptions;

// Limits on what one request may ask for.
// The most tokens one request may generate when context shifts let it outrun its context.
constexpr int64_t kMaxShiftedTokens = int64_t(1) << 20;

struct RequestLimits {
    int64_t n_ctx_per_slot = 0;  // prompt + generated tokens of one request (without context shifts)
    bool context_shift = false;  // the scheduler shifts full contexts: max_tokens may pass n_ctx_per_slot
    int32_t n_vocab = 0;
    size_t max_stop_strings = 16;
    size_t max_stop_bytes = 256;
};

// A prompt: a string (tokenized with the model's BOS and special tokens parsed, like `sparrow run`), an
// array of token ids, or a one-element array of either. Empty prompts are refused.
std::vector<int32_t> read_prompt(const json &value, const char *key, const Tokenizer &tok, const RequestLimits &lim);
// A prompt's token ids and the JSON it was read from (a string, or an array of token ids).
struct Prompt {
    std::vector<int32_t> ids;
    const json *source = nullptr;
};
// The prompts of /v1/completions: one prompt as read_prompt takes it, or an array of several (strings or arrays of
// token ids), as OpenAI's API allows (LangChain's completions client batches its prompts so).
std::vector<Prompt> read_prompts(const json &value, const char *key, const Tokenizer &tok, const RequestLimits &lim);
// The prompt inside a one-element list (["text"], [[ids]]), else value itself.
const json &prompt_source(const json &value);

// Defaults that differ between the OpenAI endpoints and llama.cpp's /completion.
struct SamplingDefaults {
    float temperature = 1.0f;
    float top_p = 1.0f;
    int top_k = 0;
    float min_p = 0.0f;
    std::optional<int64_t> max_tokens;  // nullopt: whatever the context leaves after the prompt
    int64_t min_max_tokens = 1;         // 0 where a request may only score its prompt (completions with echo)
};
// llama.cpp's /completion defaults (GET /props reports them).
inline constexpr SamplingDefaults kLlamaCompletionDefaults{
    .temperature = 0.8f, .top_p = 0.95f, .top_k = 40, .min_p = 0.05f, .max_tokens = std::nullopt, .min_max_tokens = 0};

// temperature, top_p, top_k, min_p, seed, presence_penalty, frequency_penalty, repeat_penalty, repeat_last_n, stop,
// logit_bias, ignore_eos, and max_tokens under the names given (the first present wins), checked to fit the context
// with the prompt; response_format (JSON mode, a JSON schema) and llama.cpp's json_schema. Constraints this server does
// not apply (grammar) are refused, not ignored.
SamplingOptions read_sampling(const json &body, const SamplingDefaults &defaults,
                              std::initializer_list<const char *> max_tokens_keys, int64_t n_prompt,
                              const Tokenizer &tok, const RequestLimits &lim);

// logit_bias, in either form servers take: OpenAI's object {"token id": bias} or llama.cpp's list of [token, bias]
// pairs, whose token may be a text (each of its tokens, without BOS, gets the bias). A bias is a number in
// [-100, 100], or false to ban the token. Entries naming one token add up.
std::vector<std::pair<int32_t, float>> read_logit_bias(const json &body, const Tokenizer &tok,
                                                       const RequestLimits &lim);

// OpenAI chat messages: [{"role", "content": string | [{"type": "text", "text"}] | null, "reasoning_content",
// "tool_calls" (assistant)}]; roles system, developer, user, assistant and tool.
std::vector<ChatMessage> read_messages(const json &body);

// The tools a chat request offers and how the model may use them (OpenAI's tools, tool_choice and
// parallel_tool_calls).
struct ToolRequest {
    std::vector<nlohmann::ordered_json> tools;  // {"type": "function", "function": {...}} in the client's key order
    enum class Choice {
        none,       // no calls: nothing is offered (tools is empty)
        automatic,  // the model may call (the default)
        required,   // the reply must be calls (of `only` when set)
    };
    Choice choice = Choice::automatic;
    std::string only;      // tool_choice {"type": "function", "function": {"name"}}: that function
    bool parallel = true;  // more than one call per reply
};
// `raw_body`: the request's text, read again in key order for the tools' definitions.
ToolRequest read_tool_request(const json &body, const std::string &raw_body);

// Refuses a prompt that leaves no room in a slot's context.
void check_prompt_fits(size_t n_prompt, const RequestLimits &lim);

}  // namespace sparrow::tools::http
