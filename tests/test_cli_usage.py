"""Bad usage and bad paths end as one `error:` line on stderr and exit 2, never a traceback.

Run through the real entry point in a subprocess, as a user meets it: an exception the CLI does
not turn into a line would print a traceback there (and exit 1).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import search.cli
from tests.space.conftest import SPACES


def _search(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from search.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("args, line", [
    (["space", "bogus"], "error: no such command 'bogus' (see search space --help)"),
    (["space", "check", "--bogus"], "error: no such option: --bogus (see search space check --help)"),
    (["space", "render"], "error: missing argument 'SPACE' (see search space render --help)"),
    (["trial", "show"], "error: missing argument 'NAME' (see search trial show --help)"),
    (["study", "run", str(SPACES / "demo.yaml")], "error: missing option '--study' (see search study run --help)"),
    (["bench", "http://127.0.0.1:9", "--input-len", "abc"], "error: invalid value for '--input-len': "),
])
def test_bad_usage_is_one_line_and_exit_2(args: list[str], line: str) -> None:
    done = _search(*args)
    assert done.returncode == 2
    assert _one_error_line(done).startswith(line)


@pytest.mark.parametrize("args, line", [
    ([], "error: search needs a command: "),
    (["space"], "error: search space needs a command: check, render"),
])
def test_a_bare_group_shows_its_help_then_one_line(args: list[str], line: str) -> None:
    done = _search(*args)
    assert done.returncode == 2
    assert _one_error_line(done).startswith(line)
    assert f"Usage: search {' '.join(args)}".rstrip() in done.stdout


def test_unreadable_or_unwritable_paths_are_bad_input(tmp_path: Path) -> None:
    done = _search("space", "check", str(tmp_path))
    assert done.returncode == 2
    assert _one_error_line(done) == (f"error: cannot read space file {tmp_path}: Is a directory; "
                                     "give the path of a spaces/*.yaml file")
    made = tmp_path / "missing" / "x.sh"  # a missing directory is made, as export and report do
    assert _search("space", "render", str(SPACES / "demo.yaml"), "--baseline", "-o", str(made)).returncode == 0
    assert made.read_text().startswith("#!") and made.stat().st_mode & 0o111
    target = made / "y.sh"  # under a file
    done = _search("space", "render", str(SPACES / "demo.yaml"), "--baseline", "-o", str(target))
    assert done.returncode == 2
    assert _one_error_line(done) == (f"error: cannot write {target}: File exists; give -o a file in a directory "
                                     "you can write to")


def test_a_bug_is_one_line_unless_debug(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*_: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("search.cli.space.check_space", broken)
    with pytest.raises(SystemExit) as info:
        search.cli.main(["space", "check", str(SPACES / "demo.yaml")])
    assert info.value.code == 1
    assert capsys.readouterr().err == ("error: ZeroDivisionError: division by zero "
                                       "(a bug in search; rerun with --debug for the traceback)\n")
    with pytest.raises(ZeroDivisionError):
        search.cli.main(["--debug", "space", "check", str(SPACES / "demo.yaml")])
