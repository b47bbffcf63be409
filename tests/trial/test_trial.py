"""run_trial end to end on the emulator: outcomes, artifacts, secrets, teardown."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from search import correctness
from search.hosts.emulated import EmulatedHost
from search.hosts.local import _live_pids
from search.loadtest import LevelResult
from search.logwatch import PHASES
from search.profile import render
from search.space import load_space
from search.trial import run_trial
from tests.lifecycle.conftest import LANDSCAPE
from tests.trial.conftest import ECHO_SECRET, SECRET


def _all_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.iterdir()))


def test_completed_trial_measures_and_writes_clean_artifacts(space_file, tmp_path):
    space, host = load_space(space_file), EmulatedHost()
    trial_dir, events, seen = tmp_path / "trials" / "s" / "0", [], []

    def on_level(level: LevelResult) -> bool:
        seen.append(level.max_concurrency)
        return True

    result = run_trial(space, space.baseline, host, trial_dir=trial_dir, marker="t-complete",
                       on_event=events.append, on_level=on_level, baseline_answers=None)
    assert result.outcome == "completed", result.failure
    assert seen == [2, 8] and [lv.max_concurrency for lv in result.levels] == [2, 8]
    assert result.objective == max(lv.output_throughput for lv in result.levels) > 0
    assert result.slo_ok and result.peak_concurrency in (2, 8)
    assert result.answers and result.answers_differ is None
    assert [e.name for e in events if e.kind == "phase"] == list(PHASES)
    assert result.gpu_seconds > 0 and result.teardown is None

    names = {p.name for p in trial_dir.iterdir()}
    assert names == {"command.sh", "config.yaml", "profile.json", "server.log", "phases.json", "answers.json",
                     "loadtest.json", "result.json"}
    assert list(json.loads((trial_dir / "phases.json").read_text())) == list(PHASES)
    saved = json.loads((trial_dir / "result.json").read_text())
    assert saved["outcome"] == "completed" and saved["peak_output_throughput"] == result.objective
    assert len(json.loads((trial_dir / "loadtest.json").read_text())["levels"]) == 2
    assert "The server is fired up and ready to roll" in (trial_dir / "server.log").read_text()
    # the server saw the secret (so it was passed through) but no file keeps it
    assert "token seen by server: <redacted>" in (trial_dir / "server.log").read_text()
    assert SECRET not in _all_text(trial_dir)
    assert "SEARCH_TEST_TOKEN" in (trial_dir / "profile.json").read_text()  # named, not valued

    assert host.held(render(space, space.baseline)) == [] and _live_pids("t-complete") == []

    # the same config again, compared with a baseline whose answers differ
    again = run_trial(space, space.baseline, host, trial_dir=tmp_path / "trials" / "s" / "1", marker="t-again",
                      baseline_answers=["something else"] * len(result.answers))
    assert again.answers == result.answers  # greedy answers are a fingerprint
    assert again.answers_differ is True


def test_corrupting_landscape_is_flagged_against_the_baselines_answers(space_file, tmp_path, monkeypatch):
    space, host = load_space(space_file), EmulatedHost()
    baseline = run_trial(space, space.baseline, host, trial_dir=tmp_path / "0", marker="t-baseline")
    assert baseline.outcome == "completed" and baseline.answers
    # The same server whose outputs are garbage (NaN logits): the landscape's corrupt() says so.
    corrupting = tmp_path / "corrupting.py"
    corrupting.write_text(ECHO_SECRET + LANDSCAPE + "\ndef corrupt(flags, env):\n    return True\n")
    monkeypatch.setenv("SEARCH_EMULATOR_LANDSCAPE", str(corrupting))
    broken = run_trial(space, space.baseline, host, trial_dir=tmp_path / "1", marker="t-corrupt",
                       baseline_answers=baseline.answers)
    assert broken.outcome == "completed"  # it still serves, and fast: only the answers give it away
    assert broken.answers_differ is True
    assert correctness.compare(baseline.answers, broken.answers) == list(range(len(baseline.answers)))
    saved = json.loads((tmp_path / "1" / "result.json").read_text())
    assert saved["answers_differ"] is True


def test_crash_is_recorded_with_phase_and_host_left_clean(space_file, tmp_path):
    space, host = load_space(space_file), EmulatedHost()
    config = {**space.baseline, "TEST_OUTCOME": "autotune"}
    trial_dir = tmp_path / "t"
    result = run_trial(space, config, host, trial_dir=trial_dir, marker="t-crash")
    assert result.outcome == "crashed"
    assert (result.failure.kind, result.failure.phase) == ("autotune_error", "autotune")
    assert result.failure.message.startswith("crashed at autotune: CalledProcessError")
    assert not result.levels and result.objective is None
    saved = json.loads((trial_dir / "result.json").read_text())
    assert saved["failure"]["phase"] == "autotune" and saved["outcome"] == "crashed"
    assert "loadtest.json" not in {p.name for p in trial_dir.iterdir()}
    assert host.held(render(space, config)) == [] and _live_pids("t-crash") == []


def test_server_dying_mid_ladder_aborts_it_at_once(space_file, tmp_path):
    space, host = load_space(space_file), EmulatedHost()
    marker = "t-dies"

    def kill_server(level: LevelResult) -> bool:
        for pid in _live_pids(marker):  # the whole server, as an OOM killer would
            os.kill(pid, signal.SIGKILL)
        return True

    began = time.monotonic()
    result = run_trial(space, space.baseline, host, trial_dir=tmp_path / "t", marker=marker, on_level=kill_server)
    assert result.outcome == "crashed"
    assert [lv.max_concurrency for lv in result.levels] == [2]  # the second level never ran
    assert "exited" in result.failure.message or "died" in result.failure.message
    assert time.monotonic() - began < 20
    assert host.held(render(space, space.baseline)) == []


def test_dirty_host_is_an_infrastructure_outcome(space_file, tmp_path, monkeypatch):
    import socket

    import search.trial

    space, host = load_space(space_file), EmulatedHost()
    monkeypatch.setattr(search.trial, "CLEAN_TIMEOUT_S", 0.3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", space.launch.port))
        s.listen()
        result = run_trial(space, space.baseline, host, trial_dir=tmp_path / "t", marker="t-dirty")
    assert result.outcome == "infrastructure" and result.failure.infrastructure
    assert f"port {space.launch.port} by pid {os.getpid()}" in result.failure.message
    assert result.startup is None and not (tmp_path / "t" / "server.log").exists()
