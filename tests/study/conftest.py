"""Whole studies on the real emulator: a tiny space and landscape where every outcome shows.

Landscape: the request cap (1 vs SGLang's automatic) decides throughput, ``triton`` crashes at
autotune, ``cutlass`` runs at 30% (below the target at the first level). From the baseline
(cap 1, flashinfer_cutlass) the strategy's sweep tries the cap first (a clear win), then the
backends: four trials show a win, a crash at its phase and a prune after the first level.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import yaml

from search.hosts.base import MARKER_ENV

LANDSCAPE = '''
def startup(flags, env):
    if flags["moe_runner_backend"] == "triton":
        return {"phase": "autotune", "error": "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1."}
    return None

def throughput(flags, env, running):
    factor = 0.3 if flags["moe_runner_backend"] == "cutlass" else 1.0
    return factor * 200.0 * running ** 0.5

def phase_seconds(flags, env):
    return {"starting": 20, "loading": 60, "kv_cache": 20, "autotune": 40, "cuda_graph": 20, "warmup": 10}
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_space(root: Path, time_scale: str = "0.004") -> Path:
    """A space on a free port whose emulator state, landscape and artifacts all live under ``root``."""
    landscape = root / "landscape.py"
    landscape.write_text(LANDSCAPE)
    space = {
        "sglang_version": "0.5.23",
        "launch": {
            "launcher": [sys.executable, "-m", "search.emulator"],
            "model": "test/model", "tp": 1, "host": "127.0.0.1", "port": free_port(),
            "env": {"SEARCH_EMULATOR_TIME_SCALE": time_scale, "SEARCH_EMULATOR_STATE_DIR": str(root / "state"),
                    "SEARCH_EMULATOR_LANDSCAPE": str(landscape), "SEARCH_EMULATOR_GPUS": "1"},
            "secret_env": [],
        },
        "params": {
            "--max-running-requests": {"type": "categorical", "choices": [1, None]},
            "--moe-runner-backend": {"type": "categorical", "choices": ["flashinfer_cutlass", "triton", "cutlass"]},
        },
        "baseline": {"--max-running-requests": 1, "--moe-runner-backend": "flashinfer_cutlass"},
        "load_test": {"input_len": 32, "output_len": 8, "concurrency": [4, 16], "duration_s": 1.0, "warmup_s": 0.2},
        "targets": {4: 150},
        "timeouts": {phase: 30 for phase in ("starting", "loading", "kv_cache", "autotune", "cuda_graph", "warmup")},
    }
    path = root / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def marker_pids(marker: str) -> list[int]:
    """Live processes carrying the trial marker (what the driver must never leave behind)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if needle in Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0"):
                state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """cwd = tmp_path (studies.db, trials/, profiles/ land here); the emulator state is private."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEARCH_EMULATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path
