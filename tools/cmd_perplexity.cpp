// `sparrow perplexity`: perplexity over a text file the way llama.cpp computes it. The text is tokenized
// once (BOS first), cut into chunks of n_ctx tokens; each chunk starts with BOS (replacing its first
// token) and is evaluated from an empty cache; the second half of each chunk is scored (each position
// predicts the next token). Several chunks run side by side as separate sequences of one batch.
#include <cmath>
#include <cstdio>
#include <vector>

#include "commands.h"
#include "common.h"
#include "core/error.h"
#include "runtime/tokenizer.h"

namespace sparrow::tools {

namespace {
struct PerplexityFlags {
    ModelFlags model;
    std::string text_path;
    int64_t n_chunks = -1;
};

// log(softmax(logits)[target]) in double, stable.
double log_prob(std::span<const float> logits, int32_t target) {
    float max = logits[0];
    for (float v : logits) max = std::max(max, v);
    double sum = 0.0;
    for (float v : logits) sum += std::exp(double(v) - max);
    return double(logits[static_cast<size_t>(target)]) - max - std::log(sum);
}

int perplexity(const PerplexityFlags &f) {
    const int64_t n_ctx = f.model.n_ctx;
    if (n_ctx < 4) throw_error("perplexity needs a context of at least 4 tokens (-c)");
    auto model = load_model_verbose(f.model.model_path);
    const Tokenizer &tok = model_tokenizer(*model);

    const Stopwatch tokenize_clock;
    const std::vector<int32_t> tokens =
        tok.encode(read_file(f.text_path), /*add_special=*/true, /*parse_special=*/false);
    const int64_t n_available = static_cast<int64_t>(tokens.size()) / n_ctx;
    const int64_t n_chunks = f.n_chunks >= 0 ? std::min(f.n_chunks, n_available) : n_available;
    std::fprintf(stderr, "tokenized %zu tokens in %.2f s; %lld chunks of %lld tokens\n", tokens.size(),
                 tokenize_clock.seconds(), (long long)n_chunks, (long long)n_ctx);
    if (n_chunks == 0) {
        throw_error("the text has %zu tokens, fewer than one chunk of %lld", tokens.size(), (long long)n_ctx);
    }

    // As many chunks per batch as fit in n_batch, each in its own sequence.
    const int64_t n_seq = std::clamp<int64_t>(f.model.n_batch / n_ctx, 1, std::min<int64_t>(n_chunks, 64));
    ContextParams cp = f.model.context_params();
    cp.n_ctx = n_ctx * n_seq;
    cp.n_batch = n_ctx * n_seq;
    Context ctx(model, cp);
    print_context_summary(ctx);
    const int64_t first = n_ctx / 2;  // positions [first, n_ctx - 1) are scored
    const int32_t bos = tok.add_bos() ? tok.bos_id() : -1;

    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    const Stopwatch clock;
    std::vector<BatchToken> batch;
    for (int64_t c0 = 0; c0 < n_chunks; c0 += n_seq) {
        const int64_t n_here = std::min(n_seq, n_chunks - c0);
        batch.clear();
        ctx.clear();
        for (int64_t s = 0; s < n_here; ++s) {
            const int64_t start = (c0 + s) * n_ctx;
            for (int64_t j = 0; j < n_ctx; ++j) {
                const int32_t id = (j == 0 && bos >= 0) ? bos : tokens[static_cast<size_t>(start + j)];
                batch.push_back({id, static_cast<int32_t>(j), static_cast<int32_t>(s), j >= first && j < n_ctx - 1});
            }
        }
        ctx.decode(batch);
        for (int64_t s = 0; s < n_here; ++s) {
            const int64_t start = (c0 + s) * n_ctx;
            for (int64_t j = first; j < n_ctx - 1; ++j) {
                const double lp = log_prob(ctx.logits(static_cast<size_t>(s * n_ctx + j)),
                                           tokens[static_cast<size_t>(start + j + 1)]);
                nll -= lp;
                nll2 += lp * lp;
                ++count;
            }
            std::fprintf(stderr, "[%lld]%.4f%s", (long long)(c0 + s + 1), std::exp(nll / count),
                         (c0 + s + 1) % 10 == 0 ? "\n" : ",");
        }
        if (c0 == 0) {
            const double per_chunk = clock.seconds() / double(n_here);
            std::fprintf(stderr, "(%.2f s per chunk, about %.1f s in all)\n", per_chunk, per_chunk * n_chunks);
        }
    }
    print_sparse_stats(ctx, f.model.dsa_stats);
    const double mean = nll / count;
    const double var = nll2 / count - mean * mean;
    const double err = var > 0 && count > 1 ? std::sqrt(var / (count - 1)) : 0.0;
    const double ppl = std::exp(mean);
    std::fprintf(stderr, "\n");
    std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored in %lld chunks, %.2f s)\n", ppl, err * ppl,
                (long long)count, (long long)n_chunks, clock.seconds());
    return 0;
}
}  // namespace

Command register_perplexity(CLI::App &app) {
    auto *cmd = app.add_subcommand("perplexity", "Perplexity of a model over a text file (llama.cpp's method)");
    auto f = std::make_shared<PerplexityFlags>();
    f->model.add_to(*cmd, 512);
    cmd->add_option("-f,--file", f->text_path, "Text file")->required();
    cmd->add_option("--chunks", f->n_chunks, "Evaluate at most this many chunks (default: all)");
    return [f] { return perplexity(*f); };
}

}  // namespace sparrow::tools
