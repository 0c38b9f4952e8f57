"""`sparrow serve` against malformed and hostile requests: each gets the right 4xx in OpenAI's error shape
(or a clean HTTP error from the protocol layer) and the server keeps serving everyone else."""
import http.client
import json
import os
import socket
import threading

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()
model = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
KEY = "s3cret-key"
AUTH = {"Authorization": "Bearer " + KEY}
CTX = 512  # one slot: the whole context per request


def exchange(port, method, path, headers, body=None):
    """One request; returns (status, {lower-case header name: value})."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=dict(headers, **({"Content-Type": "application/json"}
                                                                         if data else {})))
        reply = conn.getresponse()
        reply.read()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}
    finally:
        conn.close()


def error_shape(body):
    e = body.get("error") if isinstance(body, dict) else None
    return (isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("message", "type", "code"))
            and "param" in e)


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
        ("props need the key", "GET", "/props", {}, None, None, 401),
        ("POST on /props", "POST", "/props", AUTH, {}, None, 405),
        ("/slots needs the key", "GET", "/slots", {}, None, None, 401),
        ("slot actions need the key", "POST", "/slots/0?action=erase", {}, None, None, 401),
        ("POST on /slots", "POST", "/slots", AUTH, {}, None, 405),
        ("GET on /slots/0", "GET", "/slots/0", AUTH, None, None, 405),
        ("slot save without --slot-save-path", "POST", "/slots/0?action=save", AUTH, {"filename": "a"}, None, 501),
        ("slot 1 of 1", "POST", "/slots/1?action=erase", AUTH, None, None, 404),
        ("id_slot out of range", "POST", C, AUTH, dict(good, id_slot=1), None, 400),
        ("dry_multiplier -1", "POST", C, AUTH, dict(good, dry_multiplier=-1), None, 400),
        ("dry_multiplier a string", "POST", C, AUTH, dict(good, dry_multiplier="0.8"), None, 400),
        ("dry_base 0.5", "POST", C, AUTH, dict(good, dry_multiplier=0.8, dry_base=0.5), None, 400),
        ("dry_allowed_length 0", "POST", C, AUTH, dict(good, dry_multiplier=0.8, dry_allowed_length=0), None, 400),
        ("dry_penalty_last_n -2", "POST", C, AUTH, dict(good, dry_multiplier=0.8, dry_penalty_last_n=-2), None, 400),
        ("dry_sequence_breakers a string", "POST", C, AUTH, dict(good, dry_sequence_breakers="\n"), None, 400),
        ("dry_sequence_breakers [1]", "POST", C, AUTH, dict(good, dry_sequence_breakers=[1]), None, 400),
        ("dry_sequence_breakers ['']", "POST", C, AUTH, dict(good, dry_sequence_breakers=[""]), None, 400),
        ("dry_sequence_breakers 100 strings", "POST", C, AUTH, dict(good, dry_sequence_breakers=["x"] * 100), None,
         400),
        ("dynatemp_range -0.5", "POST", C, AUTH, dict(good, dynatemp_range=-0.5), None, 400),
        ("dynatemp_exponent a string", "POST", C, AUTH, dict(good, dynatemp_exponent="1"), None, 400),
        ("top_n_sigma -2", "POST", C, AUTH, dict(good, top_n_sigma=-2), None, 400),
        ("top_n_sigma a string", "POST", C, AUTH, dict(good, top_n_sigma="1"), None, 400),
        ("typical_p a string", "POST", C, AUTH, dict(good, typical_p="1"), None, 400),
        ("typical_p 1.5", "POST", C, AUTH, dict(good, typical_p=1.5), None, 400),
        ("xtc_threshold -1", "POST", C, AUTH, dict(good, xtc_threshold=-1), None, 400),
        ("/apply-template: no messages", "POST", "/apply-template", AUTH, {}, None, 400),
        ("/apply-template: a message without content", "POST", "/apply-template", AUTH,
         {"messages": [{"role": "user"}]}, None, 400),
        ("unknown path without a key", "GET", "/admin", {}, None, None, 401),
        ("unknown path", "GET", "/v1/nothing", AUTH, None, None, 404),
        ("wrong method", "GET", C, AUTH, None, None, 405),
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
        ("two prompts, a queue of one", "POST", C, AUTH, {"prompt": ["a", "b"]}, None, 400),
        ("prompts of mixed kinds", "POST", C, AUTH, {"prompt": ["a", 5]}, None, 400),
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
        ("n = 17 (at most 16 choices)", "POST", C, AUTH, dict(good, n=17), None, 400),
        ("n = 0", "POST", C, AUTH, dict(good, n=0), None, 400),
        ("n = 3 beyond a queue of one", "POST", C, AUTH, dict(good, n=3), None, 400),
        ("echo a number", "POST", C, AUTH, dict(good, echo=3), None, 400),
        ("logprobs 1000", "POST", C, AUTH, dict(good, logprobs=1000), None, 400),
        ("logit_bias a string", "POST", C, AUTH, dict(good, logit_bias="5:100"), None, 400),
        ("logit_bias key not an id", "POST", C, AUTH, dict(good, logit_bias={"abc": 1}), None, 400),
        ("logit_bias key with a sign", "POST", C, AUTH, dict(good, logit_bias={"+5": 1}), None, 400),
        ("logit_bias id out of range", "POST", C, AUTH, dict(good, logit_bias={"99999999": 1}), None, 400),
        ("logit_bias 1000", "POST", C, AUTH, dict(good, logit_bias={"5": 1000}), None, 400),
        ("logit_bias true", "POST", C, AUTH, dict(good, logit_bias={"5": True}), None, 400),
        ("logit_bias pair of three", "POST", C, AUTH, dict(good, logit_bias=[[5, 1, 2]]), None, 400),
        ("logit_bias pair, id 2**70", "POST", C, AUTH, dict(good, logit_bias=[[2 ** 70, 1]]), None, 400),
        ("logit_bias pair, token a float", "POST", C, AUTH, dict(good, logit_bias=[[5.5, 1]]), None, 400),
        ("/completion: logit_bias bias a string", "POST", "/completion", AUTH,
         {"prompt": "a", "logit_bias": [[5, "high"]]}, None, 400),
        ("min_p 2", "POST", C, AUTH, dict(good, min_p=2), None, 400),
        ("repeat_penalty 0", "POST", C, AUTH, dict(good, repeat_penalty=0), None, 400),
        ("repeat_last_n -2", "POST", C, AUTH, dict(good, repeat_last_n=-2), None, 400),
        ("ignore_eos a string", "POST", C, AUTH, dict(good, ignore_eos="yes"), None, 400),
        ("/completion: a grammar using an undefined rule", "POST", "/completion", AUTH,
         {"prompt": "a", "grammar": "root ::= \"x\" y"}, None, 400),
        ("/completion: a left-recursive grammar", "POST", "/completion", AUTH,
         {"prompt": "a", "grammar": "root ::= root \"x\" | \"y\""}, None, 400),
        ("/completion: a json_schema outside the subset", "POST", "/completion", AUTH,
         {"prompt": "a", "json_schema": {"type": "integer", "multipleOf": 2.5}}, None, 400),
        ("/completion: mirostat 3", "POST", "/completion", AUTH, {"prompt": "a", "mirostat": 3}, None, 400),
        ("/completion: mirostat_tau -1", "POST", "/completion", AUTH, {"prompt": "a", "mirostat": 2, "mirostat_tau": -1},
         None, 400),
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
        ("chat: a tool without its function", "POST", "/v1/chat/completions", AUTH,
         {"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}, None, 400),
        ("/completion: n_predict -2", "POST", "/completion", AUTH, {"prompt": "a", "n_predict": -2}, None, 400),
        ("tokenize: no content", "POST", "/tokenize", AUTH, {"text": "a"}, None, 400),
        ("detokenize: strings", "POST", "/detokenize", AUTH, {"tokens": ["a"]}, None, 400),
        ("detokenize: id out of range", "POST", "/detokenize", AUTH, {"tokens": [10 ** 9]}, None, 400),
        ("embeddings: no input", "POST", "/v1/embeddings", AUTH, {}, None, 400),
        ("embeddings: pooling max", "POST", "/v1/embeddings", AUTH, {"input": "a", "pooling": "max"}, None, 400),
        ("embeddings: input a number", "POST", "/v1/embeddings", AUTH, {"input": 7}, None, 400),
        ("embeddings: encoding binary", "POST", "/v1/embeddings", AUTH, {"input": "a", "encoding_format": "binary"},
         None, 400),
        ("embeddings: 2049 inputs", "POST", "/v1/embeddings", AUTH, {"input": ["a"] * 2049}, None, 400),
        ("chat: a tool call without its function", "POST", "/v1/chat/completions", AUTH,
         {"messages": [{"role": "user", "content": "a"},
                       {"role": "assistant", "content": "b", "tool_calls": [{"id": "1", "type": "function"}]},
                       {"role": "user", "content": "c"}]}, None, 400),
        ("GET /v1/models/{another}", "GET", "/v1/models/gpt-4o", AUTH, None, None, 404),
        ("GET /v1/models/ (no id)", "GET", "/v1/models/", AUTH, None, None, 404),
        ("GET on a POST endpoint", "GET", "/v1/chat/completions", AUTH, None, None, 405),
        ("POST on a GET endpoint", "POST", "/v1/models", AUTH, {}, None, 405),
    ]
    for what, method, path, headers, body, raw, expect in cases:
        status, reply = srv.request(method, path, body=body, headers=headers, raw=raw, timeout=60)
        checks.check(status == expect and error_shape(reply),
                     f"{what}: {status} (want {expect}) {json.dumps(reply)[:160] if status != expect else ''}")
        if not srv.alive():
            checks.check(False, f"the server died on: {what}")
            break

    # llama.cpp's other samplers at their "off" values, as clients send them: accepted.
    off = dict(good, typical_p=1, xtc_probability=0, xtc_threshold=0.1, dry_multiplier=0, dynatemp_range=0,
               top_n_sigma=-1, mirostat=0)
    status, reply = srv.request("POST", C, body=off, headers=AUTH, timeout=60)
    checks.check(status == 200, f"samplers at their off values are accepted: {status} {str(reply)[:160]}")

    # The scheme's name is case-insensitive (RFC 9110): "bearer KEY" is accepted.
    status, reply = srv.request("POST", C, body=good, headers={"Authorization": "bearer " + KEY}, timeout=60)
    checks.check(status == 200, f"a lower-case 'bearer' scheme is accepted: {status}")

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

    # A full queue gets 429. With one slot and a queue of one, requests that arrive together beyond those two
    # are refused. They are released at once by a barrier and each asks for 400 tokens, so the running one
    # is still generating when the others arrive (waiting on /metrics for a queued request would race with a
    # tiny model that finishes 400 tokens in a few milliseconds).
    long_req = {"prompt": "Tell", "max_tokens": 400, "temperature": 0}
    n_burst = 6
    barrier = threading.Barrier(n_burst)
    results = [None] * n_burst

    def burst(i):
        barrier.wait()
        results[i] = srv.request("POST", C, long_req, headers=AUTH, timeout=120)

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(n_burst)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r[0] for r in results)
    checks.check(all(st in (200, 429) for st in statuses), f"a burst gets only 200 or 429: {statuses}")
    refused = [r for r in results if r[0] == 429]
    served = [r for r in results if r[0] == 200]
    checks.check(len(refused) >= 1 and all(error_shape(r[1]) for r in refused),
                 f"a full queue gives 429 in the error shape ({len(refused)} of {n_burst})")
    checks.check(1 <= len(served) and all(r[1]["choices"][0]["finish_reason"] in ("stop", "length") for r in served),
                 f"the running and queued requests were served ({len(served)})")
    texts = {r[1]["choices"][0]["text"] for r in served}
    checks.check(len(texts) == 1, "every served request of the burst got the same greedy text")

    # Still serving, and /health needs no key.
    status, body = srv.request("GET", "/health")
    checks.check(status == 200, "/health answers without a key")
    status, body = srv.request("POST", C, good, headers=AUTH)
    checks.check(status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length"),
                 "a good request is served after all of that")
    # Without --cors-origin, no CORS: a preflight is an unknown endpoint and replies carry no CORS header.
    status, headers = exchange(srv.port, "OPTIONS", C, {"Origin": "http://page.example",
                                                        "Access-Control-Request-Method": "POST"})
    checks.check(status in (401, 404) and "access-control-allow-origin" not in headers,
                 f"no CORS unless asked for: OPTIONS {status}, headers {sorted(headers)}")
    checks.check(srv.close() == 0, "the server stops cleanly")


# The error's param names the offending field when there is one (OpenAI's shape; SDKs show it).
with serve_util.Server(model, "-np", 1, "-c", CTX) as srv:
    for body, param in (({"prompt": [1, "a", 3], "max_tokens": 2}, "prompt"),
                        ({"prompt": "a", "top_p": 7}, "top_p"),
                        ({"prompt": "a", "max_tokens": "x"}, "max_tokens"),
                        ({"prompt": "a", "stop": ["x"] * 100}, "stop"),
                        # a nested field is named by its whole path, not by its last name
                        ({"prompt": "a", "stream": True, "stream_options": {"include_usage": 1}},
                         "stream_options.include_usage")):
        status, reply = srv.request("POST", "/v1/completions", body)
        checks.check(status == 400 and error_shape(reply) and reply["error"]["param"] == param,
                     f"{body}: 400 with param {param!r}: {status} {reply}")
    user = {"role": "user", "content": "hi"}
    for body, param in (({"messages": [user, {"role": 5, "content": "x"}]}, "messages[1].role"),
                        ({"messages": [user, {"content": "x"}]}, "messages[1].role"),
                        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
                        ({"messages": [user, user, {"role": "user"}]}, "messages[2].content"),
                        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
                        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                    {"type": "image_url"}]}]},
                         "messages[0].content[1]"),
                        ({"messages": [user, "hello"]}, "messages[1]"),
                        ({"messages": [user, {"role": "assistant", "content": "x", "reasoning_content": 3}]},
                         "messages[1].reasoning_content"),
                        ({"messages": [user], "response_format": {"type": 3}}, "response_format.type"),
                        ({"messages": [user], "response_format": {"type": "json_schema"}}, "response_format"),
                        ({"messages": [user], "response_format": "json"}, "response_format"),
                        ({"messages": [user], "chat_template_kwargs": {"enable_thinking": "yes"}},
                         "chat_template_kwargs.enable_thinking")):
        status, reply = srv.request("POST", "/v1/chat/completions", body)
        checks.check(status == 400 and error_shape(reply) and reply["error"]["param"] == param
                     and reply["error"]["message"].startswith("'" + param + "'"),
                     f"{body}: 400 with param {param!r}: {status} {reply}")
    status, reply = srv.request("POST", "/v1/completions", raw=b"{not json", headers={"Content-Type": "application/json"})
    checks.check(status == 400 and error_shape(reply) and reply["error"]["param"] is None,
                 f"bad JSON: 400 with param null: {status} {reply}")


# A prompt nested 100000 one-element lists deep (200 KB, under the default body limit): a 400, not a stack overflow
# (read_prompt unwraps one level only).
with serve_util.Server(model, "-np", 1, "-c", CTX) as srv:
    nested = b'{"prompt": ' + b"[" * 100000 + b'"a"' + b"]" * 100000 + b', "max_tokens": 2}'
    status, reply = srv.request("POST", C, raw=nested, headers={"Content-Type": "application/json"}, timeout=60)
    checks.check(status == 400 and error_shape(reply) and srv.alive(),
                 f"a prompt nested 100000 lists deep: {status}, the server alive")


# --cors-origin: preflights are answered without the key (browsers send none on them), every reply carries the
# origin, and the key is still required on the request itself.
with serve_util.Server(model, "-np", 1, "-c", CTX, "--api-key", KEY, "--cors-origin", "http://page.example") as srv:
    status, headers = exchange(srv.port, "OPTIONS", C, {"Origin": "http://page.example",
                                                        "Access-Control-Request-Method": "POST",
                                                        "Access-Control-Request-Headers": "authorization"})
    checks.check(status == 204 and headers.get("access-control-allow-origin") == "http://page.example"
                 and "authorization" in headers.get("access-control-allow-headers", "").lower(),
                 f"--cors-origin: a preflight gets 204 with the CORS headers: {status} {headers}")
    # A client library's own headers (openai-node's X-Stainless-*) are allowed too, or the browser drops the call.
    asked = "authorization,content-type,x-stainless-os,x-stainless-retry-count"
    status, headers = exchange(srv.port, "OPTIONS", C, {"Origin": "http://page.example",
                                                        "Access-Control-Request-Method": "POST",
                                                        "Access-Control-Request-Headers": asked})
    allowed = {h.strip() for h in headers.get("access-control-allow-headers", "").lower().split(",")}
    checks.check(status == 204 and set(asked.split(",")) <= allowed,
                 f"--cors-origin: a preflight allows the headers it asks for: {status} {headers}")
    checks.check(headers.get("vary", "").lower() == "access-control-request-headers",
                 f"--cors-origin: the preflight's answer varies with the headers asked for: {headers}")
    # Something other than a list of header names is not echoed back.
    status, headers = exchange(srv.port, "OPTIONS", C, {"Origin": "http://page.example",
                                                        "Access-Control-Request-Method": "POST",
                                                        "Access-Control-Request-Headers": "x-a; <script>"})
    checks.check(status == 204 and headers.get("access-control-allow-headers") == "Authorization, Content-Type",
                 f"--cors-origin: a list that is not header names gets the default: {status} {headers}")
    status, headers = exchange(srv.port, "POST", C, dict(AUTH, Origin="http://page.example"), good)
    checks.check(status == 200 and headers.get("access-control-allow-origin") == "http://page.example",
                 f"--cors-origin: a request with the key is served with the origin header: {status}")
    status, headers = exchange(srv.port, "POST", C, {"Origin": "http://page.example"}, good)
    checks.check(status == 401 and headers.get("access-control-allow-origin") == "http://page.example",
                 f"--cors-origin: without the key still 401 (readable by the page): {status}")

checks.finish()
