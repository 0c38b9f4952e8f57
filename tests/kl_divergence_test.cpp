// The KL divergence of `sparrow perplexity --kl-divergence` (tools/kl_divergence.h): the bucketed KL on
// cases computed by hand, the rest bucket, the statistics, and the base file (round trip, and clear errors
// for a missing, corrupt, truncated or mismatched file).
#include "kl_divergence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace sparrow::tools::kl {
namespace {

// log of the given probabilities (they need not be normalised by the caller: they are here).
std::vector<double> log_probs(std::vector<double> p) {
    double sum = 0.0;
    for (double v : p) sum += v;
    std::vector<double> out;
    for (double v : p) out.push_back(v > 0.0 ? std::log(v / sum) : -INFINITY);
    return out;
}

double kl_of(const std::vector<double> &p, const std::vector<double> &q, int64_t n_top) {
    std::vector<uint8_t> mark;
    const Record base = summarize(log_probs(p), n_top, 0, mark);
    return compare(base, log_probs(q), 0, mark).kl;
}

TEST(KlDivergence, LogSoftmaxNormalises) {
    std::vector<double> out;
    log_softmax(std::vector<float>{1.0f, 2.0f, 3.0f, -1000.0f}, out);
    double sum = 0.0;
    for (double v : out) sum += std::exp(v);
    EXPECT_NEAR(sum, 1.0, 1e-15);
    EXPECT_NEAR(out[2] - out[1], 1.0, 1e-15);
}

TEST(KlDivergence, IdenticalDistributionsGiveExactlyZero) {
    std::mt19937 rng(4);
    std::vector<uint8_t> mark;
    std::vector<double> lp;
    for (int64_t n_vocab : {1, 2, 33, 1000}) {
        for (int64_t n_top : {1, 4, 32, 2000}) {
            const auto logits = test::random_floats(rng, static_cast<size_t>(n_vocab), -8.0f, 8.0f);
            log_softmax(logits, lp);
            const Record base = summarize(lp, n_top, 0, mark);
            const Comparison c = compare(base, lp, 0, mark);
            EXPECT_EQ(c.kl, 0.0) << n_vocab << " " << n_top;
            EXPECT_TRUE(c.same_top);
            EXPECT_EQ(c.nll_base, c.nll_current);
        }
    }
}

TEST(KlDivergence, TwoTokensByHand) {
    // P = (0.75, 0.25), Q = (0.5, 0.5): KL = 0.75 ln(0.75 / 0.5) + 0.25 ln(0.25 / 0.5) = 0.1308120...
    const double expected = 0.75 * std::log(1.5) + 0.25 * std::log(0.5);
    EXPECT_NEAR(kl_of({0.75, 0.25}, {0.5, 0.5}, 1), expected, 1e-7);  // token 1 is the rest bucket
    EXPECT_NEAR(kl_of({0.75, 0.25}, {0.5, 0.5}, 2), expected, 1e-7);  // both kept, rest empty
    EXPECT_NEAR(expected, 0.130812, 1e-6);
    // And the other way round: KL is not symmetric.
    EXPECT_NEAR(kl_of({0.5, 0.5}, {0.75, 0.25}, 1), 0.5 * std::log(0.5 / 0.75) + 0.5 * std::log(0.5 / 0.25), 1e-7);
}

TEST(KlDivergence, RestBucketIsALowerBound) {
    // Base top-1 is token 0 (0.4); the rest bucket holds 0.6. Moving mass around inside the rest bucket is
    // invisible (the bucketed KL is 0 while the full KL is not)...
    const std::vector<double> p = {0.4, 0.3, 0.2, 0.1};
    EXPECT_NEAR(kl_of(p, {0.4, 0.1, 0.2, 0.3}, 1), 0.0, 1e-7);
    // ...changing the bucket's total is not: 0.4 ln(0.4 / 0.1) + 0.6 ln(0.6 / 0.9).
    EXPECT_NEAR(kl_of(p, {0.1, 0.3, 0.3, 0.3}, 1), 0.4 * std::log(4.0) + 0.6 * std::log(0.6 / 0.9), 1e-7);
    // More tokens kept: never smaller (coarsening can only lose divergence), equal to the full KL at N = V.
    const std::vector<double> q = {0.25, 0.25, 0.25, 0.25};
    double full = 0.0;
    for (int i = 0; i < 4; ++i) full += p[i] * std::log(p[i] / q[i]);
    double prev = 0.0;
    for (int64_t n_top = 1; n_top <= 4; ++n_top) {
        const double k = kl_of(p, q, n_top);
        EXPECT_GE(k, prev - 1e-12) << n_top;
        prev = k;
    }
    EXPECT_NEAR(prev, full, 1e-7);
}

TEST(KlDivergence, ZeroProbabilitiesAndTies) {
    // P = 0 terms count 0; Q = 0 where P > 0 is an infinite divergence.
    EXPECT_NEAR(kl_of({1.0, 0.0, 0.0}, {0.5, 0.25, 0.25}, 1), std::log(2.0), 1e-7);
    EXPECT_EQ(kl_of({0.5, 0.5}, {1.0, 0.0}, 2), INFINITY);
    // Ties go to the lower id, on both sides.
    std::vector<uint8_t> mark;
    const Record r = summarize(log_probs({0.2, 0.4, 0.4}), 2, 2, mark);
    ASSERT_EQ(r.ids.size(), 2u);
    EXPECT_EQ(r.ids[0], 1);
    EXPECT_EQ(r.ids[1], 2);
    EXPECT_NEAR(std::exp(double(r.log_p_rest)), 0.2, 1e-7);
    EXPECT_NEAR(std::exp(double(r.log_p_target)), 0.4, 1e-7);
    EXPECT_TRUE(compare(r, log_probs({0.1, 0.45, 0.45}), 2, mark).same_top);
    EXPECT_FALSE(compare(r, log_probs({0.1, 0.4, 0.5}), 2, mark).same_top);
    // The kept tokens cover the vocabulary: the rest is empty (-inf) and contributes nothing.
    const Record all = summarize(log_probs({0.7, 0.3}), 5, 0, mark);
    EXPECT_EQ(all.ids.size(), 2u);
    EXPECT_EQ(all.log_p_rest, -INFINITY);
    EXPECT_THROW(summarize(log_probs({0.7, 0.3}), 5, 2, mark), Error);
}

TEST(KlDivergence, Stats) {
    Stats s;
    for (int i = 1; i <= 100; ++i) {
        Comparison c;
        c.kl = i;  // 1..100
        c.same_top = i % 4 != 0;
        c.nll_base = 1.0;
        c.nll_current = 1.0 + (i % 2 ? 0.1 : 0.3);
        s.add(c);
    }
    EXPECT_EQ(s.count(), 100);
    EXPECT_DOUBLE_EQ(s.mean_kl(), 50.5);
    EXPECT_DOUBLE_EQ(s.kl_percentile(0.99), 99.0);
    EXPECT_DOUBLE_EQ(s.kl_percentile(1.0), 100.0);
    EXPECT_DOUBLE_EQ(s.same_top_fraction(), 0.75);
    EXPECT_NEAR(s.ppl_base(), std::exp(1.0), 1e-12);
    EXPECT_NEAR(s.ln_ppl_ratio(), 0.2, 1e-12);
    EXPECT_NEAR(s.ppl_current() / s.ppl_base(), std::exp(0.2), 1e-12);
    // Sample standard deviation of 1..100 is 29.011; the mean's standard error is that / sqrt(100).
    EXPECT_NEAR(s.kl_std_error(), 2.9011492, 1e-6);
    EXPECT_NE(s.summary().find("same top 75.00%"), std::string::npos) << s.summary();
}

// A base file for 2 chunks of 8 tokens, 3 scored positions each, over a vocabulary of 10.
struct FileFixture {
    std::string dir = test::make_temp_dir("sparrow-kl-");
    std::string path = dir + "/base.kld";
    Header header;
    std::vector<Record> records;

