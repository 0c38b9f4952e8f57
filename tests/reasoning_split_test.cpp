#include "server/reasoning_split.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sparrow::server {
namespace {

TEST(ReasoningSplit, SplitsAtTheFirstClosingTag) {
    ReasoningParts p = split_reasoning("Let me think.\nOK</think>\n\nThe answer.");
    EXPECT_EQ(p.reasoning, "Let me think.\nOK");
    EXPECT_EQ(p.content, "The answer.");
    p = split_reasoning("a</think>b</think>c");  // a later tag is the answer's text
    EXPECT_EQ(p.reasoning, "a");
    EXPECT_EQ(p.content, "b</think>c");
    p = split_reasoning("<think>r</think>a");  // a repeated opening tag is dropped
    EXPECT_EQ(p.reasoning, "r");
    EXPECT_EQ(p.content, "a");
    p = split_reasoning("cut off mid-thought </thi");  // no closing tag: all reasoning, the tag prefix too
    EXPECT_EQ(p.reasoning, "cut off mid-thought </thi");
    EXPECT_EQ(p.content, "");
    p = split_reasoning("</think>");
    EXPECT_EQ(p.reasoning, "");
    EXPECT_EQ(p.content, "");
    p = split_reasoning("<thinx> r");  // not the opening tag: reasoning as it is
    EXPECT_EQ(p.reasoning, "<thinx> r");
}

// Every way of cutting a text into pieces sends the same parts as the whole text, and never sends part of a tag.
TEST(ReasoningSplit, StreamedPiecesSendWhatTheWholeTextGives) {
    const std::vector<std::string> texts = {"Let me think.\nOK</think>\n\nThe answer.",
                                            "<think>r</think>\na",
                                            "a </thinking> b</think>c",
                                            "no tag at all",
                                            "<thi",
                                            "x</think>",
                                            "</think>\n\n\n",
                                            "r</</think>a<think>b",
                                            "<think></think>"};
    for (const std::string &text : texts) {
        const ReasoningParts whole = split_reasoning(text);
        for (size_t a = 0; a <= text.size(); ++a) {
            for (size_t b = a; b <= text.size(); ++b) {
                ReasoningSplitter s;
                std::string reasoning, content;
                for (const std::string_view piece :
                     {std::string_view(text).substr(0, a), std::string_view(text).substr(a, b - a),
                      std::string_view(text).substr(b)}) {
                    const ReasoningParts p = s.push(piece);
                    EXPECT_EQ(p.reasoning.find("</think>"), std::string::npos) << text;
                    reasoning += p.reasoning;
                    content += p.content;
                }
                const ReasoningParts rest = s.finish();
                reasoning += rest.reasoning;
                content += rest.content;
                ASSERT_EQ(reasoning, whole.reasoning) << text << " cut at " << a << ", " << b;
                ASSERT_EQ(content, whole.content) << text << " cut at " << a << ", " << b;
            }
        }
    }
}

}  // namespace
}  // namespace sparrow::server
