#!/usr/bin/env python3
"""Load test for `sparrow serve`: throughput and latency with 1, 4 and 8 concurrent streaming clients.

Starts the server itself (or uses --url), then for each client count runs that many threads, each sending
streaming /v1/completions requests (distinct prompts, a fixed number of tokens) until it has sent --requests or
the phase's --time-limit passes. Prompts are --prompt-tokens token ids (distinct per request, the same length
whatever the model's tokenizer), or with --prompt-tokens 0 text of --prompt-words words; --shared-prefix N puts
the same N token ids (a system prompt) before every prompt; --long-prompt N sends one more request per phase, of
N prompt tokens, while the clients stream (how long the running streams stall while the server reads it). Reports
per phase: requests, generated tokens, aggregate tokens/s, time to first token and per-request latency (median and
p90), each request's longest wait between two tokens (median and the phase's longest), the server's time per decode
call and its share of the phase (from /metrics: how much the steps slow down, and how long the scheduler waits
between them), the prompt tokens the server evaluated against those sent (a shared prefix is read once), and the
speed-up over one client (the ratio of the medians over rounds, and the median of each round's ratio to its own
one-client phase).
Standard library only.

    build/sparrow make-model --arch deepseek32 --preset bench -o /tmp/bench.gguf
    scripts/serve_load.py -m /tmp/bench.gguf --clients 1,4,8
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

WORDS = ("river stone cloud dragon lamp forest tiny blue seven apple mountain quiet letter window garden "
         "silver morning candle harbor engine paper violet thunder meadow").split()


def prompt_for(i, n_words):
    return " ".join(WORDS[(i * 7 + j * 3 + j * j) % len(WORDS)] for j in range(n_words)) + f" ({i})"


def prompt_ids(i, n_tokens, n_vocab):
    """n_tokens ids, distinct per request index i, away from the low ids where special tokens usually sit."""
    lo, span = 100, max(1, min(n_vocab, 30000) - 100)
    return [lo + (i * 7919 + j * 104729 + j * j * 31) % span for j in range(n_tokens)]


def model_vocab(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", "/v1/models")
        return int(json.loads(conn.getresponse().read())["data"][0]["meta"]["n_vocab"])
    finally:
        conn.close()


def stream_one(host, port, body, timeout):
    """One streaming request; returns (ttft_s, latency_s, completion_tokens, stall_s): stall_s is the longest wait
    between two events that carried text, after the first (0 with fewer than two)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        ttft = None
        tokens = 0
        last_text = None
        stall = 0.0
        while True:
            line = resp.fp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                raise RuntimeError(f"stream error: {event['error']}")
            if event["choices"] and event["choices"][0].get("text"):
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - t0
                else:
                    stall = max(stall, now - last_text)
                last_text = now
            if "usage" in event:
                tokens = event["usage"]["completion_tokens"]
        latency = time.perf_counter() - t0
        return (ttft if ttft is not None else latency), latency, tokens, stall
    finally:
        conn.close()


def server_counters(host, port):
    """(generated tokens, decode calls, decode seconds, prompt tokens, prompt tokens evaluated) from /metrics, or
    None when unavailable."""
    try:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        return (float(values["sparrow_generated_tokens_total"]), float(values["sparrow_decode_calls_total"]),
                float(values["sparrow_decode_seconds_total"]), float(values["sparrow_prompt_tokens_total"]),
                float(values["sparrow_prompt_tokens_evaluated_total"]))
    except (OSError, KeyError, ValueError):
        return None