    FileFixture() {
        header.n_top = 4;
        header.n_vocab = 10;
        header.n_ctx = 8;
        header.n_chunks = 2;
        header.n_scored = 3;
        for (int i = 0; i < 16; ++i) header.tokens.push_back(i % 10);
        std::mt19937 rng(1);
        std::vector<uint8_t> mark;
        std::vector<double> lp;
        BaseWriter w(path, header);
        for (int i = 0; i < 6; ++i) {
            log_softmax(test::random_floats(rng, 10, -3.0f, 3.0f), lp);
            records.push_back(summarize(lp, header.n_top, i, mark));
            w.add(records.back());
        }
        w.finish();
    }
    ~FileFixture() { std::filesystem::remove_all(dir); }
};

template <typename F>
void expect_error_mentioning(F &&f, const std::string &needle) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(KlDivergenceFile, RoundTrip) {
    FileFixture fx;
    BaseReader r(fx.path);
    EXPECT_EQ(r.header().n_top, 4);
    EXPECT_EQ(r.header().tokens, fx.header.tokens);
    EXPECT_NO_THROW(r.check_matches(10, 8, 2, 3, fx.header.tokens));
    Record got;
    for (const Record &want : fx.records) {
        r.next(got);
        EXPECT_EQ(got.ids, want.ids);
        EXPECT_EQ(got.log_p, want.log_p);
        EXPECT_EQ(got.log_p_rest, want.log_p_rest);
        EXPECT_EQ(got.log_p_target, want.log_p_target);
    }
    expect_error_mentioning([&] { r.next(got); }, "past its last record");
}

TEST(KlDivergenceFile, MismatchesAreNamed) {
    FileFixture fx;
    BaseReader r(fx.path);
    auto tokens = fx.header.tokens;
    expect_error_mentioning([&] { r.check_matches(11, 8, 2, 3, tokens); }, "vocabulary of 10");
    expect_error_mentioning([&] { r.check_matches(10, 16, 2, 3, tokens); }, "-c 8");
    expect_error_mentioning([&] { r.check_matches(10, 8, 3, 3, tokens); }, "--chunks");
    tokens[11] = 9;
    expect_error_mentioning([&] { r.check_matches(10, 8, 2, 3, tokens); }, "chunk 2, position 3");
}

TEST(KlDivergenceFile, BadFilesAreRejectedClearly) {
    FileFixture fx;
    expect_error_mentioning([&] { BaseReader r(fx.dir + "/missing.kld"); }, "cannot open");
    std::string bytes(static_cast<size_t>(std::filesystem::file_size(fx.path)), '\0');
    std::ifstream(fx.path, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    auto write = [&](const std::string &content) {
        std::ofstream(fx.dir + "/bad.kld", std::ios::binary) << content;
        return fx.dir + "/bad.kld";
    };
    expect_error_mentioning([&] { BaseReader r(write(bytes.substr(0, bytes.size() - 1))); }, "truncated");
    expect_error_mentioning([&] { BaseReader r(write(bytes + "x")); }, "corrupt");
    expect_error_mentioning([&] { BaseReader r(write(bytes.substr(0, 10))); }, "truncated");
    expect_error_mentioning([&] { BaseReader r(write("GGUF" + bytes.substr(4))); }, "bad magic");
    std::string v2 = bytes;
    v2[8] = 2;
    expect_error_mentioning([&] { BaseReader r(write(v2)); }, "version 2");
    std::string big_top = bytes;
    big_top[12] = 11;  // n_top 11 > n_vocab 10
    expect_error_mentioning([&] { BaseReader r(write(big_top)); }, "corrupt");
    std::string bad_token = bytes;
    bad_token[48] = 50;  // first token id 50 >= n_vocab
    expect_error_mentioning([&] { BaseReader r(write(bad_token)); }, "token id 50");
    std::string bad_id = bytes;
    bad_id[48 + 64 + 8] = 77;  // first record's first id
    BaseReader r(write(bad_id));
    Record rec;
    expect_error_mentioning([&] { r.next(rec); }, "token id 77");
    // The first record's log-probabilities (target at 112, rest at 116, the top 4 at 136): positive, NaN,
    // out of order.
    const auto with_float = [&](size_t at, float v) {
        std::string b = bytes;
        std::memcpy(&b[at], &v, sizeof v);
        return b;
    };
    float second;
    std::memcpy(&second, bytes.data() + 140, sizeof second);
    for (const std::string &damaged :
         {with_float(112, 0.5f), with_float(116, NAN), with_float(136, NAN), with_float(136, second - 1.0f)}) {
        BaseReader damaged_reader(write(damaged));
        expect_error_mentioning([&] { damaged_reader.next(rec); }, "log-probabilities");
    }
}

// Every single-byte change of a base file: the reader refuses it with an Error, or reads every record, and each
// record it returns has ids in the vocabulary and valid log-probabilities, so compare() gives a KL that is not
// NaN (a damaged file never turns into NaN statistics or a crash).
TEST(KlDivergenceFile, EveryByteChangeIsRefusedOrReadsValidRecords) {
    FileFixture fx;
    std::string bytes(static_cast<size_t>(std::filesystem::file_size(fx.path)), '\0');
    std::ifstream(fx.path, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    const std::string path = fx.dir + "/damaged.kld";
    std::mt19937 rng(9);
    std::vector<double> cur;
    log_softmax(test::random_floats(rng, 10, -3.0f, 3.0f), cur);
    std::vector<uint8_t> mark;
    int refused = 0, read = 0;
    for (size_t at = 0; at < bytes.size(); ++at) {
        for (const uint8_t value : {uint8_t(bytes[at] ^ 0x01), uint8_t(bytes[at] ^ 0x80), uint8_t(0xff)}) {
            std::string b = bytes;
            b[at] = static_cast<char>(value);
            std::ofstream(path, std::ios::binary) << b;
            try {
                BaseReader r(path);
                Record rec;
                for (int64_t i = 0; i < 6; ++i) {
                    r.next(rec);
                    // A record that reads is a distribution, so KL against any other is >= 0 (up to the
                    // rounding the reader allows): a repeated id or a changed rest mass gave -4e-6 and 6.6.
                    const Comparison c = compare(rec, cur, 0, mark);
                    EXPECT_FALSE(std::isnan(c.kl)) << "byte " << at << " = " << int(value);
                    EXPECT_GE(c.kl, -1e-4) << "byte " << at << " = " << int(value);
                    const std::set<int32_t> distinct(rec.ids.begin(), rec.ids.end());
                    EXPECT_EQ(distinct.size(), rec.ids.size()) << "byte " << at << " = " << int(value);
                    double mass = std::exp(double(rec.log_p_rest));
                    for (float v : rec.log_p) mass += std::exp(double(v));
                    EXPECT_NEAR(mass, 1.0, 1e-4) << "byte " << at << " = " << int(value);
                }
                ++read;
            } catch (const Error &) {
                ++refused;
            }
        }
    }
    EXPECT_GT(refused, 0);
    EXPECT_GT(read, 0);  // changes inside a log-probability's mantissa stay valid
}

TEST(KlDivergenceFile, WriterChecksItsRecords) {
    const std::string dir = test::make_temp_dir("sparrow-kl-");
    Header h;
    h.n_top = 2;
    h.n_vocab = 4;
    h.n_ctx = 4;
    h.n_chunks = 1;
    h.n_scored = 1;
    h.tokens = {0, 1, 2, 3};
    {
        BaseWriter w(dir + "/a.kld", h);
        Record wrong;
        wrong.ids = {1};
        wrong.log_p = {0.0f};
        EXPECT_THROW(w.add(wrong), Error);
        Record nan_logits;  // what NaN logits summarise to
        nan_logits.ids = {1, 2};
        nan_logits.log_p = {NAN, NAN};
        nan_logits.log_p_target = NAN;
        expect_error_mentioning([&] { w.add(nan_logits); }, "NaN, positive or unordered");
        Record repeated;  // a valid distribution but for the repeated id
        repeated.ids = {1, 1};
        repeated.log_p = {std::log(0.5f), std::log(0.25f)};
        repeated.log_p_rest = std::log(0.25f);
        expect_error_mentioning([&] { w.add(repeated); }, "repeated");
        Record heavy = repeated;  // distinct ids, but a mass of 1.25
        heavy.ids = {1, 2};
        heavy.log_p_rest = std::log(0.5f);
        expect_error_mentioning([&] { w.add(heavy); }, "do not sum to 1");
        heavy.log_p_rest = std::log(0.25f);
        EXPECT_NO_THROW(w.add(heavy));
        EXPECT_NO_THROW(w.finish());
    }
    {
        BaseWriter w(dir + "/b.kld", h);
        expect_error_mentioning([&] { w.finish(); }, "0 records written, expected 1");
    }
    expect_error_mentioning([&] { BaseWriter w(dir + "/no/such/dir/a.kld", h); }, "cannot create");
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sparrow::tools::kl
