"""JSON mode (OpenAI's response_format {"type": "json_object"}): with random tiny models, whose unconstrained text is
never JSON, every reply that ends by itself is one JSON object (chat and /v1/completions, greedy and sampled), a
streamed reply is the same text as the whole one, `sparrow run --json` gives the server's text, and bad
response_formats are refused (schemas: test_serve_json_schema.py)."""
import json
import os

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()
JSON_MODE = {"response_format": {"type": "json_object"}}

for arch in ("llama", "deepseek32"):
    model = serve_util.make_model(arch, os.path.join(tmp, f"{arch}.gguf"))
    with serve_util.Server(model, "-np", 2, "-c", 1024) as srv:
        chat = {"messages": [{"role": "user", "content": "Reply with a JSON object."}], "max_tokens": 400}

        # Unconstrained, the model's greedy text is not JSON: what follows is the constraint's doing.
        status, free = srv.request("POST", "/v1/chat/completions", dict(chat, temperature=0))
        free_text = free["choices"][0]["message"]["content"]
        try:
            json.loads(free_text)
            free_is_json = True
        except ValueError:
            free_is_json = False
        checks.check(status == 200 and not free_is_json, f"{arch}: unconstrained text is not JSON ({free_text[:60]!r})")

        finished = 0
        for temperature in (0, 0.8, 1.5):
            for seed in (1, 2, 3):
                body = dict(chat, temperature=temperature, seed=seed, **JSON_MODE)
                status, reply = srv.request("POST", "/v1/chat/completions", body)
                choice = reply["choices"][0] if status == 200 else {}
                text = choice.get("message", {}).get("content", "")
                if choice.get("finish_reason") == "stop":
                    finished += 1
                    try:
                        value = json.loads(text)
                    except ValueError:
                        value = None
                    checks.check(isinstance(value, dict),
                                 f"{arch} temperature {temperature} seed {seed}: a JSON object ({text[:80]!r})")
                else:
                    checks.check(status == 200 and choice.get("finish_reason") == "length" and
                                 text.lstrip().startswith("{"),
                                 f"{arch} temperature {temperature} seed {seed}: cut by length, an object's start "
                                 f"({status} {text[:80]!r})")
                if temperature == 0:
                    break  # greedy: the seed changes nothing
        checks.check(finished >= 4, f"{arch}: most replies end by themselves ({finished} of 7)")

        # With the whitespace and the close pushed down and the quote up (logit_bias: strings end, members come),
        # objects get keys and values, still whole.
        def token_of(text):
            return srv.request("POST", "/tokenize", {"content": text, "add_special": False})[1]["tokens"]
        bias = {str(t): -4 for text in (" ", "\n", "\t", "\r") for t in token_of(text)}
        bias.update({str(t): -1 for t in token_of("}")})
        bias.update({str(t): 6 for t in token_of('"')})
        rich = 0
        for seed in range(1, 13):
            body = dict(chat, temperature=1.0, seed=seed, logit_bias=bias, max_tokens=300, **JSON_MODE)
            status, reply = srv.request("POST", "/v1/chat/completions", body)
            choice = reply["choices"][0]
            if choice["finish_reason"] != "stop":
                continue
            value = json.loads(choice["message"]["content"])
            checks.check(isinstance(value, dict), f"{arch} seed {seed}: with the close pushed down, still an object")
            rich += 1 if value else 0
        checks.check(rich >= 1, f"{arch}: some objects have members ({rich})")

        # /v1/completions takes it too; streamed deltas make the same text.
        body = {"prompt": "data:", "max_tokens": 300, "temperature": 0, **JSON_MODE}
        status, whole = srv.request("POST", "/v1/completions", body)
        whole_text = whole["choices"][0]["text"] if status == 200 else None
        status2, events, _ = srv.stream("/v1/completions", dict(body, stream=True))
        streamed = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        checks.check(status == 200 and status2 == 200 and streamed == whole_text,
                     f"{arch}: streamed JSON-mode text equals the whole reply ({streamed[:60]!r} vs {whole_text!r:.60})")
        if whole["choices"][0]["finish_reason"] == "stop":
            checks.check(isinstance(json.loads(whole_text), dict), f"{arch}: /v1/completions gives an object")

        # `sparrow run --json` samples the same way: its greedy text is the server's.
        for prompt in ("data:", "Reply with a JSON object."):
            ran = serve_util.run_greedy(model, prompt, 300, "--json")
            status, served = srv.request("POST", "/v1/completions",
                                         {"prompt": prompt, "max_tokens": 300, "temperature": 0, **JSON_MODE})
            checks.check(status == 200 and serve_util.norm(served["choices"][0]["text"]) == ran,
                         f"{arch}: run --json equals the server's JSON mode ({ran[:60]!r})")

        # With '{' banned no object can begin: the server fails the request, run exits non-zero, both saying why.
        brace = token_of("{")[0]
        status, reply = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 40, "temperature": 0,
                                                                "logit_bias": {str(brace): False}, **JSON_MODE})
        checks.check(status == 400 and "JSON object" in reply.get("error", {}).get("message", ""),
                     f"{arch}: '{{' banned: the request fails with a 400 ({status} {reply})")
        status, events, _ = srv.stream("/v1/completions", {"prompt": "x", "max_tokens": 40, "temperature": 0,
                                                           "logit_bias": {str(brace): False}, "stream": True,
                                                           **JSON_MODE})
        errors = [e for e in events if "error" in e]
        checks.check(len(errors) == 1 and errors[0]["error"]["type"] == "invalid_request_error",
                     f"{arch}: '{{' banned, streaming: an error event of the request's kind ({errors})")
        proc = harness.run(["run", "-m", model, "-p", "x", "-n", 40, "--temp", 0, "--json", "-l", f"{brace}-inf"],
                           check=False)
        checks.check(proc.returncode != 0 and "continues the JSON object" in proc.stderr,
                     f"{arch}: run --json with '{{' banned exits {proc.returncode}")

        for rf, what in (({"type": "json_schema", "json_schema": {"schema": {"uniqueItems": True}}}, "an unsupported schema"),
                         ({"type": "yaml"}, "an unknown type"), ("json", "not an object")):
            status, reply = srv.request("POST", "/v1/chat/completions", dict(chat, response_format=rf))
            checks.check(status == 400 and reply["error"]["param"].startswith("response_format"),
                         f"{arch}: response_format {what}: 400 ({status} {reply})")

