"""llama.cpp's fused expert tensor: its converter's --fuse-gate-up-exps writes each MoE layer's routed gate and up as
one ffn_gate_up_exps {n_embd, 2 * n_ff_exp, n_expert} (per expert its gate rows, then its up rows), which llama.cpp
loads in preference to the separate pair. `make-model --fuse-gate-up-exps` writes that file with the values the
separate tensors would hold, so sparrow's logits for it must be bit-identical to the separate file's, for both
architectures, for packed rows (q8_0, n_ff_exp a multiple of 8) and unpacked ones (f32; q8_0 with n_ff_exp 20), and
must agree with the float64 reference reading the fused tensor. A fused tensor of the wrong shape is refused by
name."""
import os

import numpy as np

import harness  # first: it puts tests/reference on the path
import dsa_ref

checks = harness.Checks()
tmp = harness.temp_dir()
rng = np.random.default_rng(7)
ids = rng.integers(0, 512, size=90)  # past top-k 64: the selection is active
ids_path = os.path.join(tmp, "ids.txt")
harness.write_ids(ids_path, ids)


def logits(model, tag):
    out = os.path.join(tmp, f"{tag}.npy")
    harness.run(["run", "-m", model, "--prompt-ids", ids_path, "-n", 0, "--dump-logits", out, "-ctk", "f32",
                 "--indexer-cache-type", "f32", "--indexer-precision", "exact"])
    return np.load(out)


cases = [("deepseek32", "f32", []), ("deepseek32", "q8_0", []), ("glm-dsa", "q8_0", []),
         ("glm-dsa", "f32", []), ("deepseek32", "q8_0", ["--n-ff-exp", 20])]
for arch, wtype, extra in cases:
    tag = f"{arch}-{wtype}-{len(extra)}"
    common = ["make-model", "--arch", arch, "--type", wtype, "--seed", 3] + extra
    separate, fused = os.path.join(tmp, f"sep-{tag}.gguf"), os.path.join(tmp, f"fus-{tag}.gguf")
    harness.run(common + ["-o", separate])
    harness.run(common + ["--fuse-gate-up-exps", "-o", fused])
    table = harness.run(["inspect", fused]).stdout
    checks.check("blk.1.ffn_gate_up_exps.weight" in table and "ffn_gate_exps" not in table,
                 f"{tag}: the file holds ffn_gate_up_exps instead of the separate pair")
    a, b = logits(separate, f"sep-{tag}"), logits(fused, f"fus-{tag}")
    checks.check(a.shape == b.shape and np.array_equal(a, b), f"{tag}: fused and separate files give the same logits")
    if wtype == "f32":
        want, _ = dsa_ref.forward(dsa_ref.DsaModel(fused), ids)
        err = float(np.max(np.abs(want[-1] - b)) / np.max(np.abs(want[-1])))
        checks.check(err < 1e-4, f"{tag}: the reference reading the fused tensor agrees (relative error {err:.2g})")

# A fused tensor whose rows are not 2 x n_ff_exp per expert: the error names the tensor.
bad = os.path.join(tmp, "bad.gguf")
harness.run(["make-model", "--arch", "deepseek32", "--type", "f32", "--fuse-gate-up-exps", "-o", bad])
data = bytearray(open(bad, "rb").read())
# The tensor table stores each name followed by its dims; halve blk.1's second dim (2 * n_ff_exp = 64 -> 32).
name = b"blk.1.ffn_gate_up_exps.weight"
at = data.find(name) + len(name)
n_dims = int.from_bytes(data[at:at + 4], "little")
dim1 = at + 4 + 8
checks.check(n_dims == 3 and int.from_bytes(data[dim1:dim1 + 8], "little") == 64, "the fused tensor's dims are found")
data[dim1:dim1 + 8] = (32).to_bytes(8, "little")
with open(bad, "wb") as f:
    f.write(data)
proc = harness.run(["run", "-m", bad, "-p", "hi", "-n", 1], check=False)
checks.check(proc.returncode != 0 and "ffn_gate_up_exps" in proc.stderr,
             f"a wrong-shaped fused tensor is refused by name: {proc.stderr.strip()[:200]}")
checks.finish()
