// Errors: user-facing problems (bad files, bad flags, bad shapes) throw sparrow::Error with a message that
// names what was wrong; the CLI and server catch it at their boundary. SPARROW_ASSERT guards internal
// invariants only and stays on in release builds.
#pragma once

#include <stdexcept>
#include <string>

namespace sparrow {

// What kind of problem an Error reports, so that a server can map it to a status (e.g. HTTP 400 for a
// bad request, 503 when the context is full) without parsing messages.
enum class ErrorCode {
    generic,         // anything not listed below (bad files, bad flags, shapes)
    invalid_batch,   // a batch that can never be decoded: empty, too large, bad position, duplicate
    bad_token,       // a token id outside the vocabulary
    bad_sequence,    // a sequence id outside [0, kMaxSequences)
    position_order,  // a position not after the last one its sequence holds (in the cache or the batch)
    context_full,    // not enough free cache cells (retry after freeing some)
    state_file,      // a sequence state file that cannot be read, is corrupt or belongs to another model
};
const char *error_code_name(ErrorCode code);

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string &message, ErrorCode code = ErrorCode::generic)
        : std::runtime_error(message), code_(code) {}
    ErrorCode code() const { return code_; }

  private:
    ErrorCode code_;
};

// printf-style formatting into a std::string (GCC 12 has no <format>).
std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void throw_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// The same with an error code.
[[noreturn]] void throw_error_code(ErrorCode code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

[[noreturn]] void assert_fail(const char *expr, const char *file, int line);

}  // namespace sparrow

#define SPARROW_ASSERT(cond) ((cond) ? static_cast<void>(0) : ::sparrow::assert_fail(#cond, __FILE__, __LINE__))
