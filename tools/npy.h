// Writes float32 arrays as numpy .npy files (format version 1.0), for comparing logits with references.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace sparrow::tools {

void write_npy_f32(const std::string &path, std::span<const float> data, const std::vector<int64_t> &shape);

}  // namespace sparrow::tools
