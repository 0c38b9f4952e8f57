// Tokenizer tests: llama.cpp's reference vectors for six vocabularies (../shared/data/vocab), stories260K,
// malformed metadata, the regex engine, special tokens, streaming pieces, and speed on wiki.test.raw.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "gguf/gguf.h"
#include "runtime/tokenizer.h"
#include "runtime/tokenizer_pre.h"
#include "runtime/unicode.h"
#include "runtime/unicode_regex.h"
#include "test_util.h"

namespace sparrow {
namespace {

std::string read_file(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The .inp files hold the test strings, each followed by "\n__ggml_vocab_test__\n" (so a string may be empty
// or consist of newlines); the .out files hold one line of space-separated ids per string.
std::vector<std::string> read_test_strings(const std::string &path) {
    const std::string data = read_file(path);
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> out;
    size_t pos = 0;
    for (size_t hit; (hit = data.find(sep, pos)) != std::string::npos; pos = hit + sep.size()) {
        out.push_back(data.substr(pos, hit - pos));
    }
    EXPECT_EQ(pos, data.size()) << "trailing text after the last separator in " << path;
    return out;
}

std::vector<std::vector<int32_t>> read_test_ids(const std::string &path) {
    const std::string data = read_file(path);
    std::vector<std::vector<int32_t>> out;
    std::istringstream lines(data);
    for (std::string line; std::getline(lines, line);) {
        std::istringstream ids(line);
        std::vector<int32_t> v;
        for (int32_t id; ids >> id;) v.push_back(id);
        out.push_back(std::move(v));
    }
    return out;
}

// Vocabularies are loaded once per test binary (the big ones take a while in sanitizer builds). A Tokenizer
// copies what it needs, so the gguf::File can go.
const Tokenizer &shared_tokenizer(const std::string &path) {
    static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
    auto &slot = cache[path];
    if (!slot) slot = std::make_unique<Tokenizer>(gguf::File::open(path));
    return *slot;
}

std::string ids_to_string(const std::vector<int32_t> &ids) {
    std::string s;
    for (int32_t id : ids) {
        s.push_back(' ');
        s += std::to_string(id);
    }
    return s;
}

std::string escaped(const std::string &s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (c < 0x20)
            out += strprintf("\\x%02x", c);
        else
            out.push_back(static_cast<char>(c));
    }
    return out;
}

// ------------------------------------------------------------------------------------------------------------
// llama.cpp's tokenizer test vectors: tokenize(text, add_special=false, parse_special=false) must give exactly
// the recorded ids (which come from the original Hugging Face / SentencePiece tokenizers).

class TokenizerVocab : public ::testing::TestWithParam<const char *> {};

TEST_P(TokenizerVocab, MatchesReferenceIds) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    const std::string base = data + "/vocab/ggml-vocab-" + GetParam() + ".gguf";
    const Tokenizer &tok = shared_tokenizer(base);
    const auto strings = read_test_strings(base + ".inp");
    const auto expected = read_test_ids(base + ".out");
    ASSERT_EQ(strings.size(), expected.size());
    ASSERT_GT(strings.size(), 40u);

    size_t n_ok = 0;
    for (size_t i = 0; i < strings.size(); ++i) {
        const std::vector<int32_t> ids = tok.encode(strings[i], false, false);
        if (ids == expected[i]) {
            ++n_ok;
        } else {
            ADD_FAILURE() << GetParam() << " string " << i << " '" << escaped(strings[i])
                          << "'\n  expected:" << ids_to_string(expected[i]) << "\n       got:" << ids_to_string(ids);
        }
        // Lossless round trip (SentencePiece: decode drops the space prefix that encode added).
        EXPECT_EQ(tok.decode(ids), strings[i]) << GetParam() << " string " << i;
        // Streaming: concatenated pieces are the same text, for every split point.
        std::string streamed;
        for (int32_t id : ids) streamed += tok.token_to_piece(id);
        if (tok.add_space_prefix() && !streamed.empty() && streamed[0] == ' ') streamed.erase(0, 1);
        EXPECT_EQ(streamed, strings[i]);
    }
    std::printf("[          ] %s: %zu/%zu strings match\n", GetParam(), n_ok, strings.size());
}

// The instantiation prefix starts with "Tokenizer" so that --gtest_filter='Tokenizer*' selects these too.
INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerVocab,
                         ::testing::Values("llama-spm", "llama-bpe", "deepseek-llm", "deepseek-coder", "qwen2",
                                           "gpt-2"),
                         [](const ::testing::TestParamInfo<const char *> &p) {
                             std::string name = p.param;
                             for (char &c : name) c = c == '-' ? '_' : c;
                             return name;
                         });

// ------------------------------------------------------------------------------------------------------------

TEST(TokenizerStories, OnceUponATime) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    const gguf::File file = gguf::File::open(data + "/models/stories260K.gguf");
    const Tokenizer tok(file);
    EXPECT_EQ(tok.n_vocab(), 512);
    EXPECT_EQ(tok.type(), VocabType::SPM);
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_TRUE(tok.add_bos());
    EXPECT_TRUE(tok.is_eog(2));
    EXPECT_FALSE(tok.is_eog(1));
    EXPECT_EQ(tok.pad_id(), -1);  // stored as 0xFFFFFFFF: none
    const std::vector<int32_t> ids = tok.encode("Once upon a time", true, false);
    EXPECT_EQ(ids, (std::vector<int32_t>{1, 403, 407, 261, 378}));
    EXPECT_EQ(tok.decode(ids), "Once upon a time");
    EXPECT_EQ(tok.token_to_piece(403), " Once");
    EXPECT_EQ(tok.token_to_piece(1), "");
    EXPECT_EQ(tok.token_to_piece(1, true), "<s>");
    // parse_special: "<s>" in the text is BOS; without it, the characters are tokenized as text.
    const auto with = tok.encode("<s>Once", false, true);
    ASSERT_FALSE(with.empty());
    EXPECT_EQ(with[0], 1);
    const auto without = tok.encode("<s>Once", false, false);
    EXPECT_EQ(std::count(without.begin(), without.end(), 1), 0);
    // Characters outside the 512 tokens fall back to byte tokens <0xNN> (ids 3 + byte) and come back whole.
    const std::string exotic = "\xe2\x82\xac \xf0\x9f\x98\x80 \xce\xa9";  // € 😀 Ω
    const auto ex_ids = tok.encode(exotic, false, false);
    EXPECT_EQ(tok.decode(ex_ids), exotic);
    std::string streamed;
    for (int32_t id : ex_ids) {
        streamed += tok.token_to_piece(id);
        // a streaming printer may only emit up to the complete prefix
        EXPECT_LE(utf8_complete_prefix(streamed), streamed.size());
    }
    EXPECT_EQ(utf8_complete_prefix(streamed), streamed.size());
    EXPECT_EQ(utf8_complete_prefix("a\xe2\x82"), 1u);
    EXPECT_EQ(utf8_complete_prefix("a\xf0\x9f\x98"), 1u);
    EXPECT_EQ(utf8_complete_prefix("a\xf0\x9f\x98\x80"), 5u);
    // Invalid UTF-8 survives as bytes.
    const std::string invalid = "ab\xff\xc3(z";
    EXPECT_EQ(tok.decode(tok.encode(invalid, false, false)), invalid);
}

