"""--indexer-precision fast (int8 products, two-stage selection) keeps exact mode's selections on the test
models: over the last 16 queries of a 300-token prompt (top-k 64, so every layer selects), the per-layer
selected sets have a mean Jaccard of at least 0.98 with exact mode, for deepseek32 and glm-dsa, with f16
and f32 indexer caches, and on models with outlier channels. The default, auto, is fast mode where the CPU
runs 8-bit queries (VNNI), else exact mode. `sparrow bench` runs both precisions and prints --dsa-stats for
each."""
import json
import os
import re

import numpy as np

import harness

checks = harness.Checks()
tmp = harness.temp_dir()
rng = np.random.default_rng(5)


def selections(model, ids_path, precision, cache, tag):
    sel = os.path.join(tmp, f"sel-{tag}-{precision}.json")
    harness.run(["run", "-m", model, "--prompt-ids", ids_path, "-n", 0, "-c", 512, "--indexer-cache-type", cache,
                 "--indexer-precision", precision, "--dump-selection", sel])
    with open(sel) as f:
        return json.load(f)["layers"]


def jaccard(a, b):
    a, b = set(a), set(b)
    return len(a & b) / max(1, len(a | b))


def check_jaccard(exact, fast, what):
    """Mean Jaccard of the selecting layers' per-query sets of two runs must be >= 0.98."""
    scores = [jaccard(qe["keys"], qf["keys"]) for le, lf in zip(exact, fast) if not le["dense"]
              for qe, qf in zip(le["queries"], lf["queries"])]
    mean = float(np.mean(scores)) if scores else 0.0
    checks.check(len(scores) > 0 and mean >= 0.98,
                 f"{what}: fast vs exact mean Jaccard {mean:.4f} over {len(scores)} selections (>= 0.98)")


configs = [
    ("deepseek32", ["--arch", "deepseek32", "--top-k", 64, "--indexer-heads", 32, "--indexer-head-dim", 64]),
    ("glm-dsa", ["--arch", "glm-dsa", "--top-k", 64, "--n-layer", 4, "--indexer-types", "1,1,0,1"]),
]
for name, args in configs:
    path = os.path.join(tmp, f"{name}.gguf")
    harness.run(["make-model", "-o", path, *args])
    for cache in ("f16", "f32"):
        ids_path = os.path.join(tmp, f"ids-{name}-{cache}.txt")
        harness.write_ids(ids_path, rng.integers(0, 512, size=300))
        exact = selections(path, ids_path, "exact", cache, f"{name}-{cache}")
        fast = selections(path, ids_path, "fast", cache, f"{name}-{cache}")
        check_jaccard(exact, fast, f"{name}, {cache} indexer cache")
# Outlier channels (a few indexer-key channels 20x the rest, the weights reading them scaled down: the same
# function, as real models' keys have them): fast mode quantises rotated keys and 8-bit queries, and keeps exact
# mode's selections there too (6-bit queries without the rotation kept 0.78-0.83). 8-bit queries are what VNNI
# and the scalar kernels run; where the native level is AVX2's (6-bit), the check runs the scalar kernels.
probe = harness.run(["run", "-m", os.path.join(tmp, "deepseek32.gguf"), "-p", "hi", "-n", 1, "--indexer-precision",
                     "fast"])
bits = re.search(r"fast indexer products \((\d+)-bit queries", probe.stderr)
checks.check(bits is not None and bits.group(1) in ("6", "8"),
             f"the load line states the query width: {bits.group(0) if bits else probe.stderr}")
# The default, --indexer-precision auto, is fast mode where this CPU runs 8-bit queries, else exact mode: the load
# line of run says which, and bench reports the mode it resolved to (auto next to that mode runs it once).
# (Selections cannot tell the modes apart: on these models they are the same.)
default_mode = "fast" if bits is not None and bits.group(1) == "8" else "exact"
plain = harness.run(["run", "-m", os.path.join(tmp, "deepseek32.gguf"), "-p", "hi", "-n", 1])
checks.check(f"{default_mode} indexer products" in plain.stderr,
             f"without --indexer-precision the load line names {default_mode} mode")
