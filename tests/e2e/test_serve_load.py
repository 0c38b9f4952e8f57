"""scripts/serve_load.py (the serving benchmark) runs end to end on a tiny model: it starts the server, drives
1 and 2 streaming clients with token-id prompts and with text prompts, and writes a JSON summary whose counts
add up (every request answered, tokens as requested, a speed for each client count, and with two rounds each
round's speed-up over its own one-client phase); with --shared-prefix the server reads the common prompt start
once per phase, not once per request; with --long-prompt one more request per phase is answered and counted apart,
and every phase reports each request's longest stall between tokens."""
import json
import os
import subprocess
import sys

import harness

checks = harness.Checks()
tmp = harness.temp_dir()
model = os.path.join(tmp, "ds.gguf")
harness.run(["make-model", "--arch", "deepseek32", "-o", model])
script = os.path.join(harness.REPO, "scripts", "serve_load.py")

for mode, rounds, extra in [("ids", 2, ["--prompt-tokens", "12"]),
                            ("text", 1, ["--prompt-tokens", "0", "--prompt-words", "5"]),
                            ("shared", 1, ["--prompt-tokens", "4", "--shared-prefix", "40"]),
                            ("long", 1, ["--prompt-tokens", "4", "--long-prompt", "60", "--long-prompt-delay", "0",
                                         "--prefill-chunk", "8"])]:
    out = os.path.join(tmp, f"load-{mode}.json")
    proc = subprocess.run([sys.executable, script, "-m", model, "--bin", harness.BIN, "--clients", "1,2", "--requests",
                           "2", "--max-tokens", "6", "-np", "2", "-c", "256", "-t", "2", "--rounds", str(rounds), "--json", out] + extra,
                          capture_output=True, text=True, timeout=600)
    checks.check(proc.returncode == 0, f"{mode}: the load script succeeds ({proc.returncode}: {proc.stderr[-400:]})")
    if proc.returncode != 0:
        continue
    result = json.load(open(out))
    summary = {p["clients"]: p for p in result["summary"]}
    checks.check(sorted(summary) == [1, 2], f"{mode}: a summary row per client count ({sorted(summary)})")
    for n, row in summary.items():
        want = 2 * n * rounds
        checks.check(row["requests"] == want, f"{mode}: {n} clients sent {row['requests']} requests, want {want}")
        # Greedy generation on a random model may stop at an end-of-generation token: at most 6 per request.
        checks.check(0 < row["tokens"] <= 6 * want, f"{mode}: {n} clients: {row['tokens']} tokens")
        paired = row["speedup_per_round"]
        checks.check(len(paired) == rounds and all(x > 0 for x in paired),
                     f"{mode}: {n} clients: a speed-up per round ({paired})")
        if n == 1:
            checks.check(paired == [1.0] * rounds, f"{mode}: one client is its own baseline ({paired})")
        checks.check(row["tokens_per_s"] > 0, f"{mode}: {n} clients: a positive speed")
    # The server's own timing: each phase spent time in decode calls, at most its wall time.
    for ph in result["phases"]:
        checks.check(ph["decode_ms_per_call"] > 0 and 0 < ph["decode_share"] <= 1,
                     f"{mode}: {ph['clients']} clients: {ph['decode_ms_per_call']:.3f} ms per decode call, "
                     f"{ph['decode_share']:.3f} of the time in decode")
    if mode == "shared":  # 44-token prompts; the 40 they share are evaluated once in the whole run
        sent = sum(ph["prompt_tokens"] for ph in result["phases"])
        evaluated = sum(ph["prompt_tokens_evaluated"] for ph in result["phases"])
        n_requests = sum(ph["requests"] for ph in result["phases"])
        checks.check(sent == 44 * n_requests and evaluated <= sent - 40 * (n_requests - 1),
                     f"{mode}: {evaluated:.0f} of {sent:.0f} prompt tokens evaluated over {n_requests} requests")
    for ph in result["phases"]:  # each request's longest wait between two tokens, within the phase's wall time
        checks.check(0 <= ph["stall_median_s"] <= ph["stall_max_s"] < ph["wall_s"],
                     f"{mode}: {ph['clients']} clients: stalls {ph['stall_median_s']:.3f} s, {ph['stall_max_s']:.3f} s")
        long_ttft = ph["long_prompt_ttft_s"]
        if mode == "long":  # the extra request was answered (and counted apart from the clients' requests)
            checks.check(long_ttft is not None and long_ttft > 0,
                         f"{mode}: the long prompt's first token ({long_ttft})")
            checks.check(ph["prompt_tokens"] == 4 * ph["requests"] + 60,
                         f"{mode}: {ph['prompt_tokens']:.0f} prompt tokens sent with the long prompt")
        else:
            checks.check(long_ttft is None, f"{mode}: no long prompt ({long_ttft})")
    checks.check("| clients |" in proc.stdout and "vs 1 client" in proc.stdout, f"{mode}: prints the table")
checks.finish()
