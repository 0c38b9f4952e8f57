"""Bad input gets a clear error naming what was wrong and a non-zero exit, never a crash: unknown flags,
missing or malformed files, wrong tensor shapes, unknown architectures, over-long prompts, bad ids."""
import json
import os
import subprocess

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
# Output files that could not be created are refused before the prompt is decoded (nothing printed yet).
missing_dir = os.path.join(tmp, "no-such-folder")
for flag, name in (("--dump-logits", "l.npy"), ("--dump-selection", "s.json")):
    proc = harness.run(["run", "-m", model, "-p", "Once upon a time", "-n", 0, flag, os.path.join(missing_dir, name)],
                       check=False)
    checks.check(proc.returncode == 1 and flag in proc.stderr and "does not exist" in proc.stderr
                 and proc.stdout == "", f"{flag} into a missing folder fails before decoding: "
                 f"exit {proc.returncode}, stdout {proc.stdout[:40]!r}, stderr {proc.stderr.strip()[-160:]!r}")
expect_error(["run", "-m", model, "-p", "x", "-n", 0, "--dump-logits", tmp], "is a folder", "--dump-logits a folder")
# A link into a missing folder passes the folder check (its own folder exists) but cannot be opened: refused before
# decoding too.
dangling = os.path.join(tmp, "dangling.npy")
os.symlink(os.path.join(missing_dir, "x.npy"), dangling)
proc = harness.run(["run", "-m", model, "-p", "Once upon a time", "-n", 0, "--dump-logits", dangling], check=False)
checks.check(proc.returncode == 1 and "--dump-logits: cannot write" in proc.stderr and proc.stdout == "",
             f"--dump-logits onto a dangling link fails before decoding: exit {proc.returncode}, "
             f"stdout {proc.stdout[:40]!r}, stderr {proc.stderr.strip()[-160:]!r}")
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

# llama.cpp's multi-letter flags are rewritten only where a flag may stand: as a value ("-p -ub") they stay text,
# and one the subcommand lacks is refused under its own name (it was read as "-n p" and blamed --n-predict).
out = harness.run(["run", "-m", model, "-p", "-ub", "-n", 0, "--verbose-prompt"])
checks.check(out.stdout.startswith("-ub"), f"-p -ub prompts with the text '-ub': {out.stdout[:40]!r}")
expect_error(["run", "-m", model, "-np", 4, "-p", "x"], "-np", "run has no -np: named as typed")
checks.check("n-predict" not in harness.run(["run", "-m", model, "-np", 4], check=False).stderr,
             "run -np: --n-predict not blamed")
out = harness.run(["run", "-m", model, "-p", "x", "-ub", 2, "-ctk", "f32", "-n", 2, "--temp", 0])
checks.check(out.returncode == 0, "run -ub 2 -ctk f32 still works")

# A FIFO as the model is refused at once (opening it for reading waited for a writer).
fifo = os.path.join(tmp, "model.fifo")
os.mkfifo(fifo)
expect_error(["run", "-m", fifo, "-p", "x"], "not a regular file", "a FIFO as the model")

# A directory named as a file is refused, not read as an empty text.
expect_error(["run", "-m", model, "-f", tmp, "-n", 2], "is a directory", "run -f DIR")
expect_error(["run", "-m", model, "--prompt-ids", tmp, "-n", 0], "is a directory", "run --prompt-ids DIR")
expect_error(["perplexity", "-m", model, "-f", tmp], "is a directory", "perplexity -f DIR")
empty_ids = os.path.join(tmp, "empty_ids.txt")
open(empty_ids, "w").close()
expect_error(["run", "-m", model, "--prompt-ids", empty_ids, "-n", 0], "holds no token ids", "empty ids file")

