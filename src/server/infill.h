// Fill-in-the-middle prompts (llama.cpp's /infill): a code model sees the text before and after a hole between
// its FIM tokens and generates what goes in the hole.
//
//   [BOS] [REP "myproject\n" {SEP filename "\n" text}...] PRE prefix SUF suffix MID prompt
//
// The repository part (input_extra: other files' text) is there only when the vocabulary has the repo and file
// separator tokens; without them the extra texts go before PRE as they are, each after its file name line.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sparrow {
class Tokenizer;
namespace gguf {
class File;
}
}  // namespace sparrow

namespace sparrow::server {

struct FimTokens {
    int32_t pre = -1, suf = -1, mid = -1;  // prefix, suffix, middle: all three for infill
    int32_t rep = -1, sep = -1;            // repository name and file separator: optional
    bool usable() const { return pre >= 0 && suf >= 0 && mid >= 0; }
};

// The model's FIM tokens: tokenizer.ggml.fim_{pre,suf,mid,rep,sep}_token_id (or the older prefix/suffix/
// middle_token_id keys), else tokens spelled as the known families spell them (Qwen, StarCoder, DeepSeek, CodeLlama).
FimTokens fim_tokens(const gguf::File &file, const Tokenizer &tok);

struct InfillChunk {
    std::string filename;
    std::string text;
};

// Budgets in tokens, llama.cpp's split of a batch: the prefix keeps its last 3/4 of `budget` at most, the suffix its
// first budget/4 - 2 - |prompt| at most, the extra files their last `extra_budget` tokens.
struct InfillBudget {
    int64_t budget = 0;
    int64_t extra_budget = 0;
};

// The token ids of the infill prompt (texts tokenized without special tokens, BOS where the vocabulary adds it).
std::vector<int32_t> infill_prompt(const Tokenizer &tok, const FimTokens &fim, std::string_view prefix,
                                   std::string_view suffix, std::string_view prompt, std::span<const InfillChunk> extra,
                                   const InfillBudget &budget);

}  // namespace sparrow::server
