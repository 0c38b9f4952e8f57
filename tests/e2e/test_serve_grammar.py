"""GBNF-constrained replies (llama.cpp's `grammar` field, `sparrow run --grammar`): with random tiny models, whose
unconstrained text is noise, every reply that ends by itself is a text the grammar derives, checked by Python's `re`
(regular grammars) or a recogniser of its own (a recursive one), on /completion, /v1/completions and chat, greedy and
sampled; bounded grammars always end; a streamed reply is the whole one; `sparrow run --grammar` gives the server's
greedy text; malformed grammars, and a grammar beside a JSON constraint, get a 400 naming the problem."""
import os
import re

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()

# (grammar, a Python regular expression for the same language, bounded: every text ends within max_tokens)
REGULAR = [
    ('root ::= "Answer: " ("yes" | "no" | [0-9]{1,3}) "."', r"Answer: (yes|no|[0-9]{1,3})\.", True),
    ('root ::= item (", " item){0,3}\nitem ::= [a-z]{2,5}', r"[a-z]{2,5}(, [a-z]{2,5}){0,3}", True),
    ('root ::= [αβγδ]{2,4} "!" | "€" [0-9]', r"[αβγδ]{2,4}!|€[0-9]", True),
    ('root ::= ([^\\n]{1,8} "\\n"){1,3}', r"([^\n]{1,8}\n){1,3}", True),
    ('# a line of words, ended by a full stop\nroot ::= word (" " word)* "."\nword ::= [A-Za-z]+', r"[A-Za-z]+( [A-Za-z]+)*\.",
     False),
]
NESTED = 'root ::= list\nlist ::= "[" (elem ("," elem)*)? "]"\nelem ::= [0-9] | list'


def nested_ok(text):
    """Recursive descent over NESTED's language: a list of digits and lists."""
    def parse_list(i):
        if i >= len(text) or text[i] != "[":
            return -1
        i += 1
        if i < len(text) and text[i] == "]":
            return i + 1
        while True:
            if i < len(text) and text[i].isdigit():
                i += 1
            else:
                i = parse_list(i)
                if i < 0:
                    return -1
            if i < len(text) and text[i] == ",":
                i += 1
                continue
            return i + 1 if i < len(text) and text[i] == "]" else -1
    return parse_list(0) == len(text)


