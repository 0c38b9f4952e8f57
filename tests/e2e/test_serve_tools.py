"""Function calling on /v1/chat/completions (OpenAI's tools, tool_choice, parallel_tool_calls) in the three chat
formats that have it:
- prompts: /apply-template of conversations with tools on offer, calls and tool results equals what the real Jinja
  templates in ../shared/data/templates render (jinja2 with Hugging Face's settings), thinking on and off;
- calls: with tool_choice "required" or a named function a random tiny model's reply is calls (a grammar makes it
  so), read back as OpenAI tool_calls whose arguments are JSON objects of the schema's types; streamed replies give
  the same calls; the calls sent back with tool results render as the template renders them;
- without tool_choice the model's text stays content (it never writes a call block);
- malformed tools, tool_choice and tool messages get 400s, and the llama2 format refuses tools; randomly damaged
  tool requests get a reply or a 4xx in the error shape, and the server keeps serving."""
import copy
import json
import os
import random

import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()

TEMPLATES = {"deepseek3": "deepseek-ai-DeepSeek-V3.2.jinja", "deepseek4": "deepseek-ai-DeepSeek-V4.jinja",
             "glm": "GLM-4.7-Flash.jinja"}
TEMPLATE_DIR = os.path.join(harness.REPO, "..", "shared", "data", "templates")
if harness.shared_data("templates"):
    TEMPLATE_DIR = harness.shared_data("templates")


def render(fmt, messages, tools, thinking, bos):
    """What Hugging Face's apply_chat_template renders: trim_blocks, lstrip_blocks, its tojson (keys as given,
    non-ASCII kept); DeepSeek's templates also use from_json on arguments given as text."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.filters["from_json"] = json.loads
    with open(os.path.join(TEMPLATE_DIR, TEMPLATES[fmt])) as f:
        template = env.from_string(f.read())
    kwargs = {"messages": messages, "add_generation_prompt": True, "bos_token": bos}
    if tools:
        kwargs["tools"] = tools
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    return template.render(**kwargs)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                    "metric": {"type": "boolean"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                                    "at": {"type": "object", "required": ["lat"], "properties": {
                                                        "lat": {"type": "number"}, "lon": {"type": "number"}}}},
                   "required": ["city"]}}}
# keys in an unusual order (function before type, parameters before name): the prompt keeps the client's order
SEARCH = {"function": {"parameters": {"type": "object", "properties": {
    "query": {"type": "string", "description": "what to look for"}, "limit": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}}, "filters": {"type": "object"}}},
    "name": "web.search", "description": "Søg på nettet \"quoted\" <tags>"}, "type": "function"}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, SEARCH, NOW]


def call(name, args, cid):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


CALLS = [call("get_weather", {"city": "Paris", "days": 2, "metric": True}, "c1"),
         call("web.search", {"query": "naïve \"café\" <b>\nline two", "limit": 2.5, "tags": ["a", "b"],
                             "filters": {"z": None, "a": [1, {"k": "v"}]}}, "c2"),
         call("now", {}, "c3")]


def conversations():
    """(name, messages, tools) with the arguments of calls as objects (the template's view)."""
    user = {"role": "user", "content": "What's the weather in Paris?"}
    system = {"role": "system", "content": "You are a helpful assistant."}
    asked = {"role": "assistant", "content": "", "tool_calls": CALLS[:1]}
    asked3 = {"role": "assistant", "content": "Let me look.", "tool_calls": CALLS}
    results = [{"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"}]
    results3 = [{"role": "tool", "tool_call_id": c["id"], "content": f"result {i}"} for i, c in enumerate(CALLS)]
    answer = {"role": "assistant", "content": "It is sunny."}
    yield "offer", [user], TOOLS
    yield "offer_system", [system, user], TOOLS
    yield "one_call", [system, user, asked] + results, TOOLS
    yield "three_calls", [user, asked3] + results3, TOOLS
    yield "answered", [user, asked] + results + [answer, {"role": "user", "content": "And Rome?"}], TOOLS
    yield "history_without_tools", [user, asked] + results, None
    yield "reasoning", [user, dict(asked3, reasoning_content="I should call tools.")] + results3, TOOLS


def wire(messages):
    """The messages as an OpenAI client sends them: each call's arguments as JSON text."""
    out = []
    for m in messages:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.dumps(c["function"]["arguments"])))
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def valid(schema, value):
    """The subset of JSON Schema the tools here use: type, enum, properties (no others), required, items."""
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}
    if "enum" in schema and value not in schema["enum"]:
        return False
    t = schema.get("type")
    if t:
        if isinstance(value, bool) and t not in ("boolean",):
            return False
        if not isinstance(value, types[t]):
            return False
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        if any(k not in props or not valid(props[k], v) for k, v in value.items()):
            return False
        if any(r not in value for r in schema.get("required", [])):
            return False
    if isinstance(value, list) and "items" in schema:
        return all(valid(schema["items"], v) for v in value)
    return True


