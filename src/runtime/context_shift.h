// How many leading positions a context shift keeps (Context::context_shift does the shift itself).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

namespace sparrow {

// llama.cpp's count for `run --context-shift --keep N` and the server's n_keep: a BOS the prompt starts with always
// stays, then N more of its tokens (-1: all of them), never more than the prompt.
inline int64_t context_shift_keep(std::span<const int32_t> prompt, int32_t bos_id, int64_t n_keep) {
    const auto n_prompt = static_cast<int64_t>(prompt.size());
    const int64_t bos = !prompt.empty() && bos_id >= 0 && prompt.front() == bos_id ? 1 : 0;
    return n_keep < 0 ? n_prompt : std::min(n_keep + bos, n_prompt);
}

}  // namespace sparrow
