"""follow() on a file another thread keeps writing: partial lines, truncation, replacement."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from search.logwatch import follow


def _collect(path: Path, stop: threading.Event, out: list[str]) -> threading.Thread:
    def run() -> None:
        for line in follow(path, stop.is_set):
            out.append(line)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "follow() did not deliver in time"
        time.sleep(0.01)


def test_waits_for_file_then_joins_partial_lines(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    stop, out = threading.Event(), []
    thread = _collect(path, stop, out)
    time.sleep(0.1)
    with path.open("w") as fh:
        fh.write("one\ntw")
        fh.flush()
        time.sleep(0.2)
        assert out == ["one"]  # the half-written line is held back
        fh.write("o\nthree\n")
        fh.flush()
        _wait_for(lambda: out == ["one", "two", "three"])
        fh.write("tail without newline")
        fh.flush()
        time.sleep(0.2)
        assert out[-1] == "three"
    stop.set()
    thread.join(2)
    assert not thread.is_alive()
    assert out[-1] == "tail without newline"  # given out as it is when stopping


def test_truncation_and_replacement(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("a\nb\n")
    stop, out = threading.Event(), []
    thread = _collect(path, stop, out)
    _wait_for(lambda: out == ["a", "b"])
    path.write_text("")  # truncated in place
    time.sleep(0.2)
    with path.open("a") as fh:
        fh.write("c\n")
    _wait_for(lambda: out == ["a", "b", "c"])
    fresh = tmp_path / "new.log"
    fresh.write_text("d\n")
    os.replace(fresh, path)  # a new file under the same name
    _wait_for(lambda: out == ["a", "b", "c", "d"])
    stop.set()
    thread.join(2)
    assert not thread.is_alive()


def test_stop_is_honoured_while_idle(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("")
    stop, out = threading.Event(), []
    thread = _collect(path, stop, out)
    time.sleep(0.2)
    stop.set()
    thread.join(1.0)  # loose bound: follow() asks stop() at least every 100 ms
    assert not thread.is_alive()