def schema_ok(tool, args):
    """Arguments are an object the tool's parameter schema accepts."""
    return isinstance(args, dict) and valid(tool["function"].get("parameters", {"type": "object"}), args)


TOOL_BY_NAME = {t["function"]["name"]: t for t in TOOLS}

HOSTILE = [None, True, False, 0, -1, 2 ** 63, 1e308, "", "x", "\u0000", "a" * 2000, [], {}, [None], {"a": {}},
           "required", "none", {"type": "function"}, {"name": "now"}, "{\"a\": 1}", "{bad"]


def fuzz_tools(srv, base_body, n=int(os.environ.get("SPARROW_TOOLS_FUZZ_REQUESTS", 60 if serve_util.LIGHT else 150))):
    """Random changes at random places of a tools request (a value replaced, removed or wrapped)."""
    rng = random.Random(20261208)

    def places(value, prefix=()):
        yield prefix
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
        for k, v in items:
            yield from places(v, prefix + (k,))

    problems, statuses = [], {}
    for _ in range(n):
        body = copy.deepcopy(base_body)
        for _ in range(rng.randint(1, 3)):
            path = rng.choice([p for p in places(body) if p])
            parent = body
            for k in path[:-1]:
                parent = parent[k]
            kind = rng.randrange(4)
            if kind <= 1:
                parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
            elif kind == 2:
                del parent[path[-1]]
            else:
                parent[path[-1]] = [parent[path[-1]]]
        status, reply = srv.request("POST", "/v1/chat/completions", body, timeout=120)
        statuses[status] = statuses.get(status, 0) + 1
        ok = (status == 200 and isinstance(reply, dict) and isinstance(reply.get("choices"), list)) or (
            400 <= status < 500 and isinstance(reply, dict) and isinstance(reply.get("error", {}).get("message"), str))
        if not ok:
            problems.append(f"{status}: {json.dumps(body)[:200]} -> {str(reply)[:200]}")
    checks.check(not problems and srv.alive(), f"{n} damaged tool requests: a reply or a clean 4xx each {statuses}"
                 + "".join("\n  " + p for p in problems[:5]))

