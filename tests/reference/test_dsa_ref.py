#!/usr/bin/python3
"""Self-validation of the deepseek32 / glm-dsa numpy reference (dsa_ref.py) and of its fixture
generator (make_dsa_fixture.py). Needs no data: every model is a tiny random GGUF written here.

Run: /usr/bin/python3 tests/reference/test_dsa_ref.py
Exit 0 on success, 1 on failure (77, skip, is never needed: nothing external is read).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import common  # noqa: E402
import dsa_ref  # noqa: E402
import make_dsa_fixture as mf  # noqa: E402
from gguf import GGMLType, GGUFReader, GGUFValueType as VT, write_gguf  # noqa: E402

TMP = tempfile.mkdtemp(prefix="dsa_ref_test_")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)
_models: dict = {}


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def fixture(name: str, cfg: mf.FixtureConfig) -> dsa_ref.DsaModel:
    """Write (once) and load a fixture."""
    if name not in _models:
        path = os.path.join(TMP, name + ".gguf")
        mf.make_fixture(path, cfg)
        _models[name] = dsa_ref.DsaModel(path)
    return _models[name]


def ds32() -> dsa_ref.DsaModel:
    return fixture("deepseek32", mf.default_config("deepseek32"))


def glm() -> dsa_ref.DsaModel:
    return fixture("glm-dsa", mf.default_config("glm-dsa"))


def tokens(n: int, model: dsa_ref.DsaModel, seed: int = 0) -> list[int]:
    return mf.random_tokens(n, model.hp.n_vocab, seed)


def write_variant(name: str, cfg: mf.FixtureConfig, edit) -> str:
    """Write cfg's fixture after edit(metadata, tensors) (in place); returns the path."""
    md, t = mf.build_fixture(cfg)
    edit(md, t)
    path = os.path.join(TMP, name + ".gguf")
    write_gguf(path, md, t)
    return path


# ------------------------------------------------------------------------------------------------
# Metadata, scales, file variants
# ------------------------------------------------------------------------------------------------

def test_metadata():
    """Keys, value types and derived hyper-parameters of both fixtures."""
    for m, arch in ((ds32(), "deepseek32"), (glm(), "glm-dsa")):
        hp, f = m.hp, m.gguf
        check(hp.arch == arch, "arch")
        types = f.metadata_types
        for k in ("block_count", "embedding_length", "attention.head_count", "attention.q_lora_rank",
                  "attention.kv_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
                  "rope.dimension_count", "expert_count", "expert_gating_func", "attention.indexer.head_count",
                  "attention.indexer.key_length", "attention.indexer.top_k", "nextn_predict_layers"):
            check(types[f"{arch}.{k}"] == VT.UINT32, f"{arch}.{k} is {types[f'{arch}.{k}']!r}, want UINT32")
        check(types[f"{arch}.expert_weights_norm"] == VT.BOOL, "expert_weights_norm type")
        check(types[f"{arch}.attention.layer_norm_rms_epsilon"] == VT.FLOAT32, "rms eps type")
        check(hp.n_layer == hp.n_layer_all - 1 and hp.n_nextn == 1, "MTP layer not excluded")
        check(f.tensors["blk.1.attn_k_b.weight"].dims == (hp.head_nope, hp.kv_lora_rank, hp.n_head), "k_b dims")
        check(f.tensors["blk.1.attn_v_b.weight"].dims == (hp.kv_lora_rank, hp.head_v, hp.n_head), "v_b dims")
        check(f.tensors["blk.1.ffn_gate_exps.weight"].dims == (hp.n_embd, hp.n_ff_exp, hp.n_expert), "exps dims")
        check(f.tensors["blk.1.ffn_gate_inp.weight"].ggml_type == GGMLType.F32, "gate_inp type")
        check(f.tensors["blk.0.indexer.proj.weight"].dims == (hp.n_embd, hp.idx_n_head), "indexer.proj dims")
        check(f.tensors["blk.0.indexer.attn_q_b.weight"].dims ==
              (hp.q_lora_rank, hp.idx_n_head * hp.idx_head_dim), "indexer.attn_q_b dims")
        check(f"blk.{hp.n_layer}.nextn.eh_proj.weight" in f.tensors, "MTP tensors")
    hp = ds32().hp
    check(hp.idx_rope_mode == common.ROPE_NEOX and glm().hp.idx_rope_mode == common.ROPE_NORM, "indexer rope modes")
    check(hp.ext_factor == 1.0 and abs(hp.yarn_log_mul - 1.0) < 1e-15, "deepseek32 YaRN")
    check(glm().hp.idx_full == [True, True, True, False, False, False, True], f"glm types {glm().hp.idx_full}")
    check(glm().gguf.metadata_types["glm-dsa.attention.indexer.types"] == (VT.ARRAY, VT.BOOL), "types array type")
    check("blk.3.indexer.proj.weight" not in glm().tensors, "shared layer has indexer tensors")


