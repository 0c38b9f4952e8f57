// `sparrow run`: tokenize a prompt, evaluate it, then sample and stream a continuation; or, with
// --conversation, a chat read from standard input, one user message per line.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <vector>

#include "commands.h"
#include "common.h"
#include "core/error.h"
#include "npy.h"
#include "runtime/context_shift.h"
#include "runtime/grammar_constraint.h"
#include "runtime/json_prefix.h"
#include "runtime/json_schema.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

namespace sparrow::tools {

namespace {
struct RunFlags {
    ModelFlags model;
    std::string prompt;
    std::string prompt_file;  // the prompt text from a file (-f)
    int64_t n_predict = 64;   // -1: until an end-of-generation token or a full context
    SamplingFlags sampling;
    bool verbose_prompt = false;      // print the prompt's token ids (each turn's, in a conversation) to stderr
    bool conversation = false;        // chat turns from stdin (--conversation)
    std::string system_prompt;        // conversation: the system message
    std::string chat_format;          // conversation: empty = recognised from the model's chat template
    std::string prompt_ids_path;      // ids used verbatim (no BOS added)
    std::string dump_logits_path;     // logits of the last prompt position, as .npy
    std::string dump_selection_path;  // per layer, the keys the last prompt queries attended (JSON)
    bool json = false;                // JSON mode: each reply is one JSON object (runtime/json_prefix.h)
    std::string json_schema;          // --json-schema: the reply is a document this schema (JSON text) accepts
    std::string json_schema_file;     // --json-schema-file: the same, from a file
    std::string grammar;              // --grammar: the reply is a text this GBNF grammar derives
    std::string grammar_file;         // --grammar-file: the same, from a file
    bool context_shift = false;       // a full context drops the older half of what follows the kept tokens
    int64_t n_keep = 0;               // --keep: prompt tokens a context shift keeps (-1: the whole prompt)
};

// Throws, naming the flag, when `path` could not be created later: its folder is missing or not writable, it names
// a folder, or it exists (a file or a link, dangling or not) and cannot be opened for writing. Checked before the
// prompt is decoded (minutes for a long prompt on a big model), not after.
void check_output_path(const char *flag, const std::string &path) {
    if (path.empty()) return;
    std::error_code ec;
    const std::filesystem::path p(path);
    if (std::filesystem::is_directory(p, ec)) throw_error("%s: '%s' is a folder", flag, path.c_str());
    const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
    if (!std::filesystem::is_directory(dir, ec)) {
        throw_error("%s: cannot create '%s': the folder '%s' does not exist", flag, path.c_str(), dir.c_str());
    }
    if (access(dir.c_str(), W_OK) != 0) {
        throw_error("%s: cannot create '%s': the folder '%s' is not writable", flag, path.c_str(), dir.c_str());
    }
    // An existing entry: opened to append (nothing truncated; a dangling link's file made where it points, or
    // refused when it points nowhere), the way the file will be opened after decoding, but now.
    if (std::filesystem::exists(std::filesystem::symlink_status(p, ec))) {
        FILE *probe = std::fopen(path.c_str(), "ab");
        if (!probe) throw_error("%s: cannot write '%s': %s", flag, path.c_str(), std::strerror(errno));
        std::fclose(probe);
    }
}

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
    const auto is_separator = [](char c) { return std::isspace(static_cast<unsigned char>(c)) || c == ','; };
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
        if (is_separator(text[i])) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
        if (j == i) {
            size_t end = i;  // the offending word, up to the next separator (at most 32 bytes shown)
            while (end < text.size() && end - i < 32 && !is_separator(text[end])) ++end;
            throw_error("%s: expected a token id at byte %zu, found '%s'", path.c_str(), i,
                        text.substr(i, end - i).c_str());
        }
        int32_t id = 0;  // digits only, so the one failure left is a value beyond int32 (leading zeros are fine)
        if (std::from_chars(text.data() + i, text.data() + j, id).ec != std::errc()) {
            const std::string digits = text.substr(i, std::min<size_t>(j - i, 32));
            throw_error("%s: token id %s%s at byte %zu is too large", path.c_str(), digits.c_str(),
                        j - i > 32 ? "..." : "", i);
        }
        ids.push_back(id);
        i = j;
    }
    return ids;
}

