// Stop strings over streamed text: where generation must end, and how much of the text so far can be sent
// without ever sending part of a stop string (or half of a UTF-8 character).
#pragma once

#include <algorithm>
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

// The length of the longest end of `text` that is a proper beginning of `marker` (0 if none, or if marker is empty):
// what a stream holds back while a stop string, a tag or a block's opening may be arriving. Inline, so that the
// readers of streamed text (reasoning_split.cpp, tool_calls.cpp) need no more than this header.
inline size_t marker_prefix_at_end(std::string_view text, std::string_view marker) {
    if (marker.empty()) return 0;
    for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
        if (marker.starts_with(text.substr(text.size() - n))) return n;
    }
    return 0;
}

}  // namespace sparrow::server
