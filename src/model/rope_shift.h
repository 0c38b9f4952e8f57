// Position shifts of stored keys (Context::seq_add / seq_div): RoPE is a rotation by an angle linear in the
// position, so a key stored at position p moves to p + delta by rotating it once more by delta, with the
// same frequencies but unit magnitude (the stored key already carries any YaRN magnitude).
#pragma once

#include <cstdint>
#include <span>

#include "cache/row_store.h"
#include "kernels/ops.h"

namespace sparrow {

// Within each row of `store` at cells[i], the n_heads heads of head_dim elements starting at element
// `offset` are rotated by deltas[i] positions with `params`'s frequencies and layout (its first n_rot
// elements of each head). Rows are read and written through RowStore::read/write.
void shift_stored_rope(RowStore &store, std::span<const int32_t> cells, std::span<const int32_t> deltas, int64_t offset,
                       int64_t n_heads, int64_t head_dim, const RopeParams &params);

}  // namespace sparrow
