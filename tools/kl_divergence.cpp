#include "kl_divergence.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace sparrow::tools::kl {

namespace {

constexpr char kMagic[8] = {'S', 'P', 'R', 'W', 'K', 'L', 'D', '\0'};
constexpr uint32_t kVersion = 1;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Bytes of the fixed part of the header (magic, version, n_top, n_vocab, n_ctx, n_chunks, n_scored).
constexpr int64_t kHeaderFixedBytes = 8 + 4 + 4 + 8 * 4;

int64_t record_bytes(int64_t n_top) { return 8 + n_top * 8; }

// Sort key of a log-probability: NaN (from NaN logits) ranks below everything, so ordering stays strict.
double rank_key(double v) { return std::isnan(v) ? kNegInf : v; }

// P (ln P - ln Q) for one bucket, from log-probabilities: 0 when P = 0, +inf when Q = 0 < P.
double kl_term(double log_p, double log_q) {
    if (log_p == kNegInf) return 0.0;
    if (log_q == kNegInf) return std::numeric_limits<double>::infinity();
    return std::exp(log_p) * (log_p - log_q);
}

// ln of the probability mass of the tokens not marked, summed in token order (the same arithmetic for the
// base and the compared run, so a run against itself gets the same float), rounded to float.
float log_unmarked_mass(std::span<const double> log_p, const std::vector<uint8_t> &mark) {
    double rest = 0.0;
    for (size_t v = 0; v < log_p.size(); ++v) {
        if (!mark[v]) rest += std::exp(log_p[v]);
    }
    return rest > 0.0 ? static_cast<float>(std::log(rest)) : -std::numeric_limits<float>::infinity();
}

// A record's log-probabilities are <= 0 (-inf allowed: a token of probability 0), never NaN, and the top N come
// in descending order. The writer refuses anything else (NaN logits from the model) and the reader calls it
// damage, which would otherwise surface as a NaN or negative KL.
bool log_probs_valid(const Record &r) {
    const auto ok = [](float v) { return v <= 0.0f; };  // false for NaN
    if (!ok(r.log_p_target) || !ok(r.log_p_rest)) return false;
    for (size_t i = 0; i < r.log_p.size(); ++i) {
        if (!ok(r.log_p[i]) || (i > 0 && r.log_p[i] > r.log_p[i - 1])) return false;
    }
    return true;
}

void set_marks(std::vector<uint8_t> &mark, size_t n_vocab, const std::vector<int32_t> &ids, uint8_t value) {
    if (mark.size() != n_vocab) mark.assign(n_vocab, 0);
    for (int32_t id : ids) mark[static_cast<size_t>(id)] = value;
}

// Beyond log_probs_valid: a record is a distribution over the vocabulary, its top tokens distinct (ids in
// [0, n_vocab)) and their mass plus the rest's 1. Against a distribution KL is >= 0 (Gibbs); a repeated id or a
// changed mass could make it negative. The tolerance covers rounding each log-probability to float (relative
// |ln p| * 2^-24 on each p, ~1e-5 at most for the ln p that carry mass).
const char *distribution_error(const Record &r, std::vector<uint8_t> &mark, size_t n_vocab) {
    if (mark.size() != n_vocab) mark.assign(n_vocab, 0);
    const char *error = nullptr;
    size_t n_marked = 0;
    for (; n_marked < r.ids.size(); ++n_marked) {
        uint8_t &m = mark[static_cast<size_t>(r.ids[n_marked])];
        if (m) {
            error = "a token id repeated among the top tokens";
            break;
        }
        m = 1;
    }
    for (size_t i = 0; i < n_marked; ++i) mark[static_cast<size_t>(r.ids[i])] = 0;
    if (error) return error;
    double mass = std::exp(double(r.log_p_rest));
    for (float v : r.log_p) mass += std::exp(double(v));
    return std::fabs(mass - 1.0) <= 1e-4 ? nullptr : "probabilities that do not sum to 1";
}

double mean_std_error(double sum, double sum2, int64_t n) {
    if (n < 2) return 0.0;
    const double mean = sum / double(n);
    const double var = std::max(0.0, sum2 / double(n) - mean * mean);
    return std::sqrt(var / double(n - 1));
}

}  // namespace

