// The HTTP API of `sparrow serve`: OpenAI-compatible completions, chat completions and embeddings, llama.cpp's
// /completion, /tokenize, /detokenize, /props, /apply-template and /slots, /health, /v1/models and Prometheus
// /metrics. Handlers run on
// httplib's threads; they read requests, submit tasks to the scheduler and turn its updates into replies.
#pragma once

#include <httplib.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "server/api_common.h"
#include "server/chat_format.h"
#include "server/infill.h"
#include "server/requests.h"
#include "server/scheduler.h"
#include "sparrow/sparrow.h"

namespace sparrow::tools::http {

using sparrow::server::ChatFormat;
using sparrow::server::Scheduler;
using sparrow::server::Task;

// The three generation endpoints differ only in their request defaults and reply shapes.
enum class Dialect {
    completion,  // OpenAI /v1/completions
    chat,        // OpenAI /v1/chat/completions
    llama,       // llama.cpp /completion
};

struct ApiConfig {
    std::string model_id;  // the name /v1/models lists and requests may give as "model"
    std::string api_key;   // empty: no authentication
    ChatFormat chat_format = ChatFormat::llama2;
    // Chat replies of a thinking generation prompt: the reasoning in message.reasoning_content (delta.reasoning_content
    // when streamed) and the answer in content, as DeepSeek's API and llama.cpp's --reasoning-format deepseek; false:
    // all of it in content.
    bool split_reasoning = true;
    // Browser pages of this origin ("*": any) may call the API: CORS headers on every reply, and preflight OPTIONS
    // requests answered (204, without the API key, which browsers do not send on them). Empty: no CORS.
    std::string cors_origin;
    // The folder slot save/restore files go in (llama.cpp's --slot-save-path); empty: those two actions are off.
    std::string slot_save_path;
};

// A chat reply whose calls are read out of its text (the request offered tools).
struct ReplyTools {
    std::optional<ChatFormat> format;  // unset: no tools on offer, the text is all content
    std::vector<nlohmann::ordered_json> tools;
    bool parallel = true;  // false: a reply's calls after its first are dropped
};

// HTTP replies by path and status, counted before the reply is sent.
class HttpCounters {
  public:
    void add(const std::string &path, int status);
    std::map<std::pair<std::string, int>, int64_t> snapshot() const;

  private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, int64_t> counts_;
};

class Api {
  public:
    Api(const Model &model, Scheduler &scheduler, ApiConfig config);
    // Registers the routes, authentication and the error handlers on the server.
    void install(httplib::Server &server);

  private:
    using Handler = void (Api::*)(const httplib::Request &, httplib::Response &);
    // Wraps a handler: ApiError and other exceptions become error replies; the reply is counted.
    httplib::Server::Handler route(const std::string &path, Handler handler);

    void health(const httplib::Request &req, httplib::Response &res);
    void models(const httplib::Request &req, httplib::Response &res);
    void model(const httplib::Request &req, httplib::Response &res);  // GET /v1/models/{id}
    json model_object() const;                                        // the entry /v1/models lists
    void props(const httplib::Request &req, httplib::Response &res);  // llama.cpp's GET /props
    void tokenize(const httplib::Request &req, httplib::Response &res);
    void detokenize(const httplib::Request &req, httplib::Response &res);
    void metrics(const httplib::Request &req, httplib::Response &res);
    void embeddings(const httplib::Request &req, httplib::Response &res);
    void completions(const httplib::Request &req, httplib::Response &res);       // /v1/completions
    void chat_completions(const httplib::Request &req, httplib::Response &res);  // /v1/chat/completions
    void completion(const httplib::Request &req, httplib::Response &res);        // llama.cpp's /completion
    void infill(const httplib::Request &req, httplib::Response &res);            // llama.cpp's /infill
    // llama.cpp's /apply-template: the prompt a chat request's messages render to, as /v1/chat/completions reads it
    void apply_template(const httplib::Request &req, httplib::Response &res);
    // A chat request's messages in the server's chat format (chat_template_kwargs.enable_thinking honoured), with
    // the tools on offer.
    std::string render_chat(const json &body, const std::vector<nlohmann::ordered_json> &tools) const;

    // Shared by the three generation endpoints (api_generate.cpp): one task per choice of the reply, `per_prompt`
    // choices (`n`) of each prompt in turn (0: all of them share one prompt), so choice k reads prompt
    // k / per_prompt. echo: empty, or per choice the text it starts with (completions' echo).
    void generate(httplib::Response &res, std::vector<Task> tasks, Dialect dialect, bool stream, bool include_usage,
                  std::vector<std::optional<std::string>> echo = {}, size_t per_prompt = 0,
                  bool split_reasoning = false, ReplyTools tools = {});
    // /completion's and /infill's one task for `prompt`, read with the rest of the request (sampling, n_probs,
    // id_slot, n_keep, stream) and answered in llama.cpp's shape.
    void generate_llama(httplib::Response &res, const json &body, std::vector<int32_t> prompt);
    void check_model(const json &body) const;
    int read_id_slot(const json &body) const;  // llama.cpp's id_slot: -1 (any) or a slot, 400 otherwise
    void slots(const httplib::Request &req, httplib::Response &res);        // llama.cpp's GET /slots
    void slot_action(const httplib::Request &req, httplib::Response &res);  // POST /slots/{id}?action=...
    void check_model_id(const std::string &name) const;                     // 404 unless name is the served model
    // Queues the tasks together (all or none: 429 when the queue cannot take them all).
    std::vector<std::shared_ptr<sparrow::server::TaskChannel>> submit_all(std::vector<Task> tasks);

    const Model &model_;
    const Tokenizer &tokenizer_;
    Scheduler &scheduler_;
    ApiConfig config_;
    RequestLimits limits_;
    sparrow::server::FimTokens fim_;  // the model's fill-in-the-middle tokens (/infill)
    HttpCounters counters_;
    std::atomic<uint64_t> next_id_{1};  // response ids
};

}  // namespace sparrow::tools::http
