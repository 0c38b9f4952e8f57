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

void assert_fail(const char *expr, const char *file, int line) {
    std::fprintf(stderr, "sparrow: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    std::abort();
}

}  // namespace sparrow
