// `sparrow batched`: one prompt, np continuations generated side by side (llama.cpp's batched example).
// The prompt is decoded once with every sequence id on its tokens (its cache cells are shared); then each
// step decodes one token per unfinished sequence in one batch, and each sequence samples from its own logits
// with its own sampler (seed + sequence index, so that the continuations differ). --compare-single also
// generates for one sequence alone, stepped in turn with the batch, and prints the speed ratio.
#include <cstdio>
#include <memory>
#include <vector>

#include "commands.h"
#include "common.h"
#include "core/error.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

namespace sparrow::tools {

namespace {

struct BatchedFlags {
    ModelFlags model;
    std::string prompt;
    int64_t n_parallel = 4;
    int64_t n_predict = 64;
    SamplingFlags sampling;
    bool compare_single = false;
    bool quiet = false;  // speeds only, no texts
};

// Decodes the prompt once for sequences [0, n_seq) in batches of n_batch; returns the seconds it took.
double decode_prompt(Context &ctx, const std::vector<int32_t> &prompt, int64_t n_seq) {
    std::vector<int32_t> extra;
    for (int32_t s = 1; s < n_seq; ++s) extra.push_back(s);
    const Stopwatch clock;
    std::vector<BatchToken> batch;
    const auto n_batch = static_cast<size_t>(ctx.params().n_batch);
    for (size_t start = 0; start < prompt.size(); start += n_batch) {
        batch.clear();
        for (size_t i = start; i < std::min(prompt.size(), start + n_batch); ++i) {
            batch.push_back({prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size(), extra});
        }
        ctx.decode(batch);
    }
    return clock.seconds();
}

// Sequences [0, n_seq) of one context generated together: each step samples one token per unfinished
// sequence from its own logits and decodes them as one batch.
class Generation {
  public:
    Generation(Context &ctx, const Tokenizer &tok, const BatchedFlags &f, int64_t n_seq,
               std::span<const int32_t> prompt, size_t last, uint64_t seed)
        : ctx_(ctx),
          tok_(tok),
          f_(f),
          n_prompt_(static_cast<int32_t>(prompt.size())),
          tokens_(static_cast<size_t>(n_seq)),
          logits_index_(static_cast<size_t>(n_seq), last),
          done_(static_cast<size_t>(n_seq), false) {
        const std::vector<int32_t> eog = end_of_generation_ids(tok);
        const LogitAdjustments adjustments = f.sampling.adjustments(tok);
        for (int64_t s = 0; s < n_seq; ++s) {
            samplers_.emplace_back(f.sampling.params(seed + s));
            adjusters_.emplace_back(adjustments, eog);
            adjusters_.back().start(prompt);
        }
    }

    // Step `step` (0-based) of n_predict; returns false once every sequence has finished.
    bool step(int64_t step) {
        const Stopwatch clock;
        batch_.clear();
        for (size_t s = 0; s < tokens_.size(); ++s) {
            if (done_[s]) continue;
            const int32_t next = samplers_[s].sample(adjusters_[s].apply(ctx_.logits(logits_index_[s])));
            ++n_tokens_;
            const bool eog = tok_.is_eog(next);
            if (!eog) {
                tokens_[s].push_back(next);
                adjusters_[s].accept(next);
            }
            if (eog || step + 1 == f_.n_predict) {
                done_[s] = true;
                continue;
            }
            logits_index_[s] = batch_.size();
            batch_.push_back({next, n_prompt_ + static_cast<int32_t>(step), static_cast<int32_t>(s), true});
        }
        if (!batch_.empty()) ctx_.decode(batch_);
        seconds_ += clock.seconds();
        return !batch_.empty();
    }

    const std::vector<int32_t> &tokens(size_t seq) const { return tokens_[seq]; }
    int64_t n_tokens() const { return n_tokens_; }  // every sampled token, EOG included (as `run` counts)
    double seconds() const { return seconds_; }
    double rate() const { return n_tokens_ > 0 ? double(n_tokens_) / seconds_ : 0.0; }