TEST(TokenizerSpecial, Qwen2ChatTokens) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    const Tokenizer &tok = shared_tokenizer(data + "/vocab/ggml-vocab-qwen2.gguf");
    const int32_t im_start = tok.find_token("<|im_start|>");
    const int32_t im_end = tok.find_token("<|im_end|>");
    ASSERT_GE(im_start, 0);
    ASSERT_GE(im_end, 0);
    EXPECT_EQ(tok.token_type(im_start), TokenType::CONTROL);
    EXPECT_TRUE(tok.is_eog(im_end));
    EXPECT_TRUE(tok.is_eog(tok.eos_id()));
    EXPECT_FALSE(tok.add_bos());
    const std::string chat = "<|im_start|>user\nHello<|im_end|>\n";
    const auto ids = tok.encode(chat, true, true);
    ASSERT_EQ(ids.size(), 6u);
    EXPECT_EQ(ids[0], im_start);
    EXPECT_EQ(ids, (std::vector<int32_t>{im_start, 872, 198, 9707, im_end, 198}));
    EXPECT_EQ(tok.decode(ids, true), chat);
    EXPECT_EQ(tok.decode(ids, false), "user\nHello\n");
    // Without parse_special the markers are ordinary text.
    const auto plain = tok.encode(chat, true, false);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), im_start), 0);
    EXPECT_EQ(tok.decode(plain), chat);
    // Longest match first: a text holding two specials back to back.
    const auto two = tok.encode("<|im_end|><|im_start|>", false, true);
    EXPECT_EQ(two, (std::vector<int32_t>{im_end, im_start}));
}

