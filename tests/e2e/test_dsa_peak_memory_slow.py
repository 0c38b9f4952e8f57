"""Issue 3's memory target: the peak resident memory of a prefill at 16K tokens of context exceeds the weights
plus the KV caches by less than 10%. On the bench preset (850 MiB of Q8_0 weights, 8 layers with an indexer),
a 512-token prompt after 16384 synthetic cache rows, as `sparrow bench` runs it; bench states the caches its test
held, so the bound follows the model's cache layout.

What the margin holds: the process itself (~30 MiB of code, libraries and small buffers), the 512-token
ubatch's scratch (~37 MiB, mostly the MoE's per-slot rows) and the cache stores' page rounding. Session 27 measured
+5.4%; with each store rounded to whole 2 MiB pages (session 26's code) the same run read +9.4% to +10.8%.
Named _slow so that the sanitizer pass leaves it out (shadow memory makes resident memory meaningless there)."""
import os
import re
import shutil

import harness

checks = harness.Checks()
tmp = harness.temp_dir()
model = os.path.join(tmp, "bench.gguf")
try:  # the model is 850 MiB: it goes as soon as bench has run
    harness.run(["make-model", "--arch", "deepseek32", "--preset", "bench", "-o", model])
    proc = harness.run(["bench", "-m", model, "-p", 512, "-n", 0, "-d", 16384, "--dsa", "on", "-r", 1, "-t", 2])
finally:
    shutil.rmtree(tmp, ignore_errors=True)
m = re.search(r"peak resident memory ([0-9.]+) MiB \(weights ([0-9.]+) MiB, [0-9.]+ MiB of them repacked; "
              r"KV caches ([0-9.]+) MiB", proc.stderr)
if not m:
    raise AssertionError(f"no peak memory line in bench's output:\n{proc.stderr}")
peak, weights, caches = (float(g) for g in m.groups())
# The caches of a 16896-cell context: per layer the f16 latent (576 wide), the f16 indexer key (128) and its
# int8 copy with a scale and a sum: 8 x 16896 x (1152 + 256 + 136) bytes = 199.1 MiB.
checks.check(190.0 < caches < 210.0, f"bench reports {caches:.1f} MiB of KV caches, expected ~199")
over = peak / (weights + caches) - 1.0
print(f"peak {peak:.1f} MiB against weights {weights:.1f} + caches {caches:.1f} MiB: {100 * over:+.1f}%")
checks.check(over < 0.10, f"peak resident memory {peak:.1f} MiB exceeds weights {weights:.1f} MiB + KV caches "
             f"{caches:.1f} MiB by {100 * over:.1f}% (the target is under 10%)")
checks.finish()
