"""A study has one driver: a second `study run` of it is refused (exit 2, naming the first), and a
study name is one directory entry under trials/, never a path out of it."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers import study_so_far, write_space

STORAGE = "sqlite:///studies.db"


def _study_run(workdir: Path, space: Path, study: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from search.cli import main; main()", "study", "run", str(space), "--study", study,
         "--emulate", "--seed", "0", *extra],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _refused(done: subprocess.Popen[str], study: str) -> None:
    out, err = done.communicate(timeout=120)
    assert done.returncode == 2, out + err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: study {study!r} is being run by pid "), err


def test_two_drivers_started_together_on_a_new_storage(workdir: Path) -> None:
    space = write_space(workdir)
    drivers = [_study_run(workdir, space, "c", "--n-trials", "2", "--remeasure", "0") for _ in range(2)]
    codes = sorted(d.wait(timeout=240) for d in drivers)
    assert codes == [0, 2], [d.communicate() for d in drivers]
    _refused(next(d for d in drivers if d.returncode == 2), "c")
    trials = optuna.load_study(study_name="c", storage=STORAGE).trials
    assert [t.user_attrs.get("strategy") for t in trials].count("baseline") == 1
    assert len([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == 2
    assert not [t for t in trials if t.state == TrialState.FAIL]


def _open_at(url: str, start: float) -> str:
    from search.errors import BadInput
    from search.storage import open_storage
    while time.time() < start:  # every process opens at the same moment
        pass
    try:
        open_storage(url, create=True)
        return "ok"
    except BadInput as exc:
        return str(exc)


def test_processes_opening_a_new_storage_at_once_all_open_it(tmp_path: Path) -> None:
    """A driver and `study show` (or drivers of two studies) opening a new SQLite file together:
    each creates the tables that are missing, and the losers of that race once said the file was
    "not an SQLite database Optuna can use (table studies already exists)"."""
    for round_ in range(3):
        url = f"sqlite:///{tmp_path / f'new-{round_}.db'}"
        with multiprocessing.get_context("fork").Pool(6) as pool:
            start = time.time() + 0.5
            opened = pool.starmap(_open_at, [(url, start)] * 6)
        assert opened == ["ok"] * 6, opened


def test_a_second_driver_is_refused_while_the_first_remeasures(workdir: Path) -> None:
    space = write_space(workdir, time_scale="0.02")
    first = _study_run(workdir, space, "r", "--n-trials", "1", "--remeasure", "1")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        opened = study_so_far("r", STORAGE)
        if opened is not None and "remeasuring" in opened.user_attrs:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"never re-measured: {first.communicate()}")
    _refused(_study_run(workdir, space, "r", "--n-trials", "1", "--remeasure", "1"), "r")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, out + err
    study = optuna.load_study(study_name="r", storage=STORAGE)
    assert [len(v) for v in study.user_attrs["remeasured"].values()] == [1]


@pytest.mark.parametrize("name", ["{workdir}/escaped", "../../escaped", "", "a/b", ".hidden", "tab\there"])
def test_a_study_name_is_never_a_path(workdir: Path, name: str) -> None:
    name = name.format(workdir=workdir)
    here = workdir / "in"
    here.mkdir()
    space = write_space(here)
    done = subprocess.run(
        [sys.executable, "-c", "from search.cli import main; main()", "study", "run", str(space), "--study", name,
         "--emulate", "--n-trials", "1"],
        cwd=here, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"error: study name {name!r} ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert [p.name for p in workdir.iterdir()] == ["in"]
    assert sorted(p.name for p in here.iterdir()) == ["landscape.py", "space.yaml"]  # no trials/, no studies.db
