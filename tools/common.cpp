#include "common.h"

#include <sys/resource.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>

#include "attention/lightning_indexer.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/tokenizer.h"

namespace sparrow::tools {

CLI::Validator finite_in(double lo, double hi) {
    char desc[64];
    std::snprintf(desc, sizeof desc, "FLOAT in [%g, %g]", lo, hi);
    return CLI::Validator(
        [lo, hi](std::string &text) -> std::string {
            char *end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            if (text.empty() || end != text.c_str() + text.size()) return "'" + text + "' is not a number";
            if (!std::isfinite(v) || v < lo || v > hi) {
                char msg[96];
                std::snprintf(msg, sizeof msg, "%s is not a finite number in [%g, %g]", text.c_str(), lo, hi);
                return msg;
            }
            return {};
        },
        desc);
}

CLI::Option *add_chat_format_option(CLI::App &cmd, std::string &chat_format) {
    return cmd
        .add_option(
            "--chat-format", chat_format,
            "Chat format: deepseek3, deepseek4, glm or llama2 (default: recognised from the model's chat template)")
        ->check(CLI::IsMember(
            {"deepseek3", "deepseek-v3.2", "deepseek4", "deepseek-v4", "glm", "glm-5", "glm4", "llama2"}));
}

server::ChatFormat choose_chat_format(const std::string &name, const Model &model, const char *command) {
    if (!name.empty()) return server::chat_format_from_name(name);
    const std::string tmpl = model.file().get_string("tokenizer.chat_template", std::string());
    if (const auto found = server::detect_chat_format(tmpl)) return *found;
    std::fprintf(
        stderr, "%s: %s; using the llama2 chat format (choose another with --chat-format)\n", command,
        tmpl.empty() ? "the model has no chat template" : "the model's chat template is not one sparrow knows");
    return server::ChatFormat::llama2;
}

void ModelFlags::add_to(CLI::App &cmd, int64_t default_ctx, bool with_dsa_flag, bool with_stats_flag) {
    n_ctx = default_ctx;
    cmd.add_option("-m,--model", model_path, "Model file (GGUF)")->required();
    cmd.add_option("-c,--ctx-size", n_ctx, "Context size in tokens (0 = the model's, at most 4096)")
        ->check(count_at_least(0));
    cmd.add_option("-b,--batch-size", n_batch, "Most tokens per decode call")->check(count_at_least(1));
    cmd.add_option("--ubatch-size", n_ubatch, "Tokens per forward pass")->check(count_at_least(1));
    cmd.add_option("-t,--threads", n_threads, "Threads (0 = all)")->check(CLI::Range(0, ContextParams::kMaxThreads));
    cmd.add_option("--cache-type-k", cache_type_k, "K cache type (MLA: the latent): f32, f16, bf16, q8_0, q4_0")
        ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0"}));
    cmd.add_option("--cache-type-v", cache_type_v, "V cache type: f32, f16, bf16, q8_0, q4_0")
        ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0"}));
    cmd.add_option("--cache-rotation", cache_rotation,
                   "Hadamard rotation of cache rows: auto (the q8_0/q4_0 caches), on (every cache), off")
        ->check(CLI::IsMember({"auto", "on", "off"}));
    if (with_dsa_flag) {
        cmd.add_option("--dsa", dsa, "Sparse attention for models with an indexer: on or off (dense)")
            ->check(CLI::IsMember({"on", "off"}));
    }
    cmd.add_option("--dsa-top-k", dsa_top_k, "Keys each query attends (0 = the model's)")->check(count_at_least(0));
    cmd.add_option("--dsa-sink", dsa_sink,
                   "Attention sinks: the first N positions of each sequence are always selected (within top-k)")
        ->check(count_at_least(0));
    cmd.add_option("--indexer-cache-type", indexer_cache_type, "Indexer key cache type: f32, f16, bf16, q8_0, q4_0")
        ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0"}));
    if (with_stats_flag)
        cmd.add_flag("--dsa-stats", dsa_stats, "Print per-layer sparse-attention statistics at the end");
    cmd.add_flag("--no-repack", no_repack,
                 "Keep Q8_0, Q4_0, MXFP4, K-quant and IQ4_XS weights as the file stores them (default: repacked 8 rows "
                 "to a record at load, for faster products)");
    if (with_dsa_flag) {
        cmd.add_option("--indexer-precision", indexer_precision,
                       "Indexer products: exact (f32), fast (8- or 6-bit queries x int8 keys, exact re-scoring at the "
                       "cut) or auto (fast where this CPU runs 8-bit queries, AVX-VNNI or AVX512-VNNI; else exact)")
            ->check(CLI::IsMember({"auto", "exact", "fast"}));
    }
}

ContextParams ModelFlags::context_params() const {
    ContextParams p;
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_ubatch = n_ubatch;
    p.n_threads = n_threads;
    p.cache_type_k = cache_type_from_name(cache_type_k);
    p.cache_type_v = cache_type_from_name(cache_type_v);
    p.dsa = dsa == "on";
    p.dsa_top_k = dsa_top_k;
    p.dsa_sink = dsa_sink;
    p.indexer_cache_type = cache_type_from_name(indexer_cache_type);
    p.cache_rotation = cache_rotation_from_name(cache_rotation);
    p.indexer_fast = resolve_indexer_precision(indexer_precision) == "fast";
    return p;
}

std::string resolve_indexer_precision(const std::string &precision) {
    if (precision != "auto") return precision;
    return indexer_fast_query_bits() == 8 ? "fast" : "exact";
}

ModelParams ModelFlags::model_params() const {
    ModelParams p;
    p.repack = !no_repack;
    return p;
}

namespace {
// A --logit-bias value, llama.cpp's TOKEN_ID(+|-)BIAS: the id, and the bias (finite, or -inf to ban the token);
// nullopt when the text is not of that form.
std::optional<std::pair<int64_t, float>> parse_logit_bias(const std::string &text) {
    int64_t id = -1;
    const char *const end = text.data() + text.size();
    const auto [sign, ec] = std::from_chars(text.data(), end, id);
    if (ec != std::errc() || sign == text.data() || sign == end || (*sign != '+' && *sign != '-') || id < 0)
        return std::nullopt;
    const std::string magnitude(sign + 1, end);
    if (magnitude == "inf") {
        if (*sign == '+') return std::nullopt;  // +inf would leave no finite logit to compare with
        return std::pair{id, -std::numeric_limits<float>::infinity()};
    }
    double b = 0.0;
    const auto [rest, ec2] = std::from_chars(magnitude.data(), magnitude.data() + magnitude.size(), b);
    if (magnitude.empty() || ec2 != std::errc() || rest != magnitude.data() + magnitude.size() || !std::isfinite(b) ||
        b < 0.0 || b > 1e6)
        return std::nullopt;
    return std::pair{id, static_cast<float>(*sign == '-' ? -b : b)};
}
}  // namespace

void SamplingFlags::add_to(CLI::App &cmd, const std::string &seed_help) {
    cmd.add_option("--temp", temp, "Temperature (0 = greedy)")->check(finite_in(0.0, 100.0));
    cmd.add_option("--top-k", top_k, "Keep the k most likely tokens (0 = all)")->check(count_at_least(0));
    cmd.add_option("--top-p", top_p, "Nucleus sampling threshold (1 = off)")->check(finite_in(0.0, 1.0));
    cmd.add_option("--min-p", min_p, "Keep tokens at least this fraction as likely as the best (0 = off)")
        ->check(finite_in(0.0, 1.0));
    cmd.add_option(
           "--typical", typical_p,
           "Locally typical sampling: keep the tokens nearest the entropy until this much probability (1 = off)")
        ->check(finite_in(0.0, 1.0));
    cmd.add_option("--top-n-sigma", top_n_sigma,
                   "Keep the tokens within N standard deviations of the logits below the best (first cut; -1 = off)")
        ->check(finite_in(-1.0, 100.0));
    cmd.add_option("--dynatemp-range", dynatemp_range,
                   "Dynamic temperature: --temp plus or minus this, by the kept tokens' entropy (0 = off)")
        ->check(finite_in(0.0, 100.0));
    cmd.add_option("--dynatemp-exp", dynatemp_exponent, "Dynamic temperature: the exponent on the entropy (1)")
        ->check(finite_in(0.0, 100.0));
    cmd.add_option("--mirostat", mirostat,
                   "Mirostat 1 or 2: draw so that the tokens' surprise tracks --mirostat-ent (replaces top-k, top-p, "
                   "min-p, typical, XTC; 0 = off)")
        ->check(CLI::Range(0, 2));
    cmd.add_option("--mirostat-ent", mirostat_tau, "Mirostat's target surprise, tau (5)")->check(finite_in(0.0, 100.0));
    cmd.add_option("--mirostat-lr", mirostat_eta, "Mirostat's learning rate, eta (0.1)")->check(finite_in(0.0, 10.0));
    cmd.add_option("--xtc-probability", xtc_probability,
                   "XTC: how often the tokens above --xtc-threshold are removed, all but the least likely (0 = off)")
        ->check(finite_in(0.0, 1.0));
    cmd.add_option("--xtc-threshold", xtc_threshold, "XTC: the probability a top token needs (above 0.5: off)")
        ->check(finite_in(0.0, 1.0));
    cmd.add_option("--presence-penalty", presence_penalty, "Subtracted from each token generated so far (0 = off)")
        ->check(finite_in(-2.0, 2.0));
    cmd.add_option("--frequency-penalty", frequency_penalty,
                   "Subtracted per occurrence of a token among those generated (0 = off)")
        ->check(finite_in(-2.0, 2.0));
    cmd.add_option("--repeat-penalty", repeat_penalty,
                   "Penalty for the last --repeat-last-n tokens of the sequence, prompt included (1 = off)")
        ->check(finite_in(0.001, 100.0));
    cmd.add_option("--repeat-last-n", repeat_last_n, "Tokens the repeat penalty looks back over (-1 = all, 0 = off)")
        ->check(CLI::Range(int64_t(-1), kMaxCount));
    cmd.add_option("-l,--logit-bias", logit_bias,
                   "Bias a token's logit, as TOKEN_ID+BIAS or TOKEN_ID-BIAS (TOKEN_ID-inf: never sampled); repeatable")
        ->check(CLI::Validator(
            [](std::string &text) -> std::string {
                return parse_logit_bias(text) ? std::string() : "'" + text + "' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS";
            },
            "ID(+|-)BIAS"))
        ->allow_extra_args(false);
    cmd.add_option("--dry-multiplier", dry_multiplier,
                   "DRY: penalty for a token that would extend a repetition of the sequence's last tokens (0 = off)")
        ->check(finite_in(0.0, 100.0));
    cmd.add_option("--dry-base", dry_base, "DRY: the penalty grows by this factor per repeated token (1.75)")
        ->check(finite_in(1.0, 100.0));
    cmd.add_option("--dry-allowed-length", dry_allowed_length, "DRY: repetitions this long go unpenalised (2)")
        ->check(CLI::Range(int64_t(1), kMaxCount));
    cmd.add_option("--dry-penalty-last-n", dry_penalty_last_n,
                   "DRY: tokens of the sequence it looks back over (-1 = all, 0 = off)")
        ->check(CLI::Range(int64_t(-1), kMaxCount));
    cmd.add_option_function<std::vector<std::string>>(
           "--dry-sequence-breaker",
           [this](const std::vector<std::string> &values) {
               dry_breakers.clear();
               for (const std::string &v : values) {
                   if (v != "none") dry_breakers.push_back(v);
               }
           },
           "DRY: a text no repetition extends across (repeatable; replaces the defaults \\n : \" *; 'none': no "
           "breaker)")
        ->check(CLI::Validator(
            [](std::string &text) -> std::string { return text.empty() ? "a sequence breaker must not be empty" : ""; },
            "TEXT"))
        ->allow_extra_args(false);
    cmd.add_flag("--ignore-eos", ignore_eos, "Never sample an end-of-generation token (generate the full -n)");
    // -1 or a value in [0, 2^63 - 1], checked on the text: CLI11 would saturate a longer number silently.
    cmd.add_option("-s,--seed", seed, seed_help)
        ->check(CLI::Validator(
            [](std::string &text) -> std::string {
                int64_t v = 0;
                const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
                if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < -1)
                    return "'" + text + "' is not a seed (-1 = random, or 0 to 9223372036854775807)";
                return {};
            },
            "INT in [-1, 2^63 - 1]"));
}