void log_softmax(std::span<const float> logits, std::vector<double> &out) {
    out.resize(logits.size());
    if (logits.empty()) return;
    float max = logits[0];
    for (float v : logits) max = std::max(max, v);
    double sum = 0.0;
    for (float v : logits) sum += std::exp(double(v) - max);
    const double log_sum = std::log(sum);
    for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - max - log_sum;
}

Record summarize(std::span<const double> log_p, int64_t n_top, int32_t target, std::vector<uint8_t> &mark) {
    const int64_t n_vocab = static_cast<int64_t>(log_p.size());
    if (target < 0 || target >= n_vocab) throw_error("KL divergence: target token %d out of range", target);
    const int64_t k = std::min(n_top, n_vocab);
    std::vector<int32_t> order(static_cast<size_t>(n_vocab));
    for (int64_t i = 0; i < n_vocab; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        const double ka = rank_key(log_p[static_cast<size_t>(a)]), kb = rank_key(log_p[static_cast<size_t>(b)]);
        return ka > kb || (ka == kb && a < b);
    });
    Record r;
    r.ids.assign(order.begin(), order.begin() + k);
    r.log_p.resize(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i)
        r.log_p[static_cast<size_t>(i)] = static_cast<float>(log_p[static_cast<size_t>(r.ids[i])]);
    r.log_p_target = static_cast<float>(log_p[static_cast<size_t>(target)]);
    set_marks(mark, log_p.size(), r.ids, 1);
    r.log_p_rest = log_unmarked_mass(log_p, mark);
    set_marks(mark, log_p.size(), r.ids, 0);
    return r;
}

Comparison compare(const Record &base, std::span<const double> cur, int32_t target, std::vector<uint8_t> &mark) {
    const int64_t n_vocab = static_cast<int64_t>(cur.size());
    if (target < 0 || target >= n_vocab) throw_error("KL divergence: target token %d out of range", target);
    for (int32_t id : base.ids) {
        if (id < 0 || id >= n_vocab) throw_error("KL divergence: base token %d out of range", id);
    }
    Comparison c;
    // The current log-probabilities are rounded to float as the base's were, so equal runs cancel exactly.
    for (size_t i = 0; i < base.ids.size(); ++i) {
        const float log_q = static_cast<float>(cur[static_cast<size_t>(base.ids[i])]);
        c.kl += kl_term(double(base.log_p[i]), double(log_q));
    }
    set_marks(mark, cur.size(), base.ids, 1);
    const float log_q_rest = log_unmarked_mass(cur, mark);
    set_marks(mark, cur.size(), base.ids, 0);
    c.kl += kl_term(double(base.log_p_rest), double(log_q_rest));

    // The current run's most probable token (ties: the lower id, as in summarize).
    int32_t best = 0;
    for (int64_t v = 1; v < n_vocab; ++v) {
        if (rank_key(cur[static_cast<size_t>(v)]) > rank_key(cur[static_cast<size_t>(best)]))
            best = static_cast<int32_t>(v);
    }
    c.same_top = !base.ids.empty() && base.ids[0] == best;
    c.nll_base = -double(base.log_p_target);
    c.nll_current = -double(static_cast<float>(cur[static_cast<size_t>(target)]));
    return c;
}

// --- Stats ---------------------------------------------------------------------------------------------------

void Stats::add(const Comparison &c) {
    kls_.push_back(c.kl);
    n_same_ += c.same_top ? 1 : 0;
    nll_base_ += c.nll_base;
    nll_current_ += c.nll_current;
    const double d = c.nll_current - c.nll_base;
    diff_ += d;
    diff2_ += d * d;
}

double Stats::mean_kl() const {
    if (kls_.empty()) return 0.0;
    double sum = 0.0;
    for (double v : kls_) sum += v;
    return sum / double(kls_.size());
}

