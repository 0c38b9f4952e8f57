// Flags shared by the subcommands that load a model (llama.cpp's names), and a few output helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "runtime/logit_adjust.h"
#include "runtime/sampler.h"
#include "server/chat_format.h"
#include "sparrow/sparrow.h"

namespace sparrow::tools {

// Option checks whose messages read well: CLI11's NonNegativeNumber / PositiveNumber print DBL_MAX in full
// as the upper bound, and its Range lets NaN through.
constexpr int64_t kMaxCount = int64_t(1) << 31;  // upper bound of sizes and counts on the command line
inline CLI::Range count_at_least(int64_t lo) { return CLI::Range(lo, kMaxCount); }
CLI::Validator finite_in(double lo, double hi);  // a finite number in [lo, hi]

struct ModelFlags {
    std::string model_path;
    int64_t n_ctx = 0;
    int64_t n_batch = 2048;
    int64_t n_ubatch = 512;
    int n_threads = 0;
    std::string cache_type_k = "f16";
    std::string cache_type_v = "f16";
    std::string dsa = "on";
    int64_t dsa_top_k = 0;
    int64_t dsa_sink = 0;
    std::string indexer_cache_type = "f16";
    std::string cache_rotation = "auto";
    std::string indexer_precision = "auto";
    bool dsa_stats = false;
    bool no_repack = false;

    // Registers the flags; bench registers its own list-valued --dsa and --indexer-precision, so it passes
    // with_dsa_flag = false. serve has no end of run to print --dsa-stats at, so it passes with_stats_flag =
    // false and the flag is refused there as unknown.
    void add_to(CLI::App &cmd, int64_t default_ctx, bool with_dsa_flag = true, bool with_stats_flag = true);
    ContextParams context_params() const;
    ModelParams model_params() const;
};

// --indexer-precision auto resolved for this CPU: "fast" where fast mode's queries are 8-bit (the VNNI and scalar
// kernels: its selections then matched exact mode's on every test model, outlier channels included), else
// "exact"; "exact" and "fast" stay as they are.
std::string resolve_indexer_precision(const std::string &precision);

// Sampling flags of the commands that generate text (run, batched): --temp, --top-k, --top-p, --min-p, --typical,
// --xtc-probability, --xtc-threshold, -s/--seed,
// and what is done to the logits before (LogitAdjustments): --presence-penalty, --frequency-penalty,
// --repeat-penalty, --repeat-last-n, -l/--logit-bias, --ignore-eos.
struct SamplingFlags {
    float temp = 0.8f;
    int top_k = 40;
    float top_p = 0.95f;
    float min_p = 0.05f;                                                   // llama.cpp's default, as the three above
    float typical_p = 1.0f, xtc_probability = 0.0f, xtc_threshold = 0.1f;  // off, as llama.cpp's defaults
    float top_n_sigma = -1.0f;                                             // off
    float dynatemp_range = 0.0f, dynatemp_exponent = 1.0f;                 // off
    int mirostat = 0;                                                      // off
    float mirostat_tau = 5.0f, mirostat_eta = 0.1f;
    int64_t seed = -1;  // -1: a random seed, drawn by resolved_seed()
    float presence_penalty = 0.0f, frequency_penalty = 0.0f;
    float repeat_penalty = 1.0f;  // llama.cpp's defaults: off, over the last 64 tokens
    int64_t repeat_last_n = 64;
    std::vector<std::string> logit_bias;  // llama.cpp's TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 2-inf
    bool ignore_eos = false;
    float dry_multiplier = 0.0f, dry_base = 1.75f;  // DRY, llama.cpp's defaults (off)
    int64_t dry_allowed_length = 2, dry_penalty_last_n = -1;
    std::vector<std::string> dry_breakers = default_dry_breakers();  // --dry-sequence-breaker ("none": no breaker)

    void add_to(CLI::App &cmd, const std::string &seed_help = "Random seed (-1 = random)");
    uint64_t resolved_seed() const;
    SamplerParams params(uint64_t used_seed) const {
        return {.temp = temp,
                .top_k = top_k,
                .top_p = top_p,
                .seed = used_seed,
                .min_p = min_p,
                .typical_p = typical_p,
                .xtc_probability = xtc_probability,
                .xtc_threshold = xtc_threshold,
                .top_n_sigma = top_n_sigma,
                .dynatemp_range = dynatemp_range,
                .dynatemp_exponent = dynatemp_exponent,
                .mirostat = mirostat,
                .mirostat_tau = mirostat_tau,
                .mirostat_eta = mirostat_eta};
    }
    // The logit adjustments of the flags; a --logit-bias token id outside the vocabulary is an error naming it.
    LogitAdjustments adjustments(const Tokenizer &tok) const;
    // The samplers past min-p and the adjustments in force, for the sampling line on stderr (", typical 0.90,
    // repeat-penalty 1.10 over 64, ignore-eos"), or "" when none is.
    std::string describe_adjustments() const;
};

// --chat-format (run --conversation, serve): one of the built-in formats' names.
CLI::Option *add_chat_format_option(CLI::App &cmd, std::string &chat_format);
// The chat format named by --chat-format (`name`), else the one recognised from the model's
// tokenizer.chat_template, else llama2 with a notice on stderr that starts with `command`.
server::ChatFormat choose_chat_format(const std::string &name, const Model &model, const char *command);

// Loads the model of the flags and prints one line about it to stderr.
std::shared_ptr<const Model> load_model_verbose(const ModelFlags &flags);
// The cache size and, for models with an indexer, what attention runs (stderr).
void print_context_summary(const Context &ctx);
// Per-layer selection statistics and indexer/attention time, when --dsa-stats was given.
void print_sparse_stats(const Context &ctx, bool enabled);

// The whole content of a file; throws sparrow::Error naming it when it cannot be read.
std::string read_file(const std::string &path);

// Peak resident memory of this process so far.
int64_t peak_rss_bytes();

class Stopwatch {
  public:
    Stopwatch() : start_(std::chrono::steady_clock::now()) {}
    double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

  private:
    std::chrono::steady_clock::time_point start_;
};

}  // namespace sparrow::tools
