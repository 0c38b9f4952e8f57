#include "model/model.h"

#include "core/error.h"
#include "runtime/tokenizer.h"

namespace sparrow {

Model::Model(const std::string &path) : file_(gguf::File::open(path)) {
    info_.arch = file_.get_string("general.architecture", "");
    if (info_.arch.empty()) throw_error("%s: metadata key 'general.architecture' is missing", path.c_str());
    info_.name = file_.get_string("general.name", "");
    WeightLoader weights(file_);
    arch_ = create_arch_model(file_, weights, info_);
    info_.n_params = weights.n_params();
    info_.n_weight_bytes = weights.n_bytes();
    info_.weight_types = weights.matrix_types();
    tokenizer_ = std::make_unique<Tokenizer>(file_);
    if (tokenizer_->n_vocab() != info_.n_vocab) {
        throw_error("%s: the tokenizer has %lld tokens but the model's vocabulary is %lld", path.c_str(),
                    (long long)tokenizer_->n_vocab(), (long long)info_.n_vocab);
    }
}

Model::~Model() = default;

std::shared_ptr<const Model> load_model(const std::string &path) { return std::make_shared<Model>(path); }
const ModelInfo &model_info(const Model &model) { return model.info(); }
const Tokenizer &model_tokenizer(const Model &model) { return model.tokenizer(); }

}  // namespace sparrow