TEST(TokenizerSpecial, LlamaBpeAddsBos) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    const Tokenizer &tok = shared_tokenizer(data + "/vocab/ggml-vocab-llama-bpe.gguf");
    EXPECT_TRUE(tok.add_bos());  // Llama 3 adds BOS by default
    const auto ids = tok.encode("Hello world", true, false);
    EXPECT_EQ(ids, (std::vector<int32_t>{128000, 9906, 1917}));
    EXPECT_EQ(tok.decode(ids), "Hello world");
    EXPECT_EQ(tok.decode(ids, true), "<|begin_of_text|>Hello world");
}

// Random text (ASCII, whitespace runs, multi-byte characters, invalid bytes, special-token markers) always
// comes back from decode(encode()), with and without parse_special.
TEST(TokenizerVocabRandom, RoundTrip) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    static const char *const k_parts[] = {"a",
                                          "Z",
                                          "0",
                                          "9",
                                          " ",
                                          "  ",
                                          "\t",
                                          "\n",
                                          "\r\n",
                                          "'s",
                                          "'LL",
                                          ".",
                                          "!!",
                                          "\xc3\xa9",
                                          "\xe2\x82\xac",
                                          "\xe4\xb8\xad",
                                          "\xf0\x9f\x98\x80",
                                          "\xe1\x9e\x80",
                                          "\xcc\x81",
                                          "\xff",
                                          "\xc3",
                                          "\x80",
                                          "<|im_start|>",
                                          "<|endoftext|>",
                                          "<s>",
                                          "</s>",
                                          "\xe3\x80\x80",
                                          "\xc2\xa0",
                                          "word",
                                          " Hello",
                                          "12345"};
    std::mt19937 rng(1234);
    for (const char *name : {"llama-spm", "qwen2", "gpt-2", "deepseek-llm", "deepseek-coder", "llama-bpe"}) {
        const Tokenizer &tok = shared_tokenizer(data + "/vocab/ggml-vocab-" + name + ".gguf");
        for (int iter = 0; iter < 200; ++iter) {
            std::string text;
            const int n = int(rng() % 40);
            for (int k = 0; k < n; ++k) text += k_parts[rng() % (sizeof(k_parts) / sizeof(k_parts[0]))];
            const auto ids = tok.encode(text, false, false);
            for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.n_vocab());
            // The DeepSeek vocabularies have no normal tokens for the bytes that never occur in UTF-8 (0xC0,
            // 0xC1, 0xF5..0xFF): user-defined tokens "\xc3\xbf" (U+00FF) etc. stand for them, and those decode
            // as their text. Invalid UTF-8 cannot round-trip there (nor in llama.cpp or Hugging Face).
            const bool valid_utf8 = [&] {
                for (size_t i = 0; i < text.size(); i += unicode::decode_utf8(text, i).len) {
                    if (!unicode::decode_utf8(text, i).valid) return false;
                }
                return true;
            }();
            const int32_t ff = tok.find_token("\xc3\xbf");
            if (!valid_utf8 && ff >= 0 && tok.token_type(ff) == TokenType::USER_DEFINED) continue;
            ASSERT_EQ(tok.decode(ids), text) << name << ": '" << escaped(text) << "'";
            if (tok.type() == VocabType::BPE) {
                // special tokens come back as their text when rendered
                ASSERT_EQ(tok.decode(tok.encode(text, false, true), true), text)
                    << name << ": '" << escaped(text) << "'";
            }
        }
    }
}