double Stats::kl_std_error() const {
    const int64_t n = count();
    if (n < 2) return 0.0;
    const double mean = mean_kl();
    if (!std::isfinite(mean)) return mean;
    double ss = 0.0;
    for (double v : kls_) ss += (v - mean) * (v - mean);
    return std::sqrt(ss / double(n) / double(n - 1));
}

double Stats::kl_percentile(double q) const {
    if (kls_.empty()) return 0.0;
    std::vector<double> sorted = kls_;
    std::sort(sorted.begin(), sorted.end());
    const int64_t n = count();
    const int64_t rank = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(q * double(n))), 1, n);
    return sorted[static_cast<size_t>(rank - 1)];
}

double Stats::same_top_fraction() const { return kls_.empty() ? 0.0 : double(n_same_) / double(count()); }
double Stats::ppl_base() const { return kls_.empty() ? 0.0 : std::exp(nll_base_ / double(count())); }
double Stats::ppl_current() const { return kls_.empty() ? 0.0 : std::exp(nll_current_ / double(count())); }
double Stats::ln_ppl_ratio() const { return kls_.empty() ? 0.0 : diff_ / double(count()); }
double Stats::ln_ppl_ratio_std_error() const { return mean_std_error(diff_, diff2_, count()); }

std::string Stats::summary() const {
    char line[512];
    std::snprintf(line, sizeof line,
                  "mean KL %.6g +/- %.3g, 99%% KL %.6g, same top %.2f%%, PPL base %.4f current %.4f, ratio %.5f "
                  "(ln %.6f +/- %.6f), %lld tokens",
                  mean_kl(), kl_std_error(), kl_percentile(0.99), 100.0 * same_top_fraction(), ppl_base(),
                  ppl_current(), std::exp(ln_ppl_ratio()), ln_ppl_ratio(), ln_ppl_ratio_std_error(),
                  (long long)count());
    return line;
}

// --- files ---------------------------------------------------------------------------------------------------

BaseWriter::BaseWriter(const std::string &path, const Header &header) : path_(path), header_(header) {
    if (header_.n_top < 1 || header_.n_vocab < 1 || header_.n_ctx < 1 || header_.n_chunks < 1 || header_.n_scored < 1 ||
        static_cast<int64_t>(header_.tokens.size()) != header_.n_chunks * header_.n_ctx) {
        throw_error("KL base file %s: inconsistent header", path.c_str());
    }
    header_.n_top = std::min(header_.n_top, header_.n_vocab);
    f_.reset(std::fopen(path.c_str(), "wb"));
    if (!f_) throw_error("cannot create KL base file %s: %s", path.c_str(), std::strerror(errno));
    const uint32_t version = kVersion, n_top = static_cast<uint32_t>(header_.n_top);
    const int64_t fields[4] = {header_.n_vocab, header_.n_ctx, header_.n_chunks, header_.n_scored};
    bool ok = std::fwrite(kMagic, 1, 8, f_.get()) == 8 && std::fwrite(&version, 4, 1, f_.get()) == 1 &&
              std::fwrite(&n_top, 4, 1, f_.get()) == 1 && std::fwrite(fields, 8, 4, f_.get()) == 4;
    ok = ok && std::fwrite(header_.tokens.data(), 4, header_.tokens.size(), f_.get()) == header_.tokens.size();
    if (!ok) throw_error("cannot write KL base file %s: %s", path.c_str(), std::strerror(errno));
}

