"""`sparrow serve` against malformed and hostile requests: each gets the right 4xx in OpenAI's error shape
(or a clean HTTP error from the protocol layer) and the server keeps serving everyone else."""
import json
import os
import socket
import threading
import time

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()
model = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
KEY = "s3cret-key"
AUTH = {"Authorization": "Bearer " + KEY}
CTX = 512  # one slot: the whole context per request


def error_shape(body):
    e = body.get("error") if isinstance(body, dict) else None
    return isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("message", "type", "code"))


with serve_util.Server(model, "-np", 1, "-c", CTX, "--api-key", KEY, "--max-queue", 1, "--max-body", 65536) as srv:
    good = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
    C = "/v1/completions"
    cases = [
        # (what, method, path, headers, json body or None, raw bytes or None, expected status)
        ("no API key", "POST", C, {}, good, None, 401),
        ("wrong API key", "POST", C, {"Authorization": "Bearer wrong"}, good, None, 401),
        ("API key prefix only", "POST", C, {"Authorization": "Bearer " + KEY[:-1]}, good, None, 401),
        ("API key with a suffix", "POST", C, {"Authorization": "Bearer " + KEY + "x"}, good, None, 401),
        ("basic auth", "POST", C, {"Authorization": "Basic " + KEY}, good, None, 401),
        ("metrics need the key", "GET", "/metrics", {}, None, None, 401),
        ("unknown path without a key", "GET", "/admin", {}, None, None, 401),
        ("unknown path", "GET", "/v1/nothing", AUTH, None, None, 404),
        ("wrong method", "GET", C, AUTH, None, None, 404),
        ("bad JSON", "POST", C, AUTH, None, b'{"prompt": "Hi", ', 400),
        ("empty body", "POST", C, AUTH, None, b"", 400),
        ("body is an array", "POST", C, AUTH, [1, 2, 3], None, 400),
        ("body is a string", "POST", C, AUTH, "prompt", None, 400),
        ("bad UTF-8", "POST", C, AUTH, None, b'{"prompt": "\xff\xfe\xfd", "max_tokens": 2}', 400),
        ("deeply nested JSON", "POST", C, AUTH, None, b"[" * 30000 + b"]" * 30000, 400),
        ("missing prompt", "POST", C, AUTH, {"max_tokens": 4}, None, 400),
        ("prompt is a number", "POST", C, AUTH, {"prompt": 5}, None, 400),
        ("prompt is an object", "POST", C, AUTH, {"prompt": {"a": 1}}, None, 400),
        ("empty prompt list", "POST", C, AUTH, {"prompt": []}, None, 400),
        ("two prompts", "POST", C, AUTH, {"prompt": ["a", "b"]}, None, 400),
        ("token id out of range", "POST", C, AUTH, {"prompt": [1, 99999999]}, None, 400),
        ("negative token id", "POST", C, AUTH, {"prompt": [-5]}, None, 400),
        ("huge token id", "POST", C, AUTH, {"prompt": [2 ** 70]}, None, 400),
        ("negative max_tokens", "POST", C, AUTH, dict(good, max_tokens=-1), None, 400),
        ("zero max_tokens", "POST", C, AUTH, dict(good, max_tokens=0), None, 400),
        ("max_tokens as a string", "POST", C, AUTH, dict(good, max_tokens="10"), None, 400),
        ("max_tokens a float", "POST", C, AUTH, dict(good, max_tokens=2.5), None, 400),
        ("max_tokens 1e30", "POST", C, AUTH, None, b'{"prompt": "Hi", "max_tokens": 1e30}', 400),
        ("max_tokens 10**30", "POST", C, AUTH, dict(good, max_tokens=10 ** 30), None, 400),
        ("max_tokens beyond the context", "POST", C, AUTH, dict(good, max_tokens=CTX + 1), None, 400),
        ("prompt + max_tokens beyond the context", "POST", C, AUTH, dict(good, max_tokens=CTX - 1), None, 400),
        ("over-long prompt (ids)", "POST", C, AUTH, {"prompt": [5] * (CTX + 10)}, None, 400),
        ("over-long prompt (text)", "POST", C, AUTH, {"prompt": "word " * 2000}, None, 400),
        ("temperature negative", "POST", C, AUTH, dict(good, temperature=-1), None, 400),
        ("temperature a string", "POST", C, AUTH, dict(good, temperature="hot"), None, 400),
        ("temperature 1e308 * 10", "POST", C, AUTH, None, b'{"prompt": "Hi", "temperature": 1e999}', 400),
        ("top_p above 1", "POST", C, AUTH, dict(good, top_p=1.5), None, 400),
        ("top_k negative", "POST", C, AUTH, dict(good, top_k=-3), None, 400),
        ("presence_penalty 5", "POST", C, AUTH, dict(good, presence_penalty=5), None, 400),
        ("seed a string", "POST", C, AUTH, dict(good, seed="abc"), None, 400),
        ("stream a string", "POST", C, AUTH, dict(good, stream="yes"), None, 400),
        ("stream_options a number", "POST", C, AUTH, dict(good, stream=True, stream_options=5), None, 400),
        ("stop a number", "POST", C, AUTH, dict(good, stop=5), None, 400),
        ("empty stop string", "POST", C, AUTH, dict(good, stop=[""]), None, 400),
        ("too many stop strings", "POST", C, AUTH, dict(good, stop=["a%d" % i for i in range(100)]), None, 400),
        ("n = 3", "POST", C, AUTH, dict(good, n=3), None, 400),
        ("echo", "POST", C, AUTH, dict(good, echo=True), None, 400),
        ("unknown model", "POST", C, AUTH, dict(good, model="gpt-9"), None, 404),
        ("model a number", "POST", C, AUTH, dict(good, model=123), None, 400),
        ("oversize body", "POST", C, AUTH, {"prompt": "x" * 100000}, None, 413),
        ("chat: no messages", "POST", "/v1/chat/completions", AUTH, {}, None, 400),
        ("chat: messages empty", "POST", "/v1/chat/completions", AUTH, {"messages": []}, None, 400),
        ("chat: messages a string", "POST", "/v1/chat/completions", AUTH, {"messages": "hi"}, None, 400),
        ("chat: unknown role", "POST", "/v1/chat/completions", AUTH,
         {"messages": [{"role": "wizard", "content": "x"}]}, None, 400),
        ("chat: content a number", "POST", "/v1/chat/completions", AUTH,
         {"messages": [{"role": "user", "content": 5}]}, None, 400),
        ("chat: image part", "POST", "/v1/chat/completions", AUTH,
         {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None, 400),
        ("chat: roles do not alternate (llama2)", "POST", "/v1/chat/completions", AUTH,
         {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, None, 400),
        ("chat: tools", "POST", "/v1/chat/completions", AUTH,
         {"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}, None, 400),
        ("/completion: n_predict -2", "POST", "/completion", AUTH, {"prompt": "a", "n_predict": -2}, None, 400),
        ("tokenize: no content", "POST", "/tokenize", AUTH, {"text": "a"}, None, 400),
        ("detokenize: strings", "POST", "/detokenize", AUTH, {"tokens": ["a"]}, None, 400),
        ("detokenize: id out of range", "POST", "/detokenize", AUTH, {"tokens": [10 ** 9]}, None, 400),
        ("embeddings: no input", "POST", "/v1/embeddings", AUTH, {}, None, 400),
        ("embeddings: pooling max", "POST", "/v1/embeddings", AUTH, {"input": "a", "pooling": "max"}, None, 400),
        ("embeddings: input a number", "POST", "/v1/embeddings", AUTH, {"input": 7}, None, 400),
        ("embeddings: base64", "POST", "/v1/embeddings", AUTH, {"input": "a", "encoding_format": "base64"}, None, 400),
    ]
    for what, method, path, headers, body, raw, expect in cases:
        status, reply = srv.request(method, path, body=body, headers=headers, raw=raw, timeout=60)
        checks.check(status == expect and error_shape(reply),
                     f"{what}: {status} (want {expect}) {json.dumps(reply)[:160] if status != expect else ''}")
        if not srv.alive():
            checks.check(False, f"the server died on: {what}")
            break

    # Below the HTTP layer: garbage request lines and huge headers get an HTTP error or a closed connection.
    def raw_exchange(data):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(data)
            try:
                return s.recv(200)
            except OSError:
                return b""
    for what, data in [("garbage request line", b"GARBAGE\r\n\r\n"),
                       ("huge header", b"GET /health HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n"),
                       ("negative Content-Length", b"POST /completion HTTP/1.1\r\nContent-Length: -5\r\n\r\n")]:
        reply = raw_exchange(data)
        checks.check(reply == b"" or reply.startswith(b"HTTP/1.1 4"), f"{what}: {reply[:40]!r}")
    checks.check(srv.alive(), "the server survived the protocol garbage")

    # A full queue gets 429: one request runs, one waits, the next is refused.
    long_req = {"prompt": "Tell", "max_tokens": 400, "temperature": 0}
    started = threading.Event()
    first = {}

    def run_first():
        def on_event(i, e):
            started.set()
            return True
        first["result"] = srv.stream(C, long_req, headers=AUTH, on_event=on_event)

    t1 = threading.Thread(target=run_first)
    t1.start()
    started.wait(60)
    second = {}
    t2 = threading.Thread(target=lambda: second.setdefault("r", srv.request("POST", C, good, headers=AUTH)))
    t2.start()
    deadline = time.time() + 30
    while time.time() < deadline and srv.request("GET", "/metrics", headers=AUTH)[1].find("sparrow_queue_depth 1") < 0:
        time.sleep(0.01)
    status, reply = srv.request("POST", C, good, headers=AUTH)
    checks.check(status == 429 and error_shape(reply), f"a full queue gives 429: {status} {reply}")
    t1.join()
    t2.join()
    checks.check(first["result"][0] == 200 and first["result"][2], "the running request finished")
    checks.check(second["r"][0] == 200, "the queued request was served")

    # Still serving, and /health needs no key.
    status, body = srv.request("GET", "/health")
    checks.check(status == 200, "/health answers without a key")
    status, body = srv.request("POST", C, good, headers=AUTH)
    checks.check(status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length"),
                 "a good request is served after all of that")
    checks.check(srv.close() == 0, "the server stops cleanly")

checks.finish()
