#include "model/model.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/error.h"
#include "kernels/ops.h"
#include "runtime/tokenizer.h"

namespace sparrow {

namespace {

// Bytes of memory the system reports available (MemAvailable), or -1 when it cannot be read.
int64_t available_memory_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string key;
    int64_t kib = 0;
    std::string unit;
    while (f >> key >> kib >> unit) {
        if (key == "MemAvailable:") return kib * 1024;
    }
    return -1;
}

}  // namespace

bool Model::repack_fits(const ModelParams &params) {
    int64_t q8_bytes = 0;  // the types packs_rows8 packs
    for (const gguf::TensorInfo &t : file_.tensors()) {
        if (packs_rows8(t.type)) q8_bytes += t.n_bytes;
    }
    int64_t limit = params.repack_memory_limit;
    if (limit < 0) {
        const int64_t available = available_memory_bytes();
        if (available < 0) return true;  // nothing to go by: repack, as on any machine that can hold it
        limit = available / 4 * 3;
    }
    if (q8_bytes <= limit) return true;
    char note[200];
    std::snprintf(note, sizeof note,
                  "not repacked: %.1f GiB of q8_0/q4_0/K-quant weights against %.1f GiB allowed (3/4 of the "
                  "available memory); mapped as stored instead",
                  q8_bytes / 1073741824.0, limit / 1073741824.0);
    info_.repack_note = note;
    return false;
}

Model::Model(const std::string &path, const ModelParams &params) : file_(gguf::File::open(path)) {
    info_.arch = file_.get_string("general.architecture", "");
    if (info_.arch.empty()) throw_error("%s: metadata key 'general.architecture' is missing", path.c_str());
    info_.name = file_.get_string("general.name", "");
    weights_ = std::make_unique<WeightLoader>(file_, params.repack && repack_fits(params));
    arch_ = create_arch_model(file_, *weights_, info_);
    refuse_unread_tensors();
    info_.n_params = weights_->n_params();
    info_.n_weight_bytes = weights_->n_bytes();
    info_.n_repacked_bytes = weights_->n_repacked_bytes();
    info_.weight_types = weights_->matrix_types();
    tokenizer_ = std::make_unique<Tokenizer>(file_);
    if (tokenizer_->n_vocab() != info_.n_vocab) {
        throw_error("%s: the tokenizer has %lld tokens but the model's vocabulary is %lld", path.c_str(),
                    (long long)tokenizer_->n_vocab(), (long long)info_.n_vocab);
    }
    // Every check has passed: only now the (long) packing of the weights.
    weights_->pack();
}

// A tensor the architecture neither read nor knows to leave unread is part of some other model (an attention
// bias, an expert layout sparrow does not run, a layer the file does not have): computing without it would give
// another model's output. So the file is refused, naming such tensors, as llama.cpp refuses a file whose tensor
// count differs from what it loads.
void Model::refuse_unread_tensors() const {
    std::vector<std::string> unread;
    for (std::string &name : weights_->unused_tensors()) {
        if (!arch_->leaves_unread(name)) unread.push_back(std::move(name));
    }
    if (unread.empty()) return;
    constexpr size_t kNamed = 4;
    std::string names;
    for (size_t i = 0; i < std::min(unread.size(), kNamed); ++i) names += (i ? ", " : "") + unread[i];
    if (unread.size() > kNamed) names += strprintf(" and %zu more", unread.size() - kNamed);
    throw_error("%s: %zu tensor%s that a %s model does not have (%s); sparrow would compute without %s",
                file_.name().c_str(), unread.size(), unread.size() == 1 ? "" : "s", info_.arch.c_str(), names.c_str(),
                unread.size() == 1 ? "it" : "them");
}

Model::~Model() = default;

std::shared_ptr<const Model> load_model(const std::string &path, const ModelParams &params) {
    try {
        return std::make_shared<Model>(path, params);
    } catch (const Error &e) {
        // Messages from the metadata getters and the vocabulary name the key; every load error names the file.
        const std::string what = e.what();
        if (what.starts_with(path)) throw;
        throw Error(path + ": " + what, e.code());
    }
}
const ModelInfo &model_info(const Model &model) { return model.info(); }
const Tokenizer &model_tokenizer(const Model &model) { return model.tokenizer(); }

}  // namespace sparrow