// ------------------------------------------------------------------------------------------------------------
// Malformed metadata: a clear sparrow::Error, never a crash.

gguf::Value str_array(std::vector<std::string> v) {
    std::vector<gguf::Value> items;
    for (auto &s : v) items.push_back(gguf::Value::str(std::move(s)));
    return gguf::Value::array(gguf::ValueType::STRING, std::move(items));
}
gguf::Value f32_array(std::vector<float> v) {
    std::vector<gguf::Value> items;
    for (float f : v) items.push_back(gguf::Value::f32(f));
    return gguf::Value::array(gguf::ValueType::FLOAT32, std::move(items));
}
gguf::Value i32_array(std::vector<int32_t> v) {
    std::vector<gguf::Value> items;
    for (int32_t i : v) items.push_back(gguf::Value::i32(i));
    return gguf::Value::array(gguf::ValueType::INT32, std::move(items));
}

// A tiny SentencePiece vocabulary: <unk> <s> </s> ▁ a b ▁a ab
gguf::Writer spm_writer() {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("llama"));
    w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
    w.set("tokenizer.ggml.tokens", str_array({"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b",
                                              "\xe2\x96\x81"
                                              "a",
                                              "ab"}));
    w.set("tokenizer.ggml.scores", f32_array({0, 0, 0, -1, -2, -3, -0.5f, -0.25f}));
    w.set("tokenizer.ggml.token_type", i32_array({2, 3, 3, 1, 1, 1, 1, 1}));
    return w;
}

// A tiny byte-level BPE vocabulary over "a", "b", "ab", "Ġ" (the space byte) and "Ġab".
gguf::Writer bpe_writer() {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.pre", gguf::Value::str("gpt-2"));
    w.set("tokenizer.ggml.tokens", str_array({"a", "b", "ab", "\xc4\xa0",
                                              "\xc4\xa0"
                                              "ab",
                                              "<|endoftext|>"}));
    w.set("tokenizer.ggml.token_type", i32_array({1, 1, 1, 1, 1, 3}));
    w.set("tokenizer.ggml.merges", str_array({"a b", "\xc4\xa0 ab"}));
    w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(5));
    return w;
}

// Builds a Tokenizer from the writer's bytes; returns the error message ("" when it loads).
std::string load_error(const gguf::Writer &w) {
    const std::vector<uint8_t> bytes = w.to_bytes();
    try {
        const gguf::File file = gguf::File::parse(bytes);
        const Tokenizer tok(file);
        return "";
    } catch (const Error &e) {
        return e.what();
    }
}

TEST(TokenizerMalformed, ValidTinyVocabsLoad) {
    {
        const std::vector<uint8_t> bytes = spm_writer().to_bytes();
        const gguf::File file = gguf::File::parse(bytes);
        const Tokenizer tok(file);
        // " ab" -> ▁ab: ▁a (-0.5) and ab (-0.25) compete; ab wins, then ▁ + ab
        EXPECT_EQ(tok.encode("ab", false, false), (std::vector<int32_t>{3, 7}));
        EXPECT_EQ(tok.encode("a", true, false), (std::vector<int32_t>{1, 6}));
        // no byte tokens: an unknown character becomes <unk>
        EXPECT_EQ(tok.encode("c", false, false), (std::vector<int32_t>{3, 0}));
        EXPECT_EQ(tok.encode("a a", false, false), (std::vector<int32_t>{6, 6}));
    }
    {
        // A token that spans a word start ("a▁") forbids merging word by word: "▁a▁a" -> ▁ a▁ a.
        gguf::Writer w = spm_writer();
        w.set("tokenizer.ggml.tokens", str_array({"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b",
                                                  "\xe2\x96\x81"
                                                  "a",
                                                  "ab", "a\xe2\x96\x81"}));
        w.set("tokenizer.ggml.scores", f32_array({0, 0, 0, -1, -2, -3, -0.5f, -0.25f, 1.0f}));
        w.set("tokenizer.ggml.token_type", i32_array({2, 3, 3, 1, 1, 1, 1, 1, 1}));
        const std::vector<uint8_t> bytes = w.to_bytes();
        const gguf::File file = gguf::File::parse(bytes);
        const Tokenizer tok(file);
        EXPECT_EQ(tok.encode("a a", false, false), (std::vector<int32_t>{3, 8, 4}));
        EXPECT_EQ(tok.decode(tok.encode("a a", false, false)), "a a");
    }
    {
        const std::vector<uint8_t> bytes = bpe_writer().to_bytes();
        const gguf::File file = gguf::File::parse(bytes);
        const Tokenizer tok(file);
        EXPECT_EQ(tok.encode("ab ab", false, false), (std::vector<int32_t>{2, 4}));
        EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 4}), "ab ab");
        EXPECT_TRUE(tok.is_eog(5));
        EXPECT_FALSE(tok.add_bos());
    }
}

