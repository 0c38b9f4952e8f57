#include "runtime/grammar_constraint.h"

#include <algorithm>

#include "core/error.h"

namespace sparrow {

TokenTrie::TokenTrie(std::span<const std::string> pieces, std::span<const uint8_t> eog) {
    if (pieces.size() != eog.size()) throw_error("token trie: %zu pieces but %zu flags", pieces.size(), eog.size());
    for (size_t i = 0; i < pieces.size(); ++i)
        if (!eog[i] && !pieces[i].empty()) ids_.push_back(static_cast<int32_t>(i));
    // In text order, a trie's nodes are made in depth-first order (a prefix before its extensions, siblings by
    // byte), and equal texts sit together.
    std::sort(ids_.begin(), ids_.end(),
              [&](int32_t a, int32_t b) { return pieces[static_cast<size_t>(a)] < pieces[static_cast<size_t>(b)]; });
    nodes_.emplace_back();
    std::vector<uint32_t> path = {0};  // the nodes of the previous text, by depth
    for (size_t k = 0; k < ids_.size(); ++k) {
        const std::string &piece = pieces[static_cast<size_t>(ids_[k])];
        // The longest prefix shared with the previous text is already in the trie; the rest is new.
        size_t shared = 0;
        if (k > 0) {
            const std::string &prev = pieces[static_cast<size_t>(ids_[k - 1])];
            while (shared < piece.size() && shared < prev.size() && shared + 1 < path.size() &&
                   piece[shared] == prev[shared])
                ++shared;
        }
        for (size_t d = path.size() - 1; d > shared; --d) nodes_[path[d]].end = static_cast<uint32_t>(nodes_.size());
        path.resize(shared + 1);
        for (size_t d = shared; d < piece.size(); ++d) {
            Node n;
            n.byte = static_cast<uint8_t>(piece[d]);
            n.depth = static_cast<uint32_t>(d + 1);
            path.push_back(static_cast<uint32_t>(nodes_.size()));
            nodes_.push_back(n);
        }
        max_depth_ = std::max(max_depth_, piece.size());
        Node &end = nodes_[path.back()];
        if (end.tokens_end == 0) end.tokens_begin = static_cast<uint32_t>(k);
        end.tokens_end = static_cast<uint32_t>(k + 1);
    }
    for (const uint32_t open : path) nodes_[open].end = static_cast<uint32_t>(nodes_.size());
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::span<const std::string> pieces,
                                     std::span<const uint8_t> eog, const TokenTrie &trie, std::string start_after)
    : grammar_(std::move(grammar)),
      pieces_(pieces),
      eog_(eog),
      trie_(&trie),
      automaton_(*grammar_),
      gate_(std::move(start_after)) {
    if (pieces.size() != eog.size())
        throw_error("grammar constraint: %zu pieces but %zu flags", pieces.size(), eog.size());
    cursor_.state = automaton_.start();
}

bool GrammarConstraint::feeds(std::string_view text) const {
    GrammarCursor trial = cursor_;
    return trial.feed(automaton_, text);
}

bool GrammarConstraint::allows(int32_t token) const {
    if (token < 0 || static_cast<size_t>(token) >= pieces_.size()) return false;
    const auto t = static_cast<size_t>(token);
    if (!gate_.open()) {
        if (eog_[t]) return false;
        const std::optional<std::string> rest = gate_.after(pieces_[t]);
        return !rest || feeds(*rest);
    }
    if (eog_[t]) return cursor_.complete(automaton_);
    return (!pieces_[t].empty() && feeds(pieces_[t])) || by_token(token) != GrammarAutomaton::kDead;
}

uint32_t GrammarConstraint::by_token(int32_t token) const {
    // A token element is matched between characters only.
    if (cursor_.need != 0 || !automaton_.waits_on_tokens(cursor_.state)) return GrammarAutomaton::kDead;
    return automaton_.step_token(cursor_.state, token);
}

int64_t GrammarConstraint::mask(std::span<float> logits) const {
    allowed_.assign(logits.size(), 0);
    const size_t n = std::min(logits.size(), pieces_.size());
    if (!gate_.open()) {
        for (size_t i = 0; i < n; ++i) allowed_[i] = allows(static_cast<int32_t>(i)) ? 1 : 0;
    } else {
        // Every token's text through the trie, in one pass over its nodes: a prefix is fed once for all the tokens
        // that share it, and a refused one skips its subtree.
        const auto ids = trie_->ids();
        const auto nodes = trie_->nodes();
        walk_.resize(trie_->max_depth() + 1);
        walk_[0] = cursor_;
        for (size_t i = 1; i < nodes.size();) {
            const TokenTrie::Node &node = nodes[i];
            GrammarCursor c = walk_[node.depth - 1];
            if (!c.feed(automaton_, node.byte)) {
                i = node.end;
                continue;
            }
            walk_[node.depth] = c;
            for (uint32_t k = node.tokens_begin; k < node.tokens_end; ++k) {
                const auto id = static_cast<size_t>(ids[k]);
                if (id < n) allowed_[id] = 1;
            }
            ++i;
        }
        // Token elements the stacks wait on: that token, or any but it (never an end of generation).
        if (cursor_.need == 0 && automaton_.waits_on_tokens(cursor_.state)) {
            automaton_.for_each_token_element(cursor_.state, [&](int32_t id, bool negated) {
                if (!negated) {
                    if (static_cast<size_t>(id) < n) allowed_[static_cast<size_t>(id)] = 1;
                    return;
                }
                for (size_t i = 0; i < n; ++i)
                    if (i != static_cast<size_t>(id)) allowed_[i] = 1;
            });
        }
        const bool whole = cursor_.complete(automaton_);
        for (size_t i = 0; i < n; ++i)
            if (eog_[i]) allowed_[i] = whole ? 1 : 0;
    }
    return keep_allowed(logits, [&](size_t i) { return allowed_[i] != 0; });
}

void GrammarConstraint::accept(int32_t token) {
    SPARROW_ASSERT(allows(token));
    const auto t = static_cast<size_t>(token);
    if (!gate_.open()) {
        if (const std::optional<std::string> rest = gate_.pass(pieces_[t])) cursor_.feed(automaton_, *rest);
    } else if (!eog_[t]) {
        // The token's text read by the stacks that wait on characters, and the token itself by those that wait on
        // a token element: the stacks of both go on (a text that stops inside a character keeps its own).
        GrammarCursor text = cursor_;
        const bool by_text = !pieces_[t].empty() && text.feed(automaton_, pieces_[t]);
        const uint32_t token_state = by_token(token);
        if (by_text && text.need == 0) {
            text.state = automaton_.merge(text.state, token_state);
            cursor_ = text;
        } else if (by_text) {
            cursor_ = text;
        } else {
            cursor_ = GrammarCursor{};
            cursor_.state = token_state;
        }
    }
    // The caches hold every state the mask walks touched; past their bound only the current one is kept.
    if (automaton_.cached() > GrammarAutomaton::kMaxCached) cursor_.state = automaton_.compact(cursor_.state);
}

}  // namespace sparrow
