"""follow() on a file another thread keeps writing: partial lines, truncation, replacement."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from search.logwatch import follow, split_pieces


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


def test_tqdm_redraws_are_lines_as_they_come(tmp_path: Path) -> None:
    """tqdm in a file redraws with "\\r" and writes "\\n" only when done (SGLang's graph-capture bar):
    each redraw is given out once the next one begins, long before the bar ends."""
    path = tmp_path / "server.log"
    stop, out = threading.Event(), []
    thread = _collect(path, stop, out)
    bar = "Capturing batches (bs={bs} avail_mem=18.00 GB): {pct:3d}%|          | {done}/4 [00:0{done}<00:03,  1.00it/s]"
    with path.open("w", newline="") as fh:
        fh.write("[2026-02-20 10:00:10] Capture cuda graph begin. This can take up to several minutes.\n")
        for done, bs in enumerate((32, 16, 8, 4)):
            fh.write("\r" + bar.format(bs=bs, pct=25 * done, done=done))
            fh.flush()
            if done:  # the previous redraw is complete now; it arrives while the bar still runs
                _wait_for(lambda bs=bs, done=done: out[-1:] == [bar.format(bs=bs * 2, pct=25 * (done - 1), done=done - 1)])
        fh.write("\r" + bar.format(bs=4, pct=100, done=4) + "\n")
        fh.write("first\r\n")
        fh.flush()
        _wait_for(lambda: out[-1:] == ["first"])
        fh.write("second\r")  # half of a "\r\n": held until the next byte says which
        fh.flush()
        time.sleep(0.2)
        assert out[-1] == "first"
        fh.write("\nthird\n")
        fh.flush()
        _wait_for(lambda: out[-1:] == ["third"])
    stop.set()
    thread.join(2)
    assert out[-3:] == ["first", "second", "third"]  # CRLF ends one line, not two
    assert bar.format(bs=4, pct=100, done=4) in out and "" in out  # the empty piece before the first "\r"


def test_split_pieces() -> None:
    assert split_pieces(b"a\nb") == ([b"a"], b"b")
    assert split_pieces(b"\rbar 0%\rbar 10%\rbar 20") == ([b"", b"bar 0%", b"bar 10%"], b"bar 20")
    assert split_pieces(b"x\r\ny\r") == ([b"x"], b"y\r")
    assert split_pieces(b"a\rb\r\nc") == ([b"a", b"b"], b"c")
