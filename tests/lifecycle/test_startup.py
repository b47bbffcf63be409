"""start_server against real emulator processes: every landscape outcome, its events and timeline."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import httpx
import pytest

from search.errors import InfrastructureFault
from search.hosts import LocalHost
from search.hosts.emulated import EmulatedHost
from search.lifecycle import start_server
from search.logwatch import PHASES, Event

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"

# Writes a saved SGLang log (argv[2]) and then says nothing more, as a server stuck in a collective.
REPLAY_THEN_HANG = """
import sys, time
sys.stdout.write(open(sys.argv[2]).read())
sys.stdout.flush()
time.sleep(600)
"""

# SGLang's graph capture: its tqdm bar (stderr, into the same log) is redrawn with "\r" every
# argv[2] seconds and ends with "\n" only when done; then uvicorn starts and the server hangs.
SLOW_CAPTURE = """
import sys, time
from tqdm import tqdm

def log(message):
    print(f"[2026-02-20 10:00:10 TP0] {message}", flush=True)

sizes = [1, 2, 4, 8, 16, 24, 32, 40]
log("Capture cuda graph begin. This can take up to several minutes. avail mem=20.00 GB")
log(f"Capture cuda graph bs {sizes}")
bar = tqdm(list(reversed(sizes)))
for bs in bar:
    bar.set_description(f"Capturing batches (bs={bs} avail_mem=18.00 GB)")
    time.sleep(float(sys.argv[2]))
log("Capture cuda graph end. Time elapsed: 3.20 s. mem usage=2.00 GB. avail mem=18.00 GB.")
print("[2026-02-20 10:00:14] INFO:     Started server process [4242]", flush=True)
time.sleep(600)
"""


class _FirstSeen(threading.Thread):
    """Notes when ``text`` first appears in the log, looking every 10 ms: about when it was written,
    independently of the watcher under test."""

    def __init__(self, path: Path, text: str) -> None:
        super().__init__(daemon=True)
        self.path, self.text = path, text
        self.at: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if self.path.exists() and self.text in self.path.read_text(errors="replace"):
                self.at = time.time()
                return
            time.sleep(0.01)

CRASHES = [
    # outcome (crash phase), failure kind, a word of the deciding line
    ("loading", "oom", "CUDA out of memory"),
    ("kv_cache", "oom", "Not enough memory"),
    ("autotune", "autotune_error", "Ninja build failed"),
    ("cuda_graph", "unsupported", "No supported CUDA architectures"),
    ("warmup", "unsupported", "No supported CUDA architectures found for major versions [10]"),
]


def _start(make_profile, marker, tmp_path, outcome, timeouts=None, **kw):
    host, profile, events = EmulatedHost(), make_profile(outcome, **kw), []
    handle, startup = start_server(host, profile, marker=marker, log_path=tmp_path / "server.log",
                                   timeouts=timeouts or {}, on_event=events.append)
    return host, profile, handle, startup, events


def _phase_names(events: list[Event]) -> list[str]:
    return [e.name for e in events if e.kind == "phase"]


def test_clean_start_reaches_ready_with_every_phase_timed(make_profile, marker, tmp_path):
    host, profile, handle, startup, events = _start(make_profile, marker, tmp_path, "ok")
    try:
        assert startup.ok and startup.failure is None
        assert _phase_names(events) == list(PHASES)  # in order, each once
        assert list(startup.phases) == list(PHASES)
        starts = [span.start for span in startup.phases.values()]
        assert starts == sorted(starts)
        # the modelled 60 unscaled seconds of loading at TIME_SCALE 0.01 take about 0.6 s
        assert 0.2 < startup.phases["loading"].duration < 5
        assert startup.progress == 100.0
        assert any(e.kind == "progress" for e in events)
        assert httpx.get(f"{handle.url}/health").status_code == 200  # ready means /health said 200
        assert handle.returncode() is None
    finally:
        handle.stop()
    assert handle.returncode() is not None
    assert host.held(profile) == []


def test_failure_keeps_the_advice_lines_sglang_prints_after_it(make_profile, marker, tmp_path):
    """The study's strategy reads what SGLang suggests changing; the deciding line alone names no flag."""
    _, _, handle, startup, _ = _start(make_profile, marker, tmp_path, "graph_oom")
    try:
        failure = startup.failure
        assert failure is not None and failure.kind == "oom" and failure.phase == "cuda_graph"
        assert "--" not in failure.line
        assert failure.advice == ("1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
                                  "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
                                  "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
                                  "(Not recommended. Huge performance loss)")
        assert failure.to_dict()["advice"] == list(failure.advice)
    finally:
        handle.stop()


