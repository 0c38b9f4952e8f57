"""`sparrow serve` under random request bodies: valid requests of every endpoint (the slot actions save, restore
and erase among them), damaged at random (values
swapped for boundary numbers, wrong types, huge or empty strings and lists, keys removed or added, the JSON
text cut or a byte changed), sent from two clients at once, some streaming.

Every answer must be 200 with the endpoint's response shape (a stream ending in [DONE]) or a 4xx in OpenAI's
error shape; never a 5xx, a dropped connection or a hang. Afterwards the server is alive, a greedy request
gives the text it gave before the fuzzing, /metrics still parses, and the server stops cleanly (under
AddressSanitizer: with no report). SPARROW_SERVE_FUZZ_REQUESTS and SPARROW_SERVE_FUZZ_SEED override the
defaults."""
import copy
import json
import os
import random

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()
model = serve_util.make_model("deepseek32", os.path.join(tmp, "ds.gguf"), "--n-layer", 2, "--top-k", 16,
                               "--fim-tokens")
N_REQUESTS = int(os.environ.get("SPARROW_SERVE_FUZZ_REQUESTS", 150 if serve_util.LIGHT else 400))
SEED = int(os.environ.get("SPARROW_SERVE_FUZZ_SEED", 20261201))
rng = random.Random(SEED)

BASES = {
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "top_p": 0.9, "top_k": 8,
                        "seed": 3, "stop": ["zz"], "presence_penalty": 0.1, "frequency_penalty": 0.2,
                        "logit_bias": {"5": 3, "9": -100}, "min_p": 0.05, "typical_p": 0.9, "xtc_probability": 0.5,
                        "xtc_threshold": 0.1, "top_n_sigma": 2, "dynatemp_range": 0.5, "dynatemp_exponent": 1.5,
                        "mirostat": 2, "mirostat_tau": 4, "mirostat_eta": 0.2,
                        "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": {
                            "type": "object", "required": ["a"], "maxProperties": 3,
                            "properties": {"a": {"type": "string", "pattern": "^[a-z]+(x|y)?$"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "l": {"type": "array", "items": {"enum": ["x", "y", 3]}, "maxItems": 2},
                                           "o": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/D"}]}},
                            "$defs": {"D": {"type": "object", "properties": {
                                "v": {"type": "number", "minimum": 0, "maximum": 1}}}}}}}},
    "/v1/chat/completions": {"messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "Hello there"}],
                             "max_tokens": 6, "temperature": 0.7, "seed": 9, "logprobs": True, "top_logprobs": 2,
                             "response_format": {"type": "json_object"}},
    "/completion": {"prompt": "The bird", "n_predict": 5, "temperature": 0, "logit_bias": [[5, False], ["bird", 2]],
                    "repeat_penalty": 1.1, "repeat_last_n": 16, "ignore_eos": True, "id_slot": 0, "n_keep": 2,
                    "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
                    "dry_sequence_breakers": ["\n", ":"],
                    "grammar": "root ::= w (\" \" w){0,3} [.!]\nw ::= [a-z\u00e9]{1,6} | \"(\" w \")\""},
    "/tokenize": {"content": "Hello world"},
    "/infill": {"input_prefix": "def f(", "input_suffix": "):\n", "prompt": "x", "n_predict": 4, "temperature": 0,
                "input_extra": [{"filename": "a.py", "text": "y = 1"}]},
    "/detokenize": {"tokens": [5, 6, 7]},
    "/v1/embeddings": {"input": ["one day", "a tree"], "pooling": "mean"},
    "/slots/1?action=save": {"filename": "fuzz.bin"},
    "/slots/0?action=restore": {"filename": "fuzz.bin"},
    "/slots/1?action=erase": {},
}
STREAMABLE = ("/v1/completions", "/v1/chat/completions", "/completion", "/infill")

HOSTILE = [None, True, False, 0, -1, 1, 7, 2 ** 31 - 1, 2 ** 31, 2 ** 53 + 1, 2 ** 63, -2 ** 63, 2 ** 64, 10 ** 30,
           0.5, -0.0, 1e-320, 1e308, -1e308, "", "x", "\u0000", "\ud7ff\ue000", "\U0001f600" * 3, "a" * 3000, [],
           {}, [None], [[]], {"a": {"b": []}}, list(range(300)), [2 ** 40], ["a", 1, None]]


