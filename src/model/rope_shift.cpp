#include "model/rope_shift.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace sparrow {

void shift_stored_rope(RowStore &store, std::span<const int32_t> cells, std::span<const int32_t> deltas, int64_t offset,
                       int64_t n_heads, int64_t head_dim, const RopeParams &params) {
    SPARROW_ASSERT(cells.size() == deltas.size() && offset + n_heads * head_dim <= store.width());
    // rope() scales by mscale = attn_factor (times YaRN's 1 + 0.1 ln(1/freq_scale)); choose attn_factor so
    // that the extra rotation has unit magnitude.
    RopeParams unit = params;
    unit.attn_factor = params.ext_factor != 0.0f ? 1.0f / (1.0f + 0.1f * std::log(1.0f / params.freq_scale)) : 1.0f;
    const RopeTable table(unit);
    std::vector<float> row(static_cast<size_t>(store.width()));
    for (size_t i = 0; i < cells.size(); ++i) {
        if (deltas[i] == 0) continue;
        store.read(cells[i], row.data());
        rope(row.data() + offset, 1, n_heads, head_dim, &deltas[i], table);
        store.write(cells[i], row.data());
    }
}

}  // namespace sparrow
