"""`sparrow serve`: log probabilities (OpenAI's `logprobs` on /v1/completions, `logprobs` + `top_logprobs` on
/v1/chat/completions, llama.cpp's `n_probs` on /completion), plain and streamed.

- The first generated token's log probability and its alternatives equal log_softmax of the logits that
  `run --dump-logits` writes for the same prompt; each later token's entry is consistent (greedy: the chosen
  token is the most likely, alternatives sorted, probabilities sum to at most 1).
- The entries' tokens spell the returned text; streamed entries equal the plain reply's; a stop string cuts
  the entries with the text; bad values are refused with 400.
- `echo: true` puts the prompt before the text and, with logprobs, reports every prompt token's log
  probability after the first (null) - equal to the numpy float64 reference's - also with max_tokens 0,
  which only scores the prompt (how evaluation harnesses score continuations)."""
import math
import os

import numpy as np

import harness
import llama_ref
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()
model = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
PROMPT = "Once upon a time"
N = 6
CACHE = ["-ctk", "f32", "-ctv", "f32"]


log_softmax = harness.log_softmax


logits_path = os.path.join(tmp, "logits.npy")
harness.run(["run", "-m", model, "-p", PROMPT, "-n", 0, "--dump-logits", logits_path] + CACHE)
want_lp = log_softmax(np.load(logits_path))


def consistent(entries, greedy=True):
    """Each entry: logprob <= 0, alternatives sorted and summing to at most 1, greedy token = best."""
    for e in entries:
        alts = e["alts"]
        if e["logprob"] > 1e-6 or any(b[1] > a[1] + 1e-6 for a, b in zip(alts, alts[1:])):
            return False
        if sum(math.exp(v) for _, v in alts) > 1 + 1e-4:
            return False
        if greedy and alts and abs(alts[0][1] - e["logprob"]) > 1e-5:
            return False
    return True


