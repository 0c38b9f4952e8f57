// A loaded model: the mapped GGUF file, its description, its tokenizer and its architecture.
#pragma once

#include <memory>

#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/weights.h"
#include "sparrow/sparrow.h"

namespace sparrow {

class Model {
  public:
    explicit Model(const std::string &path, const ModelParams &params = {});
    ~Model();

    const gguf::File &file() const { return file_; }
    const ModelInfo &info() const { return info_; }
    const ArchModel &arch() const { return *arch_; }
    const Tokenizer &tokenizer() const { return *tokenizer_; }

  private:
    // Whether the file's Q8_0 weights may be repacked within params' memory limit; sets info_.repack_note
    // when not.
    bool repack_fits(const ModelParams &params);
    // Throws when the file holds tensors the architecture neither read nor leaves unread on purpose.
    void refuse_unread_tensors() const;

    gguf::File file_;
    ModelInfo info_;
    // Owns what the weights did not map: converted vectors and repacked matrices (the architecture points
    // into it, so it is declared before arch_ and outlives it).
    std::unique_ptr<WeightLoader> weights_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::unique_ptr<ArchModel> arch_;
};

}  // namespace sparrow
