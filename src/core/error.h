// Errors: user-facing problems (bad files, bad flags, bad shapes) throw sparrow::Error with a message that
// names what was wrong; the CLI and server catch it at their boundary. SPARROW_ASSERT guards internal
// invariants only and stays on in release builds.
#pragma once

#include <stdexcept>
#include <string>

namespace sparrow {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string &message) : std::runtime_error(message) {}
};

// printf-style formatting into a std::string (GCC 12 has no <format>).
std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void throw_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void assert_fail(const char *expr, const char *file, int line);

}  // namespace sparrow

#define SPARROW_ASSERT(cond) ((cond) ? static_cast<void>(0) : ::sparrow::assert_fail(#cond, __FILE__, __LINE__))
