#include "server/api.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <sstream>
#include <thread>

#include "commands.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/tokenizer.h"
#include "server/requests.h"

namespace sparrow::tools::http {

namespace {
using sparrow::server::FinishReason;
using sparrow::server::Pooling;
using sparrow::server::TaskKind;
using sparrow::server::TaskUpdate;

// Most inputs one embeddings request may carry, as OpenAI's API (LangChain sends up to 1000 at a time). Each runs as
// its own task; they are queued in waves of half the queue, so one request never asks for the whole queue, and a
// wave after the first waits for room (up to kWaveWait) rather than failing a request already partly computed.
constexpr size_t kMaxEmbeddingInputs = 2048;
constexpr auto kWaveWait = std::chrono::seconds(60);

// The standard base64 alphabet, with padding (RFC 4648), of n bytes at p.
std::string base64(const uint8_t *p, size_t n) {
    static constexpr char kDigits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((n + 2) / 3 * 4);
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t a = p[i], b = i + 1 < n ? p[i + 1] : 0, c = i + 2 < n ? p[i + 2] : 0;
        const uint32_t v = (a << 16) | (b << 8) | c;
        out += kDigits[(v >> 18) & 63];
        out += kDigits[(v >> 12) & 63];
        out += i + 1 < n ? kDigits[(v >> 6) & 63] : '=';
        out += i + 2 < n ? kDigits[v & 63] : '=';
    }
    return out;
}

// An embedding as encoding_format asks: a JSON array of floats, or base64 of its float32 little-endian bytes (what
// openai-python asks for by default, and decodes).
json encode_embedding(std::span<const float> v, bool as_base64) {
    if (!as_base64) return json(std::vector<float>(v.begin(), v.end()));
    std::vector<uint8_t> bytes(v.size() * sizeof(float));
    for (size_t i = 0; i < v.size(); ++i) {
        uint32_t u;
        std::memcpy(&u, &v[i], sizeof u);
        for (int k = 0; k < 4; ++k) bytes[4 * i + static_cast<size_t>(k)] = static_cast<uint8_t>(u >> (8 * k));
    }
    return base64(bytes.data(), bytes.size());
}

// Compares in time that depends only on the length of `expected`, not on where the strings differ.
bool constant_time_equal(std::string_view given, std::string_view expected) {
    unsigned diff = given.size() == expected.size() ? 0u : 1u;
    for (size_t i = 0; i < expected.size(); ++i) {
        const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
        diff |= g ^ static_cast<unsigned char>(expected[i]);
    }
    return diff == 0;
}

// The routes and their methods: the metrics' path label (anything else counts as "other") and the 405 for a known
// path asked with another method. /v1/models/{id} stands for every /v1/models/<name>.
struct Endpoint {
    const char *path;
    const char *method;
};
constexpr Endpoint kEndpoints[] = {
    {"/health", "GET"},          {"/v1/models", "GET"},       {"/v1/models/{id}", "GET"},
    {"/metrics", "GET"},         {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
    {"/completion", "POST"},     {"/tokenize", "POST"},       {"/detokenize", "POST"},
    {"/v1/embeddings", "POST"},  {"/embeddings", "POST"},     {"/props", "GET"},
    {"/apply-template", "POST"}, {"/slots", "GET"},           {"/slots/{id}", "POST"},
    {"/infill", "POST"}};

const Endpoint *endpoint_of(const std::string &path) {
    const std::string_view models = "/v1/models/", slots = "/slots/";
    const std::string key = path.size() > models.size() && path.starts_with(models) ? "/v1/models/{id}"
                            : path.size() > slots.size() && path.starts_with(slots) ? "/slots/{id}"
                                                                                    : path;
    for (const Endpoint &e : kEndpoints) {
        if (key == e.path) return &e;
    }
    return nullptr;
}

std::string path_label(const std::string &path) {
    const Endpoint *e = endpoint_of(path);
    return e ? e->path : "other";
}
}  // namespace

void HttpCounters::add(const std::string &path, int status) {
    std::lock_guard lock(mu_);
    ++counts_[{path_label(path), status}];
}

std::map<std::pair<std::string, int>, int64_t> HttpCounters::snapshot() const {
    std::lock_guard lock(mu_);
    return counts_;
}

Api::Api(const Model &model, Scheduler &scheduler, ApiConfig config)
    : model_(model), tokenizer_(model_tokenizer(model)), scheduler_(scheduler), config_(std::move(config)) {
    limits_.n_ctx_per_slot = scheduler_.n_ctx_per_slot();
    limits_.context_shift = scheduler_.context_shift();
    limits_.n_vocab = tokenizer_.n_vocab();
    fim_ = sparrow::server::fim_tokens(model_.file(), tokenizer_);
}

httplib::Server::Handler Api::route(const std::string &path, Handler handler) {
    return [this, path, handler](const httplib::Request &req, httplib::Response &res) {
        try {
            (this->*handler)(req, res);
        } catch (const ApiError &e) {
            send_error(res, e.status(), e.what(), e.code());
        } catch (const json::exception &e) {  // a field of an unexpected type that no check caught
            send_error(res, 400, e.what(), "invalid_request");
        } catch (const sparrow::Error &e) {
            send_error(res, 400, e.what(), "invalid_request");
        } catch (const std::bad_alloc &) {
            send_error(res, 500, "out of memory", "server_error");
        } catch (const std::exception &e) {
            send_error(res, 500, e.what(), "server_error");
        }
        counters_.add(path, res.status);
    };
}

void Api::install(httplib::Server &server) {
    if (!config_.cors_origin.empty()) {
        server.set_default_headers({{"Access-Control-Allow-Origin", config_.cors_origin},
                                    {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                                    {"Access-Control-Max-Age", "600"}});
    }
    server.set_pre_routing_handler([this](const httplib::Request &req, httplib::Response &res) {
        if (!config_.cors_origin.empty() && req.method == "OPTIONS") {  // a preflight: the headers are the answer
            // The headers the page asked for are allowed, whatever they are: client libraries add their own
            // (openai-node sends X-Stainless-*), and "*" would not cover Authorization. Only a list of header
            // names is echoed; the answer depends on the request's list, so caches are told so (Vary).
            const std::string asked = req.get_header_value("Access-Control-Request-Headers");
            const bool names_only = std::all_of(asked.begin(), asked.end(), [](char c) {
                return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ',' || c == ' ';
            });
            res.set_header("Access-Control-Allow-Headers",
                           asked.empty() || !names_only ? "Authorization, Content-Type" : asked);
            res.set_header("Vary", "Access-Control-Request-Headers");
            res.status = 204;
            counters_.add(req.path, 204);
            return httplib::Server::HandlerResponse::Handled;
        }
        if (config_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
        const std::string auth = req.get_header_value("Authorization");
        // The scheme's name is case-insensitive (RFC 9110 11.1): "bearer KEY" is as good as "Bearer KEY".
        constexpr std::string_view scheme = "bearer ";
        bool scheme_ok = auth.size() >= scheme.size();
        for (size_t i = 0; scheme_ok && i < scheme.size(); ++i) {
            scheme_ok = std::tolower(static_cast<unsigned char>(auth[i])) == scheme[i];
        }
        const bool ok = scheme_ok && constant_time_equal(std::string_view(auth).substr(scheme.size()), config_.api_key);
        if (ok) return httplib::Server::HandlerResponse::Unhandled;
        send_error(res, 401, "missing or invalid API key (send 'Authorization: Bearer KEY')", "invalid_api_key");
        counters_.add(req.path, 401);
        return httplib::Server::HandlerResponse::Handled;
    });
    // Replies httplib makes itself (no route, body too large, bad request line) get the OpenAI error shape.
    server.set_error_handler(
        httplib::Server::HandlerWithResponse([this](const httplib::Request &req, httplib::Response &res) {
            if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours, already counted
            int status = res.status;
            std::string message = strprintf("HTTP %d", status);
            std::string code = "invalid_request";
            // A known endpoint asked with another method: 405 with the method it takes (RFC 9110 15.5.6).
            const Endpoint *e = status == 404 ? endpoint_of(req.path) : nullptr;
            if (e && req.method != e->method && !(req.method == "HEAD" && std::string_view(e->method) == "GET")) {
                status = 405;
                res.set_header("Allow", e->method);
                message = strprintf("%s takes %s, not %s", req.path.c_str(), e->method, req.method.c_str());
                code = "method_not_allowed";
            } else if (status == 404) {
                message = "unknown endpoint: " + req.method + " " + req.path;
                code = "not_found";
            } else if (status == 413) {
                message = "the request body is too large";
                code = "request_too_large";
            } else if (status == 400) {
                message = "malformed HTTP request";
            }
            send_error(res, status, message, code);
            counters_.add(req.path, status);
            return httplib::Server::HandlerResponse::Handled;
        }));
    server.set_exception_handler([this](const httplib::Request &req, httplib::Response &res, std::exception_ptr) {
        send_error(res, 500, "internal error", "server_error");
        counters_.add(req.path, 500);
    });
    server.Get("/health", route("/health", &Api::health));
    server.Get("/v1/models", route("/v1/models", &Api::models));
    server.Get(R"(/v1/models/(.+))", route("/v1/models/{id}", &Api::model));
    server.Get("/metrics", route("/metrics", &Api::metrics));
    server.Get("/props", route("/props", &Api::props));
    server.Post("/tokenize", route("/tokenize", &Api::tokenize));
    server.Post("/detokenize", route("/detokenize", &Api::detokenize));
    server.Post("/v1/embeddings", route("/v1/embeddings", &Api::embeddings));
    server.Post("/embeddings", route("/embeddings", &Api::embeddings));
    server.Post("/v1/completions", route("/v1/completions", &Api::completions));
    server.Post("/v1/chat/completions", route("/v1/chat/completions", &Api::chat_completions));
    server.Post("/completion", route("/completion", &Api::completion));
    server.Post("/infill", route("/infill", &Api::infill));
    server.Post("/apply-template", route("/apply-template", &Api::apply_template));
    server.Get("/slots", route("/slots", &Api::slots));
    server.Post(R"(/slots/([^/]+))", route("/slots/{id}", &Api::slot_action));
}

void Api::check_model(const json &body) const {
    if (const std::optional<std::string> name = get_string(body, "model")) check_model_id(*name);
}

void Api::check_model_id(const std::string &name) const {
    if (name != config_.model_id) {
        throw ApiError(404, "the model '" + name + "' does not exist; this server serves '" + config_.model_id + "'",
                       "model_not_found");
    }
}

std::vector<std::shared_ptr<sparrow::server::TaskChannel>> Api::submit_all(std::vector<Task> tasks) {
    auto channels = scheduler_.submit_all(std::move(tasks));
    if (channels.empty()) throw ApiError(429, "too many requests are queued; retry later", "queue_full");
    return channels;
}

void Api::health(const httplib::Request &, httplib::Response &res) {
    const auto m = scheduler_.metrics();
    send_json(res, {{"status", "ok"},
                    {"slots_idle", m.n_slots - m.slots_busy},
                    {"slots_processing", m.slots_busy},
                    {"queue_depth", m.queue_depth}});
}

void Api::models(const httplib::Request &, httplib::Response &res) {
    send_json(res, {{"object", "list"}, {"data", json::array({model_object()})}});
}

void Api::model(const httplib::Request &req, httplib::Response &res) {
    check_model_id(req.matches.size() > 1 ? std::string(req.matches[1]) : std::string());
    send_json(res, model_object());
}

json Api::model_object() const {
    const ModelInfo &info = model_info(model_);
    json model = {{"id", config_.model_id},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "sparrow"},
                  {"meta",
                   {{"arch", info.arch},
                    {"n_vocab", info.n_vocab},
                    {"n_embd", info.n_embd},
                    {"n_params", info.n_params},
                    {"n_ctx", scheduler_.n_ctx()},
                    {"n_ctx_per_slot", scheduler_.n_ctx_per_slot()},
                    {"slots", scheduler_.n_slots()},
                    {"chat_format", sparrow::server::chat_format_name(config_.chat_format)}}}};
    return model;
}

// llama.cpp's server properties, which its web UI and several clients read for the context size and the chat
// template: the defaults of /completion (requests/api_generate: llama.cpp's), the slots, the model.
void Api::props(const httplib::Request &, httplib::Response &res) {
    const std::string tmpl = model_.file().get_string("tokenizer.chat_template", std::string());
    const auto piece = [&](int32_t id) { return id >= 0 ? tokenizer_.token_to_piece(id, true) : std::string(); };
    const auto shortest = [](float x) { return std::strtod(strprintf("%g", double(x)).c_str(), nullptr); };  // 0.05
    const LogitAdjustments off;  // what a request changes nothing with
    const bool tools = sparrow::server::chat_format_has_tools(config_.chat_format);
    send_json(res, {{"default_generation_settings",
                     {{"n_ctx", scheduler_.n_ctx_per_slot()},
                      {"params",
                       {{"temperature", shortest(kLlamaCompletionDefaults.temperature)},
                        {"top_k", kLlamaCompletionDefaults.top_k},
                        {"top_p", shortest(kLlamaCompletionDefaults.top_p)},
                        {"min_p", shortest(kLlamaCompletionDefaults.min_p)},
                        {"typical_p", 1.0},
                        {"xtc_probability", 0.0},
                        {"xtc_threshold", shortest(0.1f)},
                        {"top_n_sigma", -1.0},
                        {"dynatemp_range", 0.0},
                        {"dynatemp_exponent", 1.0},
                        {"mirostat", 0},
                        {"mirostat_tau", 5.0},
                        {"mirostat_eta", shortest(0.1f)},
                        {"n_predict", -1},
                        {"repeat_penalty", shortest(off.repeat_penalty)},
                        {"repeat_last_n", off.repeat_last_n},
                        {"presence_penalty", shortest(off.presence_penalty)},
                        {"frequency_penalty", shortest(off.frequency_penalty)},
                        {"dry_multiplier", shortest(off.dry_multiplier)},
                        {"dry_base", shortest(off.dry_base)},
                        {"dry_allowed_length", off.dry_allowed_length},
                        {"dry_penalty_last_n", off.dry_penalty_last_n},
                        {"dry_sequence_breakers", default_dry_breakers()},
                        {"ignore_eos", off.ignore_eos}}}}},
                    {"total_slots", scheduler_.n_slots()},
                    {"model_path", config_.model_id},
                    {"chat_template", tmpl},
                    {"chat_format", sparrow::server::chat_format_name(config_.chat_format)},
                    // what the chat format can express (llama.cpp's names for a template's capabilities)
                    {"chat_template_caps",
                     {{"supports_system_role", true},
                      {"supports_tools", tools},
                      {"supports_tool_calls", tools},
                      {"supports_tool_responses", tools},
                      {"supports_parallel_tool_calls", tools}}},
                    {"bos_token", piece(tokenizer_.bos_id())},
                    {"eos_token", piece(tokenizer_.eos_id())},
                    {"modalities", {{"vision", false}, {"audio", false}}},
                    {"build_info", sparrow::tools::kVersion}});
}

// llama.cpp's GET /slots: each slot's state; with ?fail_on_no_slot=1, 503 when none is idle.
void Api::slots(const httplib::Request &req, httplib::Response &res) {
    const sparrow::server::SchedulerMetrics m = scheduler_.metrics();
    json out = json::array();
    bool any_idle = false;
    for (size_t i = 0; i < m.slots.size(); ++i) {
        const sparrow::server::SlotInfo &s = m.slots[i];
        any_idle = any_idle || !s.busy;
        out.push_back({{"id", i},
                       {"n_ctx", scheduler_.n_ctx_per_slot()},
                       {"is_processing", s.busy},
                       {"n_past", s.n_cached},  // tokens whose cache rows the slot holds
                       {"n_prompt_tokens", s.n_prompt},
                       {"next_token", {{"n_decoded", s.n_generated}}}});
    }
    const std::string fail = req.get_param_value("fail_on_no_slot");
    if (!any_idle && (fail == "1" || fail == "true")) throw ApiError(503, "no slot available", "unavailable");
    send_json(res, out);
}

namespace {
// A slot file's name as a client gives it: one plain name inside --slot-save-path, nothing that could reach
// outside it or trouble a shell or another system's file names.
void check_slot_filename(const std::string &name) {
    const bool plain = std::none_of(name.begin(), name.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u < 0x20 || u == 0x7f || std::string_view("/\\:*?\"<>|").find(c) != std::string_view::npos;
    });
    if (name.empty() || name.size() > 255 || name == "." || name == ".." || !plain) {
        throw ApiError(400,
                       "'filename' must be a plain file name (1 to 255 bytes; no path separators, control characters "
                       "or any of :*?\"<>|; not . or ..)",
                       "invalid_value");
    }
}
}  // namespace

// llama.cpp's POST /slots/{id}?action=save|restore|erase: a slot's cache to a file in --slot-save-path, back from
// one (its prefix then serves the next prompts that begin with it), or dropped.
void Api::slot_action(const httplib::Request &req, httplib::Response &res) {
    using sparrow::server::SlotActionKind;
    const std::string id_text = req.matches[1];
    int id = -1;
    const auto [end, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
    if (ec != std::errc() || end != id_text.data() + id_text.size() || id < 0 || id >= scheduler_.n_slots()) {
        throw ApiError(404, strprintf("no slot '%s' (slots are 0 to %d)", id_text.c_str(), scheduler_.n_slots() - 1),
                       "not_found");
    }
    const std::string action = req.get_param_value("action");
    SlotActionKind kind;
    if (action == "save") {
        kind = SlotActionKind::save;
    } else if (action == "restore") {
        kind = SlotActionKind::restore;
    } else if (action == "erase") {
        kind = SlotActionKind::erase;
    } else {
        throw ApiError(400, "'action' must be save, restore or erase", "invalid_value");
    }
    std::string filename, path;
    if (kind != SlotActionKind::erase) {
        if (config_.slot_save_path.empty()) {
            throw ApiError(501, "slot save and restore are off: start the server with --slot-save-path DIR",
                           "not_supported");
        }
        const json body = parse_body(req);
        filename = get_string(body, "filename").value_or("");
        check_slot_filename(filename);
        path = config_.slot_save_path + "/" + filename;
        if (kind == SlotActionKind::restore && !std::filesystem::is_regular_file(path)) {
            throw ApiError(404, strprintf("no slot file '%s'", filename.c_str()), "not_found");
        }
    }
    sparrow::server::SlotActionResult r = scheduler_.slot_action(id, kind, path);
    if (!r.ok) {
        // The message names the file as the client did, not where the server keeps it.
        for (size_t at; !path.empty() && (at = r.error.find(path)) != std::string::npos;)
            r.error.replace(at, path.size(), filename);
        throw ApiError(400, strprintf("slot %d: %s", id, r.error.c_str()), "invalid_request");
    }
    const double ms = r.seconds * 1e3;
    if (kind == SlotActionKind::save) {
        send_json(res, {{"id_slot", id},
                        {"filename", filename},
                        {"n_saved", r.n_tokens},
                        {"n_written", r.n_bytes},
                        {"timings", {{"save_ms", ms}}}});
    } else if (kind == SlotActionKind::restore) {
        send_json(res, {{"id_slot", id},
                        {"filename", filename},
                        {"n_restored", r.n_tokens},
                        {"n_read", r.n_bytes},
                        {"timings", {{"restore_ms", ms}}}});
    } else {
        send_json(res, {{"id_slot", id}, {"n_erased", r.n_tokens}});
    }
}

void Api::tokenize(const httplib::Request &req, httplib::Response &res) {
    const json body = parse_body(req);
    const std::optional<std::string> content = get_string(body, "content");
    if (!content) throw ApiError(400, "'content' (a string) is required", "missing_field");
    const bool add_special = get_bool(body, "add_special").value_or(false);
    const bool parse_special = get_bool(body, "parse_special").value_or(true);
    const bool with_pieces = get_bool(body, "with_pieces").value_or(false);
    const std::vector<int32_t> ids = tokenizer_.encode(*content, add_special, parse_special);
    json tokens = json::array();
    for (int32_t id : ids) {
        if (with_pieces) {
            tokens.push_back({{"id", id}, {"piece", tokenizer_.token_to_piece(id, true)}});
        } else {
            tokens.push_back(id);
        }
    }
    send_json(res, {{"tokens", tokens}});
}

void Api::detokenize(const httplib::Request &req, httplib::Response &res) {
    const json body = parse_body(req);
    const auto it = body.find("tokens");
    if (it == body.end() || !it->is_array())
        throw ApiError(400, "'tokens' (an array of ids) is required", "missing_field");
    std::vector<int32_t> ids;
    for (const json &v : *it) {
        if (!v.is_number_integer()) throw ApiError(400, "'tokens' must hold integer ids", "invalid_type");
        const int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT32_MAX) ? -1 : v.get<int64_t>();
        if (id < 0 || id >= limits_.n_vocab) {
            throw ApiError(400,
                           strprintf("'tokens' holds token id %lld, outside the vocabulary [0, %d)", (long long)id,
                                     limits_.n_vocab),
                           "invalid_value");
        }
        ids.push_back(static_cast<int32_t>(id));
    }
    send_json(res, {{"content", tokenizer_.decode(ids)}});
}

void Api::embeddings(const httplib::Request &req, httplib::Response &res) {
    const json body = parse_body(req);
    check_model(body);
    const auto input = body.find("input") != body.end() ? body.find("input") : body.find("content");
    if (input == body.end() || input->is_null()) throw ApiError(400, "'input' is required", "missing_field");
    const std::string pooling_name = get_string(body, "pooling").value_or("mean");
    Pooling pooling = Pooling::mean;
    if (pooling_name == "none") {
        pooling = Pooling::none;
    } else if (pooling_name == "last") {
        pooling = Pooling::last;
    } else if (pooling_name != "mean") {
        throw ApiError(400, "'pooling' must be none, mean or last", "invalid_value");
    }
    const std::string encoding = get_string(body, "encoding_format").value_or("float");
    if (encoding != "float" && encoding != "base64") {
        throw ApiError(400, "'encoding_format' must be float or base64", "invalid_value");
    }
    const bool as_base64 = encoding == "base64";
    const bool normalize = get_bool(body, "normalize").value_or(true);
    // One input (a string or an array of ids) or an array of inputs.
    std::vector<json> inputs;
    if (input->is_array() && !input->empty() && (input->at(0).is_string() || input->at(0).is_array())) {
        inputs.assign(input->begin(), input->end());
    } else {
        inputs.push_back(*input);
    }
    if (inputs.size() > kMaxEmbeddingInputs) {
        throw ApiError(400,
                       strprintf("'input' holds %zu inputs; at most %zu are allowed per request", inputs.size(),
                                 kMaxEmbeddingInputs),
                       "invalid_value");
    }
    std::vector<Task> tasks;
    int64_t n_prompt = 0;
    for (const json &in : inputs) {
        if (in.is_array() && !in.empty() && !in[0].is_number()) {
            throw ApiError(400, "'input' must be a string, an array of token ids, or an array of those",
                           "invalid_type");
        }
        Task t;
        t.kind = TaskKind::embedding;
        t.prompt = read_prompt(in, "input", tokenizer_, limits_);
        t.pooling = pooling;
        t.normalize = normalize;
        n_prompt += static_cast<int64_t>(t.prompt.size());
        tasks.push_back(std::move(t));
    }
    json data = json::array();
    const int64_t n_embd = model_info(model_).n_embd;
    const size_t wave = std::max<size_t>(1, static_cast<size_t>(scheduler_.max_queue()) / 2);
    for (size_t w0 = 0; w0 < tasks.size(); w0 += wave) {
        const auto first = tasks.begin() + static_cast<std::ptrdiff_t>(w0);
        const std::vector<Task> these(first, first + static_cast<std::ptrdiff_t>(std::min(wave, tasks.size() - w0)));
        std::vector<std::shared_ptr<sparrow::server::TaskChannel>> channels = scheduler_.submit_all(these);
        for (const auto give_up = std::chrono::steady_clock::now() + kWaveWait;
             channels.empty() && w0 > 0 && std::chrono::steady_clock::now() < give_up;) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            channels = scheduler_.submit_all(these);
        }
        if (channels.empty()) channels = submit_all(these);  // a last try, or the 429
        for (size_t i = 0; i < channels.size(); ++i) {
            TaskUpdate u;
            while (!(u = channels[i]->wait(std::chrono::milliseconds(1000))).done) {}
            if (u.finish == FinishReason::error) {
                for (auto &c : channels) c->cancel();
                throw ApiError(500, u.error, "server_error");
            }
            json embedding;
            if (pooling == Pooling::none) {
                embedding = json::array();
                for (int64_t r = 0; r < u.n_embd_rows; ++r) {
                    embedding.push_back(
                        encode_embedding(std::span<const float>(u.embedding)
                                             .subspan(static_cast<size_t>(r * n_embd), static_cast<size_t>(n_embd)),
                                         as_base64));
                }
            } else {
                embedding = encode_embedding(u.embedding, as_base64);
            }
            data.push_back({{"object", "embedding"}, {"index", w0 + i}, {"embedding", std::move(embedding)}});
        }
    }
    send_json(res, {{"object", "list"},
                    {"model", config_.model_id},
                    {"data", std::move(data)},
                    {"usage", {{"prompt_tokens", n_prompt}, {"total_tokens", n_prompt}}}});
}

