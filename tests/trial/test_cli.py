"""`search trial run` as a user runs it: a real subprocess, exit codes, what it prints."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.trial.conftest import SECRET


def _search(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["search", *args], capture_output=True, text=True, env=dict(os.environ), timeout=120)


@pytest.mark.timing  # measures rates against the landscape: run alone
def test_trial_run_prints_timeline_and_levels_and_exits_0(space_file, tmp_path):
    done = _search("trial", "run", str(space_file), "--emulate", "--trials-dir", str(tmp_path / "trials"),
                   "--study", "first", "--set", "--max-running-requests=8")
    assert done.returncode == 0, done.stderr
    for text in ("startup", "autotune", "cuda_graph", "load test", "completed: peak", "tok/s output throughput at concurrency 8"):
        assert text in done.stdout
    trial = tmp_path / "trials" / "first" / "0"
    assert "--max-running-requests 8" in (trial / "command.sh").read_text()
    assert SECRET not in done.stdout + done.stderr
    # The landscape's 400 tok/s per stream (cap 8 here, above both levels), loosely, for each request
    # in flight: a 16-token request lasts 40 ms, so the client's turnaround between requests takes a
    # few per cent of each stream's time, which the level's measured concurrency leaves out. (A client
    # stalled inside the window reads low: scipy imported in the first level read half the rate.)
    levels = json.loads((trial / "loadtest.json").read_text())["levels"]
    assert [lv["max_concurrency"] for lv in levels] == [2, 8]
    for lv in levels:
        assert 0 < lv["concurrency"] <= lv["max_concurrency"]
        assert lv["output_throughput"] == pytest.approx(400.0 * lv["concurrency"], rel=0.15)
        assert lv["median_itl_ms"] == pytest.approx(1000 / 400.0, rel=0.25)
        assert lv["errors"] == {}


def test_trial_run_crash_exits_1_with_the_one_line_failure(space_file, tmp_path):
    done = _search("trial", "run", str(space_file), "--emulate", "--trials-dir", str(tmp_path / "trials"),
                   "--set", "TEST_OUTCOME=kv_cache")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(
        "error: out of memory at kv_cache: RuntimeError: Not enough memory.")
    assert (tmp_path / "trials" / "trial-run" / "0" / "result.json").is_file()


def test_trial_run_unknown_param_exits_2(space_file, tmp_path):
    done = _search("trial", "run", str(space_file), "--emulate", "--trials-dir", str(tmp_path),
                   "--set", "--tp-size=4")
    assert done.returncode == 2
    assert "--set --tp-size: not a parameter of the space; use one of --max-running-requests, TEST_OUTCOME" in done.stderr
    assert not Path(tmp_path / "trial-run").exists()
