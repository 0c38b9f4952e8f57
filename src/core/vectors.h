// Small helpers for std::vector buffers that are kept and reused between calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparrow {

// Grows v to at least n elements (new ones value-initialised) and never shrinks it: a buffer sized for the
// largest call so far, whose first n elements the caller then uses.
template <typename T>
void grow_to(std::vector<T> &v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
}

}  // namespace sparrow