def test_yarn_scales():
    """MODELS §2.1d: factor 40, original context 4096, n_rot 32 (16 pairs), key_length_mla 96,
    yarn_log_multiplier 0.1 -> freq_scale 0.025, correction range [5, 12], mscale 1.3688879,
    kq_scale 0.191249415, RoPE at unit magnitude."""
    cfg = mf.default_config("deepseek32", n_rot=32, head_nope=64, idx_head_dim=64, yarn_factor=40.0,
                            yarn_orig_ctx=4096, n_layer=1, n_nextn=0, n_dense_lead=1)
    m = fixture("yarn40", cfg)
    hp = m.hp
    check(abs(hp.freq_scale - 0.025) < 1e-9, f"freq_scale {hp.freq_scale}")
    check(hp.yarn_log_mul == 1.0, f"yarn_log_mul {hp.yarn_log_mul} (llama.cpp reads back exactly 1)")
    check(common.rope_yarn_corr_dims(32, 4096, 10000.0, 32.0, 1.0) == (5.0, 12.0), "corr dims")
    check(abs(math.sqrt(hp.kq_scale * math.sqrt(96)) - 1.3688879) < 1e-6, "mscale")
    # llama.cpp computes this in float32 (0.191249415); the float64 value is 0.19124944
    check(abs(hp.kq_scale / 0.191249415 - 1) < 1e-6, f"kq_scale {hp.kq_scale}")
    cos, sin = common.rope_cos_sin(np.arange(50), 32, **{k: v for k, v in m.rope_kwargs().items()})
    check(np.allclose(cos ** 2 + sin ** 2, 1.0, atol=1e-12), "rope magnitude is not 1")
    # no scaling: everything is 1 and kq_scale = 1/sqrt(key_length_mla)
    check(abs(glm().hp.kq_scale - 1 / math.sqrt(glm().hp.head_k)) < 1e-15 and glm().hp.rope_attn_factor == 1.0,
          "glm scales")


def test_mtp_and_legacy_kv_b():
    """The MTP block does not influence the logits; a legacy unsplit attn_kv_b gives the same model."""
    cfg = mf.default_config("deepseek32", n_layer=2)
    m = fixture("ds32-2l", cfg)
    toks = tokens(40, m)
    ref, _ = dsa_ref.forward(m, toks, top_k=16)

    def scramble_mtp(md, t):
        for name in list(t):
            if name.startswith(f"blk.{cfg.n_layer}."):
                ty, a = t[name]
                t[name] = (ty, (a * -3.0 + 1.0).astype(np.float32))

    got, _ = dsa_ref.forward(dsa_ref.DsaModel(write_variant("mtp-scrambled", cfg, scramble_mtp)), toks, top_k=16)
    check(np.array_equal(got, ref), "MTP weights changed the logits")

    def legacy(md, t):
        for il in range(cfg.block_count):
            p = f"blk.{il}."
            kb, vb = t.pop(p + "attn_k_b.weight")[1], t.pop(p + "attn_v_b.weight")[1]
            # HF kv_b_proj rows per head: [k_nope (nope) | v (v_head)], columns kv_lora
            kvb = np.concatenate([kb.transpose(0, 2, 1), vb], axis=1).reshape(-1, cfg.kv_lora_rank)
            t[p + "attn_kv_b.weight"] = (GGMLType.F32, kvb)

    got, _ = dsa_ref.forward(dsa_ref.DsaModel(write_variant("legacy-kvb", cfg, legacy)), toks, top_k=16)
    check(np.max(np.abs(got - ref)) < 1e-12, "attn_kv_b differs from attn_k_b/attn_v_b")


