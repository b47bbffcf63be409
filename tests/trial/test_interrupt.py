"""Ctrl-C after a ladder level finished: the trial's result.json keeps that level."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from search.hosts import local_host
from search.loadtest import LevelResult
from search.space import load_space
from search.trial import run_trial
from tests.helpers import marker_pids, write_space


def test_levels_measured_before_ctrl_c_reach_result_json(tmp_path: Path) -> None:
    space = load_space(write_space(tmp_path))

    def interrupt(level: LevelResult) -> bool:
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, just after the first level ended
        return True

    # A suite started in the background by a non-interactive shell inherits SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_trial(space, space.baseline, local_host(emulate=True), trial_dir=tmp_path / "t", marker="interrupt-1",
                      on_level=interrupt)
    finally:
        signal.signal(signal.SIGINT, previous)
    saved = json.loads((tmp_path / "t" / "result.json").read_text())
    assert [level["max_concurrency"] for level in saved["levels"]] == [4]
    assert not marker_pids("interrupt-1")
