// `sparrow make-model`: writes a tiny random-weight model of a supported architecture.
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "model/synthetic.h"

namespace sparrow::tools {

Command register_make_model(CLI::App &app) {
    auto *cmd = app.add_subcommand("make-model", "Write a tiny random-weight model (GGUF) for tests and benchmarks");
    auto p = std::make_shared<SyntheticParams>();
    auto out = std::make_shared<std::string>();
    auto type = std::make_shared<std::string>("f32");
    cmd->add_option("--arch", p->arch, "Architecture")->check(CLI::IsMember({"llama"}));
    cmd->add_option("-o,--output", *out, "Output file")->required();
    cmd->add_option("--type", *type, "Weight type: f32, f16, bf16, q8_0, q4_0")
        ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0"}));
    cmd->add_option("--n-vocab", p->n_vocab, "Vocabulary size (byte-level BPE)")->check(CLI::Range(258, 1 << 20));
    cmd->add_option("--n-embd", p->n_embd, "Embedding width")->check(CLI::Range(2, 1 << 16));
    cmd->add_option("--n-layer", p->n_layer, "Layers")->check(CLI::Range(1, 1024));
    cmd->add_option("--n-head", p->n_head, "Attention heads")->check(CLI::Range(1, 1024));
    cmd->add_option("--n-head-kv", p->n_head_kv, "KV heads")->check(CLI::Range(1, 1024));
    cmd->add_option("--n-ff", p->n_ff, "Feed-forward width")->check(CLI::Range(1, 1 << 20));
    cmd->add_option("--n-ctx-train", p->n_ctx_train, "Training context written to the metadata")
        ->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--seed", p->seed, "Random seed");
    cmd->add_flag("--tied-output", p->tied_output, "No output.weight: the output reuses token_embd");
    return [p, out, type] {
        p->type = *dtype_from_name(*type);
        write_synthetic_model(*p, *out);
        std::fprintf(stderr, "wrote %s (%s, %lld layers, n_embd %lld, vocab %lld, %s)\n", out->c_str(), p->arch.c_str(),
                     (long long)p->n_layer, (long long)p->n_embd, (long long)p->n_vocab, type->c_str());
        return 0;
    };
}

}  // namespace sparrow::tools
