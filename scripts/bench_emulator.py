"""How close the emulator delivers its landscape's rate with N concurrent streams, and its ceiling.

Starts `python -m search.emulator` (tuned config: tp 8, flashinfer_cutlass, graphs off, stream
interval 1), opens N streaming /v1/completions with raw asyncio clients (one connection per
stream, as bench_serving does; `--clients` processes share the streams), and over a window after
all streams run counts what arrives: chunks (`"text":` fields) and tokens (the emulator's text is
one " word" per token, so a chunk's spaces less the one of `data: `). Both are compared with the
landscape's throughput(flags, env, N); a server behind its clock sends several tokens per chunk,
so chunks fall short first.

    python scripts/bench_emulator.py --streams 64 1024              # seed landscape: modelled rates
    SEARCH_EMULATOR_LANDSCAPE=scripts/landscapes/flat_rate.py \
        python scripts/bench_emulator.py --ceiling --streams 1024   # highest rate within 3%

`--ceiling` needs a landscape whose rate `BENCH_EMULATOR_RATE` sets (flat_rate.py): it raises the
rate by `--factor` from `--start` while both counts stay within 3%, then bisects `--steps` times
between the last rate that held and the first that did not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from multiprocessing.sharedctypes import SynchronizedArray
from pathlib import Path

from search.emulator.landscape import Landscape
from search.emulator.launch import parse_flags

FLAGS = ["--model-path", "lukealonso/GLM-5-NVFP4", "--tp", "8", "--moe-runner-backend", "flashinfer_cutlass",
         "--disable-cuda-graph", "--mem-fraction-static", "0.92"]
TOLERANCE = 0.03
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    modelled: float
    tokens: float  # tok/s received
    chunks: float  # chunks/s received
    server_cpu: float  # share of one core used by the emulator's main (HTTP) process
    client_cpu: float  # cores used by the client processes together

    def error(self, measured: float) -> float:
        return (measured - self.modelled) / self.modelled

    @property
    def holds(self) -> bool:
        return abs(self.error(self.tokens)) <= TOLERANCE and abs(self.error(self.chunks)) <= TOLERANCE

    def row(self, streams: int) -> str:
        return (f"streams={streams:5d}  modelled={self.modelled:9.1f} tok/s  tokens={self.tokens:9.1f} "
                f"({self.error(self.tokens):+.2%})  chunks={self.chunks:9.1f}/s ({self.error(self.chunks):+.2%})  "
                f"server cpu={self.server_cpu:.0%}  client cpu={self.client_cpu:.0%}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


async def stream(port: int, counts: SynchronizedArray, slot: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"prompt": "Tell me a long story.", "max_tokens": 1_000_000, "ignore_eos": True,
                       "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    while data := await reader.read(65536):
        events = data.count(b"data: ")
        counts[slot] += data.count(b'"text":')
        counts[slot + 1] += data.count(b" ") - events


def client(port: int, streams: int, counts: SynchronizedArray, slot: int) -> None:
    """One client process: `streams` connections, its counts in counts[slot], counts[slot + 1]."""
    async def run() -> None:
        await asyncio.gather(*(stream(port, counts, slot) for _ in range(streams)), return_exceptions=True)
    asyncio.run(run())


def measure(env: dict[str, str], streams: int, clients: int, warm: float, seconds: float,
            modelled: float) -> Result:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "search.emulator", *FLAGS, "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counts = mp.Array("q", 2 * clients, lock=False)
    procs = []
    try:
        wait_healthy(port, server)
        procs = [mp.Process(target=client, args=(port, streams // clients + (i < streams % clients), counts, 2 * i))
                 for i in range(clients)]
        for p in procs:
            p.start()
        time.sleep(warm)
        pids = [server.pid, *(p.pid for p in procs if p.pid)]
        cpu0 = [cpu_seconds(pid) for pid in pids]
        chunks0, tokens0, t0 = sum(counts[0::2]), sum(counts[1::2]), time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        chunks, tokens = sum(counts[0::2]) - chunks0, sum(counts[1::2]) - tokens0
        cpu = [(cpu_seconds(pid) - c) / elapsed for pid, c in zip(pids, cpu0, strict=True)]
        return Result(modelled, tokens / elapsed, chunks / elapsed, cpu[0], sum(cpu[1:]))
    finally:
        for p in procs:
            p.kill()
        server.terminate()
        server.wait()


def wait_healthy(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"error: the emulator exited with {server.returncode} before it was ready")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("error: the emulator was not ready within 120 s")


def ceiling(args: argparse.Namespace, env: dict[str, str], flags: dict, landscape: Landscape) -> int:
    """The highest tried rate at which tokens and chunks both arrive within TOLERANCE."""
    def attempt(rate: float) -> bool:
        run_env = {**env, "BENCH_EMULATOR_RATE": str(round(rate))}
        modelled = landscape.throughput(flags, run_env, args.streams[0])
        if modelled != round(rate):
            raise SystemExit("error: the landscape ignores BENCH_EMULATOR_RATE; set SEARCH_EMULATOR_LANDSCAPE="
                             "scripts/landscapes/flat_rate.py")
        result = measure(run_env, args.streams[0], args.clients, args.warm, args.seconds, modelled)
        print(("holds  " if result.holds else "misses ") + result.row(args.streams[0]), flush=True)
        return result.holds

    good, bad, rate = 0.0, 0.0, args.start
    while attempt(rate):
        good, rate = rate, rate * args.factor
    bad = rate
    for _ in range(args.steps):
        middle = (good + bad) / 2
        if attempt(middle):
            good = middle
        else:
            bad = middle
    return round(good)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warm", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=1, help="client processes sharing the streams")
    ap.add_argument("--ceiling", action="store_true", help="search the highest rate delivered within 3%%")
    ap.add_argument("--start", type=float, default=4000.0, help="first rate of the ceiling search (tok/s)")
    ap.add_argument("--factor", type=float, default=1.5, help="rate step of the ceiling search while it holds")
    ap.add_argument("--steps", type=int, default=3, help="bisection steps after the first miss")
    args = ap.parse_args()
    state = tempfile.mkdtemp(prefix="bench-emulator-")
    env = {**os.environ, "SEARCH_EMULATOR_TIME_SCALE": "0.002", "SEARCH_EMULATOR_STATE_DIR": state}
    flags = parse_flags("0.5.23", FLAGS)
    landscape = Landscape.load(Path(env["SEARCH_EMULATOR_LANDSCAPE"]) if env.get("SEARCH_EMULATOR_LANDSCAPE")
                               else None)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    failed = 0
    if args.ceiling:
        if not env.get("SEARCH_EMULATOR_LANDSCAPE"):
            raise SystemExit("error: --ceiling needs SEARCH_EMULATOR_LANDSCAPE=scripts/landscapes/flat_rate.py")
        best = ceiling(args, env, flags, landscape)
        print(f"ceiling: {best} tok/s delivered within {TOLERANCE:.0%} with {args.streams[0]} streams")
    else:
        for n in args.streams:
            result = measure(env, n, args.clients, args.warm, args.seconds, landscape.throughput(flags, env, n))
            failed += not result.holds
            print(result.row(n), flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
