"""The emulator as a real subprocess on a free port with its own state directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, \
                (state_dir / f"server-{port}.log").read_text()[-2000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.1)
        yield server
    finally:
        server.kill(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            server.kill(signal.SIGKILL)
            proc.wait()
        log.close()
