#include "server/reasoning_split.h"

#include <algorithm>

#include "server/stop_strings.h"

namespace sparrow::server {

namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

}  // namespace

ReasoningParts ReasoningSplitter::push(std::string_view text) {
    ReasoningParts out;
    held_.append(text);
    if (state_ == State::start) {
        // Undecided while what came is a prefix of "<think>"; a repeated opening tag is dropped.
        if (held_.size() < kOpen.size() && kOpen.substr(0, held_.size()) == held_) return out;
        if (std::string_view(held_).starts_with(kOpen)) held_.erase(0, kOpen.size());
        state_ = State::reasoning;
    }
    if (state_ == State::reasoning) {
        const size_t close = held_.find(kClose);
        if (close == std::string::npos) {
            const size_t keep = marker_prefix_at_end(held_, kClose);
            out.reasoning = held_.substr(0, held_.size() - keep);
            held_.erase(0, held_.size() - keep);
            return out;
        }
        out.reasoning = held_.substr(0, close);
        held_.erase(0, close + kClose.size());
        state_ = State::answer_start;
    }
    if (state_ == State::answer_start) {  // the newlines between the tag and the answer are not the answer's
        const size_t first = held_.find_first_not_of('\n');
        if (first == std::string::npos) {
            held_.clear();
            return out;
        }
        held_.erase(0, first);
        state_ = State::answer;
    }
    out.content = std::move(held_);
    held_.clear();
    return out;
}

ReasoningParts ReasoningSplitter::finish() {
    ReasoningParts out;
    if (state_ == State::start || state_ == State::reasoning) out.reasoning = std::move(held_);
    held_.clear();
    return out;
}

ReasoningParts split_reasoning(std::string_view text) {
    ReasoningSplitter s;
    ReasoningParts all = s.push(text), rest = s.finish();
    all.reasoning += rest.reasoning;
    all.content += rest.content;
    return all;
}

}  // namespace sparrow::server
