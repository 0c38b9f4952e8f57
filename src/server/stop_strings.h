// Stop strings over streamed text: where generation must end, and how much of the text so far can be sent
// without ever sending part of a stop string (or half of a UTF-8 character).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sparrow::server {

struct StopScan {
    static constexpr size_t npos = std::string_view::npos;
    size_t stop_at = npos;  // byte offset where the earliest stop string starts, or npos
    size_t safe_end = 0;    // when no stop matched: text[from, safe_end) can be sent now
};

// Scans text[from, ...) (from = what was sent already; nothing before it can start a stop string, since
// the held-back tail is always a possible stop-string prefix). Empty stop strings are ignored.
StopScan scan_stop_strings(std::string_view text, size_t from, const std::vector<std::string> &stops);

}  // namespace sparrow::server
