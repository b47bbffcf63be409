"""How close the emulator delivers its landscape's rate with N concurrent streams on this machine.

Starts `python -m search.emulator` (seed landscape, tuned config: cap removed, graphs off,
flashinfer_cutlass autotune), opens N streaming /v1/completions with a raw asyncio client (one
connection per stream, as bench_serving does), counts content chunks received during a window
after all streams run, and compares with the landscape's throughput(flags, env, N).

    python scripts/bench_emulator.py --streams 1024 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from search.emulator.landscape import Landscape
from search.emulator.launch import parse_flags

FLAGS = ["--model-path", "lukealonso/GLM-5-NVFP4", "--tp", "8", "--moe-runner-backend", "flashinfer_cutlass",
         "--disable-cuda-graph", "--mem-fraction-static", "0.92"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def stream(port: int, counter: list[int], stop: asyncio.Event) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"prompt": "Tell me a long story.", "max_tokens": 1_000_000, "ignore_eos": True,
                       "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    while not stop.is_set():
        data = await reader.read(65536)
        if not data:
            break
        counter[0] += data.count(b'"text":')
    writer.close()


async def measure(port: int, streams: int, warm: float, seconds: float) -> float:
    counter, stop = [0], asyncio.Event()
    tasks = [asyncio.create_task(stream(port, counter, stop)) for _ in range(streams)]
    await asyncio.sleep(warm)
    start_count, start = counter[0], time.monotonic()
    await asyncio.sleep(seconds)
    rate = (counter[0] - start_count) / (time.monotonic() - start)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warm", type=float, default=5.0)
    args = ap.parse_args()
    state = tempfile.mkdtemp(prefix="bench-emulator-")
    env = {**os.environ, "SEARCH_EMULATOR_TIME_SCALE": "0.002", "SEARCH_EMULATOR_STATE_DIR": state}
    flags = parse_flags("0.5.23", FLAGS)
    landscape = Landscape.load(None)
    failed = 0
    for n in args.streams:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "search.emulator", *FLAGS, "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            got = asyncio.run(measure(port, n, args.warm, args.seconds))
        finally:
            proc.terminate()
            proc.wait()
        want = landscape.throughput(flags, env, n)
        err = (got - want) / want
        failed += abs(err) > 0.03
        print(f"streams={n:5d}  modelled={want:8.1f} tok/s  delivered={got:8.1f} tok/s  error={err:+.2%}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
