"""Benchmark the log watcher: our CPU while following a log written at 10,000 lines/s (serving
lines, then tqdm redraws ended by "\r"), and the latency from a decisive line being written to
its event.

    python scripts/bench_logwatch.py [--seconds 10] [--rate 10000]

The writer is a separate process (so its CPU is not ours); the watcher thread runs follow() +
LogClassifier exactly as the lifecycle does, and we read this process's CPU time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from search.logwatch import LogClassifier, follow

SERVING = ("[2026-02-19 05:52:10 TP0] Decode batch, #running-req: 64, #token: 80123, token usage: 0.10, cuda graph: True, "
           "gen throughput (token/s): 880.12, #queue-req: 12, \n")
# tqdm in a file: each redraw begins with "\r", the bar ends with "\n" only when done
REDRAW = "\rCapturing batches (bs=256 avail_mem=20.08 GB):  54%|█████▍    | 28/52 [00:10<00:09,  2.60it/s]"
CRASH = "[2026-02-19 06:10:31 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"


def _writer(path: str, rate: int, seconds: float, payload: str) -> None:
    """Write `rate` payloads/s in 10 ms batches, flushing each batch (as a logging server does)."""
    with open(path, "a") as fh:
        start = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(elapsed * rate) - sent
            if due > 0:
                fh.write(payload * due)
                fh.flush()
                sent += due
            time.sleep(0.01)


def cpu_while_following(rate: int, seconds: float, payload: str) -> tuple[float, int]:
    """(our CPU in % of a core, lines given out) while ``payload`` is written ``rate`` times a second."""
    ends = b"\r" if payload.startswith("\r") else b"\n"  # what completes one payload's line
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "server.log")
        path.write_text("")
        stop = threading.Event()
        seen = [0]
        classifier = LogClassifier()

        def watch() -> None:
            for line in follow(path, stop.is_set):
                classifier.feed(line)
                seen[0] += 1

        thread = threading.Thread(target=watch)
        thread.start()
        writer = mp.Process(target=_writer, args=(str(path), rate, seconds, payload))
        cpu0, wall0 = time.process_time(), time.monotonic()
        writer.start()
        writer.join()
        written = path.read_bytes().count(ends)
        deadline = time.monotonic() + 10
        while seen[0] < written and time.monotonic() < deadline:
            time.sleep(0.01)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        complete = seen[0]  # before stop(), which also gives out the last, unterminated redraw
        stop.set()
        thread.join()
        if complete != written:
            raise SystemExit(f"watcher saw {complete} of {written} lines")
        return 100.0 * cpu / wall, written


def detection_latency(trials: int) -> list[float]:
    """Seconds from writing the crash line to the failure event coming out of the classifier."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(trials):
            path = Path(tmp, f"server{i}.log")
            path.write_text(SERVING * 100)
            stop = threading.Event()
            got = threading.Event()
            detected = [0.0]

            def watch(path: Path = path, stop: threading.Event = stop, got: threading.Event = got,
                      detected: list[float] = detected) -> None:
                classifier = LogClassifier()
                for line in follow(path, stop.is_set):
                    if any(e.kind == "failure" for e in classifier.feed(line)):
                        detected[0] = time.monotonic()
                        got.set()
                        return

            thread = threading.Thread(target=watch)
            thread.start()
            time.sleep(0.3 + (i % 7) * 0.013)  # land at varied points of the watcher's wait
            with path.open("a") as fh:
                written = time.monotonic()
                fh.write(CRASH)
                fh.flush()
            got.wait(5)
            stop.set()
            thread.join()
            results.append(detected[0] - written)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    for name, payload in (("serving lines", SERVING), ("tqdm redraws", REDRAW)):
        cpu, lines = cpu_while_following(args.rate, args.seconds, payload)
        print(
            f"follow+classify {name}, writer asked for {args.rate}/s for {args.seconds:g} s: "
            f"{lines} lines ({lines / args.seconds:.0f}/s achieved), our CPU {cpu:.1f}% of one core"
        )
    lat = sorted(detection_latency(args.trials))
    print(
        f"crash line -> failure event over {len(lat)} trials: median {statistics.median(lat) * 1000:.1f} ms, "
        f"max {lat[-1] * 1000:.1f} ms"
    )
    print(f"(pid {os.getpid()}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