for arch in ("llama", "deepseek32"):
    model = serve_util.make_model(arch, os.path.join(tmp, f"{arch}.gguf"))
    with serve_util.Server(model, "-np", 2, "-c", 2048) as srv:
        for i, (grammar, pattern, bounded) in enumerate(REGULAR + [(NESTED, None, False)]):
            ended = 0
            for temperature, seed in ((0, 1), (0.8, 1), (1.5, 2)):
                for path, body in (("/completion", {"prompt": "Q:", "n_predict": 300, "grammar": grammar}),
                                   ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Q?"}],
                                                             "max_tokens": 300, "grammar": grammar})):
                    status, reply = srv.request("POST", path, dict(body, temperature=temperature, seed=seed))
                    if path == "/completion":
                        text, finish = reply.get("content", ""), reply.get("finish_reason")
                    else:
                        choice = reply["choices"][0] if status == 200 else {}
                        text, finish = choice.get("message", {}).get("content", ""), choice.get("finish_reason")
                    what = f"{arch} grammar {i} {path} t={temperature}"
                    if status != 200:
                        checks.check(False, f"{what}: 200 ({status} {str(reply)[:200]})")
                        continue
                    if finish == "stop":
                        ended += 1
                        ok = re.fullmatch(pattern, text) is not None if pattern else nested_ok(text)
                        checks.check(ok, f"{what}: the grammar derives the reply ({text[:120]!r})")
                    else:
                        checks.check(finish == "length", f"{what}: stop or length ({finish})")
            if bounded:
                checks.check(ended == 6, f"{arch} bounded grammar {i}: every reply ends by itself ({ended} of 6)")

        # /v1/completions, streamed and whole, and run --grammar / --grammar-file: the same greedy text.
        grammar, pattern, _ = REGULAR[1]
        body = {"prompt": "list:", "max_tokens": 200, "temperature": 0, "grammar": grammar}
        status, whole = srv.request("POST", "/v1/completions", body)
        whole_text = whole["choices"][0]["text"] if status == 200 else ""
        checks.check(status == 200 and re.fullmatch(pattern, whole_text) is not None,
                     f"{arch}: /v1/completions ({whole_text[:100]!r})")
        status2, events, _ = srv.stream("/v1/completions", dict(body, stream=True))
        streamed = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        checks.check(status2 == 200 and streamed == whole_text, f"{arch}: streamed text equals the whole reply")
        ran = serve_util.run_greedy(model, "list:", 200, "--grammar", grammar)
        checks.check(ran == serve_util.norm(whole_text), f"{arch}: run --grammar equals the server ({ran[:80]!r})")
        grammar_file = os.path.join(tmp, "g.gbnf")
        with open(grammar_file, "w") as f:
            f.write(grammar + "\n")
        checks.check(serve_util.run_greedy(model, "list:", 200, "--grammar-file", grammar_file) == ran,
                     f"{arch}: --grammar-file equals --grammar")

        # Token matches: <[id]> is that token whole, whatever its text; !<[id]> any token but it.
        status, detok = srv.request("POST", "/detokenize", {"tokens": [300]})
        piece = detok.get("content", "") if status == 200 else None
        status, reply = srv.request("POST", "/completion", {"prompt": "Q:", "n_predict": 20, "temperature": 0,
                                                             "grammar": 'root ::= <[300]> "x" !<[300]> "."',
                                                             "n_probs": 0})
        content = reply.get("content", "") if status == 200 else ""
        checks.check(status == 200 and piece is not None and content.startswith(piece + "x") and
                     content.endswith(".") and reply.get("finish_reason") == "stop",
                     f"{arch}: a token match gives that token ({piece!r}, {content!r})")
        status, reply = srv.request("POST", "/completion", {"prompt": "x", "grammar": "root ::= <no-such-token>"})
        checks.check(status == 400 and "no token of the vocabulary has exactly this text" in
                     reply.get("error", {}).get("message", ""), f"{arch}: an unknown token's text: 400 ({reply})")

        # Refusals, each a 400 whose message says what, and the server serves on.
        for bad, words in (("root ::= x", "rule 'x' is used (line 1) but not defined"),
                           ("root ::= \"a\n", "line 1, column 12: unterminated string literal"),
                           ("root ::= root \"a\" | \"b\"", "left-recursive"),
                           ("item ::= \"a\"", "no 'root' rule"),
                           ("root ::= <[99999999]>", "token id beyond the vocabulary"),
                           ("root ::= \"a\"{3,1}", "maximum below its minimum")):
            status, reply = srv.request("POST", "/completion", {"prompt": "x", "grammar": bad})
            message = reply.get("error", {}).get("message", "") if isinstance(reply, dict) else ""
            checks.check(status == 400 and words in message and "'grammar'" in message,
                         f"{arch}: grammar {bad!r}: 400 naming it ({status} {message!r})")
        for extra, what in (({"response_format": {"type": "json_object"}}, "JSON mode"),
                            ({"json_schema": {"type": "object"}}, "a json_schema"),
                            ({"grammar": 5}, "a number")):
            body = dict({"messages": [{"role": "user", "content": "x"}], "grammar": 'root ::= "a"'}, **extra)
            status, reply = srv.request("POST", "/v1/chat/completions", body)
            checks.check(status == 400, f"{arch}: a grammar with {what}: 400 ({status} {str(reply)[:160]})")
        status, reply = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 4})
        checks.check(status == 200, f"{arch}: serving after the refusals ({status})")

harness.expect_error(checks, ["run", "-m", os.path.join(tmp, "llama.gguf"), "-p", "x", "-n", 8, "--grammar",
                              "root ::= (\"a\""], "--grammar: grammar: line 1, column 14: expected ')'",
                     "run --grammar with a malformed grammar")
harness.expect_error(checks, ["run", "-m", os.path.join(tmp, "llama.gguf"), "-p", "x", "-n", 8, "--grammar",
                              "root ::= \"a\"", "--json"], "excludes", "run --grammar with --json")
checks.finish()
