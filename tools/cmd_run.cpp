// `sparrow run`: tokenize a prompt, evaluate it, then sample and stream a continuation.
#include <cctype>
#include <cstdio>
#include <vector>

#include "commands.h"
#include "common.h"
#include "core/error.h"
#include "npy.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

namespace sparrow::tools {

namespace {
struct RunFlags {
    ModelFlags model;
    std::string prompt;
    int64_t n_predict = 64;
    SamplingFlags sampling;
    std::string prompt_ids_path;      // ids used verbatim (no BOS added)
    std::string dump_logits_path;     // logits of the last prompt position, as .npy
    std::string dump_selection_path;  // per layer, the keys the last prompt queries attended (JSON)
};

// {"layers": [{"layer": 0, "dense": false, "queries": [{"pos": 299, "keys": [0, 5, ...]}, ...]}, ...]}
void write_selection_json(const std::string &path, const std::vector<LayerSelection> &layers) {
    FILE *out = std::fopen(path.c_str(), "wb");
    if (!out) throw_error("cannot create '%s'", path.c_str());
    std::fprintf(out, "{\"layers\": [");
    for (size_t l = 0; l < layers.size(); ++l) {
        std::fprintf(out, "%s\n  {\"layer\": %lld, \"dense\": %s, \"queries\": [", l ? "," : "",
                     (long long)layers[l].layer, layers[l].dense ? "true" : "false");
        for (size_t q = 0; q < layers[l].queries.size(); ++q) {
            const QuerySelection &sel = layers[l].queries[q];
            std::fprintf(out, "%s{\"pos\": %d, \"keys\": [", q ? ", " : "", sel.pos);
            for (size_t k = 0; k < sel.keys.size(); ++k) std::fprintf(out, "%s%d", k ? ", " : "", sel.keys[k]);
            std::fprintf(out, "]}");
        }
        std::fprintf(out, "]}");
    }
    std::fprintf(out, "\n]}\n");
    if (std::fclose(out) != 0) throw_error("cannot write '%s'", path.c_str());
}

// Token ids separated by whitespace and/or commas.
std::vector<int32_t> read_prompt_ids(const std::string &path) {
    const std::string text = read_file(path);
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
        if (std::isspace(static_cast<unsigned char>(text[i])) || text[i] == ',') {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
        if (j == i || j - i > 9) {
            throw_error("%s: expected a token id at byte %zu, found '%s'", path.c_str(), i, text.substr(i, 12).c_str());
        }
        ids.push_back(static_cast<int32_t>(std::stol(text.substr(i, j - i))));
        i = j;
    }
    return ids;
}

int run(const RunFlags &f) {
    auto model = load_model_verbose(f.model);
    const Tokenizer &tok = model_tokenizer(*model);
    ContextParams cp = f.model.context_params();
    cp.record_selections = !f.dump_selection_path.empty();
    Context ctx(model, cp);
    print_context_summary(ctx);

    const std::vector<int32_t> prompt = f.prompt_ids_path.empty()
                                            ? tok.encode(f.prompt, /*add_special=*/true, /*parse_special=*/true)
                                            : read_prompt_ids(f.prompt_ids_path);
    if (prompt.empty()) throw_error("the prompt is empty (and the model adds no BOS token)");
    if (static_cast<int64_t>(prompt.size()) + f.n_predict > ctx.n_ctx()) {
        throw_error(
            "the prompt (%zu tokens) plus %lld tokens to generate does not fit in the context of %lld tokens "
            "(raise -c or lower -n)",
            prompt.size(), (long long)f.n_predict, (long long)ctx.n_ctx());
    }
    const uint64_t seed = f.sampling.resolved_seed();
    std::fprintf(stderr,
                 "context: %lld cells, batch %lld, ubatch %lld, cache %s/%s; sampling: temp %.2f, top-k %d, "
                 "top-p %.2f, seed %llu\n",
                 (long long)ctx.n_ctx(), (long long)ctx.params().n_batch, (long long)ctx.params().n_ubatch,
                 cache_type_name(ctx.params().cache_type_k), cache_type_name(ctx.params().cache_type_v),
                 f.sampling.temp, f.sampling.top_k, f.sampling.top_p, (unsigned long long)seed);

    std::fputs(f.prompt_ids_path.empty() ? f.prompt.c_str() : tok.decode(prompt).c_str(), stdout);
    std::fflush(stdout);

    // Prompt: in batches of n_batch; logits only for the last token.
    const Stopwatch prompt_clock;
    std::vector<BatchToken> batch;
    for (size_t start = 0; start < prompt.size(); start += static_cast<size_t>(ctx.params().n_batch)) {
        const size_t end = std::min(prompt.size(), start + static_cast<size_t>(ctx.params().n_batch));
        batch.clear();
        for (size_t i = start; i < end; ++i) {
            batch.push_back({prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size()});
        }
        ctx.decode(batch);
    }
    const double prompt_s = prompt_clock.seconds();
    if (!f.dump_logits_path.empty()) {
        const auto last = ctx.logits(batch.size() - 1);
        write_npy_f32(f.dump_logits_path, last, {static_cast<int64_t>(last.size())});
    }
    if (!f.dump_selection_path.empty()) write_selection_json(f.dump_selection_path, ctx.last_selections());

    Sampler sampler(f.sampling.params(seed));
    const Stopwatch gen_clock;
    int64_t n_generated = 0;
    int32_t pos = static_cast<int32_t>(prompt.size());
    std::span<const float> logits = ctx.logits(batch.size() - 1);
    while (n_generated < f.n_predict) {
        const int32_t next = sampler.sample(logits);
        ++n_generated;
        if (tok.is_eog(next)) break;
        std::fputs(tok.token_to_piece(next).c_str(), stdout);
        std::fflush(stdout);
        if (n_generated == f.n_predict) break;
        const BatchToken t{next, pos++, 0, true};
        ctx.decode(std::span<const BatchToken>(&t, 1));
        logits = ctx.logits(0);
    }
    const double gen_s = gen_clock.seconds();
    std::fputs("\n", stdout);
    std::fflush(stdout);
    print_sparse_stats(ctx, f.model.dsa_stats);
    std::fprintf(stderr,
                 "peak resident memory %.1f MiB (weights %.1f MiB, %.1f MiB of them repacked; KV cache %.1f MiB)\n",
                 peak_rss_bytes() / 1048576.0, model_info(*model).n_weight_bytes / 1048576.0,
                 model_info(*model).n_repacked_bytes / 1048576.0, ctx.cache_bytes() / 1048576.0);
    std::fprintf(stderr,
                 "\nprompt: %zu tokens in %.2f ms (%.1f tokens/s) | generation: %lld tokens in %.2f ms "
                 "(%.1f tokens/s)\n",
                 prompt.size(), prompt_s * 1e3, prompt.size() / prompt_s, (long long)n_generated, gen_s * 1e3,
                 n_generated > 0 ? n_generated / gen_s : 0.0);
    return 0;
}
}  // namespace

Command register_run(CLI::App &app) {
    auto *cmd = app.add_subcommand("run", "Generate text from a prompt");
    auto f = std::make_shared<RunFlags>();
    f->model.add_to(*cmd, 0);
    auto *prompt = cmd->add_option("-p,--prompt", f->prompt, "Prompt text");
    auto *ids = cmd->add_option("--prompt-ids", f->prompt_ids_path, "File of prompt token ids (used verbatim)");
    prompt->excludes(ids);
    cmd->add_option("--dump-logits", f->dump_logits_path, "Write the last prompt position's logits (.npy)");
    cmd->add_option("--dump-selection", f->dump_selection_path,
                    "Write, per layer, the keys the last prompt queries attended (.json; sparse-attention models)");
    cmd->add_option("-n,--n-predict", f->n_predict, "Tokens to generate")->check(count_at_least(0));
    f->sampling.add_to(*cmd);
    return [f, prompt, ids] {
        if (prompt->count() == 0 && ids->count() == 0) throw_error("run: give a prompt (-p) or --prompt-ids");
        return run(*f);
    };
}

}  // namespace sparrow::tools
