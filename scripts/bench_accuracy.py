"""Accuracy of the load test: measured output tok/s against the emulator's modelled rate.

Starts the emulator (the built-in seed landscape, ``--tp 8`` baseline flags) and runs the
ladder in duration mode at 64 to 1,024 streams; the modelled rate is the landscape's
``throughput(flags, env, min(level, cap))``. Prints one row per level and the relative error.

    python scripts/bench_accuracy.py [--concurrency 64,256,512,1024] [--duration 30s] [--output-len 512]
        [--server-args "--moe-runner-backend flashinfer_cutlass --disable-cuda-graph"]

``--server-args`` adds SGLang flags to the emulator's (the seed's tuned config, say); the modelled
rate is then the landscape's for those flags.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx

from search.emulator.landscape import Landscape
from search.loadtest import LadderSpec, parse_concurrency, parse_duration, run_ladder
from search.manifests import load

SERVER_ARGS = ["--model-path", "m", "--tp", "8"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def emulator(time_scale: float = 0.01, extra_env: dict[str, str] | None = None,
             args: list[str] | None = None) -> Iterator[str]:
    """A running emulator (own state dir, free port, ``args`` after the baseline flags); yields its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "SEARCH_EMULATOR_TIME_SCALE": str(time_scale), "SEARCH_EMULATOR_STATE_DIR": state,
               **(extra_env or {})}
        log = open(os.path.join(state, "server.log"), "w")
        proc = subprocess.Popen([sys.executable, "-m", "search.emulator", *SERVER_ARGS, *(args or []), "--port", str(port)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"emulator did not get ready; log: {open(log.name).read()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def modelled(concurrency: int, args: list[str] | None = None) -> float:
    """The seed landscape's output tok/s for the baseline flags (plus ``args``) at this many streams."""
    flags = load().parse([*SERVER_ARGS, *(args or [])]).values
    land = Landscape.load(None)
    cap = flags["max_running_requests"] or land.max_running_requests(flags, {})
    return land.throughput(flags, {}, min(concurrency, cap))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="64,256,512,1024")
    ap.add_argument("--duration", default="30s")
    ap.add_argument("--warmup", default="5s")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--server-args", default="", help="SGLang flags added to the emulator's")
    args = ap.parse_args()
    server_args = shlex.split(args.server_args)
    spec = LadderSpec(concurrency=parse_concurrency(args.concurrency), input_len=args.input_len,
                      output_len=args.output_len, duration_s=parse_duration(args.duration),
                      warmup_s=parse_duration(args.warmup, "--warmup", allow_zero=True))
    with emulator(args=server_args) as url:
        result = run_ladder(url, spec)
    print(f"{'streams':>7} {'achieved':>8} {'modelled tok/s':>14} {'measured tok/s':>14} {'error':>7} "
          f"{'window s':>8} {'converged':>9} {'completed':>9} {'TPOT ms':>8} {'TTFT p50':>8}")
    for lv in result.levels:
        model = modelled(lv.max_concurrency, server_args)
        print(f"{lv.max_concurrency:>7} {lv.concurrency:>8.1f} {model:>14,.1f} {lv.output_throughput:>14,.1f} "
              f"{(lv.output_throughput - model) / model:>+7.2%} {lv.duration:>8.1f} {str(lv.ended_early):>9} "
              f"{lv.completed:>9} {lv.mean_tpot_ms or 0:>8.1f} {lv.median_ttft_ms or 0:>8.0f}", flush=True)
    if result.aborted:
        print(f"aborted: {result.aborted}")


if __name__ == "__main__":
    main()
