// A thinking model's reply split into its reasoning and its answer, as clients of DeepSeek's and llama.cpp's
// servers receive them (message.reasoning_content and message.content). The chat formats that think open the block
// in the generation prompt ("...<think>"), so the reply is the reasoning, "</think>", then the answer. Streamed
// text arrives in pieces: a piece that ends in a prefix of the tag is held back until the next one shows whether
// the tag follows.
#pragma once

#include <string>
#include <string_view>

namespace sparrow::server {

struct ReasoningParts {
    std::string reasoning;  // text before "</think>" (a "<think>" the model repeats at the very start is dropped)
    std::string content;    // text after it, without the newlines that open the answer
};

class ReasoningSplitter {
  public:
    // The next piece of generated text; returns what can be sent now of each part.
    ReasoningParts push(std::string_view text);
    // Generation ended: what was held back (a tag prefix that never completed is reasoning).
    ReasoningParts finish();

  private:
    enum class State { start, reasoning, answer_start, answer };
    State state_ = State::start;
    std::string held_;  // text not yet sent: a possible prefix of "<think>" (start) or of "</think>" (reasoning)
};

// The whole reply at once (the parts a stream of any pieces would send, concatenated).
ReasoningParts split_reasoning(std::string_view text);

}  // namespace sparrow::server
