#!/usr/bin/python3
"""float64 reference forward pass of the GGUF architectures `deepseek32` (DeepSeek-V3.2, DSA) and
`glm-dsa` (GLM-5.x, DSA with IndexShare), as llama.cpp runs them (docs: shared/docs/MODELS.md §1-3).

Per layer il < n_layer = block_count - nextn_predict_layers (the trailing MTP/NextN blocks are skipped):

    h   = rms_norm(x) * attn_norm
    qr  = rms_norm(attn_q_a h) * attn_q_a_norm                      q latent [T, q_lora_rank]
  lightning indexer (full layers; glm-dsa "shared" layers reuse the last full layer's selection):
    qI  = indexer.attn_q_b qr   -> [T, H, D], per head [rope n_rot | nope]   (rope part FIRST)
    kI  = layer_norm(indexer.attn_k h) * k_norm.weight + k_norm.bias   (eps 1e-6) -> [T, D] (one head)
    RoPE on the first n_rot dims of qI and kI: half-split (NEOX) for deepseek32, adjacent pairs (NORM)
        for glm-dsa; same base / scale / YaRN parameters as the MLA RoPE
    w   = indexer.proj h / sqrt(D * H)                              [T, H]
    I[t, s] = sum_h w[t, h] * relu(qI[t, h] . kI[s])   for s <= t (causal)
    selection of query t = the min(top_k, t + 1) keys of largest I[t, :]; ties go to the LOWER position.
    When no query sees more than top_k keys (T <= top_k) nothing is selected: attention is dense.
  MLA (absorbed form; identical to the naive form with attn_k_b / attn_v_b expanded, see naive=True):
    q      = attn_q_b qr -> [T, n_head, nope | rope]
    kv     = attn_kv_a_mqa h = [c_kv (kv_lora_rank) | k_pe (n_rot)];  c = rms_norm(c_kv) * attn_kv_a_norm
    q_pe, k_pe: RoPE with adjacent pairs (NORM) and YaRN
    q'_h   = W_UK_h q_nope_h  (attn_k_b, numpy [n_head, kv_lora, nope])
    s[h,t,u] = (q'_h[t] . c[u] + q_pe_h[t] . k_pe[u]) * kq_scale  (+0 on selected/visible keys, -inf else)
    o_h    = W_UV_h (softmax(s) c)  (attn_v_b, numpy [n_head, v_head, kv_lora]);  x += attn_output o
  FFN:
    h = rms_norm(x) * ffn_norm;  il < leading_dense_block_count: SwiGLU ffn_{gate,up,down}
    else MoE (llama.cpp build_moe_ffn): router ffn_gate_inp, gating func (1 softmax, 2 sigmoid,
    3 softmax over the chosen, 4 sqrt(softplus)), exp_probs_b.bias for the choice only, group-limited
    routing (group score = sum of its two best biased scores), top expert_used_count, weights
    normalised (expert_weights_norm) and scaled (expert_weights_scale if not 0 or 1), SwiGLU experts
    ffn_{gate,up,down}_exps + shared expert ffn_{gate,up,down}_shexp.
logits = output (or tied token_embd) rms_norm(x) * output_norm.

Scales, following llama.cpp (src/models/deepseek32.cpp [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX] and
llama-context.cpp's yarn_attn_factor): with factor f = 1/freq_scale, get_mscale(s, m) = 1 + 0.1 m ln s:
    yarn_attn_factor = get_mscale(f, 1) / get_mscale(f, log_mul)   (YaRN and log_mul != 0)
                     = get_mscale(f, 1)                            (YaRN, no log_mul)
                     times 1 / (1 + 0.1 ln f) (YaRN only), times rope.scaling.attn_factor (default 1)
    RoPE magnitude   = yarn_attn_factor * (1 + 0.1 ln f) with YaRN (= 1 for DeepSeek files), else
                       yarn_attn_factor
    mscale           = yarn_attn_factor * (1 + 0.1 ln f) * (1 + 0.1 log_mul ln f)
    kq_scale         = mscale^2 / sqrt(key_length_mla)
where log_mul = rope.scaling.yarn_log_multiplier / 0.1 for deepseek32 (the converter stores 0.1 *
mscale_all_dim); glm-dsa does not read that key (log_mul = 0). deepseek32/glm-dsa do not read the
yarn beta keys: beta_fast 32, beta_slow 1. The indexer's own scale (1/sqrt(D*H)) is unchanged.
No Hadamard rotation and no fp8 simulation: exact arithmetic (the rotation is orthonormal: a no-op).

CLI:
    /usr/bin/python3 tests/reference/dsa_ref.py --model F.gguf --tokens-file ids.txt [--top-k N] \
        [--dense] --out logits.npy [--selection-out sel.json] [--selection-last 16]
writes the last position's logits (float64, shape [n_vocab]) and, per layer, the selected key
positions of the last 16 queries as JSON:
    {"arch", "n_tokens", "top_k", "dsa", "layers": [{"layer": il, "indexer": "full"|"shared",
     "dense": bool, "queries": [{"pos": p, "keys": [...]}, ...]}, ...]}
("dense": true means no selection was made, keys are then every visible position 0..p).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (ROPE_NEOX, ROPE_NORM, layer_norm, linear, rms_norm, rope, sigmoid,  # noqa: E402
                    softmax, softplus, swiglu)
from gguf import GGUFReader  # noqa: E402

ARCHS = ("deepseek32", "glm-dsa")

GATING_SOFTMAX = 1
GATING_SIGMOID = 2
GATING_SOFTMAX_WEIGHT = 3
GATING_SQRT_SOFTPLUS = 4

INDEXER_NORM_EPS = 1e-6           # LayerNorm eps of indexer.k_norm (llama.cpp deepseek32; HF GLM)
GLM_DSA_LONG_CONTEXT = 1048576    # glm-dsa without indexer.types: GLM-5.2 pattern at/above this n_ctx_train
MOE_WEIGHT_SUM_MIN = 6.103515625e-5  # build_moe_ffn clamps the weight sum (smallest normal f16)


QUERY_BLOCK = 256                 # queries per block in the attention / indexer (memory ~ block x T)


def _blocks(n: int, size: int):
    """[a, b) ranges covering 0..n in steps of size."""
    return [(a, min(n, a + size)) for a in range(0, n, max(1, size))]


class DsaModelError(ValueError):
    """A file that the reference refuses (missing/inconsistent metadata or tensors)."""


def glm52_default_indexer_full(n_layer: int) -> list[bool]:
    """llama.cpp's GLM_5_2_DEFAULT_INDEXER_TYPES: full at layers 0, 1, 2, 6, 10, ... (il < 2 or
    (il - 2) % 4 == 0, i.e. il <= 1 or il % 4 == 2), shared elsewhere."""
    return [il < 2 or (il - 2) % 4 == 0 for il in range(n_layer)]


@dataclass
class DsaHParams:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer_all: int          # block_count (includes the MTP/NextN blocks)
    n_nextn: int              # nextn_predict_layers
    n_head: int
    q_lora_rank: int
    kv_lora_rank: int
    head_k: int               # key_length_mla = nope + rope
    head_v: int               # value_length_mla
    n_rot: int                # rope.dimension_count (MLA and indexer rope dims)
    rms_eps: float
    n_ff: int                 # dense FFN width (leading dense layers)
    n_ff_exp: int
    n_expert: int
    n_expert_used: int
    n_expert_shared: int
    n_expert_groups: int
    n_group_used: int
    n_dense_lead: int
    expert_weights_scale: float
    expert_weights_norm: bool
    gating: int
    idx_n_head: int
    idx_head_dim: int
    idx_top_k: int
    idx_full: list = field(default_factory=list)   # per effective layer: True = full, False = shared
    n_ctx_train: int = 0
    # RoPE / YaRN (see the module docstring)
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    rope_attn_factor: float = 1.0     # ggml rope attn_factor (cparams.yarn_attn_factor)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0
    yarn_log_mul: float = 0.0
    kq_scale: float = 0.0
    norm_eps: float = INDEXER_NORM_EPS

    @property
    def n_layer(self) -> int:
        """Layers the forward pass runs (the MTP/NextN blocks at the end are skipped)."""
        return self.n_layer_all - self.n_nextn

    @property
    def head_nope(self) -> int:
        return self.head_k - self.n_rot

    @property
    def idx_rope_mode(self) -> int:
        return ROPE_NEOX if self.arch == "deepseek32" else ROPE_NORM


def _scalar_or_layer(v, name: str):
    """get_key_or_arr: a scalar, or a per-layer array that must be uniform here."""
    if isinstance(v, list):
        if not v or any(e != v[0] for e in v):
            raise NotImplementedError(f"{name}: per-layer values {v!r} are not supported")
        return v[0]
    return v


class DsaModel:
    """Weights (float64, numpy shapes) and hyper-parameters of a GGUF deepseek32 / glm-dsa model."""

    def __init__(self, path: str):
        self.path = path
        self.gguf = f = GGUFReader(path)
        arch = f.get("general.architecture")
        if arch not in ARCHS:
            raise DsaModelError(f"{path}: architecture {arch!r} is not one of {ARCHS}")
        self.arch = arch
        self.tensors = {name: f.tensor(name) for name in f.tensors}
        self.hp = self._hparams()
        self._check_tensors()

    # -- metadata ----------------------------------------------------------------------------------
    def _key(self, name: str, default=None, required: bool = False):
        k = f"{self.arch}.{name}"
        v = self.gguf.get(k)
        if v is None:
            if required:
                raise DsaModelError(f"{self.path}: missing metadata key {k!r}")
            return default
        return v

    def _hparams(self) -> DsaHParams:
        a, key = self.arch, self._key
        if "token_embd.weight" not in self.tensors:
            raise DsaModelError(f"{self.path}: missing tensor 'token_embd.weight'")
        n_vocab, n_embd_t = self.tensors["token_embd.weight"].shape
        n_embd = int(key("embedding_length", required=True))
        if n_embd != n_embd_t:
            raise DsaModelError(f"{self.path}: token_embd width {n_embd_t} != embedding_length {n_embd}")
        vs = key("vocab_size")
        if vs is not None and int(vs) != n_vocab:
            raise DsaModelError(f"{self.path}: vocab_size {vs} != token_embd rows {n_vocab}")
        n_layer_all = int(key("block_count", required=True))
        n_nextn = int(key("nextn_predict_layers", 0))
        if not 0 <= n_nextn < n_layer_all:
            raise DsaModelError(f"{self.path}: nextn_predict_layers {n_nextn} must be < block_count {n_layer_all}")
        head_k = key("attention.key_length_mla")
        head_v = key("attention.value_length_mla")
        if head_k is None or head_v is None:
            raise DsaModelError(f"{self.path}: {a} requires MLA (attention.key_length_mla / value_length_mla)")
        n_head_kv = key("attention.head_count_kv")
        if n_head_kv is not None and int(_scalar_or_layer(n_head_kv, "head_count_kv")) != 1:
            # the converter writes 1 (MLA runs as MQA); any other value is a different layout
            raise DsaModelError(f"{self.path}: attention.head_count_kv must be 1 for MLA, got {n_head_kv}")
        gating = int(key("expert_gating_func", 0))
        if a == "deepseek32" and key("expert_gating_func") is None:
            raise DsaModelError(f"{self.path}: missing metadata key '{a}.expert_gating_func'")
        if a == "glm-dsa" and gating == 0:
            gating = GATING_SIGMOID                  # llama.cpp glm-dsa: NONE -> sigmoid
        hp = DsaHParams(
            arch=a,
            n_vocab=int(n_vocab),
            n_embd=n_embd,
            n_layer_all=n_layer_all,
            n_nextn=n_nextn,
            n_head=int(_scalar_or_layer(key("attention.head_count", required=True), "head_count")),
            q_lora_rank=int(key("attention.q_lora_rank", required=True)),
            kv_lora_rank=int(key("attention.kv_lora_rank", required=True)),
            head_k=int(head_k),
            head_v=int(head_v),
            n_rot=int(key("rope.dimension_count", required=True)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon", required=True)),
            n_ff=int(_scalar_or_layer(key("feed_forward_length", 0), "feed_forward_length")),
            n_ff_exp=int(key("expert_feed_forward_length", required=True)),
            n_expert=int(key("expert_count", 0)),
            n_expert_used=int(key("expert_used_count", 0)),
            n_expert_shared=int(key("expert_shared_count", required=True)),
            n_expert_groups=int(key("expert_group_count", 0)),
            n_group_used=int(key("expert_group_used_count", 0)),
            n_dense_lead=int(key("leading_dense_block_count", 0)),
            expert_weights_scale=float(key("expert_weights_scale", 0.0)),
            expert_weights_norm=bool(key("expert_weights_norm", False)),
            gating=gating,
            idx_n_head=int(key("attention.indexer.head_count", required=True)),
            idx_head_dim=int(key("attention.indexer.key_length", required=True)),
            idx_top_k=int(key("attention.indexer.top_k", required=True)),
            n_ctx_train=int(key("context_length", 0)),
        )
        if hp.n_rot % 2 or hp.n_rot > hp.head_k or hp.n_rot > hp.idx_head_dim:
            raise DsaModelError(f"{self.path}: rope.dimension_count {hp.n_rot} does not fit the heads")
        if hp.gating not in (GATING_SOFTMAX, GATING_SIGMOID, GATING_SOFTMAX_WEIGHT, GATING_SQRT_SOFTPLUS):
            raise DsaModelError(f"{self.path}: expert_gating_func {hp.gating} is not supported")
        if hp.n_expert_groups > 1:
            if hp.n_expert % hp.n_expert_groups or not 0 < hp.n_group_used <= hp.n_expert_groups:
                raise DsaModelError(f"{self.path}: bad expert groups {hp.n_expert_groups}/{hp.n_group_used}")
            if hp.n_expert // hp.n_expert_groups < 2:
                raise DsaModelError(f"{self.path}: group-limited routing needs >= 2 experts per group")
        if hp.n_dense_lead < hp.n_layer and not 0 < hp.n_expert_used <= hp.n_expert:
            raise DsaModelError(f"{self.path}: MoE layers need 0 < expert_used_count <= expert_count")

        # IndexShare (glm-dsa only; deepseek32 runs its indexer on every layer)
        if a == "glm-dsa":
            types = key("attention.indexer.types")
            if types is None:
                full = ([True] * hp.n_layer if hp.n_ctx_train < GLM_DSA_LONG_CONTEXT
                        else glm52_default_indexer_full(hp.n_layer))
            elif isinstance(types, list):
                if len(types) not in (hp.n_layer, hp.n_layer_all):
                    raise DsaModelError(f"{self.path}: attention.indexer.types has {len(types)} entries, "
                                        f"expected {hp.n_layer} (or block_count {hp.n_layer_all})")
                full = [bool(t) for t in types[:hp.n_layer]]
            else:
                full = [bool(types)] * hp.n_layer
        else:
            full = [True] * hp.n_layer
        if hp.n_layer > 0 and not full[0]:
            raise DsaModelError(f"{self.path}: layer 0 is a shared indexer layer: there is no earlier "
                                f"selection to reuse")
        hp.idx_full = full

        # RoPE / YaRN, as llama.cpp derives them (llama-model.cpp load_hparams, llama-context.cpp)
        hp.freq_base = float(key("rope.freq_base", 10000.0))
        scaling = key("rope.scaling.type", "linear")
        factor = key("rope.scaling.factor")
        if factor is None:
            factor = key("rope.scale_linear", 0.0)
        factor = float(factor or 0.0)
        hp.freq_scale = 1.0 if factor == 0.0 else 1.0 / factor
        if scaling == "none":
            hp.freq_scale = 1.0
        elif scaling not in ("linear", "yarn"):
            raise NotImplementedError(f"rope scaling type {scaling!r}")
        hp.ext_factor = 1.0 if scaling == "yarn" else 0.0
        hp.n_ctx_orig = int(key("rope.scaling.original_context_length", hp.n_ctx_train))
        if hp.ext_factor != 0.0 and hp.n_ctx_orig <= 0:
            raise DsaModelError(f"{self.path}: YaRN needs rope.scaling.original_context_length or context_length")
        if a == "deepseek32":
            # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: llama.cpp divides the stored value by 0.1f (in float32, so
            # the usual stored 0.1f reads back as exactly 1)
            hp.yarn_log_mul = float(key("rope.scaling.yarn_log_multiplier", 0.0)) / float(np.float32(0.1))
        rope_attn_factor_key = float(key("rope.scaling.attn_factor", 1.0))

        def get_mscale(scale: float, m: float) -> float:
            return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0

        yaf = 1.0
        if hp.ext_factor != 0.0:
            f_ = 1.0 / hp.freq_scale
            if hp.yarn_log_mul != 0.0:
                yaf = get_mscale(f_, 1.0) / get_mscale(f_, hp.yarn_log_mul)
            else:
                yaf = get_mscale(f_, 1.0)
            yaf *= 1.0 / (1.0 + 0.1 * math.log(f_))
        yaf *= rope_attn_factor_key
        hp.rope_attn_factor = yaf
        attn_factor_org = yaf * (1.0 + 0.1 * math.log(1.0 / hp.freq_scale))
        mscale = attn_factor_org * (1.0 + 0.1 * hp.yarn_log_mul * math.log(1.0 / hp.freq_scale))
        hp.kq_scale = mscale * mscale / math.sqrt(hp.head_k)
        return hp

    def _check_tensors(self) -> None:
        hp = self.hp
        miss = []

        def need(name):
            if name not in self.tensors:
                miss.append(name)

        need("output_norm.weight")
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            for n in ("attn_norm", "attn_q_a_norm", "attn_kv_a_norm", "attn_q_a", "attn_q_b",
                      "attn_kv_a_mqa", "attn_output", "ffn_norm"):
                need(p + n + ".weight")
            if (p + "attn_k_b.weight" not in self.tensors or p + "attn_v_b.weight" not in self.tensors) \
                    and p + "attn_kv_b.weight" not in self.tensors:
                miss.append(p + "attn_k_b.weight / attn_v_b.weight")
            if il < hp.n_dense_lead:
                for n in ("ffn_gate", "ffn_up", "ffn_down"):
                    need(p + n + ".weight")
            else:
                for n in ("ffn_gate_inp", "ffn_down_exps"):
                    need(p + n + ".weight")
                if p + "ffn_gate_up_exps.weight" not in self.tensors:  # llama.cpp's fused form, else both
                    need(p + "ffn_gate_exps.weight")
                    need(p + "ffn_up_exps.weight")
            idx = [p + n for n in ("indexer.attn_q_b.weight", "indexer.attn_k.weight",
                                   "indexer.k_norm.weight", "indexer.k_norm.bias", "indexer.proj.weight")]
            if hp.idx_full[il]:
                absent = [n for n in idx if n not in self.tensors]
                if absent:
                    raise DsaModelError(f"{self.path}: layer {il} is a full indexer layer but lacks "
                                        f"{', '.join(absent)}")
        if miss:
            raise DsaModelError(f"{self.path}: missing tensors: {', '.join(miss[:8])}"
                                + (" ..." if len(miss) > 8 else ""))
        # shapes of the parts whose layout matters most
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            self._expect(p + "attn_q_a.weight", (hp.q_lora_rank, hp.n_embd))
            self._expect(p + "attn_q_b.weight", (hp.n_head * hp.head_k, hp.q_lora_rank))
            self._expect(p + "attn_kv_a_mqa.weight", (hp.kv_lora_rank + hp.n_rot, hp.n_embd))
            self._expect(p + "attn_output.weight", (hp.n_embd, hp.n_head * hp.head_v))
            if p + "attn_k_b.weight" in self.tensors:
                self._expect(p + "attn_k_b.weight", (hp.n_head, hp.kv_lora_rank, hp.head_nope))
                self._expect(p + "attn_v_b.weight", (hp.n_head, hp.head_v, hp.kv_lora_rank))
            if hp.idx_full[il]:
                self._expect(p + "indexer.attn_q_b.weight", (hp.idx_n_head * hp.idx_head_dim, hp.q_lora_rank))
                self._expect(p + "indexer.attn_k.weight", (hp.idx_head_dim, hp.n_embd))
                self._expect(p + "indexer.proj.weight", (hp.idx_n_head, hp.n_embd))
            if il >= hp.n_dense_lead:
                self._expect(p + "ffn_gate_inp.weight", (hp.n_expert, hp.n_embd))
                if p + "ffn_gate_up_exps.weight" in self.tensors:
                    self._expect(p + "ffn_gate_up_exps.weight", (hp.n_expert, 2 * hp.n_ff_exp, hp.n_embd))
                else:
                    self._expect(p + "ffn_gate_exps.weight", (hp.n_expert, hp.n_ff_exp, hp.n_embd))
                    self._expect(p + "ffn_up_exps.weight", (hp.n_expert, hp.n_ff_exp, hp.n_embd))
                self._expect(p + "ffn_down_exps.weight", (hp.n_expert, hp.n_embd, hp.n_ff_exp))

    def _expect(self, name: str, shape: tuple) -> None:
        got = self.tensors[name].shape
        if tuple(got) != tuple(shape):
            raise DsaModelError(f"{self.path}: {name} has numpy shape {got} (GGUF dims {tuple(reversed(got))}), "
                                f"expected {shape}")

    # -- accessors ---------------------------------------------------------------------------------
    def w(self, name: str) -> np.ndarray | None:
        return self.tensors.get(name)

    @property
    def output(self) -> np.ndarray:
        out = self.w("output.weight")
        return out if out is not None else self.tensors["token_embd.weight"]

    def rope_kwargs(self) -> dict:
        hp = self.hp
        return dict(freq_base=hp.freq_base, freq_scale=hp.freq_scale, ext_factor=hp.ext_factor,
                    attn_factor=hp.rope_attn_factor, beta_fast=hp.beta_fast, beta_slow=hp.beta_slow,
                    n_ctx_orig=hp.n_ctx_orig)

    def kv_b(self, il: int) -> tuple[np.ndarray, np.ndarray]:
        """(W_UK [n_head, kv_lora, nope], W_UV [n_head, v_head, kv_lora]) of layer il, from the split
        attn_k_b / attn_v_b or, in legacy files, from the unsplit attn_kv_b (rows per head: nope then v)."""
        hp, p = self.hp, f"blk.{il}."
        kb, vb = self.w(p + "attn_k_b.weight"), self.w(p + "attn_v_b.weight")
        if kb is not None and vb is not None:
            return kb, vb
        kvb = self.tensors[p + "attn_kv_b.weight"].reshape(hp.n_head, hp.head_nope + hp.head_v, hp.kv_lora_rank)
        return kvb[:, :hp.head_nope, :].transpose(0, 2, 1), kvb[:, hp.head_nope:, :]


# --------------------------------------------------------------------------------------------------
# Lightning indexer
# --------------------------------------------------------------------------------------------------

def indexer_qkw(model: DsaModel, il: int, h: np.ndarray, qr: np.ndarray, positions: np.ndarray):
    """Indexer queries q[T, H, D], keys k[T, D] (both roped) and head weights w[T, H] (already divided by
    sqrt(D*H)) of a full layer."""
    hp, p = model.hp, f"blk.{il}."
    T, H, D = h.shape[0], hp.idx_n_head, hp.idx_head_dim
    q = linear(qr, model.w(p + "indexer.attn_q_b.weight")).reshape(T, H, D)        # [T, H, rope | nope]
    k = linear(h, model.w(p + "indexer.attn_k.weight"))                             # [T, D]
    k = layer_norm(k, model.w(p + "indexer.k_norm.weight"), model.w(p + "indexer.k_norm.bias"), hp.norm_eps)
    rk = model.rope_kwargs()
    q = rope(q, positions, hp.n_rot, hp.idx_rope_mode, **rk)                        # rotates dims [0, n_rot)
    k = rope(k, positions, hp.n_rot, hp.idx_rope_mode, **rk)
    w = linear(h, model.w(p + "indexer.proj.weight")) / math.sqrt(D * H)            # [T, H]
    return q, k, w


def indexer_scores(q: np.ndarray, k: np.ndarray, w: np.ndarray, q_pos: np.ndarray,
                   k_pos: np.ndarray) -> np.ndarray:
    """I[t, s] = sum_h w[t, h] * relu(q[t, h] . k[s]) for k_pos[s] <= q_pos[t], -inf elsewhere."""
    dots = np.einsum("thd,sd->ths", q, k)                                           # [T, H, S]
    score = np.einsum("th,ths->ts", w, np.maximum(dots, 0.0))
    return np.where(np.asarray(k_pos)[None, :] <= np.asarray(q_pos)[:, None], score, -np.inf)


def select_top_k(score: np.ndarray, top_k: int) -> list[np.ndarray]:
    """Per query row, the min(top_k, #finite) keys of largest score, returned sorted ascending.
    Ties are broken by the lower key index (a stable sort of -score)."""
    out = []
    for row in score:
        visible = np.flatnonzero(np.isfinite(row))
        if len(visible) <= top_k:
            out.append(visible)
            continue
        order = np.argsort(-row[visible], kind="stable")                           # ties: lower index first
        out.append(np.sort(visible[order[:top_k]]))
    return out


def selection_mask(sel: list[np.ndarray], n_kv: int) -> np.ndarray:
    """Boolean [T, n_kv] mask of a selection."""
    m = np.zeros((len(sel), n_kv), dtype=bool)
    for t, s in enumerate(sel):
        m[t, s] = True
    return m


# --------------------------------------------------------------------------------------------------
# MLA attention
# --------------------------------------------------------------------------------------------------

def mla_attention(model: DsaModel, il: int, h: np.ndarray, qr: np.ndarray, positions: np.ndarray,
                  selected: np.ndarray | None = None, naive: bool = False,
                  return_probs: bool = False):
    """Multi-head latent attention of layer il over the whole sequence (causal). selected: optional
    boolean [T, T] mask of the keys each query may attend (a subset of the causal ones). naive=True
    expands k_nope / v per head from the latent (the MHA form) instead of absorbing attn_k_b into q and
    attn_v_b after the attention; both are the same function. Returns out[T, n_embd] (and probs)."""
    hp, p = model.hp, f"blk.{il}."
    T, nh, nope, r, L = h.shape[0], hp.n_head, hp.head_nope, hp.n_rot, hp.kv_lora_rank
    q = linear(qr, model.w(p + "attn_q_b.weight")).reshape(T, nh, hp.head_k)        # [T, nh, nope | rope]
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    kv = linear(h, model.w(p + "attn_kv_a_mqa.weight"))                             # [T, L + r]
    c = rms_norm(kv[:, :L], model.w(p + "attn_kv_a_norm.weight"), hp.rms_eps)      # [T, L]
    k_pe = kv[:, L:]                                                                # [T, r]
    rk = model.rope_kwargs()
    q_pe = rope(q_pe, positions, r, ROPE_NORM, **rk)                                # [T, nh, r]
    k_pe = rope(k_pe, positions, r, ROPE_NORM, **rk)                                # [T, r]
    w_uk, w_uv = model.kv_b(il)                                                     # [nh, L, nope], [nh, v, L]

    pos = np.asarray(positions)
    if naive:
        k_nope = np.einsum("hln,sl->shn", w_uk, c)                                  # [T, nh, nope]
        v = np.einsum("hvl,sl->shv", w_uv, c)                                       # [T, nh, v]
        k_full = np.concatenate([k_nope, np.broadcast_to(k_pe[:, None, :], (T, nh, r))], axis=-1)
        q_full = np.concatenate([q_nope, q_pe], axis=-1)
    else:
        q_abs = np.einsum("hln,thn->thl", w_uk, q_nope)                             # [T, nh, L]

    o = np.empty((T, nh, hp.head_v))
    all_probs = np.empty((nh, T, T)) if return_probs else None
    for a, b in _blocks(T, QUERY_BLOCK):                                            # bounded memory
        mask = np.where(pos[None, :] <= pos[a:b, None], 0.0, -np.inf)               # [B, T]
        if selected is not None:
            mask = np.where(selected[a:b], mask, -np.inf)
        if naive:
            scores = np.einsum("thd,shd->hts", q_full[a:b], k_full) * hp.kq_scale
            probs = softmax(scores + mask[None], axis=-1)                           # [nh, B, T]
            o[a:b] = np.einsum("hts,shv->thv", probs, v)
        else:
            scores = (np.einsum("thl,sl->hts", q_abs[a:b], c)
                      + np.einsum("thr,sr->hts", q_pe[a:b], k_pe)) * hp.kq_scale
            probs = softmax(scores + mask[None], axis=-1)                           # [nh, B, T]
            lat = np.einsum("hts,sl->thl", probs, c)                                # [B, nh, L]
            o[a:b] = np.einsum("hvl,thl->thv", w_uv, lat)                           # [B, nh, v]
        if return_probs:
            all_probs[:, a:b] = probs
    probs = all_probs
    out = linear(o.reshape(T, nh * hp.head_v), model.w(p + "attn_output.weight"))
    return (out, probs) if return_probs else out


# --------------------------------------------------------------------------------------------------
# Feed-forward
# --------------------------------------------------------------------------------------------------

def moe_route(model: DsaModel, il: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(experts [T, n_used] in choice order, weights [T, n_used]) as llama.cpp's build_moe_ffn."""
    hp, p = model.hp, f"blk.{il}."
    T, E = h.shape[0], hp.n_expert
    logits = linear(h, model.w(p + "ffn_gate_inp.weight"))                          # [T, E]
    if hp.gating == GATING_SOFTMAX:
        probs = softmax(logits, axis=-1)
    elif hp.gating == GATING_SIGMOID:
        probs = sigmoid(logits)
    elif hp.gating == GATING_SOFTMAX_WEIGHT:
        probs = logits
    else:
        probs = np.sqrt(softplus(logits))
    sel = probs
    bias = model.w(p + "exp_probs_b.bias")
    if bias is not None:
        sel = probs + bias                                                          # choice only
    if hp.n_expert_groups > 1:
        G = hp.n_expert_groups
        grp = sel.reshape(T, G, E // G)
        top2 = -np.sort(-grp, axis=-1)[..., :2].sum(axis=-1)                        # [T, G]
        keep = np.argsort(-top2, axis=-1, kind="stable")[:, :hp.n_group_used]
        gmask = np.zeros((T, G), dtype=bool)
        np.put_along_axis(gmask, keep, True, axis=-1)
        sel = np.where(np.repeat(gmask, E // G, axis=-1), sel, -np.inf)
    experts = np.argsort(-sel, axis=-1, kind="stable")[:, :hp.n_expert_used]       # [T, n_used]
    weights = np.take_along_axis(probs, experts, axis=-1)
    if hp.gating == GATING_SOFTMAX_WEIGHT:
        weights = softmax(weights, axis=-1)
    if hp.expert_weights_norm:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), MOE_WEIGHT_SUM_MIN)
    if hp.expert_weights_scale not in (0.0, 1.0):
        weights = weights * hp.expert_weights_scale
    return experts, weights


def ffn_block(model: DsaModel, il: int, h: np.ndarray) -> np.ndarray:
    """Dense SwiGLU for the leading layers, MoE (routed + shared expert) for the others; h is the
    ffn_norm output."""
    hp, p = model.hp, f"blk.{il}."
    if il < hp.n_dense_lead:
        return linear(swiglu(linear(h, model.w(p + "ffn_gate.weight")), linear(h, model.w(p + "ffn_up.weight"))),
                      model.w(p + "ffn_down.weight"))
    experts, weights = moe_route(model, il, h)
    fused = model.w(p + "ffn_gate_up_exps.weight")  # per expert: n_ff_exp gate rows, then n_ff_exp up rows
    if fused is not None:
        gate, up = fused[:, :hp.n_ff_exp, :], fused[:, hp.n_ff_exp:, :]
    else:
        gate, up = model.w(p + "ffn_gate_exps.weight"), model.w(p + "ffn_up_exps.weight")
    down = model.w(p + "ffn_down_exps.weight")
    out = np.zeros_like(h)
    for e in np.unique(experts):
        rows, slot = np.nonzero(experts == e)
        y = linear(swiglu(linear(h[rows], gate[e]), linear(h[rows], up[e])), down[e])
        out[rows] += weights[rows, slot][:, None] * y
    if model.w(p + "ffn_gate_shexp.weight") is not None:
        out += linear(swiglu(linear(h, model.w(p + "ffn_gate_shexp.weight")),
                             linear(h, model.w(p + "ffn_up_shexp.weight"))),
                      model.w(p + "ffn_down_shexp.weight"))
    return out


# --------------------------------------------------------------------------------------------------
# Forward pass
# --------------------------------------------------------------------------------------------------

def forward(model: DsaModel, tokens, top_k: int | None = None, dsa: bool = True, naive_mla: bool = False,
            trace: dict | None = None):
    """Logits [T, n_vocab] (float64) of one causal sequence at positions 0..T-1, and the selections:
    selections[il] = list over query positions of the sorted selected key positions (numpy int arrays),
    or None where no selection was made (dsa=False, or no query sees more than top_k keys).
    glm-dsa shared layers carry the same list as the full layer they reuse.
    top_k: overrides the model's attention.indexer.top_k. trace: optional dict filled with per-layer
    intermediates (indexer scores, attention probabilities, hidden states) for tests."""
    hp = model.hp
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or len(tokens) == 0:
        raise ValueError("tokens must be a non-empty 1-D sequence")
    if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
        raise ValueError(f"token id out of range [0, {hp.n_vocab})")
    top_k = hp.idx_top_k if top_k is None else int(top_k)
    if top_k <= 0:
        raise ValueError("top_k must be positive")
    T = len(tokens)
    positions = np.arange(T)
    sparse = dsa and T > top_k           # otherwise every query sees <= top_k keys: all selected = dense
    x = model.tensors["token_embd.weight"][tokens]                                  # [T, n_embd]
    selections: list = []
    prev_sel, prev_mask = None, None
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        h = rms_norm(x, model.w(p + "attn_norm.weight"), hp.rms_eps)
        qr = rms_norm(linear(h, model.w(p + "attn_q_a.weight")), model.w(p + "attn_q_a_norm.weight"), hp.rms_eps)
        sel, smask = None, None
        if sparse:
            if hp.idx_full[il]:
                q, k, w = indexer_qkw(model, il, h, qr, positions)
                sel, scores = [], []
                for a, b in _blocks(T, QUERY_BLOCK):                                # bounded memory
                    score = indexer_scores(q[a:b], k, w[a:b], positions[a:b], positions)
                    sel += select_top_k(score, top_k)
                    if trace is not None:
                        scores.append(score)
                smask = selection_mask(sel, T)
                prev_sel, prev_mask = sel, smask
                if trace is not None:
                    trace.setdefault("indexer_scores", {})[il] = np.concatenate(scores)
            else:
                sel, smask = prev_sel, prev_mask
        selections.append(sel)
        attn = mla_attention(model, il, h, qr, positions, smask, naive=naive_mla, return_probs=trace is not None)
        if trace is not None:
            attn, probs = attn
            trace.setdefault("attn_probs", {})[il] = probs
        x = x + attn
        x = x + ffn_block(model, il, rms_norm(x, model.w(p + "ffn_norm.weight"), hp.rms_eps))
        if trace is not None:
            trace.setdefault("hidden", {})[il] = x
    x = rms_norm(x, model.w("output_norm.weight"), hp.rms_eps)
    return linear(x, model.output), selections


def selection_json(model: DsaModel, selections: list, n_tokens: int, top_k: int, dsa: bool,
                   last: int = 16) -> dict:
    """The --selection-out document: per layer, the selected keys of the last `last` queries."""
    hp = model.hp
    first = max(0, n_tokens - last)
    layers = []
    for il in range(hp.n_layer):
        sel = selections[il]
        qs = []
        for pos in range(first, n_tokens):
            keys = list(range(pos + 1)) if sel is None else [int(s) for s in sel[pos]]
            qs.append({"pos": pos, "keys": keys})
        layers.append({"layer": il, "indexer": "full" if hp.idx_full[il] else "shared",
                       "dense": sel is None, "queries": qs})
    return {"arch": hp.arch, "n_tokens": n_tokens, "top_k": top_k, "dsa": dsa, "layers": layers}


def read_tokens_file(path: str) -> list[int]:
    """Token ids separated by whitespace and/or commas."""
    with open(path, encoding="utf-8") as fh:
        return [int(t) for t in fh.read().replace(",", " ").split()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file (architecture deepseek32 or glm-dsa)")
    ap.add_argument("--tokens-file", required=True, help="token ids, whitespace/comma separated")
    ap.add_argument("--top-k", type=int, default=None, help="indexer top-k (default: the model's)")
    ap.add_argument("--dense", action="store_true", help="dense attention (no indexer selection)")
    ap.add_argument("--out", required=True, help="last position's logits, float64 .npy of shape [n_vocab]")
    ap.add_argument("--selection-out", help="JSON with the selected keys of the last queries per layer")
    ap.add_argument("--selection-last", type=int, default=16, help="queries per layer in --selection-out")
    args = ap.parse_args(argv)

    model = DsaModel(args.model)
    tokens = read_tokens_file(args.tokens_file)
    top_k = model.hp.idx_top_k if args.top_k is None else args.top_k
    logits, selections = forward(model, tokens, top_k=top_k, dsa=not args.dense)
    np.save(args.out, logits[-1])
    if args.selection_out:
        doc = selection_json(model, selections, len(tokens), top_k, not args.dense, args.selection_last)
        with open(args.selection_out, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
    top = np.argsort(-logits[-1])[:5]
    print(f"{model.hp.arch}: {len(tokens)} tokens, top_k {top_k}, {'dense' if args.dense else 'dsa'}; "
          "last-position top-5: " + ", ".join(f"{int(t)}:{logits[-1, t]:.6f}" for t in top), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