def run_phase(host, port, n_clients, args, first_index):
    results, errors = [], []
    lock = threading.Lock()
    deadline = time.perf_counter() + args.time_limit

    def client(c):
        for r in range(args.requests):
            if time.perf_counter() > deadline:
                return
            i = first_index + c * args.requests + r
            prompt = args.prefix + prompt_ids(i, args.prompt_tokens, args.n_vocab) if args.prompt_tokens > 0 \
                else prompt_for(i, args.prompt_words)
            body = {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "stream": True}
            try:
                res = stream_one(host, port, body, timeout=args.time_limit + 600)
                with lock:
                    results.append(res)
            except Exception as e:  # counted and reported
                with lock:
                    errors.append(str(e))

    long_result = []

    def long_client():
        # After the streams have started: one request whose prompt the server reads while they run.
        time.sleep(args.long_prompt_delay)
        body = {"prompt": prompt_ids(2 * 10 ** 6 + first_index, args.long_prompt, args.n_vocab), "max_tokens": 4,
                "temperature": 0, "stream": True}
        try:
            long_result.append(stream_one(host, port, body, timeout=args.time_limit + 600))
        except Exception as e:  # counted and reported
            with lock:
                errors.append(f"long prompt: {e}")

    before = server_counters(host, port)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(n_clients)]
    if args.long_prompt > 0:
        threads.append(threading.Thread(target=long_client))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = server_counters(host, port)
    # Generated tokens per decoded batch: how many slots the scheduler batched together (prompt-only batches
    # count too, so this stays a little under the number of clients).
    per_batch = (after[0] - before[0]) / max(1.0, after[1] - before[1]) if before and after else float("nan")
    # The scheduler's time inside decode calls: per call, and as a share of the phase's wall time (the rest is
    # the server's own work between steps and steps waiting for requests).
    step_ms = 1e3 * (after[2] - before[2]) / max(1.0, after[1] - before[1]) if before and after else float("nan")
    decode_share = (after[2] - before[2]) / wall if before and after and wall > 0 else float("nan")
    prompt_sent = after[3] - before[3] if before and after else float("nan")
    prompt_evaluated = after[4] - before[4] if before and after else float("nan")
    tokens = sum(r[2] for r in results)
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")  # noqa: E731
    return {
        "clients": n_clients,
        "requests": len(results),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "tokens_per_batch": per_batch,
        "decode_ms_per_call": step_ms,
        "decode_share": decode_share,
        "prompt_tokens": prompt_sent,
        "prompt_tokens_evaluated": prompt_evaluated,
        "ttft_median_s": statistics.median([r[0] for r in results]) if results else float("nan"),
        "ttft_p90_s": q([r[0] for r in results], 0.9),
        "latency_median_s": statistics.median([r[1] for r in results]) if results else float("nan"),
        "latency_p90_s": q([r[1] for r in results], 0.9),
        # Each request's longest wait between two tokens: the median request's, and the longest in the phase.
        "stall_median_s": statistics.median([r[3] for r in results]) if results else float("nan"),
        "stall_max_s": max([r[3] for r in results], default=float("nan")),
        "long_prompt_ttft_s": long_result[0][0] if long_result else None,
    }


