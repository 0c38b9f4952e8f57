"""deepseek32 and glm-dsa end to end against the numpy float64 reference (tests/reference/dsa_ref.py), on tiny
models written by `sparrow make-model` with top-k 64:
- final logits agree to a relative error below 1e-4 for prompts of 40 tokens (every key selected) and 300
  tokens (selection active), and the per-layer selections of the last 16 queries have a mean Jaccard of at
  least 0.99 with the reference's;
- below top-k, logits are bit-identical with --dsa on and --dsa off;
- one batch, several ubatches and token by token give the same logits and selections;
- GLM IndexShare (shared layers without indexer tensors reuse the full layer's selection), MTP layers skipped;
- linear RoPE scaling (a factor without a type key, with the log multiplier) against the reference at 40 tokens.
"""
import json
import os

import numpy as np

import harness
import dsa_ref
import gguf  # tests/reference, on the path harness sets, as dsa_ref

checks = harness.Checks()
tmp = harness.temp_dir()
rng = np.random.default_rng(11)

EXACT = ["-ctk", "f32", "--indexer-cache-type", "f32", "--indexer-precision", "exact", "-c", 512]


def sparrow_eval(model, ids, extra=(), tag="x"):
    ids_path = os.path.join(tmp, f"ids-{tag}.txt")
    logits = os.path.join(tmp, f"logits-{tag}.npy")
    sel = os.path.join(tmp, f"sel-{tag}.json")
    harness.write_ids(ids_path, ids)
    harness.run(["run", "-m", model, "--prompt-ids", ids_path, "-n", 0, "--dump-logits", logits,
                 "--dump-selection", sel, *EXACT, *extra])
    with open(sel) as f:
        selection = json.load(f)
    return np.load(logits).astype(np.float64), selection


def jaccard(a, b):
    a, b = set(a), set(b)
    return len(a & b) / max(1, len(a | b))


def min_cut_gap(trace, top_k):
    """Smallest gap, over layers and queries, between the top_k-th and the next best reference score,
    relative to the query's largest |score|. Exact ties of zeros (every head's ReLU at 0) are not near-ties:
    both engines compute them as exactly 0 and break them by position."""
    gap = np.inf
    for scores in trace.get("indexer_scores", {}).values():
        for p in range(top_k, scores.shape[0]):
            row = np.sort(scores[p, : p + 1])[::-1]
            if row[top_k - 1] == 0.0 and row[top_k] == 0.0:
                continue
            gap = min(gap, (row[top_k - 1] - row[top_k]) / max(np.abs(row).max(), 1e-30))
    return gap


def compare_with_reference(model_path, n_tokens, what):
    # float32 and float64 can order two keys differently only when their scores are nearly equal; such a
    # flip early in the prompt changes later hidden states, so prompts with a near-tie at a cut (relative
    # gap below 1e-6, in any layer) are redrawn: the comparison is about the math, not about rounding.
    model = dsa_ref.DsaModel(model_path)
    for attempt in range(8):
        ids = rng.integers(0, 512, size=n_tokens)
        trace = {}
        want, ref_sel = dsa_ref.forward(model, np.asarray(ids), trace=trace)
        gap = min_cut_gap(trace, 64)
        if gap > 1e-6:
            break
        print(f"note: {what}: prompt {attempt} has a near-tie at a top-k cut (relative gap {gap:.1e}); redrawn")
    got, sel = sparrow_eval(model_path, ids, tag=what.replace(" ", "_"))
    err = harness.rel_error(got, want[-1])
    checks.check(err < 1e-4, f"{what}: logits relative error {err:.2e} < 1e-4")
    scores = []
    for layer in sel["layers"]:
        il = layer["layer"]
        for q in layer["queries"]:
            ref_keys = list(range(q["pos"] + 1)) if ref_sel[il] is None else ref_sel[il][q["pos"]]
            scores.append(jaccard(q["keys"], ref_keys))
    mean = float(np.mean(scores)) if scores else 0.0
    checks.check(mean >= 0.99, f"{what}: mean Jaccard of selections {mean:.4f} >= 0.99 ({len(scores)} queries)")
    return ids, got, sel