def test_indexer_types_rules():
    """glm-dsa IndexShare metadata: explicit types (bool or int), defaults by context length, and the
    two files that must be refused."""
    base = mf.default_config("glm-dsa", n_layer=7)

    def drop_types(md, t):
        md.pop("glm-dsa.attention.indexer.types")

    # absent + context < 1M: every layer full -> layer 3 lacks its indexer tensors -> refused
    try:
        dsa_ref.DsaModel(write_variant("glm-absent-short", base, drop_types))
        raise AssertionError("a full layer without indexer tensors was accepted")
    except dsa_ref.DsaModelError as e:
        check("layer 3" in str(e), f"message does not name the layer: {e}")
    # absent + context >= 1M: the GLM-5.2 default pattern
    long_cfg = dataclasses.replace(base, context_length=1048576)
    m = dsa_ref.DsaModel(write_variant("glm-absent-long", long_cfg, drop_types))
    check(m.hp.idx_full == [True, True, True, False, False, False, True], f"GLM-5.2 default {m.hp.idx_full}")
    check(dsa_ref.glm52_default_indexer_full(11) == [il <= 1 or il % 4 == 2 for il in range(11)], "pattern")
    # absent + context < 1M with all tensors present: all full
    all_full = dataclasses.replace(base, indexer_types=[1] * 7)
    m = dsa_ref.DsaModel(write_variant("glm-absent-allfull", all_full, drop_types))
    check(m.hp.idx_full == [True] * 7, "all-full default")

    # int32 array, block_count entries (MTP layer included)
    def int_types(md, t):
        md["glm-dsa.attention.indexer.types"] = ((VT.ARRAY, VT.INT32), [1, 1, 1, 0, 0, 0, 1, 1])

    m = dsa_ref.DsaModel(write_variant("glm-int-types", base, int_types))
    check(m.hp.idx_full == [True, True, True, False, False, False, True], "int32 types")

    # shared layer 0
    def shared0(md, t):
        md["glm-dsa.attention.indexer.types"] = ((VT.ARRAY, VT.BOOL), [False] + [True] * 6)

    try:
        dsa_ref.DsaModel(write_variant("glm-shared0", all_full, shared0))
        raise AssertionError("a shared layer 0 was accepted")
    except dsa_ref.DsaModelError as e:
        check("layer 0" in str(e), f"message: {e}")
    # deepseek32 ignores indexer.types and needs the indexer on every layer
    try:
        dsa_ref.DsaModel(write_variant("ds32-missing-idx", mf.default_config("deepseek32"),
                                       lambda md, t: t.pop("blk.2.indexer.attn_k.weight")))
        raise AssertionError("deepseek32 without an indexer tensor was accepted")
    except dsa_ref.DsaModelError as e:
        check("layer 2" in str(e), f"message: {e}")


# ------------------------------------------------------------------------------------------------
# Forward-pass properties
# ------------------------------------------------------------------------------------------------

def test_absorbed_vs_naive():
    """Absorbed MLA (attn_k_b into q, attn_v_b after attention) equals the naive MHA form."""
    for m in (ds32(), glm()):
        toks = tokens(120, m, seed=5)
        for top_k in (32, 1000):
            a, sa = dsa_ref.forward(m, toks, top_k=top_k)
            b, sb = dsa_ref.forward(m, toks, top_k=top_k, naive_mla=True)
            err = np.max(np.abs(a - b)) / np.max(np.abs(a))
            check(err < 1e-10, f"{m.hp.arch} top_k {top_k}: absorbed vs naive relative error {err:.3g}")
            check(all((x is None and y is None) or all(np.array_equal(u, v) for u, v in zip(x, y))
                      for x, y in zip(sa, sb)), "selections differ between the two forms")


