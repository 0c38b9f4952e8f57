// Looks up a model's tensors by name and checks each one's type and shape as it is taken, so a wrong file
// fails at load with the tensor, the expected shape and the actual shape in the message.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/page_arena.h"
#include "gguf/gguf.h"
#include "kernels/ops.h"

namespace sparrow {

class WeightLoader {
  public:
    // repack: Q8_0, Q4_0 and K-quant matrices whose rows (per matrix of a stack) come in multiples of 8 are packed
    // eight rows to a record (kernels/ops.h) into memory this loader owns, and the file's pages they came from are
    // given back to the kernel (a later read maps them in again). The loader must outlive the matrices.
    // The packing itself waits for pack(): a matrix taken is only placed, so that a file the model then refuses
    // (a tensor missing from its last layer, one nobody reads, a vocabulary that does not match) fails in
    // milliseconds rather than after packing every weight before it (minutes and tens of GB on a real model).
    explicit WeightLoader(const gguf::File &file, bool repack = false) : file_(file), repack_(repack) {}

    // A weight matrix [n_rows, n_cols] (GGUF ne = {n_cols, n_rows}) of a type the kernels compute with.
    WeightMatrix matrix(const std::string &name, int64_t n_cols, int64_t n_rows);
    // A stack of n_mats matrices [n_rows, n_cols] (GGUF ne = {n_cols, n_rows, n_mats}), returned as one
    // matrix of n_mats * n_rows rows: matrix m is the row block [m * n_rows, (m + 1) * n_rows).
    WeightMatrix matrix_stack(const std::string &name, int64_t n_cols, int64_t n_rows, int64_t n_mats);
    // A stack of n_mats matrices each made of n_parts matrices [n_rows, n_cols] one after the other (GGUF ne =
    // {n_cols, n_parts * n_rows, n_mats}: llama.cpp's fused ffn_gate_up_exps, gate rows then up rows per expert),
    // returned as one matrix of n_mats * n_parts * n_rows rows: part p of matrix m is row block m * n_parts + p.
    WeightMatrix matrix_stack_parts(const std::string &name, int64_t n_cols, int64_t n_rows, int64_t n_parts,
                                    int64_t n_mats);
    bool has(const std::string &name) const { return file_.find_tensor(name) != nullptr; }
    // A vector of n floats: used in place when stored as f32, else converted once into owned memory.
    const float *vector(const std::string &name, int64_t n);

    // Packs every matrix taken so far into the place its WeightMatrix points to; until then a packed matrix's
    // bytes are not its weights. Call once the model has taken everything it reads and the file is accepted.
    void pack();

    int64_t n_params() const { return n_params_; }
    int64_t n_bytes() const { return n_bytes_; }
    int64_t n_repacked_bytes() const { return n_repacked_bytes_; }
    // Types of the matrices taken, e.g. "q8_0" or "q8_0, f32".
    std::string matrix_types() const;
    // Tensors in the file that the model never asked for.
    std::vector<std::string> unused_tensors() const;

  private:
    const gguf::TensorInfo &take(const std::string &name, const std::vector<int64_t> &ne);
    void note_matrix_type(DType type);
    // The matrix of tensor t, [n_mats * rows_per_mat, n_cols], packed when repacking applies.
    WeightMatrix weight_matrix(const gguf::TensorInfo &t, int64_t n_cols, int64_t rows_per_mat, int64_t n_mats);

    const gguf::File &file_;
    const bool repack_;
    std::deque<std::vector<float>> converted_;  // owned f32 copies; a deque keeps pointers stable
    PageArena packed_;  // the packed matrices; reserved at the first, for every packable tensor of the file
    std::map<std::string, WeightMatrix> by_name_;  // matrices placed for packing (a tied output asks twice)
    struct PendingPack {
        DType type;
        const void *src;
        int64_t n_rows, n_cols;
        uint8_t *dst;
    };
    std::vector<PendingPack> pending_;  // placed, packed by pack()
    std::set<std::string> used_;
    std::vector<std::string> matrix_types_;
    int64_t n_params_ = 0;
    int64_t n_bytes_ = 0;
    int64_t n_repacked_bytes_ = 0;
};

}  // namespace sparrow
