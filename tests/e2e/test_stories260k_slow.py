"""stories260K (a real trained Llama, ../shared/data) end to end: the greedy continuation of
"Once upon a time" and perplexity over wiki.test.raw, against the figures in ../shared/data/README.md."""
import re

import harness

model = harness.shared_data("models", "stories260K.gguf")
wiki = harness.shared_data("text", "wiki.test.raw")
if not model or not wiki:
    print("skip: ../shared/data is absent (stories260K.gguf, wiki.test.raw)")
    raise SystemExit(harness.SKIP)

checks = harness.Checks()

expected_text = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
out = harness.run(["run", "-m", model, "-p", "Once upon a time", "-n", 32, "--temp", 0, "-t", 2])
checks.check(out.stdout.startswith("Once upon a time" + expected_text),
             f"greedy continuation matches the known text (got {out.stdout[:140]!r})")
checks.check(re.search(r"generation: 32 tokens", out.stderr) is not None, "speed line printed for 32 tokens")

# llama.cpp's method at -c 128 over 50 chunks, F32 cache: within 0.05% of 107.65 (exact: 107.6599).
out = harness.run(["perplexity", "-m", model, "-f", wiki, "-c", 128, "--chunks", 50, "-ctk", "f32", "-ctv", "f32"])
m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", out.stdout)
checks.check(m is not None, "perplexity prints a final estimate")
if m:
    ppl = float(m.group(1))
    checks.check(abs(ppl - 107.65) / 107.65 < 0.0005, f"perplexity {ppl} within 0.05% of 107.65")
    checks.check(abs(ppl - 107.6599) < 0.01, f"perplexity {ppl} matches the exact evaluation 107.6599")
checks.check("[1]75.2" in out.stderr, "first chunk's running value is 75.2x")
checks.finish()
