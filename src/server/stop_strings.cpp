#include "server/stop_strings.h"

#include <algorithm>

#include "runtime/tokenizer.h"

namespace sparrow::server {

StopScan scan_stop_strings(std::string_view text, size_t from, const std::vector<std::string> &stops) {
    StopScan scan;
    from = std::min(from, text.size());
    for (const std::string &stop : stops) {
        if (stop.empty()) continue;
        const size_t at = text.find(stop, from);
        if (at != std::string_view::npos && at < scan.stop_at) scan.stop_at = at;
    }
    if (scan.stop_at != StopScan::npos) return scan;
    // Hold back the longest tail of the text that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const std::string &stop : stops) hold = std::max(hold, marker_prefix_at_end(text.substr(from), stop));
    const std::string_view sendable = text.substr(from, text.size() - from - hold);
    scan.safe_end = from + utf8_complete_prefix(sendable);
    return scan;
}

}  // namespace sparrow::server
