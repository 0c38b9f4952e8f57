"""DSA models: malformed files are refused at load with the layer named (a full layer without its indexer
tensors, IndexShare with a shared layer 0, a types array of the wrong length, a bad expert count); the forms
llama.cpp also takes load as it reads them (indexer.types as one value for every layer, glm-dsa gating 0 =
sigmoid, expert_weights_scale 0 = no scaling); and perplexity runs on both architectures with a finite result."""
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

# One value instead of an array stands for every layer (llama.cpp reads the key with get_key_or_arr).
glm_full = os.path.join(tmp, "glm_full.gguf")
harness.run(["make-model", "--arch", "glm-dsa", "-o", glm_full, "--n-layer", 5, "--indexer-types", "1,1,1,1,1"])
# (A true value is told apart from an ignored key by the false one below, which must be refused.)
for value_type, value in ((GGUFValueType.BOOL, True), (GGUFValueType.UINT32, 1)):
    scalar = os.path.join(tmp, f"scalar-{value_type.name}.gguf")
    rewrite(glm_full, scalar, metadata_edit=lambda md: md.update({types_key: (value_type, value)}))
    out = harness.run(["run", "-m", scalar, "-p", "x", "-n", 1])
    checks.check("indexer on 5 of 5 layers (0 share)" in out.stderr,
                 f"a scalar {value_type.name} indexer.types makes every layer full")
all_shared = os.path.join(tmp, "scalar-false.gguf")
rewrite(glm_full, all_shared, metadata_edit=lambda md: md.update({types_key: (GGUFValueType.BOOL, False)}))
expect_error(["run", "-m", all_shared, "-p", "x"], "layer 0", "a scalar false indexer.types (layer 0 shared)")

# glm-dsa: expert_gating_func 0 (llama.cpp's NONE) is sigmoid, as llama.cpp's glm-dsa loader maps it.
ids = os.path.join(tmp, "ids.txt")
harness.write_ids(ids, [5, 9, 2, 7, 11, 3])


def last_logits(model, tag):
    out = os.path.join(tmp, f"logits-{tag}.npy")
    harness.run(["run", "-m", model, "--prompt-ids", ids, "-n", 0, "--dump-logits", out])
    return np.load(out)


gating_none = os.path.join(tmp, "gating_none.gguf")
rewrite(glm_full, gating_none, metadata_edit=lambda md: md.update({"glm-dsa.expert_gating_func": (GGUFValueType.UINT32, 0)}))
checks.check(np.array_equal(last_logits(glm_full, "sigmoid"), last_logits(gating_none, "none")),
             "glm-dsa with expert_gating_func 0 gives the sigmoid file's logits")

ds = os.path.join(tmp, "ds.gguf")
harness.run(["make-model", "--arch", "deepseek32", "-o", ds])
# expert_weights_scale 0 means no scaling (llama.cpp's default when the key is absent): the logits of scale 1.
scales = {}
for scale in (0.0, 1.0):
    scaled = os.path.join(tmp, f"ds-scale-{scale}.gguf")
    rewrite(ds, scaled, metadata_edit=lambda md: md.update({"deepseek32.expert_weights_scale": (GGUFValueType.FLOAT32, scale)}))
    scales[scale] = last_logits(scaled, f"scale-{scale}")
checks.check(np.array_equal(scales[0.0], scales[1.0]), "deepseek32 with expert_weights_scale 0 gives scale 1's logits")
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
