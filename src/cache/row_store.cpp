#include "cache/row_store.h"

#include "core/error.h"

namespace sparrow {

RowStore::RowStore(DType type, int64_t n_cells, int64_t width)
    : type_(type),
      width_(width),
      row_bytes_(dtype_row_size(type, width)),
      data_(static_cast<size_t>(n_cells * dtype_row_size(type, width))) {
    SPARROW_ASSERT(type == DType::F32 || type == DType::F16 || type == DType::BF16);
}

void RowStore::write(int64_t cell, const float *src) {
    quantize_row(type_, src, data_.data() + cell * row_bytes_, width_);
}

}  // namespace sparrow