  private:
    Context &ctx_;
    const Tokenizer &tok_;
    const BatchedFlags &f_;
    int32_t n_prompt_;
    std::vector<Sampler> samplers_;
    std::vector<LogitAdjuster> adjusters_;      // per sequence: its penalties and biases
    std::vector<std::vector<int32_t>> tokens_;  // per sequence: the generated ids (EOG excluded)
    std::vector<size_t> logits_index_;          // per sequence: its logits' index in the last batch
    std::vector<bool> done_;
    std::vector<BatchToken> batch_;
    int64_t n_tokens_ = 0;
    double seconds_ = 0;
};

int run_batched(const BatchedFlags &f) {
    auto model = load_model_verbose(f.model);
    const Tokenizer &tok = model_tokenizer(*model);
    const std::vector<int32_t> prompt = tok.encode(f.prompt, /*add_special=*/true, /*parse_special=*/true);
    if (prompt.empty()) throw_error("the prompt is empty (and the model adds no BOS token)");
    const int64_t n_seq = f.n_parallel;
    const int64_t need = static_cast<int64_t>(prompt.size()) + n_seq * f.n_predict;
    ContextParams cp = f.model.context_params();
    if (cp.n_ctx == 0) cp.n_ctx = need;
    if (need > cp.n_ctx) {
        throw_error(
            "the prompt (%zu tokens) plus %lld x %lld generated tokens needs %lld cache cells, more than -c %lld",
            prompt.size(), (long long)n_seq, (long long)f.n_predict, (long long)need, (long long)cp.n_ctx);
    }
    cp.n_batch = std::max(cp.n_batch, n_seq);
    Context ctx(model, cp);
    print_context_summary(ctx);
    const uint64_t seed = f.sampling.resolved_seed();
    std::fprintf(stderr,
                 "batched: %lld sequences x %lld tokens; sampling: temp %.2f, top-k %d, top-p %.2f, min-p %.2f%s, "
                 "seed %llu (+ sequence index)\n",
                 (long long)n_seq, (long long)f.n_predict, f.sampling.temp, f.sampling.top_k, f.sampling.top_p,
                 f.sampling.min_p, f.sampling.describe_adjustments().c_str(), (unsigned long long)seed);

    const auto n_prompt = static_cast<int32_t>(prompt.size());
    const size_t last = (prompt.size() - 1) % static_cast<size_t>(ctx.params().n_batch);
    const double prompt_s = decode_prompt(ctx, prompt, n_seq);
    Generation gen(ctx, tok, f, n_seq, prompt, last, seed);
    // --compare-single: one sequence in a context of its own, stepped in turn with the batched sequences so
    // that both see the same machine load (other processes, clock changes) over the run.
    std::unique_ptr<Context> single_ctx;
    std::unique_ptr<Generation> single;
    if (f.compare_single) {
        cp.n_ctx = n_prompt + f.n_predict;
        single_ctx = std::make_unique<Context>(model, cp);
        decode_prompt(*single_ctx, prompt, 1);
        const size_t single_last = (prompt.size() - 1) % static_cast<size_t>(single_ctx->params().n_batch);
        single = std::make_unique<Generation>(*single_ctx, tok, f, 1, prompt, single_last, seed);
    }
    bool more = true, more_single = single != nullptr;
    for (int64_t step = 0; more || more_single; ++step) {
        if (more) more = gen.step(step);
        if (more_single) more_single = single->step(step);
    }
    if (!f.quiet) {
        for (int64_t s = 0; s < n_seq; ++s) {
            std::string text = f.prompt;
            for (const int32_t id : gen.tokens(static_cast<size_t>(s))) text += tok.token_to_piece(id);
            std::printf("--- sequence %lld ---\n", (long long)s);
            std::fwrite(text.data(), 1, text.size(), stdout);  // bytes as they are: a piece may hold a NUL
            std::fputc('\n', stdout);
        }
        std::fflush(stdout);
    }
    print_sparse_stats(ctx, f.model.dsa_stats);
    std::fprintf(stderr,
                 "\nprompt: %zu tokens in %.2f ms (%.1f tokens/s), decoded once for %lld sequences | generation: "
                 "%lld tokens in %.2f ms (%.1f tokens/s aggregate, %.1f per sequence)\n",
                 prompt.size(), prompt_s * 1e3, double(prompt.size()) / prompt_s, (long long)n_seq,
                 (long long)gen.n_tokens(), gen.seconds() * 1e3, gen.rate(), gen.rate() / double(n_seq));
    if (single) {
        std::fprintf(stderr,
                     "single sequence (stepped in turn): %lld tokens in %.2f ms (%.1f tokens/s); %lld sequences "
                     "reach %.2fx its aggregate speed\n",
                     (long long)single->n_tokens(), single->seconds() * 1e3, single->rate(), (long long)n_seq,
                     single->rate() > 0 ? gen.rate() / single->rate() : 0.0);
    }
    return 0;
}

}  // namespace

Command register_batched(CLI::App &app) {
    auto *cmd = app.add_subcommand("batched", "Generate several continuations of one prompt side by side");
    auto f = std::make_shared<BatchedFlags>();
    f->model.add_to(*cmd, 0);
    cmd->add_option("-p,--prompt", f->prompt, "Prompt text")->required();
    cmd->add_option("--parallel", f->n_parallel, "Sequences generated side by side (-np)")
        ->check(CLI::Range(int64_t(1), int64_t(256)));
    cmd->add_option("-n,--n-predict", f->n_predict, "Tokens to generate per sequence")->check(count_at_least(1));
    f->sampling.add_to(*cmd, "Random seed of sequence 0; sequence i uses seed + i (-1 = random)");
    cmd->add_flag("--compare-single", f->compare_single,
                  "Then generate for one sequence alone and print the aggregate speed ratio");
    cmd->add_flag("--quiet", f->quiet, "Print only the speeds, not the texts");
    return [f] { return run_batched(*f); };
}

}  // namespace sparrow::tools
