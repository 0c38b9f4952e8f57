"""`sparrow make-model --arch deepseek32|glm-dsa`: the files load in the numpy reference
(tests/reference/dsa_ref.py), carry the same metadata keys (with the same GGUF value types) and tensor
names/dims as the reference's own fixture writer (make_dsa_fixture.py) for the same sizes, print in
`sparrow inspect`, and are far from uniform: mean next-token entropy at most half of log(n_vocab),
attention and lightning-indexer scores spread out (checked on ~40-token prompts with a small top-k so
that the sparse path runs)."""
import math
import os
import subprocess
import sys

import numpy as np

import harness

try:
    import dsa_ref
    import make_dsa_fixture
    from gguf import GGUFReader
except ImportError as e:  # the numpy reference needs Debian's python3-numpy
    print(f"skip: the numpy reference does not import: {e}")
    sys.exit(harness.SKIP)

checks = harness.Checks()
tmp = harness.temp_dir()
N_TOKENS, SPARSE_TOP_K = 40, 16

# (name, make-model flags, fixture overrides for the same model)
TINY = dict(n_vocab=512, n_embd=64, n_head=4, q_lora_rank=32, kv_lora_rank=32, head_nope=32, n_rot=16,
            head_v=32, n_ff=96, n_ff_exp=32, n_expert=8, n_expert_used=2, n_expert_shared=1,
            idx_n_head=8, idx_head_dim=32, idx_top_k=64, context_length=4096, gating=2,
            expert_weights_norm=True, expert_weights_scale=2.5, n_dense_lead=1, probs_bias=True)
DS = dict(TINY, n_expert_groups=4, n_group_used=2, rms_eps=1e-6, yarn=False)
GLM = dict(TINY, n_expert_groups=1, n_group_used=1, rms_eps=1e-5, yarn=False)
CONFIGS = [
    ("deepseek32", ["--nextn", 1], dict(DS, n_layer=4, n_nextn=1)),
    ("deepseek32", ["--yarn", "--type", "q8_0"],
     dict(DS, n_layer=4, n_nextn=0, yarn=True, yarn_factor=4.0, yarn_orig_ctx=1024)),
    ("deepseek32", ["--type", "q4_0", "--n-layer", 3, "--gating", 1, "--no-probs-bias"],
     dict(DS, n_layer=3, n_nextn=0, gating=1, probs_bias=False)),
    ("glm-dsa", ["--nextn", 1], dict(GLM, n_layer=4, n_nextn=1, indexer_types=[1, 1, 1, 0])),
    ("glm-dsa", ["--indexer-types", "absent", "--type", "bf16"], dict(GLM, n_layer=4, n_nextn=0, indexer_types=None)),
    ("glm-dsa", ["--n-layer", 7, "--indexer-types", "1,1,0,1,0,0,1", "--type", "q8_0"],
     dict(GLM, n_layer=7, n_nextn=0, indexer_types=[1, 1, 0, 1, 0, 0, 1])),
]
OWN_KEYS = ("general.file_type", "general.quantization_version")   # written by llama.cpp too, not the fixture


def compare_with_fixture(path, arch, overrides, what):
    """Same metadata keys / value types / values and tensor names / dims as make_dsa_fixture for the
    same configuration (tensor types are the model's; the fixture only writes float ones)."""
    cfg = make_dsa_fixture.default_config(arch, **overrides)
    md, tensors = make_dsa_fixture.build_fixture(cfg)
    r = GGUFReader(path)
    ours = {k for k in r.metadata if not k.startswith("tokenizer.") and k not in OWN_KEYS}
    missing, extra = sorted(set(md) - ours), sorted(ours - set(md))
    checks.check(not missing and not extra, f"{what}: metadata keys as the fixture's (missing {missing}, extra {extra})")
    bad = []
    for k, (vtype, value) in md.items():
        if k not in r.metadata or k == "general.name":
            continue
        if r.metadata_types[k] != vtype:
            bad.append(f"{k} type {r.metadata_types[k]} != {vtype}")
        elif isinstance(value, float):
            if not math.isclose(r.metadata[k], value, rel_tol=1e-6):
                bad.append(f"{k} = {r.metadata[k]} != {value}")
        elif r.metadata[k] != value:
            bad.append(f"{k} = {r.metadata[k]!r} != {value!r}")
    checks.check(not bad, f"{what}: metadata types and values as the fixture's {bad[:4]}")
    want = {name: tuple(reversed(arr.shape)) for name, (_, arr) in tensors.items()}
    got = {name: tuple(info.dims) for name, info in r.tensors.items()}
    checks.check(set(got) == set(want),
                 f"{what}: tensor names as the fixture's (missing {sorted(set(want) - set(got))[:4]}, "
                 f"extra {sorted(set(got) - set(want))[:4]})")
    dims = [n for n in want if n in got and got[n] != want[n]]
    checks.check(not dims, f"{what}: tensor dims as the fixture's {[(n, got[n], want[n]) for n in dims[:3]]}")
    f32_only = [n for n, info in r.tensors.items()
                if any(s in n for s in ("norm", "ffn_gate_inp", "indexer.proj", "exp_probs_b"))
                and info.ggml_type != 0]
    checks.check(not f32_only, f"{what}: norms, ffn_gate_inp, indexer.proj, exp_probs_b stay f32 {f32_only[:3]}")


