"""`sparrow serve`: every endpoint in shape and content on tiny synthetic models. Greedy completions equal
`sparrow run --temp 0`; embeddings equal the numpy reference's final normed hidden states; stop strings,
seeds and the chat format behave; switching between embeddings and completions is safe."""
import base64
import os
import socket
import subprocess

import numpy as np

import harness
import llama_ref
import serve_util
from serve_util import norm

checks = harness.Checks()
tmp = harness.temp_dir()
llama = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
N = 12 if serve_util.LIGHT else 24
PROMPT = "Once upon a time"


def error_shape(body):
    e = body.get("error") if isinstance(body, dict) else None
    return isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("message", "type", "code"))


with serve_util.Server(llama, "-np", 2, "-c", 1024, "--chat-format", "llama2", "-ctk", "f32", "-ctv", "f32") as srv:
    status, body = srv.request("GET", "/health")
    checks.check(status == 200 and body.get("status") == "ok", f"/health: {status} {body}")
    status, body = srv.request("GET", "/v1/models")
    checks.check(status == 200 and body["object"] == "list" and body["data"][0]["id"] == "llama.gguf",
                 f"/v1/models lists the model by file name: {body}")
    # A second server on the same port is refused (cpp-httplib's default SO_REUSEPORT would let it bind, and the
    # kernel would split the clients between the two), and the first keeps serving.
    try:
        second = harness.run(["serve", "-m", llama, "--port", srv.port], check=False, timeout=60)
        refused = 0 < second.returncode < 128 and "address already in use" in second.stderr.lower()
        detail = f"exit {second.returncode}: {second.stderr.strip()[-200:]!r}"
    except subprocess.TimeoutExpired:
        refused, detail = False, "it kept running on the same port"
    checks.check(refused, f"a second serve on a port in use is refused ({detail})")
    checks.check(srv.request("GET", "/health")[0] == 200 and srv.alive(), "the first server still serves")
    # llama.cpp's GET /props: the per-slot context, the slots, /completion's defaults, the model.
    status, props = srv.request("GET", "/props")
    gen = props.get("default_generation_settings", {})
    checks.check(status == 200 and gen.get("n_ctx") == 512 and props.get("total_slots") == 2
                 and props.get("model_path") == "llama.gguf" and gen["params"]["min_p"] == 0.05
                 and gen["params"]["top_k"] == 40 and props.get("chat_format") == "llama2"
                 and isinstance(props.get("chat_template"), str), f"/props: {status} {props}")
    status, body = srv.request("GET", "/v1/models/llama.gguf")
    checks.check(status == 200 and body["object"] == "model" and body["id"] == "llama.gguf",
                 f"GET /v1/models/{{id}} (openai-python's models.retrieve): {status} {body}")

    # --- completions: equal to `sparrow run --temp 0` -------------------------------------------------------
    want = serve_util.run_greedy(llama, PROMPT, N, "-ctk", "f32", "-ctv", "f32")
    checks.check(len(want) > 0, f"run generated text: {want!r}")
    status, tok = srv.request("POST", "/tokenize", {"content": PROMPT, "add_special": True})
    n_prompt = len(tok["tokens"])
    req = {"model": "llama.gguf", "prompt": PROMPT, "max_tokens": N, "temperature": 0}
    status, body = srv.request("POST", "/v1/completions", req)
    ok = status == 200 and body["object"] == "text_completion" and norm(body["choices"][0]["text"]) == want
    checks.check(ok, f"/v1/completions greedy equals sparrow run ({status}): {body}")
    usage = body.get("usage", {})
    checks.check(usage.get("prompt_tokens") == n_prompt and 0 < usage.get("completion_tokens", 0) <= N
                 and usage.get("total_tokens") == n_prompt + usage.get("completion_tokens", -1),
                 f"/v1/completions usage {usage} (prompt {n_prompt} tokens)")
    checks.check(body["choices"][0]["finish_reason"] in ("stop", "length") and body["id"].startswith("cmpl-"),
                 "/v1/completions finish_reason and id")
    full = usage.get("completion_tokens") == N and body["choices"][0]["finish_reason"] == "length"

    status, events, done = srv.stream("/v1/completions", req)
    text = norm("".join(e["choices"][0]["text"] for e in events))
    checks.check(status == 200 and done and text == want, f"streamed /v1/completions equals run: {text!r}")
    checks.check(events[-1]["choices"][0]["finish_reason"] in ("stop", "length") and "usage" in events[-1]
                 and all(e["choices"][0]["finish_reason"] is None for e in events[:-1]),
                 "stream: finish_reason only on the last chunk, with usage")
    status, events, done = srv.stream("/v1/completions", dict(req, stream_options={"include_usage": True}))
    checks.check(done and events[-1]["choices"] == [] and events[-1]["usage"]["prompt_tokens"] == n_prompt,
                 "stream_options.include_usage adds a usage chunk")
    # OpenAI's shape: every other chunk has usage null, so a client adding usage up per chunk counts it once.
    checks.check(all("usage" in e and e["usage"] is None for e in events[:-1])
                 and sum(1 for e in events if e.get("usage")) == 1,
                 "with include_usage, usage is null on every chunk but the last")

    # Token ids as the prompt; the cached prefix is reused.
    status, body = srv.request("POST", "/v1/completions", dict(req, prompt=tok["tokens"]))
    checks.check(status == 200 and norm(body["choices"][0]["text"]) == want, "a prompt of token ids gives the same text")
    checks.check(body["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1,
                 f"the slot reused the cached prompt: {body['usage']}")

    # A token whose piece is a NUL byte: `sparrow run` writes the bytes as they are, as the server sends them.
    status, nul = srv.request("POST", "/tokenize", {"content": "a\u0000b", "add_special": False})
    ids_path = os.path.join(tmp, "nul-ids.txt")
    harness.write_ids(ids_path, nul["tokens"])
    out = harness.run(["run", "-m", llama, "--prompt-ids", ids_path, "-n", 0]).stdout
    checks.check(out == "a\u0000b\n", f"run prints a prompt holding a NUL byte whole: {out!r}")

    # llama.cpp's /completion.
    status, body = srv.request("POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0})
    checks.check(status == 200 and norm(body.get("content", "")) == want and body.get("stop") is True
                 and body.get("tokens_evaluated") == n_prompt, f"/completion: {body}")
    t = body.get("timings", {})
    checks.check(t.get("predicted_n") == body.get("tokens_predicted")
                 and t.get("prompt_n") == body["tokens_evaluated"] - body["tokens_cached"]
                 and t.get("prompt_ms", -1) > 0 and t.get("predicted_ms", -1) >= 0
                 and t.get("predicted_per_second", -1) >= 0, f"/completion timings (llama.cpp's): {t}")
    status, events, _ = srv.stream("/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0})
    checks.check(status == 200 and norm("".join(e["content"] for e in events)) == want and events[-1]["stop"] is True,
                 "streamed /completion equals run")
    # n_predict 0 only evaluates the prompt (llama.cpp's cache warming): a later request finds it cached.
    warm = "A prompt warmed by n_predict 0, then asked again"
    status, body = srv.request("POST", "/completion", {"prompt": warm, "n_predict": 0})
    status2, again = srv.request("POST", "/completion", {"prompt": warm, "n_predict": 1, "temperature": 0})
    checks.check(status == 200 and body["tokens_predicted"] == 0 and body["content"] == ""
                 and body["timings"]["prompt_ms"] > 0
                 and again["tokens_cached"] == again["tokens_evaluated"] - 1,
                 f"/completion n_predict 0 reads the prompt only, which the next request reuses: {body} {again}")

    # --- stop strings -----------------------------------------------------------------------------------------
    windows = [i for i in range(2, len(want) - 3) if "\ufffd" not in want[i:i + 3]]
    if windows:
        stop = want[windows[0]:windows[0] + 3]
        cut = want[:want.find(stop)]
        status, body = srv.request("POST", "/v1/completions", dict(req, stop=[stop, "\u00e9\u00e9\u00e9"]))
        checks.check(norm(body["choices"][0]["text"]) == cut and body["choices"][0]["finish_reason"] == "stop",
                     f"stop {stop!r}: text cut before it ({body['choices'][0]})")
        status, events, done = srv.stream("/v1/completions", dict(req, stop=stop))
        got = norm("".join(e["choices"][0]["text"] for e in events))
        checks.check(got == cut and events[-1]["choices"][0]["finish_reason"] == "stop",
                     f"streamed stop: no part of the stop string is sent ({got!r})")

    # --- sampling: seeded runs repeat; penalties stay deterministic --------------------------------------------
    sreq = dict(req, temperature=1.0, top_p=0.9, top_k=20, seed=1234)
    a = srv.request("POST", "/v1/completions", sreq)[1]["choices"][0]["text"]
    b = srv.request("POST", "/v1/completions", sreq)[1]["choices"][0]["text"]
    checks.check(a == b, "the same seed gives the same sample")
    # Negative penalties reward what was generated already: the greedy text turns into a loop.
    preq = dict(req, presence_penalty=-2, frequency_penalty=-2)
    a = srv.request("POST", "/v1/completions", preq)[1]["choices"][0]
    b = srv.request("POST", "/v1/completions", preq)[1]["choices"][0]
    checks.check(a["text"] == b["text"], "greedy with penalties is deterministic")
    if full:
        checks.check(norm(a["text"]) != want, f"penalties change the greedy text ({a['text']!r})")

    # min_p 1 keeps only the most likely token: sampling at any temperature is greedy then.
    hot = dict(req, temperature=1.5, min_p=1.0, seed=99)
    checks.check(norm(srv.request("POST", "/v1/completions", hot)[1]["choices"][0]["text"]) == want,
                 "min_p 1 at temperature 1.5 gives the greedy text")
    status, body = srv.request("POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 1.5,
                                                      "min_p": 1.0, "repeat_penalty": 1.0, "mirostat": 0})
    checks.check(status == 200 and norm(body["content"]) == want, f"/completion's min_p alike: {body.get('content')!r}")
    # repeat_penalty over the whole sequence changes greedy text (below 1 it rewards what was seen: positive logits
    # times 20, so greedy turns back to the prompt's tokens); with repeat_last_n 0 it is off.
    rp = {"prompt": PROMPT, "n_predict": N, "temperature": 0, "repeat_penalty": 0.05, "repeat_last_n": -1}
    penalised = srv.request("POST", "/completion", rp)[1]["content"]
    off = srv.request("POST", "/completion", dict(rp, repeat_last_n=0))[1]["content"]
    checks.check(norm(penalised) != want and norm(off) == want,
                 f"repeat_penalty changes the greedy text ({penalised!r}), repeat_last_n 0 turns it off")

    # --- logit_bias: OpenAI's object and llama.cpp's pairs ------------------------------------------------------
    # Token ids of the greedy text from /completion's n_probs entries (the text alone may not re-tokenize alike).
    def llama_ids(extra):
        st, b = srv.request("POST", "/completion", dict({"prompt": PROMPT, "n_predict": 4, "temperature": 0,
                                                         "n_probs": 2}, **extra))
        return st, [p["id"] for p in b.get("completion_probabilities", [])], b
    _, plain_ids, plain = llama_ids({})
    greedy_first = plain_ids[0]
    # +100 on one token: greedy writes nothing else. The token: one of the prompt's words, not greedy's first.
    words = srv.request("POST", "/tokenize", {"content": PROMPT, "add_special": False, "with_pieces": True})[1]
    target, piece = next((t["id"], t["piece"]) for t in words["tokens"] if t["id"] != greedy_first)
    status, body = srv.request("POST", "/v1/completions", dict(req, max_tokens=5, logit_bias={str(target): 100}))
    checks.check(status == 200 and body["choices"][0]["text"] == piece * 5,
                 f"logit_bias +100 on token {target} ({piece!r}) makes greedy repeat it: {body}")
    # Banned by false (llama.cpp) or -100 (OpenAI): greedy takes the model's second choice there, and the reported
    # alternatives stay the model's (the banned token first).
    status, banned_ids, banned = llama_ids({"logit_bias": [[greedy_first, False]]})
    second = plain["completion_probabilities"][0]["top_logprobs"][1]["id"]
    checks.check(status == 200 and banned_ids[0] == second
                 and banned["completion_probabilities"][0]["top_logprobs"][0]["id"] == greedy_first,
                 f"/completion's [[{greedy_first}, false]] bans greedy's first token: {banned_ids} (was {plain_ids})")
    status, body = srv.request("POST", "/v1/completions", dict(req, max_tokens=4, logit_bias={str(greedy_first): -100}))
    checks.check(status == 200 and body["choices"][0]["text"] == banned["content"],
                 f"/v1/completions' {{id: -100}} bans it alike: {body['choices'][0]['text']!r}")
    # A text names its tokens: [[piece, 100]] steers as the id does.
    status, llama_body = srv.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 3, "temperature": 0,
                                                            "logit_bias": [[piece, 100]]})
    checks.check(status == 200 and llama_body["content"] == piece * 3,
                 f"/completion's [[text, bias]] biases the text's token: {llama_body.get('content')!r}")
    status, body = srv.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                "max_tokens": 3, "temperature": 0,
                                                                "logit_bias": {str(target): 100}})
    checks.check(status == 200 and body["choices"][0]["message"]["content"] == piece * 3,
                 f"chat completions take logit_bias: {body}")
    checks.check(norm(srv.request("POST", "/v1/completions", req)[1]["choices"][0]["text"]) == want,
                 "the next request without a bias is greedy again")

    # --- chat: the llama2 format, then the same completion --------------------------------------------------
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    bos = srv.request("POST", "/tokenize", {"content": "", "add_special": True, "with_pieces": True})[1]["tokens"]
    rendered = bos[0]["piece"] + "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nTell me a story. [/INST]"
    status, applied = srv.request("POST", "/apply-template", {"messages": messages})
    checks.check(status == 200 and applied.get("prompt") == rendered,
                 f"/apply-template (llama.cpp's) gives the rendered prompt: {applied}")
    ids = srv.request("POST", "/tokenize", {"content": rendered, "add_special": False})[1]["tokens"]
    want_chat = srv.request("POST", "/v1/completions", {"prompt": ids, "max_tokens": N, "temperature": 0})[1]
    status, body = srv.request("POST", "/v1/chat/completions",
                               {"messages": messages, "max_tokens": N, "temperature": 0})
    ok = (status == 200 and body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
          and norm(body["choices"][0]["message"]["content"]) == norm(want_chat["choices"][0]["text"])
          and body["usage"]["prompt_tokens"] == len(ids))
    checks.check(ok, f"/v1/chat/completions renders the llama2 format ({status}): {body}")
    status, events, done = srv.stream("/v1/chat/completions", {"messages": messages, "max_tokens": N, "temperature": 0})
    checks.check(done and events[0]["choices"][0]["delta"].get("role") == "assistant"
                 and events[0]["object"] == "chat.completion.chunk"
                 and norm("".join(e["choices"][0]["delta"].get("content", "") for e in events))
                 == norm(want_chat["choices"][0]["text"]), "streamed chat: role first, then the same text")

    # --- tokenize / detokenize ------------------------------------------------------------------------------
    text = "Hello, w\u00f6rld! 123"
    status, body = srv.request("POST", "/tokenize", {"content": text, "with_pieces": True})
    pieces = body["tokens"]
    status, back = srv.request("POST", "/detokenize", {"tokens": [p["id"] for p in pieces]})
    checks.check(back.get("content") == text, f"/tokenize and /detokenize round-trip: {back}")
    ascii_pieces = srv.request("POST", "/tokenize", {"content": "Hello, world", "with_pieces": True})[1]["tokens"]
    checks.check("".join(p["piece"] for p in ascii_pieces) == "Hello, world", "with_pieces: the pieces make the text")

    # --- embeddings: the final normed hidden states --------------------------------------------------------
    ref = llama_ref.LlamaModel(llama)
    hidden = llama_ref.rms_norm(llama_ref.hidden_states(ref, np.asarray(tok["tokens"])), ref.w("output_norm.weight"),
                                ref.hp.rms_eps)
    status, none = srv.request("POST", "/v1/embeddings", {"input": PROMPT, "pooling": "none"})
    rows = np.asarray(none["data"][0]["embedding"])
    checks.check(status == 200 and rows.shape == hidden.shape, f"pooling none: one row per token {rows.shape}")
    err = harness.rel_error(rows, hidden)
    checks.check(err < 1e-4, f"embeddings equal the reference's normed hidden states (relative error {err:.1e})")
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    status, mean = srv.request("POST", "/v1/embeddings", {"input": [PROMPT, "x"], "pooling": "mean"})
    checks.check(status == 200 and len(mean["data"]) == 2 and mean["data"][1]["index"] == 1
                 and mean["usage"]["prompt_tokens"] == n_prompt + 2, f"two inputs, usage {mean.get('usage')}")
    checks.check(harness.rel_error(mean["data"][0]["embedding"], unit(hidden.mean(0))) < 1e-4,
                 "pooling mean: the normalised mean of the rows")
    status, last = srv.request("POST", "/v1/embeddings", {"input": tok["tokens"], "pooling": "last"})
    checks.check(harness.rel_error(last["data"][0]["embedding"], unit(hidden[-1])) < 1e-4,
                 "pooling last: the normalised last row")
    # encoding_format base64 (openai-python's default): the float32 little-endian bytes of the same vector.
    status, b64 = srv.request("POST", "/v1/embeddings", {"input": PROMPT, "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    checks.check(status == 200 and np.array_equal(decoded, np.asarray(mean["data"][0]["embedding"], dtype=np.float32)),
                 "encoding_format base64 carries the float vector's bytes")
    # More inputs than the queue holds (-np 2, queue 16 by default) run in waves, each index in place.
    many = [f"item {i}" for i in range(70)]
    status, batch = srv.request("POST", "/v1/embeddings", {"input": many})
    status1, one_69 = srv.request("POST", "/v1/embeddings", {"input": many[69]})
    checks.check(status == 200 and [d["index"] for d in batch["data"]] == list(range(70))
                 and batch["data"][69]["embedding"] == one_69["data"][0]["embedding"],
                 f"70 inputs in one request ({status}): 70 embeddings in order")
    # Completions, embeddings and completions again in turn: the text never changes.
    for i in range(2):
        srv.request("POST", "/v1/embeddings", {"input": PROMPT + " again", "pooling": "mean"})
        got = norm(srv.request("POST", "/v1/completions", req)[1]["choices"][0]["text"])
        checks.check(got == want, f"completion after embeddings (round {i}) is unchanged")

    # Several prompts in one request (OpenAI's API; LangChain's completions client batches so): choice
    # p * n + k is prompt p's k-th, each equal to that prompt alone; usage counts every prompt once.
    prompts = ["The first prompt", "A second one, longer than the first", [5, 6, 7, 8]]
    alone = [srv.request("POST", "/v1/completions", {"prompt": p, "max_tokens": N, "temperature": 0})[1]
             for p in prompts]
    status, body = srv.request("POST", "/v1/completions", {"prompt": prompts, "max_tokens": N, "temperature": 0,
                                                          "n": 2, "echo": True})
    texts = [c["text"] for c in body.get("choices", [])]
    want_texts = [(p if isinstance(p, str) else "") for p in prompts]
    checks.check(status == 200 and [c["index"] for c in body["choices"]] == list(range(6))
                 and all(texts[2 * i + k].endswith(alone[i]["choices"][0]["text"]) for i in range(3) for k in range(2))
                 and all(texts[2 * i].startswith(want_texts[i]) for i in range(2)),
                 f"three prompts x n = 2: each choice is its prompt's completion, echoed ({status})")
    checks.check(body["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
                 and body["usage"]["completion_tokens"] == 2 * sum(a["usage"]["completion_tokens"] for a in alone),
                 f"several prompts: usage counts each prompt once, every completion: {body['usage']}")
    status, events, done = srv.stream("/v1/completions", {"prompt": prompts, "max_tokens": N, "temperature": 0})
    streamed = ["".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == i) for i in range(3)]
    checks.check(done and streamed == [a["choices"][0]["text"] for a in alone],
                 "several prompts streamed: each index's text is its prompt's completion")

    # n choices: queued together (the third waits for a slot), each its own task with seed, seed + 1, ...; the
    # prompt is read once (the choices ride along, then each reads its last token), usage counts it once.
    fresh = "A prompt no slot has seen, for choices"
    status, tok2 = srv.request("POST", "/tokenize", {"content": fresh, "add_special": True})
    before = srv.metrics()
    status, body = srv.request("POST", "/v1/completions", {"prompt": fresh, "max_tokens": N, "temperature": 0, "n": 3})
    after = srv.metrics()
    texts = [c["text"] for c in body.get("choices", [])]
    checks.check(status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2] and len(set(texts)) == 1,
                 f"n = 3 greedy: three equal choices ({status})")
    u3 = body["usage"]
    status, one = srv.request("POST", "/v1/completions", {"prompt": fresh, "max_tokens": N, "temperature": 0})
    checks.check(u3["prompt_tokens"] == len(tok2["tokens"]) and u3["completion_tokens"] == 3 * one["usage"][
        "completion_tokens"] and u3["total_tokens"] == u3["prompt_tokens"] + u3["completion_tokens"],
                 f"n = 3 usage: the prompt once, the completions of all three: {u3}")
    evaluated = after["sparrow_prompt_tokens_evaluated_total"] - before["sparrow_prompt_tokens_evaluated_total"]
    cached = u3["prompt_tokens_details"]["cached_tokens"]
    checks.check(evaluated == len(tok2["tokens"]) - cached + 2,
                 f"n = 3: {evaluated:.0f} prompt tokens evaluated for a {len(tok2['tokens'])}-token prompt "
                 f"({cached} cached): once, and each choice's last token")
    sampled = {"prompt": fresh + " again", "max_tokens": N, "temperature": 1.0, "seed": 1234}
    status, body = srv.request("POST", "/v1/completions", dict(sampled, n=3))
    each = [srv.request("POST", "/v1/completions", dict(sampled, seed=1234 + k))[1]["choices"][0]["text"]
            for k in range(3)]
    checks.check(status == 200 and [c["text"] for c in body["choices"]] == each,
                 "n = 3 sampled: choice k is the request with seed + k")
    chat_req = {"messages": [{"role": "user", "content": "Name two colours"}], "max_tokens": N, "temperature": 1.0,
                "seed": 7, "n": 2}
    status, body = srv.request("POST", "/v1/chat/completions", chat_req)
    status_s, events, done = srv.stream("/v1/chat/completions", dict(chat_req, stream_options={"include_usage": True}))
    streamed = ["".join(e["choices"][0]["delta"].get("content", "") for e in events
                        if e.get("choices") and e["choices"][0]["index"] == k) for k in range(2)]
    finishes = [e["choices"][0]["index"] for e in events if e.get("choices") and e["choices"][0]["finish_reason"]]
    checks.check(status == 200 and status_s == 200 and done
                 and streamed == [c["message"]["content"] for c in body["choices"]] and sorted(finishes) == [0, 1]
                 and events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"]
                 == body["usage"]["completion_tokens"],
                 f"chat n = 2 streamed: each index's deltas are that choice's message, one finish each, one usage")
    # Clients writing back an empty tool_calls list, and Python's json writing max_tokens as 3.0, are served.
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": []},
               {"role": "user", "content": "c"}]
    status, body = srv.request("POST", "/v1/chat/completions", {"messages": history, "max_tokens": 3.0})
    checks.check(status == 200 and 0 < body["usage"]["completion_tokens"] <= 3,
                 f"an empty tool_calls list and max_tokens 3.0 are accepted: {status}")


    # --- metrics ----------------------------------------------------------------------------------------------
    m = srv.metrics()
    names = ["sparrow_prompt_tokens_total", "sparrow_generated_tokens_total", "sparrow_queue_depth",
             "sparrow_slots_busy", "sparrow_tokens_per_second", "sparrow_kv_cells_used",
             "sparrow_prefixes_shared_total"]
    checks.check(all(n in m for n in names), f"/metrics has {names}")
    checks.check(m.get('sparrow_http_requests_total{path="/v1/completions",status="200"}', 0) >= 10,
                 "/metrics counts requests by path and status")
    checks.check(0 < m["sparrow_kv_cells_used"] <= 1024, f"KV cells used: {m['sparrow_kv_cells_used']}")
    checks.check(srv.close() == 0, "the server stops cleanly on SIGTERM")

