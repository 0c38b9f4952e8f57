"""`sparrow batched`: with --temp 0 every sequence's text equals `sparrow run`'s greedy text for the same
prompt (llama and deepseek32 with a small top-k, so that sparse selection runs over the shared prompt),
sampled runs with different seeds are valid and their sequences differ, and bad flags fail cleanly."""
import os

import harness

checks = harness.Checks()
tmp = harness.temp_dir()


def sections(stdout):
    """The texts after each '--- sequence i ---' line, in order."""
    out, current = [], None
    for line in stdout.split("\n"):
        if line.startswith("--- sequence ") and line.endswith(" ---"):
            current = []
            out.append(current)
        elif current is not None:
            current.append(line)
    return ["\n".join(lines).rstrip("\n") for lines in out]


PROMPT = "The quick brown fox jumps over the lazy dog, then"
for arch, extra in [("llama", []), ("deepseek32", ["--dsa-top-k", 8])]:
    model = os.path.join(tmp, f"{arch}.gguf")
    harness.run(["make-model", "--arch", arch, "-o", model])
    common = ["-m", model, "-p", PROMPT, "-t", 2] + extra
    ref = harness.run(["run"] + common + ["-n", 24, "--temp", 0]).stdout.rstrip("\n")
    got = harness.run(["batched"] + common + ["-np", 3, "-n", 24, "--temp", 0])
    texts = sections(got.stdout)
    checks.check(len(texts) == 3, f"{arch}: batched -np 3 prints 3 sequences (got {len(texts)})")
    for i, text in enumerate(texts):
        checks.check(text == ref, f"{arch}: greedy sequence {i} equals `run` ({text[len(PROMPT):][:40]!r} vs "
                                  f"{ref[len(PROMPT):][:40]!r})")
    checks.check("tokens/s aggregate" in got.stderr and "decoded once for 3 sequences" in got.stderr,
                 f"{arch}: prints the prompt and aggregate generation speeds")

    for seed in (1, 2):
        proc = harness.run(["batched"] + common + ["-np", 4, "-n", 16, "--temp", 1.0, "--top-k", 0, "-s", seed,
                                                   "--compare-single"])
        texts = sections(proc.stdout)
        checks.check(len(texts) == 4 and all(t.startswith(PROMPT) for t in texts),
                     f"{arch}: seed {seed}: 4 sequences, each starting with the prompt")
        checks.check(len(set(texts)) > 1, f"{arch}: seed {seed}: sampled sequences differ from each other")
        checks.check("single sequence" in proc.stderr and "aggregate speed" in proc.stderr,
                     f"{arch}: seed {seed}: --compare-single prints the speed ratio")

model = os.path.join(tmp, "llama.gguf")
harness.expect_error(checks, ["batched", "-m", model, "-p", "x", "-np", 0], "parallel", "-np 0")
harness.expect_error(checks, ["batched", "-m", model, "-p", "x", "-np", 8, "-n", 64, "-c", 100], "cache cells",
                     "a context too small for np x n tokens")
checks.finish()
