"""`sparrow bench` output: one JSON object per test and mode (pp and tg, each depth, sparse per indexer precision
and dense), each with its repetitions' speeds, their mean and spread, and for sparse tests the speed-up over the
dense test of the same round (the median of the per-repetition ratios, which the modes' interleaved repetitions
make comparable), and for tests at depth > 0 their speed as a fraction of the same test and mode at depth 0 (the
median of the ratios to depth-0 passes made in the same rounds); the markdown table carries both in its last two
columns. Without depth 0 among the depths there is no fraction."""
import json
import os
import statistics

import harness

checks = harness.Checks()
tmp = harness.temp_dir()
model = os.path.join(tmp, "ds.gguf")
harness.run(["make-model", "--arch", "deepseek32", "-o", model])

common = ["bench", "-m", model, "-p", 8, "-n", 3, "-d", "0,300", "--dsa", "on,off", "--indexer-precision", "exact,fast",
          "-r", 3, "-t", 2]
proc = harness.run(common + ["-o", "json"])
rows = json.loads(proc.stdout)
keys = {(r["test"], r["depth"], r["dsa"], r["indexer_precision"] if r["dsa"] else "-") for r in rows}
want = {(t, d, dsa, p) for t in ("pp8", "tg3") for d in (0, 300)
        for dsa, p in ((True, "exact"), (True, "fast"), (False, "-"))}
checks.check(len(rows) == 12 and keys == want, f"one object per test, depth and mode ({len(rows)} objects)")
for r in rows:
    name = f"{r['test']} depth {r['depth']} dsa {r['dsa']} {r['indexer_precision']}"
    each = r["tokens_per_s_each"]
    checks.check(len(each) == 3 and all(v > 0 for v in each), f"{name}: three positive repetitions ({each})")
    checks.check(abs(statistics.mean(each) - r["tokens_per_s"]) <= 1e-3 * r["tokens_per_s"] + 2e-3,
                 f"{name}: tokens_per_s is the mean of the repetitions")
    checks.check(abs(statistics.stdev(each) - r["tokens_per_s_stddev"]) <= 1e-3 * r["tokens_per_s"] + 2e-3,
                 f"{name}: the spread is their standard deviation")
    checks.check(r["synthetic_fill"] == (r["depth"] > 0), f"{name}: synthetic_fill says whether the cache was filled")
    checks.check((r["n_prompt"], r["n_gen"]) == ((8, 0) if r["test"] == "pp8" else (0, 3)), f"{name}: n_prompt, n_gen")
    each0 = r["depth0_tokens_per_s_each"]
    if r["depth"] == 0:
        checks.check(r["fraction_of_depth0"] is None and each0 == [],
                     f"{name}: a depth-0 row has no fraction of depth 0 and no depth-0 passes of its own")
    else:
        checks.check(len(each0) == 3 and all(v > 0 for v in each0),
                     f"{name}: three depth-0 passes made in the rounds of its repetitions ({each0})")
        want_fraction = statistics.median(a / b for a, b in zip(each, each0))
        checks.check(r["fraction_of_depth0"] is not None and abs(r["fraction_of_depth0"] - want_fraction) < 1e-3,
                     f"{name}: fraction of depth 0 {r['fraction_of_depth0']} is the median of the rounds' ratios "
                     f"({want_fraction:.4f})")
    if not r["dsa"]:
        checks.check(r["speedup_over_dense"] is None, f"{name}: a dense row has no speed-up")
        continue
    dense = next(d for d in rows if not d["dsa"] and d["test"] == r["test"] and d["depth"] == r["depth"])
    want_speedup = statistics.median(a / b for a, b in zip(each, dense["tokens_per_s_each"]))
    checks.check(r["speedup_over_dense"] is not None and abs(r["speedup_over_dense"] - want_speedup) < 1e-3,
                 f"{name}: speed-up over dense {r['speedup_over_dense']} is the median of the rounds' ratios "
                 f"({want_speedup:.4f})")

proc = harness.run(["bench", "-m", model, "-p", 0, "-n", 2, "-d", 300, "--dsa", "on", "-r", 2, "-t", 2, "-o", "json"])
alone = json.loads(proc.stdout)
checks.check(len(alone) == 1 and alone[0]["fraction_of_depth0"] is None and alone[0]["depth0_tokens_per_s_each"] == [],
             "without depth 0 among the depths a row has no fraction of depth 0")

proc = harness.run(common)
table = [line for line in proc.stdout.splitlines() if line.startswith("| sparrow")]
checks.check("| vs dense | of depth 0 |" in proc.stdout and len(table) == 12,
             f"the table has a row per test and mode ({len(table)})")
for line in table:
    cells = [c.strip() for c in line.strip("|").split("|")]
    sparse = cells[3] == "on"
    checks.check(cells[-2].endswith("x") if sparse else cells[-2] == "-",
                 f"vs dense is a ratio on sparse rows and '-' on dense ones: {line}")
    checks.check(cells[-1].endswith("%") if cells[2] == "300" else cells[-1] == "-",
                 f"of depth 0 is a percentage on rows at depth 300 and '-' at depth 0: {line}")
checks.finish()
