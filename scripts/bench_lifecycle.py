"""Lifecycle speed: how soon a crash, an exit or readiness is known, and how fast teardown is.

Issue 4's targets, measured from the moment the decisive thing happens (the server stamps it):
  crash line -> start_server returns          < 0.5 s
  silent exit -> start_server returns         < 0.5 s
  /health turns 200 -> start_server returns   < 0.5 s
  cooperative teardown (emulator, TP 2)       < 3 s
  server ignoring SIGTERM                     < grace + 1 s

Usage: python scripts/bench_lifecycle.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from search.hosts import LocalHost
from search.hosts.emulated import EmulatedHost
from search.lifecycle import start_server
from search.profile import LaunchProfile

# A fake server whose decisive moment is written to a stamp file: argv = mode port stamp.
SERVER = r'''
import http.server, os, pathlib, signal, socketserver, sys, threading, time
mode, port, stamp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("[2026-01-01 00:00:00] server_args=ServerArgs(model_path='m')", flush=True)
print("[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=90.00 GB", flush=True)
time.sleep(0.3)
if mode == "crash":
    pathlib.Path(stamp).write_text(repr(time.time()))
    print("[2026-01-01 00:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):", flush=True)
    print("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.5", flush=True)
    time.sleep(0.1)
    sys.exit(1)
if mode == "exit":
    pathlib.Path(stamp).write_text(repr(time.time()))
    os._exit(3)
healthy = threading.Event()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if healthy.is_set() else 503); self.end_headers()
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    allow_reuse_address = True
    daemon_threads = True
srv = S(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("[2026-01-01 00:00:02] The server is fired up and ready to roll!", flush=True)
time.sleep(0.3)
healthy.set()
pathlib.Path(stamp).write_text(repr(time.time()))
time.sleep(600)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake(mode: str, work: Path) -> tuple[LaunchProfile, Path]:
    script, port, stamp = work / "server.py", free_port(), work / f"stamp-{uuid.uuid4().hex}"
    script.write_text(SERVER)
    profile = LaunchProfile(launcher=[sys.executable, str(script)], args=[mode, str(port), str(stamp)], env={},
                            secret_env=[], host="127.0.0.1", port=port, sglang_version="0.5.23")
    return profile, stamp


def detection(mode: str, work: Path) -> float:
    """Seconds from the server's stamped moment to start_server returning."""
    host = LocalHost()
    profile, stamp = fake(mode, work)
    handle, startup = start_server(host, profile, marker=uuid.uuid4().hex, log_path=stamp.with_suffix(".log"), timeouts={})
    returned = time.time()
    handle.stop(grace=2)
    assert startup.ok == (mode == "ready"), startup.failure
    return returned - float(stamp.read_text())


def stubborn(work: Path, grace: float) -> float:
    """Seconds stop() takes beyond its grace for a server ignoring SIGTERM."""
    host = LocalHost()
    profile, _ = fake("stubborn", work)
    handle, startup = start_server(host, profile, marker=uuid.uuid4().hex, log_path=work / f"s-{uuid.uuid4().hex}.log", timeouts={})
    assert startup.ok
    began = time.monotonic()
    handle.stop(grace=grace)
    return time.monotonic() - began - grace


def cooperative(work: Path) -> float:
    """Seconds stop() takes for a ready emulator server (main process + 2 ranks)."""
    host, port = EmulatedHost(), free_port()
    profile = LaunchProfile(
        launcher=["python3", "-m", "sglang.launch_server"],
        args=["--model-path", "m", "--tp-size", "2", "--host", "127.0.0.1", "--port", str(port)],
        env={"SEARCH_EMULATOR_STATE_DIR": str(work / "state"), "SEARCH_EMULATOR_TIME_SCALE": "0.002",
             "SEARCH_EMULATOR_GPUS": "2", "SEARCH_EMULATOR_LANDSCAPE": str(work / "landscape.py")},
        secret_env=[], host="127.0.0.1", port=port, sglang_version="0.5.23")
    (work / "landscape.py").write_text("def startup(f, e):\n    return None\n\ndef throughput(f, e, r):\n    return 1000.0\n")
    handle, startup = start_server(host, profile, marker=uuid.uuid4().hex, log_path=work / f"c-{uuid.uuid4().hex}.log", timeouts={})
    assert startup.ok, startup.failure
    began = time.monotonic()
    handle.stop()
    return time.monotonic() - began


def report(name: str, values: list[float], target: str) -> None:
    print(f"| {name} | {statistics.median(values):.3f} | {max(values):.3f} | {target} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    grace = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = {
            "crash line -> failure reported (s)": ([detection("crash", work) for _ in range(args.runs)], "< 0.5"),
            "silent exit -> failure reported (s)": ([detection("exit", work) for _ in range(args.runs)], "< 0.5"),
            "/health 200 -> ready reported (s)": ([detection("ready", work) for _ in range(args.runs)], "< 0.5"),
            "cooperative teardown, emulator TP 2 (s)": ([cooperative(work) for _ in range(args.runs)], "< 3"),
            f"SIGTERM ignored: stop() beyond grace {grace:g} s (s)": (
                [stubborn(work, grace) for _ in range(args.runs)], "< 1"),
        }
    print(f"runs: {args.runs}, pid {os.getpid()}")
    print("| measure | median | max | target |")
    print("|---|---|---|---|")
    for name, (values, target) in rows.items():
        report(name, values, target)


if __name__ == "__main__":
    main()