def test_dense_when_all_keys_fit():
    """top_k >= T: no selection, logits bit-identical to dense; an explicit all-visible selection mask
    and the indexer's own selection at top_k = T change nothing either."""
    for m in (ds32(), glm()):
        T = 96
        toks = tokens(T, m, seed=2)
        dense, sd = dsa_ref.forward(m, toks, dsa=False)
        check(all(s is None for s in sd), "dense selections")
        for top_k in (T, T + 1, 4096):
            got, sel = dsa_ref.forward(m, toks, top_k=top_k)
            check(all(s is None for s in sel), f"top_k {top_k}: a selection was made")
            check(np.array_equal(got, dense), f"top_k {top_k}: logits differ from dense")
        # the attention with an explicit all-visible mask is bit-identical to the plain causal one
        hp = m.hp
        x = m.tensors["token_embd.weight"][np.asarray(toks)]
        h = common.rms_norm(x, m.w("blk.0.attn_norm.weight"), hp.rms_eps)
        qr = common.rms_norm(common.linear(h, m.w("blk.0.attn_q_a.weight")), m.w("blk.0.attn_q_a_norm.weight"),
                             hp.rms_eps)
        pos = np.arange(T)
        q, k, w = dsa_ref.indexer_qkw(m, 0, h, qr, pos)
        sel = dsa_ref.select_top_k(dsa_ref.indexer_scores(q, k, w, pos, pos), T)
        check(all(np.array_equal(s, np.arange(t + 1)) for t, s in enumerate(sel)), "top_k = T selects all")
        full = dsa_ref.selection_mask(sel, T)
        check(np.array_equal(dsa_ref.mla_attention(m, 0, h, qr, pos, full), dsa_ref.mla_attention(m, 0, h, qr, pos)),
              "all-visible selection mask changes the attention")
        # top_k = T - 1: only the last query loses a key
        got, sel = dsa_ref.forward(m, toks, top_k=T - 1)
        check(all(s is not None and len(s[-1]) == T - 1 and len(s[-2]) == T - 1 for s in sel), "T-1 selection")
        check(np.max(np.abs(got[:-1] - dense[:-1])) < 1e-12, "earlier positions changed at top_k = T - 1")


def test_selection_active():
    """T = 300, top_k = 64: every layer selects, the selections are well formed and the logits move."""
    for m in (ds32(), glm()):
        T, K = 300, 64
        toks = tokens(T, m)
        tr: dict = {}
        got, sel = dsa_ref.forward(m, toks, top_k=K, trace=tr)
        dense, _ = dsa_ref.forward(m, toks, dsa=False)
        for il, s in enumerate(sel):
            check(s is not None and len(s) == T, f"layer {il}: no selection")
            for t, keys in enumerate(s):
                want = min(K, t + 1)
                check(len(keys) == want and len(np.unique(keys)) == want, f"layer {il} query {t}: {len(keys)} keys")
                check(np.all(np.diff(keys) > 0) and keys[-1] <= t, f"layer {il} query {t}: not sorted/causal")
                if t < K:
                    check(np.array_equal(keys, np.arange(t + 1)), f"layer {il} query {t}: not all visible")
        # the selected keys are the top scores
        for il, score in tr["indexer_scores"].items():
            for t in (K, 150, T - 1):
                row = score[t, :t + 1]
                chosen = np.zeros(t + 1, dtype=bool)
                chosen[sel[il][t]] = True
                check(row[chosen].min() >= row[~chosen].max(), f"layer {il} query {t}: not the top-k")
        diff = np.max(np.abs(got[-1] - dense[-1]))
        check(diff > 1e-2, f"{m.hp.arch}: selection barely changes the logits ({diff:.3g})")
        check(np.max(np.abs(got[:K] - dense[:K])) < 1e-12, "queries with <= top_k keys must be dense")
        # distinct full layers select differently
        check(any(not np.array_equal(a, b) for a, b in zip(sel[0][K:], sel[1][K:])), "layers 0/1 select alike")