TEST(TokenizerMalformed, MissingTokens) {
    gguf::Writer w;
    w.set("tokenizer.ggml.model", gguf::Value::str("llama"));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.tokens is missing"), std::string::npos) << load_error(w);
    gguf::Writer none;
    none.set("general.architecture", gguf::Value::str("llama"));
    EXPECT_NE(load_error(none).find("tokenizer.ggml.model is missing"), std::string::npos) << load_error(none);
}

TEST(TokenizerMalformed, WrongTypes) {
    gguf::Writer w = spm_writer();
    w.set("tokenizer.ggml.tokens", gguf::Value::str("not an array"));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.tokens"), std::string::npos) << load_error(w);
    w = spm_writer();
    w.set("tokenizer.ggml.tokens", f32_array({1, 2}));
    EXPECT_NE(load_error(w).find("array of strings"), std::string::npos) << load_error(w);
    w = spm_writer();
    w.set("tokenizer.ggml.tokens", str_array({}));
    EXPECT_NE(load_error(w).find("empty"), std::string::npos) << load_error(w);
    w = spm_writer();
    w.set("tokenizer.ggml.model", gguf::Value::str("t5"));
    EXPECT_NE(load_error(w).find("unsupported tokenizer model 't5'"), std::string::npos) << load_error(w);
    w = bpe_writer();
    w.set("tokenizer.ggml.pre", gguf::Value::str("no-such-pre"));
    EXPECT_NE(load_error(w).find("unknown BPE pre-tokenizer 'no-such-pre'"), std::string::npos) << load_error(w);
}

TEST(TokenizerMalformed, ScoresAndTypesOfWrongLength) {
    gguf::Writer w = spm_writer();
    w.set("tokenizer.ggml.scores", f32_array({0, 0, 0}));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.scores has 3 entries but tokenizer.ggml.tokens has 8"),
              std::string::npos)
        << load_error(w);
    w = spm_writer();
    w.set("tokenizer.ggml.token_type", i32_array({1, 1, 1, 1, 1, 1, 1, 1, 1}));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.token_type has 9 entries"), std::string::npos) << load_error(w);
    w = spm_writer();
    w.set("tokenizer.ggml.scores", str_array({"a", "b", "c", "d", "e", "f", "g", "h"}));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.scores"), std::string::npos) << load_error(w);
}

TEST(TokenizerMalformed, BadMerges) {
    gguf::Writer w = bpe_writer();
    w.set("tokenizer.ggml.merges", str_array({"a b", "a zz"}));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.merges[1] = 'a zz' refers to a token that is not in the vocabulary"),
              std::string::npos)
        << load_error(w);
    w = bpe_writer();
    w.set("tokenizer.ggml.merges", str_array({"ab"}));
    EXPECT_NE(load_error(w).find("not two tokens separated by a space"), std::string::npos) << load_error(w);
    w = bpe_writer();
    w.set("tokenizer.ggml.merges", i32_array({1}));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.merges must be an array of strings"), std::string::npos)
        << load_error(w);
    gguf::Writer missing;
    missing.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    missing.set("tokenizer.ggml.tokens", str_array({"a"}));
    EXPECT_NE(load_error(missing).find("tokenizer.ggml.merges is missing"), std::string::npos) << load_error(missing);
}