# Results that cannot be written (stdout on a full disk) fail the command instead of exiting 0.
if os.path.exists("/dev/full"):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([harness.BIN, "run", "-m", model, "-p", "x", "-n", "2"], stdout=full,
                              stderr=subprocess.PIPE, text=True)
    checks.check(proc.returncode == 1 and "cannot write the output" in proc.stderr,
                 f"run > /dev/full: exit {proc.returncode}, {proc.stderr.strip()[-80:]!r}")

# -n counts the generated tokens, the last of which needs no cell: a 2-token prompt and -n 15 fit in 16.
two = os.path.join(tmp, "two_ids.txt")
with open(two, "w") as f:
    f.write("1 2")
out = harness.run(["run", "-m", model, "-c", 16, "--prompt-ids", two, "-n", 15, "--temp", 0], check=False)
checks.check(out.returncode == 0, f"2 prompt tokens + 15 generated fit in -c 16: {out.stderr.strip()[-120:]!r}")
expect_error(["run", "-m", model, "-c", 16, "--prompt-ids", two, "-n", 16], "does not fit", "-n 16 does not")

# Seeds: -1 (random) or 0 .. 2^63 - 1, checked on the text (CLI11 saturated longer numbers silently).
for seed in ("99999999999999999999999", "-2", "1e3"):
    expect_error(["run", "-m", model, "-p", "x", "-n", 1, "-s", seed], "not a seed", f"run -s {seed}")
checks.check(harness.run(["run", "-m", model, "-p", "x", "-n", 1, "-s", "9223372036854775807"]).returncode == 0,
             "run -s 2^63 - 1")

# perplexity: -c 0 is the model's context (as in run); --chunks must be positive.
text_file = os.path.join(tmp, "ppl.txt")
with open(text_file, "w") as f:
    f.write("the cat sat on the mat and looked at the dog. " * 200)
out = harness.run(["perplexity", "-m", model, "-f", text_file, "-c", 0, "--chunks", 1], check=False)
checks.check(out.returncode == 0 and "Final estimate" in out.stdout, f"perplexity -c 0: {out.stderr.strip()[-160:]!r}")
for chunks in (0, -5):
    expect_error(["perplexity", "-m", model, "-f", text_file, "--chunks", chunks], "--chunks", f"--chunks {chunks}")

# bench: a dense model runs its one mode whatever --dsa lists; -c below what a test needs is refused, and -b
# splits the prompt into decode calls.
out = harness.run(["bench", "-m", model, "-p", 16, "-n", 0, "-r", 1, "--dsa", "off", "-o", "json"])
checks.check(len(json.loads(out.stdout)) == 1, f"bench --dsa off on a dense model runs one test: {out.stdout[:200]!r}")
expect_error(["bench", "-m", model, "-p", 64, "-n", 0, "-r", 1, "-c", 8], "-c 8 is smaller", "bench -c too small")
out = harness.run(["bench", "-m", model, "-p", 64, "-n", 0, "-r", 1, "-b", 16, "-o", "json"])
checks.check(len(json.loads(out.stdout)) == 1, "bench -b 16 runs pp64 in calls of 16")

# make-model refuses flags of another architecture family instead of ignoring them.
for flags in (["--yarn"], ["--top-k", 5], ["--indexer-types", "1,0"], ["--n-expert", 4], ["--no-probs-bias"]):
    expect_error(["make-model", "--arch", "llama", "-o", os.path.join(tmp, "y.gguf")] + flags,
                 f"{flags[0]} applies to deepseek32 and glm-dsa", f"make-model llama {flags[0]}")
expect_error(["make-model", "--arch", "deepseek32", "-o", os.path.join(tmp, "y.gguf"), "--n-head-kv", 2],
             "--n-head-kv applies to llama", "make-model deepseek32 --n-head-kv")

# And a good run still works after all that.
out = harness.run(["run", "-m", model, "-p", "Once upon a time", "-n", 8, "--temp", 0])
checks.check(out.stdout.startswith("Once upon a time"), "a valid run prints the prompt and its continuation")
checks.finish()