configs = [
    ("deepseek32", ["--arch", "deepseek32", "--top-k", 64]),
    ("deepseek32-yarn-mtp", ["--arch", "deepseek32", "--top-k", 64, "--yarn", "--nextn", 1]),
    ("glm-dsa-indexshare", ["--arch", "glm-dsa", "--top-k", 64, "--n-layer", 5, "--indexer-types", "1,1,0,0,1"]),
]
for name, args in configs:
    path = os.path.join(tmp, f"{name}.gguf")
    harness.run(["make-model", "-o", path, *args])
    compare_with_reference(path, 40, f"{name} 40 tokens")
    ids, logits_300, sel_300 = compare_with_reference(path, 300, f"{name} 300 tokens")
    active = [layer for layer in sel_300["layers"] if not layer["dense"]]
    checks.check(len(active) == len(sel_300["layers"]) and all(len(q["keys"]) == 64 for l in active for q in l["queries"]),
                 f"{name}: at 300 tokens every layer selects exactly 64 keys")

    # Same logits and selections whatever the batching.
    # --dump-selection shows the prompt's last 16 queries however the prompt is split (it showed the last
    # ubatch's or decode call's alone).
    for extra, label in [(["-ub", 7], "ubatches of 7"), (["-b", 5], "calls of 5"),
                         (["-b", 1, "-ub", 1], "token by token")]:
        got, sel = sparrow_eval(path, ids, extra, tag=f"{name}-{label.replace(' ', '_')}")
        err = harness.rel_error(got, logits_300)
        same = sel == sel_300 and all(len(l["queries"]) == 16 for l in sel["layers"])
        checks.check(err < 1e-5 and same, f"{name}: {label} equals one batch (rel {err:.1e}, same 16 selections {same})")

    # Below top-k, the indexer changes nothing: bit-identical logits with it on and off.
    short = rng.integers(0, 512, size=50)
    on, _ = sparrow_eval(path, short, ["--dsa", "on"], tag=f"{name}-on")
    off, _ = sparrow_eval(path, short, ["--dsa", "off"], tag=f"{name}-off")
    checks.check(np.array_equal(on, off), f"{name}: 50 tokens (< top-k) bit-identical with --dsa on and off")

    # Dense mode above top-k equals the reference's dense run.
    dense, _ = sparrow_eval(path, ids, ["--dsa", "off"], tag=f"{name}-dense300")
    want_dense, _ = dsa_ref.forward(dsa_ref.DsaModel(path), np.asarray(ids), dsa=False)
    err = harness.rel_error(dense, want_dense[-1])
    checks.check(err < 1e-4, f"{name}: --dsa off at 300 tokens equals dense reference (rel {err:.1e})")
    checks.check(harness.rel_error(dense, logits_300) > 1e-4, f"{name}: the selection changes the logits at 300 tokens")

# Linear RoPE scaling as llama.cpp reads it: no rope.scaling.type key (linear), factor 4, and the log multiplier,
# which the attention scale's mscale takes whatever the type (a file of the deepseek32 config, keys added).
src = gguf.GGUFReader(os.path.join(tmp, "deepseek32.gguf"))
md = {k: (src.metadata_types[k], v) for k, v in src.metadata.items()}
md["deepseek32.rope.scaling.factor"] = (gguf.GGUFValueType.FLOAT32, 4.0)
md["deepseek32.rope.scaling.yarn_log_multiplier"] = (gguf.GGUFValueType.FLOAT32, 0.1)
assert all(info.ggml_type == gguf.GGMLType.F32 for info in src.tensors.values()), "make-model's default is f32"
tensors = {name: (gguf.GGMLType.F32, src.tensor(name)) for name in src.tensors}
linear_path = os.path.join(tmp, "deepseek32-linear-rope.gguf")
gguf.write_gguf(linear_path, md, tensors)
compare_with_reference(linear_path, 40, "deepseek32 linear rope 40 tokens")
base, _ = sparrow_eval(os.path.join(tmp, "deepseek32.gguf"), np.arange(40), tag="rope-base")
scaled, _ = sparrow_eval(linear_path, np.arange(40), tag="rope-linear")
checks.check(harness.rel_error(scaled, base) > 1e-3, "deepseek32: linear rope scaling changes the logits")

# glm-dsa shared layers reuse the full layer's selection.
path = os.path.join(tmp, "glm-dsa-indexshare.gguf")
_, sel = sparrow_eval(path, rng.integers(0, 512, size=200), tag="glm-share")
layers = sel["layers"]
checks.check(layers[2]["queries"] == layers[1]["queries"] and layers[3]["queries"] == layers[1]["queries"],
             "glm-dsa: shared layers 2 and 3 attend exactly layer 1's selection")

checks.finish()