with serve_util.Server(model, "-np", 2, "-c", 512, *CACHE) as srv:
    # --- completions ---------------------------------------------------------------------------------------
    req = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": 5}
    status, body = srv.request("POST", "/v1/completions", req)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    checks.check(status == 200 and len(lp["tokens"]) == body["usage"]["completion_tokens"] == N
                 and serve_util.norm("".join(lp["tokens"])) == serve_util.norm(choice["text"]),
                 f"completions: one entry per generated token, spelling the text: {lp}")
    # text_offset: byte offsets into the text (a token holding part of a character shows as U+FFFD here, so
    # only whole tokens' lengths can be checked)
    off = lp["text_offset"]
    checks.check(len(off) == N and off[0] == 0 and all(b >= a for a, b in zip(off, off[1:]))
                 and all(b - a == len(t.encode()) for a, b, t in zip(off, off[1:], lp["tokens"]) if "\ufffd" not in t),
                 f"text_offset: byte offsets of the tokens: {off}")
    entries = [{"logprob": v, "alts": sorted(top.items(), key=lambda kv: -kv[1])}
               for v, top in zip(lp["token_logprobs"], lp["top_logprobs"])]
    checks.check(all(len(top) <= 5 for top in lp["top_logprobs"]) and consistent(entries),
                 "completions: each entry is consistent (greedy token first, sorted, sums <= 1)")
    best = np.argsort(-want_lp, kind="stable")[:5]
    first_top = sorted(lp["top_logprobs"][0].values(), reverse=True)
    checks.check(abs(lp["token_logprobs"][0] - want_lp[best[0]]) < 1e-4
                 and np.allclose(first_top, want_lp[best][:len(first_top)], atol=1e-4),
                 f"the first token's log probabilities equal log_softmax of run's dumped logits: "
                 f"{lp['token_logprobs'][0]} / {first_top} vs {want_lp[best]}")

    # streamed: the same entries, in pieces
    status, events, done = srv.stream("/v1/completions", dict(req, stream=True))
    s_tokens, s_lps, s_offsets = [], [], []
    for ev in events:
        c = ev["choices"][0] if ev.get("choices") else None
        if c and c.get("logprobs"):
            s_tokens += c["logprobs"]["tokens"]
            s_lps += c["logprobs"]["token_logprobs"]
            s_offsets += c["logprobs"]["text_offset"]
    checks.check(done and s_tokens == lp["tokens"] and np.allclose(s_lps, lp["token_logprobs"])
                 and s_offsets == lp["text_offset"], f"streamed completion entries equal the plain reply's: {s_tokens}")

    # logprobs 0: each token's own log probability, no alternatives
    status, body = srv.request("POST", "/v1/completions", dict(req, logprobs=0))
    lp0 = body["choices"][0]["logprobs"]
    checks.check(status == 200 and all(t == {} for t in lp0["top_logprobs"])
                 and np.allclose(lp0["token_logprobs"], lp["token_logprobs"]), "logprobs 0: no alternatives")
    # no logprobs: null, as before
    status, body = srv.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0})
    checks.check(body["choices"][0]["logprobs"] is None, "without logprobs the field is null")

    # a stop string cuts the entries with the text
    text = choice["text"]
    cut = next((i for i in range(1, len(text)) if text[i].isprintable() and text[i] != "\ufffd"), None)
    checks.check(cut is not None, f"the greedy text has a printable character to stop at: {text!r}")
    status, body = srv.request("POST", "/v1/completions", dict(req, stop=[text[cut:cut + 1] if cut else "x"]))
    c = body["choices"][0]
    joined = "".join(c["logprobs"]["tokens"])
    checks.check(status == 200 and c["finish_reason"] == "stop" and joined.startswith(c["text"])
                 and len(c["logprobs"]["tokens"]) <= body["usage"]["completion_tokens"]
                 and len(joined) < len("".join(lp["tokens"])),
                 f"a stop string cuts the entries: {c['text']!r} / {c['logprobs']['tokens']}")

    # --- chat ---------------------------------------------------------------------------------------------
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": N, "temperature": 0,
            "logprobs": True, "top_logprobs": 3}
    status, body = srv.request("POST", "/v1/chat/completions", chat)
    c = body["choices"][0]
    content = c["logprobs"]["content"]
    checks.check(status == 200 and len(content) == body["usage"]["completion_tokens"]
                 and all(bytes(e["bytes"]).decode(errors="replace") == e["token"] for e in content)
                 and all(len(e["top_logprobs"]) == 3 for e in content)
                 and consistent([{"logprob": e["logprob"], "alts": [(a["token"], a["logprob"]) for a in e["top_logprobs"]]}
                                 for e in content]),
                 f"chat: logprobs.content has one consistent entry per token with 3 alternatives: {content[:2]}")
    checks.check(serve_util.norm("".join(e["token"] for e in content)) == serve_util.norm(c["message"]["content"]),
                 "chat: the entries spell the message")
    status, events, done = srv.stream("/v1/chat/completions", dict(chat, stream=True))
    streamed = [e for ev in events if ev.get("choices") and ev["choices"][0].get("logprobs")
                for e in ev["choices"][0]["logprobs"]["content"]]
    checks.check(done and [e["token"] for e in streamed] == [e["token"] for e in content]
                 and np.allclose([e["logprob"] for e in streamed], [e["logprob"] for e in content]),
                 "chat: streamed entries equal the plain reply's")
    status, body = srv.request("POST", "/v1/chat/completions", dict(chat, top_logprobs=None))
    checks.check(status == 200 and all(e["top_logprobs"] == [] for e in body["choices"][0]["logprobs"]["content"]),
                 "chat: logprobs without top_logprobs reports no alternatives")

    # --- llama.cpp's /completion with n_probs ----------------------------------------------------------------
    status, body = srv.request("POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                                       "n_probs": 3})
    probs = body.get("completion_probabilities", [])
    checks.check(status == 200 and len(probs) == N and [p["token"] for p in probs] == lp["tokens"]
                 and np.allclose([p["logprob"] for p in probs], lp["token_logprobs"])
                 and all(len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"] for p in probs),
                 f"/completion n_probs: llama.cpp's completion_probabilities, equal to the OpenAI entries: {probs[:1]}")
    status, events, done = srv.stream("/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                                      "n_probs": 3, "stream": True})
    streamed = [p for ev in events for p in ev.get("completion_probabilities", [])]
    checks.check([p["id"] for p in streamed] == [p["id"] for p in probs], "/completion n_probs, streamed")
    status, body = srv.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 2, "temperature": 0})
    checks.check("completion_probabilities" not in body, "/completion without n_probs has no probabilities")

    # --- echo: the prompt's log probabilities ---------------------------------------------------------------
    status, tok = srv.request("POST", "/tokenize", {"content": PROMPT, "add_special": True})
    ids = tok["tokens"]
    ref = llama_ref.next_token_logprobs(llama_ref.LlamaModel(model), np.asarray(ids))
    for attempt in range(2):  # the second runs on a slot that holds the prompt: it must still score all of it
        status, body = srv.request("POST", "/v1/completions",
                                   {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 2})
        c = body["choices"][0]
        elp = c["logprobs"]
        checks.check(status == 200 and c["text"] == PROMPT and c["finish_reason"] == "length"
                     and body["usage"]["completion_tokens"] == 0 and len(elp["tokens"]) == len(ids)
                     and elp["token_logprobs"][0] is None and elp["top_logprobs"][0] is None
                     and np.allclose(elp["token_logprobs"][1:], ref, atol=2e-4),
                     f"echo, max_tokens 0 (request {attempt + 1}): the prompt's log probabilities equal the "
                     f"reference's: {elp['token_logprobs']} vs {ref}")
    status, body = srv.request("POST", "/v1/completions", dict(req, echo=True))
    c = body["choices"][0]
    checks.check(status == 200 and c["text"] == PROMPT + choice["text"]
                 and c["logprobs"]["tokens"][len(ids):] == lp["tokens"]
                 and np.allclose(c["logprobs"]["token_logprobs"][len(ids):], lp["token_logprobs"])
                 and np.allclose(c["logprobs"]["token_logprobs"][1:len(ids)], ref, atol=2e-4)
                 and c["logprobs"]["text_offset"][len(ids)] == sum(len(t.encode()) for t in c["logprobs"]["tokens"][:len(ids)]),
                 "echo with generation: the prompt's entries, then the generated ones")
    status, events, done = srv.stream("/v1/completions", dict(req, echo=True, stream=True))
    s_text = "".join(ev["choices"][0]["text"] for ev in events if ev.get("choices"))
    s_tokens = [t for ev in events if ev.get("choices") and ev["choices"][0].get("logprobs")
                for t in ev["choices"][0]["logprobs"]["tokens"]]
    checks.check(done and s_text == c["text"] and s_tokens == c["logprobs"]["tokens"],
                 "streamed echo: the prompt first, then the same text and entries")
    status, body = srv.request("POST", "/v1/completions", {"prompt": ids, "max_tokens": 2, "echo": True})
    checks.check(status == 200 and body["choices"][0]["logprobs"] is None
                 and body["choices"][0]["text"].startswith(PROMPT[:4]), f"echo of token ids, no logprobs: {body}")

    # --- refused values -------------------------------------------------------------------------------------
    for path, extra, what in [
        ("/v1/completions", {"logprobs": 21}, "logprobs above 20"),
        ("/v1/completions", {"logprobs": -1}, "negative logprobs"),
        ("/v1/completions", {"logprobs": "5"}, "logprobs of the wrong type"),
        ("/v1/completions", {"max_tokens": 0}, "max_tokens 0 without echo"),
        ("/completion", {"n_probs": 21}, "n_probs above 20"),
        ("/v1/completions", {"echo": "yes"}, "echo of the wrong type"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs without logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs above 20"),
        ("/v1/chat/completions", {"logprobs": 3}, "chat logprobs that is not a boolean"),
    ]:
        base = {"messages": [{"role": "user", "content": "x"}]} if path == "/v1/chat/completions" else {"prompt": PROMPT}
        status, body = srv.request("POST", path, {**base, "max_tokens": 2, **extra})
        checks.check(status == 400 and "error" in body, f"{what}: 400 ({status} {body})")
    status, body = srv.request("GET", "/health")
    checks.check(status == 200, "the server still serves")

checks.finish()
