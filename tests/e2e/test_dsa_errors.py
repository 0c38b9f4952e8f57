"""DSA models: malformed files are refused at load with the layer named (a full layer without its indexer
tensors, IndexShare with a shared layer 0, a types array of the wrong length, a bad expert count), and
perplexity runs on both architectures with a finite result."""
import math
import os
import re

import numpy as np

import harness
from gguf import GGUFValueType

checks = harness.Checks()
tmp = harness.temp_dir()


def expect_error(args, needle, what):
    harness.expect_error(checks, args, needle, what)


rewrite = harness.rewrite_gguf


glm = os.path.join(tmp, "glm.gguf")
harness.run(["make-model", "--arch", "glm-dsa", "-o", glm, "--n-layer", 5, "--indexer-types", "1,1,0,0,1"])

no_indexer = os.path.join(tmp, "no_indexer.gguf")
rewrite(glm, no_indexer, tensor_edit=lambda t: [t.pop(n) for n in list(t) if n.startswith("blk.4.indexer.")])
expect_error(["run", "-m", no_indexer, "-p", "x"], "layer 4", "full layer without indexer tensors")

types_key = "glm-dsa.attention.indexer.types"


def set_types(values):
    def edit(md):
        md[types_key] = ((GGUFValueType.ARRAY, GGUFValueType.BOOL), values)
    return edit


shared0 = os.path.join(tmp, "shared0.gguf")
rewrite(glm, shared0, metadata_edit=set_types([False, True, True, True, True]))
expect_error(["run", "-m", shared0, "-p", "x"], "layer 0", "IndexShare with a shared layer 0")

short = os.path.join(tmp, "short.gguf")
rewrite(glm, short, metadata_edit=set_types([True, True]))
expect_error(["run", "-m", short, "-p", "x"], "indexer.types", "indexer types of the wrong length")

ds = os.path.join(tmp, "ds.gguf")
harness.run(["make-model", "--arch", "deepseek32", "-o", ds])
bad_experts = os.path.join(tmp, "bad_experts.gguf")
rewrite(ds, bad_experts, metadata_edit=lambda md: md.update({"deepseek32.expert_used_count": (GGUFValueType.UINT32, 99)}))
expect_error(["run", "-m", bad_experts, "-p", "x"], "expert", "more experts used than exist")

# Perplexity runs on both architectures (selection active at -c 128 > top-k 64) with a finite value.
text = os.path.join(tmp, "text.txt")
rng = np.random.default_rng(0)
words = ["the", "little", "bird", "sang", "a", "song", "and", "flew", "over", "house", "girl", "smiled"]
with open(text, "w") as f:
    f.write(" ".join(rng.choice(words, size=3000)))
for model in (ds, glm):
    out = harness.run(["perplexity", "-m", model, "-f", text, "-c", 128, "--chunks", 4, "--dsa-stats"])
    m = re.search(r"PPL = ([0-9.einf]+)", out.stdout)
    ppl = float(m.group(1)) if m else math.nan
    checks.check(m is not None and math.isfinite(ppl) and ppl > 1, f"perplexity on {os.path.basename(model)}: {ppl}")
    checks.check("dsa-stats" in out.stderr and "sparse attention: on" in out.stderr,
                 f"{os.path.basename(model)}: attention mode and statistics printed")
checks.finish()