model = serve_util.make_model("deepseek32", os.path.join(tmp, "ds.gguf"))
for fmt in TEMPLATES:
    with serve_util.Server(model, "-np", 2, "-c", 8192, "--chat-format", fmt) as srv:
        caps = srv.request("GET", "/props")[1].get("chat_template_caps", {})
        checks.check(caps.get("supports_tools") is True and caps.get("supports_parallel_tool_calls") is True,
                     f"{fmt}: /props says the format has tool calls")
        bos = srv.request("POST", "/apply-template", {"messages": [{"role": "user", "content": "x"}]})[1]["prompt"]
        bos = bos[:bos.index("<｜User｜>")] if fmt != "glm" else ""
        # Prompts against the template.
        for name, messages, tools in conversations():
            for thinking in (None, True, False):
                body = {"messages": wire(messages)}
                if tools:
                    body["tools"] = tools
                if thinking is not None:
                    body["chat_template_kwargs"] = {"enable_thinking": thinking}
                status, reply = srv.request("POST", "/apply-template", body)
                want = render(fmt, messages, tools, thinking, bos)
                got = reply.get("prompt") if status == 200 else reply
                checks.check(status == 200 and got == want,
                             f"{fmt} {name} thinking={thinking}: the prompt is the template's"
                             + ("" if got == want else f"\n got:  {got!r}\n want: {want!r}"))

        # Forced calls: greedy and sampled, all calls or one, any tool or a named one.
        # A random model's text values would run on for ever: the characters that end values are made likelier.
        ends = sorted({t for ch in '<"]}' for t in srv.request("POST", "/tokenize", {"content": ch})[1]["tokens"]})
        base = {"messages": [{"role": "user", "content": "What's the weather in Paris?"}], "tools": TOOLS,
                "max_tokens": 1500, "chat_template_kwargs": {"enable_thinking": False},
                "logit_bias": {str(t): 6 for t in ends}}
        cases = [("required", {"tool_choice": "required", "temperature": 0}),
                 ("required sampled", {"tool_choice": "required", "temperature": 1.0, "seed": 7}),
                 ("required one", {"tool_choice": "required", "parallel_tool_calls": False, "temperature": 0.8,
                                   "seed": 3}),
                 ("named", {"tool_choice": {"type": "function", "function": {"name": "web.search"}},
                            "temperature": 0.9, "seed": 11})]
        for label, extra in cases:
            body = dict(base, **extra)
            status, reply = srv.request("POST", "/v1/chat/completions", body)
            ok = status == 200
            msg = reply["choices"][0]["message"] if ok else {}
            calls = msg.get("tool_calls") or []
            finish_whole = reply["choices"][0]["finish_reason"] if ok else None
            if finish_whole == "length" and extra.get("temperature") != 0:
                # A sampled value that never ended (a random model's text has no reason to): the calls before it
                # are calls, the unfinished one is content as the model wrote it.
                ok = ok and (msg.get("content") or "").lstrip().startswith(("<｜DSML｜", "<tool_call>"))
            else:
                ok = ok and finish_whole == "tool_calls" and msg.get("content") is None
            ok = ok and len(calls) >= 1 and len({c["id"] for c in calls}) == len(calls)
            if extra.get("parallel_tool_calls") is False:
                ok = ok and len(calls) == 1
            for c in calls:
                fn = c.get("function", {})
                want_name = extra["tool_choice"]["function"]["name"] if isinstance(extra["tool_choice"], dict) else None
                ok = ok and c.get("type") == "function" and c["id"].startswith("call_")
                ok = ok and fn.get("name") in TOOL_BY_NAME and (want_name is None or fn["name"] == want_name)
                ok = ok and schema_ok(TOOL_BY_NAME.get(fn.get("name"), WEATHER), json.loads(fn.get("arguments", "0")))
            checks.check(ok, f"{fmt} {label}: the reply is {len(calls)} call(s) of the schema's types"
                         + ("" if ok else f": {status} {reply}"))
            # The same request streamed: the same calls (ids aside), the same finish.
            status, events, done = srv.stream("/v1/chat/completions", body)
            streamed, finish, content = [], None, ""
            for e in events:
                for ch in e.get("choices", []):
                    delta = ch.get("delta", {})
                    content += delta.get("content") or ""
                    for tc in delta.get("tool_calls", []):
                        streamed.append((tc["index"], tc["function"]["name"], tc["function"]["arguments"]))
                    finish = ch.get("finish_reason") or finish
            whole = [(i, c["function"]["name"], c["function"]["arguments"]) for i, c in enumerate(calls)]
            if extra.get("temperature") == 0 or "seed" in extra:
                checks.check(status == 200 and done and streamed == whole and finish == finish_whole
                             and content == (msg.get("content") or ""),
                             f"{fmt} {label}: streamed, the same calls as deltas"
                             + ("" if streamed == whole else f": {streamed} vs {whole}"))
            # The calls sent back with results: the prompt is the template's.
            if calls:
                asked = {"role": "assistant", "content": "", "tool_calls": calls}
                results = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
                history = base["messages"] + [asked] + results
                status, reply = srv.request("POST", "/apply-template", {"messages": history, "tools": TOOLS,
                                                                        "chat_template_kwargs": {"enable_thinking": False}})
                as_objects = base["messages"] + [dict(asked, tool_calls=[
                    dict(c, function=dict(c["function"], arguments=json.loads(c["function"]["arguments"])))
                    for c in calls])] + results
                checks.check(status == 200 and reply.get("prompt") == render(fmt, as_objects, TOOLS, False, bos),
                             f"{fmt} {label}: the calls sent back render as the template renders them")
                status, reply = srv.request("POST", "/v1/chat/completions",
                                            dict(base, messages=history, max_tokens=8, temperature=0))
                checks.check(status == 200 and isinstance(reply["choices"][0]["message"]["content"], str),
                             f"{fmt} {label}: a conversation with the results goes on")

        # Tools on offer, the model free: its noise is content, never calls.
        status, reply = srv.request("POST", "/v1/chat/completions", dict(base, max_tokens=24, temperature=0))
        msg = reply["choices"][0]["message"] if status == 200 else {}
        checks.check(status == 200 and "tool_calls" not in msg and isinstance(msg.get("content"), str)
                     and reply["choices"][0]["finish_reason"] in ("length", "stop"), f"{fmt} auto: text stays content")
        status, reply = srv.request("POST", "/v1/chat/completions",
                                    dict(base, max_tokens=24, temperature=0, tool_choice="none"))
        checks.check(status == 200 and "tool_calls" not in reply["choices"][0]["message"], f"{fmt} tool_choice none")
        # tool_choice none offers nothing: the prompt is the template's without tools.
        status, reply = srv.request("POST", "/apply-template", dict(base, tool_choice="none"))
        checks.check(status == 200 and reply.get("prompt") == render(fmt, base["messages"], None, False, bos),
                     f"{fmt} tool_choice none: the prompt offers no tools")

        # Refusals.
        bad = [
            ({"tools": {"type": "function"}}, "'tools' must be an array"),
            ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
            ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "parameters"),
            ({"tools": [WEATHER, WEATHER]}, "a second tool named 'get_weather'"),
            ({"tool_choice": "sometimes"}, "'tool_choice' must be"),
            ({"tool_choice": "required"}, "offers none"),
            ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in 'tools'"),
            ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "'tool_choice' must be"),
            ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
             "cannot be combined"),
            ({"tools": TOOLS, "tool_choice": "required", "grammar": "root ::= \"x\""}, "cannot be combined"),
            ({"functions": [WEATHER["function"]]}, "send 'tools'"),
            ({"function_call": "auto"}, "send 'tool_choice'"),
            ({"messages": [{"role": "user", "content": "q"},
                           {"role": "assistant", "content": "", "tool_calls": [call("f", "[1]", "x")]}]},
             "arguments' must be a JSON object"),
            ({"messages": [{"role": "user", "content": "q"},
                           {"role": "assistant", "content": "", "tool_calls": [call("f", "{bad", "x")]}]},
             "arguments' must be a JSON object"),
            ({"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "", "tool_calls": [
                call("f", "{}", "x")]}]}, "belongs in an assistant message"),
            ({"messages": [{"role": "user", "content": "q"}, {"role": "tool"}]}, "'messages[1].content' is required"),
            ({"messages": [{"role": "user", "content": "q"},
                           {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}]},
             "function' must be an object"),
        ]
        if fmt == "deepseek3":
            bad.append(({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]},
                        "no assistant message of tool calls"))
        for extra, needle in bad:
            body = dict({"messages": [{"role": "user", "content": "q"}], "max_tokens": 4}, **extra)
            status, reply = srv.request("POST", "/v1/chat/completions", body)
            message = reply.get("error", {}).get("message", "") if isinstance(reply, dict) else ""
            checks.check(status == 400 and needle in message, f"{fmt} 400 for {json.dumps(extra)[:80]}: {message}")
        checks.check(srv.alive(), f"{fmt}: the server is still up")

        if fmt == "glm":  # the shortest tools prompt: damaged requests, every answer a reply or a clean 4xx
            fuzz_tools(srv, dict(base, max_tokens=40, tool_choice="required", stream=False, messages=[
                {"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": wire([
                    {"tool_calls": CALLS}])[0]["tool_calls"]}] + [
                {"role": "tool", "tool_call_id": c["id"], "content": "r"} for c in CALLS]))

llama = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
with serve_util.Server(llama, "-np", 1, "-c", 1024, "--chat-format", "llama2") as srv:
    status, reply = srv.request("POST", "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "q"}], "tools": TOOLS, "max_tokens": 4})
    checks.check(status == 400 and "has no tool calling" in reply["error"]["message"], "llama2 refuses tools")
    checks.check(srv.request("GET", "/props")[1]["chat_template_caps"]["supports_tools"] is False,
                 "llama2: /props says the format has no tool calls")
    status, reply = srv.request("POST", "/v1/chat/completions", {"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call("f", "{}", "x")]},
        {"role": "tool", "content": "r"}], "max_tokens": 4})
    checks.check(status == 400 and "no tool calls" in reply["error"]["message"], "llama2 refuses tool turns")

checks.finish()
