#!/usr/bin/python3
"""float64 reference forward pass of the GGUF `llama` architecture, as llama.cpp runs it.

    x = token_embd[tokens]
    per layer N (tensors blk.N.*):
        h  = rms_norm(x) * attn_norm
        q, k, v = h Wq^T, h Wk^T, h Wv^T            (+ optional biases), split into heads
        q, k = rope(q), rope(k)                      ggml NORM layout: adjacent pairs (x[2i], x[2i+1])
        a  = softmax(q k^T / sqrt(head_dim) + causal mask) v    grouped-query: head h reads kv head h//group
        x  = x + a Wo^T
        h  = rms_norm(x) * ffn_norm
        x  = x + Wdown^T (silu(h Wgate^T) * (h Wup^T))
    logits = rms_norm(x) * output_norm  @ output^T  (output tied to token_embd when output.weight is absent)

llama.cpp's converter permutes the HF q/k weights so that the adjacent-pair layout is right for GGUF files.

CLI:
    /usr/bin/python3 tests/reference/llama_ref.py --model F.gguf --tokens 1,403,407 \
        [--out logits.npy] [--all-positions] [--greedy N]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (ROPE_NORM, attention, causal_mask, linear, rms_norm, rope,  # noqa: E402
                    swiglu, token_logprobs)
from gguf import GGUFReader  # noqa: E402


@dataclass
class LlamaHParams:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_rot: int
    rms_eps: float
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    # YaRN (only when llama.rope.scaling.type == "yarn")
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0
    n_ctx_train: int = 0


class LlamaModel:
    """Weights (float64, numpy shapes) and hyper-parameters of a GGUF llama model."""

    def __init__(self, path: str):
        self.gguf = f = GGUFReader(path)
        arch = f.get("general.architecture")
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch!r} is not 'llama'")
        self.tensors = {name: f.tensor(name) for name in f.tensors}
        self.hp = self._hparams()
        if any(n.startswith("blk.0.ffn_gate_inp") for n in self.tensors):
            raise NotImplementedError("mixture-of-experts llama (ffn_gate_inp) is not implemented")

    def _hparams(self) -> LlamaHParams:
        f, a = self.gguf, "llama."
        n_embd = int(f.metadata[a + "embedding_length"])
        n_head = int(f.metadata[a + "attention.head_count"])
        n_head_kv = int(f.get(a + "attention.head_count_kv", n_head))
        head_dim_k = int(f.get(a + "attention.key_length", n_embd // n_head))
        head_dim_v = int(f.get(a + "attention.value_length", n_embd // n_head))
        n_vocab = self.tensors["token_embd.weight"].shape[0]
        hp = LlamaHParams(
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=int(f.metadata[a + "block_count"]),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k,
            head_dim_v=head_dim_v,
            n_ff=int(f.metadata[a + "feed_forward_length"]),
            n_rot=int(f.get(a + "rope.dimension_count", head_dim_k)),
            rms_eps=float(f.get(a + "attention.layer_norm_rms_epsilon", 1e-5)),
            freq_base=float(f.get(a + "rope.freq_base", 10000.0)),
            n_ctx_train=int(f.get(a + "context_length", 0)),
        )
        hp.n_ctx_orig = int(f.get(a + "rope.scaling.original_context_length", hp.n_ctx_train))
        scaling = f.get(a + "rope.scaling.type", "none")
        factor = float(f.get(a + "rope.scaling.factor", 0.0) or 0.0)
        if scaling == "none" and f.get(a + "rope.scale_linear") is not None:  # legacy key
            scaling, factor = "linear", float(f.get(a + "rope.scale_linear"))
        if scaling in ("linear", "yarn") and factor > 0.0:
            hp.freq_scale = 1.0 / factor
        if scaling == "yarn":
            hp.ext_factor = 1.0
            hp.beta_fast = float(f.get(a + "rope.scaling.yarn_beta_fast", 32.0))
            hp.beta_slow = float(f.get(a + "rope.scaling.yarn_beta_slow", 1.0))
        elif scaling not in ("none", "linear"):
            raise NotImplementedError(f"rope scaling type {scaling!r}")
        return hp

    def w(self, name: str) -> np.ndarray | None:
        return self.tensors.get(name)

    @property
    def output(self) -> np.ndarray:
        out = self.w("output.weight")
        return out if out is not None else self.tensors["token_embd.weight"]

    def rope_kwargs(self) -> dict:
        hp = self.hp
        return dict(freq_base=hp.freq_base, freq_scale=hp.freq_scale, ext_factor=hp.ext_factor,
                    attn_factor=hp.attn_factor, beta_fast=hp.beta_fast, beta_slow=hp.beta_slow,
                    n_ctx_orig=hp.n_ctx_orig, freq_factors=self.w("rope_freqs.weight"))


def attention_block(model: LlamaModel, il: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Self-attention of layer il over the whole sequence x[T, n_embd] (causal); returns a[T, n_embd]."""
    hp, p = model.hp, f"blk.{il}."
    T = x.shape[0]
    h = rms_norm(x, model.w(p + "attn_norm.weight"), hp.rms_eps)                     # [T, n_embd]
    q = linear(h, model.w(p + "attn_q.weight"), model.w(p + "attn_q.bias"))         # [T, n_head*dk]
    k = linear(h, model.w(p + "attn_k.weight"), model.w(p + "attn_k.bias"))         # [T, n_head_kv*dk]
    v = linear(h, model.w(p + "attn_v.weight"), model.w(p + "attn_v.bias"))         # [T, n_head_kv*dv]
    q = q.reshape(T, hp.n_head, hp.head_dim_k)
    k = k.reshape(T, hp.n_head_kv, hp.head_dim_k)
    v = v.reshape(T, hp.n_head_kv, hp.head_dim_v)
    rk = model.rope_kwargs()
    q = rope(q, positions, hp.n_rot, ROPE_NORM, **rk)
    k = rope(k, positions, hp.n_rot, ROPE_NORM, **rk)
    mask = causal_mask(T, T, q_pos=positions, kv_pos=positions)                     # [T, T]
    a = attention(q, k, v, 1.0 / math.sqrt(hp.head_dim_k), mask)                    # [T, n_head, dv]
    return linear(a.reshape(T, hp.n_head * hp.head_dim_v), model.w(p + "attn_output.weight"),
                  model.w(p + "attn_output.bias"))


