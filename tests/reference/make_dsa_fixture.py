#!/usr/bin/python3
"""Tiny random GGUF models of the architectures `deepseek32` and `glm-dsa`, written with the metadata
keys, value types, tensor names and tensor dims that llama.cpp's converter and loader use
(src/models/deepseek32.cpp and glm-dsa.cpp load_arch_hparams / load_arch_tensors, llama-arch.cpp,
conversion/deepseek.py DeepseekV2Model / DeepseekV32Model), for testing the numpy reference
(dsa_ref.py) independently of the C++ engine.

    from make_dsa_fixture import FixtureConfig, default_config, make_fixture
    cfg = default_config("glm-dsa", seed=3)
    make_fixture("tiny-glm-dsa.gguf", cfg)

CLI:
    /usr/bin/python3 tests/reference/make_dsa_fixture.py --arch deepseek32 --out F.gguf [--seed N]
        [--top-k N] [--layers N] [--nextn N] [--vocab N] [--indexer-types 1,1,1,0,0,0,1|absent]
        [--context-length N] [--no-yarn] [--gating 1|2|3] [--groups G --groups-used U] [--tied-output]
        [--type f32|f16|bf16] [--tokens-out ids.txt --n-tokens 300]

Weights are Gaussian, scaled so that the model is far from uniform: the output projection makes the
next-token distribution peaked (mean entropy well under half of log(n_vocab), checked by
test_dsa_ref.py) and the query projections give attention logits of a few units. Layout notes:
  * the MTP/NextN blocks (the last nextn_predict_layers of block_count) carry a full layer plus
    nextn.{eh_proj, enorm, hnorm, shared_head_norm}; the forward pass skips them;
  * glm-dsa "shared" layers (attention.indexer.types false) have no indexer tensors;
  * attention.indexer.types is written with one bool per non-MTP layer (block_count - nextn entries,
    as the converter writes the HF list);
  * ffn_gate_inp, exp_probs_b and indexer.proj stay F32 (as llama.cpp's converter keeps them).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gguf import GGMLType, GGUFValueType as VT, write_gguf  # noqa: E402


@dataclass
class FixtureConfig:
    arch: str = "deepseek32"
    seed: int = 0
    n_vocab: int = 128
    n_embd: int = 64
    n_layer: int = 4                 # layers the forward pass runs
    n_nextn: int = 1                 # trailing MTP/NextN blocks (block_count = n_layer + n_nextn)
    n_head: int = 4
    q_lora_rank: int = 48
    kv_lora_rank: int = 32
    head_nope: int = 16
    n_rot: int = 8                   # qk_rope_head_dim = rope.dimension_count
    head_v: int = 16
    n_ff: int = 96                   # leading dense layers
    n_ff_exp: int = 32
    n_expert: int = 8
    n_expert_used: int = 2
    n_expert_shared: int = 1
    n_expert_groups: int = 4
    n_group_used: int = 2
    n_dense_lead: int = 1
    gating: int = 2                  # 1 softmax, 2 sigmoid, 3 softmax over the chosen weights
    expert_weights_norm: bool = True
    expert_weights_scale: float = 2.5
    probs_bias: bool = True          # write exp_probs_b.bias
    idx_n_head: int = 4
    idx_head_dim: int = 16
    idx_top_k: int = 64
    indexer_types: list | None = None   # glm-dsa: per layer 1 full / 0 shared; None: key absent
    context_length: int = 4096
    rms_eps: float = 1e-6
    freq_base: float = 10000.0
    yarn: bool = True                # rope.scaling.type yarn (deepseek32 default)
    yarn_factor: float = 4.0
    yarn_orig_ctx: int = 128
    yarn_log_mul_stored: float = 0.1  # what the converter writes: 0.1 * mscale_all_dim
    tied_output: bool = False
    wtype: str = "f32"               # big matrices: f32, f16 or bf16
    # scales of the random weights (std = gain / sqrt(n_in))
    gain_q: float = 2.0
    gain_kv: float = 1.5
    gain_out: float = 6.0
    gain_idx: float = 1.5

    @property
    def head_k(self) -> int:
        return self.head_nope + self.n_rot

    @property
    def block_count(self) -> int:
        return self.n_layer + self.n_nextn


def default_config(arch: str, **overrides) -> FixtureConfig:
    """The standard tiny model of each architecture. glm-dsa: 7 layers with indexer types
    [full, full, full, shared, shared, shared, full] (layers 4 and 5 reuse layer 2's selection), one
    expert group, sigmoid gating, no YaRN (GLM-5.x has none); with another n_layer the types follow the
    same GLM-5.2 pattern (full at 0, 1, 2, 6, 10, ...) unless indexer_types is given."""
    if arch == "deepseek32":
        cfg = FixtureConfig(arch=arch)
    elif arch == "glm-dsa":
        cfg = FixtureConfig(arch=arch, n_layer=7, n_expert_groups=1, n_group_used=1, yarn=False)
        if "indexer_types" not in overrides:  # the GLM-5.2 pattern, written explicitly
            n = overrides.get("n_layer", cfg.n_layer)
            overrides = dict(overrides, indexer_types=[int(il < 2 or (il - 2) % 4 == 0) for il in range(n)])
    else:
        raise ValueError(f"unknown architecture {arch!r}")
    return dataclasses.replace(cfg, **overrides)


def _indexer_full(cfg: FixtureConfig) -> list[bool]:
    if cfg.arch != "glm-dsa" or cfg.indexer_types is None:
        if cfg.arch == "glm-dsa" and cfg.context_length >= 1048576:
            return [il < 2 or (il - 2) % 4 == 0 for il in range(cfg.n_layer)]
        return [True] * cfg.n_layer
    return [bool(t) for t in cfg.indexer_types[:cfg.n_layer]]


def build_fixture(cfg: FixtureConfig) -> tuple[dict, dict]:
    """(metadata, tensors) of a random model, in write_gguf's format."""
    if cfg.arch not in ("deepseek32", "glm-dsa"):
        raise ValueError(f"unknown architecture {cfg.arch!r}")
    a = cfg.arch
    rng = np.random.default_rng(cfg.seed)
    big = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16}[cfg.wtype]

    def mat(n_out, n_in, gain=1.0, ggml_type=None):
        w = rng.standard_normal((n_out, n_in)) * (gain / np.sqrt(n_in))
        return (big if ggml_type is None else ggml_type, w.astype(np.float32))

    def stack(n, n_out, n_in, gain=1.0):
        w = rng.standard_normal((n, n_out, n_in)) * (gain / np.sqrt(n_in))
        return (big, w.astype(np.float32))

    def norm(n, spread=0.1):
        return (GGMLType.F32, (1.0 + spread * rng.standard_normal(n)).astype(np.float32))

    u32 = lambda v: (VT.UINT32, int(v))  # noqa: E731
    f32 = lambda v: (VT.FLOAT32, float(v))  # noqa: E731
    md = {
        "general.architecture": (VT.STRING, a),
        "general.name": (VT.STRING, f"sparrow tiny random {a}"),
        f"{a}.vocab_size": u32(cfg.n_vocab),
        f"{a}.context_length": u32(cfg.context_length),
        f"{a}.embedding_length": u32(cfg.n_embd),
        f"{a}.block_count": u32(cfg.block_count),
        f"{a}.feed_forward_length": u32(cfg.n_ff),
        f"{a}.attention.head_count": u32(cfg.n_head),
        f"{a}.attention.head_count_kv": u32(1),
        f"{a}.attention.layer_norm_rms_epsilon": f32(cfg.rms_eps),
        f"{a}.rope.freq_base": f32(cfg.freq_base),
        f"{a}.rope.dimension_count": u32(cfg.n_rot),
        f"{a}.leading_dense_block_count": u32(cfg.n_dense_lead),
        f"{a}.attention.q_lora_rank": u32(cfg.q_lora_rank),
        f"{a}.attention.kv_lora_rank": u32(cfg.kv_lora_rank),
        f"{a}.attention.key_length": u32(cfg.kv_lora_rank + cfg.n_rot),
        f"{a}.attention.value_length": u32(cfg.kv_lora_rank),
        f"{a}.attention.key_length_mla": u32(cfg.head_k),
        f"{a}.attention.value_length_mla": u32(cfg.head_v),
        f"{a}.expert_feed_forward_length": u32(cfg.n_ff_exp),
        f"{a}.expert_count": u32(cfg.n_expert),
        f"{a}.expert_used_count": u32(cfg.n_expert_used),
        f"{a}.expert_shared_count": u32(cfg.n_expert_shared),
        f"{a}.expert_group_count": u32(cfg.n_expert_groups),
        f"{a}.expert_group_used_count": u32(cfg.n_group_used),
        f"{a}.expert_weights_scale": f32(cfg.expert_weights_scale),
        f"{a}.expert_weights_norm": (VT.BOOL, bool(cfg.expert_weights_norm)),
        f"{a}.expert_gating_func": u32(cfg.gating),
        f"{a}.attention.indexer.head_count": u32(cfg.idx_n_head),
        f"{a}.attention.indexer.key_length": u32(cfg.idx_head_dim),
        f"{a}.attention.indexer.top_k": u32(cfg.idx_top_k),
    }
    if cfg.n_nextn:
        md[f"{a}.nextn_predict_layers"] = u32(cfg.n_nextn)
    if cfg.yarn:
        md[f"{a}.rope.scaling.type"] = (VT.STRING, "yarn")
        md[f"{a}.rope.scaling.factor"] = f32(cfg.yarn_factor)
        md[f"{a}.rope.scaling.original_context_length"] = u32(cfg.yarn_orig_ctx)
        if a == "deepseek32":
            md[f"{a}.rope.scaling.yarn_log_multiplier"] = f32(cfg.yarn_log_mul_stored)
    if a == "glm-dsa" and cfg.indexer_types is not None:
        md[f"{a}.attention.indexer.types"] = ((VT.ARRAY, VT.BOOL), [bool(t) for t in cfg.indexer_types])
    full = _indexer_full(cfg)

    E, D, H = cfg.n_embd, cfg.idx_head_dim, cfg.idx_n_head
    t: dict = {}
    t["token_embd.weight"] = (big, rng.standard_normal((cfg.n_vocab, E)).astype(np.float32))
    for il in range(cfg.block_count):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(E)
        t[p + "attn_q_a_norm.weight"] = norm(cfg.q_lora_rank)
        t[p + "attn_kv_a_norm.weight"] = norm(cfg.kv_lora_rank)
        t[p + "attn_q_a.weight"] = mat(cfg.q_lora_rank, E)
        t[p + "attn_q_b.weight"] = mat(cfg.n_head * cfg.head_k, cfg.q_lora_rank, cfg.gain_q)
        t[p + "attn_kv_a_mqa.weight"] = mat(cfg.kv_lora_rank + cfg.n_rot, E, cfg.gain_kv)
        # GGUF dims {nope, kv_lora, n_head} and {kv_lora, v_head, n_head}
        t[p + "attn_k_b.weight"] = stack(cfg.n_head, cfg.kv_lora_rank, cfg.head_nope, 1.5)
        t[p + "attn_v_b.weight"] = stack(cfg.n_head, cfg.head_v, cfg.kv_lora_rank)
        t[p + "attn_output.weight"] = mat(E, cfg.n_head * cfg.head_v, 0.7)
        t[p + "ffn_norm.weight"] = norm(E)
        if il >= cfg.n_layer or full[il]:
            t[p + "indexer.k_norm.weight"] = norm(D)
            t[p + "indexer.k_norm.bias"] = (GGMLType.F32, (0.1 * rng.standard_normal(D)).astype(np.float32))
            t[p + "indexer.proj.weight"] = mat(H, E, 1.0, GGMLType.F32)
            t[p + "indexer.attn_k.weight"] = mat(D, E, cfg.gain_idx)
            t[p + "indexer.attn_q_b.weight"] = mat(H * D, cfg.q_lora_rank, cfg.gain_idx)
        if il < cfg.n_dense_lead:
            t[p + "ffn_gate.weight"] = mat(cfg.n_ff, E)
            t[p + "ffn_up.weight"] = mat(cfg.n_ff, E)
            t[p + "ffn_down.weight"] = mat(E, cfg.n_ff, 0.5)
        else:
            t[p + "ffn_gate_inp.weight"] = mat(cfg.n_expert, E, 2.0, GGMLType.F32)
            if cfg.probs_bias:
                t[p + "exp_probs_b.bias"] = (GGMLType.F32, (0.2 * rng.standard_normal(cfg.n_expert)).astype(np.float32))
            # GGUF dims {n_embd, n_ff_exp, n_expert} and {n_ff_exp, n_embd, n_expert}
            t[p + "ffn_gate_exps.weight"] = stack(cfg.n_expert, cfg.n_ff_exp, E)
            t[p + "ffn_up_exps.weight"] = stack(cfg.n_expert, cfg.n_ff_exp, E)
            t[p + "ffn_down_exps.weight"] = stack(cfg.n_expert, E, cfg.n_ff_exp, 0.5)
            ns = cfg.n_ff_exp * cfg.n_expert_shared
            t[p + "ffn_gate_shexp.weight"] = mat(ns, E)
            t[p + "ffn_up_shexp.weight"] = mat(ns, E)
            t[p + "ffn_down_shexp.weight"] = mat(E, ns, 0.5)
        if il >= cfg.n_layer:  # MTP / NextN block: kept by llama.cpp, unused by the main forward pass
            t[p + "nextn.eh_proj.weight"] = mat(E, 2 * E)
            t[p + "nextn.enorm.weight"] = norm(E)
            t[p + "nextn.hnorm.weight"] = norm(E)
            t[p + "nextn.shared_head_norm.weight"] = norm(E)
    t["output_norm.weight"] = norm(E)
    if not cfg.tied_output:
        t["output.weight"] = mat(cfg.n_vocab, E, cfg.gain_out)
    else:  # tied: the embedding rows must then give peaked logits themselves
        emb = t["token_embd.weight"][1]
        t["token_embd.weight"] = (big, (emb * (cfg.gain_out / np.sqrt(E))).astype(np.float32))
    return md, t


