"""Reference SentencePiece-style tokenizer for GGUF vocabularies with tokenizer.ggml.model == "llama",
following llama.cpp's behaviour (used to turn test text into token ids for perplexity cross-checks).

Algorithm:
  1. Prepend a space when tokenizer.ggml.add_space_prefix (default true), then replace every ' ' by
     U+2581 '▁'.
  2. Start from one symbol per Unicode character. Every adjacent pair whose concatenation is a vocabulary
     token is a candidate merge, ranked by that token's score (higher first; ties: leftmost first).
     Repeatedly apply the best candidate that is still valid (both sides unchanged since it was queued)
     and queue the new pairs it forms with its neighbours.
  3. Each final symbol is its token; a symbol that is not in the vocabulary (a character never merged)
     falls back to one <0xXX> byte token per UTF-8 byte (unknown token if there are no byte tokens).
Special tokens in the text are not parsed (text is plain text).
"""

from __future__ import annotations

import heapq

from gguf import GGUFReader


class SPMTokenizer:
    def __init__(self, gguf: GGUFReader | str):
        f = GGUFReader(gguf) if isinstance(gguf, str) else gguf
        if f.get("tokenizer.ggml.model") != "llama":
            raise ValueError(f"tokenizer model {f.get('tokenizer.ggml.model')!r} is not 'llama' (SPM)")
        self.tokens = list(f.metadata["tokenizer.ggml.tokens"])
        self.scores = list(f.metadata.get("tokenizer.ggml.scores", [0.0] * len(self.tokens)))
        self.token_to_id = {}
        for i, t in enumerate(self.tokens):
            self.token_to_id.setdefault(t, i)
        self.bos = f.get("tokenizer.ggml.bos_token_id", 1)
        self.eos = f.get("tokenizer.ggml.eos_token_id", 2)
        self.unk = f.get("tokenizer.ggml.unknown_token_id", 0)
        self.add_bos = bool(f.get("tokenizer.ggml.add_bos_token", True))
        self.add_space_prefix = bool(f.get("tokenizer.ggml.add_space_prefix", True))

    def byte_token(self, b: int) -> int:
        return self.token_to_id.get(f"<0x{b:02X}>", self.unk)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        add_bos = self.add_bos if add_bos is None else add_bos
        out = [self.bos] if add_bos else []
        if not text:
            return out
        if self.add_space_prefix:
            text = " " + text
        text = text.replace(" ", "\u2581")

        sym = list(text)                       # symbol texts; "" once merged into the left neighbour
        n = len(sym)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            s = sym[left] + sym[right]
            tid = self.token_to_id.get(s)
            if tid is not None:
                heapq.heappush(heap, (-self.scores[tid], left, right, len(s)))

        for i in range(1, n):
            push(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
                continue                       # stale: one side changed since it was queued
            sym[left] += sym[right]
            sym[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])

        i = 0
        while i != -1:
            tid = self.token_to_id.get(sym[i])
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self.byte_token(b) for b in sym[i].encode("utf-8"))
            i = nxt[i]
        return out

    def decode(self, ids) -> str:
        raw = bytearray()
        for t in ids:
            s = self.tokens[t]
            if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
                raw.append(int(s[3:5], 16))
            elif t in (self.bos, self.eos):
                continue
            else:
                raw.extend(s.replace("\u2581", " ").encode("utf-8"))
        return raw.decode("utf-8", errors="replace")
