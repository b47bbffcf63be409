"""The emulator as a real subprocess on a free port with its own state directory."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from tests.helpers import free_port

SERVER_ARGS = ["--model-path", "m", "--tp", "8"]
TIME_SCALE = "0.002"


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Signal the server's process group (it leads its own session: only what we started)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float, why: Callable[[], str]) -> None:
    """Until ``url``/health answers 200; fails with ``why()`` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, why()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        time.sleep(0.1)


@contextlib.contextmanager
def clock_server(*args: str) -> Iterator[str]:
    """tests/loadtest/clock_server.py (a server of exactly known rate) with ``args``; yields its URL."""
    port = free_port()
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "tests.loadtest.clock_server", "--port", str(port), *args],
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 30, lambda: "clock server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def start_emulator(state_dir: Path, landscape: Path | None = None) -> Iterator[Server]:
    port = free_port()
    env = {**os.environ, "SEARCH_EMULATOR_TIME_SCALE": TIME_SCALE, "SEARCH_EMULATOR_STATE_DIR": str(state_dir)}
    if landscape is not None:
        env["SEARCH_EMULATOR_LANDSCAPE"] = str(landscape)
    log = (state_dir / f"server-{port}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "search.emulator", *SERVER_ARGS, "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", proc)
    try:
        wait_healthy(server.url, proc, 60, lambda: (state_dir / f"server-{port}.log").read_text()[-2000:])
        yield server
    finally:
        server.kill(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            server.kill(signal.SIGKILL)
            proc.wait()
        log.close()


@contextlib.contextmanager
def stub_server(fail_every: int = 0, usage: bool = True, silent: bool = False,
                claimed_tokens: int | None = None) -> Iterator[str]:
    """A minimal OpenAI-style server in a thread; yields its URL.

    Every ``fail_every``-th POST (0: none; 1: all) is answered 500; the others stream
    ``max_tokens`` one-token /v1/completions chunks, then the usage chunk only when ``usage``
    (a server that ignores ``stream_options``, as some OpenAI-compatible ones do), claiming
    ``claimed_tokens`` completion tokens when given. ``silent``: POSTs are read and never
    answered (a hung server). /v1/models gives a 4,096-token ``max_model_len``.
    """
    posts = itertools.count(1)
    stopped = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(200, "application/json", b'{"object":"list","data":[{"id":"stub","max_model_len":4096}]}')

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if silent:
                stopped.wait()
                return
            if fail_every and next(posts) % fail_every == 0:
                self._send(500, "application/json", b'{"object":"error","message":"stub failure","code":500}')
                return
            n = int(request["max_tokens"])
            chunk = {"object": "text_completion", "choices": [{"index": 0, "text": " a", "finish_reason": None}]}
            events = [chunk] * n + ([{"object": "text_completion", "choices": [], "usage": {
                "prompt_tokens": len(request["prompt"]), "completion_tokens": claimed_tokens or n,
                "total_tokens": len(request["prompt"]) + n}}] if usage else [])
            body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            self._send(200, "text/event-stream", body.encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stopped.set()
        server.shutdown()
        server.server_close()
