// GBNF-constrained sampling (runtime/grammar.h) over a vocabulary: which tokens keep the reply a prefix of a text the
// grammar derives, and, once it is whole, that generation may end.
//
// A vocabulary's tokens share prefixes ("the", "there", "therefore"), so the mask walks a byte trie of their texts
// with the grammar's cursor, each prefix fed once and a subtree dropped at its first refused byte; the automaton
// caches its steps, so the walk is mostly lookups.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/constraint.h"
#include "runtime/grammar.h"

namespace sparrow {

// The texts of a vocabulary's tokens as a byte trie, its nodes in depth-first order (a node's subtree is the run
// of nodes after it up to `end`), so that a walk over it is one pass over an array that skips refused subtrees.
// End-of-generation tokens and empty texts are left out.
class TokenTrie {
  public:
    TokenTrie(std::span<const std::string> pieces, std::span<const uint8_t> eog);

    struct Node {
        uint32_t end = 0;                           // the first node after this one's subtree
        uint32_t tokens_begin = 0, tokens_end = 0;  // ids()[tokens_begin, tokens_end): the tokens whose text ends here
        uint32_t depth = 0;                         // the byte's place in the text, from 1 (0: the root)
        uint8_t byte = 0;
    };
    // nodes()[0] is the root (the empty text).
    std::span<const Node> nodes() const { return nodes_; }
    std::span<const int32_t> ids() const { return ids_; }
    size_t max_depth() const { return max_depth_; }

  private:
    std::vector<Node> nodes_;
    std::vector<int32_t> ids_;  // token ids sorted by their text
    size_t max_depth_ = 0;
};

class GrammarConstraint final : public TokenConstraint {
  public:
    // `pieces`, `eog` and `trie` (built from them) must outlive the constraint; with `start_after`, the grammar's
    // text begins after it (StartGate).
    GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::span<const std::string> pieces,
                      std::span<const uint8_t> eog, const TokenTrie &trie, std::string start_after = {});
    // End-of-generation tokens once the text is whole, and before that tokens whose text (not empty) continues it.
    bool allows(int32_t token) const override;
    int64_t mask(std::span<float> logits) const override;
    void accept(int32_t token) override;
    bool complete() const override { return gate_.open() && cursor_.complete(automaton_); }

  private:
    bool feeds(std::string_view text) const;  // the text continues the grammar's from where it stands
    uint32_t by_token(int32_t token) const;   // the state after `token` as a whole token (a token element), or kDead

    std::shared_ptr<const Grammar> grammar_;
    std::span<const std::string> pieces_;
    std::span<const uint8_t> eog_;
    const TokenTrie *trie_;
    mutable GrammarAutomaton automaton_;  // its caches grow as queries step it
    GrammarCursor cursor_;
    StartGate gate_;
    mutable std::vector<uint8_t> allowed_;     // mask()'s scratch
    mutable std::vector<GrammarCursor> walk_;  // mask()'s cursor at each depth of the trie
};

}  // namespace sparrow