def make_fixture(path: str, cfg: FixtureConfig | None = None, extra_metadata: dict | None = None) -> FixtureConfig:
    """Write the random model of cfg (default: default_config('deepseek32')) to path; extra_metadata is
    merged into the metadata (e.g. tokenizer keys). Returns the config."""
    cfg = cfg or default_config("deepseek32")
    md, tensors = build_fixture(cfg)
    if extra_metadata:
        md.update(extra_metadata)
    write_gguf(path, md, tensors)
    return cfg


def random_tokens(n: int, n_vocab: int, seed: int = 0) -> list[int]:
    return [int(v) for v in np.random.default_rng(seed + 1000).integers(0, n_vocab, n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=("deepseek32", "glm-dsa"), default="deepseek32")
    ap.add_argument("--out", required=True, help="output .gguf")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top-k", type=int, help="attention.indexer.top_k")
    ap.add_argument("--layers", type=int, help="non-MTP layers")
    ap.add_argument("--nextn", type=int, help="MTP/NextN layers")
    ap.add_argument("--vocab", type=int, help="n_vocab")
    ap.add_argument("--indexer-types", help="glm-dsa: comma list of 1 (full) / 0 (shared), or 'absent'")
    ap.add_argument("--context-length", type=int)
    ap.add_argument("--no-yarn", action="store_true")
    ap.add_argument("--gating", type=int, choices=(1, 2, 3))
    ap.add_argument("--groups", type=int, help="expert_group_count")
    ap.add_argument("--groups-used", type=int, help="expert_group_used_count")
    ap.add_argument("--tied-output", action="store_true")
    ap.add_argument("--type", choices=("f32", "f16", "bf16"), default="f32", help="type of the big matrices")
    ap.add_argument("--tokens-out", help="also write random token ids (one line, space separated)")
    ap.add_argument("--n-tokens", type=int, default=300)
    args = ap.parse_args(argv)

    ov = {"seed": args.seed, "wtype": args.type}
    for k, v in (("idx_top_k", args.top_k), ("n_layer", args.layers), ("n_nextn", args.nextn),
                 ("n_vocab", args.vocab), ("context_length", args.context_length), ("gating", args.gating),
                 ("n_expert_groups", args.groups), ("n_group_used", args.groups_used)):
        if v is not None:
            ov[k] = v
    if args.no_yarn:
        ov["yarn"] = False
    if args.tied_output:
        ov["tied_output"] = True
    if args.indexer_types is not None:
        ov["indexer_types"] = None if args.indexer_types == "absent" else \
            [int(v) for v in args.indexer_types.split(",") if v.strip()]
    cfg = default_config(args.arch, **ov)
    if cfg.arch == "glm-dsa" and cfg.indexer_types is not None and len(cfg.indexer_types) != cfg.n_layer:
        ap.error(f"--indexer-types needs {cfg.n_layer} entries")
    make_fixture(args.out, cfg)
    if args.tokens_out:
        with open(args.tokens_out, "w", encoding="utf-8") as fh:
            fh.write(" ".join(str(v) for v in random_tokens(args.n_tokens, cfg.n_vocab, cfg.seed)) + "\n")
    print(f"wrote {args.out}: {cfg.arch}, {cfg.n_layer}+{cfg.n_nextn} layers, top_k {cfg.idx_top_k}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