TEST(TokenizerMalformed, BadTokenIds) {
    gguf::Writer w = spm_writer();
    w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(8));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.bos_token_id = 8 is out of range: the vocabulary has 8 tokens"),
              std::string::npos)
        << load_error(w);
    w = spm_writer();
    w.set("tokenizer.ggml.eos_token_id", gguf::Value::u64(uint64_t(1) << 40));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.eos_token_id"), std::string::npos) << load_error(w);
    w = spm_writer();
    w.set("tokenizer.ggml.padding_token_id", gguf::Value::u32(0xFFFFFFFFu));  // "none"
    EXPECT_EQ(load_error(w), "");
    w = spm_writer();
    w.set("tokenizer.ggml.unknown_token_id", gguf::Value::str("zero"));
    EXPECT_NE(load_error(w).find("tokenizer.ggml.unknown_token_id"), std::string::npos) << load_error(w);

    const std::vector<uint8_t> bytes = spm_writer().to_bytes();
    const gguf::File file = gguf::File::parse(bytes);
    const Tokenizer tok(file);
    EXPECT_THROW(tok.token_text(8), Error);
    EXPECT_THROW(tok.token_text(-1), Error);
    EXPECT_EQ(tok.token_to_piece(99), "");
    EXPECT_EQ(tok.decode(std::vector<int32_t>{-5, 4, 1000}), "a");
}

// ------------------------------------------------------------------------------------------------------------
// The regex engine on its own.

std::vector<std::string> regex_split(const std::string &pattern, const std::string &text) {
    const unicode::Regex re(pattern);
    const unicode::CodepointText t = unicode::prepare_text(text);
    std::vector<uint32_t> ends;
    re.split(t, 0, static_cast<uint32_t>(t.size()), ends);
    std::vector<std::string> out;
    uint32_t begin = 0;
    for (uint32_t end : ends) {
        out.push_back(text.substr(t.offsets[begin], t.offsets[end] - t.offsets[begin]));
        begin = end;
    }
    return out;
}

using Pieces = std::vector<std::string>;

TEST(TokenizerRegex, Basics) {
    // a run of spaces before a word keeps its last space for the word; "b" matches nothing and is a gap
    EXPECT_EQ(regex_split(R"(\s+(?!\S)|\s+)", "a   b  "), (Pieces{"a", "  ", " ", "b", "  "}));
    EXPECT_EQ(regex_split(R"( ?\p{L}+|\s+(?!\S)|\s+)", "a   b  "), (Pieces{"a", "  ", " b", "  "}));
    EXPECT_EQ(regex_split(R"(\p{N}{1,3})", "12345x9"), (Pieces{"123", "45", "x", "9"}));
    EXPECT_EQ(regex_split(R"('s|'t| ?\p{L}+)", "it's ok"), (Pieces{"it", "'s", " ok"}));
    EXPECT_EQ(regex_split(R"(\s+$)", "a  b  "), (Pieces{"a  b", "  "}));
    EXPECT_EQ(regex_split(R"([^\s\p{L}]+)", "h\xc3\xa9llo, w\xc3\xb6rld!!"),
              (Pieces{"h\xc3\xa9llo", ",", " w\xc3\xb6rld", "!!"}));
    EXPECT_EQ(regex_split(R"(\p{Lu}+)", "abCDe\xc3\x89"), (Pieces{"ab", "CD", "e", "\xc3\x89"}));
    EXPECT_EQ(regex_split(R"([\x{4E00}-\x{9FA5}]+)",
                          "a\xe4\xb8\xad\xe6\x96\x87"
                          "b"),
              (Pieces{"a", "\xe4\xb8\xad\xe6\x96\x87", "b"}));
    EXPECT_EQ(regex_split(R"(a(?=b)|c)", "abacb"), (Pieces{"a", "ba", "c", "b"}));
    // alternatives are tried in order, not longest-first
    EXPECT_EQ(regex_split(R"(a|ab)", "ab"), (Pieces{"a", "b"}));
}

