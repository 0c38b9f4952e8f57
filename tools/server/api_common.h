// Helpers shared by the server's HTTP handlers: the OpenAI error shape, typed reads of request fields with
// range checks, and JSON replies. Every client mistake becomes an ApiError (a 4xx reply), never a crash.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

namespace sparrow::tools::http {

using json = nlohmann::json;

// A reply in OpenAI's error shape: {"error": {"message", "type", "code"}}.
class ApiError : public std::runtime_error {
  public:
    ApiError(int status, const std::string &message, std::string code = "invalid_request")
        : std::runtime_error(message), status_(status), code_(std::move(code)) {}
    int status() const { return status_; }
    const std::string &code() const { return code_; }

  private:
    int status_;
    std::string code_;
};

// "invalid_request_error", "authentication_error", ... for a status.
const char *error_type_for_status(int status);
json error_body(int status, const std::string &message, const std::string &code);
void send_error(httplib::Response &res, int status, const std::string &message, const std::string &code);

// Serialises with invalid UTF-8 (partial characters at a token boundary) replaced, so a reply never throws.
std::string dump_json(const json &j);
void send_json(httplib::Response &res, const json &j, int status = 200);

// The body as a JSON object; ApiError 400 when it is not one.
json parse_body(const httplib::Request &req);

// Optional fields: absent or null gives nullopt; a wrong type or a value outside [lo, hi] is ApiError 400.
// `parent` is the path of obj in the body when obj is nested ("stream_options", "messages[2]"): the error
// names the field by its whole path ('messages[2].role'), which is also the error's param.
std::optional<bool> get_bool(const json &obj, const char *key, const std::string &parent = {});
std::optional<double> get_number(const json &obj, const char *key, double lo, double hi,
                                 const std::string &parent = {});
std::optional<int64_t> get_int(const json &obj, const char *key, int64_t lo, int64_t hi,
                               const std::string &parent = {});
std::optional<std::string> get_string(const json &obj, const char *key, const std::string &parent = {});

// The path of a field for messages and param: "key", or "parent.key".
std::string field_path(const std::string &parent, const char *key);

// Unix time in seconds (the "created" field).
int64_t unix_time();

}  // namespace sparrow::tools::http