// Prompt tokens [from, end) decoded for sequence 0 at their positions, n_batch at a time; the last asks for logits.
// Adds the last decode call's recorded selections to `into`, which keeps per layer the last queries (as many as
// a call records) since the layer last attended densely: --dump-selection shows the prompt's last queries
// whatever -b splits it into.
void roll_selections(std::vector<LayerSelection> &into, std::vector<LayerSelection> last) {
    if (into.size() != last.size()) {
        into = std::move(last);
        return;
    }
    for (size_t l = 0; l < into.size(); ++l) {
        if (into[l].dense || last[l].dense) {
            into[l] = std::move(last[l]);
            continue;
        }
        std::vector<QuerySelection> &q = into[l].queries;
        q.insert(q.end(), std::make_move_iterator(last[l].queries.begin()),
                 std::make_move_iterator(last[l].queries.end()));
        if (std::ssize(q) > kRecordedQueries) q.erase(q.begin(), q.end() - kRecordedQueries);
    }
}

// Decodes prompt[from, end) in calls of at most -b tokens; with `selections`, rolls each call's into it.
void decode_prompt(Context &ctx, const std::vector<int32_t> &prompt, size_t from,
                   std::vector<LayerSelection> *selections = nullptr) {
    std::vector<BatchToken> batch;
    for (size_t start = from; start < prompt.size(); start += static_cast<size_t>(ctx.params().n_batch)) {
        const size_t end = std::min(prompt.size(), start + static_cast<size_t>(ctx.params().n_batch));
        batch.clear();
        for (size_t i = start; i < end; ++i) {
            batch.push_back({prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size()});
        }
        ctx.decode(batch);
        if (selections) roll_selections(*selections, ctx.last_selections());
    }
}

// --json, --json-schema or --grammar: what constrains each reply (nothing when none is given).
struct ReplyConstraint {
    bool json = false;
    std::shared_ptr<const JsonSchema> schema;
    std::shared_ptr<const Grammar> grammar;
    JsonVocabulary vocab;           // the vocabulary's texts, made by prepare() when a constraint is given
    std::optional<TokenTrie> trie;  // and their trie, for a grammar

    bool any() const { return json || schema || grammar; }
    const char *what() const { return grammar ? "grammar's text" : "JSON object"; }
    void prepare(const Tokenizer &tok) {
        if (!any() || !vocab.pieces.empty()) return;
        vocab = json_vocabulary(tok);
        if (grammar) trie.emplace(vocab.pieces, vocab.eog);
    }
    std::unique_ptr<TokenConstraint> make() const {
        if (grammar) return std::make_unique<GrammarConstraint>(grammar, vocab.pieces, vocab.eog, *trie);
        return std::make_unique<JsonConstraint>(vocab, std::string(), schema);
    }
};

struct Continuation {
    std::vector<int32_t> tokens;  // sampled, an end-of-generation token excluded
    std::string text;             // their pieces, as printed
    int64_t n_sampled = 0;        // tokens sampled (an end-of-generation token included)
    int64_t n_decoded = 0;        // of `tokens`, those now in the cache (all but the last)
    bool context_full = false;    // stopped because the next token had no cell
    bool dead_end = false;        // constrained: stopped because no token could continue the text
    int64_t n_shifts = 0;         // context shifts (shift_keep >= 0)
    int64_t n_dropped = 0;        // positions they dropped
};

