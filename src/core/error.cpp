#include "core/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace sparrow {

__attribute__((format(printf, 1, 0))) static std::string vstrprintf(const char *fmt, va_list args) {
    va_list copy;
    va_copy(copy, args);
    const int n = std::vsnprintf(nullptr, 0, fmt, copy);
    va_end(copy);
    if (n <= 0) return {};
    std::string out(static_cast<size_t>(n), '\0');
    std::vsnprintf(out.data(), out.size() + 1, fmt, args);
    return out;
}

std::string strprintf(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::string out = vstrprintf(fmt, args);
    va_end(args);
    return out;
}

void throw_error(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::string message = vstrprintf(fmt, args);
    va_end(args);
    throw Error(message);
}

void throw_error_code(ErrorCode code, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::string message = vstrprintf(fmt, args);
    va_end(args);
    throw Error(message, code);
}

const char *error_code_name(ErrorCode code) {
    switch (code) {
        case ErrorCode::generic: return "generic";
        case ErrorCode::invalid_batch: return "invalid_batch";
        case ErrorCode::bad_token: return "bad_token";
        case ErrorCode::bad_sequence: return "bad_sequence";
        case ErrorCode::position_order: return "position_order";
        case ErrorCode::context_full: return "context_full";
        case ErrorCode::state_file: return "state_file";
    }
    return "?";
}

void assert_fail(const char *expr, const char *file, int line) {
    std::fprintf(stderr, "sparrow: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    std::abort();
}

}  // namespace sparrow
