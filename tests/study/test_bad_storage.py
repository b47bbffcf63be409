"""A storage that cannot be used is bad input: exit 2, one line naming the file or URL and what to do,
before any server starts, and nothing the storage or trials/ already hold is touched."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.helpers import write_space

# Root writes through any file mode; without CAP_DAC_OVERRIDE it meets them as a user does.
_AS_A_USER = (["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]
              if os.geteuid() == 0 else [])


def _search(workdir: Path, *args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-c", "from search.cli import main; main()", *args],
                          cwd=workdir, capture_output=True, text=True, timeout=120)


def _one_line_exit_2(done: subprocess.CompletedProcess[str], *named: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1 and "bug in search" not in done.stderr, done.stderr
    for name in named:
        assert name in done.stderr, done.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cases(workdir: Path) -> dict[str, tuple[list[str], str]]:
    """Each broken storage as command-line options, and what the error must name."""
    (workdir / "garbage.db").write_bytes(b"not a database\n" * 100)
    url = f"postgresql://search@127.0.0.1:{_closed_port()}/search"
    return {
        "garbage": (["--storage", "sqlite:///garbage.db"], "garbage.db"),
        "bogus scheme": (["--storage", "bogus://"], "bogus://"),
        "unreachable postgres": (["--storage", url], url),
        "missing directory": (["--storage", "sqlite:///nodir/studies.db"], "nodir"),
        "trials dir on a file": (["--trials-dir", "garbage.db"], "garbage.db"),
    }


@pytest.mark.parametrize("case", ["garbage", "bogus scheme", "unreachable postgres", "missing directory",
                                  "trials dir on a file"])
def test_study_run_on_a_broken_storage_is_bad_input(workdir: Path, case: str) -> None:
    space = write_space(workdir)
    options, named = _cases(workdir)[case]
    before = (workdir / "garbage.db").read_bytes()
    done = _search(workdir, "study", "run", str(space), "--study", "s", "--emulate", "--n-trials", "1", *options)
    _one_line_exit_2(done, named)
    assert (workdir / "garbage.db").read_bytes() == before  # nothing it held is lost
    assert not (workdir / "trials").exists() and not (workdir / "state").exists()  # no trial, no server


@pytest.mark.parametrize(("command", "case"), [
    (["study", "show", "s"], "garbage"), (["study", "list"], "unreachable postgres"),
    (["study", "export", "s", "--format", "json"], "bogus scheme"), (["study", "report", "s"], "garbage"),
    (["trial", "show", "s", "0"], "unreachable postgres")])
def test_every_view_on_a_broken_storage_is_bad_input(workdir: Path, case: str, command: list[str]) -> None:
    options, named = _cases(workdir)[case]
    _one_line_exit_2(_search(workdir, *command, *options), named)


def test_from_study_on_a_broken_storage_is_bad_input(workdir: Path) -> None:
    space = write_space(workdir)
    options, named = _cases(workdir)["garbage"]
    done = _search(workdir, "study", "run", str(space), "--study", "s", "--emulate", "--from-study", "other", *options)
    _one_line_exit_2(done, named)


def test_reading_a_missing_storage_creates_nothing(workdir: Path) -> None:
    for command in (["study", "show", "nosuch"], ["study", "list"], ["trial", "show", "nosuch", "0"]):
        _one_line_exit_2(_search(workdir, *command), "studies.db")
    assert list(workdir.iterdir()) == []


def test_a_missing_study_in_a_real_storage_names_the_ones_there(workdir: Path) -> None:
    optuna.create_study(study_name="there", storage="sqlite:///studies.db")
    _one_line_exit_2(_search(workdir, "study", "show", "nosuch"), "nosuch", "there")


def test_a_postgresql_url_without_its_driver_names_the_package(workdir: Path) -> None:
    """SQLAlchemy's own error for an absent driver is told as the package to install."""
    url = f"postgresql+pg8000://search@127.0.0.1:{_closed_port()}/search"
    _one_line_exit_2(_search(workdir, "study", "list", "--storage", url), url, "pg8000")


def test_trial_run_with_trials_dir_on_a_file_is_bad_input(workdir: Path) -> None:
    space = write_space(workdir)
    (workdir / "file").write_text("kept\n")
    _one_line_exit_2(_search(workdir, "trial", "run", str(space), "--emulate", "--trials-dir", "file"), "file")
    assert (workdir / "file").read_text() == "kept\n" and not (workdir / "state").exists()


def test_study_run_on_a_read_only_storage_is_bad_input(workdir: Path) -> None:
    space = write_space(workdir)
    study = optuna.create_study(study_name="kept", storage="sqlite:///ro.db")
    study.enqueue_trial({"x": 1})
    (workdir / "ro.db").chmod(0o444)
    before = (workdir / "ro.db").read_bytes()
    done = _search(workdir, "study", "run", str(space), "--study", "s", "--emulate", "--n-trials", "1",
                   "--storage", "sqlite:///ro.db", prefix=_AS_A_USER)
    _one_line_exit_2(done, "ro.db", "read-only")
    assert (workdir / "ro.db").read_bytes() == before and not (workdir / "trials").exists()