// Samples from `logits` (those of the token at pos - 1) and decodes each sampled token at pos, pos + 1, ...
// until an end-of-generation token, `limit` sampled tokens (-1: no limit) or a full context; prints the
// pieces as they come. With shift_keep >= 0 a full context is shifted instead (Context::context_shift: the
// first shift_keep positions stay, the older half of the rest goes) and generation goes on.
Continuation continue_from(Context &ctx, Sampler &sampler, LogitAdjuster &adjuster, const Tokenizer &tok,
                           std::span<const float> logits, int32_t pos, int64_t limit, int32_t shift_keep = -1,
                           const ReplyConstraint *constraint = nullptr) {
    Continuation c;
    // Constrained (JSON mode, a schema or a grammar): only the text's prefixes, ended once whole.
    const std::unique_ptr<TokenConstraint> json = constraint ? constraint->make() : nullptr;
    std::vector<float> masked;
    while (limit < 0 || c.n_sampled < limit) {
        const std::span<const float> adjusted = adjuster.apply(logits);
        const int32_t next = json ? sample_constrained(sampler, adjusted, *json, masked) : sampler.sample(adjusted);
        if (next < 0) {  // constrained: nothing may follow (a whole text with its end banned, or a dead end)
            c.dead_end = !json->complete();
            break;
        }
        ++c.n_sampled;
        if (tok.is_eog(next)) break;
        adjuster.accept(next);
        c.tokens.push_back(next);
        const std::string piece = tok.token_to_piece(next);
        c.text += piece;
        std::fwrite(piece.data(), 1, piece.size(), stdout);  // bytes as they are: a piece may hold a NUL
        std::fflush(stdout);
        if (c.n_sampled == limit) break;
        if (pos >= ctx.n_ctx() && shift_keep >= 0) {
            const int32_t dropped = ctx.context_shift(0, shift_keep);
            pos -= dropped;
            c.n_dropped += dropped;
            c.n_shifts += dropped > 0 ? 1 : 0;
        }
        if (pos >= ctx.n_ctx()) {
            c.context_full = true;
            break;
        }
        const BatchToken t{next, pos++, 0, true};
        ctx.decode(std::span<const BatchToken>(&t, 1));
        ++c.n_decoded;
        logits = ctx.logits(0);
    }
    return c;
}

// --verbose-prompt: "prompt ids (N): id id ..." on stderr.
void print_prompt_ids(const std::vector<int32_t> &ids) {
    std::fprintf(stderr, "prompt ids (%zu):", ids.size());
    for (const int32_t id : ids) std::fprintf(stderr, " %d", id);
    std::fputs("\n", stderr);
}

void print_memory(const Model &model, const Context &ctx) {
    std::fprintf(stderr,
                 "peak resident memory %.1f MiB (weights %.1f MiB, %.1f MiB of them repacked; KV cache %.1f MiB)\n",
                 peak_rss_bytes() / 1048576.0, model_info(model).n_weight_bytes / 1048576.0,
                 model_info(model).n_repacked_bytes / 1048576.0, ctx.cache_bytes() / 1048576.0);
}

void print_sampling(const RunFlags &f, const Context &ctx, uint64_t seed) {
    std::fprintf(stderr,
                 "context: %lld cells, batch %lld, ubatch %lld, cache %s/%s; sampling: temp %.2f, top-k %d, "
                 "top-p %.2f, min-p %.2f%s, seed %llu\n",
                 (long long)ctx.n_ctx(), (long long)ctx.params().n_batch, (long long)ctx.params().n_ubatch,
                 cache_type_name(ctx.params().cache_type_k), cache_type_name(ctx.params().cache_type_v),
                 f.sampling.temp, f.sampling.top_k, f.sampling.top_p, f.sampling.min_p,
                 f.sampling.describe_adjustments().c_str(), (unsigned long long)seed);
}