@pytest.mark.parametrize(("phase", "kind", "evidence"), CRASHES)
def test_crash_names_kind_phase_and_line(make_profile, marker, tmp_path, phase, kind, evidence):
    seen = _FirstSeen(tmp_path / "server.log", evidence)
    seen.start()
    try:
        host, profile, handle, startup, events = _start(make_profile, marker, tmp_path, phase)
    finally:
        seen.done.set()
    try:
        failure = startup.failure
        assert not startup.ok
        assert (failure.kind, failure.phase) == (kind, phase)
        assert evidence in failure.line
        assert not failure.infrastructure
        said = "out of memory" if kind == "oom" else kind if kind == "unsupported" else "crashed"
        assert failure.message.startswith(f"{said} at {phase}: ")
        assert evidence in failure.message
        # the event stream ends in the failure, after the phase it names was entered
        names = _phase_names(events)
        assert names[-1] == phase or phase not in names  # a frame may name a phase whose line never came
        assert [e for e in events if e.kind == "failure"][-1].name == kind
        assert PHASES.index(names[-1]) <= PHASES.index(phase)
        assert list(startup.phases)[-1] == names[-1]
        # detected soon after the deciding line was written, not after some long timeout
        decided = [e for e in events if e.kind == "failure"][-1]
        assert evidence in decided.line and seen.at is not None
        assert decided.time - seen.at < 5
    finally:
        handle.stop()
    assert host.held(profile) == []


def test_autotune_crash_reads_as_a_user_sees_it(make_profile, marker, tmp_path):
    _, _, handle, startup, _ = _start(make_profile, marker, tmp_path, "autotune")
    handle.stop()
    assert startup.failure.message.startswith("crashed at autotune: RuntimeError: Ninja build failed. Ninja output:")


@pytest.mark.parametrize("phase", ["loading", "kv_cache"])
def test_hang_becomes_a_stall_of_that_phase(make_profile, marker, tmp_path, phase):
    # only the hung phase's timer is short: on a loaded box the phases before it may take over 1 s
    timeouts = {p: 1.0 if p == phase else 30.0 for p in PHASES}
    host, profile, handle, startup, events = _start(make_profile, marker, tmp_path, f"{phase}:hang", timeouts)
    try:
        assert handle.returncode() is None  # a hang is a live process that says nothing
        failure = startup.failure
        assert (failure.kind, failure.phase) == ("stall", phase)
        assert "timeout 1 s" in failure.line and failure.message.startswith(f"stalled at {phase}: ")
        assert events[-1].kind == "failure" and events[-1].name == "stall"
        silent = events[-1].time - max(e.time for e in events[:-1])
        assert 1.0 <= silent < 10.0  # its own 1 s timer fired, not a later phase's 30 s one
    finally:
        handle.stop()
    assert host.held(profile) == []