void BaseWriter::add(const Record &r) {
    if (!f_) throw_error("KL base file %s is already closed", path_.c_str());
    if (static_cast<int64_t>(r.ids.size()) != header_.n_top || r.log_p.size() != r.ids.size()) {
        throw_error("KL base file %s: record with %zu tokens, expected %lld", path_.c_str(), r.ids.size(),
                    (long long)header_.n_top);
    }
    if (!log_probs_valid(r)) {
        throw_error("KL base file %s: record %lld has NaN, positive or unordered log-probabilities (NaN logits?)",
                    path_.c_str(), (long long)n_written_);
    }
    for (int32_t id : r.ids) {
        if (id < 0 || id >= header_.n_vocab) {
            throw_error("KL base file %s: record %lld has token id %d", path_.c_str(), (long long)n_written_, id);
        }
    }
    if (const char *error = distribution_error(r, mark_, static_cast<size_t>(header_.n_vocab))) {
        throw_error("KL base file %s: record %lld has %s", path_.c_str(), (long long)n_written_, error);
    }
    const bool ok = std::fwrite(&r.log_p_target, 4, 1, f_.get()) == 1 &&
                    std::fwrite(&r.log_p_rest, 4, 1, f_.get()) == 1 &&
                    std::fwrite(r.ids.data(), 4, r.ids.size(), f_.get()) == r.ids.size() &&
                    std::fwrite(r.log_p.data(), 4, r.log_p.size(), f_.get()) == r.log_p.size();
    if (!ok) throw_error("cannot write KL base file %s: %s", path_.c_str(), std::strerror(errno));
    ++n_written_;
}

void BaseWriter::finish() {
    if (!f_) return;
    const int64_t expected = header_.n_chunks * header_.n_scored;
    const bool closed = std::fclose(f_.release()) == 0;
    if (n_written_ != expected) {
        throw_error("KL base file %s: %lld records written, expected %lld", path_.c_str(), (long long)n_written_,
                    (long long)expected);
    }
    if (!closed) throw_error("cannot write KL base file %s: %s", path_.c_str(), std::strerror(errno));
}

BaseReader::BaseReader(const std::string &path) : path_(path) {
    f_.reset(std::fopen(path.c_str(), "rb"));
    if (!f_) throw_error("cannot open KL base file %s: %s", path.c_str(), std::strerror(errno));
    char magic[8];
    uint32_t version = 0, n_top = 0;
    int64_t fields[4] = {};
    if (std::fread(magic, 1, 8, f_.get()) != 8 || std::memcmp(magic, kMagic, 8) != 0) {
        throw_error("%s is not a sparrow KL base file (bad magic; make it with --kl-divergence-base)", path.c_str());
    }
    if (std::fread(&version, 4, 1, f_.get()) != 1 || std::fread(&n_top, 4, 1, f_.get()) != 1 ||
        std::fread(fields, 8, 4, f_.get()) != 4) {
        throw_error("KL base file %s is truncated (incomplete header)", path.c_str());
    }
    if (version != kVersion) {
        throw_error("KL base file %s has version %u; this sparrow reads version %u", path.c_str(), version, kVersion);
    }
    header_.n_top = n_top;
    header_.n_vocab = fields[0];
    header_.n_ctx = fields[1];
    header_.n_chunks = fields[2];
    header_.n_scored = fields[3];
    // Bounds that keep the size arithmetic below far from overflow; real files are well inside them.
    constexpr int64_t kMax = int64_t(1) << 30;
    if (header_.n_top < 1 || header_.n_top > 65536 || header_.n_vocab < 1 || header_.n_vocab > kMax ||
        header_.n_top > header_.n_vocab || header_.n_ctx < 1 || header_.n_ctx > kMax || header_.n_chunks < 1 ||
        header_.n_chunks > kMax || header_.n_scored < 1 || header_.n_scored > header_.n_ctx ||
        header_.n_chunks * header_.n_ctx > kMax) {
        throw_error(
            "KL base file %s is corrupt (header: n_top %lld, n_vocab %lld, n_ctx %lld, chunks %lld, scored %lld)",
            path.c_str(), (long long)header_.n_top, (long long)header_.n_vocab, (long long)header_.n_ctx,
            (long long)header_.n_chunks, (long long)header_.n_scored);
    }
    const int64_t n_tokens = header_.n_chunks * header_.n_ctx;
    const int64_t expected =
        kHeaderFixedBytes + 4 * n_tokens + header_.n_chunks * header_.n_scored * record_bytes(header_.n_top);
    if (std::fseek(f_.get(), 0, SEEK_END) != 0) throw_error("cannot read KL base file %s", path.c_str());
    const long size = std::ftell(f_.get());
    if (size != expected) {
        throw_error("KL base file %s is truncated or corrupt: %ld bytes, expected %lld", path.c_str(), size,
                    (long long)expected);
    }
    if (std::fseek(f_.get(), kHeaderFixedBytes, SEEK_SET) != 0)
        throw_error("cannot read KL base file %s", path.c_str());
    header_.tokens.resize(static_cast<size_t>(n_tokens));
    if (std::fread(header_.tokens.data(), 4, header_.tokens.size(), f_.get()) != header_.tokens.size()) {
        throw_error("cannot read KL base file %s", path.c_str());
    }
    for (int32_t t : header_.tokens) {
        if (t < 0 || t >= header_.n_vocab) throw_error("KL base file %s is corrupt (token id %d)", path.c_str(), t);
    }
}

