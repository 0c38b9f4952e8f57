"""`sparrow serve` under load: 16 streaming clients over 4 slots each get exactly the greedy text the same
request gets alone, with no errors, and /metrics counts what was sent; a client that hangs up mid-stream
frees its slot for the next request."""
import json
import os
import threading
import time

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()
model = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
N_CLIENTS = 8 if serve_util.LIGHT else 16
N_TOKENS = 12 if serve_util.LIGHT else 32
WORDS = ["apple", "river", "stone", "cloud", "dragon", "lamp", "forest", "tiny", "blue", "seven"]
# Different lengths and texts; a few share a prefix so slots get to reuse cached prompts.
prompts = [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(2 + i % 5)) for i in range(N_CLIENTS)]
prompts[1] = prompts[0] + " and more"


def completion_request(prompt):
    return {"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0}


with serve_util.Server(model, "-np", 4, "-c", 1024) as srv:
    # Each request alone first.
    alone = []
    for p in prompts:
        status, body = srv.request("POST", "/v1/completions", completion_request(p))
        assert status == 200, body
        alone.append(body)
    before = srv.metrics()

    def client(i):
        status, events, done = srv.stream("/v1/completions", completion_request(prompts[i]))
        text = "".join(e["choices"][0].get("text", "") for e in events if "choices" in e)
        return status, done, text, events[-1] if events else {}

    t0 = time.time()
    results = serve_util.parallel(client, [(i,) for i in range(N_CLIENTS)])
    wall = time.time() - t0
    errors = [r for r in results if r[0] != 200 or not r[1] or "error" in r[3]]
    checks.check(not errors, f"{N_CLIENTS} concurrent streams over 4 slots: no errors ({wall:.1f} s)")
    same = [serve_util.norm(r[2]) == serve_util.norm(a["choices"][0]["text"]) for r, a in zip(results, alone)]
    checks.check(all(same), f"every concurrent greedy output equals the same request alone ({sum(same)}/{len(same)})")

    after = srv.metrics()
    key = 'sparrow_http_requests_total{path="/v1/completions",status="200"}'
    checks.check(after.get(key) == 2 * N_CLIENTS, f"/metrics counts {2 * N_CLIENTS} completions: {after.get(key)}")
    sent_prompt = sum(r[3]["usage"]["prompt_tokens"] for r in results)
    sent_gen = sum(r[3]["usage"]["completion_tokens"] for r in results)
    d_prompt = after["sparrow_prompt_tokens_total"] - before["sparrow_prompt_tokens_total"]
    d_gen = after["sparrow_generated_tokens_total"] - before["sparrow_generated_tokens_total"]
    checks.check(d_prompt == sent_prompt, f"/metrics prompt tokens {d_prompt} = sum of usage {sent_prompt}")
    checks.check(d_gen == sent_gen, f"/metrics generated tokens {d_gen} = sum of usage {sent_gen}")
    checks.check(after['sparrow_tasks_total{result="completed"}'] == 2 * N_CLIENTS, "every task completed")
    # The latency histograms: one first token per request, every later token one inter-token time, and the
    # cumulative buckets end at the count.
    d_first = after["sparrow_time_to_first_token_seconds_count"] - before["sparrow_time_to_first_token_seconds_count"]
    d_inter = after["sparrow_inter_token_seconds_count"] - before["sparrow_inter_token_seconds_count"]
    checks.check(d_first == N_CLIENTS and d_first + d_inter == sent_gen,
                 f"/metrics latency counts: {d_first} first tokens, {d_inter} inter-token times, {sent_gen} tokens")
    for name in ("sparrow_time_to_first_token_seconds", "sparrow_inter_token_seconds"):
        buckets = [v for k, v in after.items() if k.startswith(name + "_bucket")]
        checks.check(buckets == sorted(buckets) and buckets[-1] == after[name + "_count"] and after[name + "_sum"] > 0,
                     f"{name}: cumulative buckets {buckets}")
    d_calls = after["sparrow_decode_calls_total"] - before["sparrow_decode_calls_total"]
    checks.check(d_calls < sent_gen, f"slots decoded together: {d_calls} batches for {sent_gen} tokens")
    checks.check(after["sparrow_slots_busy"] == 0 and after["sparrow_queue_depth"] == 0, "all slots idle again")
    checks.check(srv.close() == 0, "the server stops cleanly (no leaks under ASan)")

# The DSA model (MLA, MoE, the indexer with its selection active): batching must not change any output either.
ds = serve_util.make_model("deepseek32", os.path.join(tmp, "ds.gguf"))
with serve_util.Server(ds, "-np", 4, "-c", 1024, "--dsa-top-k", 4) as srv:
    n = N_CLIENTS // 2
    alone = [srv.request("POST", "/v1/completions", completion_request(p))[1] for p in prompts[:n]]
    results = serve_util.parallel(lambda i: srv.stream("/v1/completions", completion_request(prompts[i])),
                                  [(i,) for i in range(n)])
    texts = ["".join(e["choices"][0].get("text", "") for e in r[1] if "choices" in e) for r in results]
    same = [serve_util.norm(t) == serve_util.norm(a["choices"][0]["text"]) for t, a in zip(texts, alone)]
    checks.check(all(r[0] == 200 and r[2] for r in results) and all(same),
                 f"deepseek32: {n} concurrent streams equal the requests alone ({sum(same)}/{n})")

# Clients with one system prompt, arriving together on a fresh server: the slots share its cells (riding along
# with the first one reading it, or taking a slot's cached copy), and every output is still what `sparrow run`
# prints for the request.
SYSTEM = "You are a careful assistant. Answer briefly and use plain words. " * 4
shared = [SYSTEM + p for p in prompts[:8]]
for arch, path, flags in (("llama", model, []), ("deepseek32", ds, ["--dsa-top-k", 4])):
    alone = [serve_util.run_greedy(path, p, N_TOKENS, *flags) for p in shared]
    with serve_util.Server(path, "-np", 4, "-c", 2048, *flags) as srv:
        results = serve_util.parallel(lambda i: srv.stream("/v1/completions", completion_request(shared[i])),
                                      [(i,) for i in range(len(shared))])
        texts = ["".join(e["choices"][0].get("text", "") for e in r[1] if "choices" in e) for r in results]
        same = [serve_util.norm(t) == serve_util.norm(a) for t, a in zip(texts, alone)]
        m = srv.metrics()
        checks.check(all(r[0] == 200 and r[2] for r in results) and all(same),
                     f"{arch}: {len(shared)} concurrent streams with one system prompt equal the requests alone "
                     f"({sum(same)}/{len(shared)})")
        checks.check(m["sparrow_prefixes_shared_total"] > 0
                     and m["sparrow_prompt_tokens_evaluated_total"] < m["sparrow_prompt_tokens_total"],
                     f"{arch}: the slots shared the system prompt ({m['sparrow_prefixes_shared_total']:.0f} times; "
                     f"{m['sparrow_prompt_tokens_evaluated_total']:.0f} of {m['sparrow_prompt_tokens_total']:.0f} "
                     f"prompt tokens evaluated)")

# A client that hangs up mid-stream: with one slot, the next request is served only if the slot was freed.
with serve_util.Server(model, "-np", 1, "-c", 2048) as srv:
    got_some = threading.Event()

    def hang_up(i, event):
        if i >= 2:
            got_some.set()
            return False  # closes the connection
        return True

    # Negative penalties make the greedy text loop, so no end-of-generation token ends it early.
    long_request = {"prompt": "Long story:", "max_tokens": 2000, "temperature": 0, "presence_penalty": -2,
                    "frequency_penalty": -2}
    status, events, done = srv.stream("/v1/completions", long_request, on_event=hang_up)
    checks.check(got_some.is_set() and not done, f"client hung up after {len(events)} chunks")
    t0 = time.time()
    status, body = srv.request("POST", "/v1/completions", {"prompt": "Next", "max_tokens": 4}, timeout=120)
    checks.check(status == 200, f"the next request is served after the hang-up ({time.time() - t0:.1f} s)")
    m = srv.metrics()
    checks.check(m['sparrow_tasks_total{result="cancelled"}'] == 1, "the abandoned request was cancelled")
    checks.check(m["sparrow_generated_tokens_total"] < 2000, f"it stopped early ({m['sparrow_generated_tokens_total']:.0f} tokens)")
    checks.check(srv.alive(), "the server is still up")
    checks.check(srv.close() == 0, "the server stops cleanly after the hang-up")

# The same for a plain (non-streamed) request: after 2 s its reply is kept open with whitespace probes, and a
# failed probe cancels it. A slower model makes the request outlast the probe.
mid = serve_util.make_model("llama", os.path.join(tmp, "mid.gguf"), "--n-embd", 256, "--n-layer", 4, "--n-ff", 768,
                            "--n-head", 4, "--n-head-kv", 4)
with serve_util.Server(mid, "-np", 1, "-c", 4096) as srv:
    conn = srv.connection()
    conn.request("POST", "/v1/completions", body=json.dumps(dict(long_request, max_tokens=4000)),
                 headers={"Content-Type": "application/json"})
    time.sleep(0.5)
    conn.close()
    t0 = time.time()
    status, body = srv.request("POST", "/v1/completions", {"prompt": "Next", "max_tokens": 4}, timeout=120)
    waited = time.time() - t0
    m = srv.metrics()
    checks.check(status == 200 and m['sparrow_tasks_total{result="cancelled"}'] == 1,
                 f"a plain request whose client left is cancelled; the next one was served after {waited:.1f} s")
    checks.check(m["sparrow_generated_tokens_total"] < 4000, f"it stopped early ({m['sparrow_generated_tokens_total']:.0f} tokens)")
    # A long plain request whose client stays gets its whole reply (after the whitespace).
    status, body = srv.request("POST", "/v1/completions", dict(long_request, max_tokens=600), timeout=300)
    checks.check(status == 200 and body["usage"]["completion_tokens"] == 600,
                 f"a long plain request still gets its reply ({status})")
    checks.check(srv.close() == 0, "the server stops cleanly")

checks.finish()