def spread_checks(model, tokens, what):
    """Entropy of the next-token distributions, attention and indexer score spread (float64 reference)."""
    trace = {}
    logits, _ = dsa_ref.forward(model, tokens, top_k=SPARSE_TOP_K, trace=trace)
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    ent = float(-(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1).mean())
    half = 0.5 * math.log(model.hp.n_vocab)
    checks.check(ent <= half, f"{what}: mean next-token entropy {ent:.3f} <= {half:.3f} (half of log n_vocab)")
    # Attention: entropy of each head's probabilities over the attended keys, relative to uniform over them.
    worst_attn = 0.0
    for il, probs in trace["attn_probs"].items():
        rel = []
        for t in range(8, len(tokens)):
            row = probs[:, t, :t + 1]
            n_att = np.count_nonzero(row > 0, axis=-1)
            h = -(row * np.log(np.maximum(row, 1e-300))).sum(axis=-1)
            rel.append(np.mean(h / np.log(np.maximum(n_att, 2))))
        worst_attn = max(worst_attn, float(np.mean(rel)))
    checks.check(worst_attn < 0.85, f"{what}: attention far from uniform (worst layer's relative entropy "
                                    f"{worst_attn:.3f} < 0.85)")
    # Indexer: per-query spread of the scores of visible keys, and (almost) no ties at the top-k cut.
    spreads, ties, n = [], 0, 0
    for il, score in trace["indexer_scores"].items():
        for t in range(SPARSE_TOP_K, len(tokens)):
            row = score[t, :t + 1]
            spreads.append(row.std() / max(np.abs(row).mean(), 1e-30))
            s = np.sort(row)[::-1]
            ties += int(s[SPARSE_TOP_K - 1] == s[SPARSE_TOP_K])
            n += 1
    spread = float(np.mean(spreads))
    checks.check(spread > 0.3, f"{what}: indexer scores spread out (mean std/mean|I| {spread:.3f} > 0.3)")
    checks.check(ties <= 0.05 * n, f"{what}: ties at the indexer's top-k cut in {ties} of {n} queries")
    return ent


rng = np.random.default_rng(5)
for i, (arch, flags, overrides) in enumerate(CONFIGS):
    what = f"{arch} {' '.join(map(str, flags))}"
    path = os.path.join(tmp, f"m{i}.gguf")
    harness.run(["make-model", "--arch", arch, "-o", path, *flags])
    out = harness.run(["inspect", path]).stdout
    checks.check(arch in out and "blk.1.ffn_gate_exps.weight" in out and "indexer.attn_q_b" in out,
                 f"{what}: sparrow inspect prints the model")
    compare_with_fixture(path, arch, overrides, what)
    try:
        model = dsa_ref.DsaModel(path)
    except Exception as e:  # noqa: BLE001
        checks.check(False, f"{what}: the reference loads the file ({e})")
        continue
    checks.check(True, f"{what}: the reference loads the file")
    tokens = rng.integers(0, 510, size=N_TOKENS)
    ent = spread_checks(model, tokens, what)
    print(f"  {what}: entropy {ent:.3f} of log n_vocab {math.log(model.hp.n_vocab):.3f}")

# The reference's CLI on one written file (logits file of the right size).
ids = os.path.join(tmp, "ids.txt")
harness.write_ids(ids, rng.integers(0, 510, size=N_TOKENS))
npy = os.path.join(tmp, "l.npy")
proc = subprocess.run([sys.executable, os.path.join(harness.REPO, "tests", "reference", "dsa_ref.py"), "--model",
                       os.path.join(tmp, "m3.gguf"), "--tokens-file", ids, "--top-k", str(SPARSE_TOP_K), "--out", npy],
                      capture_output=True, text=True)
checks.check(proc.returncode == 0 and np.load(npy).shape == (512,), f"dsa_ref.py CLI runs on a glm-dsa file {proc.stderr[-300:]}")

# Refusals.
for arch, flags, why in [("glm-dsa", ["--yarn"], "glm-dsa has no YaRN"),
                         ("glm-dsa", ["--indexer-types", "1,1,0"], "indexer types of the wrong length"),
                         ("glm-dsa", ["--indexer-types", "0,1,1,1"], "layer 0 shared"),
                         ("deepseek32", ["--indexer-types", "1,1,1,1"], "indexer types on deepseek32"),
                         ("deepseek32", ["--expert-groups", 3], "8 experts in 3 groups"),
                         ("llama", ["--preset", "bench"], "bench preset for llama")]:
    proc = harness.run(["make-model", "--arch", arch, "-o", os.path.join(tmp, "bad.gguf"), *flags], check=False)
    checks.check(proc.returncode != 0 and proc.stderr.strip() != "",
                 f"refused: {why} ({proc.stderr.strip()[:120]})")

checks.finish()
