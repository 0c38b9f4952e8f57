// Fill-in-the-middle prompts (server/infill.h): the FIM tokens found by metadata key (llama's synthetic file) or by
// their text (deepseek32's), and the prompt's layout and cuts written out token by token.
#include "server/infill.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "runtime/tokenizer.h"
#include "test_util.h"

namespace sparrow::server {
namespace {

std::shared_ptr<const Model> fim_model(const std::string &arch, bool fim) {
    const std::string dir = test::make_temp_dir("sparrow-infill");
    SyntheticParams p = synthetic_defaults(arch, "");
    p.fim_tokens = fim;
    write_synthetic_model(p, dir + "/m.gguf");
    auto m = load_model(dir + "/m.gguf");
    std::filesystem::remove_all(dir);
    return m;
}

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto &p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

TEST(Infill, FindsTheTokensByKeyOrByText) {
    for (const std::string arch : {"llama", "deepseek32"}) {
        const auto m = fim_model(arch, true);
        const Tokenizer &tok = model_tokenizer(*m);
        const FimTokens f = fim_tokens(m->file(), tok);
        ASSERT_TRUE(f.usable()) << arch;
        EXPECT_EQ(f.pre, tok.eos_id() + 1) << arch;
        EXPECT_EQ(f.suf, tok.eos_id() + 2) << arch;
        EXPECT_EQ(f.mid, tok.eos_id() + 3) << arch;
        EXPECT_EQ(tok.token_text(f.pre), "<｜fim▁begin｜>");
        EXPECT_EQ(f.rep, -1);
        EXPECT_EQ(f.sep, -1);
        EXPECT_EQ(m->file().has("tokenizer.ggml.fim_pre_token_id"), arch == "llama");
    }
    const auto none = fim_model("llama", false);
    const FimTokens f = fim_tokens(none->file(), model_tokenizer(*none));
    EXPECT_FALSE(f.usable());
    EXPECT_THROW(infill_prompt(model_tokenizer(*none), f, "a", "b", "", {}, {100, 100}), Error);
}

TEST(Infill, LaysOutAndCutsThePrompt) {
    const auto m = fim_model("llama", true);
    const Tokenizer &tok = model_tokenizer(*m);
    FimTokens f = fim_tokens(m->file(), tok);
    const auto ids = [&](const std::string &s) { return tok.encode(s, false, false); };
    const int32_t bos = tok.bos_id();
    const std::string prefix = "the cat sat on the mat and then ", suffix = " and that was all of it", mid = "it";
    // Room for everything: [BOS] PRE prefix SUF suffix MID prompt.
    EXPECT_EQ(infill_prompt(tok, f, prefix, suffix, mid, {}, {1000, 1000}),
              cat({{bos, f.pre}, ids(prefix), {f.suf}, ids(suffix), {f.mid}, ids(mid)}));
    // A budget of 16: the prefix keeps its last 12 tokens, the suffix its first 16 / 4 - 2 - |prompt| = 1.
    const std::vector<int32_t> p = ids(prefix), s = ids(suffix), q = ids(mid);
    ASSERT_GT(p.size(), 12u);
    ASSERT_EQ(q.size(), 1u);
    EXPECT_EQ(infill_prompt(tok, f, prefix, suffix, mid, {}, {16, 0}),
              cat({{bos, f.pre}, std::vector<int32_t>(p.end() - 12, p.end()), {f.suf}, {s[0]}, {f.mid}, q}));
    // Other files: without repository tokens their name line and text, before PRE; the context keeps its end.
    const std::vector<InfillChunk> extra = {{"a.py", "x = 1\n"}, {"b.py", "y = 2\n"}};
    const std::vector<int32_t> files = cat({ids("a.py\n"), ids("x = 1\n"), ids("b.py\n"), ids("y = 2\n")});
    EXPECT_EQ(infill_prompt(tok, f, "p", "s", "", extra, {1000, 1000}),
              cat({{bos}, files, {f.pre}, ids("p"), {f.suf}, ids("s"), {f.mid}}));
    EXPECT_EQ(infill_prompt(tok, f, "p", "s", "", extra, {1000, 3}),
              cat({{bos},
                   std::vector<int32_t>(files.end() - 3, files.end()),
                   {f.pre},
                   ids("p"),
                   {f.suf},
                   ids("s"),
                   {f.mid}}));
    // With repository and file separator tokens (stand-ins here): REP "myproject\n", then SEP before each file.
    f.rep = 7;
    f.sep = 8;
    EXPECT_EQ(infill_prompt(tok, f, "p", "s", "", extra, {1000, 1000}), cat({{bos, 7},
                                                                             ids("myproject\n"),
                                                                             {8},
                                                                             ids("a.py\n"),
                                                                             ids("x = 1\n"),
                                                                             {8},
                                                                             ids("b.py\n"),
                                                                             ids("y = 2\n"),
                                                                             {f.pre},
                                                                             ids("p"),
                                                                             {f.suf},
                                                                             ids("s"),
                                                                             {f.mid}}));
}

}  // namespace
}  // namespace sparrow::server