void BaseReader::check_matches(int64_t n_vocab, int64_t n_ctx, int64_t n_chunks, int64_t n_scored,
                               std::span<const int32_t> tokens) const {
    const char *p = path_.c_str();
    if (n_vocab != header_.n_vocab) {
        throw_error("KL base file %s was made with a vocabulary of %lld tokens; this model has %lld", p,
                    (long long)header_.n_vocab, (long long)n_vocab);
    }
    if (n_ctx != header_.n_ctx) {
        throw_error("KL base file %s was made with -c %lld; this run uses -c %lld", p, (long long)header_.n_ctx,
                    (long long)n_ctx);
    }
    if (n_chunks != header_.n_chunks) {
        throw_error("KL base file %s has %lld chunks; this run evaluates %lld (use the same text and --chunks)", p,
                    (long long)header_.n_chunks, (long long)n_chunks);
    }
    if (n_scored != header_.n_scored) {
        throw_error("KL base file %s scores %lld positions per chunk; this run scores %lld", p,
                    (long long)header_.n_scored, (long long)n_scored);
    }
    if (tokens.size() != header_.tokens.size()) {
        throw_error("KL base file %s holds %zu tokens; this run evaluates %zu", p, header_.tokens.size(),
                    tokens.size());
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] != header_.tokens[i]) {
            throw_error(
                "KL base file %s differs from this run at chunk %lld, position %lld (base token %d, this run %d): "
                "not the same text or tokenizer",
                p, (long long)(int64_t(i) / n_ctx + 1), (long long)(int64_t(i) % n_ctx), header_.tokens[i], tokens[i]);
        }
    }
}

void BaseReader::next(Record &r) {
    if (n_read_ >= header_.n_chunks * header_.n_scored) {
        throw_error("KL base file %s: read past its last record", path_.c_str());
    }
    r.ids.resize(static_cast<size_t>(header_.n_top));
    r.log_p.resize(static_cast<size_t>(header_.n_top));
    const bool ok = std::fread(&r.log_p_target, 4, 1, f_.get()) == 1 &&
                    std::fread(&r.log_p_rest, 4, 1, f_.get()) == 1 &&
                    std::fread(r.ids.data(), 4, r.ids.size(), f_.get()) == r.ids.size() &&
                    std::fread(r.log_p.data(), 4, r.log_p.size(), f_.get()) == r.log_p.size();
    if (!ok) throw_error("cannot read KL base file %s (record %lld)", path_.c_str(), (long long)n_read_);
    for (int32_t id : r.ids) {
        if (id < 0 || id >= header_.n_vocab) {
            throw_error("KL base file %s is corrupt (record %lld: token id %d)", path_.c_str(), (long long)n_read_, id);
        }
    }
    if (!log_probs_valid(r)) {
        throw_error("KL base file %s is corrupt (record %lld: log-probabilities not <= 0 and descending)",
                    path_.c_str(), (long long)n_read_);
    }
    if (const char *error = distribution_error(r, mark_, static_cast<size_t>(header_.n_vocab))) {
        throw_error("KL base file %s is corrupt (record %lld: %s)", path_.c_str(), (long long)n_read_, error);
    }
    ++n_read_;
}

}  // namespace sparrow::tools::kl