# The DSA model path (deepseek32) through the server, with the selection active (tiny top-k).
ds = serve_util.make_model("deepseek32", os.path.join(tmp, "ds.gguf"))
want = serve_util.run_greedy(ds, PROMPT, N, "--dsa-top-k", 4)
with serve_util.Server(ds, "-np", 2, "-c", 512, "--dsa-top-k", 4) as srv:
    status, body = srv.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0})
    checks.check(status == 200 and norm(body["choices"][0]["text"]) == want, f"deepseek32: greedy equals run ({body})")
    status, body = srv.request("POST", "/v1/embeddings", {"input": PROMPT})
    checks.check(status == 200 and len(body["data"][0]["embedding"]) > 0, "deepseek32: embeddings")
    status, body = srv.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
    checks.check(status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length"),
                 "deepseek32: chat (default format, default max_tokens)")

# A GGUF that carries DeepSeek-V3.2's chat template: the format is recognised without --chat-format, and the
# prompt is the template's rendering.
template = harness.shared_data("templates", "deepseek-ai-DeepSeek-V3.2.jinja")
if template:
    from gguf import GGUFValueType
    ds_tmpl = os.path.join(tmp, "ds-template.gguf")
    with open(template) as f:
        text = f.read()
    harness.rewrite_gguf(ds, ds_tmpl, metadata_edit=lambda md: md.__setitem__(
        "tokenizer.chat_template", (GGUFValueType.STRING, text)))
    with serve_util.Server(ds_tmpl, "-np", 1, "-c", 512) as srv:
        meta = srv.request("GET", "/v1/models")[1]["data"][0]["meta"]
        checks.check(meta["chat_format"] == "deepseek3", f"the DeepSeek-V3.2 template is recognised: {meta}")
        bos = srv.request("POST", "/tokenize", {"content": "", "add_special": True, "with_pieces": True})[1]["tokens"]
        rendered = bos[0]["piece"] + "Be brief.<｜User｜>Hi<｜Assistant｜><think></think>"
        ids = srv.request("POST", "/tokenize", {"content": rendered})[1]["tokens"]
        status, body = srv.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_tokens": 4, "temperature": 0})
        checks.check(status == 200 and body["usage"]["prompt_tokens"] == len(ids),
                     f"deepseek3 chat prompt: {body.get('usage')} tokens, rendering has {len(ids)}")
        # Thinking off (the default): no reasoning field. On: the reply's reasoning (before "</think>") goes to
        # message.reasoning_content, streamed as delta.reasoning_content (ReasoningSplitter; its unit test cuts the
        # tag across pieces); the streamed parts join to the plain reply's.
        checks.check("reasoning_content" not in body["choices"][0]["message"], "thinking off: no reasoning_content")
        think = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0,
                 "chat_template_kwargs": {"enable_thinking": True}}
        status, body = srv.request("POST", "/v1/chat/completions", think)
        message = body["choices"][0]["message"]
        status_s, events, done = srv.stream("/v1/chat/completions", think)
        parts = {k: "".join(e["choices"][0]["delta"].get(k, "") for e in events if e.get("choices"))
                 for k in ("reasoning_content", "content")}
        checks.check(status == 200 and "reasoning_content" in message and done
                     and parts == {"reasoning_content": message["reasoning_content"], "content": message["content"]}
                     and len(message["reasoning_content"] + message["content"]) > 0,
                     f"thinking on: reasoning_content and content, streamed alike: {message}")
        # An assistant turn last: the prompt opens no thinking block (the template writes none after it), so
        # nothing is split off even with thinking on.
        prefill = dict(think, messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure"}])
        status, body = srv.request("POST", "/v1/chat/completions", prefill)
        checks.check(status == 200 and "reasoning_content" not in body["choices"][0]["message"]
                     and body["choices"][0]["message"]["content"],
                     f"thinking on after an assistant turn: no block opened, no split: {body}")
    with serve_util.Server(ds_tmpl, "-np", 1, "-c", 512, "--reasoning-format", "none") as srv:
        status, body = srv.request("POST", "/v1/chat/completions", think)
        raw = body["choices"][0]["message"]
        split = message["reasoning_content"] + ("</think>" if message["content"] else "") + message["content"]
        checks.check(status == 200 and "reasoning_content" not in raw and raw["content"].startswith(split[:8])
                     and (message["content"] or raw["content"] == message["reasoning_content"]),
                     f"--reasoning-format none: the whole reply in content: {raw}")

# IPv6 loopback, where the machine has one: the printed URL puts the address in brackets (RFC 3986), and it serves.
try:
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
    have_ipv6 = True
except OSError:
    have_ipv6 = False
if have_ipv6:
    with serve_util.Server(llama, "--host", "::1", "-np", 1) as srv:
        checks.check("listening on http://[::1]:" in srv.stderr() and srv.request("GET", "/health")[0] == 200,
                     "--host ::1: the URL in brackets, and /health answers there")
else:
    print("skip: no IPv6 loopback here (--host ::1 not checked)")

checks.finish()