def test_glm_shared_reuse():
    """glm-dsa: shared layers 3, 4, 5 reuse layer 2's selection object; layer 6 selects anew; the indexer
    runs on full layers only; reusing is what the attention sees (re-running a shared layer with its
    previous full layer's selection reproduces the hidden state)."""
    m = glm()
    T, K = 300, 64
    toks = tokens(T, m, seed=7)
    tr: dict = {}
    _, sel = dsa_ref.forward(m, toks, top_k=K, trace=tr)
    check(sorted(tr["indexer_scores"]) == [0, 1, 2, 6], f"indexer ran on {sorted(tr['indexer_scores'])}")
    for il in (3, 4, 5):
        check(sel[il] is sel[2], f"layer {il} does not reuse layer 2")
    check(any(not np.array_equal(a, b) for a, b in zip(sel[6][K:], sel[2][K:])), "layer 6 reuses layer 2")
    # layer 4's attention with layer 2's mask, from layer 3's output, gives layer 4's output
    hp, pos = m.hp, np.arange(T)
    x = tr["hidden"][3]
    p = "blk.4."
    h = common.rms_norm(x, m.w(p + "attn_norm.weight"), hp.rms_eps)
    qr = common.rms_norm(common.linear(h, m.w(p + "attn_q_a.weight")), m.w(p + "attn_q_a_norm.weight"), hp.rms_eps)
    y = x + dsa_ref.mla_attention(m, 4, h, qr, pos, dsa_ref.selection_mask(sel[2], T))
    y = y + dsa_ref.ffn_block(m, 4, common.rms_norm(y, m.w(p + "ffn_norm.weight"), hp.rms_eps))
    check(np.array_equal(y, tr["hidden"][4]), "layer 4 did not attend layer 2's selection")


# ------------------------------------------------------------------------------------------------
# Independent loop implementations
# ------------------------------------------------------------------------------------------------

