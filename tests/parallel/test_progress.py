"""What a study with several hosts shows while it runs: the terminal panel lists every running trial
with its host and phase, and a plain log says where each trial was placed (and what it changes
from the baseline) when it is placed, not only when it ends."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

from rich.console import Console

from search.hosts.emulated import EmulatedHost
from search.loadtest import LevelResult
from search.logwatch import Event
from search.progress import StudyProgress
from search.runner import InProcessRunner
from search.space import load_space
from search.study import StudyRun
from tests.parallel.conftest import write_space

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run(tmp_path: Path) -> StudyRun:
    """A study that is never run: the display is driven through its listener as the driver would."""
    return StudyRun(space=load_space(write_space(tmp_path, time_scale=0.01)), name="shown",
                    runner=InProcessRunner([EmulatedHost()]))


def _level(tok_s: float, concurrency: int) -> LevelResult:
    return LevelResult(concurrency, concurrency, 1.0, 10, 100, 100, 10.0, 100.0, tok_s, tok_s + 100.0,
                       *([None] * 16))


def _two_running(run: StudyRun, console: Console) -> StudyProgress:
    """Trial 3 starting up on gpu-a and trial 4 in its load test on gpu-b."""
    progress = StudyProgress(run, console)
    listener = run.listener
    with progress:
        listener.trial_started(3, "tpe", {"--chunked-prefill-size": 2048, "--moe-runner-backend": "flashinfer_cutlass"})
        listener.trial_started(4, "sweep", {"--chunked-prefill-size": 8192, "--moe-runner-backend": "triton"})
        listener.placed(4, "gpu-b")
        listener.placed(3, "gpu-a")
        listener.event(3, Event("phase", "autotune", "autotune", time.time(), "autotuning"))
        listener.level(4, _level(1234.0, 64))
    return progress


def test_the_panel_lists_every_running_trial_with_its_host_and_phase(tmp_path: Path) -> None:
    screen = io.StringIO()
    _two_running(_run(tmp_path), Console(file=screen, force_terminal=True, width=160, color_system=None))
    last = _ANSI.sub("", screen.getvalue()).split("study ")[-1]  # the panel as it was left on screen
    rows = [line.split(None, 1)[1].rstrip() for line in last.splitlines() if line.startswith("now ")]
    assert [re.sub(r"\s+\d+:\d\d:\d\d$", "", row) for row in rows] == [
        "trial 3 (tpe) on gpu-a: autotune",
        "trial 4 (sweep) on gpu-b: load test: 1,234 tok/s at 64",
    ]


def test_a_plain_log_says_where_a_trial_was_placed_and_what_it_changes(tmp_path: Path) -> None:
    log = io.StringIO()
    _two_running(_run(tmp_path), Console(file=log, force_terminal=False, width=160))
    lines = log.getvalue().splitlines()
    assert "trial 4 (sweep) on gpu-b: --moe-runner-backend=triton" in lines
    assert "trial 3 (tpe) on gpu-a: --chunked-prefill-size=2048" in lines
    assert lines.index("trial 4 (sweep) on gpu-b: --moe-runner-backend=triton") < lines.index(
        "trial 4: load test: 1,234 tok/s at 64")  # said when placed, before anything it measured
