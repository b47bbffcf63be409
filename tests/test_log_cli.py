"""`search log` on what a careless night hands it: a binary file, a directory, a path that never appears."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def _log(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", "from search.cli import main; main()", "log", *args],
                          capture_output=True, timeout=60, check=False)


def test_classify_never_echoes_control_characters(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"Load weight begin. \x1b]0;pwned\x07 \x9b31m \x00\x08 avail mem=10 GB\n" + bytes(range(256)))
    done = _log("classify", str(path))
    assert done.returncode == 0
    assert not re.search(rb"[\x00-\x09\x0b-\x1f\x7f]", done.stdout), done.stdout  # only the final newline
    assert "\\x1b]0;pwned\\x07" in done.stdout.decode()


def test_classify_a_directory_says_so(tmp_path: Path) -> None:
    done = _log("classify", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.decode() == (f"error: {tmp_path} is a directory; give a server log file in it "
                                    f"(e.g. {tmp_path / 'server.log'})\n")


def test_watch_on_a_path_that_never_appears_is_not_a_stall(tmp_path: Path) -> None:
    done = _log("watch", str(tmp_path / "nosuch.log"), "--timeout-s", "0.5")
    assert done.returncode == 2
    assert done.stdout == b"" and done.stderr.decode() == (
        f"error: no log file at {tmp_path / 'nosuch.log'} after 0.5 s; check the path (the server writes it as it "
        "starts)\n")
