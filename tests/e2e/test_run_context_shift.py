"""`sparrow run --context-shift [--keep N]`: when generation fills the context, the older half of what follows the
kept prompt tokens is dropped and generation goes on (llama.cpp's context shift).

On one-layer models (llama, and deepseek32 with the indexer's selection active), whose cache rows depend only on each
token and its position, the shifted cache equals a fresh run of the shortened history: the text after the shift must
be what greedy generation from that history gives. The server (same model, greedy) supplies the token ids: the
first 58 tokens after a 6-token prompt fill a 64-cell context, the 59th is decoded after the shift, and from then on
the run must continue as /completion does from the shortened history plus that token. Also: many shifts in a long
run, the counts on stderr, --keep -1, the conversation, the refusals, and `serve --context-shift` (n_keep), whose
replies equal run's."""
import os
import re
import subprocess

import harness
import serve_util
from serve_util import norm

checks = harness.Checks()
tmp = harness.temp_dir()
CTX = 64
PROMPT = "Once upon a time"


def shifts_of(stderr):
    m = re.search(r"shifted (\d+) times? \((\d+) positions dropped after the first (\d+)\)", stderr)
    return tuple(int(g) for g in m.groups()) if m else (0, 0, 0)


def run_out(model, *args, ctx=CTX):
    proc = harness.run(["run", "-m", model, "-p", PROMPT, "-c", ctx, "--temp", "0"] + list(args))
    out = proc.stdout
    assert out.startswith(PROMPT) and out.endswith("\n"), repr(out[:100])
    return norm(out[len(PROMPT):-1]), proc.stderr


