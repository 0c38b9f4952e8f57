// Looks up a model's tensors by name and checks each one's type and shape as it is taken, so a wrong file
// fails at load with the tensor, the expected shape and the actual shape in the message.
#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/ops.h"

namespace sparrow {

class WeightLoader {
  public:
    explicit WeightLoader(const gguf::File &file) : file_(file) {}

    // A weight matrix [n_rows, n_cols] (GGUF ne = {n_cols, n_rows}) of a type the kernels compute with.
    WeightMatrix matrix(const std::string &name, int64_t n_cols, int64_t n_rows);
    // A stack of n_mats matrices [n_rows, n_cols] (GGUF ne = {n_cols, n_rows, n_mats}), returned as one
    // matrix of n_mats * n_rows rows: matrix m is the row block [m * n_rows, (m + 1) * n_rows).
    WeightMatrix matrix_stack(const std::string &name, int64_t n_cols, int64_t n_rows, int64_t n_mats);
    bool has(const std::string &name) const { return file_.find_tensor(name) != nullptr; }
    // A vector of n floats: used in place when stored as f32, else converted once into owned memory.
    const float *vector(const std::string &name, int64_t n);

    int64_t n_params() const { return n_params_; }
    int64_t n_bytes() const { return n_bytes_; }
    // Types of the matrices taken, e.g. "q8_0" or "q8_0, f32".
    std::string matrix_types() const;
    // Tensors in the file that the model never asked for.
    std::vector<std::string> unused_tensors() const;

  private:
    const gguf::TensorInfo &take(const std::string &name, const std::vector<int64_t> &ne);
    void note_matrix_type(DType type);

    const gguf::File &file_;
    std::deque<std::vector<float>> converted_;  // owned f32 copies; a deque keeps pointers stable
    std::set<std::string> used_;
    std::vector<std::string> matrix_types_;
    int64_t n_params_ = 0;
    int64_t n_bytes_ = 0;
};

}  // namespace sparrow
