#include "model/weights.h"

#include <algorithm>

#include "core/error.h"

namespace sparrow {

namespace {
std::string shape_string(const std::vector<int64_t> &ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}
}  // namespace

const gguf::TensorInfo &WeightLoader::take(const std::string &name, const std::vector<int64_t> &ne) {
    const gguf::TensorInfo *t = file_.find_tensor(name);
    if (!t) throw_error("%s: tensor '%s' is missing", file_.name().c_str(), name.c_str());
    if (t->ne != ne) {
        throw_error("%s: tensor '%s' has shape %s, expected %s", file_.name().c_str(), name.c_str(),
                    t->shape_string().c_str(), shape_string(ne).c_str());
    }
    if (!dtype_is_supported(t->type)) {
        throw_error(
            "%s: tensor '%s' has type %s, which sparrow cannot compute with (supported: f32, f16, bf16, "
            "q8_0, q4_0)",
            file_.name().c_str(), name.c_str(), std::string(dtype_name(t->type)).c_str());
    }
    if (used_.insert(name).second) {
        n_params_ += t->n_elements;
        n_bytes_ += t->n_bytes;
    }
    return *t;
}

WeightMatrix WeightLoader::matrix(const std::string &name, int64_t n_cols, int64_t n_rows) {
    const gguf::TensorInfo &t = take(name, {n_cols, n_rows});
    note_matrix_type(t.type);
    return WeightMatrix{t.type, t.data, n_rows, n_cols, dtype_row_size(t.type, n_cols)};
}

WeightMatrix WeightLoader::matrix_stack(const std::string &name, int64_t n_cols, int64_t n_rows, int64_t n_mats) {
    const gguf::TensorInfo &t = take(name, {n_cols, n_rows, n_mats});
    note_matrix_type(t.type);
    return WeightMatrix{t.type, t.data, n_rows * n_mats, n_cols, dtype_row_size(t.type, n_cols)};
}

const float *WeightLoader::vector(const std::string &name, int64_t n) {
    const gguf::TensorInfo &t = take(name, {n});
    if (t.type == DType::F32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
        return reinterpret_cast<const float *>(t.data);
    }
    auto &copy = converted_.emplace_back(static_cast<size_t>(n));
    dequantize_row(t.type, t.data, copy.data(), n);
    return copy.data();
}

void WeightLoader::note_matrix_type(DType type) {
    const std::string name(dtype_name(type));
    if (std::find(matrix_types_.begin(), matrix_types_.end(), name) == matrix_types_.end()) {
        matrix_types_.push_back(name);
    }
}

std::string WeightLoader::matrix_types() const {
    std::string s;
    for (const auto &t : matrix_types_) s += (s.empty() ? "" : ", ") + t;
    return s;
}

std::vector<std::string> WeightLoader::unused_tensors() const {
    std::vector<std::string> out;
    for (const auto &t : file_.tensors()) {
        if (!used_.count(t.name)) out.push_back(t.name);
    }
    return out;
}

}  // namespace sparrow
