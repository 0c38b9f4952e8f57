#include "server/api_common.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace sparrow::tools::http {

const char *error_type_for_status(int status) {
    switch (status) {
        case 401: return "authentication_error";
        case 403: return "permission_error";
        case 404: return "not_found_error";
        case 413: return "request_too_large";
        case 429: return "rate_limit_error";
        case 501: return "not_supported_error";
        case 503: return "unavailable_error";
        default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

namespace {
// The request field a message is about: every message on a field opens with its path in single quotes ("'top_p'
// must be in [0, 1]", "'messages[2].role' must be a string"); other messages name none.
json param_of(const std::string &message) {
    if (message.size() < 3 || message[0] != '\'') return nullptr;
    const size_t end = message.find('\'', 1);
    if (end == std::string::npos || end == 1) return nullptr;
    const std::string name = message.substr(1, end - 1);
    const bool plain = std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' || c == ']';
    });
    return plain ? json(name) : json(nullptr);
}
}  // namespace

json error_body(int status, const std::string &message, const std::string &code) {
    // OpenAI's error object: message, type, param (the offending field, or null), code.
    return {{"error",
             {{"message", message},
              {"type", error_type_for_status(status)},
              {"param", param_of(message)},
              {"code", code}}}};
}

void send_error(httplib::Response &res, int status, const std::string &message, const std::string &code) {
    send_json(res, error_body(status, message, code), status);
}

std::string dump_json(const json &j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_json(httplib::Response &res, const json &j, int status) {
    res.status = status;
    res.set_content(dump_json(j), "application/json");
}

json parse_body(const httplib::Request &req) {
    json j;
    try {
        j = json::parse(req.body);
    } catch (const json::exception &e) {  // parse_error, and out_of_range for numbers like 1e999
        throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what(), "invalid_json");
    }
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object", "invalid_json");
    return j;
}

namespace {
const json *field(const json &obj, const char *key) {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}
}  // namespace

std::string field_path(const std::string &parent, const char *key) {
    return parent.empty() ? std::string(key) : parent + "." + key;
}

std::optional<bool> get_bool(const json &obj, const char *key, const std::string &parent) {
    const json *v = field(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
        throw ApiError(400, strprintf("'%s' must be a boolean", field_path(parent, key).c_str()), "invalid_type");
    return v->get<bool>();
}

std::optional<double> get_number(const json &obj, const char *key, double lo, double hi, const std::string &parent) {
    const json *v = field(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_number())
        throw ApiError(400, strprintf("'%s' must be a number", field_path(parent, key).c_str()), "invalid_type");
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) {
        throw ApiError(400, strprintf("'%s' must be in [%g, %g]", field_path(parent, key).c_str(), lo, hi),
                       "invalid_value");
    }
    return x;
}

std::optional<int64_t> get_int(const json &obj, const char *key, int64_t lo, int64_t hi, const std::string &parent) {
    const json *v = field(obj, key);
    if (!v) return std::nullopt;
    int64_t x = 0;
    if (v->is_number_integer() && !v->is_number_unsigned()) {
        x = v->get<int64_t>();
    } else if (v->is_number_unsigned()) {
        const uint64_t u = v->get<uint64_t>();
        x = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
    } else if (const double d = v->is_number_float() ? v->get<double>() : 0.5;
               d == std::trunc(d) && std::fabs(d) < 9.0e15) {
        x = static_cast<int64_t>(d);  // 3.0: what Python's json writes for an integer-valued float (inf and NaN fail)
    } else {
        throw ApiError(400, strprintf("'%s' must be an integer", field_path(parent, key).c_str()), "invalid_type");
    }
    if (x < lo || x > hi) {
        throw ApiError(
            400,
            strprintf("'%s' must be in [%lld, %lld]", field_path(parent, key).c_str(), (long long)lo, (long long)hi),
            "invalid_value");
    }
    return x;
}

std::optional<std::string> get_string(const json &obj, const char *key, const std::string &parent) {
    const json *v = field(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_string())
        throw ApiError(400, strprintf("'%s' must be a string", field_path(parent, key).c_str()), "invalid_type");
    return v->get<std::string>();
}

int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace sparrow::tools::http
