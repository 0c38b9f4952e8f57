"""`sparrow run --conversation` and the prompt options of `run` (-f, -n -1, --verbose-prompt).

A conversation turn renders every message so far in the chat format and decodes only what its cache does not
already hold. Checked here, greedy, on tiny synthetic models:
- each turn's reply equals a fresh `run --prompt-ids` of that turn's whole rendering (so reusing the cached
  prefix changes nothing), on deepseek32 with the selection active (top-k 4);
- each turn's reply equals what `serve` answers on /v1/chat/completions for the same messages, for the
  DeepSeek-V3.2 and GLM templates (recognised from the GGUF) and with a system prompt, over three turns
  whose replies are valid UTF-8 (a reply's invalid bytes cannot travel back to the server in JSON);
- a long chat in a small context drops its oldest exchanges and its replies still equal fresh runs; a
  message too long even alone is refused with a notice and the conversation goes on; bad flag combinations
  are refused."""
import os
import subprocess

import harness
import serve_util
from gguf import GGUFValueType

checks = harness.Checks()
tmp = harness.temp_dir()
N = 8
LINES = ["Hello there", "Tell me more", "And then?"]


def converse(model, lines, *extra, n=N):
    """Runs a greedy conversation; returns (stdout, stderr, returncode)."""
    args = [harness.BIN, "run", "-m", model, "--conversation", "-n", n, "--temp", 0, "-t", 2] + list(extra)
    proc = subprocess.run([str(a) for a in args], input=("\n".join(lines) + "\n").encode(), capture_output=True,
                          timeout=600)
    # decoded by hand: text mode would turn a reply's "\r" into "\n"
    return proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"), proc.returncode


def turn_ids(stderr):
    return [[int(t) for t in line.split(":", 1)[1].split()] for line in stderr.splitlines()
            if line.startswith("prompt ids (")]


def run_bytes(args, stdin=None):
    proc = subprocess.run([str(a) for a in [harness.BIN] + args], input=stdin, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-400:]
    return proc.stdout, proc.stderr.decode(errors="replace")


def fresh_reply(model, ids, *extra):
    """The reply `run --prompt-ids` generates over a whole rendering, as bytes: its output minus what it prints
    for the prompt alone (-n 0)."""
    path = os.path.join(tmp, "ids.txt")
    harness.write_ids(path, ids)
    base = ["run", "-m", model, "--prompt-ids", path, "--temp", 0, "-t", 2] + list(extra)
    full, err = run_bytes(base + ["-n", N, "--verbose-prompt"])
    assert turn_ids(err) == [ids], f"run --verbose-prompt shows the ids it was given: {turn_ids(err)} vs {ids}"
    prompt_only, _ = run_bytes(base + ["-n", 0])
    assert full.startswith(prompt_only[:-1]), (full, prompt_only)
    return full[len(prompt_only) - 1:]  # the reply and the final newline


CANDIDATES = [f"{a} {b}" for a in ("Hello", "Tell me", "What about", "Why", "Sing", "Once", "And then")
              for b in ("there", "more", "the bird", "a song", "the river", "one day")]


def server_conversation(srv, system, n_turns):
    """A conversation of n_turns whose greedy replies are valid UTF-8 (a reply's invalid bytes could not travel
    back to the server in JSON): each turn takes the first candidate message whose reply is. Returns the user
    messages chosen and the replies."""
    messages = [{"role": "system", "content": system}] if system else []
    lines, replies = [], []
    for _ in range(n_turns):
        for line in CANDIDATES:
            trial = messages + [{"role": "user", "content": line}]
            status, body = srv.request("POST", "/v1/chat/completions",
                                       {"messages": trial, "max_tokens": N, "temperature": 0})
            assert status == 200, body
            reply = body["choices"][0]["message"]["content"]
            if "\ufffd" not in reply:
                messages = trial + [{"role": "assistant", "content": reply}]
                lines.append(line)
                replies.append(reply)
                break
    return lines, replies


def compare_with_server(model, name, *extra, system=None):
    # The whole reply in content, as `run` prints it (a thinking format would otherwise split off its reasoning).
    with serve_util.Server(model, "-np", 1, "-c", 1024, "--reasoning-format", "none", *extra) as srv:
        lines, want = server_conversation(srv, system, 3)
    checks.check(len(lines) == 3, f"{name}: the server found three turns with valid UTF-8 replies: {lines}")
    sys_args = ["--system-prompt", system] if system else []
    out, err, rc = converse(model, lines, *(list(extra) + sys_args))
    checks.check(rc == 0 and out == "".join(r + "\n" for r in want),
                 f"{name}: the conversation's replies equal serve's chat replies ({rc}): {out!r} vs {want!r}")
    return out, err


# --- prefix reuse: each turn equals a fresh run of its whole rendering (deepseek32, selection active) ----------
ds = serve_util.make_model("deepseek32", os.path.join(tmp, "ds.gguf"))
conv_args = ["run", "-m", ds, "--conversation", "-n", N, "--temp", 0, "-t", 2, "--dsa-top-k", 4, "--chat-format",
             "llama2", "--verbose-prompt"]
out, err = run_bytes(conv_args, stdin=("\n".join(LINES) + "\n").encode())
checks.check("conversation: chat format llama2" in err, f"deepseek32 conversation ran: {err[-300:]}")
turns = turn_ids(err)
checks.check(len(turns) == len(LINES) and all(b[:len(a)] == a for a, b in zip(turns, turns[1:])),
             f"one rendering per turn, each extending the previous: {[len(t) for t in turns]}")