def test_silence_after_init_torch_distributed_is_a_stall_at_starting(script_profile, marker, tmp_path):
    """The NCCL-init hang with TP > 1 (SGLang issues 3666, 4257): nothing after
    `Init torch distributed begin.`; only the stall timer catches it."""
    host, profile = LocalHost(), script_profile(REPLAY_THEN_HANG, str(FIXTURES / "versions/v0.5.9_tp_hang_nccl_init.log"))
    events: list[Event] = []
    handle, startup = start_server(host, profile, marker=marker, log_path=tmp_path / "server.log",
                                   timeouts={p: 1.0 for p in PHASES}, on_event=events.append)
    try:
        assert handle.returncode() is None  # alive, silent
        failure = startup.failure
        assert (failure.kind, failure.phase) == ("stall", "starting") and not failure.infrastructure
        assert failure.line.endswith("last line: Init torch distributed begin.")
        assert _phase_names(events) == ["starting"]
    finally:
        handle.stop()
    assert host.held(profile) == []


def test_a_progress_bar_redrawn_with_carriage_returns_keeps_its_phase_alive(script_profile, marker, tmp_path):
    """Graph capture longer than its timeout is not a stall while tqdm keeps redrawing its bar."""
    host, profile = LocalHost(), script_profile(SLOW_CAPTURE, "0.4")  # 8 redraws, 3.2 s in all
    events: list[Event] = []
    handle, startup = start_server(host, profile, marker=marker, log_path=tmp_path / "server.log",
                                   timeouts={p: 1.5 for p in PHASES}, on_event=events.append)
    try:
        assert _phase_names(events) == ["starting", "cuda_graph", "warmup"]
        assert startup.phases["cuda_graph"].duration > 1.5  # longer than its timeout, yet no stall there
        assert (startup.failure.kind, startup.failure.phase) == ("stall", "warmup")
        assert startup.failure.line.endswith("last line: Started server process [4242]")
    finally:
        handle.stop()


def test_a_version_without_signatures_still_starts(make_profile, marker, tmp_path):
    """A space on a release newer than the signature files (a live manifest of 0.5.10) is read
    with every known wording instead of refused."""
    host, profile = EmulatedHost(), dataclasses.replace(make_profile("ok"), sglang_version="0.5.10")
    handle, startup = start_server(host, profile, marker=marker, log_path=tmp_path / "server.log", timeouts={})
    try:
        assert startup.ok and list(startup.phases) == list(PHASES)
    finally:
        handle.stop()


def test_gpu_held_by_another_server_is_an_infrastructure_failure(make_profile, marker, tmp_path):
    host = EmulatedHost()
    first = make_profile("ok")
    holder, ready = start_server(host, first, marker=marker, log_path=tmp_path / "first.log", timeouts={})
    try:
        assert ready.ok
        # Same state dir, GPUs 1 and 2: GPU 1 held, GPU 2 free, so SGLang's balance check fails
        # (GPUs held alike pass it, and the start runs out of memory loading instead).
        second = make_profile("ok", env={**first.env, "CUDA_VISIBLE_DEVICES": "1,2"})
        handle, startup = start_server(host, second, marker=marker + "-2", log_path=tmp_path / "second.log",
                                       timeouts={})
        # Its own processes go, but the host stays dirty: stop says so, naming the holder.
        with pytest.raises(InfrastructureFault, match=r"GPU 1 by pid \d+ \(.*search\.emulator"):
            handle.stop()
        assert host.kill_marker(marker + "-2") == 0
        assert startup.failure.kind == "gpu_busy"
        assert startup.failure.infrastructure
        assert "unbalanced" in startup.failure.line
    finally:
        holder.stop()


def test_exit_without_a_failure_line_is_a_crash_with_the_exit_code(make_profile, marker, tmp_path):
    host = EmulatedHost()
    # An unknown flag: the emulator exits 2 with argparse's message, as SGLang does.
    _, profile, handle, startup, events = _start(make_profile, marker, tmp_path, "ok", args=["--no-such-flag"])
    handle.stop()
    assert handle.returncode() == 2
    assert startup.failure.kind == "crash"
    assert startup.failure.phase == "starting"
    assert "exited with code 2" in startup.failure.line
    assert "unrecognized arguments: --no-such-flag" in startup.failure.line
    assert host.held(profile) == []