# A chat format whose prompt opens a thinking block: the reasoning is free text and the object comes after it (the
# unit test runs through a block's end; this random model rarely writes "</think>", so here its reasoning runs to
# max_tokens, into reasoning_content, and the content stays empty: no object has begun).
model = serve_util.make_model("deepseek32", os.path.join(tmp, "deepseek32.gguf"))
with serve_util.Server(model, "-np", 1, "-c", 512, "--chat-format", "deepseek3") as srv:
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 24, "temperature": 0, **JSON_MODE}
    status, reply = srv.request("POST", "/v1/chat/completions",
                                dict(body, chat_template_kwargs={"enable_thinking": True}))
    message = reply["choices"][0]["message"] if status == 200 else {}
    checks.check(status == 200 and message.get("reasoning_content") and not message.get("content") and
                 reply["choices"][0]["finish_reason"] == "length",
                 f"JSON mode with a thinking block open: free reasoning first ({status} {str(reply)[:200]})")
    status, reply = srv.request("POST", "/v1/chat/completions", body)
    content = reply["choices"][0]["message"]["content"] if status == 200 else ""
    checks.check(status == 200 and (reply["choices"][0]["finish_reason"] == "length" or
                                    isinstance(json.loads(content), dict)),
                 f"JSON mode without thinking on the same format: an object ({status} {content[:80]!r})")

checks.finish()
