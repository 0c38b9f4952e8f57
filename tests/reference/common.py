"""Shared float64 building blocks of the numpy reference models, written as ggml computes them.

Conventions: activations are numpy arrays with tokens first, e.g. x[n_tokens, n_embd]; a weight is in
numpy shape (n_out, n_in) (GGUF dims [n_in, n_out]), so a projection is `x @ W.T` (see `linear`).
"""

from __future__ import annotations

import math

import numpy as np

ROPE_NORM = 0  # ggml's default layout: rotate ADJACENT pairs (x[2i], x[2i+1])
ROPE_NEOX = 2  # GPT-NeoX layout: rotate pairs (x[i], x[i + n_rot/2])


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """y = x W^T (+ b); w in numpy shape (n_out, n_in)."""
    y = x @ w.T
    return y if b is None else y + b


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis, times weight (if given)."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def layer_norm(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float) -> np.ndarray:
    mu = np.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    y = xc / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return silu(gate) * up


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), without overflow for large x."""
    return np.logaddexp(0.0, x)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax that tolerates -inf entries (masked positions); a row that is all -inf gives zeros."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


# --------------------------------------------------------------------------------------------------
# RoPE, as ggml's rope op (ggml_rope_ext) with its YaRN extension
# --------------------------------------------------------------------------------------------------

def rope_yarn_corr_dim(n_rot: int, n_ctx_orig: int, n_rotations: float, base: float) -> float:
    """The rotary dimension index at which a frequency completes n_rotations over n_ctx_orig positions."""
    return n_rot * math.log(n_ctx_orig / (n_rotations * 2.0 * math.pi)) / (2.0 * math.log(base))


def rope_yarn_corr_dims(n_rot: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: [low, high] dimension range of the YaRN ramp."""
    start = math.floor(rope_yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, freq_base))
    end = math.ceil(rope_yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, freq_base))
    return max(0.0, float(start)), min(float(n_rot - 1), float(end))


def rope_yarn_ramp(low: float, high: float, i0: np.ndarray) -> np.ndarray:
    """1 for dims below `low` (pure extrapolation), 0 above `high` (pure interpolation), linear between.
    i0 is the even index 2i of the pair."""
    y = (i0 / 2.0 - low) / max(0.001, high - low)
    return 1.0 - np.minimum(1.0, np.maximum(0.0, y))