// The positions a context shift keeps: a BOS the prompt starts with, and --keep N of its tokens after that (-1:
// all of them), as llama.cpp counts them. A shift needs at least two positions after them; when they leave less,
// `strict` refuses, else shifts are off (-1).
int32_t shift_keep_for(const RunFlags &f, std::span<const int32_t> prompt, const Tokenizer &tok, int64_t n_ctx,
                       bool strict) {
    const int64_t keep = context_shift_keep(prompt, tok.bos_id(), f.n_keep);
    if (keep <= n_ctx - 2) return static_cast<int32_t>(keep);
    if (strict) {
        throw_error(
            "--keep: keeping %lld prompt tokens leaves a context shift no room in the context of %lld tokens "
            "(lower --keep or raise -c)",
            (long long)keep, (long long)n_ctx);
    }
    return -1;
}

void print_shifts(const Continuation &c, int32_t keep) {
    if (c.n_shifts == 0) return;
    std::fprintf(stderr, "run: the context was shifted %lld time%s (%lld positions dropped after the first %d)\n",
                 (long long)c.n_shifts, c.n_shifts == 1 ? "" : "s", (long long)c.n_dropped, keep);
}

// The conversation: each user message (the prompt first when there is one, then each line of stdin) joins
// the messages, the chat format renders them all with the assistant's generation prompt, and the rendering's
// tokens are decoded past the prefix the cache already holds (as a server slot reuses its cached prefix),
// so a turn costs its own tokens. The reply is printed, then a newline. When the rendering leaves too little
// room for a reply, the oldest exchanges are dropped (then only the cached part before them is reused); a
// message that does not fit even alone is refused with a notice, and a reply that
// fills the context is cut. The conversation goes on in each case.
// --json-schema / --json-schema-file compiled (runtime/json_schema.h), or none.
std::shared_ptr<const JsonSchema> read_json_schema(const RunFlags &f) {
    if (f.json_schema.empty() && f.json_schema_file.empty()) return nullptr;
    const char *flag = f.json_schema.empty() ? "--json-schema-file" : "--json-schema";
    const std::string text = f.json_schema.empty() ? read_file(f.json_schema_file) : f.json_schema;
    nlohmann::json schema;
    try {
        schema = nlohmann::json::parse(text);
    } catch (const std::exception &e) {
        throw_error("%s: not JSON (%s)", flag, e.what());
    }
    try {
        return std::make_shared<const JsonSchema>(JsonSchema::compile(schema));
    } catch (const std::exception &e) {
        throw_error("%s: %s", flag, e.what());
    }
}

// --grammar / --grammar-file compiled (runtime/grammar.h) against the model's vocabulary (its token matches), or
// none.
std::shared_ptr<const Grammar> read_grammar(const RunFlags &f, const Tokenizer &tok) {
    if (f.grammar.empty() && f.grammar_file.empty()) return nullptr;
    const char *flag = f.grammar.empty() ? "--grammar-file" : "--grammar";
    const TokenLookup lookup{[&tok](std::string_view text) { return tok.find_token(text); }, tok.n_vocab()};
    try {
        return std::make_shared<const Grammar>(
            Grammar::parse(f.grammar.empty() ? read_file(f.grammar_file) : f.grammar, &lookup));
    } catch (const std::exception &e) {
        throw_error("%s: %s", flag, e.what());
    }
}

