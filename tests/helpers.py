"""What several test areas share: free ports, processes by trial marker, a small emulated space."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from search.errors import BadInput
from search.hosts.base import MARKER_ENV
from search.storage import load

PHASES = ("starting", "loading", "kv_cache", "autotune", "cuda_graph", "warmup")


def ctrl_c_reaches() -> None:
    """``preexec_fn`` of a driver a test will Ctrl-C: a suite started in the background by a
    non-interactive shell (``bash .ci/run &``) inherits SIGINT ignored, and Python keeps it so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def toy_landscape(factor: str = '0.3 if flags["moe_runner_backend"] == "cutlass" else 1.0') -> str:
    """A landscape file's text: triton crashes at autotune; throughput is ``factor`` x 200 x sqrt(running).

    The default factor runs cutlass at 30% (under the target at the first level, so a study prunes
    it mid-ladder).
    """
    return f'''
def startup(flags, env):
    if flags["moe_runner_backend"] == "triton":
        return {{"phase": "autotune", "error": "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1."}}
    return None

def throughput(flags, env, running):
    return ({factor}) * 200.0 * running ** 0.5

def phase_seconds(flags, env):
    return {{"starting": 20, "loading": 60, "kv_cache": 20, "autotune": 40, "cuda_graph": 20, "warmup": 10}}
'''


TOY_LANDSCAPE = toy_landscape()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def marker_processes(prefix: str) -> dict[int, str]:
    """Live processes whose trial marker starts with ``prefix``: pid -> marker (zombies excluded)."""
    needle = f"{MARKER_ENV}={prefix}".encode()
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        markers = [item[len(MARKER_ENV) + 1:].decode() for item in env if item.startswith(needle)]
        if markers and state not in ("Z", "X"):
            found[int(entry.name)] = markers[0]
    return found


def parent(pid: int) -> int:
    """A process's parent pid, from /proc (OSError once it is gone)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def marker_pids(marker: str) -> list[int]:
    """Live processes carrying exactly this trial marker (what a driver must never leave behind)."""
    return [pid for pid, found in marker_processes(marker).items() if found == marker]


def study_so_far(study: str, storage: str = "sqlite:///studies.db") -> optuna.Study | None:
    """The study a driver is running, read as `search study show` reads it; None before the driver
    has created it (the product's opener, so a read while the driver creates the tables is retried
    as a user's would be)."""
    try:
        return load(study, storage)
    except BadInput:
        return None


def running_server(study: str, storage: str = "sqlite:///studies.db", timeout: float = 60.0) -> tuple[int, str]:
    """Wait until the study's driver has a server up (a live process carrying the trial marker):
    its trial number and marker."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        opened = study_so_far(study, storage)
        trials = opened.get_trials(states=(TrialState.RUNNING,)) if opened else []
        for t in trials:
            marker = t.user_attrs.get("marker")
            if marker and marker_pids(marker):
                return t.number, marker
        time.sleep(0.1)
    raise AssertionError("no trial server came up")


def write_space(root: Path, *, time_scale: str = "0.004", landscape: str = TOY_LANDSCAPE,
                params: dict[str, Any] | None = None, baseline: dict[str, Any] | None = None,
                private_state: bool = True, timeout_s: float = 30, **sections: Any) -> Path:
    """A small space on a free port for the emulator; its landscape (and state, if private) under ``root``.

    ``sections`` replace top-level keys (``load_test``, ``slos``, ``targets``...).
    """
    (root / "landscape.py").write_text(landscape)
    env = {"SEARCH_EMULATOR_TIME_SCALE": time_scale, "SEARCH_EMULATOR_LANDSCAPE": str(root / "landscape.py"),
           "SEARCH_EMULATOR_GPUS": "1"}
    if private_state:
        env["SEARCH_EMULATOR_STATE_DIR"] = str(root / "state")
    space: dict[str, Any] = {
        "sglang_version": "0.5.23",
        "launch": {"launcher": [sys.executable, "-m", "search.emulator"], "model": "test/model", "tp": 1,
                   "host": "127.0.0.1", "port": free_port(), "env": env, "secret_env": []},
        "params": params or {
            "--max-running-requests": {"type": "categorical", "choices": [1, None]},
            "--moe-runner-backend": {"type": "categorical", "choices": ["flashinfer_cutlass", "triton", "cutlass"]},
        },
        "baseline": baseline or {"--max-running-requests": 1, "--moe-runner-backend": "flashinfer_cutlass"},
        "load_test": {"input_len": 32, "output_len": 32, "concurrency": [4, 16], "duration_s": 1.0, "warmup_s": 0.2},
        # Cap 1 serves 200 tok/s while decoding and uncapped cutlass 120: the target lies between. Levels
        # span whole request cycles, so outputs are long enough that turnover barely dents the baseline.
        "targets": {4: 150},
        "timeouts": {phase: timeout_s for phase in PHASES},
        **sections,
    }
    path = root / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


class AtOnce:
    """Counts the most trials a study ran at once, from its listener's placed / trial_done calls."""

    def __init__(self) -> None:
        self.running: set[int] = set()
        self.most = 0

    def placed(self, number: int, host: str) -> None:
        self.running.add(number)
        self.most = max(self.most, len(self.running))

    def done(self, trial: Any) -> None:
        self.running.discard(trial.number)
