"""Bad input gets a clear error naming what was wrong and a non-zero exit, never a crash: unknown flags,
missing or malformed files, wrong tensor shapes, unknown architectures, over-long prompts, bad ids."""
import os

import numpy as np

import harness

checks = harness.Checks()
tmp = harness.temp_dir()
model = os.path.join(tmp, "tiny.gguf")
harness.run(["make-model", "--arch", "llama", "-o", model])


def expect_error(args, needle, what):
    harness.expect_error(checks, args, needle, what)


rewrite = harness.rewrite_gguf


expect_error(["run", "-m", model, "-p", "x", "--bogus-flag"], "bogus-flag", "unknown flag")
# Usage errors (unknown flag, value out of range, missing subcommand) exit 2; --help exits 0.
for args in (["run", "-m", model, "--bogus-flag"], ["run", "-m", model, "--temp", "nan"], []):
    code = harness.run(args, check=False).returncode
    checks.check(code == 2, f"usage error {args[3:] or args or 'no subcommand'} exits 2 (got {code})")
checks.check(harness.run(["run", "--help"], check=False).returncode == 0, "--help exits 0")
expect_error(["serve", "-m", model, "--dsa-stats"], "--dsa-stats", "serve has no --dsa-stats (no end of run to print at)")
expect_error(["serve", "-m", model, "--prefill-chunk", "-1"], "--prefill-chunk", "negative prefill chunk")
expect_error(["serve", "-m", model, "--max-queue", "0"], "--max-queue", "a queue of 0 (nothing could be served)")
expect_error([], "subcommand", "no subcommand")
expect_error(["run", "-m", os.path.join(tmp, "missing.gguf"), "-p", "x"], "cannot open", "missing model file")
expect_error(["run", "-m", model, "-p", "x", "--temp", "-1"], "temp", "negative temperature")

text = os.path.join(tmp, "text.gguf")
with open(text, "w") as f:
    f.write("this is not a model\n" * 10)
expect_error(["run", "-m", text, "-p", "x"], "not a GGUF file", "text file as model")

data = open(model, "rb").read()
for frac in (0.1, 0.5, 0.99):
    cut = os.path.join(tmp, f"cut{frac}.gguf")
    with open(cut, "wb") as f:
        f.write(data[: int(len(data) * frac)])
    expect_error(["run", "-m", cut, "-p", "x"], "truncated", f"model truncated to {frac:.0%}")
    expect_error(["inspect", cut], "truncated", f"inspect of a model truncated to {frac:.0%}")

bad_shape = os.path.join(tmp, "bad_shape.gguf")
rewrite(model, bad_shape, tensor_edit=lambda t: t.update({"blk.1.attn_k.weight": (0, np.zeros((16, 64)))}))
expect_error(["run", "-m", bad_shape, "-p", "x"], "blk.1.attn_k.weight", "wrong tensor shape names the tensor")

missing = os.path.join(tmp, "missing_tensor.gguf")
rewrite(model, missing, tensor_edit=lambda t: t.pop("blk.0.ffn_up.weight"))
expect_error(["run", "-m", missing, "-p", "x"], "blk.0.ffn_up.weight", "missing tensor is named")

arch = os.path.join(tmp, "arch.gguf")
rewrite(model, arch, metadata_edit=lambda md: md.update({"general.architecture": (md["general.architecture"][0], "foo")}))
expect_error(["run", "-m", arch, "-p", "x"], "'foo' is not supported", "unknown architecture")

expect_error(["run", "-m", model, "-c", 16, "-p", "word " * 40], "does not fit in the context", "over-long prompt")
# A context far larger than memory (2^31 - 1 cells: terabytes of cache) is refused with the cell count named.
# Not under AddressSanitizer, whose operator new reports a failed allocation and aborts instead of throwing.
if not harness.sanitized():
    expect_error(["run", "-m", model, "-c", 2**31 - 1, "-b", 1, "-p", "x"], "context of 2147483647 cells",
                 "context too large for memory")
ids = os.path.join(tmp, "ids.txt")


def expect_ids_error(content, needle, what):
    """`run --prompt-ids` over a file holding `content` fails naming `needle`."""
    with open(ids, "w") as f:
        f.write(content)
    expect_error(["run", "-m", model, "--prompt-ids", ids, "-n", 0], needle, what)


expect_ids_error("1, 2, abc", "expected a token id at byte 6, found 'abc'", "malformed prompt ids")
expect_ids_error("1 2 -3", "found '-3'", "negative prompt id")
expect_ids_error("1 2 99999999999999999999999", "token id 99999999999999999999999 at byte 4 is too large",
                 "prompt id beyond int32")
expect_ids_error("1 2147483648", "token id 2147483648 at byte 2 is too large", "prompt id 2^31")
expect_ids_error("1 2147483647", "outside the vocabulary", "prompt id 2^31 - 1")
expect_ids_error("1 0000000000000999999", "outside the vocabulary", "a zero-padded prompt id is read as its value")
expect_ids_error("1 2 999999", "outside the vocabulary", "token id out of range")
expect_error(["make-model", "--arch", "llama", "-o", os.path.join(tmp, "x.gguf"), "--n-embd", 66, "--n-head", 4],
             "head size", "make-model with inconsistent sizes")
expect_error(["make-model", "--arch", "llama", "-o", os.path.join(tmp, "x.gguf"), "--type", "mxfp4_moe"],
             "needs an MoE architecture", "make-model mxfp4_moe without experts")
expect_error(["perplexity", "-m", model, "-f", os.path.join(tmp, "nope.txt")], "cannot open", "missing text file")

# Out-of-range numbers: the message gives the range in plain figures (CLI11's own checks printed DBL_MAX in
# full), NaN is refused, and a thread count that would start 100,000 threads is refused instead of hanging.
for flag, value, needle in (("-b", -7, "not in range 1 to 2147483648"), ("-c", -1, "not in range 0 to"),
                            ("--temp", "nan", "not a finite number"), ("--top-p", "nan", "not a finite number"),
                            ("--temp", "x", "not a number"), ("-t", 100000, "not in range 0 to 1024")):
    expect_error(["run", "-m", model, "-p", "x", flag, value], needle, f"run {flag} {value}")
    proc = harness.run(["run", "-m", model, "-p", "x", flag, value], check=False)
    checks.check("17976931348623157" not in proc.stderr, f"run {flag} {value}: no DBL_MAX in the message")

# bench's list-valued lengths are checked per element; a depth past int64 (which CLI11 read as INT64_MAX)
# overflowed the context size computed from it ("context sizes must not be negative").
for flag, value in (("-d", "99999999999999999999"), ("-n", "9223372036854775807"), ("-p", "1,-5"),
                    ("-p", "2147483649")):
    expect_error(["bench", "-m", model, "-p", 0, "-n", 1, "-r", 1, flag, value], "not in range 0 to 2147483648",
                 f"bench {flag} {value}")

# And a good run still works after all that.
out = harness.run(["run", "-m", model, "-p", "Once upon a time", "-n", 8, "--temp", 0])
checks.check(out.stdout.startswith("Once upon a time"), "a valid run prints the prompt and its continuation")
checks.finish()
