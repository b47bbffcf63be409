"""`search log classify` and `search log watch` as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
SEARCH = [sys.executable, "-c", "from search.cli import main; main()"]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SEARCH, *args], capture_output=True, text=True, timeout=timeout)


def test_classify_json_on_a_failure_exits_0() -> None:
    result = _run("log", "classify", str(FIXTURES / "real/sglang5285_cuda_graph_oom.log"), "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    # the frames place the OOM in graph capture, so that is the last phase reached
    assert verdict == {
        "phase": "cuda_graph",
        "failure": "oom",
        "line": ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. "
                 "GPU 7 has a total capacity of 95.00"),
        "progress": None,
    }


def test_classify_readable_line() -> None:
    result = _run("log", "classify", str(FIXTURES / "versions/v0.5.9_autotune_ninja.log"))
    assert result.returncode == 0
    assert result.stdout.startswith("crashed at autotune: CalledProcessError: Command '['ninja'")
    ready = _run("log", "classify", str(FIXTURES / "versions/v0.5.23_ready.log"))
    assert ready.stdout.startswith("ready (loading 100%): ")


def test_classify_missing_file_exits_2(tmp_path: Path) -> None:
    result = _run("log", "classify", str(tmp_path / "absent.log"), "--json")
    assert result.returncode == 2
    assert result.stderr.startswith("error: log file") and "not found" in result.stderr


def test_watch_follows_a_growing_log_to_ready(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    lines = (FIXTURES / "versions/v0.5.8.post1_ready.log").read_text().splitlines(keepends=True)
    proc = subprocess.Popen([*SEARCH, "log", "watch", str(log)], stdout=subprocess.PIPE, text=True)
    try:
        with log.open("w") as fh:
            for line in lines:
                fh.write(line)
                fh.flush()
                time.sleep(0.005)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    printed = [row.split(maxsplit=1)[1] for row in out.splitlines()]
    assert [p for p in printed if not p.startswith("loading ")] == [
        "starting", "loading", "kv_cache", "autotune", "cuda_graph", "warmup", "ready"]
    assert "loading 100%" in printed


def test_watch_reports_the_failure_and_exits_1(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text((FIXTURES / "versions/v0.5.23_cuda_graph_oom.log").read_text())
    result = _run("log", "watch", str(log))
    assert result.returncode == 1
    assert "out of memory at cuda_graph: Exception: Capture cuda graph failed: CUDA out of memory" in result.stdout
    assert "failed: oom at cuda_graph" in result.stderr


def test_watch_stalls_after_timeout(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("Loading safetensors checkpoint shards: 100% Completed | 163/163\n")
    result = _run("log", "watch", str(log), "--timeout-s", "0.5")
    assert result.returncode == 1
    assert "stalled at loading: no output for" in result.stdout


def test_watch_shows_loading_progress_while_a_tqdm_bar_redraws(tmp_path: Path) -> None:
    """A bar tqdm redraws with "\\r" (its default in a file) reaches `search log watch` while it
    runs, not only when its final "\\n" comes."""
    log = tmp_path / "server.log"
    proc = subprocess.Popen([*SEARCH, "log", "watch", str(log)], stdout=subprocess.PIPE, text=True)
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        with log.open("w") as fh:
            fh.write("[2026-02-20 10:00:03 TP0] Load weight begin. avail mem=139.50 GB\n")
            with tqdm(total=4, desc="Loading safetensors checkpoint shards", file=fh, mininterval=0,
                      bar_format="{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]") as bar:
                for _ in range(2):
                    bar.update()
                    fh.flush()
                # the 25% redraw is complete now that the 50% one began: it shows before the bar ends
                deadline = time.monotonic() + 30
                while not any(row.endswith("loading 25%\n") for row in printed):
                    assert time.monotonic() < deadline, f"no live progress: {printed}"
                    time.sleep(0.02)
                bar.update(2)
            fh.write("[2026-02-20 10:01:17] The server is fired up and ready to roll!\n")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    reader.join(5)
    assert [row.split(maxsplit=1)[1].strip() for row in printed] == [
        "starting", "loading", "loading 0%", "loading 25%", "loading 50%", "loading 100%", "ready"]