TEST(TokenizerRegex, Errors) {
    EXPECT_THROW(unicode::Regex("a*"), Error);  // matches empty
    EXPECT_THROW(unicode::Regex("(a"), Error);
    EXPECT_THROW(unicode::Regex("a)"), Error);
    EXPECT_THROW(unicode::Regex("[a"), Error);
    EXPECT_THROW(unicode::Regex("\\p{Xy}"), Error);
    EXPECT_THROW(unicode::Regex("+a"), Error);
    EXPECT_THROW(unicode::Regex("(?i:a)"), Error);
    EXPECT_THROW(unicode::Regex("(?:a*)*b"), Error);  // unbounded repetition of an empty match
}

TEST(TokenizerRegex, LinearOnLongRuns) {
    // Patterns that backtrack quadratically in a naive engine: long runs of spaces and letters.
    const std::string spaces(200000, ' ');
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(regex_split(R"(\s+$)", spaces + "x").size(), 1u);  // no match: every start fails
    EXPECT_EQ(regex_split(R"(\s+$)", "x" + spaces).size(), 2u);
    EXPECT_EQ(regex_split(R"(\s*[\r\n]+|\s+(?!\S)|\s+)", spaces + "x"), (Pieces{spaces.substr(1), " ", "x"}));
    EXPECT_EQ(regex_split(R"([^\r\n\p{L}\p{N}]?\p{L}+|\s+)", std::string(200000, 'a') + "1").size(), 2u);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 5.0);
}

TEST(TokenizerUnicode, Categories) {
    using unicode::Category;
    EXPECT_EQ(unicode::category('a'), Category::Ll);
    EXPECT_EQ(unicode::category('A'), Category::Lu);
    EXPECT_EQ(unicode::category('5'), Category::Nd);
    EXPECT_EQ(unicode::category('$'), Category::Sc);
    EXPECT_EQ(unicode::category('_'), Category::Pc);
    EXPECT_EQ(unicode::category(0x4E2D), Category::Lo);
    EXPECT_EQ(unicode::category(0x0301), Category::Mn);
    EXPECT_EQ(unicode::category(0x1F600), Category::So);
    EXPECT_EQ(unicode::category(0x10FFFF), Category::Cn);
    EXPECT_TRUE(unicode::is_whitespace(0x3000));
    EXPECT_FALSE(unicode::is_whitespace(0x200B));
    for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode::byte_from_codepoint(unicode::byte_to_codepoint(uint8_t(b))), b);
    EXPECT_EQ(unicode::byte_to_codepoint(' '), 0x120u);  // "Ġ"
}

// ------------------------------------------------------------------------------------------------------------
// Pre-tokenizers without reference vectors here: their splits, worked out by hand from the patterns.

Pieces pre_split(const std::string &pre, const std::string &text) {
    const PreTokenizer p = PreTokenizer::for_name(pre);
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    p.split(text, ranges);
    Pieces out;
    for (const auto &[off, len] : ranges) out.push_back(text.substr(off, len));
    return out;
}

TEST(TokenizerPre, AllKnownNamesCompile) {
    const std::string names = PreTokenizer::known_names();
    size_t pos = 0, n = 0;
    while (pos <= names.size()) {
        const size_t end = std::min(names.find(',', pos), names.size());
        const std::string name = names.substr(pos, end - pos);
        const Pieces pieces = pre_split(name,
                                        "Hello, world! 12345 it's \xe4\xb8\xad\xe6\x96\x87"
                                        "abc  \n\n x");
        std::string joined;
        for (const auto &p : pieces) joined += p;
        EXPECT_EQ(joined,
                  "Hello, world! 12345 it's \xe4\xb8\xad\xe6\x96\x87"
                  "abc  \n\n x")
            << name;
        pos = end + 1;
        ++n;
    }
    EXPECT_GT(n, 20u);
    EXPECT_THROW(PreTokenizer::for_name("nonsense"), Error);
}