# f32 caches (the indexer's too, and its exact products): a re-rotated key then differs from a fresh one by float
# rounding alone, which leaves the indexer's top-k cut no near tie to flip.
EXACT = ["-ctk", "f32", "-ctv", "f32", "--indexer-cache-type", "f32", "--indexer-precision", "exact"]
for arch, extra in [("llama", []), ("deepseek32", ["--top-k", 16])]:
    model = serve_util.make_model(arch, os.path.join(tmp, f"{arch}-1.gguf"), "--n-layer", 1, *extra)
    with serve_util.Server(model, "-np", 1, "-c", 512, *EXACT) as srv:
        prompt = srv.request("POST", "/tokenize", {"content": PROMPT, "add_special": True})[1]["tokens"]
        n_prompt = len(prompt)
        # A BOS the prompt starts with always stays (llama.cpp's count): --keep N keeps N more.
        bos = n_prompt - len(srv.request("POST", "/tokenize", {"content": PROMPT})[1]["tokens"])
        checks.check(bos in (0, 1), f"{arch}: BOS {bos}")

        def greedy_ids(ids, n):
            body = {"prompt": ids, "n_predict": n, "temperature": 0, "n_probs": 1, "ignore_eos": True}
            return [p["id"] for p in srv.request("POST", "/completion", body)[1]["completion_probabilities"]]

        for keep in (0, 3):
            n_fill = CTX - n_prompt  # generated tokens decoded before the first shift
            first = greedy_ids(prompt, n_fill + 1)
            full = prompt + first[:n_fill]  # positions 0 .. CTX - 1
            kept = keep + bos
            n_discard = (CTX - kept) // 2
            history = full[:kept] + full[kept + n_discard:] + [first[n_fill]]
            after = greedy_ids(history, n_discard - 1)  # up to the next shift
            want = norm(srv.request("POST", "/detokenize", {"tokens": first + after})[1]["content"])
            got, err = run_out(model, "-n", len(first) + len(after), "--context-shift", "--keep", keep,
                               "--ignore-eos", *EXACT)
            checks.check(got == want, f"{arch}, --keep {keep}: the text after the shift is the shortened history's "
                                      f"continuation\n got  {got!r}\n want {want!r}")
            checks.check(shifts_of(err) == (1, n_discard, kept), f"{arch}, --keep {keep}: one shift: {shifts_of(err)}")

    # A long run: the shifts the position arithmetic predicts, whatever the text.
    n = 300
    got, err = run_out(model, "-n", n, "--context-shift", "--keep", 2, "--ignore-eos")
    pos, shifts, dropped = n_prompt, 0, 0
    for _ in range(n - 1):  # every sampled token but the last is decoded
        if pos >= CTX:
            d = (pos - 2 - bos) // 2
            pos, shifts, dropped = pos - d, shifts + 1, dropped + d
        pos += 1
    checks.check(shifts_of(err) == (shifts, dropped, 2 + bos) and "generation: 300 tokens" in err,
                 f"{arch}: 300 tokens in a 64-cell context: {shifts_of(err)} (want {(shifts, dropped, 2 + bos)})")
    _, err = run_out(model, "-n", 200, "--context-shift", "--keep", -1, "--ignore-eos")
    checks.check(shifts_of(err)[2] == n_prompt, f"{arch}: --keep -1 keeps the whole prompt: {shifts_of(err)}")
    plain, _ = run_out(model, "-n", 40, "--ignore-eos")
    shifted, _ = run_out(model, "-n", 40, "--context-shift", "--ignore-eos")
    checks.check(plain == shifted, f"{arch}: no shift before the context is full")

    # serve --context-shift: a slot of 64 cells shifts as run does (n_keep as --keep), for every endpoint.
    with serve_util.Server(model, "-np", 1, "-c", CTX, "--context-shift", *EXACT) as srv:
        for keep in (0, 5, -1):
            want, _ = run_out(model, "-n", 150, "--context-shift", "--keep", keep, "--ignore-eos", *EXACT)
            status, body = srv.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 150, "temperature": 0,
                                                               "n_keep": keep, "ignore_eos": True})
            checks.check(status == 200 and body["tokens_predicted"] == 150 and norm(body["content"]) == want,
                         f"{arch}: serve with n_keep {keep} says what run --keep {keep} says: {status} "
                         f"{norm(body.get('content', ''))!r} vs {want!r}")
        status, body = srv.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 100,
                                                               "temperature": 0, "ignore_eos": True})
        checks.check(status == 200 and body["usage"]["completion_tokens"] == 100,
                     f"{arch}: /v1/completions past the slot's context: {status} {body.get('usage')}")
        shifts = srv.metrics().get("sparrow_context_shifts_total", 0)
        checks.check(shifts > 0, f"{arch}: /metrics counts the shifts: {shifts}")
        for what, fields in [("max_tokens over 2^20", {"max_tokens": 2 ** 20 + 1}),
                             ("n_keep -2", {"max_tokens": 4, "n_keep": -2}),
                             ("n_keep a string", {"max_tokens": 4, "n_keep": "3"})]:
            status, _ = srv.request("POST", "/v1/completions", dict({"prompt": PROMPT}, **fields))
            checks.check(status == 400, f"{arch}: {what}: {status}")
    with serve_util.Server(model, "-np", 1, "-c", CTX) as srv:
        status, _ = srv.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 100})
        checks.check(status == 400, f"{arch}: without --context-shift, max_tokens past the context is refused: {status}")

# The conversation: a reply longer than the context is shifted, and the next turn still answers.
model = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
proc = subprocess.run([harness.BIN, "run", "-m", model, "--conversation", "-c", "128", "-n", "300", "--temp", "0",
                       "--ignore-eos", "--context-shift"], input="Hello there\nAnd again\n", capture_output=True,
                      text=True, errors="replace", timeout=600)
checks.check(proc.returncode == 0 and proc.stderr.count("shifted") == 2 and "turns: 2" in proc.stderr,
             f"conversation: both 300-token replies shifted: {proc.stderr[-400:]}")

# Refusals.
for what, args, needle in [
        ("--keep without --context-shift", ["-n", 10, "--keep", 2], "requires --context-shift"),
        ("-n past the context without it", ["-n", 200], "allow --context-shift"),
        ("--keep leaving no room", ["-n", 200, "--context-shift", "--keep", -1, "-c", 7], "--keep"),
        ("--keep -2", ["-n", 10, "--context-shift", "--keep", -2], "--keep")]:
    ctx = [] if "-c" in args else ["-c", CTX]
    proc = harness.run(["run", "-m", model, "-p", PROMPT] + ctx + args, check=False)
    checks.check(proc.returncode != 0 and needle in proc.stderr, f"{what}: {proc.returncode} {proc.stderr[-200:]!r}")

checks.finish()
