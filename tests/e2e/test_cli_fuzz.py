"""Random command lines: every subcommand with random flags at boundary values (0, -1, huge, NaN, not a
number, empty) must finish within its time limit with exit 0, or with a non-zero exit (not a signal, not an
abort) and a message on stderr. test_cli_errors.py checks chosen cases and their messages; this one looks for
the combinations nobody chose (it found `-t 100000` trying to start 100,000 threads).

SPARROW_FUZZ_ITERATIONS and SPARROW_FUZZ_SEED make longer runs by hand."""
import os
import random

import harness

checks = harness.Checks()
tmp = harness.temp_dir()
asan = "asan" in harness.BIN
iterations = int(os.environ.get("SPARROW_FUZZ_ITERATIONS", "40" if asan else "120"))
rng = random.Random(int(os.environ.get("SPARROW_FUZZ_SEED", "7")))

models = {}
for arch in ("llama", "deepseek32"):
    models[arch] = os.path.join(tmp, f"{arch}.gguf")
    harness.run(["make-model", "--arch", arch, "-o", models[arch], "--n-layer", 2])
text = os.path.join(tmp, "text.txt")
harness.write_word_text(text, __import__("numpy").random.default_rng(0), 600)
ids = os.path.join(tmp, "ids.txt")
with open(ids, "w") as f:
    f.write("1, 2, 3 400 5\n")

INTS = ["0", "1", "2", "3", "7", "33", "64", "-1", "-7", "4097", "100000", "2147483648", "99999999999999999999",
        "x", "", "1.5"]
FLOATS = ["0", "0.5", "1", "2", "-1", "nan", "inf", "-inf", "1e30", "1e-30", "x", ""]
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", ""]
# flag -> values, per family of subcommands
COMMON = {"-c": INTS, "-b": INTS, "--ubatch-size": INTS, "-t": INTS, "--cache-type-k": TYPES,
          "--cache-type-v": TYPES, "--cache-rotation": ["auto", "on", "off", "x"], "--dsa-top-k": INTS,
          "--dsa-sink": INTS, "--indexer-cache-type": TYPES, "--dsa-stats": None, "--no-repack": None}
SAMPLING = {"--temp": FLOATS, "--top-k": INTS, "--top-p": FLOATS, "--min-p": FLOATS, "-s": INTS,
            "--presence-penalty": FLOATS, "--frequency-penalty": FLOATS, "--repeat-penalty": FLOATS,
            "--repeat-last-n": INTS, "--ignore-eos": None,
            "-l": ["5+1", "5-inf", "0-2.5", "511+100", "512+1", "5+inf", "5", "+1", "x", "", "99999999999999999999+1"]}
FLAGS = {
    "run": {**COMMON, **SAMPLING, "--dsa": ["on", "off", "x"], "--indexer-precision": ["exact", "fast", "x"],
            "-n": ["0", "1", "5", "-1", "x"], "--dump-logits": [os.path.join(tmp, "l.npy"), "/nonexistent/l.npy"],
            "--dump-selection": [os.path.join(tmp, "s.json"), "/nonexistent/s.json"],
            # alone (--context-shift with -n -1 and --ignore-eos would generate for ever, as it should): refused
            "--keep": INTS},
    "perplexity": {**COMMON, "--dsa": ["on", "off"], "--chunks": INTS, "--kl-top": INTS,
                   "--kl-divergence-base": [os.path.join(tmp, "kl.bin")],
                   "--kl-divergence": [os.path.join(tmp, "kl.bin"), text, "/nonexistent"]},
    # -p 100000 is a valid request that takes minutes on the tiny model (a quadratic prefill): huge values here
    # are ones that must be refused.
    "bench": {**COMMON, "-p": ["0", "1", "8", "1,2", "-5", "x", "4097", "2147483649", "99999999999999999999"], "-n": ["0", "1", "4", "-1", "x"],
              "-d": ["0", "64", "0,128", "-1", "5000", "x", "99999999999999999999"], "--dsa": ["on", "off", "on,off", "x"],
              "-r": INTS, "-o": ["md", "json", "x"]},
    "batched": {**COMMON, **SAMPLING, "--parallel": INTS, "-n": ["1", "3", "0", "-1", "100000", "x"],
                "--compare-single": None, "--quiet": None},
}


def base(cmd, model):
    if cmd == "run":
        return ["run", "-m", model] + (["--prompt-ids", ids] if rng.random() < 0.3 else ["-p", "Once upon a time"])
    if cmd == "perplexity":
        return ["perplexity", "-m", model, "-f", text, "-c", "64", "--chunks", "2"]
    if cmd == "bench":
        return ["bench", "-m", model, "-p", "4", "-n", "2", "-r", "1"]
    return ["batched", "-m", model, "-p", "Once upon", "-n", "2", "--parallel", "2", "--quiet"]


n_ran = 0
for it in range(iterations):
    cmd = rng.choice(list(FLAGS))
    args = base(cmd, models[rng.choice(list(models))])
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.05:
            args.append(rng.choice(["--bogus", "-Z", "--", "-", "--threads=", "-m"]))
            continue
        flag, values = rng.choice(list(FLAGS[cmd].items()))
        args.append(flag)
        if values is not None and r > 0.08:  # sometimes the value is missing
            args.append(rng.choice(values))
    what = " ".join(args[:1] + args[3:])
    try:
        proc = harness.run(args, check=False, timeout=120)
    except Exception as e:  # subprocess.TimeoutExpired
        checks.check(False, f"{what}: {type(e).__name__}")
        continue
    crashed = proc.returncode < 0 or proc.returncode >= 128
    ok = not crashed and (proc.returncode == 0 or proc.stderr.strip() != "")
    n_ran += proc.returncode == 0
    if os.environ.get("SPARROW_FUZZ_VERBOSE"):
        print(proc.returncode, what, proc.stderr.strip()[-120:].replace("\n", " | "))
    if ok:
        checks.passed += 1
    else:
        checks.check(False, f"{what}: exit {proc.returncode}, stderr {proc.stderr.strip()[-300:]!r}")

print(f"{iterations} random command lines, {n_ran} ran to the end, the others were refused")
# Both outcomes must be common, or the flags are too tame or too broken to reach the engine.
checks.check(n_ran >= iterations // 8 and iterations - n_ran >= iterations // 8, "both outcomes are common")
checks.finish()