// `constraint`: the replies' (read by run() before the model loaded), its vocabulary not yet made.
int converse(const RunFlags &f, const Model &model, Context &ctx, ReplyConstraint &constraint) {
    const Tokenizer &tok = model_tokenizer(model);
    const server::ChatFormat format = choose_chat_format(f.chat_format, model, "run");
    const uint64_t seed = f.sampling.resolved_seed();
    print_sampling(f, ctx, seed);
    std::fprintf(stderr, "conversation: chat format %s; one message per line of standard input, end with EOF\n",
                 server::chat_format_name(format));
    const server::ChatOptions opts = server::chat_options_for(tok);
    std::vector<server::ChatMessage> messages;
    if (!f.system_prompt.empty()) messages.push_back({"system", f.system_prompt, std::nullopt});

    Sampler sampler(f.sampling.params(seed));
    LogitAdjuster adjuster(f.sampling.adjustments(tok), end_of_generation_ids(tok));
    constraint.prepare(tok);
    std::vector<int32_t> cached;  // the tokens sequence 0 holds, at positions 0, 1, ...
    std::optional<std::string> first = f.prompt;
    if (!f.prompt_file.empty()) first = read_file(f.prompt_file);
    if (first && first->empty()) first.reset();
    const bool interactive = ::isatty(STDIN_FILENO) != 0;
    int64_t n_turns = 0, n_prompt_decoded = 0, n_generated = 0;
    double prompt_s = 0, gen_s = 0;
    for (std::string line;;) {
        std::string user;
        if (first) {
            user = std::move(*first);
            first.reset();
        } else {
            if (interactive) {
                std::fputs("> ", stdout);
                std::fflush(stdout);
            }
            if (!std::getline(std::cin, line)) break;
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.empty()) continue;
            user = line;
        }
        messages.push_back({"user", user, std::nullopt});
        // The rendering must leave room for the reply: -n tokens, or a quarter of the context when replies are
        // unbounded. Without it, the oldest exchanges (a user message and what follows up to the next one; system
        // messages stay) are dropped, as a chat front end truncates its history.
        // With --context-shift a reply may outgrow the context, so it needs no more than the quarter.
        const int64_t quarter = std::max<int64_t>(ctx.n_ctx() / 4, 1);
        const int64_t room = f.n_predict < 0   ? quarter
                             : f.context_shift ? std::min(std::max<int64_t>(f.n_predict, 1), quarter)
                                               : std::max<int64_t>(f.n_predict, 1);
        const auto render = [&] {
            return tok.encode(server::apply_chat_format(format, messages, opts), /*add_special=*/false,
                              /*parse_special=*/true);
        };
        std::vector<int32_t> prompt = render();
        int64_t n_dropped = 0;
        while (static_cast<int64_t>(prompt.size()) + room > ctx.n_ctx()) {
            const auto first_user = std::find_if(messages.begin(), messages.end(),
                                                 [](const server::ChatMessage &m) { return m.role == "user"; });
            const auto next_user = std::find_if(first_user + 1, messages.end(),
                                                [](const server::ChatMessage &m) { return m.role == "user"; });
            if (next_user == messages.end()) break;  // only the new message is left
            messages.erase(first_user, next_user);
            ++n_dropped;
            prompt = render();
        }
        if (static_cast<int64_t>(prompt.size()) + room > ctx.n_ctx()) {
            std::fprintf(stderr,
                         "run: this message makes a rendering of %zu tokens, which leaves less than %lld tokens for a "
                         "reply in the context of %lld tokens even without earlier turns; it was not sent (raise -c)\n",
                         prompt.size(), (long long)room, (long long)ctx.n_ctx());
            messages.pop_back();
            continue;
        }
        if (n_dropped > 0) {
            std::fprintf(stderr, "run: the %lld oldest exchange%s dropped to fit the context of %lld tokens\n",
                         (long long)n_dropped, n_dropped == 1 ? " was" : "s were", (long long)ctx.n_ctx());
        }
        if (f.verbose_prompt) print_prompt_ids(prompt);
        // Keep the cached prefix the rendering starts with; at least the last token is decoded again (its
        // logits start the reply).
        const size_t common = static_cast<size_t>(
            std::mismatch(cached.begin(), cached.end(), prompt.begin(), prompt.end()).first - cached.begin());
        const size_t keep = std::min(common, prompt.size() - 1);
        ctx.seq_rm(0, static_cast<int32_t>(keep), -1);
        const Stopwatch prompt_clock;
        decode_prompt(ctx, prompt, keep);
        prompt_s += prompt_clock.seconds();
        n_prompt_decoded += static_cast<int64_t>(prompt.size() - keep);
        cached = prompt;
        adjuster.start(prompt);  // the penalties see the whole conversation as rendered

        const Stopwatch gen_clock;
        const size_t last =
            (prompt.size() - keep - 1) % static_cast<size_t>(ctx.params().n_batch);  // in the last batch
        const int32_t shift_keep = f.context_shift ? shift_keep_for(f, prompt, tok, ctx.n_ctx(), false) : -1;
        const Continuation c =
            continue_from(ctx, sampler, adjuster, tok, ctx.logits(last), static_cast<int32_t>(prompt.size()),
                          f.n_predict, shift_keep, constraint.any() ? &constraint : nullptr);
        gen_s += gen_clock.seconds();
        std::fputs("\n", stdout);
        std::fflush(stdout);
        ++n_turns;
        n_generated += c.n_sampled;
        cached.insert(cached.end(), c.tokens.begin(), c.tokens.begin() + c.n_decoded);
        if (c.n_shifts > 0) {
            // The rows after the kept ones were computed with a longer history: only the kept prefix is reused.
            print_shifts(c, shift_keep);
            cached.resize(static_cast<size_t>(shift_keep));
            ctx.seq_rm(0, shift_keep, -1);
        }
        messages.push_back({"assistant", c.text, std::nullopt});
        if (c.context_full) {
            std::fprintf(stderr,
                         "run: the reply filled the context of %lld tokens and was cut; the next message "
                         "drops the oldest exchanges\n",
                         (long long)ctx.n_ctx());
        }
        if (c.dead_end)
            std::fprintf(stderr,
                         "run: no token of the vocabulary (with the logit biases given) continues the %s; the reply "
                         "ends there\n",
                         constraint.what());
    }
    print_sparse_stats(ctx, f.model.dsa_stats);
    print_memory(model, ctx);
    std::fprintf(stderr,
                 "\nturns: %lld | prompt: %lld tokens decoded in %.2f ms | generation: %lld tokens in %.2f ms "
                 "(%.1f tokens/s)\n",
                 (long long)n_turns, (long long)n_prompt_decoded, prompt_s * 1e3, (long long)n_generated, gen_s * 1e3,
                 n_generated > 0 ? n_generated / gen_s : 0.0);
    return 0;
}

