// `sparrow perplexity`: perplexity over a text file the way llama.cpp computes it. The text is tokenized
// once (BOS first), cut into chunks of n_ctx tokens; each chunk starts with BOS (replacing its first
// token) and is evaluated from an empty cache; the second half of each chunk is scored (each position
// predicts the next token). Several chunks run side by side as separate sequences of one batch.
// --kl-divergence-base FILE saves the scored distributions compactly; --kl-divergence FILE compares this run
// against such a file (kl_divergence.h says how, and what the figures mean).
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "commands.h"
#include "common.h"
#include "core/error.h"
#include "kl_divergence.h"
#include "runtime/tokenizer.h"

namespace sparrow::tools {

namespace {
struct PerplexityFlags {
    ModelFlags model;
    std::string text_path;
    int64_t n_chunks = -1;
    std::string kl_base_path;  // --kl-divergence-base: write the base file
    std::string kl_path;       // --kl-divergence: compare against this base file
    int64_t kl_top = kl::kDefaultTop;
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
    if (f.model.n_ctx != 0 && f.model.n_ctx < 4) throw_error("perplexity needs a context of at least 4 tokens (-c)");
    if (!f.kl_base_path.empty() && !f.kl_path.empty()) {
        throw_error("give --kl-divergence-base (save a base run) or --kl-divergence (compare with one), not both");
    }
    if (f.kl_top < 1 || f.kl_top > 65536) throw_error("--kl-top must be in [1, 65536], got %lld", (long long)f.kl_top);
    // The base file is opened (and its header checked) before the model loads, so a wrong path fails fast.
    std::unique_ptr<kl::BaseReader> kl_reader;
    if (!f.kl_path.empty()) kl_reader = std::make_unique<kl::BaseReader>(f.kl_path);
    auto model = load_model_verbose(f.model);
    const Tokenizer &tok = model_tokenizer(*model);
    const int64_t n_ctx = f.model.n_ctx != 0 ? f.model.n_ctx : default_context_size(model_info(*model));  // -c 0
    if (n_ctx < 4)
        throw_error("perplexity needs a context of at least 4 tokens (the model's is %lld)", (long long)n_ctx);

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
    const int64_t n_scored = n_ctx - 1 - first;
    // The tokens every chunk evaluates (BOS in front), in chunk order: what a KL base file records.
    std::vector<int32_t> evaluated(static_cast<size_t>(n_chunks * n_ctx));
    for (int64_t i = 0; i < n_chunks * n_ctx; ++i) {
        evaluated[static_cast<size_t>(i)] = (i % n_ctx == 0 && bos >= 0) ? bos : tokens[static_cast<size_t>(i)];
    }
    std::unique_ptr<kl::BaseWriter> kl_writer;
    if (!f.kl_base_path.empty()) {
        kl::Header h;
        h.n_top = f.kl_top;
        h.n_vocab = ctx.n_vocab();
        h.n_ctx = n_ctx;
        h.n_chunks = n_chunks;
        h.n_scored = n_scored;
        h.tokens = evaluated;
        kl_writer = std::make_unique<kl::BaseWriter>(f.kl_base_path, h);
    }
    if (kl_reader) kl_reader->check_matches(ctx.n_vocab(), n_ctx, n_chunks, n_scored, evaluated);
    std::vector<double> log_p;  // one position's full log-softmax (KL modes)
    std::vector<uint8_t> kl_mark;
    kl::Record kl_record;
    kl::Stats kl_total;

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
                const int32_t id = evaluated[static_cast<size_t>(start + j)];
                batch.push_back({id, static_cast<int32_t>(j), static_cast<int32_t>(s), j >= first && j < n_ctx - 1});
            }
        }
        ctx.decode(batch);
        for (int64_t s = 0; s < n_here; ++s) {
            const int64_t start = (c0 + s) * n_ctx;
            kl::Stats kl_chunk;
            for (int64_t j = first; j < n_ctx - 1; ++j) {
                const std::span<const float> logits = ctx.logits(static_cast<size_t>(s * n_ctx + j));
                const int32_t target = tokens[static_cast<size_t>(start + j + 1)];
                const double lp = log_prob(logits, target);
                nll -= lp;
                nll2 += lp * lp;
                ++count;
                if (kl_writer || kl_reader) kl::log_softmax(logits, log_p);
                if (kl_writer) kl_writer->add(kl::summarize(log_p, f.kl_top, target, kl_mark));
                if (kl_reader) {
                    kl_reader->next(kl_record);
                    const kl::Comparison cmp = kl::compare(kl_record, log_p, target, kl_mark);
                    kl_chunk.add(cmp);
                    kl_total.add(cmp);
                }
            }
            std::fprintf(stderr, "[%lld]%.4f%s", (long long)(c0 + s + 1), std::exp(nll / count),
                         (c0 + s + 1) % 10 == 0 ? "\n" : ",");
            if (kl_reader) std::printf("KL chunk %lld: %s\n", (long long)(c0 + s + 1), kl_chunk.summary().c_str());
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
    if (kl_writer) {
        kl_writer->finish();
        std::printf("KL base saved to %s (%lld positions, top %lld tokens each)\n", f.kl_base_path.c_str(),
                    (long long)count, (long long)std::min<int64_t>(f.kl_top, ctx.n_vocab()));
    }
    if (kl_reader) {
        std::printf("KL divergence vs %s over %lld chunks: %s\n", f.kl_path.c_str(), (long long)n_chunks,
                    kl_total.summary().c_str());
    }
    return 0;
}
}  // namespace

Command register_perplexity(CLI::App &app) {
    auto *cmd = app.add_subcommand("perplexity", "Perplexity of a model over a text file (llama.cpp's method)");
    auto f = std::make_shared<PerplexityFlags>();
    f->model.add_to(*cmd, 512);
    cmd->add_option("-f,--file", f->text_path, "Text file")->required();
    cmd->add_option("--chunks", f->n_chunks, "Evaluate at most this many chunks (default: all)")
        ->check(count_at_least(1));
    cmd->add_option("--kl-divergence-base", f->kl_base_path,
                    "Save this run's scored distributions (top tokens + rest mass) to FILE as a KL base");
    cmd->add_option("--kl-divergence", f->kl_path,
                    "Compare this run with a base FILE: KL divergence, same-top-token %, PPL ratio");
    cmd->add_option("--kl-top", f->kl_top, "Tokens kept per position in a KL base file (default 32)");
    return [f] { return perplexity(*f); };
}

}  // namespace sparrow::tools
