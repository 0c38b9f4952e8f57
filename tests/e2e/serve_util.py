"""Helpers for the `sparrow serve` end-to-end tests: start a server on a free loopback port, make plain and
streaming requests with the standard library, read /metrics."""
import http.client
import json
import os
import re
import subprocess
import threading
import time

import harness


# Under sanitizers everything is slower: the tests scale their work down (also with SPARROW_SERVE_LIGHT=1).
LIGHT = os.environ.get("SPARROW_SERVE_LIGHT", "") not in ("", "0") or harness.sanitized()


class Server:
    """A `sparrow serve` process; use as a context manager. Its stderr is kept in a file for failures."""

    def __init__(self, model, *args, timeout=120):
        self.log_path = os.path.join(harness.temp_dir(), "serve.log")
        self.log = open(self.log_path, "w+")
        cmd = [harness.BIN, "serve", "-m", model, "--port", "0"] + [str(a) for a in args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.host, self.port = None, None
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sparrow serve exited ({self.proc.returncode}):\n{self.stderr()}")
            # http://127.0.0.1:PORT, or http://[::1]:PORT for an IPv6 address
            m = re.search(r"listening on http://(\[[^\]]+\]|[^:/]+):(\d+)", self.stderr())
            if m:
                self.host = m.group(1).strip("[]")
                self.port = int(m.group(2))
                break
            time.sleep(0.05)
        if self.port is None:
            self.close()
            raise AssertionError("sparrow serve did not start:\n" + self.stderr())
        while time.time() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.close()
        raise AssertionError("/health never answered:\n" + self.stderr())

    def stderr(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        """Stops the server with SIGTERM (a clean shutdown, so sanitizers can report); returns its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            if self.proc.returncode != 0:
                print(f"sparrow serve exited with {self.proc.returncode}; its log ends:\n{self.stderr()[-3000:]}")
            self.log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def connection(self, timeout=300):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, raw=None, timeout=300):
        """Returns (status, parsed JSON or text). `raw` sends bytes verbatim as the body."""
        conn = self.connection(timeout)
        try:
            hdrs = dict(headers or {})
            data = raw
            if body is not None:
                data = json.dumps(body).encode()
                hdrs.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", errors="replace")
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text
        finally:
            conn.close()

    def stream(self, path, body, headers=None, on_event=None, timeout=300):
        """POSTs with stream: true; returns (status, [parsed events], saw_done). on_event(i, event) may return
        False to hang up early."""
        conn = self.connection(timeout)
        events, done = [], False
        try:
            hdrs = {"Content-Type": "application/json"}
            hdrs.update(headers or {})
            conn.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(), headers=hdrs)
            resp = conn.getresponse()
            if resp.status != 200:
                return resp.status, [json.loads(resp.read().decode())], False
            while True:
                line = resp.fp.readline()
                if not line:
                    break
                line = line.decode("utf-8", errors="replace").rstrip("\r\n")
                if not line.startswith("data: "):
                    continue  # blank separators and ": keep-alive" comments
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    done = True
                    break
                events.append(json.loads(payload))
                if on_event and on_event(len(events) - 1, events[-1]) is False:
                    break
            return resp.status, events, done
        finally:
            conn.close()

    def metrics(self):
        """/metrics as {name or name{labels}: value}."""
        status, text = self.request("GET", "/metrics")
        assert status == 200, text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
        return out


def make_model(arch, path, *extra):
    if not os.path.exists(path):
        harness.run(["make-model", "--arch", arch, "-o", path] + list(extra))
    return path


def norm(text):
    """Text with each run of U+FFFD collapsed to one: random tiny models emit invalid UTF-8, which the server's
    JSON and Python's decoder both replace, not necessarily with the same number of U+FFFD."""
    return re.sub("\ufffd+", "\ufffd", text)


def run_greedy(model, prompt, n, *extra):
    """What `sparrow run --temp 0` generates after the prompt (it prints the prompt, the text, a newline), read as
    bytes: text mode would turn a generated carriage return into a newline."""
    args = ["run", "-m", model, "-p", prompt, "-n", n, "--temp", "0"] + list(extra)
    proc = subprocess.run([harness.BIN] + [str(a) for a in args], capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    out = proc.stdout.decode("utf-8", errors="replace")
    assert out.startswith(prompt) and out.endswith("\n"), repr(out[:200])
    return norm(out[len(prompt):-1])


def parallel(fn, args_list):
    """Runs fn(*args) in one thread each; returns the results (exceptions re-raised)."""
    results = [None] * len(args_list)
    errors = []

    def work(i, args):
        try:
            results[i] = fn(*args)
        except Exception as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, a)) for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
