"""`sparrow run` and `batched` take the server's logit adjustments as flags (--logit-bias, --repeat-penalty,
--repeat-last-n, --presence-penalty, --frequency-penalty, DRY's --dry-*, --ignore-eos): greedy `run` with each equals the server's
/completion with the same settings (one LogitAdjuster under both), and bad values are refused with the flag named."""
import os
import re

import harness
import serve_util
from serve_util import norm

checks = harness.Checks()
tmp = harness.temp_dir()
model = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
PROMPT = "Once upon a time"
N = 16


def generated_count(stderr):
    m = re.search(r"generation: (\d+) tokens", stderr)
    return int(m.group(1)) if m else -1


plain = serve_util.run_greedy(model, PROMPT, N)
with serve_util.Server(model, "-np", 1, "-c", 512) as srv:
    base = {"prompt": PROMPT, "n_predict": N, "temperature": 0, "n_probs": 1}
    first = srv.request("POST", "/completion", base)[1]["completion_probabilities"][0]["id"]
    cases = [
        ("ban greedy's first token", ["-l", f"{first}-inf"], {"logit_bias": [[first, False]]}),
        ("bias a token up", ["--logit-bias", f"{first}-3.5", "-l", "5+2"], {"logit_bias": [[first, -3.5], [5, 2]]}),
        ("repeat penalty over everything", ["--repeat-penalty", "0.05", "--repeat-last-n", "-1"],
         {"repeat_penalty": 0.05, "repeat_last_n": -1}),
        ("repeat penalty over 4 tokens", ["--repeat-penalty", "0.05", "--repeat-last-n", "4"],
         {"repeat_penalty": 0.05, "repeat_last_n": 4}),
        ("presence and frequency penalties", ["--presence-penalty", "-2", "--frequency-penalty", "-1.5"],
         {"presence_penalty": -2, "frequency_penalty": -1.5}),
    ]
    for what, flags, fields in cases:
        got = serve_util.run_greedy(model, PROMPT, N, *flags)
        want = norm(srv.request("POST", "/completion", dict(base, **fields))[1]["content"])
        checks.check(got == want, f"{what}: run equals /completion ({got!r} vs {want!r})")
        checks.check(got != plain, f"{what}: the greedy text changes")
    # DRY: a word's token biased up by 100 repeats it all along; DRY's penalty, growing with the repeat,
    # breaks it: run and /completion alike, with the breakers each is given.
    word = srv.request("POST", "/tokenize", {"content": " the"})[1]["tokens"][0]
    piece = srv.request("POST", "/detokenize", {"tokens": [word]})[1]["content"]
    push = (["-l", f"{word}+100"], {"logit_bias": [[word, 100]]})
    repeated = serve_util.run_greedy(model, PROMPT, N, *push[0])
    for what, flags, fields in [
            ("DRY from one repeated token", ["--dry-multiplier", "3", "--dry-allowed-length", "1"],
             {"dry_multiplier": 3, "dry_allowed_length": 1}),
            ("DRY over the last 6 tokens, base 3", ["--dry-multiplier", "5", "--dry-base", "3",
                                                    "--dry-penalty-last-n", "6"],
             {"dry_multiplier": 5, "dry_base": 3, "dry_penalty_last_n": 6}),
            ("DRY with no breaker", ["--dry-multiplier", "3", "--dry-sequence-breaker", "none"],
             {"dry_multiplier": 3, "dry_sequence_breakers": []})]:
        got = serve_util.run_greedy(model, PROMPT, N, *push[0], *flags)
        want = norm(srv.request("POST", "/completion", dict(base, **push[1], **fields))[1]["content"])
        checks.check(got == want, f"{what}: run equals /completion ({got!r} vs {want!r})")
        checks.check(got != repeated, f"{what}: the repeat is broken ({repeated!r})")
    # The repeated token's own text as the breaker: no repeat reaches back past it, so nothing is penalised.
    flags = ["--dry-multiplier", "3", "--dry-allowed-length", "1", "--dry-sequence-breaker", piece]
    got = serve_util.run_greedy(model, PROMPT, N, *push[0], *flags)
    want = norm(srv.request("POST", "/completion", dict(base, **push[1], dry_multiplier=3, dry_allowed_length=1,
                                                       dry_sequence_breakers=[piece]))[1]["content"])
    checks.check(got == want == repeated, f"DRY, the token's text {piece!r} a breaker: nothing changes ({got!r})")

