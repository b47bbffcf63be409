"""Start the real emulator as a subprocess on a free port with its own state directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import free_port

TUNED = ["--model-path", "m", "--tp", "8", "--moe-runner-backend", "flashinfer_cutlass", "--disable-cuda-graph",
         "--mem-fraction-static", "0.92"]
# A landscape for tests that need neither the seed's model nor its failures: the startup outcome is
# the JSON in EMULATOR_TEST_OUTCOME (unset: it starts); at time scale 0.01 loading takes 1.66 s,
# 0.02 s a shard, and the capture of batch sizes 1, 2, 4, 8 (the cap) 0.04 s.
SMALL_LANDSCAPE = """
import json

def startup(flags, env):
    outcome = env.get("EMULATOR_TEST_OUTCOME")
    return json.loads(outcome) if outcome else None

def throughput(flags, env, running):
    return 400.0 * running

def max_running_requests(flags, env):
    return 8

def phase_seconds(flags, env):
    return {"starting": 5, "loading": 166, "kv_cache": 5, "autotune": 0, "cuda_graph": 4, "warmup": 5}
"""


@pytest.fixture
def small_landscape(tmp_path: Path) -> dict[str, str]:
    """The environment that runs SMALL_LANDSCAPE at time scale 0.01."""
    path = tmp_path / "small_landscape.py"
    path.write_text(SMALL_LANDSCAPE)
    return {"SEARCH_EMULATOR_LANDSCAPE": str(path), "SEARCH_EMULATOR_TIME_SCALE": "0.01"}



class Server:
    def __init__(self, state: Path, log: Path, args: list[str], env: dict[str, str]) -> None:
        if "--port" not in args:  # a test that names the port (a taken one) keeps it
            args = [*args, "--port", str(free_port())]
        self.port = int(args[args.index("--port") + 1])
        self.log_path = log
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SEARCH_EMULATOR_TIME_SCALE": "0.002", "SEARCH_EMULATOR_STATE_DIR": str(state),
                    **env}
        self.state = Path(self.env["SEARCH_EMULATOR_STATE_DIR"])
        self._log = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "search.emulator", *args],
                                     env=self.env, stdout=self._log, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, needle: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not in log:\n{self.text()[-3000:]}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_for("The server is fired up and ready to roll!", timeout)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    """Each server gets its own GPU state dir unless SEARCH_EMULATOR_STATE_DIR is passed (shared GPUs)."""
    servers: list[Server] = []

    def _start(args: list[str] | None = None, **env: str) -> Server:
        n = len(servers)
        server = Server(tmp_path / f"state{n}", tmp_path / f"server{n}.log", TUNED if args is None else args, env)
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.stop()
    # Ranks left behind by a test (orphans) hold GPU locks: end them by the pids they published.
    for path in tmp_path.glob("state*/gpu*.json"):
        pid = int(json.loads(path.read_text())["pid"])
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def client(server: Server) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30)
