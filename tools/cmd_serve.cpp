// `sparrow serve`: an OpenAI-compatible HTTP server over one model, with -np parallel slots decoded together
// (continuous batching). See tools/server/ for the API and src/server/ for the scheduler.
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "common.h"
#include "core/error.h"
#include "model/model.h"
#include "server/api.h"

namespace sparrow::tools {

namespace {
struct ServeFlags {
    ModelFlags model;
    std::string host = "127.0.0.1";
    int port = 8080;
    int n_parallel = 4;
    std::string api_key;
    std::string chat_format;                    // empty: recognised from tokenizer.chat_template
    std::string alias;                          // the model id clients see; default: the file name
    std::string reasoning_format = "deepseek";  // deepseek: thinking replies split into reasoning_content; none
    std::string cors_origin;                    // empty: no CORS
    std::string slot_save_path;                 // empty: slot save/restore off
    bool context_shift = false;
    int64_t max_queue = 64;
    int64_t prefill_chunk = 0;  // 0: the ubatch size
    int64_t max_body_bytes = 1 << 20;
    int http_threads = 0;  // 0: enough for every slot and queued request
    bool verbose = false;
};

int serve(const ServeFlags &f) {
    // A write to a connection the client closed must fail (and cancel its request), not kill the server.
    ::signal(SIGPIPE, SIG_IGN);
    // SIGINT / SIGTERM stop the server cleanly: blocked here, before any thread starts, and taken by sigwait.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    auto model = load_model_verbose(f.model);
    const sparrow::server::ChatFormat chat_format = choose_chat_format(f.chat_format, *model, "serve");
    sparrow::server::Scheduler scheduler(model, f.model.context_params(),
                                         {f.n_parallel, f.max_queue, f.prefill_chunk, f.context_shift});
    std::fprintf(stderr,
                 "serve: %d slots of %lld tokens (context %lld), batch %lld (%lld while generating), queue %lld, "
                 "chat format %s%s\n",
                 scheduler.n_slots(), (long long)scheduler.n_ctx_per_slot(), (long long)scheduler.n_ctx(),
                 (long long)scheduler.n_batch(), (long long)scheduler.prefill_chunk(), (long long)f.max_queue,
                 sparrow::server::chat_format_name(chat_format), f.api_key.empty() ? "" : ", API key required");

    http::ApiConfig config;
    config.model_id = f.alias.empty() ? std::filesystem::path(f.model.model_path).filename().string() : f.alias;
    config.api_key = f.api_key;
    config.chat_format = chat_format;
    config.split_reasoning = f.reasoning_format == "deepseek";
    config.cors_origin = f.cors_origin;
    config.slot_save_path = f.slot_save_path;
    http::Api api(*model, scheduler, config);

    httplib::Server http;
    // Each open connection holds a thread (a streamed reply for its whole length): enough threads for every
    // slot and queued request plus a few for /health and /metrics.
    const size_t n_threads =
        f.http_threads > 0 ? static_cast<size_t>(f.http_threads) : static_cast<size_t>(f.n_parallel + f.max_queue + 8);
    http.new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
    http.set_payload_max_length(static_cast<size_t>(f.max_body_bytes));
    if (f.verbose) {
        http.set_logger([](const httplib::Request &req, const httplib::Response &res) {
            std::fprintf(stderr, "serve: %s %s -> %d\n", req.method.c_str(), req.path.c_str(), res.status);
        });
    }
    api.install(http);
    // cpp-httplib sets SO_REUSEPORT by default, which lets a second server bind a port this one listens on and
    // the kernel then splits the connections between the two: each would see some clients' requests. Only
    // SO_REUSEADDR (a restart may bind while the last run's connections sit in TIME_WAIT), so a port in use fails.
    http.set_socket_options([](socket_t sock) {
        const int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    int port = f.port;
    errno = 0;
    if (port == 0) {
        port = http.bind_to_any_port(f.host);
    } else if (!http.bind_to_port(f.host, port)) {
        port = -1;
    }
    if (port <= 0) {
        const int err = errno;
        throw_error("serve: cannot listen on %s:%d%s%s", f.host.c_str(), f.port, err ? ": " : "",
                    err ? std::strerror(err) : "");
    }
    // An IPv6 address goes in brackets in a URL (RFC 3986): http://[::1]:8080.
    const bool ipv6 = f.host.find(':') != std::string::npos;
    std::fprintf(stderr, "serve: listening on http://%s%s%s:%d\n", ipv6 ? "[" : "", f.host.c_str(), ipv6 ? "]" : "",
                 port);
    std::fflush(stderr);

    std::thread signal_waiter([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        http.stop();
    });
    const bool ok = http.listen_after_bind();
    pthread_kill(signal_waiter.native_handle(), SIGTERM);  // wakes the waiter when listen ended on its own
    signal_waiter.join();
    std::fprintf(stderr, "serve: stopped\n");
    return ok ? 0 : 1;
}
}  // namespace

Command register_serve(CLI::App &app) {
    auto *cmd = app.add_subcommand("serve", "Serve the model over HTTP (OpenAI-compatible API)");
    auto f = std::make_shared<ServeFlags>();
    f->model.add_to(*cmd, 0, /*with_dsa_flag=*/true, /*with_stats_flag=*/false);
    cmd->add_option("--host", f->host, "Address to listen on (default: loopback only)");
    cmd->add_option("--port", f->port, "Port (0 = any free port, printed at start-up)")->check(CLI::Range(0, 65535));
    cmd->add_option("--parallel", f->n_parallel, "Slots: requests decoded together (-np)")->check(CLI::Range(1, 64));
    cmd->add_option("--api-key", f->api_key, "Require 'Authorization: Bearer KEY' on every endpoint but /health");
    add_chat_format_option(*cmd, f->chat_format);
    cmd->add_option("--alias", f->alias, "Model id shown to clients (default: the file name)");
    cmd->add_option("--cors-origin", f->cors_origin,
                    "Let browser pages of this origin ('*': any) call the API (CORS headers, preflights answered); "
                    "off by default, as any page the user opens could then drive the server");
    cmd->add_flag("--context-shift", f->context_shift,
                  "A slot whose context fills while it generates keeps a BOS and the request's n_keep prompt tokens, "
                  "drops the older half of the rest and goes on (max_tokens may then pass the slot's context)");
    cmd->add_option("--slot-save-path", f->slot_save_path,
                    "Folder for POST /slots/{id}?action=save|restore files (a slot's cache and its tokens); off "
                    "without it")
        ->check(CLI::ExistingDirectory);
    cmd->add_option("--reasoning-format", f->reasoning_format,
                    "Chat replies of a thinking prompt: deepseek (the reasoning in reasoning_content, the answer in "
                    "content; default) or none (all of it in content)")
        ->check(CLI::IsMember({"deepseek", "none"}));
    cmd->add_option("--max-queue", f->max_queue, "Requests that may wait for a slot; more get HTTP 429")
        ->check(CLI::Range(int64_t(1), int64_t(4096)));
    cmd->add_option("--prefill-chunk", f->prefill_chunk,
                    "Most tokens per step while requests generate (0 = the ubatch size): a long prompt is read in "
                    "chunks and the running streams get a token after each")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
    cmd->add_option("--max-body", f->max_body_bytes, "Largest request body in bytes")
        ->check(CLI::Range(int64_t(1024), int64_t(1) << 30));
    cmd->add_option("--http-threads", f->http_threads, "HTTP worker threads (0 = slots + queue + 8)")
        ->check(CLI::Range(0, 4096));
    cmd->add_flag("-v,--verbose", f->verbose, "Log every request");
    return [f] { return serve(*f); };
}

}  // namespace sparrow::tools