def paths(value, prefix=()):
    """Every place in a JSON value, as a key path (the root is ())."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))


def get_parent(value, path):
    for p in path[:-1]:
        value = value[p]
    return value


def mutate(body):
    """One random change at a random place (the body is modified and returned, or replaced at the root)."""
    path = rng.choice(list(paths(body)))
    kind = rng.randrange(6)
    if not path:  # the root itself
        return rng.choice(HOSTILE) if kind == 0 else body
    parent, key = get_parent(body, path), path[-1]
    if kind <= 2:
        parent[key] = copy.deepcopy(rng.choice(HOSTILE))
    elif kind == 3:  # remove
        del parent[key]
    elif kind == 4:  # wrap in a list or an object
        parent[key] = [parent[key]] if rng.random() < 0.5 else {"value": parent[key]}
    else:  # a sibling: a new key, or the element repeated
        if isinstance(parent, dict):
            parent[rng.choice(["n", "logprobs", "top_logprobs", "echo", "stream_options", "user", "model", "suffix",
                               "zzz"])] = \
                copy.deepcopy(rng.choice(HOSTILE))
        else:
            parent.insert(key, copy.deepcopy(parent[key]))
    return body


def make_request():
    path = rng.choice(list(BASES))
    body = copy.deepcopy(BASES[path])
    for _ in range(rng.randint(0, 3)):
        body = mutate(body)
    stream = path in STREAMABLE and isinstance(body, dict) and rng.random() < 0.3
    raw = None
    if rng.random() < 0.1:  # damage the text itself: cut it or change one byte
        text = json.dumps(body).encode()
        if rng.random() < 0.5:
            raw = text[: rng.randrange(len(text))]
        else:
            i = rng.randrange(len(text))
            raw = text[:i] + bytes([rng.randrange(256)]) + text[i + 1:]
        stream = False
    return path, body, raw, stream


def error_shape(reply):
    e = reply.get("error") if isinstance(reply, dict) else None
    return isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("message", "type", "code"))


def answer_shape(path, reply):
    if not isinstance(reply, dict):
        return False
    if path in ("/v1/completions", "/v1/chat/completions"):
        return isinstance(reply.get("choices"), list) and len(reply["choices"]) == 1 and "usage" in reply
    if path in ("/completion", "/infill"):
        return isinstance(reply.get("content"), str)
    if path == "/tokenize":
        return isinstance(reply.get("tokens"), list)
    if path == "/detokenize":
        return isinstance(reply.get("content"), str)
    if path.startswith("/slots/"):
        return isinstance(reply.get("id_slot"), int)
    return isinstance(reply.get("data"), list) and all(isinstance(d.get("embedding"), list) for d in reply["data"])


def send(srv, request):
    """Sends one request; returns (status, a problem description or None when the answer was acceptable)."""
    path, body, raw, stream = request
    try:
        if stream:
            status, events, done = srv.stream(path, body, timeout=120)
            if status == 200:  # OpenAI streams end with [DONE], llama.cpp's /completion with an event "stop": true
                ended = done if path not in ("/completion", "/infill") else bool(events) and events[-1].get("stop") is True
                return status, None if ended else "a stream that does not end"
            ok = 400 <= status < 500 and events and error_shape(events[0])
            return status, None if ok else f"stream status {status}"
        status, reply = srv.request("POST", path, body=None if raw is not None else body, raw=raw,
                                    headers={"Content-Type": "application/json"}, timeout=120)
    except Exception as e:  # a dropped connection, a timeout, a reply that is not JSON
        return 0, f"{type(e).__name__}: {e}"
    if status == 200:
        return status, None if answer_shape(path, reply) else f"200 without the {path} shape: {str(reply)[:120]}"
    if 400 <= status < 500 and error_shape(reply):
        return status, None
    return status, f"status {status}: {str(reply)[:160]}"


slot_dir = os.path.join(tmp, "slots")
os.makedirs(slot_dir, exist_ok=True)
with serve_util.Server(model, "-np", 2, "-c", 512, "--max-body", 200000, "--slot-save-path", slot_dir) as srv:
    probe = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
    status, before = srv.request("POST", "/v1/completions", probe)
    checks.check(status == 200, f"the probe is served before the fuzzing ({status})")

    requests = [make_request() for _ in range(N_REQUESTS)]
    problems, n_served, n_refused = [], 0, 0
    for i in range(0, N_REQUESTS, 2):
        pair = requests[i:i + 2]
        results = serve_util.parallel(lambda r: send(srv, r), [(r,) for r in pair])
        for request, (status, problem) in zip(pair, results):
            if problem is not None:
                problems.append((request, problem))
            elif status == 200:
                n_served += 1
            else:
                n_refused += 1
        if not srv.alive():
            problems.append((pair, "the server died"))
            break
    for (path, body, raw, stream), problem in problems[:10]:
        shown = raw if raw is not None else json.dumps(body)[:200]
        print(f"  {path} stream={stream} {shown!r}: {problem}")
    checks.check(not problems, f"{N_REQUESTS} fuzzed requests (seed {SEED}): {n_served} served, {n_refused} "
                               f"refused with a 4xx, {len(problems)} problems")
    # Both outcomes must be common, or the damage is too mild (or too wild) to test anything.
    checks.check(min(n_served, n_refused) >= N_REQUESTS // 5, "at least a fifth of the requests were served and "
                                                              "at least a fifth refused")

    checks.check(srv.alive(), "the server is alive after the fuzzing")
    status, after = srv.request("POST", "/v1/completions", probe)
    checks.check(status == 200 and after["choices"][0]["text"] == before["choices"][0]["text"],
                 "the probe's greedy text is unchanged by the fuzzing")
    metrics = srv.metrics()
    http = {k: v for k, v in metrics.items() if k.startswith("sparrow_http_requests_total{")}
    counted = sum(http.values())
    server_errors = sum(v for k, v in http.items() if 'status="5' in k)
    checks.check(counted >= N_REQUESTS and server_errors == 0,
                 f"/metrics counts the requests ({counted:.0f}), none answered 5xx ({server_errors:.0f})")
    checks.check(srv.close() == 0, "the server stops cleanly")

checks.finish()