int run(const RunFlags &f) {
    check_output_path("--dump-logits", f.dump_logits_path);
    check_output_path("--dump-selection", f.dump_selection_path);
    // Before the model loads: a bad schema fails fast (a grammar's token matches need the vocabulary).
    ReplyConstraint constraint;
    constraint.json = f.json;
    constraint.schema = read_json_schema(f);
    auto model = load_model_verbose(f.model);
    const Tokenizer &tok = model_tokenizer(*model);
    constraint.grammar = read_grammar(f, tok);
    ContextParams cp = f.model.context_params();
    cp.record_selections = !f.dump_selection_path.empty();
    Context ctx(model, cp);
    print_context_summary(ctx);
    if (f.conversation) return converse(f, *model, ctx, constraint);

    const std::string text = f.prompt_file.empty() ? f.prompt : read_file(f.prompt_file);
    const std::vector<int32_t> prompt = f.prompt_ids_path.empty()
                                            ? tok.encode(text, /*add_special=*/true, /*parse_special=*/true)
                                            : read_prompt_ids(f.prompt_ids_path);
    if (prompt.empty()) {
        if (!f.prompt_ids_path.empty()) throw_error("'%s' holds no token ids", f.prompt_ids_path.c_str());
        throw_error("the prompt is empty (and the model adds no BOS token)");
    }
    if (f.n_predict < 0 && static_cast<int64_t>(prompt.size()) > ctx.n_ctx()) {
        throw_error("the prompt (%zu tokens) does not fit in the context of %lld tokens (raise -c)", prompt.size(),
                    (long long)ctx.n_ctx());
    }
    // The prompt's tokens and every generated token but the last (sampled, printed, never decoded) need a cell,
    // unless context shifts make room.
    if (f.context_shift && static_cast<int64_t>(prompt.size()) > ctx.n_ctx()) {
        throw_error("the prompt (%zu tokens) does not fit in the context of %lld tokens (raise -c)", prompt.size(),
                    (long long)ctx.n_ctx());
    }
    const int32_t shift_keep = f.context_shift ? shift_keep_for(f, prompt, tok, ctx.n_ctx(), true) : -1;
    if (!f.context_shift && f.n_predict >= 0 &&
        static_cast<int64_t>(prompt.size()) + std::max<int64_t>(f.n_predict - 1, 0) > ctx.n_ctx()) {
        throw_error(
            "the prompt (%zu tokens) plus %lld tokens to generate does not fit in the context of %lld tokens "
            "(raise -c, lower -n or allow --context-shift)",
            prompt.size(), (long long)f.n_predict, (long long)ctx.n_ctx());
    }
    const uint64_t seed = f.sampling.resolved_seed();
    print_sampling(f, ctx, seed);
    if (f.verbose_prompt) print_prompt_ids(prompt);

    const std::string shown = f.prompt_ids_path.empty() ? text : tok.decode(prompt);
    std::fwrite(shown.data(), 1, shown.size(), stdout);
    std::fflush(stdout);

    const Stopwatch prompt_clock;
    std::vector<LayerSelection> selections;
    decode_prompt(ctx, prompt, 0, f.dump_selection_path.empty() ? nullptr : &selections);
    const double prompt_s = prompt_clock.seconds();
    const size_t last = (prompt.size() - 1) % static_cast<size_t>(ctx.params().n_batch);  // in the last batch
    if (!f.dump_logits_path.empty()) {
        const auto logits = ctx.logits(last);
        write_npy_f32(f.dump_logits_path, logits, {static_cast<int64_t>(logits.size())});
    }
    if (!f.dump_selection_path.empty()) write_selection_json(f.dump_selection_path, selections);

    Sampler sampler(f.sampling.params(seed));
    LogitAdjuster adjuster(f.sampling.adjustments(tok), end_of_generation_ids(tok));
    adjuster.start(prompt);
    constraint.prepare(tok);
    const Stopwatch gen_clock;
    const Continuation c =
        continue_from(ctx, sampler, adjuster, tok, ctx.logits(last), static_cast<int32_t>(prompt.size()), f.n_predict,
                      shift_keep, constraint.any() ? &constraint : nullptr);
    const double gen_s = gen_clock.seconds();
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (c.context_full)
        std::fprintf(stderr, "run: stopped at the end of the context (%lld tokens)\n", (long long)ctx.n_ctx());
    if (c.dead_end) {
        std::fprintf(stderr, "run: no token of the vocabulary (with the logit biases given) continues the %s\n",
                     constraint.what());
        return 1;
    }
    print_shifts(c, shift_keep);
    print_sparse_stats(ctx, f.model.dsa_stats);
    print_memory(*model, ctx);
    std::fprintf(stderr,
                 "\nprompt: %zu tokens in %.2f ms (%.1f tokens/s) | generation: %lld tokens in %.2f ms "
                 "(%.1f tokens/s)\n",
                 prompt.size(), prompt_s * 1e3, prompt.size() / prompt_s, (long long)c.n_sampled, gen_s * 1e3,
                 c.n_sampled > 0 ? c.n_sampled / gen_s : 0.0);
    return 0;
}
}  // namespace

