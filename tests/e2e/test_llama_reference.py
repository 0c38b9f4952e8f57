"""Llama end to end against the numpy float64 reference (tests/reference/llama_ref.py): logits of the last
prompt position for synthetic models of several shapes and weight types (made by `sparrow make-model`),
and for stories260K when ../shared/data is present."""
import os

import numpy as np

import harness
import llama_ref

checks = harness.Checks()
tmp = harness.temp_dir()
rng = np.random.default_rng(3)


def compare(model_path, ids, tol, what, extra=()):
    ids_path = os.path.join(tmp, "ids.txt")
    out = os.path.join(tmp, "logits.npy")
    harness.write_ids(ids_path, ids)
    harness.run(["run", "-m", model_path, "--prompt-ids", ids_path, "-n", 0, "--dump-logits", out,
                 "-ctk", "f32", "-ctv", "f32", "-c", 512, *extra])
    got = np.load(out)
    model = llama_ref.LlamaModel(model_path)
    want = llama_ref.forward(model, np.asarray(ids))[-1]
    err = harness.rel_error(got, want)
    checks.check(err < tol, f"{what}: relative error {err:.2e} < {tol:g}")
    checks.check(int(np.argmax(got)) == int(np.argmax(want)), f"{what}: same argmax")


# Synthetic models: GQA, MHA, tied output, several ubatch sizes; f32 weights compare at 1e-4.
configs = [
    ("gqa", ["--n-embd", 64, "--n-head", 4, "--n-head-kv", 2, "--n-layer", 2], []),
    ("mha-ubatch7", ["--n-embd", 96, "--n-head", 3, "--n-head-kv", 3, "--n-layer", 3, "--n-ff", 160], ["-ub", 7]),
    ("tied-ubatch1", ["--n-embd", 64, "--n-head", 8, "--n-head-kv", 1, "--tied-output"], ["-ub", 1]),
]
for name, make_args, run_args in configs:
    path = os.path.join(tmp, f"{name}.gguf")
    harness.run(["make-model", "--arch", "llama", "-o", path, *make_args])
    ids = rng.integers(0, 512, size=40)
    compare(path, ids, 1e-4, f"synthetic {name}", run_args)

# Quantised weights: sparrow quantises activations to Q8_0 (as ggml does), the reference does not, so the
# tolerance is that of the quantisation.
for wtype, tol in [("f16", 1e-5), ("bf16", 1e-5), ("q8_0", 3e-2), ("q4_0", 5e-2)]:
    path = os.path.join(tmp, f"gqa-{wtype}.gguf")
    harness.run(["make-model", "--arch", "llama", "-o", path, "--type", wtype, "--n-embd", 64])
    compare(path, rng.integers(0, 512, size=24), tol, f"synthetic {wtype} weights")

stories = harness.shared_data("models", "stories260K.gguf")
if stories:
    ids = [1] + list(rng.integers(3, 512, size=63))
    compare(stories, ids, 1e-4, "stories260K 64-token prompt")
else:
    print("skip: ../shared/data is absent: stories260K comparison not run")

checks.finish()
