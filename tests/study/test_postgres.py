"""A study on a real PostgreSQL server (tests/postgres.py): run, killed with kill -9 mid-trial,
resumed with nothing lost, and shown, as on the default SQLite file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers import marker_pids, running_server, write_space
from tests.postgres import postgres_server


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A server for this module; no PostgreSQL installed is an error naming the setup command."""
    with postgres_server() as url:
        yield url


def _search(workdir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", "from search.cli import main; main()", *args],
                            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_study_on_postgresql_is_killed_resumed_and_shown(workdir: Path, postgres: str) -> None:
    space = write_space(workdir, time_scale="0.02")  # a 3.4 s startup: time to kill it mid-trial
    run = ["study", "run", str(space), "--study", "pg", "--n-trials", "2", "--emulate", "--remeasure", "0",
           "--seed", "0", "--storage", postgres]
    first = _search(workdir, *run)
    number, marker = running_server("pg", postgres)
    first.kill()
    first.wait(30)

    second = _search(workdir, *run)
    out, _ = second.communicate(timeout=240)
    assert second.returncode == 0, out
    assert "left RUNNING by a dead run" in out and not marker_pids(marker)
    study = optuna.load_study(study_name="pg", storage=postgres)
    assert study.trials[number].state == TrialState.FAIL
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(measured) == 2 and any(t.user_attrs.get("retry_of") == number for t in measured)
    assert not (workdir / "studies.db").exists()  # everything went to the server

    shown = _search(workdir, "study", "show", "pg", "--format", "json", "--storage", postgres)
    text, _ = shown.communicate(timeout=60)
    assert shown.returncode == 0, text
    shown_trials = {row["trial"] for row in json.loads(text)["trials"]}
    assert shown_trials >= {t.number for t in measured}