def ffn_block(model: LlamaModel, il: int, x: np.ndarray) -> np.ndarray:
    """SwiGLU feed-forward of layer il: down(silu(gate h) * up h) with h = rms_norm(x) * ffn_norm."""
    hp, p = model.hp, f"blk.{il}."
    h = rms_norm(x, model.w(p + "ffn_norm.weight"), hp.rms_eps)
    g = linear(h, model.w(p + "ffn_gate.weight"))                                   # [T, n_ff]
    u = linear(h, model.w(p + "ffn_up.weight"))                                     # [T, n_ff]
    return linear(swiglu(g, u), model.w(p + "ffn_down.weight"))                    # [T, n_embd]


def hidden_states(model: LlamaModel, tokens, positions=None) -> np.ndarray:
    """Final hidden states (before output_norm) [T, n_embd]."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or len(tokens) == 0:
        raise ValueError("tokens must be a non-empty 1-D sequence")
    if tokens.min() < 0 or tokens.max() >= model.hp.n_vocab:
        raise ValueError(f"token id out of range [0, {model.hp.n_vocab})")
    positions = np.arange(len(tokens)) if positions is None else np.asarray(positions)
    x = model.tensors["token_embd.weight"][tokens]                                  # [T, n_embd]
    for il in range(model.hp.n_layer):
        x = x + attention_block(model, il, x, positions)
        x = x + ffn_block(model, il, x)
    return x


def forward(model: LlamaModel, tokens, positions=None) -> np.ndarray:
    """logits[n_tokens, n_vocab] (float64) for every position of one causal sequence."""
    x = hidden_states(model, tokens, positions)
    x = rms_norm(x, model.w("output_norm.weight"), model.hp.rms_eps)
    return linear(x, model.output)


def next_token_logprobs(model: LlamaModel, tokens) -> np.ndarray:
    """log p(tokens[i+1] | tokens[0..i]) for i = 0..n-2 (n-1 values), for perplexity cross-checks."""
    return token_logprobs(forward(model, tokens), tokens)


def perplexity_chunks(model: LlamaModel, tokens, n_ctx: int, n_chunks: int | None = None,
                      bos: int | None = 1) -> tuple[float, np.ndarray]:
    """Perplexity as llama.cpp's `perplexity` tool computes it: the token stream is cut into chunks of
    n_ctx tokens, the first token of each chunk is replaced by BOS (when bos is not None), and only the
    second half of each chunk is scored (predictions of tokens n_ctx/2+1 .. n_ctx-1).
    Returns (ppl, nll per scored token)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    total = len(tokens) // n_ctx
    n_chunks = total if n_chunks is None else min(n_chunks, total)
    first = n_ctx // 2
    nll = []
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx].copy()
        if bos is not None:
            chunk[0] = bos
        lp = next_token_logprobs(model, chunk)         # lp[j] = log p(chunk[j+1] | chunk[..j])
        nll.append(-lp[first:])
    nll = np.concatenate(nll) if nll else np.zeros(0)
    return float(np.exp(nll.mean())) if len(nll) else float("nan"), nll


def greedy(model: LlamaModel, tokens, n: int) -> list[int]:
    """n greedy (argmax) continuation ids; re-runs the whole sequence each step (no KV cache)."""
    seq = [int(t) for t in tokens]
    out = []
    for _ in range(n):
        nxt = int(np.argmax(forward(model, seq)[-1]))
        out.append(nxt)
        seq.append(nxt)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file (architecture llama)")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids, e.g. 1,403,407")
    ap.add_argument("--out", help="save logits (float64) to this .npy file")
    ap.add_argument("--all-positions", action="store_true",
                    help="--out saves logits of every position [n_tokens, n_vocab] (default: last only)")
    ap.add_argument("--greedy", type=int, default=0, metavar="N",
                    help="print N greedy continuation ids")
    args = ap.parse_args(argv)

    tokens = [int(t) for t in args.tokens.replace(" ", "").split(",") if t != ""]
    model = LlamaModel(args.model)
    logits = forward(model, tokens)
    if args.out:
        np.save(args.out, logits if args.all_positions else logits[-1:])
    top = np.argsort(-logits[-1])[:5]
    print("last-position top-5: " + ", ".join(f"{int(t)}:{logits[-1, t]:.6f}" for t in top), file=sys.stderr)
    if args.greedy > 0:
        print(",".join(str(t) for t in greedy(model, tokens, args.greedy)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