for flags, want in (([], [default_mode]), (["--indexer-precision", f"auto,{default_mode}"], [default_mode]),
                    (["--indexer-precision", "auto,exact,fast"], sorted({default_mode, "exact", "fast"}))):
    out = harness.run(["bench", "-m", os.path.join(tmp, "deepseek32.gguf"), "-p", 0, "-n", 1, "-d", 0, "--dsa", "on",
                       "-r", 1, "-o", "json", *flags]).stdout
    got = sorted(r["indexer_precision"] for r in json.loads(out))
    checks.check(got == sorted(want), f"bench {' '.join(flags) or '(default)'} runs {want}: {got}")
saved_isa = os.environ.get("SPARROW_ISA")
if bits is not None and bits.group(1) != "8":
    os.environ["SPARROW_ISA"] = "scalar"
for name in ("deepseek32", "glm-dsa"):
    path = os.path.join(tmp, f"{name}-outliers.gguf")
    harness.run(["make-model", "-o", path, "--arch", name, "--outlier-channels", 4, "--outlier-scale", 20])
    ids_path = os.path.join(tmp, f"ids-{name}-outliers.txt")
    harness.write_ids(ids_path, rng.integers(3, 500, size=400))
    exact = selections(path, ids_path, "exact", "f16", f"{name}-outliers")
    fast = selections(path, ids_path, "fast", "f16", f"{name}-outliers")
    check_jaccard(exact, fast, f"{name} with outlier channels")
if saved_isa is None:
    os.environ.pop("SPARROW_ISA", None)
else:
    os.environ["SPARROW_ISA"] = saved_isa
# bench reports both precisions and, with --dsa-stats, the statistics of each sparse test (selection active:
# depth 300 > top-k 64).
model = os.path.join(tmp, "deepseek32.gguf")
proc = harness.run(["bench", "-m", model, "-p", 0, "-n", 4, "-d", 300, "--dsa", "on", "--indexer-precision",
                    "exact,fast", "-r", 1, "-t", 2, "--dsa-stats"])
rows = [line for line in proc.stdout.splitlines() if line.startswith("|") and "tg4" in line]
checks.check(len(rows) == 2 and "exact" in rows[0] and "fast" in rows[1], f"bench rows for both precisions: {rows}")
for precision in ("exact", "fast"):
    checks.check(f"dsa-stats of tg4 at depth 300, {precision} indexer:" in proc.stderr,
                 f"bench --dsa-stats prints the {precision} test's statistics")
checks.check(proc.stderr.count("time in indexer") == 2 and " 64.0 " in proc.stderr,
             "each block has the indexer time and 64 keys per query")
# The selection call is part of the indexer's time and the attention kernel part of attention's.
times = re.findall(r"time in indexer ([0-9.]+) ms \(selection call ([0-9.]+) ms\), in attention ([0-9.]+) ms "
                   r"\(attention kernel ([0-9.]+) ms\)", proc.stderr)
checks.check(len(times) == 2 and all(0 < float(sel) <= float(ind) and 0 < float(ker) <= float(att)
                                     for ind, sel, att, ker in times),
             f"selection call within the indexer time, attention kernel within the attention time: {times}")
# The selection call's phases lie within it; fast mode re-scores its band exactly, so that phase takes time there.
phases = re.findall(r"selection call by phase: plan ([0-9.]+) ms, scoring ([0-9.]+) ms, merge ([0-9.]+) ms, exact "
                    r"re-scoring ([0-9.]+) ms, choice ([0-9.]+) ms", proc.stderr)
checks.check(len(phases) == 2 and all(float(p[1]) > 0 and sum(map(float, p)) <= float(t[1]) + 0.003
                                      for p, t in zip(phases, times)),
             f"each block has the selection's phases, scoring timed, their sum within the call: {phases} {times}")
checks.check(len(phases) == 2 and float(phases[1][3]) > 0, f"fast mode's exact re-scoring is timed: {phases}")
checks.finish()