LogitAdjustments SamplingFlags::adjustments(const Tokenizer &tok) const {
    const int32_t n_vocab = tok.n_vocab();
    LogitAdjustments a;
    a.dry_multiplier = dry_multiplier;
    a.dry_base = dry_base;
    a.dry_allowed_length = dry_allowed_length;
    a.dry_penalty_last_n = dry_penalty_last_n;
    if (dry_multiplier > 0.0f) a.dry_breakers = dry_breaker_tokens(tok, dry_breakers);
    a.presence_penalty = presence_penalty;
    a.frequency_penalty = frequency_penalty;
    a.repeat_penalty = repeat_penalty;
    a.repeat_last_n = repeat_last_n;
    a.ignore_eos = ignore_eos;
    for (const std::string &text : logit_bias) {
        const auto bias = parse_logit_bias(text);  // the flag's validator let only this form through
        SPARROW_ASSERT(bias.has_value());
        if (bias->first >= n_vocab) {
            throw_error("--logit-bias %s: token id %lld is outside the vocabulary [0, %d)", text.c_str(),
                        (long long)bias->first, n_vocab);
        }
        a.logit_bias.emplace_back(static_cast<int32_t>(bias->first), bias->second);
    }
    return a;
}

std::string SamplingFlags::describe_adjustments() const {
    std::string out;
    if (mirostat != 0) out += strprintf(", mirostat %d (tau %.2f, eta %.2f)", mirostat, mirostat_tau, mirostat_eta);
    if (top_n_sigma > 0.0f) out += strprintf(", top-n-sigma %.2f", top_n_sigma);
    if (dynatemp_range > 0.0f) out += strprintf(", dynatemp +-%.2f exponent %.2f", dynatemp_range, dynatemp_exponent);
    if (typical_p < 1.0f) out += strprintf(", typical %.2f", typical_p);
    if (xtc_probability > 0.0f && xtc_threshold <= 0.5f)
        out += strprintf(", xtc %.2f above %.2f", xtc_probability, xtc_threshold);
    if (presence_penalty != 0.0f) out += strprintf(", presence-penalty %.2f", presence_penalty);
    if (frequency_penalty != 0.0f) out += strprintf(", frequency-penalty %.2f", frequency_penalty);
    if (repeat_penalty != 1.0f && repeat_last_n != 0) {
        out += repeat_last_n < 0
                   ? strprintf(", repeat-penalty %.2f over the whole sequence", repeat_penalty)
                   : strprintf(", repeat-penalty %.2f over %lld tokens", repeat_penalty, (long long)repeat_last_n);
    }
    if (!logit_bias.empty())
        out += strprintf(", %zu logit bias%s", logit_bias.size(), logit_bias.size() > 1 ? "es" : "");
    if (dry_multiplier > 0.0f && dry_penalty_last_n != 0) {
        out += strprintf(", dry %.2f x %.2f^(length - %lld)", dry_multiplier, dry_base, (long long)dry_allowed_length);
        out += dry_penalty_last_n < 0 ? std::string(" over the whole sequence")
                                      : strprintf(" over %lld tokens", (long long)dry_penalty_last_n);
    }
    if (ignore_eos) out += ", ignore-eos";
    return out;
}

