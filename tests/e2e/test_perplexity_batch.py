"""`sparrow perplexity` does not depend on -b: with -b = -c each chunk runs alone, with larger -b several
chunks run side by side as sequences of one batch (split into ubatches that mix sequences). The kernels sum
in the same order whatever the tile or batch, so every logit is the same float either way: the printed
PPL must be identical, digit for digit, and a KL base saved at -b = -c compared with a batched run must give
KL exactly 0 (printed with %g, so any difference shows) and 100% same top token (which checks the top-32 log-probabilities of every scored position,
bit for bit, not just the 4 printed decimals). Checked on llama and on deepseek32 with the lightning
indexer's selection active (top-k 64 < -c 256)."""
import os
import re

import numpy as np

import harness

checks = harness.Checks()
tmp = harness.temp_dir()

text = os.path.join(tmp, "text.txt")
harness.write_word_text(text, np.random.default_rng(3), 4000)

llama = os.path.join(tmp, "llama.gguf")
harness.run(["make-model", "--arch", "llama", "--type", "q4_0", "-o", llama])
ds = os.path.join(tmp, "ds.gguf")
harness.run(["make-model", "--arch", "deepseek32", "--top-k", 64, "-o", ds])

PPL = re.compile(r"PPL = (\S+) \+/- (\S+)")
KL = re.compile(r"KL divergence vs .* mean KL (\S+) \+/- (\S+), 99% KL (\S+), same top (\S+)%")

# (model, -c, chunks, -b values: alone, 4 chunks per batch, and an odd value that fits 3 or 2)
CASES = [(llama, 64, 9, [64, 256, 200]), (ds, 256, 5, [256, 1024, 700])]
for model, n_ctx, n_chunks, batches in CASES:
    name = os.path.basename(model)
    base = os.path.join(tmp, f"{name}.kld")
    common = ["perplexity", "-m", model, "-f", text, "-c", n_ctx, "--chunks", n_chunks, "-t", 2]
    results = {}
    for b in batches:
        extra = ["--kl-divergence-base", base] if b == n_ctx else ["--kl-divergence", base]
        out = harness.run(common + ["-b", b] + extra)
        if model == ds and b == n_ctx:
            checks.check("sparse attention: on" in out.stderr, f"{name}: the indexer's selection is on")
        m = PPL.search(out.stdout)
        results[b] = m.groups() if m else None
        if b != n_ctx:
            k = KL.search(out.stdout)
            ok = k is not None and float(k.group(1)) == 0.0 and float(k.group(3)) == 0.0 and k.group(4) == "100.00"
            checks.check(ok, f"{name}: -b {b} against -b {n_ctx}: KL exactly 0, 100% same top token "
                             f"({k.group(0) if k else out.stdout.strip()[-300:]})")
    checks.check(results[batches[0]] is not None, f"{name}: PPL printed ({results[batches[0]]})")
    for b in batches[1:]:
        checks.check(results[b] == results[batches[0]],
                     f"{name}: -c {n_ctx}, -b {b} gives the same PPL as -b {batches[0]}: {results[b]} vs {results[batches[0]]}")
checks.finish()