def start_server(args):
    log = tempfile.NamedTemporaryFile("w+", prefix="serve-load-", suffix=".log", delete=False)
    cmd = [args.bin, "serve", "-m", args.model, "--port", "0", "-np", str(args.parallel), "-c", str(args.ctx)]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    if args.prefill_chunk:
        cmd += ["--prefill-chunk", str(args.prefill_chunk)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited: {open(log.name).read()}")
        m = re.search(r"listening on http://[^:]+:(\d+)", open(log.name).read())
        if m:
            return proc, int(m.group(1)), log.name
        time.sleep(0.1)
    proc.kill()
    sys.exit("the server did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", help="GGUF to serve (the script starts `sparrow serve`)")
    ap.add_argument("--url", help="use a running server instead, e.g. http://127.0.0.1:8080")
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "sparrow"))
    ap.add_argument("--clients", default="1,4,8", help="client counts, one phase each")
    ap.add_argument("--requests", type=int, default=3, help="requests per client per phase")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the client counts this many times, interleaved; the summary takes medians (a shared "
                         "machine's load changes over time)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per request")
    ap.add_argument("--prompt-tokens", type=int, default=32,
                    help="prompt length in token ids (0: text prompts of --prompt-words words instead)")
    ap.add_argument("--prompt-words", type=int, default=24, help="words per text prompt (with --prompt-tokens 0)")
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="token ids every prompt begins with (a system prompt; needs --prompt-tokens > 0)")
    ap.add_argument("--long-prompt", type=int, default=0,
                    help="token ids of one more request per phase, sent while the clients stream "
                         "(needs --prompt-tokens > 0)")
    ap.add_argument("--long-prompt-delay", type=float, default=0.5, help="seconds into a phase the long prompt is sent")
    ap.add_argument("--prefill-chunk", type=int, default=0, help="the server's --prefill-chunk (0: its default)")
    ap.add_argument("--time-limit", type=float, default=240, help="seconds per phase after which no request starts")
    ap.add_argument("-np", "--parallel", type=int, default=8, help="server slots")
    ap.add_argument("-c", "--ctx", type=int, default=2048, help="server context")
    ap.add_argument("-t", "--threads", type=int, default=0, help="server threads (0 = all)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if not args.model and not args.url:
        ap.error("give -m MODEL or --url")
    if args.shared_prefix < 0 or (args.shared_prefix > 0 and args.prompt_tokens <= 0):
        ap.error("--shared-prefix takes a count >= 0 and token-id prompts (--prompt-tokens > 0)")
    if args.long_prompt < 0 or (args.long_prompt > 0 and args.prompt_tokens <= 0):
        ap.error("--long-prompt takes a count >= 0 and token-id prompts (--prompt-tokens > 0)")

    proc = None
    if args.url:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname, u.port or 80
    else:
        proc, port, log = start_server(args)
        host = "127.0.0.1"
    try:
        args.n_vocab = model_vocab(host, port) if args.prompt_tokens > 0 else 0
        args.prefix = prompt_ids(10 ** 6, args.shared_prefix, args.n_vocab) if args.shared_prefix > 0 else []
        # Warm-up: one short request (page in the weights).
        stream_one(host, port, {"prompt": "warm up", "max_tokens": 4, "temperature": 0, "stream": True}, 600)
        phases = []
        first = 0
        counts = [int(x) for x in args.clients.split(",")]
        for n in counts * args.rounds:
            res = run_phase(host, port, n, args, first)
            first += n * args.requests
            phases.append(res)
            print(f"{n} clients: {res['requests']} requests, {res['tokens']} tokens in {res['wall_s']:.1f} s = "
                  f"{res['tokens_per_s']:.2f} tokens/s; first token median {res['ttft_median_s']:.2f} s "
                  f"(p90 {res['ttft_p90_s']:.2f}); request median {res['latency_median_s']:.2f} s "
                  f"(p90 {res['latency_p90_s']:.2f}); longest stall between tokens median "
                  f"{res['stall_median_s']:.3f} s "
                  f"(max {res['stall_max_s']:.3f})"
                  + (f"; long prompt first token {res['long_prompt_ttft_s']:.2f} s"
                     if res["long_prompt_ttft_s"] is not None else "")
                  + f"; {res['tokens_per_batch']:.2f} tokens per batch; "
                  f"{res['decode_ms_per_call']:.2f} ms per decode call, {100 * res['decode_share']:.0f}% of the time "
                  f"in decode; prompt tokens evaluated {res['prompt_tokens_evaluated']:.0f} of "
                  f"{res['prompt_tokens']:.0f}; errors {res['errors']}"
                  + (f" ({res['first_error']})" if res["first_error"] else ""), flush=True)
        # Per client count, the median over rounds of each figure.
        summary = []
        for n in dict.fromkeys(counts):
            rows = [p for p in phases if p["clients"] == n]
            med = lambda key: statistics.median([r[key] for r in rows])  # noqa: E731
            summary.append({"clients": n, "rounds": len(rows), "requests": sum(r["requests"] for r in rows),
                            "tokens": sum(r["tokens"] for r in rows), "tokens_per_s": med("tokens_per_s"),
                            "tokens_per_batch": med("tokens_per_batch"),
                            "decode_ms_per_call": med("decode_ms_per_call"), "decode_share": med("decode_share"),
                            "ttft_median_s": med("ttft_median_s"), "ttft_p90_s": med("ttft_p90_s"),
                            "latency_median_s": med("latency_median_s"), "latency_p90_s": med("latency_p90_s"),
                            "stall_median_s": med("stall_median_s"), "stall_max_s": med("stall_max_s")})
        base = next((p["tokens_per_s"] for p in summary if p["clients"] == 1), None)
        # Each round's speed-up over the same round's one-client phase, which ran minutes apart at most: on a
        # shared machine whose speed drifts, the median of these paired ratios is steadier than the ratio of
        # the medians.
        per_round = {}
        if 1 in counts:
            for r in range(args.rounds):
                row = phases[r * len(counts):(r + 1) * len(counts)]
                one = next(p["tokens_per_s"] for p in row if p["clients"] == 1)
                for p in row:
                    per_round.setdefault(p["clients"], []).append(p["tokens_per_s"] / one if one > 0 else 0.0)
        for p in summary:
            p["speedup_per_round"] = per_round.get(p["clients"], [])
        print(f"\nmedians over {args.rounds} round(s):")
        print("| clients | requests | tokens | tokens/s | vs 1 client | vs 1 client, per round (median) "
              "| tokens per batch | ms per decode call (time in decode) | first token (median, p90) "
              "| request (median, p90) | longest stall (median, max) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for p in summary:
            ratio = f"{p['tokens_per_s'] / base:.2f}x" if base else "-"
            rounds = p["speedup_per_round"]
            paired = (f"{statistics.median(rounds):.2f}x ({', '.join(f'{x:.2f}' for x in rounds)})" if rounds
                      else "-")
            print(f"| {p['clients']} | {p['requests']} | {p['tokens']} | {p['tokens_per_s']:.2f} | {ratio} | {paired} | "
                  f"{p['tokens_per_batch']:.2f} | {p['decode_ms_per_call']:.2f} ({100 * p['decode_share']:.0f}%) | "
                  f"{p['ttft_median_s']:.2f} s, {p['ttft_p90_s']:.2f} s | "
                  f"{p['latency_median_s']:.2f} s, {p['latency_p90_s']:.2f} s | "
                  f"{p['stall_median_s']:.3f} s, {p['stall_max_s']:.3f} s |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "phases": phases, "summary": summary}, f, indent=2)
        return 1 if any(p["errors"] for p in phases) else 0
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
