"""Shared helpers for the end-to-end tests: locate the binary, the references and ../shared/data, run
sparrow, compare arrays. Tests exit 0 on success, 1 on failure, 77 when skipped."""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.environ.get("SPARROW_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("SPARROW_BIN", os.path.join(REPO, "build", "sparrow"))
SHARED_DATA = os.environ.get("SPARROW_SHARED_DATA", os.path.normpath(os.path.join(REPO, "..", "shared", "data")))
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))

SKIP = 77


def shared_data(*parts):
    """Path inside ../shared/data, or None when that folder is absent."""
    path = os.path.join(SHARED_DATA, *parts)
    return path if os.path.exists(path) else None


def run(args, check=True, timeout=600):
    """Runs sparrow with args; returns the CompletedProcess (text mode)."""
    proc = subprocess.run([BIN] + [str(a) for a in args], capture_output=True, text=True, errors="replace", timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"sparrow {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def sanitized():
    """True when the binary was built with AddressSanitizer."""
    try:
        with open(BIN, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


def temp_dir():
    """A fresh directory, removed when the test's process exits (SPARROW_KEEP_TEMP=1 keeps it, for a look at
    what a failing test wrote): the suite makes ~500 of them a run, and models of up to 850 MiB."""
    path = tempfile.mkdtemp(prefix="sparrow-e2e-")
    if not os.environ.get("SPARROW_KEEP_TEMP"):
        atexit.register(shutil.rmtree, path, True)
    return path


def rel_error(a, b):
    """||a - b|| / ||b|| over the whole array."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def log_softmax(logits):
    """log of the softmax of a vector, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def kl(p_log, q_log):
    """KL(P || Q) of two log-probability vectors."""
    return float(np.sum(np.exp(p_log) * (p_log - q_log)))


# A small vocabulary of plain words: perplexity tests write texts of random picks from it.
TEXT_WORDS = ["the", "little", "bird", "sang", "a", "song", "and", "flew", "over", "house", "girl", "smiled", "one",
              "day", "tree", "river", "found", "big", "red", "ball"]


def write_word_text(path, rng, n_words):
    """Writes n_words random picks of TEXT_WORDS (drawn from the numpy Generator rng), space-separated."""
    with open(path, "w") as f:
        f.write(" ".join(rng.choice(TEXT_WORDS, size=n_words)))


def write_ids(path, ids):
    with open(path, "w") as f:
        f.write(" ".join(str(int(i)) for i in ids))


def expect_error(checks, args, needle, what):
    """sparrow must fail cleanly (non-zero exit, no crash) with `needle` in its error message."""
    proc = run(args, check=False)
    crashed = proc.returncode < 0 or proc.returncode >= 128
    ok = proc.returncode != 0 and not crashed and needle.lower() in proc.stderr.lower()
    checks.check(ok, f"{what}: exit {proc.returncode}, stderr mentions {needle!r}"
                 + ("" if ok else f" (stderr: {proc.stderr.strip()[:300]!r})"))


def rewrite_gguf(src, dst, metadata_edit=None, tensor_edit=None):
    """Copies a GGUF through the reference reader/writer, letting the caller edit metadata and tensors
    (dicts of name -> (type, value)) on the way."""
    from gguf import GGUFReader, write_gguf
    r = GGUFReader(src)
    md = {k: (r.metadata_types[k], v) for k, v in r.metadata.items()}
    tensors = {name: (t.ggml_type, r.tensor(name)) for name, t in r.tensors.items()}
    if metadata_edit:
        metadata_edit(md)
    if tensor_edit:
        tensor_edit(tensors)
    write_gguf(dst, md, tensors)


class Checks:
    """Collects failures so that one run reports all of them."""

    def __init__(self):
        self.failures = []
        self.passed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
            print(f"ok: {what}")
        else:
            self.failures.append(what)
            print(f"FAIL: {what}")

    def finish(self):
        print(f"{self.passed} passed, {len(self.failures)} failed")
        sys.exit(1 if self.failures else 0)