def _rope_vec(v: np.ndarray, pos: int, hp, mode: int) -> np.ndarray:
    """RoPE of one vector, pair by pair, written out from ggml's rope_yarn (not via common.rope)."""
    out = v.astype(np.float64).copy()
    n = hp.n_rot
    if hp.ext_factor != 0.0:
        def corr(n_rotations):
            return n * math.log(hp.n_ctx_orig / (n_rotations * 2 * math.pi)) / (2 * math.log(hp.freq_base))
        low = max(0.0, math.floor(corr(hp.beta_fast)))
        high = min(n - 1.0, math.ceil(corr(hp.beta_slow)))
    for i in range(n // 2):
        theta_e = pos * hp.freq_base ** (-2.0 * i / n)
        theta = hp.freq_scale * theta_e
        mag = hp.rope_attn_factor
        if hp.ext_factor != 0.0:
            ramp = 1.0 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))
            theta = theta * (1 - ramp * hp.ext_factor) + theta_e * ramp * hp.ext_factor
            mag *= 1.0 + 0.1 * math.log(1.0 / hp.freq_scale)
        a, b = (2 * i, 2 * i + 1) if mode == common.ROPE_NORM else (i, i + n // 2)
        x0, x1 = v[a], v[b]
        out[a] = (x0 * math.cos(theta) - x1 * math.sin(theta)) * mag
        out[b] = (x0 * math.sin(theta) + x1 * math.cos(theta)) * mag
    return out


def _indexer_loop(m: dsa_ref.DsaModel, il: int, x: np.ndarray, top_k: int):
    """Per-token, per-key, per-head lightning indexer of layer il on the layer input x; returns
    (scores [T, T] with nan above the diagonal, selections)."""
    hp, p = m.hp, f"blk.{il}."
    T, H, D, r = x.shape[0], hp.idx_n_head, hp.idx_head_dim, hp.n_rot
    mode = common.ROPE_NEOX if hp.arch == "deepseek32" else common.ROPE_NORM
    wq, wk, wp = m.w(p + "indexer.attn_q_b.weight"), m.w(p + "indexer.attn_k.weight"), m.w(p + "indexer.proj.weight")
    gamma, beta = m.w(p + "indexer.k_norm.weight"), m.w(p + "indexer.k_norm.bias")
    qs, ks, ws = [], [], []
    for t in range(T):
        xt = x[t]
        h = xt / math.sqrt(float(np.dot(xt, xt)) / len(xt) + hp.rms_eps) * m.w(p + "attn_norm.weight")
        a = m.w(p + "attn_q_a.weight") @ h
        qr = a / math.sqrt(float(np.dot(a, a)) / len(a) + hp.rms_eps) * m.w(p + "attn_q_a_norm.weight")
        qt = []
        for hh in range(H):
            qv = wq[hh * D:(hh + 1) * D] @ qr                       # [rope | nope]
            qt.append(np.concatenate([_rope_vec(qv[:r], t, hp, mode), qv[r:]]))
        kv = wk @ h
        mu = kv.mean()
        var = ((kv - mu) ** 2).mean()
        kv = (kv - mu) / math.sqrt(var + 1e-6) * gamma + beta
        ks.append(np.concatenate([_rope_vec(kv[:r], t, hp, mode), kv[r:]]))
        qs.append(qt)
        ws.append((wp @ h) / math.sqrt(D * H))
    score = np.full((T, T), np.nan)
    sel = []
    for t in range(T):
        for s in range(t + 1):
            acc = 0.0
            for hh in range(H):
                acc += ws[t][hh] * max(0.0, float(np.dot(qs[t][hh], ks[s])))
            score[t, s] = acc
        order = sorted(range(t + 1), key=lambda s: (-score[t, s], s))
        sel.append(sorted(order[:top_k]))
    return score, sel


def test_indexer_loop():
    """The vectorised indexer agrees with a loop over tokens, keys and heads (scores to 1e-12 relative,
    identical selections), for the half-split (deepseek32, with YaRN) and adjacent-pair (glm-dsa) RoPE.
    Also: ties go to the lower position, and the wrong RoPE layout changes the selection."""
    for m in (ds32(), glm()):
        T, K = 72, 12
        toks = tokens(T, m, seed=11)
        tr: dict = {}
        _, sel = dsa_ref.forward(m, toks, top_k=K, trace=tr)
        for il in (0, 1):
            x = m.tensors["token_embd.weight"][np.asarray(toks)] if il == 0 else tr["hidden"][0]
            score, lsel = _indexer_loop(m, il, x, K)
            vs = tr["indexer_scores"][il]
            low = np.tril(np.ones((T, T), dtype=bool))
            check(np.all(np.isneginf(vs[~low])), "future keys are not -inf")
            err = np.max(np.abs(vs[low] - score[low])) / np.max(np.abs(score[low]))
            check(err < 1e-12, f"{m.hp.arch} layer {il}: indexer scores differ by {err:.3g}")
            check(all(list(a) == b for a, b in zip(sel[il], lsel)), f"{m.hp.arch} layer {il}: selections differ")
    # ties: equal scores -> lower positions first
    score = np.array([[3.0, 1.0, 3.0, 1.0, 2.0, -np.inf]])
    check([list(s) for s in dsa_ref.select_top_k(score, 2)] == [[0, 2]], "tie 2")
    check([list(s) for s in dsa_ref.select_top_k(score, 4)] == [[0, 1, 2, 4]], "tie 4")
    check([list(s) for s in dsa_ref.select_top_k(np.zeros((1, 5)), 3)] == [[0, 1, 2]], "all tied")
    # the indexer RoPE layout matters (NEOX for deepseek32 vs NORM for glm-dsa)
    m = ds32()
    T, K = 200, 32
    toks = tokens(T, m, seed=3)
    _, a = dsa_ref.forward(m, toks, top_k=K)
    m.hp.arch = "glm-dsa"          # flips only idx_rope_mode
    try:
        _, b = dsa_ref.forward(m, toks, top_k=K)
    finally:
        m.hp.arch = "deepseek32"
    changed = np.mean([not np.array_equal(u, v) for u, v in zip(a[0][K:], b[0][K:])])
    check(changed > 0.5, f"the indexer RoPE layout changes only {changed:.0%} of the selections")


def _moe_loop(m: dsa_ref.DsaModel, il: int, h: np.ndarray) -> np.ndarray:
    """MoE FFN token by token, routing written out with python sorting."""
    hp, p = m.hp, f"blk.{il}."
    E, G = hp.n_expert, max(1, hp.n_expert_groups)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        lg = m.w(p + "ffn_gate_inp.weight") @ h[t]
        if hp.gating == 1:
            pr = np.exp(lg - lg.max()) / np.exp(lg - lg.max()).sum()
        elif hp.gating == 2:
            pr = 1 / (1 + np.exp(-lg))
        else:
            pr = lg.copy()
        b = m.w(p + "exp_probs_b.bias")
        s = pr + (b if b is not None else 0.0)
        allowed = set(range(E))
        if G > 1:
            per = E // G
            gs = [sum(sorted(s[g * per:(g + 1) * per], reverse=True)[:2]) for g in range(G)]
            keep = sorted(range(G), key=lambda g: (-gs[g], g))[:hp.n_group_used]
            allowed = {e for e in range(E) if e // per in keep}
        chosen = sorted(allowed, key=lambda e: (-s[e], e))[:hp.n_expert_used]
        wts = np.array([pr[e] for e in chosen])
        if hp.gating == 3:
            wts = np.exp(wts - wts.max()) / np.exp(wts - wts.max()).sum()
        if hp.expert_weights_norm:
            wts = wts / max(wts.sum(), 6.103515625e-5)
        if hp.expert_weights_scale not in (0.0, 1.0):
            wts = wts * hp.expert_weights_scale
        for e, wt in zip(chosen, wts):
            g = m.w(p + "ffn_gate_exps.weight")[e] @ h[t]
            u = m.w(p + "ffn_up_exps.weight")[e] @ h[t]
            out[t] += wt * (m.w(p + "ffn_down_exps.weight")[e] @ (g / (1 + np.exp(-g)) * u))
        g = m.w(p + "ffn_gate_shexp.weight") @ h[t]
        u = m.w(p + "ffn_up_shexp.weight") @ h[t]
        out[t] += m.w(p + "ffn_down_shexp.weight") @ (g / (1 + np.exp(-g)) * u)
    return out


def test_moe_loop():
    """Vectorised MoE routing (groups, bias for the choice only, norm, scale, gating funcs 1/2/3) equals a
    per-token loop; group-limited routing really restricts the choice."""
    rng = np.random.default_rng(4)
    variants = [("moe-sigmoid-groups", mf.default_config("deepseek32", n_layer=2)),
                ("moe-softmax", mf.default_config("deepseek32", n_layer=2, gating=1, n_expert_groups=1,
                                                   n_group_used=1, expert_weights_norm=False)),
                ("moe-softmax-weight", mf.default_config("glm-dsa", n_layer=2, gating=3,
                                                         expert_weights_scale=1.0))]
    for name, cfg in variants:
        m = fixture(name, cfg)
        h = rng.standard_normal((64, m.hp.n_embd))
        a = dsa_ref.ffn_block(m, 1, h)
        b = _moe_loop(m, 1, h)
        check(np.max(np.abs(a - b)) < 1e-12 * np.max(np.abs(b)), f"{name}: MoE differs from the loop")
    m = fixture("moe-sigmoid-groups", variants[0][1])
    h = rng.standard_normal((256, m.hp.n_embd))
    experts, w = dsa_ref.moe_route(m, 1, h)
    per = m.hp.n_expert // m.hp.n_expert_groups
    check(all(len({e // per for e in row}) <= m.hp.n_group_used for row in experts), "group limit violated")
    check(np.allclose(w.sum(-1), m.hp.expert_weights_scale), "normalised weights times scale")


# ------------------------------------------------------------------------------------------------
# Fixture quality and CLI
# ------------------------------------------------------------------------------------------------

def test_fixture_not_uniform():
    """The generator's models are far from uniform: mean next-token entropy <= log(n_vocab) / 2, and the
    attention is concentrated (mean entropy well below that of a uniform distribution over the visible
    keys) on both architectures."""
    for m in (ds32(), glm()):
        toks = tokens(300, m, seed=9)
        tr: dict = {}
        logits, _ = dsa_ref.forward(m, toks, top_k=64, trace=tr)
        lp = common.log_softmax(logits)
        ent = float(np.mean(-(np.exp(lp) * lp).sum(-1)))
        half = 0.5 * math.log(m.hp.n_vocab)
        check(ent <= half, f"{m.hp.arch}: mean next-token entropy {ent:.3f} > {half:.3f}")
        for il, P in tr["attn_probs"].items():
            e = -(P * np.log(np.clip(P, 1e-300, 1.0))).sum(-1)[:, 16:]           # [heads, T-16]
            uniform = np.log(np.minimum(np.arange(17, 301), 64))                  # sparse rows see <= 64 keys
            rel = float(np.mean(e / uniform))
            check(rel < 0.7, f"{m.hp.arch} layer {il}: attention nearly uniform (relative entropy {rel:.2f})")
        print(f"    {m.hp.arch}: next-token entropy {ent:.3f} (limit {half:.3f})")


def test_cli():
    """dsa_ref.py CLI: last-position logits [n_vocab] and the selection JSON; make_dsa_fixture.py CLI."""
    path = os.path.join(TMP, "cli.gguf")
    ids = os.path.join(TMP, "ids.txt")
    check(mf.main(["--arch", "glm-dsa", "--out", path, "--seed", "5", "--top-k", "48", "--tokens-out", ids,
                   "--n-tokens", "120"]) == 0, "make_dsa_fixture CLI")
    m = dsa_ref.DsaModel(path)
    check(m.hp.idx_top_k == 48 and m.hp.arch == "glm-dsa", "CLI fixture metadata")
    toks = dsa_ref.read_tokens_file(ids)
    check(len(toks) == 120, "tokens file")
    out, js = os.path.join(TMP, "logits.npy"), os.path.join(TMP, "sel.json")
    check(dsa_ref.main(["--model", path, "--tokens-file", ids, "--out", out, "--selection-out", js]) == 0, "CLI")
    logits = np.load(out)
    ref, sel = dsa_ref.forward(m, toks)
    check(logits.shape == (m.hp.n_vocab,) and np.array_equal(logits, ref[-1]), "CLI logits")
    with open(js, encoding="utf-8") as fh:
        doc = json.load(fh)
    check(doc["top_k"] == 48 and len(doc["layers"]) == m.hp.n_layer, "JSON header")
    for L in doc["layers"]:
        il = L["layer"]
        check(L["indexer"] == ("full" if m.hp.idx_full[il] else "shared") and not L["dense"], "JSON layer")
        check([q["pos"] for q in L["queries"]] == list(range(104, 120)), "JSON positions")
        for q in L["queries"]:
            check(q["keys"] == [int(v) for v in sel[il][q["pos"]]] and len(q["keys"]) == 48, "JSON keys")
    # --dense and --top-k
    check(dsa_ref.main(["--model", path, "--tokens-file", ids, "--dense", "--out", out, "--selection-out", js]) == 0,
          "CLI dense")
    with open(js, encoding="utf-8") as fh:
        doc = json.load(fh)
    check(all(L["dense"] and L["queries"][-1]["keys"] == list(range(120)) for L in doc["layers"]), "dense JSON")
    check(np.array_equal(np.load(out), dsa_ref.forward(m, toks, dsa=False)[0][-1]), "dense logits")
    check(dsa_ref.main(["--model", path, "--tokens-file", ids, "--top-k", "200", "--out", out]) == 0, "CLI top-k")
    check(np.array_equal(np.load(out), dsa_ref.forward(m, toks, dsa=False)[0][-1]), "top-k >= T is dense")
    # header check of the file the C++ side will also read
    f = GGUFReader(path)
    check(f.get("glm-dsa.attention.indexer.types") == [True, True, True, False, False, False, True], "types")


def run(name, fn):
    t0 = time.perf_counter()
    try:
        fn()
    except Exception:  # noqa: BLE001
        print(f"FAIL {name}")
        traceback.print_exc()
        return False
    print(f"ok   {name} ({time.perf_counter() - t0:.2f} s)")
    return True


def main() -> int:
    ok = True
    for name, fn in (("metadata and tensor layout", test_metadata),
                     ("YaRN scales (MODELS 2.1d)", test_yarn_scales),
                     ("MTP skipped, legacy attn_kv_b", test_mtp_and_legacy_kv_b),
                     ("glm-dsa indexer types rules", test_indexer_types_rules),
                     ("absorbed vs naive MLA", test_absorbed_vs_naive),
                     ("dense when all keys fit", test_dense_when_all_keys_fit),
                     ("selection active at T=300, top_k=64", test_selection_active),
                     ("glm-dsa shared layers reuse", test_glm_shared_reuse),
                     ("indexer vs loop implementation", test_indexer_loop),
                     ("MoE vs loop implementation", test_moe_loop),
                     ("fixture far from uniform", test_fixture_not_uniform),
                     ("CLI", test_cli)):
        ok &= run(name, fn)
    print("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
