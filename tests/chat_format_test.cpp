// Chat formats: each built-in format against what its Jinja template renders (goldens produced once with
// jinja2 3.1 from ../shared/data/templates, HF settings trim_blocks + lstrip_blocks; the Llama-2 template is
// Meta's), and template recognition.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "server/chat_format.h"
#include "test_util.h"

namespace sparrow::server {
namespace {

std::vector<ChatMessage> conversation(const std::string &name) {
    if (name == "sys_user") return {{"system", "You are terse.", {}}, {"user", "Hi there", {}}};
    if (name == "multi") {
        return {{"system", "S1", {}}, {"user", "Q1", {}}, {"assistant", " A1 \n", {}}, {"user", "Q2", {}}};
    }
    if (name == "rc") {  // thinking sent as reasoning_content
        return {{"user", "Q1", {}},
                {"assistant", " A1 ", std::string("R1")},
                {"user", "Q2", {}},
                {"assistant", "A2", std::string(" R2 ")}};
    }
    if (name == "two_sys") {
        return {{"system", "S1", {}}, {"user", "Q1", {}}, {"system", "S2", {}}, {"user", "Q2", {}}};
    }
    // "think": assistant turns that carry their thinking inline.
    return {{"user", "Q1", {}},
            {"assistant", "<think>\nR1\n</think>\nA1", {}},
            {"user", "Q2", {}},
            {"assistant", "<think>R2</think>A2", {}}};
}

struct Golden {
    const char *format;
    const char *conversation;
    bool add_generation_prompt;
    std::optional<bool> enable_thinking;
    const char *expected;
};

const Golden kGoldens[] = {
    {"deepseek3", "sys_user", true, std::nullopt,
     "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there<｜Assistant｜><think></think>"},
    {"deepseek3", "sys_user", true, true,
     "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there<｜Assistant｜><think>"},
    {"deepseek3", "sys_user", true, false,
     "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there<｜Assistant｜><think></think>"},
    {"deepseek3", "sys_user", false, std::nullopt, "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there"},
    {"deepseek3", "multi", true, std::nullopt,
     "<｜begin▁of▁sentence｜>S1<｜User｜>Q1<｜Assistant｜></think> A1 "
     "\n<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜><think></think>"},
    {"deepseek3", "multi", true, true,
     "<｜begin▁of▁sentence｜>S1<｜User｜>Q1<｜Assistant｜></think> A1 "
     "\n<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜><think>"},
    {"deepseek3", "multi", true, false,
     "<｜begin▁of▁sentence｜>S1<｜User｜>Q1<｜Assistant｜></think> A1 "
     "\n<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜><think></think>"},
    {"deepseek3", "multi", false, std::nullopt,
     "<｜begin▁of▁sentence｜>S1<｜User｜>Q1<｜Assistant｜></think> A1 \n<｜end▁of▁sentence｜><｜User｜>Q2"},
    {"deepseek3", "think", true, std::nullopt,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think><think>\nR1\n</"
     "think>\nA1<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think><think>R2</think>A2<｜end▁of▁sentence｜>"},
    {"deepseek3", "think", true, true,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think><think>\nR1\n</"
     "think>\nA1<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜><think></think><think>R2</"
     "think>A2<｜end▁of▁sentence｜>"},
    {"deepseek3", "think", true, false,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think><think>\nR1\n</"
     "think>\nA1<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think><think>R2</think>A2<｜end▁of▁sentence｜>"},
    {"deepseek3", "think", false, std::nullopt,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think><think>\nR1\n</"
     "think>\nA1<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think><think>R2</think>A2<｜end▁of▁sentence｜>"},
    {"deepseek3", "rc", true, std::nullopt,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think> A1 "
     "<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think>A2<｜end▁of▁sentence｜>"},
    {"deepseek3", "rc", true, true,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think> A1 "
     "<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜><think> R2 </think>A2<｜end▁of▁sentence｜>"},
    {"deepseek3", "rc", true, false,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think> A1 "
     "<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think>A2<｜end▁of▁sentence｜>"},
    {"deepseek3", "rc", false, std::nullopt,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think> A1 "
     "<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think>A2<｜end▁of▁sentence｜>"},
    {"deepseek3", "two_sys", true, std::nullopt,
     "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q1<｜User｜>Q2<｜Assistant｜><think></think>"},
    {"deepseek3", "two_sys", true, true,
     "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q1<｜User｜>Q2<｜Assistant｜><think>"},
    {"deepseek3", "two_sys", true, false,
     "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q1<｜User｜>Q2<｜Assistant｜><think></think>"},
    {"deepseek3", "two_sys", false, std::nullopt, "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q1<｜User｜>Q2"},
    {"deepseek4", "sys_user", true, std::nullopt,
     "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there<｜Assistant｜></think>"},
    {"deepseek4", "sys_user", true, true,
     "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there<｜Assistant｜><think>"},
    {"deepseek4", "sys_user", true, false,
     "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there<｜Assistant｜></think>"},
    {"deepseek4", "sys_user", false, std::nullopt, "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi there"},
    {"deepseek4", "multi", true, std::nullopt,
     "<｜begin▁of▁sentence｜>S1<｜User｜>Q1<｜Assistant｜></think> A1 "
     "\n<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think>"},
    {"deepseek4", "multi", true, true,
     "<｜begin▁of▁sentence｜>S1<｜User｜>Q1<｜Assistant｜></think> A1 "
     "\n<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜><think>"},
    {"deepseek4", "multi", true, false,
     "<｜begin▁of▁sentence｜>S1<｜User｜>Q1<｜Assistant｜></think> A1 "
     "\n<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think>"},
    {"deepseek4", "multi", false, std::nullopt,
     "<｜begin▁of▁sentence｜>S1<｜User｜>Q1<｜Assistant｜></think> A1 \n<｜end▁of▁sentence｜><｜User｜>Q2"},
    {"deepseek4", "think", true, std::nullopt,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think><think>\nR1\n</"
     "think>\nA1<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think><think>R2</"
     "think>A2<｜end▁of▁sentence｜><｜Assistant｜></think>"},
    {"deepseek4", "think", true, true,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think><think>\nR1\n</"
     "think>\nA1<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜><think></think><think>R2</"
     "think>A2<｜end▁of▁sentence｜><｜Assistant｜><think>"},
    {"deepseek4", "think", true, false,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think><think>\nR1\n</"
     "think>\nA1<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think><think>R2</"
     "think>A2<｜end▁of▁sentence｜><｜Assistant｜></think>"},
    {"deepseek4", "think", false, std::nullopt,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think><think>\nR1\n</"
     "think>\nA1<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think><think>R2</think>A2<｜end▁of▁sentence｜>"},
    {"deepseek4", "rc", true, std::nullopt,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think> A1 "
     "<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think>A2<｜end▁of▁sentence｜><｜Assistant｜></think>"},
    {"deepseek4", "rc", true, true,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think> A1 "
     "<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜><think> R2 "
     "</think>A2<｜end▁of▁sentence｜><｜Assistant｜><think>"},
    {"deepseek4", "rc", true, false,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think> A1 "
     "<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think>A2<｜end▁of▁sentence｜><｜Assistant｜></think>"},
    {"deepseek4", "rc", false, std::nullopt,
     "<｜begin▁of▁sentence｜><｜User｜>Q1<｜Assistant｜></think> A1 "
     "<｜end▁of▁sentence｜><｜User｜>Q2<｜Assistant｜></think>A2<｜end▁of▁sentence｜>"},
    {"deepseek4", "two_sys", true, std::nullopt,
     "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q1\n\nQ2<｜Assistant｜></think>"},
    {"deepseek4", "two_sys", true, true, "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q1\n\nQ2<｜Assistant｜><think>"},
    {"deepseek4", "two_sys", true, false, "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q1\n\nQ2<｜Assistant｜></think>"},
    {"deepseek4", "two_sys", false, std::nullopt, "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Q1\n\nQ2"},
    {"glm", "sys_user", true, std::nullopt, "[gMASK]<sop><|system|>You are terse.<|user|>Hi there<|assistant|><think>"},
    {"glm", "sys_user", true, true, "[gMASK]<sop><|system|>You are terse.<|user|>Hi there<|assistant|><think>"},
    {"glm", "sys_user", true, false, "[gMASK]<sop><|system|>You are terse.<|user|>Hi there<|assistant|></think>"},
    {"glm", "sys_user", false, std::nullopt, "[gMASK]<sop><|system|>You are terse.<|user|>Hi there"},
    {"glm", "multi", true, std::nullopt,
     "[gMASK]<sop><|system|>S1<|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>"},
    {"glm", "multi", true, true,
     "[gMASK]<sop><|system|>S1<|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>"},
    {"glm", "multi", true, false,
     "[gMASK]<sop><|system|>S1<|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|></think>"},
    {"glm", "multi", false, std::nullopt, "[gMASK]<sop><|system|>S1<|user|>Q1<|assistant|></think>A1<|user|>Q2"},
    {"glm", "think", true, std::nullopt,
     "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2<|assistant|><think>"},
    {"glm", "think", true, true,
     "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2<|assistant|><think>"},
    {"glm", "think", true, false,
     "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2<|assistant|></think>"},
    {"glm", "think", false, std::nullopt,
     "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2"},
    {"glm", "rc", true, std::nullopt,
     "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2<|assistant|><think>"},
    {"glm", "rc", true, true,
     "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2<|assistant|><think>"},
    {"glm", "rc", true, false,
     "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2<|assistant|></think>"},
    {"glm", "rc", false, std::nullopt,
     "[gMASK]<sop><|user|>Q1<|assistant|></think>A1<|user|>Q2<|assistant|><think>R2</think>A2"},
    {"glm", "two_sys", true, std::nullopt,
     "[gMASK]<sop><|system|>S1<|user|>Q1<|system|>S2<|user|>Q2<|assistant|><think>"},
    {"glm", "two_sys", true, true, "[gMASK]<sop><|system|>S1<|user|>Q1<|system|>S2<|user|>Q2<|assistant|><think>"},
    {"glm", "two_sys", true, false, "[gMASK]<sop><|system|>S1<|user|>Q1<|system|>S2<|user|>Q2<|assistant|></think>"},
    {"glm", "two_sys", false, std::nullopt, "[gMASK]<sop><|system|>S1<|user|>Q1<|system|>S2<|user|>Q2"},
    {"llama2", "sys_user", true, std::nullopt, "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST]"},
    {"llama2", "sys_user", false, std::nullopt, "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST]"},
    {"llama2", "multi", true, std::nullopt,
     "<s>[INST] <<SYS>>\nS1\n<</SYS>>\n\nQ1 [/INST] A1 </s><s>[INST] Q2 [/INST]"},
    {"llama2", "multi", false, std::nullopt,
     "<s>[INST] <<SYS>>\nS1\n<</SYS>>\n\nQ1 [/INST] A1 </s><s>[INST] Q2 [/INST]"},
    {"llama2", "think", true, std::nullopt,
     "<s>[INST] Q1 [/INST] <think>\nR1\n</think>\nA1 </s><s>[INST] Q2 [/INST] <think>R2</think>A2 </s>"},
    {"llama2", "think", false, std::nullopt,
     "<s>[INST] Q1 [/INST] <think>\nR1\n</think>\nA1 </s><s>[INST] Q2 [/INST] <think>R2</think>A2 </s>"},
    {"llama2", "rc", true, std::nullopt, "<s>[INST] Q1 [/INST] A1 </s><s>[INST] Q2 [/INST] A2 </s>"},
    {"llama2", "rc", false, std::nullopt, "<s>[INST] Q1 [/INST] A1 </s><s>[INST] Q2 [/INST] A2 </s>"},
    {"llama2", "two_sys", true, std::nullopt, "<s>[INST] <<SYS>>\nS1\n<</SYS>>\n\nQ1 [/INST]<s>[INST] Q2 [/INST]"},
    {"llama2", "two_sys", false, std::nullopt, "<s>[INST] <<SYS>>\nS1\n<</SYS>>\n\nQ1 [/INST]<s>[INST] Q2 [/INST]"},
};

TEST(ChatFormat, MatchesTheTemplates) {
    for (const Golden &g : kGoldens) {
        const ChatFormat f = chat_format_from_name(g.format);
        ChatOptions opts;
        opts.add_generation_prompt = g.add_generation_prompt;
        opts.enable_thinking = g.enable_thinking;
        opts.bos_text = f == ChatFormat::deepseek3 || f == ChatFormat::deepseek4 ? "<｜begin▁of▁sentence｜>" : "<s>";
        opts.eos_text = "</s>";
        EXPECT_EQ(apply_chat_format(f, conversation(g.conversation), opts), g.expected)
            << g.format << " / " << g.conversation << " / generation prompt " << g.add_generation_prompt;
    }
}

TEST(ChatFormat, ExplicitReasoningContent) {
    // GLM: a reasoning_content field wins over <think> in the text; shown only after the last user turn.
    std::vector<ChatMessage> m = {{"user", "Q", {}}, {"assistant", " A ", std::string(" R ")}};
    ChatOptions no_prompt;
    no_prompt.add_generation_prompt = false;
    EXPECT_EQ(apply_chat_format(ChatFormat::glm, m, no_prompt), "[gMASK]<sop><|user|>Q<|assistant|><think>R</think>A");
    ChatOptions ds = no_prompt;
    ds.enable_thinking = true;
    ds.bos_text = "<B>";
    EXPECT_EQ(apply_chat_format(ChatFormat::deepseek3, m, ds),
              "<B><｜User｜>Q<｜Assistant｜><think> R </think> A <｜end▁of▁sentence｜>");
}

TEST(ChatFormat, RejectsWhatTheFormatCannotExpress) {
    const std::vector<ChatMessage> two_users = {{"user", "a", {}}, {"user", "b", {}}};
    EXPECT_THROW(apply_chat_format(ChatFormat::llama2, two_users, {}), Error);
    // A system message alone: the template has no user turn to put it in (said so, not "the prompt is empty").
    try {
        apply_chat_format(ChatFormat::llama2, {{"system", "S", {}}}, {});
        ADD_FAILURE() << "a system message alone was rendered";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("needs a user message"), std::string::npos) << e.what();
    }
    // Tool results: llama2 has none; DeepSeek-V3.2 numbers them by the calls of the assistant turn before them.
    const std::vector<ChatMessage> tool = {{"tool", "x", {}}};
    for (ChatFormat f : {ChatFormat::deepseek3, ChatFormat::llama2}) {
        EXPECT_THROW(apply_chat_format(f, tool, {}), Error) << chat_format_name(f);
    }
    EXPECT_THROW(apply_chat_format(ChatFormat::llama2, {{"other", "x", {}}}, {}), Error);
    for (ChatFormat f : {ChatFormat::deepseek3, ChatFormat::deepseek4, ChatFormat::glm}) {
        EXPECT_THROW(apply_chat_format(f, {{"critic", "x", {}}}, {}), Error) << chat_format_name(f);
    }
    EXPECT_THROW(chat_format_from_name("chatml"), Error);
}

TEST(ChatFormat, RecognisesTemplates) {
    EXPECT_EQ(detect_chat_format("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"), ChatFormat::llama2);
    EXPECT_EQ(detect_chat_format("{% for m in messages %}{{ m.content }}{% endfor %}"), std::nullopt);
    SPARROW_REQUIRE_SHARED_DATA(data);
    const auto read = [&](const char *name) {
        std::ifstream in(data + "/templates/" + name);
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
    };
    EXPECT_EQ(detect_chat_format(read("deepseek-ai-DeepSeek-V3.2.jinja")), ChatFormat::deepseek3);
    EXPECT_EQ(detect_chat_format(read("deepseek-ai-DeepSeek-V4.jinja")), ChatFormat::deepseek4);
    EXPECT_EQ(detect_chat_format(read("GLM-4.7-Flash.jinja")), ChatFormat::glm);
}

}  // namespace
}  // namespace sparrow::server
