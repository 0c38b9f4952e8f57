// Tiny random-weight models of each supported architecture, written as GGUF files with the metadata keys
// and tensor names llama.cpp uses, so the same file loads in both engines. For tests and benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace sparrow {

struct SyntheticVocab {
    std::vector<std::string> tokens;
    std::vector<int32_t> token_types;  // 1 normal, 3 control, 4 user-defined
    std::vector<std::string> merges;   // "a b", in rank order
    int32_t bos_id = 0;
    int32_t eos_id = 0;
};
SyntheticVocab make_synthetic_vocab(int64_t n_vocab);

struct SyntheticParams {
    std::string arch = "llama";
    int64_t n_vocab = 512;
    int64_t n_embd = 64;
    int64_t n_layer = 2;
    int64_t n_head = 4;
    int64_t n_head_kv = 2;
    int64_t n_ff = 128;
    int64_t n_ctx_train = 2048;
    DType type = DType::F32;  // type of the 2-D weights (rows not a multiple of its block size stay f32)
    uint64_t seed = 42;
    bool tied_output = false;
};

// Writes the model; throws sparrow::Error for inconsistent parameters or an unsupported architecture.
void write_synthetic_model(const SyntheticParams &params, const std::string &path);

}  // namespace sparrow
