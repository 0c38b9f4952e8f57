// Software prefetch of a byte range, for rows the hardware prefetcher cannot guess (gathered from anywhere in a
// cache store).
#pragma once

#include <cstdint>

namespace sparrow {

// Asks the memory system for every cache line of [p, p + n) that a later read will touch.
inline void prefetch_bytes(const void *p, int64_t n) {
    const auto *b = static_cast<const char *>(p);
    for (int64_t i = 0; i < n; i += 64) __builtin_prefetch(b + i, 0, 3);
}

}  // namespace sparrow