decoded = int(err.split("prompt: ")[-1].split()[0])
checks.check(decoded < sum(len(t) for t in turns) - len(turns[0]),
             f"later turns decode only what the cache lacks: {decoded} tokens of {[len(t) for t in turns]}")
fresh = b"".join(fresh_reply(ds, ids, "--dsa-top-k", 4) for ids in turns)
checks.check(out == fresh, f"each reply equals a fresh run over its turn's whole rendering: {out!r} vs {fresh!r}")
checks.check(max(len(t) for t in turns) > 4 + N, "the last turns' contexts exceed top-k 4: the selection is active")

# --- the chat formats, against the server's chat endpoint -----------------------------------------------------
def with_template(src, template_name, dst):
    template = harness.shared_data("templates", template_name)
    if not template:
        return None
    with open(template) as f:
        text = f.read()
    harness.rewrite_gguf(src, dst, metadata_edit=lambda md: md.__setitem__(
        "tokenizer.chat_template", (GGUFValueType.STRING, text)))
    return dst


ds_tmpl = with_template(ds, "deepseek-ai-DeepSeek-V3.2.jinja", os.path.join(tmp, "ds-template.gguf"))
if ds_tmpl:
    out, err = compare_with_server(ds_tmpl, "deepseek3", "--dsa-top-k", 4, system="Be brief.")
    checks.check("chat format deepseek3" in err, "the DeepSeek-V3.2 template is recognised by run")
glm = serve_util.make_model("glm-dsa", os.path.join(tmp, "glm.gguf"))
glm_tmpl = with_template(glm, "GLM-4.7-Flash.jinja", os.path.join(tmp, "glm-template.gguf"))
if glm_tmpl:
    out, err = compare_with_server(glm_tmpl, "glm", "--dsa-top-k", 4)
    checks.check("chat format glm" in err, "the GLM template is recognised by run")

# --- limits -------------------------------------------------------------------------------------------------
# A message too long for the context even alone is refused; the next one is answered.
out, err, rc = converse(ds, ["word " * 400, "Hello there"], "--chat-format", "llama2", "-c", 128)
checks.check(rc == 0 and "it was not sent" in err and "turns: 1" in err and out.count("\n") == 1,
             f"an over-long message is refused and the conversation goes on ({rc}): {err[-300:]}")
# A long chat in a small context: the oldest exchanges are dropped, every message is answered, and each reply
# still equals a fresh run over its turn's (shortened) rendering.
many = [f"{a} {b}" for a, b in zip(["Hello", "Tell me", "Why", "Sing", "Once", "And then"],
                                     ["there", "more", "the bird", "a song", "the river", "one day"])]
small = ["--chat-format", "llama2", "-c", 96, "--dsa-top-k", 4]
out, err = run_bytes(["run", "-m", ds, "--conversation", "-n", N, "--temp", 0, "-t", 2, "--verbose-prompt"] + small,
                     stdin=("\n".join(many) + "\n").encode())
turns = turn_ids(err)
checks.check(f"turns: {len(many)}" in err and "oldest exchange" in err and all(len(t) + N <= 96 for t in turns),
             f"a long chat drops its oldest exchanges and answers every message: {[len(t) for t in turns]}")
fresh = b"".join(fresh_reply(ds, ids, "--dsa-top-k", 4) for ids in turns)
checks.check(out == fresh, "after dropped exchanges each reply still equals a fresh run over its rendering")
# Unbounded replies keep a quarter of the context free; a reply that fills it is cut and the chat goes on.
out, err, rc = converse(ds, ["Hello there", "Tell me more"], "--chat-format", "llama2", "-c", 48, n=-1)
checks.check(rc == 0 and "turns: 2" in err, f"-n -1 in a small context: both messages answered ({rc}): {err[-300:]}")

# --- run's prompt options -------------------------------------------------------------------------------------
prompt_path = os.path.join(tmp, "prompt.txt")
with open(prompt_path, "w") as f:
    f.write("Once upon a time")
from_file = harness.run(["run", "-m", ds, "-f", prompt_path, "-n", N, "--temp", 0]).stdout
from_flag = harness.run(["run", "-m", ds, "-p", "Once upon a time", "-n", N, "--temp", 0]).stdout
checks.check(from_file == from_flag and from_file.startswith("Once upon a time"), "-f reads the prompt as -p gives it")
proc = harness.run(["run", "-m", ds, "-p", "Once upon a time", "-n", -1, "--temp", 0, "-c", 40])
checks.check("stopped at the end of the context (40 tokens)" in proc.stderr or "generation:" in proc.stderr,
             f"-n -1 generates until EOS or the end of the context: {proc.stderr[-300:]}")
n_gen = int(proc.stderr.split("generation: ")[1].split()[0])
checks.check(0 < n_gen <= 40, f"-n -1 stays within the context: {n_gen} tokens")
for args, needle in [
    (["--system-prompt", "x", "-p", "hi"], "--system-prompt requires --conversation"),
    (["--chat-format", "glm", "-p", "hi"], "--chat-format requires --conversation"),
    (["--conversation", "--prompt-ids", prompt_path], "excludes"),
    (["--conversation", "--dump-logits", os.path.join(tmp, "x.npy")], "excludes"),
    (["-p", "hi", "-f", prompt_path], "excludes"),
    (["-p", "hi", "-n", -2], "-2"),
    (["--conversation", "--chat-format", "chatml"], "chatml"),
    ([], "give a prompt"),
]:
    harness.expect_error(checks, ["run", "-m", ds] + args, needle, f"run {' '.join(map(str, args))}")

checks.finish()