# Sampled (not greedy), with typical-p and XTC: the same seed draws the same text from run and /completion (one
# Sampler under both), and the settings change it.
with serve_util.Server(model, "-np", 1, "-c", 512) as srv:
    def sampled_run(*flags):
        out = harness.run(["run", "-m", model, "-p", PROMPT, "-n", N, "-s", 7, "--temp", "1.2"] + list(flags)).stdout
        return norm(out[len(PROMPT):-1])

    def sampled_serve(**fields):
        body = dict({"prompt": PROMPT, "n_predict": N, "seed": 7, "temperature": 1.2}, **fields)
        return norm(srv.request("POST", "/completion", body)[1]["content"])

    base_text = sampled_run()
    checks.check(base_text == sampled_serve(), "sampled: run and /completion draw the same text from one seed")
    for what, flags, fields in [
            ("typical 0.5", ["--typical", "0.5"], {"typical_p": 0.5}),
            ("top-n-sigma 0.5", ["--top-n-sigma", "0.5"], {"top_n_sigma": 0.5}),
            ("top-n-sigma 2 with typical 0.9", ["--top-n-sigma", "2", "--typical", "0.9"],
             {"top_n_sigma": 2, "typical_p": 0.9}),
            ("dynatemp 1.0, exponent 0.5", ["--dynatemp-range", "1.0", "--dynatemp-exp", "0.5"],
             {"dynatemp_range": 1.0, "dynatemp_exponent": 0.5}),
            ("mirostat 1, tau 3", ["--mirostat", "1", "--mirostat-ent", "3"], {"mirostat": 1, "mirostat_tau": 3}),
            ("mirostat 2, tau 2, eta 0.3", ["--mirostat", "2", "--mirostat-ent", "2", "--mirostat-lr", "0.3"],
             {"mirostat": 2, "mirostat_tau": 2, "mirostat_eta": 0.3}),
            ("xtc always, above 0.02", ["--xtc-probability", "1", "--xtc-threshold", "0.02"],
             {"xtc_probability": 1, "xtc_threshold": 0.02}),
            ("typical 0.8 and xtc 0.5 above 0.05", ["--typical", "0.8", "--xtc-probability", "0.5",
                                                    "--xtc-threshold", "0.05"],
             {"typical_p": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.05})]:
        got = sampled_run(*flags)
        checks.check(got == sampled_serve(**fields), f"sampled, {what}: run equals /completion ({got!r})")
        checks.check(got != base_text, f"sampled, {what}: the text changes")

# --ignore-eos: with the end-of-generation token biased to the top, run stops at once; with --ignore-eos it
# generates all -n tokens.
eos = int(re.search(r"tokenizer\.ggml\.eos_token_id\s+u32\s+(\d+)", harness.run(["inspect", model]).stdout).group(1))
up = f"{eos}+100"
proc = harness.run(["run", "-m", model, "-p", PROMPT, "-n", N, "--temp", "0", "-l", up])
checks.check(generated_count(proc.stderr) == 1, f"EOS biased up: one token sampled, the EOS ({proc.stderr[-200:]!r})")
proc = harness.run(["run", "-m", model, "-p", PROMPT, "-n", N, "--temp", "0", "-l", up, "--ignore-eos"])
checks.check(generated_count(proc.stderr) == N, f"--ignore-eos: all {N} tokens ({proc.stderr[-200:]!r})")
proc = harness.run(["batched", "-m", model, "-p", PROMPT, "-n", N, "-np", 2, "--temp", "0", "-l", up,
                    "--ignore-eos"])
checks.check(generated_count(proc.stderr) == 2 * N, f"batched --ignore-eos: 2 x {N} tokens")
proc = harness.run(["batched", "-m", model, "-p", PROMPT, "-n", N, "-np", 2, "--temp", "0", "-l", up])
checks.check(generated_count(proc.stderr) == 2, f"batched, EOS biased up: each sequence stops at once")

# The sampling line on stderr names what is in force.
line = next(l for l in proc.stderr.splitlines() if "sampling:" in l)
checks.check("1 logit bias," in line and "min-p 0.05" in line, f"batched's sampling line names the bias: {line!r}")
proc = harness.run(["run", "-m", model, "-p", PROMPT, "-n", 1, "--repeat-penalty", 1.1, "--repeat-last-n", -1,
                    "--presence-penalty", 0.5, "--ignore-eos"])
line = next(l for l in proc.stderr.splitlines() if "sampling:" in l)
checks.check("presence-penalty 0.50, repeat-penalty 1.10 over the whole sequence, ignore-eos" in line,
             f"run's sampling line names the adjustments: {line!r}")

for bad, needle in (("abc", "TOKEN_ID+BIAS"), ("5*3", "TOKEN_ID+BIAS"), ("5+inf", "TOKEN_ID+BIAS"), ("5+", "TOKEN_ID+BIAS"),
                    ("-5+1", "TOKEN_ID+BIAS"), ("5+1e999", "TOKEN_ID+BIAS"), ("99999+1", "outside the vocabulary")):
    harness.expect_error(checks, ["run", "-m", model, "-p", "x", "-n", 1, "-l", bad], needle, f"--logit-bias {bad}")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--repeat-penalty", "0"], "--repeat-penalty",
                     "--repeat-penalty 0")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--repeat-last-n", "-2"], "--repeat-last-n",
                     "--repeat-last-n -2")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--presence-penalty", "3"], "--presence-penalty",
                     "--presence-penalty 3")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--typical", "1.5"], "--typical", "--typical 1.5")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--top-n-sigma", "-3"], "--top-n-sigma", "--top-n-sigma -3")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--dynatemp-range", "-1"], "--dynatemp-range",
                     "--dynatemp-range -1")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--mirostat", "3"], "--mirostat", "--mirostat 3")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--dry-allowed-length", "0"], "--dry-allowed-length",
                     "--dry-allowed-length 0")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--dry-base", "0.5"], "--dry-base", "--dry-base 0.5")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--dry-sequence-breaker", ""], "--dry-sequence-breaker",
                     "--dry-sequence-breaker ''")
proc = harness.run(["run", "-m", model, "-p", PROMPT, "-n", 1, "--dry-multiplier", 0.8])
line = next(l for l in proc.stderr.splitlines() if "sampling:" in l)
checks.check("dry 0.80 x 1.75^(length - 2) over the whole sequence" in line, f"run's sampling line names DRY: {line!r}")
harness.expect_error(checks, ["run", "-m", model, "-p", "x", "--xtc-probability", "-0.1"], "--xtc-probability",
                     "--xtc-probability -0.1")
checks.finish()
