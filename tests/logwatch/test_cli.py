"""`search log classify` and `search log watch` as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"
SEARCH = [sys.executable, "-c", "from search.cli import main; main()"]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SEARCH, *args], capture_output=True, text=True, timeout=timeout)


def test_classify_json_on_a_failure_exits_0() -> None:
    result = _run("log", "classify", str(FIXTURES / "real/sglang5285_cuda_graph_oom.log"), "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict == {
        "phase": "starting",
        "failure": "oom",
        "line": "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 7 has a total capacity of 95.00",
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