uint64_t SamplingFlags::resolved_seed() const {
    return seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
}

std::shared_ptr<const Model> load_model_verbose(const ModelFlags &flags) {
    const std::string &path = flags.model_path;
    auto model = load_model(path, flags.model_params());
    const ModelInfo &info = model_info(*model);
    std::fprintf(stderr, "model: %s (%s), %lld layers, n_embd %lld, vocab %lld, %.2f M params, %.1f MiB (%s)\n",
                 path.c_str(), info.arch.c_str(), (long long)info.n_layer, (long long)info.n_embd,
                 (long long)info.n_vocab, info.n_params / 1e6, info.n_weight_bytes / 1048576.0,
                 info.weight_types.c_str());
    if (!info.repack_note.empty()) std::fprintf(stderr, "model: %s\n", info.repack_note.c_str());
    if (info.n_repacked_bytes > 0) {
        std::fprintf(stderr, "model: %.1f MiB of weights repacked 8 rows to a record (--no-repack: as stored)\n",
                     info.n_repacked_bytes / 1048576.0);
    }
    if (!info.summary.empty()) std::fprintf(stderr, "model: %s\n", info.summary.c_str());
    return model;
}

std::string read_file(const std::string &path) {
    // A directory opens as a stream that reads nothing: refused by name, not taken as an empty text.
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw_error("'%s' is a directory, not a file", path.c_str());
    std::ifstream in(path, std::ios::binary);
    if (!in) throw_error("cannot open '%s'", path.c_str());
    std::ostringstream ss;
    if (in.peek() != std::ifstream::traits_type::eof()) ss << in.rdbuf();  // << of an empty file sets failbit
    if (in.bad() || ss.fail()) throw_error("cannot read '%s'", path.c_str());
    return ss.str();
}

