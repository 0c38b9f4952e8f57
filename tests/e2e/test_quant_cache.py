"""Quantised caches from the command line: -ctk / --indexer-cache-type q8_0 and q4_0 run (run and
perplexity, selection active), the start-up line names the types, the rotation and a smaller size than
f16, --cache-rotation off is honoured, rows that are not whole 32-blocks are refused with the reason, and
make-model refuses impossible outlier settings."""
import math
import os
import re

import harness

checks = harness.Checks()
tmp = harness.temp_dir()

# Latent 64 + 32 and indexer keys 64 wide: whole 32-blocks.
ds = os.path.join(tmp, "ds.gguf")
harness.run(["make-model", "--arch", "deepseek32", "-o", ds, "--kv-lora-rank", 64, "--n-rot", 32,
             "--indexer-head-dim", 64, "--outlier-channels", 2, "--outlier-scale", 25])


def cache_line(stderr):
    m = re.search(r"KV cache (\d+) cells: ([0-9.]+) MiB \(([^)]*)\)", stderr)
    return (float(m.group(2)), m.group(3)) if m else (math.nan, "")


sizes = {}
for t in ("f16", "q8_0", "q4_0"):
    out = harness.run(["run", "-m", ds, "-p", "hello there", "-n", 4, "--temp", 0, "-c", 256, "-ctk", t,
                       "--indexer-cache-type", t])
    mib, types = cache_line(out.stderr)
    sizes[t] = mib
    rot = "" if t == "f16" else " rotated"
    checks.check(types == f"latent {t}{rot}, indexer {t}{rot}", f"-ctk {t}: start-up line says {types!r}")
checks.check(sizes["q4_0"] < sizes["q8_0"] < sizes["f16"], f"cache sizes shrink with the type: {sizes}")

out = harness.run(["run", "-m", ds, "-p", "hello", "-n", 2, "-c", 256, "-ctk", "q4_0", "--cache-rotation", "off"])
checks.check(cache_line(out.stderr)[1] == "latent q4_0, indexer f16", "--cache-rotation off: nothing rotated")
out = harness.run(["run", "-m", ds, "-p", "hello", "-n", 2, "-c", 256, "--cache-rotation", "on"])
checks.check(cache_line(out.stderr)[1] == "latent f16 rotated, indexer f16 rotated", "--cache-rotation on: all rotated")

# Perplexity with quantised caches and selection active (-c 128 > top-k 64): finite.
text = os.path.join(tmp, "text.txt")
with open(text, "w") as f:
    f.write(" ".join(["the bird sang a song and flew over the house"] * 120))
for t in ("q8_0", "q4_0"):
    out = harness.run(["perplexity", "-m", ds, "-f", text, "-c", 128, "--chunks", 2, "-ctk", t,
                       "--indexer-cache-type", t])
    m = re.search(r"PPL = ([0-9.einf]+)", out.stdout)
    ppl = float(m.group(1)) if m else math.nan
    checks.check(math.isfinite(ppl) and ppl > 1, f"perplexity with {t} caches: {ppl}")

# Rows that are not whole blocks: the default tiny deepseek32 (latent 32 + 16) and llama (head size 16).
small = os.path.join(tmp, "small.gguf")
harness.run(["make-model", "--arch", "deepseek32", "-o", small])
harness.expect_error(checks, ["run", "-m", small, "-p", "x", "-ctk", "q8_0"], "multiple of 32",
                     "q8_0 latent of width 48")
llama = os.path.join(tmp, "llama.gguf")
harness.run(["make-model", "--arch", "llama", "-o", llama])
harness.expect_error(checks, ["run", "-m", llama, "-p", "x", "-ctv", "q4_0"], "multiple of 32", "q4_0 V, head size 16")
harness.expect_error(checks, ["run", "-m", llama, "-p", "x", "-ctk", "q5_0"], "q5_0", "unknown cache type")
harness.expect_error(checks, ["make-model", "--arch", "deepseek32", "-o", os.path.join(tmp, "bad.gguf"),
                              "--outlier-channels", 40], "outlier", "more outlier channels than non-RoPE key dims")
checks.finish()