void Api::metrics(const httplib::Request &, httplib::Response &res) {
    const auto m = scheduler_.metrics();
    std::ostringstream out;
    out.precision(12);  // counters in seconds keep sub-millisecond resolution after days of uptime
    const auto metric = [&](const char *name, const char *type, const char *help, auto value) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
            << name << ' ' << value << '\n';
    };
    out << "# HELP sparrow_http_requests_total HTTP requests answered, by path and status.\n"
        << "# TYPE sparrow_http_requests_total counter\n";
    for (const auto &[key, count] : counters_.snapshot()) {
        out << "sparrow_http_requests_total{path=\"" << key.first << "\",status=\"" << key.second << "\"} " << count
            << '\n';
    }
    out << "# HELP sparrow_tasks_total Generation and embedding tasks ended, by result.\n"
        << "# TYPE sparrow_tasks_total counter\n"
        << "sparrow_tasks_total{result=\"completed\"} " << m.tasks_completed << '\n'
        << "sparrow_tasks_total{result=\"cancelled\"} " << m.tasks_cancelled << '\n'
        << "sparrow_tasks_total{result=\"failed\"} " << m.tasks_failed << '\n';
    metric("sparrow_prompt_tokens_total", "counter", "Prompt tokens of started tasks.", m.prompt_tokens);
    metric("sparrow_prompt_tokens_evaluated_total", "counter",
           "Prompt tokens run through the model (the rest came from slot caches).", m.prompt_tokens_evaluated);
    metric("sparrow_prefixes_shared_total", "counter",
           "Tasks that took their prompt's start from another slot's cells.", m.prefixes_shared);
    metric("sparrow_context_shifts_total", "counter",
           "Context shifts of generating slots whose context was full (--context-shift).", m.context_shifts);
    metric("sparrow_generated_tokens_total", "counter", "Tokens sampled.", m.generated_tokens);
    metric("sparrow_decode_calls_total", "counter", "Batches decoded.", m.decode_calls);
    metric("sparrow_decode_seconds_total", "counter", "Time spent decoding batches.", m.decode_seconds);
    metric("sparrow_tokens_per_second", "gauge", "Tokens sampled per second over the last 10 s.", m.tokens_per_second);
    metric("sparrow_queue_depth", "gauge", "Requests waiting for a slot.", m.queue_depth);
    metric("sparrow_slots_busy", "gauge", "Slots running a task.", m.slots_busy);
    metric("sparrow_slots_total", "gauge", "Slots (parallel sequences).", m.n_slots);
    metric("sparrow_kv_cells_used", "gauge",
           "KV cache cells holding rows (cached prefixes included; a shared cell once).", m.kv_cells_used);
    metric("sparrow_kv_cells_total", "gauge", "KV cache cells.", m.kv_cells_total);
    const auto histogram = [&](const char *name, const char *help, const server::LatencyHistogram &h) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
        int64_t cumulative = 0;
        for (size_t i = 0; i < h.kBounds.size(); ++i) {
            cumulative += h.counts[i];
            out << name << "_bucket{le=\"" << h.kBounds[i] << "\"} " << cumulative << '\n';
        }
        out << name << "_bucket{le=\"+Inf\"} " << h.count() << '\n'
            << name << "_sum " << h.sum << '\n'
            << name << "_count " << h.count() << '\n';
    };
    histogram("sparrow_time_to_first_token_seconds",
              "Completion tasks: from the request's arrival to its first sampled token.", m.time_to_first_token);
    histogram("sparrow_inter_token_seconds", "Completion tasks: time between two sampled tokens of one task.",
              m.inter_token);
    res.status = 200;
    res.set_content(out.str(), "text/plain; version=0.0.4");
}

}  // namespace sparrow::tools::http