TEST(TokenizerPre, DeepSeekV3) {
    // digits in threes; CJK apart; a word may take one leading ASCII punctuation mark ("'s")
    EXPECT_EQ(
        pre_split("deepseek-v3",
                  "Hello, world! 12345 \xe4\xb8\xad\xe6\x96\x87"
                  "abc it's"),
        (Pieces{"Hello", ",", " world", "!", " ", "123", "45", " ", "\xe4\xb8\xad\xe6\x96\x87", "abc", " it", "'s"}));
    EXPECT_EQ(pre_split("deepseek-v3", "a  \n\nb"), (Pieces{"a", "  \n\n", "b"}));
    EXPECT_EQ(pre_split("deepseek-v3", "x+=1;"), (Pieces{"x", "+=", "1", ";"}));
}

TEST(TokenizerPre, Llama3AndQwen2Digits) {
    EXPECT_EQ(pre_split("llama-bpe", "1234567"), (Pieces{"123", "456", "7"}));
    EXPECT_EQ(pre_split("qwen2", "1234"), (Pieces{"1", "2", "3", "4"}));
    EXPECT_EQ(pre_split("llama-bpe", "I'M fine"), (Pieces{"I", "'M", " fine"}));
    EXPECT_EQ(pre_split("gpt-2", "I'M fine"), (Pieces{"I", "'", "M", " fine"}));  // GPT-2 contractions are lowercase
}

// ------------------------------------------------------------------------------------------------------------
// Speed: the perplexity tool tokenizes all of wiki.test.raw (1.3 MB) at once.

double time_encode(const Tokenizer &tok, const std::string &text, size_t &n_tokens) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text, true, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    n_tokens = ids.size();
    EXPECT_EQ(tok.decode(ids), text);
    return s;
}

#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
constexpr double k_wiki_limit_s = 5.0;
constexpr size_t k_wiki_bytes = SIZE_MAX;  // all of it
#else
constexpr double k_wiki_limit_s = 60.0;  // debug / sanitizer builds: only catch blow-ups,
constexpr size_t k_wiki_bytes = 300000;  // on a part of the text to keep the suite short
#endif

std::string wiki_text(const std::string &data) {
    std::string text = read_file(data + "/text/wiki.test.raw");
    if (text.size() > k_wiki_bytes) {
        text.resize(k_wiki_bytes);
        text.resize(utf8_complete_prefix(text));
    }
    return text;
}

TEST(TokenizerPerf, WikiStories260K) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    const std::string text = wiki_text(data);
    const Tokenizer &tok = shared_tokenizer(data + "/models/stories260K.gguf");
    size_t n = 0;
    const double s = time_encode(tok, text, n);
    std::printf("[          ] stories260K: %zu bytes -> %zu tokens in %.3f s\n", text.size(), n, s);
    EXPECT_LT(s, k_wiki_limit_s);
    // Long runs of one character and of spaces: the merge queue keeps this O(n log n).
    const size_t run = k_wiki_bytes < SIZE_MAX ? 20000 : 200000;
    for (const std::string &t : {std::string(run, 'a'), std::string(run, ' ') + "x", std::string(run, '\xff')}) {
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_EQ(tok.decode(tok.encode(t, false, false)), t);
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), k_wiki_limit_s);
    }
}

TEST(TokenizerPerf, WikiQwen2) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    const std::string text = wiki_text(data);
    const Tokenizer &tok = shared_tokenizer(data + "/vocab/ggml-vocab-qwen2.gguf");
    size_t n = 0;
    const double s = time_encode(tok, text, n);
    std::printf("[          ] qwen2: %zu bytes -> %zu tokens in %.3f s\n", text.size(), n, s);
    EXPECT_LT(s, k_wiki_limit_s);
    // With parse_special every control token is searched for in the text: still fast.
    const auto t_special = std::chrono::steady_clock::now();
    EXPECT_EQ(tok.encode(text, false, true).size(), n);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_special).count(), k_wiki_limit_s);
    // A long word and a long run of spaces stay fast (merging is O(n log n) per word).
    const std::string long_word(k_wiki_bytes < SIZE_MAX ? 20000 : 100000, 'x');
    const std::string long_spaces = std::string(long_word.size(), ' ') + "x";
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(tok.decode(tok.encode(long_word, false, false)), long_word);
    EXPECT_EQ(tok.decode(tok.encode(long_spaces, false, false)), long_spaces);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), k_wiki_limit_s);
}

}  // namespace
}  // namespace sparrow
