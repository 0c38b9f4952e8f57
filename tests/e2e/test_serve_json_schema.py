"""Schema-constrained replies (OpenAI's response_format {"type": "json_schema"}, llama.cpp's top-level json_schema):
with random tiny models, whose unconstrained text is never JSON, every reply that ends by itself satisfies its
schema as python-jsonschema (an independent validator) reads it, for chat and /v1/completions, greedy and sampled;
bounded schemas always end; a streamed reply is the whole one; `sparrow run --json-schema` gives the server's greedy
text; schemas outside the subset, malformed ones and ones no document satisfies get a 400 naming the problem."""
import json
import os

import jsonschema

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()

# Bounded schemas (every string, array and integer bounded, objects closed): a document cannot grow forever, so
# every reply ends by itself within max_tokens.
BOUNDED = [
    {"type": "object",
     "properties": {"name": {"type": "string", "maxLength": 6},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "colour": {"enum": ["red", "green", "blue"]},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
                    "ok": {"type": "boolean"}},
     "required": ["name", "age", "colour", "tags", "ok"], "additionalProperties": False},
    {"$defs": {"Point": {"type": "object",
                         "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                        "y": {"type": "integer", "minimum": -9, "maximum": 9}},
                         "required": ["x", "y"], "additionalProperties": False}},
     "type": "object",
     "properties": {"points": {"type": "array", "items": {"$ref": "#/$defs/Point"}, "minItems": 1, "maxItems": 3},
                    "label": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]}},
     "required": ["points", "label"], "additionalProperties": False},
    {"type": "array", "items": {"const": "yes"}, "minItems": 2, "maxItems": 2},
    {"type": "object",
     "properties": {"confidence": {"type": "number", "minimum": 0, "maximum": 1},
                    "delta": {"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1}},
     "required": ["confidence", "delta"], "additionalProperties": False},
    {"type": "object",
     "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"},
                    "day": {"type": "string", "pattern": "^(mon|tue|wed)$"}},
     "required": ["code", "day"], "additionalProperties": False},
]
# Open ones (free strings, other keys): replies that end must satisfy them; some may run to max_tokens.
OPEN = [
    {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "number"}},
     "required": ["answer"]},
    {"$defs": {"Node": {"type": "object",
                        "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 99, "multipleOf": 3},
                                       "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
                        "required": ["v", "next"], "additionalProperties": False}},
     "$ref": "#/$defs/Node"},
]


def rf(schema):
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


def valid(text, schema):
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


for arch in ("llama", "deepseek32"):
    model = serve_util.make_model(arch, os.path.join(tmp, f"{arch}.gguf"))
    with serve_util.Server(model, "-np", 2, "-c", 2048) as srv:
        chat = {"messages": [{"role": "user", "content": "Reply in JSON."}], "max_tokens": 600}
        for i, schema in enumerate(BOUNDED + OPEN):
            ended = 0
            for temperature, seed in ((0, 1), (0.8, 1), (0.8, 2), (1.5, 3)):
                body = dict(chat, temperature=temperature, seed=seed, response_format=rf(schema))
                status, reply = srv.request("POST", "/v1/chat/completions", body)
                choice = reply["choices"][0] if status == 200 else {}
                text = choice.get("message", {}).get("content", "")
                if choice.get("finish_reason") == "stop":
                    ended += 1
                    checks.check(valid(text, schema), f"{arch} schema {i} t={temperature}: valid ({text[:120]!r})")
                else:
                    checks.check(status == 200 and choice.get("finish_reason") == "length",
                                 f"{arch} schema {i} t={temperature}: 200, cut by length ({status} {str(reply)[:160]})")
            if i < len(BOUNDED):
                checks.check(ended == 4, f"{arch} bounded schema {i}: every reply ends by itself ({ended} of 4)")

        # /v1/completions with response_format, and /completion with llama.cpp's top-level json_schema.
        schema = BOUNDED[0]
        body = {"prompt": "data:", "max_tokens": 600, "temperature": 0, "response_format": rf(schema)}
        status, whole = srv.request("POST", "/v1/completions", body)
        whole_text = whole["choices"][0]["text"] if status == 200 else ""
        checks.check(status == 200 and valid(whole_text, schema), f"{arch}: /v1/completions ({whole_text[:100]!r})")
        status2, events, _ = srv.stream("/v1/completions", dict(body, stream=True))
        streamed = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        checks.check(status2 == 200 and streamed == whole_text, f"{arch}: streamed text equals the whole reply")
        status, native = srv.request("POST", "/completion", {"prompt": "data:", "n_predict": 600, "temperature": 0,
                                                             "json_schema": schema})
        checks.check(status == 200 and native.get("content") == whole_text,
                     f"{arch}: /completion's json_schema gives the same text ({status} {str(native)[:100]})")

        # run --json-schema samples the same way: its greedy text is the server's.
        ran = serve_util.run_greedy(model, "data:", 600, "--json-schema", json.dumps(schema))
        checks.check(ran == serve_util.norm(whole_text), f"{arch}: run --json-schema equals the server ({ran[:80]!r})")
        schema_file = os.path.join(tmp, "schema.json")
        with open(schema_file, "w") as f:
            json.dump(schema, f)
        ran_file = serve_util.run_greedy(model, "data:", 600, "--json-schema-file", schema_file)
        checks.check(ran_file == ran, f"{arch}: --json-schema-file equals --json-schema")

        # Refusals: outside the subset, malformed, unsatisfiable; each a 400 whose message says what.
        for bad, words in (({"type": "string", "pattern": "(?=a)"}, "lookarounds are not supported"),
                           ({"type": "object", "properties": {"n": {"type": "number", "maximum": 2.5}}},
                            "must be whole"),
                           ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems'"),
                           ({"$ref": "#/$defs/nowhere"}, "points to nothing"),
                           (False, "no document satisfies"),
                           ({"type": "integer"}, "only be a number"),
                           ("not a schema", "must be an object or a boolean")):
            status, reply = srv.request("POST", "/v1/chat/completions", dict(chat, response_format=rf(bad)))
            message = reply.get("error", {}).get("message", "") if isinstance(reply, dict) else ""
            checks.check(status == 400 and words in message, f"{arch}: schema {bad!r:.60}: 400 naming it ({status} "
                                                              f"{message!r})")
        for body_rf, what in (({"type": "json_schema"}, "no json_schema object"),
                              ({"type": "json_schema", "json_schema": "x"}, "json_schema not an object")):
            status, reply = srv.request("POST", "/v1/chat/completions", dict(chat, response_format=body_rf))
            checks.check(status == 400 and reply["error"]["param"].startswith("response_format"),
                         f"{arch}: response_format with {what}: 400 ({status} {reply})")
        status, reply = srv.request("POST", "/completion", {"prompt": "x", "json_schema": {"type": "string",
                                                                                           "format": "uuid",
                                                                                           "multipleOf": 0.5}})
        checks.check(status == 400 and "multipleOf" in reply["error"]["message"],
                     f"/completion: a json_schema outside the subset: 400 ({status} {reply})")
        # The server still serves after the refusals.
        status, reply = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4})
        checks.check(status == 200, f"{arch}: serving after the refusals ({status})")

proc = harness.run(["run", "-m", os.path.join(tmp, "llama.gguf"), "-p", "x", "-n", 8, "--json-schema", "{oops"],
                   check=False)
checks.check(proc.returncode != 0 and "--json-schema: not JSON" in proc.stderr,
             f"run --json-schema with malformed JSON exits {proc.returncode} ({proc.stderr[-200:]!r})")
checks.finish()
