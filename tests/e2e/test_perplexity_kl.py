"""`sparrow perplexity --kl-divergence-base / --kl-divergence` (tools/kl_divergence.h): a run compared with
itself gives KL exactly 0 and 100% same top token; sparse vs dense attention on a tiny deepseek32 model
with the selection active (top-k 64, -c 256) gives a positive finite KL (printed); a missing, truncated or
mismatched base file, or both flags at once, fail with a clear error."""
import os
import re

import numpy as np

import harness

checks = harness.Checks()
tmp = harness.temp_dir()

text = os.path.join(tmp, "text.txt")
rng = np.random.default_rng(5)
harness.write_word_text(text, rng, 3000)
other_text = os.path.join(tmp, "other.txt")
harness.write_word_text(other_text, rng, 3000)

ds = os.path.join(tmp, "ds.gguf")
harness.run(["make-model", "--arch", "deepseek32", "--top-k", 64, "-o", ds])
base = os.path.join(tmp, "dense.kld")
common = ["perplexity", "-m", ds, "-f", text, "-c", 256, "--chunks", 4, "-b", 1024]

KL = re.compile(r"KL divergence vs .* mean KL (\S+) \+/- (\S+), 99% KL (\S+), same top (\S+)%, "
                r"PPL base (\S+) current (\S+), ratio (\S+) \(ln (\S+) \+/- (\S+)\)")
PPL = re.compile(r"PPL = (\S+) ")

dense = harness.run(common + ["--dsa", "off", "--kl-divergence-base", base])
checks.check("KL base saved" in dense.stdout and os.path.getsize(base) > 0, "the base run saves its file")
dense_ppl = PPL.search(dense.stdout).group(1)

same = harness.run(common + ["--dsa", "off", "--kl-divergence", base])
k = KL.search(same.stdout)
checks.check(k is not None and float(k.group(1)) == 0.0 and float(k.group(3)) == 0.0 and k.group(4) == "100.00"
             and float(k.group(7)) == 1.0, f"dense against itself: KL 0, same top 100%, ratio 1 ({k.group(0) if k else same.stdout[-300:]})")
checks.check(same.stdout.count("KL chunk ") == 4, "one KL line per chunk")

sparse = harness.run(common + ["--dsa", "on", "--kl-divergence", base])
k = KL.search(sparse.stdout)
print(sparse.stdout)
ok = k is not None and np.isfinite(float(k.group(1))) and float(k.group(1)) > 0 and float(k.group(2)) >= 0
checks.check(ok, f"sparse (top-k 64) against dense at -c 256: positive finite KL ({k.group(0) if k else sparse.stdout[-300:]})")
if k:
    sparse_ppl = PPL.search(sparse.stdout).group(1)
    checks.check(abs(float(k.group(5)) - float(dense_ppl)) <= 1e-3 * float(dense_ppl) and
                 abs(float(k.group(6)) - float(sparse_ppl)) <= 1e-3 * float(sparse_ppl),
                 f"PPL base/current in the KL line match the two runs' own PPL ({dense_ppl}, {sparse_ppl})")

# Errors: non-zero exit, no crash, a message naming the problem.
harness.expect_error(checks, common + ["--kl-divergence", os.path.join(tmp, "missing.kld")], "cannot open",
                     "missing base file")
truncated = os.path.join(tmp, "truncated.kld")
with open(base, "rb") as f, open(truncated, "wb") as g:
    g.write(f.read()[:-5])
harness.expect_error(checks, common + ["--kl-divergence", truncated], "truncated", "truncated base file")
not_kl = os.path.join(tmp, "not.kld")
with open(not_kl, "w") as f:
    f.write("hello, this is not a KL file at all........................................")
harness.expect_error(checks, common + ["--kl-divergence", not_kl], "bad magic", "not a base file")
harness.expect_error(checks, ["perplexity", "-m", ds, "-f", text, "-c", 128, "--chunks", 4, "--kl-divergence", base],
                     "-c 256", "another -c")
harness.expect_error(checks, ["perplexity", "-m", ds, "-f", text, "-c", 256, "--chunks", 3, "--kl-divergence", base],
                     "chunks", "another chunk count")
harness.expect_error(checks, ["perplexity", "-m", ds, "-f", other_text, "-c", 256, "--chunks", 4, "--kl-divergence", base],
                     "not the same text", "another text")
harness.expect_error(checks, common + ["--kl-divergence", base, "--kl-divergence-base", os.path.join(tmp, "x.kld")],
                     "not both", "both flags")
checks.finish()