Command register_run(CLI::App &app) {
    auto *cmd = app.add_subcommand("run", "Generate text from a prompt, or hold a conversation (--conversation)");
    auto f = std::make_shared<RunFlags>();
    f->model.add_to(*cmd, 0);
    auto *prompt = cmd->add_option("-p,--prompt", f->prompt, "Prompt text (--conversation: the first user message)");
    auto *file = cmd->add_option("-f,--file", f->prompt_file, "Prompt text from a file (as -p)");
    auto *ids = cmd->add_option("--prompt-ids", f->prompt_ids_path, "File of prompt token ids (used verbatim)");
    prompt->excludes(ids);
    prompt->excludes(file);
    file->excludes(ids);
    auto *logits =
        cmd->add_option("--dump-logits", f->dump_logits_path, "Write the last prompt position's logits (.npy)");
    auto *selection =
        cmd->add_option("--dump-selection", f->dump_selection_path,
                        "Write, per layer, the keys the last prompt queries attended (.json; sparse-attention models)");
    auto *n_predict = cmd->add_option("-n,--n-predict", f->n_predict,
                                      "Tokens to generate (-1 = until an end-of-generation token or a full context; "
                                      "--conversation: per reply, default -1)")
                          ->check(CLI::Range(int64_t(-1), kMaxCount));
    f->sampling.add_to(*cmd);
    auto *shift =
        cmd->add_flag("--context-shift", f->context_shift,
                      "When generation fills the context, drop the older half of what follows the kept prompt tokens "
                      "(--keep) and go on, as llama.cpp does (keys re-rotated; -n may then exceed the context)");
    auto *json_flag = cmd->add_flag(
        "--json", f->json,
        "JSON mode: the reply is one JSON object (only tokens that keep it so are sampled; it ends once whole)");
    auto *schema_text = cmd->add_option("--json-schema", f->json_schema,
                                        "JSON mode with a JSON Schema (given as JSON text) the reply must satisfy: "
                                        "the subset structured outputs use (see README)");
    auto *schema_file = cmd->add_option("--json-schema-file", f->json_schema_file, "--json-schema read from this file")
                            ->check(CLI::ExistingFile)
                            ->excludes(schema_text);
    auto *grammar_text =
        cmd->add_option("--grammar", f->grammar,
                        "The reply is a text this GBNF grammar (llama.cpp's format, rule 'root') derives; it ends once "
                        "whole")
            ->excludes(json_flag)
            ->excludes(schema_text)
            ->excludes(schema_file);
    cmd->add_option("--grammar-file", f->grammar_file, "--grammar read from this file")
        ->check(CLI::ExistingFile)
        ->excludes(grammar_text)
        ->excludes(json_flag)
        ->excludes(schema_text)
        ->excludes(schema_file);
    cmd->add_option("--keep", f->n_keep,
                    "Prompt tokens a context shift keeps after a BOS, which always stays (-1 = the whole prompt; "
                    "--conversation: of each turn's rendering; default 0)")
        ->check(CLI::Range(int64_t(-1), kMaxCount))
        ->needs(shift);
    cmd->add_flag("--verbose-prompt", f->verbose_prompt,
                  "Print the prompt's token ids to stderr (--conversation: each turn's whole rendering)");
    auto *conversation =
        cmd->add_flag("--conversation", f->conversation,
                      "Chat: each line of standard input is a user message, answered in the model's chat format");
    auto *system = cmd->add_option("--system-prompt", f->system_prompt, "--conversation: the system message");
    auto *format = add_chat_format_option(*cmd, f->chat_format);
    conversation->excludes(ids)->excludes(logits)->excludes(selection);
    system->needs(conversation);
    format->needs(conversation);
    return [f, prompt, file, ids, n_predict, conversation] {
        if (f->conversation) {
            if (n_predict->count() == 0) f->n_predict = -1;
            return run(*f);
        }
        if (prompt->count() == 0 && file->count() == 0 && ids->count() == 0) {
            throw_error("run: give a prompt (-p, -f or --prompt-ids), or --conversation");
        }
        return run(*f);
    };
}

}  // namespace sparrow::tools
