"""Quantised weights on a deepseek32 model: every weight type loads and runs; sparrow's run of a quantised
file agrees with the float64 reference evaluated on the same (dequantised) weights within the error of
Q8_0 activation quantisation; and the KL divergence of each type against the f32 file (same seed, so the
quantised file is exactly the f32 weights quantised) is measured and printed."""
import os

import numpy as np

import harness
import dsa_ref

checks = harness.Checks()
tmp = harness.temp_dir()
rng = np.random.default_rng(2)


log_softmax, kl = harness.log_softmax, harness.kl


def sparrow_logits(model, ids, tag):
    ids_path, out = os.path.join(tmp, f"ids-{tag}.txt"), os.path.join(tmp, f"l-{tag}.npy")
    harness.write_ids(ids_path, ids)
    harness.run(["run", "-m", model, "--prompt-ids", ids_path, "-n", 0, "--dump-logits", out, "-ctk", "f32",
                 "--indexer-cache-type", "f32"])
    return log_softmax(np.load(out))


types = ["f32", "f16", "bf16", "q8_0", "q4_0"]
paths = {}
for t in types:
    paths[t] = os.path.join(tmp, f"ds-{t}.gguf")
    harness.run(["make-model", "--arch", "deepseek32", "--type", t, "--seed", 5, "-o", paths[t]])

prompts = [rng.integers(0, 512, size=n) for n in (40, 40, 100, 100)]
vs_f32 = {t: [] for t in types[1:]}
vs_ref = {t: [] for t in types}
for i, ids in enumerate(prompts):
    base = sparrow_logits(paths["f32"], ids, f"f32-{i}")
    for t in types:
        got = base if t == "f32" else sparrow_logits(paths[t], ids, f"{t}-{i}")
        if t != "f32":
            vs_f32[t].append(kl(base, got))
        if len(ids) <= 64:  # the reference of a dense prompt: no selection near-ties to worry about
            want, _ = dsa_ref.forward(dsa_ref.DsaModel(paths[t]), ids)
            vs_ref[t].append(kl(log_softmax(want[-1]), got))

for t in types[1:]:
    print(f"KL(f32 || {t}) over {len(prompts)} prompts: mean {np.mean(vs_f32[t]):.4g}, max {np.max(vs_f32[t]):.4g}")
# Against the reference on the same weights, only activation rounding remains: f32/f16/bf16 weights keep
# f32 activations; q8_0/q4_0 quantise activations to Q8_0 as ggml does.
bounds = {"f32": 1e-8, "f16": 1e-6, "bf16": 1e-6, "q8_0": 0.1, "q4_0": 0.1}
for t in types:
    m = float(np.mean(vs_ref[t]))
    checks.check(np.isfinite(m) and m < bounds[t], f"{t}: mean KL(reference || sparrow) on the same weights {m:.3g} < {bounds[t]:g}")
checks.finish()
