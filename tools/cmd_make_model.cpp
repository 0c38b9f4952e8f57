// `sparrow make-model`: writes a tiny random-weight model of a supported architecture.
#include <cstdio>
#include <functional>
#include <sstream>

#include "commands.h"
#include "common.h"
#include "core/error.h"
#include "model/synthetic.h"

namespace sparrow::tools {

namespace {

// "1,1,0,1" -> {1, 1, 0, 1}
std::vector<int> parse_int_list(const std::string &s) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty()) continue;
        size_t used = 0;
        int v = 0;
        try {
            v = std::stoi(item, &used);
        } catch (const std::exception &) {
            used = 0;
        }
        if (used != item.size()) throw_error("--indexer-types: '%s' is not an integer", item.c_str());
        out.push_back(v);
    }
    return out;
}

}  // namespace

Command register_make_model(CLI::App &app) {
    auto *cmd = app.add_subcommand("make-model", "Write a tiny random-weight model (GGUF) for tests and benchmarks");
    // Options write into `given`; only those present on the command line override the architecture's
    // (or preset's) defaults, which are known only once --arch and --preset are parsed.
    auto given = std::make_shared<SyntheticParams>();
    auto appliers = std::make_shared<std::vector<std::function<void(SyntheticParams &)>>>();
    auto arch = std::make_shared<std::string>("llama");
    auto preset = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto type = std::make_shared<std::string>();
    auto indexer_types = std::make_shared<std::string>();
    // Flags of one family of architectures: given for the other, they are refused rather than ignored.
    auto dsa_only = std::make_shared<std::vector<CLI::Option *>>();
    auto llama_only = std::make_shared<std::vector<CLI::Option *>>();
    cmd->add_option("--arch", *arch, "Architecture")->check(CLI::IsMember({"llama", "deepseek32", "glm-dsa"}));
    cmd->add_option("--preset", *preset, "Size preset: bench (deepseek32 / glm-dsa: n_embd 2048, 8 layers, q8_0)")
        ->check(CLI::IsMember({"bench"}));
    cmd->add_option("-o,--output", *out, "Output file")->required();
    cmd->add_option(
           "--type", *type,
           "Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, q2_k, q3_k, q4_k, q5_k, q6_k, "
           "iq4_xs, or mxfp4_moe (llama.cpp's MXFP4_MOE: mxfp4 for 3-D stacks, the routed experts and attn_k_b / "
           "attn_v_b, q8_0 elsewhere; deepseek32 / glm-dsa) "
           "(default f32; bench: q8_0). Matrices whose rows the type's blocks do not divide are stored in llama.cpp's "
           "fallback type (K-quants, iq4_xs) or f32")
        ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "q2_k",
                               "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs", "mxfp4_moe"}));

    const auto num = [&](const std::string &name, int64_t SyntheticParams::*field, const std::string &help, int64_t lo,
                         int64_t hi) {
        CLI::Option *o = cmd->add_option(name, (*given).*field, help)->check(CLI::Range(lo, hi));
        appliers->push_back([o, given, field](SyntheticParams &p) {
            if (o->count()) p.*field = (*given).*field;
        });
        return o;
    };
    num("--n-vocab", &SyntheticParams::n_vocab, "Vocabulary size (byte-level BPE)", 258, 1 << 20);
    num("--n-embd", &SyntheticParams::n_embd, "Embedding width", 2, 1 << 16);
    num("--n-layer", &SyntheticParams::n_layer, "Layers (deepseek32 / glm-dsa: without the MTP layers)", 1, 1024);
    num("--n-head", &SyntheticParams::n_head, "Attention heads", 1, 1024);
    llama_only->push_back(num("--n-head-kv", &SyntheticParams::n_head_kv, "KV heads (llama)", 1, 1024));
    num("--n-ff", &SyntheticParams::n_ff, "Feed-forward width (deepseek32 / glm-dsa: the dense layers)", 1, 1 << 20);
    num("--n-ctx-train", &SyntheticParams::n_ctx_train, "Training context written to the metadata", 1, 1 << 24);
    // deepseek32 / glm-dsa
    dsa_only->push_back(
        num("--top-k", &SyntheticParams::idx_top_k, "Indexer top-k (attention.indexer.top_k; default 64)", 1, 1 << 24));
    dsa_only->push_back(
        num("--nextn", &SyntheticParams::n_nextn, "MTP (NextN) layers appended after the others", 0, 16));
    dsa_only->push_back(
        num("--n-dense-lead", &SyntheticParams::n_dense_lead, "Leading dense-FFN layers (default 1)", 0, 1024));
    dsa_only->push_back(num("--n-expert", &SyntheticParams::n_expert, "Routed experts (default 8)", 1, 4096));
    dsa_only->push_back(
        num("--n-expert-used", &SyntheticParams::n_expert_used, "Experts per token (default 2)", 1, 4096));
    dsa_only->push_back(
        num("--n-expert-shared", &SyntheticParams::n_expert_shared, "Shared experts (default 1)", 1, 64));
    dsa_only->push_back(num("--n-ff-exp", &SyntheticParams::n_ff_exp, "Expert width (default 32)", 1, 1 << 20));
    dsa_only->push_back(
        num("--expert-groups", &SyntheticParams::n_expert_groups, "Expert groups (deepseek32 4, glm-dsa 1)", 1, 4096));
    dsa_only->push_back(
        num("--expert-groups-used", &SyntheticParams::n_group_used, "Expert groups kept (deepseek32 2)", 1, 4096));
    dsa_only->push_back(num("--q-lora-rank", &SyntheticParams::q_lora_rank, "MLA q latent (default 32)", 1, 1 << 16));
    dsa_only->push_back(
        num("--kv-lora-rank", &SyntheticParams::kv_lora_rank, "MLA kv latent (default 32)", 1, 1 << 16));
    dsa_only->push_back(
        num("--head-nope", &SyntheticParams::head_nope, "MLA no-rope head dims (default 32)", 1, 1 << 12));
    dsa_only->push_back(
        num("--n-rot", &SyntheticParams::n_rot, "RoPE head dims, MLA and indexer (default 16)", 2, 1 << 12));
    dsa_only->push_back(num("--head-v", &SyntheticParams::head_v, "MLA value head dims (default 32)", 1, 1 << 12));
    dsa_only->push_back(num("--indexer-heads", &SyntheticParams::idx_n_head, "Indexer heads (default 8)", 1, 1024));
    dsa_only->push_back(
        num("--indexer-head-dim", &SyntheticParams::idx_head_dim, "Indexer head dims (default 32)", 2, 1 << 12));
    dsa_only->push_back(
        num("--outlier-channels", &SyntheticParams::outlier_channels,
            "Per layer, this many channels of the MLA latent's c_kv and of the indexer key scaled up by "
            "--outlier-scale and the weights reading them scaled down (same function, outliers in the cache, as "
            "real models have; default 0)",
            0, 1 << 12));
    CLI::Option *gating = cmd->add_option("--gating", given->gating,
                                          "expert_gating_func: 1 softmax, 2 sigmoid, "
                                          "3 softmax over the chosen, 4 sqrt(softplus)")
                              ->check(CLI::Range(1, 4));
    CLI::Option *types_opt =
        cmd->add_option("--indexer-types", *indexer_types,
                        "glm-dsa: 1 (full) / 0 (shared) per layer, e.g. 1,1,1,0; 'absent' omits the key "
                        "(default: the GLM-5.2 pattern 1,1,1,0,0,0,1,...)");
    CLI::Option *outlier_scale =
        cmd->add_option("--outlier-scale", given->outlier_scale, "Factor of the outlier channels (default 30)")
            ->check(finite_in(1.0, 1e4));
    CLI::Option *seed = cmd->add_option("--seed", given->seed, "Random seed");
    cmd->add_flag("--fim-tokens", given->fim_tokens,
                  "Fill-in-the-middle tokens in the vocabulary (llama: named by tokenizer.ggml.fim_*_token_id; "
                  "deepseek32 / glm-dsa: found by their text)");
    CLI::Option *tied =
        cmd->add_flag("--tied-output", given->tied_output, "No output.weight: the output reuses token_embd");
    CLI::Option *yarn = cmd->add_flag("--yarn", given->yarn,
                                      "deepseek32: YaRN rope scaling keys (factor 4 of n_ctx_train / 4, log "
                                      "multiplier 0.1), as V3.2 files carry them (factor 40 of 4096 there)");
    auto no_bias = std::make_shared<bool>(false);  // owned by the returned command, which CLI11 writes into
    CLI::Option *no_bias_opt = cmd->add_flag("--no-probs-bias", *no_bias, "deepseek32 / glm-dsa: no exp_probs_b.bias");
    auto fuse = std::make_shared<bool>(false);
    CLI::Option *fuse_opt =
        cmd->add_flag("--fuse-gate-up-exps", *fuse,
                      "deepseek32 / glm-dsa: the experts' gate and up in one ffn_gate_up_exps tensor (llama.cpp's "
                      "converter flag of that name), with the values the separate tensors would have");

    dsa_only->insert(dsa_only->end(), {gating, types_opt, outlier_scale, yarn, no_bias_opt, fuse_opt});

    return [=] {
        for (const CLI::Option *o : *arch == "llama" ? *dsa_only : *llama_only) {
            if (o->count()) {
                throw_error("make-model: %s applies to %s, not %s", o->get_name().c_str(),
                            *arch == "llama" ? "deepseek32 and glm-dsa" : "llama", arch->c_str());
            }
        }
        SyntheticParams p = synthetic_defaults(*arch, *preset);
        for (const auto &apply : *appliers) apply(p);
        if (gating->count()) p.gating = given->gating;
        if (seed->count()) p.seed = given->seed;
        if (outlier_scale->count()) p.outlier_scale = given->outlier_scale;
        if (tied->count()) p.tied_output = true;
        p.fim_tokens = given->fim_tokens;
        if (yarn->count()) p.yarn = true;
        if (*no_bias) p.probs_bias = false;
        if (*fuse) p.fuse_gate_up_exps = true;
        if (*type == "mxfp4_moe") {
            if (p.arch == "llama")
                throw_error("make-model: --type mxfp4_moe needs an MoE architecture (deepseek32, glm-dsa)");
            p.type = DType::Q8_0;
            p.stack_type = DType::MXFP4;
        } else if (!type->empty()) {
            p.type = *dtype_from_name(*type);
        }
        if (!indexer_types->empty()) {
            if (*indexer_types == "absent") {
                p.indexer_types_absent = true;
            } else {
                p.indexer_types = parse_int_list(*indexer_types);
                if (p.indexer_types.empty()) throw_error("--indexer-types: empty list");
            }
        }
        write_synthetic_model(p, *out);
        std::fprintf(stderr, "wrote %s (%s, %lld layers, n_embd %lld, vocab %lld, %s)\n", out->c_str(), p.arch.c_str(),
                     (long long)p.n_layer, (long long)p.n_embd, (long long)p.n_vocab,
                     (std::string(dtype_name(p.type)) +
                      (p.stack_type ? ", " + std::string(dtype_name(*p.stack_type)) + " stacks" : ""))
                         .c_str());
        return 0;
    };
}

}  // namespace sparrow::tools
