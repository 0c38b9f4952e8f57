"""llama.cpp's /infill: the prompt is [BOS] PRE prefix SUF suffix MID prompt with the model's fill-in-the-middle
tokens (from tokenizer.ggml.fim_*_token_id on llama, found by their text on deepseek32), texts tokenized without
special tokens; the reply is /completion's for that prompt. Other files (input_extra) go before PRE, each after its
file name line. A model without FIM tokens gets 501; malformed fields 400."""
import os

import harness
import serve_util
from serve_util import norm

checks = harness.Checks()
tmp = harness.temp_dir()
PREFIX, SUFFIX, MIDDLE = "def add(a, b):\n    ", "\n    return c\n", "c ="

for arch in ("llama", "deepseek32"):
    model = serve_util.make_model(arch, os.path.join(tmp, f"{arch}-fim.gguf"), "--fim-tokens")
    with serve_util.Server(model, "-np", 1, "-c", 512) as srv:
        n_vocab = srv.request("GET", "/v1/models")[1]["data"][0]["meta"]["n_vocab"]
        bos, pre, suf, mid = n_vocab - 5, n_vocab - 3, n_vocab - 2, n_vocab - 1  # specials come last

        def ids(text):
            return srv.request("POST", "/tokenize", {"content": text, "parse_special": False})[1]["tokens"]

        want_prompt = [bos, pre] + ids(PREFIX) + [suf] + ids(SUFFIX) + [mid] + ids(MIDDLE)
        base = {"n_predict": 8, "temperature": 0, "n_probs": 1}
        status, got = srv.request("POST", "/infill", dict(base, input_prefix=PREFIX, input_suffix=SUFFIX,
                                                          prompt=MIDDLE))
        checks.check(status == 200, f"{arch}: /infill answers ({status} {str(got)[:200]})")
        status, want = srv.request("POST", "/completion", dict(base, prompt=want_prompt))
        checks.check(norm(got.get("content", "")) == norm(want["content"]) and
                     [p["id"] for p in got["completion_probabilities"]] ==
                     [p["id"] for p in want["completion_probabilities"]],
                     f"{arch}: /infill equals /completion of [BOS] PRE prefix SUF suffix MID prompt "
                     f"({got.get('content')!r} vs {want['content']!r})")
        checks.check(got.get("tokens_evaluated") == len(want_prompt),
                     f"{arch}: the prompt has {len(want_prompt)} tokens ({got.get('tokens_evaluated')})")

        # Other files: each file's name line and text, before PRE (no repository tokens in this vocabulary).
        extra = [{"filename": "util.py", "text": "x = 1\n"}, {"filename": "b.py", "text": "y = 2\n"}]
        with_extra = ([bos] + ids("util.py\n") + ids("x = 1\n") + ids("b.py\n") + ids("y = 2\n") + [pre] + ids(PREFIX)
                      + [suf] + ids(SUFFIX) + [mid])
        status, got = srv.request("POST", "/infill", dict(base, input_prefix=PREFIX, input_suffix=SUFFIX,
                                                          input_extra=extra))
        status2, want = srv.request("POST", "/completion", dict(base, prompt=with_extra))
        checks.check(status == 200 and [p["id"] for p in got["completion_probabilities"]] ==
                     [p["id"] for p in want["completion_probabilities"]],
                     f"{arch}: input_extra goes before PRE, file name line then text")

        # A long prefix keeps its end: 3/4 of half the slot's context (512 / 2 * 3 / 4 = 192 tokens at most).
        long_prefix = "word " * 400
        status, got = srv.request("POST", "/infill", dict(base, input_prefix=long_prefix, input_suffix=SUFFIX))
        checks.check(status == 200 and got["tokens_evaluated"] <= 1 + 1 + 192 + 1 + 64 + 1,
                     f"{arch}: a long prefix is cut to fit ({status}, {got.get('tokens_evaluated')} tokens)")

        # Streaming works as for /completion.
        status, events, _ = srv.stream("/infill", dict(base, input_prefix=PREFIX, input_suffix=SUFFIX))
        checks.check(status == 200 and len(events) > 0, f"{arch}: /infill streams ({status}, {len(events)} events)")

        for what, body in [("input_extra an object", {"input_extra": {"text": "x"}}),
                           ("input_extra entry a string", {"input_extra": ["x"]}),
                           ("input_extra text a number", {"input_extra": [{"text": 5}]}),
                           ("input_prefix a number", {"input_prefix": 5}),
                           ("n_predict a string", {"input_prefix": "a", "n_predict": "5"})]:
            status, reply = srv.request("POST", "/infill", body)
            checks.check(status == 400, f"{arch}: {what}: 400 ({status})")
        checks.check(srv.request("GET", "/health")[0] == 200, f"{arch}: the server keeps serving")

# Without FIM tokens: 501, naming what is missing.
plain = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
with serve_util.Server(plain, "-np", 1, "-c", 256) as srv:
    status, reply = srv.request("POST", "/infill", {"input_prefix": "a", "input_suffix": "b"})
    checks.check(status == 501 and "fill-in-the-middle" in str(reply), f"no FIM tokens: 501 ({status} {reply})")
    checks.check(srv.request("GET", "/infill")[0] == 405, "GET /infill: 405")
checks.finish()
