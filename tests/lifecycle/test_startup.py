"""start_server against real emulator processes: every landscape outcome, its events and timeline."""

from __future__ import annotations

import time

import httpx
import pytest

from search.errors import InfrastructureFault
from search.hosts import LocalHost
from search.lifecycle import start_server
from search.logwatch import PHASES, Event

CRASHES = [
    # outcome (crash phase), failure kind, a word of the deciding line
    ("loading", "oom", "CUDA out of memory"),
    ("kv_cache", "oom", "Not enough memory"),
    ("autotune", "autotune_error", "ninja"),
    ("cuda_graph", "unsupported", "No supported CUDA architectures"),
    ("warmup", "unsupported", "not supported on SM120"),
]


def _start(make_profile, marker, tmp_path, outcome, timeouts=None, **kw):
    host, profile, events = LocalHost(emulate=True), make_profile(outcome, **kw), []
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
                                  "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)")
        assert failure.to_dict()["advice"] == list(failure.advice)
    finally:
        handle.stop()


@pytest.mark.parametrize(("phase", "kind", "evidence"), CRASHES)
def test_crash_names_kind_phase_and_line(make_profile, marker, tmp_path, phase, kind, evidence):
    host, profile, handle, startup, events = _start(make_profile, marker, tmp_path, phase)
    try:
        failure = startup.failure
        assert not startup.ok
        assert (failure.kind, failure.phase) == (kind, phase)
        assert evidence in failure.line
        assert not failure.infrastructure
        assert failure.message.startswith(f"{'out of memory' if kind == 'oom' else kind if kind == 'unsupported' else 'crashed'} at {phase}: ")
        assert evidence in failure.message
        # the event stream ends in the failure, after the phase it names was entered
        names = _phase_names(events)
        assert names[-1] == phase or phase not in names  # a frame may name a phase whose line never came
        assert [e for e in events if e.kind == "failure"][-1].name == kind
        assert PHASES.index(names[-1]) <= PHASES.index(phase)
        assert list(startup.phases)[-1] == names[-1]
        # detected soon after the deciding line, not after some long timeout
        assert time.time() - failure_time(events) < 5
    finally:
        handle.stop()
    assert host.held(profile) == []


def failure_time(events: list[Event]) -> float:
    return next(e.time for e in events if e.kind == "failure")


def test_autotune_crash_reads_as_a_user_sees_it(make_profile, marker, tmp_path):
    _, _, handle, startup, _ = _start(make_profile, marker, tmp_path, "autotune")
    handle.stop()
    assert startup.failure.message.startswith("crashed at autotune: CalledProcessError: Command '['ninja'")


@pytest.mark.parametrize("phase", ["loading", "kv_cache"])
def test_hang_becomes_a_stall_of_that_phase(make_profile, marker, tmp_path, phase):
    timeouts = {p: 1.0 for p in PHASES}
    host, profile, handle, startup, events = _start(make_profile, marker, tmp_path, f"{phase}:hang", timeouts)
    try:
        assert handle.returncode() is None  # a hang is a live process that says nothing
        failure = startup.failure
        assert (failure.kind, failure.phase) == ("stall", phase)
        assert "timeout 1 s" in failure.line and failure.message.startswith(f"stalled at {phase}: ")
        assert events[-1].kind == "failure" and events[-1].name == "stall"
        silent = events[-1].time - max(e.time for e in events[:-1])
        assert 1.0 <= silent < 4.0
    finally:
        handle.stop()
    assert host.held(profile) == []


def test_gpu_held_by_another_server_is_an_infrastructure_failure(make_profile, marker, tmp_path):
    host = LocalHost(emulate=True)
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
    host = LocalHost(emulate=True)
    # An unknown flag: the emulator exits 2 with argparse's message, as SGLang does.
    _, profile, handle, startup, events = _start(make_profile, marker, tmp_path, "ok", args=["--no-such-flag"])
    handle.stop()
    assert handle.returncode() == 2
    assert startup.failure.kind == "crash"
    assert startup.failure.phase == "starting"
    assert "exited with code 2" in startup.failure.line
    assert "unrecognized arguments: --no-such-flag" in startup.failure.line
    assert host.held(profile) == []
