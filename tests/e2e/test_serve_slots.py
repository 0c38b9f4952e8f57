"""`sparrow serve`'s slots (llama.cpp's API): GET /slots, `id_slot` on the generation endpoints, and
POST /slots/{id}?action=save|restore|erase with --slot-save-path. A slot saved after a completion, erased, and
restored into the other slot serves the same prompt again from its cache (one token evaluated) with the same
text; file names that could leave the folder, missing and damaged files are refused and the server keeps
serving."""
import os

import harness
import serve_util

checks = harness.Checks()
tmp = harness.temp_dir()
llama = serve_util.make_model("llama", os.path.join(tmp, "llama.gguf"))
slot_dir = os.path.join(tmp, "slots")
os.makedirs(slot_dir)
PROMPT = "Once upon a time there was a"
N = 8


def slot(srv, i):
    status, body = srv.request("GET", "/slots")
    checks.check(status == 200 and isinstance(body, list) and len(body) == 2, f"GET /slots: {status} {body}")
    return body[i]


with serve_util.Server(llama, "-np", 2, "-c", 512, "--slot-save-path", slot_dir) as srv:
    s0 = slot(srv, 0)
    checks.check(s0.get("id") == 0 and s0.get("n_ctx") == 256 and s0.get("is_processing") is False
                 and s0.get("n_past") == 0, f"an idle, empty slot: {s0}")
    status, _ = srv.request("GET", "/slots?fail_on_no_slot=1")
    checks.check(status == 200, f"fail_on_no_slot with idle slots: {status}")

    req = {"prompt": PROMPT, "n_predict": N, "temperature": 0}
    status, first = srv.request("POST", "/completion", dict(req, id_slot=1))
    checks.check(status == 200 and first.get("id_slot") == 1, f"id_slot 1 runs in slot 1: {status} {first}")
    held = slot(srv, 1)["n_past"]
    checks.check(held == first["tokens_evaluated"] + first["tokens_predicted"] - 1,
                 f"slot 1 holds the prompt and all but the last sampled token: {held} {first}")

    status, saved = srv.request("POST", "/slots/1?action=save", {"filename": "story.bin"})
    size = os.path.getsize(os.path.join(slot_dir, "story.bin")) if status == 200 else -1
    checks.check(status == 200 and saved.get("id_slot") == 1 and saved.get("filename") == "story.bin"
                 and saved.get("n_saved") == held and saved.get("n_written") == size
                 and "save_ms" in saved.get("timings", {}), f"save: {status} {saved} (file {size} bytes)")
    status, erased = srv.request("POST", "/slots/1?action=erase")
    checks.check(status == 200 and erased == {"id_slot": 1, "n_erased": held}, f"erase: {status} {erased}")
    checks.check(slot(srv, 1)["n_past"] == 0, "an erased slot holds nothing")

    status, restored = srv.request("POST", "/slots/0?action=restore", {"filename": "story.bin"})
    checks.check(status == 200 and restored.get("id_slot") == 0 and restored.get("n_restored") == held
                 and restored.get("n_read") == size, f"restore into slot 0: {status} {restored}")
    checks.check(slot(srv, 0)["n_past"] == held, "slot 0 holds the restored tokens")
    status, again = srv.request("POST", "/completion", req)
    checks.check(status == 200 and again.get("id_slot") == 0
                 and again["tokens_cached"] == first["tokens_evaluated"] - 1
                 and again["content"] == first["content"],
                 f"the same prompt reuses the restored cache (one token read) and says the same: {again}")

    # Refusals: each a 4xx in the error shape, and the server goes on.
    with open(os.path.join(slot_dir, "junk.bin"), "wb") as f:
        f.write(b"not a state file")
    cases = [
        ("a name with a path", "/slots/0?action=save", {"filename": "../story.bin"}, 400),
        ("a name in a folder", "/slots/0?action=save", {"filename": "a/b.bin"}, 400),
        ("an empty name", "/slots/0?action=save", {"filename": ""}, 400),
        ("the name ..", "/slots/0?action=restore", {"filename": ".."}, 400),
        ("no name", "/slots/0?action=save", {}, 400),
        ("a name of 300 bytes", "/slots/0?action=save", {"filename": "a" * 300}, 400),
        ("a name with a newline", "/slots/0?action=save", {"filename": "a\nb"}, 400),
        ("a missing file", "/slots/0?action=restore", {"filename": "nothing.bin"}, 404),
        ("a file that is no state", "/slots/0?action=restore", {"filename": "junk.bin"}, 400),
        ("a folder as the file", "/slots/0?action=restore", {"filename": "."}, 400),
        ("no such slot", "/slots/2?action=erase", None, 404),
        ("a slot that is no number", "/slots/x?action=erase", None, 404),
        ("an unknown action", "/slots/0?action=drop", None, 400),
        ("no action", "/slots/0", None, 400),
    ]
    for what, path, body, want in cases:
        status, reply = srv.request("POST", path, body)
        err = reply.get("error") if isinstance(reply, dict) else None
        checks.check(status == want and isinstance(err, dict) and isinstance(err.get("message"), str),
                     f"{what}: {status} (want {want}) {reply}")
        checks.check(srv.alive(), f"the server survived: {what}")
    status, reply = srv.request("POST", "/slots/0?action=restore", {"filename": "junk.bin"})
    checks.check("junk.bin" in reply["error"]["message"] and slot_dir not in reply["error"]["message"],
                 f"errors name the file as the client did, not the server's folder: {reply}")
    checks.check(slot(srv, 0)["n_past"] == held, "a refused restore leaves the slot as it was")
    for what, extra in [("id_slot 2 of 2", {"id_slot": 2}), ("id_slot -2", {"id_slot": -2}),
                        ("id_slot a string", {"id_slot": "0"})]:
        status, reply = srv.request("POST", "/completion", dict(req, **extra))
        checks.check(status == 400, f"{what}: {status} {reply}")
    status, reply = srv.request("POST", "/v1/completions",
                                {"prompt": PROMPT, "max_tokens": 2, "n": 2, "id_slot": 0})
    checks.check(status == 400, f"id_slot with n 2: {status} {reply}")
    status, body = srv.request("POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "id_slot": 1})
    checks.check(status == 200, f"id_slot on /v1/completions: {status} {body}")

# Without --slot-save-path, save and restore are off (501); erase still works.
with serve_util.Server(llama, "-np", 1, "-c", 256) as srv:
    status, reply = srv.request("POST", "/slots/0?action=save", {"filename": "a.bin"})
    checks.check(status == 501 and reply["error"]["type"] == "not_supported_error", f"save is off: {status} {reply}")
    status, reply = srv.request("POST", "/slots/0?action=erase")
    checks.check(status == 200 and reply.get("n_erased") == 0, f"erase without a folder: {status} {reply}")

checks.finish()
