// KL divergence between two runs of `sparrow perplexity` over the same text (llama.cpp's
// --kl-divergence-base / --kl-divergence, with its own compact file).
//
// The base run saves, for every scored position, a compact form of its next-token distribution P:
//   the N most probable tokens (ties: lower id first), their log-probabilities, and log P(rest), the
//   probability mass of all other tokens, plus log P(target) for the base perplexity.
// The compared run has its full distribution Q at the same positions and measures
//   KL = sum_{i in top-N(P)} P_i (ln P_i - ln Q_i)  +  P_rest (ln P_rest - ln Q_rest),
//   Q_rest = sum of Q over the tokens outside the base's top N.
// That is the exact KL divergence between P and Q coarsened to N + 1 buckets (the base's top N tokens and
// one bucket for everything else). Coarsening never increases a KL divergence, so this is a lower bound
// on the full KL(P || Q); it misses only how Q redistributes mass inside the rest bucket, which holds
// the least probable tokens. Terms with P = 0 count 0 (0 ln 0 = 0). A run compared with itself gives 0
// exactly: the same float log-probabilities are computed the same way on both sides.
//
// File (native little-endian, what every machine sparrow runs on uses):
//   header   char magic[8] = "SPRWKLD\0", uint32 version = 1, uint32 n_top, int64 n_vocab, int64 n_ctx,
//            int64 n_chunks, int64 n_scored (per chunk), int32 tokens[n_chunks * n_ctx] (as evaluated,
//            BOS included)
//   records  n_chunks * n_scored of: float log_p_target, float log_p_rest, int32 ids[n_top],
//            float log_p[n_top]
// The header lets a compared run check that it evaluates the same tokens in the same chunks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace sparrow::tools::kl {

constexpr int kDefaultTop = 32;  // tokens kept per position: 32 * 8 + 8 = 264 bytes

// Closes a FILE when its owner goes, also when a constructor throws half-way.
struct FileCloser {
    void operator()(std::FILE *f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// What the base file describes (and the compared run must match).
struct Header {
    int64_t n_top = kDefaultTop;
    int64_t n_vocab = 0;
    int64_t n_ctx = 0;
    int64_t n_chunks = 0;
    int64_t n_scored = 0;         // scored positions per chunk
    std::vector<int32_t> tokens;  // n_chunks * n_ctx token ids, as evaluated
};

// The compact distribution at one scored position.
struct Record {
    float log_p_target = 0.0f;
    float log_p_rest = 0.0f;  // -inf when the top N hold every token
    std::vector<int32_t> ids;
    std::vector<float> log_p;  // of ids, descending
};

// Natural-log softmax of logits in double (max-subtracted), written to out (resized to logits.size()).
void log_softmax(std::span<const float> logits, std::vector<double> &out);

// The base's compact record of log_p (a full log-softmax) with the n_top most probable tokens.
// `mark` is scratch (any content; left all zero, sized to the vocabulary).
Record summarize(std::span<const double> log_p, int64_t n_top, int32_t target, std::vector<uint8_t> &mark);

// The comparison at one position.
struct Comparison {
    double kl = 0.0;           // the bucketed KL(base || current) above, >= 0 up to rounding (can be +inf)
    bool same_top = false;     // the base's most probable token is also the current run's
    double nll_base = 0.0;     // -log P(target)
    double nll_current = 0.0;  // -log Q(target)
};

// base against the current full log-softmax cur (same vocabulary). `mark` as in summarize.
Comparison compare(const Record &base, std::span<const double> cur, int32_t target, std::vector<uint8_t> &mark);

// Running figures over a set of positions (one chunk, or all of them).
class Stats {
  public:
    void add(const Comparison &c);
    int64_t count() const { return static_cast<int64_t>(kls_.size()); }
    double mean_kl() const;
    double kl_std_error() const;           // of the mean: sqrt(var / (n - 1))
    double kl_percentile(double q) const;  // nearest rank: the ceil(q * n)-th smallest value
    double same_top_fraction() const;
    double ppl_base() const;                // exp(mean nll_base)
    double ppl_current() const;             // exp(mean nll_current)
    double ln_ppl_ratio() const;            // mean(nll_current - nll_base) = ln(ppl_current / ppl_base)
    double ln_ppl_ratio_std_error() const;  // of that mean, from the per-position differences
    // One line of figures: "mean KL ... +/- ..., 99% KL ..., same top ...%, PPL base ... current ...".
    std::string summary() const;

  private:
    std::vector<double> kls_;
    int64_t n_same_ = 0;
    double nll_base_ = 0.0, nll_current_ = 0.0, diff_ = 0.0, diff2_ = 0.0;
};

// Writes a base file: the header at construction, then one record per scored position, in chunk order.
class BaseWriter {
  public:
    BaseWriter(const std::string &path, const Header &header);
    BaseWriter(const BaseWriter &) = delete;
    BaseWriter &operator=(const BaseWriter &) = delete;
    void add(const Record &r);
    // Checks that every record was written and closes the file; throws sparrow::Error on a write error.
    void finish();

  private:
    std::string path_;
    Header header_;
    FilePtr f_;
    int64_t n_written_ = 0;
    std::vector<uint8_t> mark_;  // per token id: a record's top tokens while it is checked
};

// Reads a base file: validates the header and the file size at construction (throws sparrow::Error naming
// the file and what is wrong), then hands out records in order.
class BaseReader {
  public:
    explicit BaseReader(const std::string &path);
    BaseReader(const BaseReader &) = delete;
    BaseReader &operator=(const BaseReader &) = delete;
    const Header &header() const { return header_; }
    // Throws sparrow::Error when the current run differs from the base (vocabulary, -c, chunks, tokens).
    void check_matches(int64_t n_vocab, int64_t n_ctx, int64_t n_chunks, int64_t n_scored,
                       std::span<const int32_t> tokens) const;
    // The next record (reusing r's storage).
    void next(Record &r);

  private:
    std::string path_;
    Header header_;
    FilePtr f_;
    int64_t n_read_ = 0;
    std::vector<uint8_t> mark_;  // per token id: a record's top tokens while it is checked
};

}  // namespace sparrow::tools::kl
