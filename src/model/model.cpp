#include "model/model.h"

#include "core/error.h"
#include "runtime/tokenizer.h"

namespace sparrow {

Model::Model(const std::string &path, const ModelParams &params) : file_(gguf::File::open(path)) {
    info_.arch = file_.get_string("general.architecture", "");
    if (info_.arch.empty()) throw_error("%s: metadata key 'general.architecture' is missing", path.c_str());
    info_.name = file_.get_string("general.name", "");
    weights_ = std::make_unique<WeightLoader>(file_, params.repack);
    arch_ = create_arch_model(file_, *weights_, info_);
    info_.n_params = weights_->n_params();
    info_.n_weight_bytes = weights_->n_bytes();
    info_.n_repacked_bytes = weights_->n_repacked_bytes();
    info_.weight_types = weights_->matrix_types();
    tokenizer_ = std::make_unique<Tokenizer>(file_);
    if (tokenizer_->n_vocab() != info_.n_vocab) {
        throw_error("%s: the tokenizer has %lld tokens but the model's vocabulary is %lld", path.c_str(),
                    (long long)tokenizer_->n_vocab(), (long long)info_.n_vocab);
    }
}

Model::~Model() = default;

std::shared_ptr<const Model> load_model(const std::string &path, const ModelParams &params) {
    return std::make_shared<Model>(path, params);
}
const ModelInfo &model_info(const Model &model) { return model.info(); }
const Tokenizer &model_tokenizer(const Model &model) { return model.tokenizer(); }

}  // namespace sparrow