int64_t peak_rss_bytes() {
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

void print_sparse_stats(const Context &ctx, bool enabled) {
    if (!enabled) return;
    const SparseStats st = ctx.sparse_stats();
    if (st.layers.empty()) {
        std::fprintf(stderr, "dsa-stats: this model has no sparse attention\n");
        return;
    }
    std::fprintf(stderr,
                 "dsa-stats: time in indexer %.3f ms (selection call %.3f ms), in attention %.3f ms (attention "
                 "kernel %.3f ms)\n",
                 1e3 * st.indexer_seconds, 1e3 * st.select_seconds, 1e3 * st.attention_seconds,
                 1e3 * st.attend_seconds);
    std::fprintf(stderr,
                 "dsa-stats: selection call by phase: plan %.3f ms, scoring %.3f ms, merge %.3f ms, exact re-scoring "
                 "%.3f ms, choice %.3f ms\n",
                 1e3 * st.select_phases.plan, 1e3 * st.select_phases.score, 1e3 * st.select_phases.merge,
                 1e3 * st.select_phases.rescore, 1e3 * st.select_phases.choose);
    std::fprintf(stderr, "  layer  indexer  queries  keys/query  visible/query  fraction\n");
    for (const SparseLayerStats &l : st.layers) {
        const double n = l.n_queries > 0 ? double(l.n_queries) : 1.0;
        std::fprintf(stderr, "  %5lld  %-7s  %7lld  %10.1f  %13.1f  %7.1f%%\n", (long long)l.layer,
                     l.shared ? "shared" : "full", (long long)l.n_queries, l.keys_attended / n, l.keys_visible / n,
                     l.keys_visible > 0 ? 100.0 * l.keys_attended / l.keys_visible : 100.0);
    }
}

void print_context_summary(const Context &ctx) {
    const ContextParams &params = ctx.params();
    const ModelInfo &info = model_info(ctx.model());
    // Which stores are Hadamard-rotated (ContextParams::cache_rotation), named as the types are.
    const auto rotated = [&](CacheType t) { return cache_rotated(params.cache_rotation, t); };
    std::string types;
    if (info.has_indexer) {  // MLA: one latent store (-ctk), which is both K and V
        types = strprintf("latent %s%s, indexer %s%s", cache_type_name(params.cache_type_k),
                          rotated(params.cache_type_k) ? " rotated" : "", cache_type_name(params.indexer_cache_type),
                          rotated(params.indexer_cache_type) ? " rotated" : "");
    } else {
        types = strprintf("K %s%s, V %s%s", cache_type_name(params.cache_type_k),
                          rotated(params.cache_type_k) ? " rotated" : "", cache_type_name(params.cache_type_v),
                          rotated(params.cache_type_v) ? " rotated" : "");
    }
    std::fprintf(stderr, "KV cache %lld cells: %.1f MiB (%s)\n", (long long)ctx.n_ctx(), ctx.cache_bytes() / 1048576.0,
                 types.c_str());
    if (!info.has_indexer) return;
    if (!params.dsa) {
        std::fprintf(stderr, "sparse attention: off (dense attention over every key; --dsa on to enable)\n");
        return;
    }
    const std::string products =
        params.indexer_fast
            ? strprintf("fast indexer products (%d-bit queries x int8 keys, exact re-scoring at the cut)",
                        indexer_fast_query_bits())
            : std::string("exact indexer products");
    std::fprintf(stderr, "sparse attention: on, top-k %lld, %s%s\n",
                 (long long)(params.dsa_top_k > 0 ? params.dsa_top_k : info.indexer_top_k), products.c_str(),
                 params.dsa_sink > 0 ? strprintf(", %lld attention sinks", (long long)params.dsa_sink).c_str() : "");
}

}  // namespace sparrow::tools