def rope_cos_sin(positions: np.ndarray, n_rot: int, freq_base: float = 10000.0, freq_scale: float = 1.0,
                 ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
                 beta_slow: float = 1.0, n_ctx_orig: int = 0,
                 freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [n_tokens, n_rot/2] of each rotated pair, as ggml's rope cache:

        theta_extrap = pos * freq_base^(-2i/n_rot) / freq_factors[i]
        theta_interp = freq_scale * theta_extrap
        ext_factor == 0: theta = theta_interp, mscale = attn_factor
        else:           ramp = rope_yarn_ramp(corr_dims, 2i) * ext_factor
                        theta = theta_interp * (1 - ramp) + theta_extrap * ramp
                        mscale = attn_factor * (1 + 0.1 ln(1/freq_scale))
        cos = cos(theta) * mscale, sin = sin(theta) * mscale
    """
    if n_rot % 2:
        raise ValueError(f"n_rot {n_rot} must be even")
    i0 = np.arange(0, n_rot, 2, dtype=np.float64)                  # 2i
    inv_freq = float(freq_base) ** (-i0 / n_rot)                     # base^(-2i/n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)[: n_rot // 2]
    theta_extrap = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    theta_interp = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor != 0.0:
        low, high = rope_yarn_corr_dims(n_rot, n_ctx_orig, freq_base, beta_fast, beta_slow)
        ramp_mix = rope_yarn_ramp(low, high, i0)[None, :] * ext_factor
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    else:
        theta = theta_interp
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def rope(x: np.ndarray, positions: np.ndarray, n_rot: int, mode: int = ROPE_NORM, **kw) -> np.ndarray:
    """Rotate the first n_rot features of each head; x[n_tokens, n_head, head_dim] (or [n_tokens, head_dim]).

    mode ROPE_NORM rotates adjacent pairs (x[2i], x[2i+1]); ROPE_NEOX rotates (x[i], x[i + n_rot/2]).
    Pair i turns by theta_i (see rope_cos_sin; keyword arguments are passed on):
        x0' = x0 cos - x1 sin,  x1' = x0 sin + x1 cos.
    Features n_rot.. are passed through unchanged.
    """
    cos, sin = rope_cos_sin(positions, n_rot, **kw)                  # [T, n_rot/2]
    squeeze = x.ndim == 2
    if squeeze:
        x = x[:, None, :]
    cos, sin = cos[:, None, :], sin[:, None, :]                      # broadcast over heads
    out = np.array(x, dtype=np.float64, copy=True)
    if mode == ROPE_NORM:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    elif mode == ROPE_NEOX:
        h = n_rot // 2
        x0, x1 = x[..., :h], x[..., h:n_rot]
        out[..., :h] = x0 * cos - x1 * sin
        out[..., h:n_rot] = x0 * sin + x1 * cos
    else:
        raise ValueError(f"unsupported rope mode {mode}")
    return out[:, 0, :] if squeeze else out


# --------------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------------

def causal_mask(n_q: int, n_kv: int | None = None, q_pos: np.ndarray | None = None,
                kv_pos: np.ndarray | None = None) -> np.ndarray:
    """[n_q, n_kv] additive mask: 0 where kv_pos <= q_pos, -inf elsewhere. By default the queries are the
    last n_q of n_kv consecutive positions."""
    if n_kv is None:
        n_kv = n_q
    if q_pos is None:
        q_pos = np.arange(n_kv - n_q, n_kv)
    if kv_pos is None:
        kv_pos = np.arange(n_kv)
    return np.where(np.asarray(kv_pos)[None, :] <= np.asarray(q_pos)[:, None], 0.0, -np.inf)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray | None = None,
              return_probs: bool = False):
    """Multi-head attention with grouped KV heads.

    q[n_q, n_head, d_k], k[n_kv, n_head_kv, d_k], v[n_kv, n_head_kv, d_v]; query head h reads KV head
    h // (n_head / n_head_kv) (ggml's broadcast). mask: additive [n_q, n_kv] (e.g. causal_mask).
    Returns out[n_q, n_head, d_v] (and probs[n_head, n_q, n_kv] if asked).
    """
    n_head, n_head_kv = q.shape[1], k.shape[1]
    if n_head % n_head_kv:
        raise ValueError(f"n_head {n_head} is not a multiple of n_head_kv {n_head_kv}")
    group = n_head // n_head_kv
    kh = np.repeat(k.transpose(1, 0, 2), group, axis=0)              # [n_head, n_kv, d_k]
    vh = np.repeat(v.transpose(1, 0, 2), group, axis=0)              # [n_head, n_kv, d_v]
    scores = np.matmul(q.transpose(1, 0, 2), kh.transpose(0, 2, 1)) * scale   # [n_head, n_q, n_kv]
    if mask is not None:
        scores = scores + mask[None, :, :]
    probs = softmax(scores, axis=-1)
    out = np.matmul(probs, vh).transpose(1, 0, 2)                    # [n_q, n_head, d_v]
    return (out, probs) if return_probs else out


def token_logprobs(logits: np.ndarray, tokens) -> np.ndarray:
    """log p(tokens[i+1] | tokens[..i]) for i in 0..n-2, from logits[n, n_vocab] of the same sequence."""
    tokens = np.asarray(tokens)
    lp = log_softmax(np.asarray(logits[:-1], dtype=np.float64), axis=-1)
    return lp[np.arange(len(tokens) - 1), tokens[1:]]
