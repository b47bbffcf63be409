"""Our load test against a client no one here wrote: ``sglang.bench_serving --backend sglang-oai``.

Both run the same settings against the same emulator: N requests of exactly ``--input-len`` /
``--output-len`` tokens, at most C in flight, request rate inf, counted from the first send to
the last end (our ``--requests`` mode is that procedure). bench_serving needs a tokenizer and a
dataset file; both are built here, locally, with nothing downloaded: a word-level tokenizer made
with the ``tokenizers`` library and a ShareGPT-shaped JSON of generated conversations.

bench_serving is run as shipped (``runpy`` on ``sglang.bench_serving``) with one shim: its
module imports ``FAKE_BOOTSTRAP_HOST`` from ``sglang.srt.disaggregation.utils``, whose package
imports the multimodal configs and so torchvision, which has no build on the package index
matching this machine's torch 2.13+cpu. The shim registers that module with the one constant.
It also needs two packages that ``scripts/setup.sh`` leaves out (``pip install datasets
transformers==5.19.0``, the version sglang 0.5.23 pins). The last column is the machine's
1-minute load average after each level: both clients share the cores with the emulator.

    python scripts/bench_vs_bench_serving.py [--concurrency 64,256,1024] [--input-len 1024] [--output-len 64] [--waves 3]
        [--instant-ms MS] [--server-args "SGLang flags"] [--duration 180s]

``--duration`` adds our steady-state mode (what a trial runs) beside the two N-request figures:
in the long regime (1,024-token answers at a few tok/s a stream) no request ends inside its window.

``--request-rate 4,8 --requests 400 --goodput ttft:500 --goodput tpot:20 [--range-ratio 0.5]``
compares open-loop levels instead: N requests at that rate (Poisson arrivals, no concurrency
cap) with both clients' goodput for the same SLOs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_accuracy import emulator
from bench_client import instant_server

from search.loadtest import LadderSpec, parse_concurrency, parse_duration, parse_goodput, parse_rates, run_ladder

_SHIM = (
    "import sys, types, runpy; "
    "m = types.ModuleType('sglang.srt.disaggregation.utils'); m.FAKE_BOOTSTRAP_HOST = '2.2.2.2'; "
    "sys.modules[m.__name__] = m; "
    "runpy.run_module('sglang.bench_serving', run_name='__main__', alter_sys=True)"
)


def build_tokenizer(directory: Path, vocab: int = 32000) -> None:
    """A word-level tokenizer (w0..wN) saved as a transformers-loadable directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(vocab - 1)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(directory)


def build_dataset(path: Path, conversations: int, seed: int = 0) -> None:
    """ShareGPT-shaped conversations of random words (bench_serving's random dataset samples them)."""
    rng = random.Random(seed)
    rows = [{"conversations": [{"from": "human", "value": " ".join(f"w{rng.randrange(1, 32000)}" for _ in range(200))},
                               {"from": "gpt", "value": "w1 w2 w3"}]} for _ in range(conversations)]
    path.write_text(json.dumps(rows))


def bench_serving(url: str, work: Path, concurrency: int | None, requests: int, input_len: int, output_len: int,
                  rate: float = float("inf"), range_ratio: float = 1.0, goodput: tuple[str, ...] = ()) -> dict:
    out = work / f"bench_serving_{concurrency}_{rate}.jsonl"
    cmd = [sys.executable, "-c", _SHIM, "--backend", "sglang-oai", "--base-url", url, "--model", "m",
           "--tokenizer", str(work / "tokenizer"), "--dataset-name", "random",
           "--dataset-path", str(work / "sharegpt.json"), "--random-input-len", str(input_len),
           "--random-output-len", str(output_len), "--random-range-ratio", str(range_ratio),
           "--num-prompts", str(requests), "--request-rate", str(rate), "--disable-tqdm", "--output-file", str(out),
           *(["--max-concurrency", str(concurrency)] if concurrency else []),
           *(["--goodput", *goodput] if goodput else [])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench_serving failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="64,256,1024")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--waves", type=int, default=3, help="requests per level = waves x concurrency")
    ap.add_argument("--instant-ms", type=float, default=None,
                    help="instead of the emulator, bench_client.py's instant server pacing one chunk per this "
                         "many ms per stream: its own TTFT is ~0, so the TTFT measured is the client's")
    ap.add_argument("--server-args", default="", help="SGLang flags added to the emulator's")
    ap.add_argument("--duration", default=None, help="also run our steady-state mode with levels this long")
    ap.add_argument("--request-rate", default=None, help="open-loop levels (req/s), e.g. 4,8, instead of concurrency")
    ap.add_argument("--requests", type=int, default=400, help="requests per open-loop level")
    ap.add_argument("--range-ratio", type=float, default=1.0, help="open-loop levels: lengths in [ratio x len, len]")
    ap.add_argument("--goodput", action="append", default=[], help="an SLO KEY:MS for both clients, repeatable")
    ap.add_argument("--same-arrivals", action="store_true",
                    help="open-loop levels: ours sends the gaps bench_serving draws (its seed 42), each slept "
                         "after the send as bench_serving does, instead of its own draw on an absolute clock")
    args = ap.parse_args()
    server = (emulator(args=shlex.split(args.server_args)) if args.instant_ms is None
              else instant_server(args.instant_ms / 1000))
    with tempfile.TemporaryDirectory() as tmp, server as url:
        work = Path(tmp)
        build_tokenizer(work / "tokenizer")
        levels = parse_concurrency(args.concurrency)
        build_dataset(work / "sharegpt.json", max(args.waves * max(levels), args.requests))
        if args.request_rate:
            open_loop(url, work, args)
            return
        print(f"{'streams':>7} {'requests':>8} {'bench_serving tok/s':>19} {'ours tok/s':>10} {'diff':>7} "
              f"{'bs TTFT p50/p99':>15} {'our TTFT p50/p99':>16} {'bs ITL p50':>10} {'our ITL p50':>11} {'load':>5}"
              + (f" {'ours steady tok/s':>17} {'completed':>9}" if args.duration else ""))
        for c in levels:
            n = args.waves * c
            theirs = bench_serving(url, work, c, n, args.input_len, args.output_len)
            spec = LadderSpec(concurrency=(c,), input_len=args.input_len, output_len=args.output_len,
                              duration_s=None, requests=n)
            ours = run_ladder(url, spec).levels[0]
            diff = (ours.output_throughput - theirs["output_throughput"]) / theirs["output_throughput"]
            print(f"{c:>7} {n:>8} {theirs['output_throughput']:>19,.1f} {ours.output_throughput:>10,.1f} {diff:>+7.2%} "
                  f"{theirs['median_ttft_ms']:>7.0f}/{theirs['p99_ttft_ms']:<7.0f} "
                  f"{ours.median_ttft_ms:>8.0f}/{ours.p99_ttft_ms:<7.0f} "
                  f"{theirs['median_itl_ms']:>10.1f} {ours.median_itl_ms:>11.1f} {os.getloadavg()[0]:>5.1f}",
                  end="", flush=True)
            if args.duration:
                steady = run_ladder(url, LadderSpec(concurrency=(c,), input_len=args.input_len,
                                                    output_len=args.output_len,
                                                    duration_s=parse_duration(args.duration))).levels[0]
                print(f" {steady.output_throughput:>17,.1f} {steady.completed:>9}", end="")
            print(flush=True)


def bench_serving_schedule(requests: int, rate: float, input_len: int, output_len: int, range_ratio: float,
                           seed: int = 42) -> tuple[float, ...]:
    """The send times bench_serving draws for its random dataset, so ours can offer the same arrivals.

    0.5.23 seeds numpy's global generator with ``--seed`` (serving.py:2056, default 42), draws the
    input then the output lengths (datasets/random.py -> common.py:60, ``np.random.randint(size=N)``),
    and after each send an exponential gap (serving.py:1127). Its sends are relative sleeps, so a
    busy event loop adds its delays to these; ours keeps them on an absolute clock.
    """
    import numpy as np

    rng = np.random.RandomState(seed)
    for full in (input_len, output_len):
        rng.randint(max(int(full * range_ratio), 1), full + 1, size=requests)
    gaps = [rng.exponential(1.0 / rate) for _ in range(requests - 1)]
    times, t = [0.0], 0.0
    for gap in gaps:
        t += gap
        times.append(t)
    return tuple(times)


def open_loop(url: str, work: Path, args: argparse.Namespace) -> None:
    """N requests at each rate through both clients: throughput and goodput side by side."""
    print(f"{'req/s':>6} {'requests':>8} {'bs tok/s':>9} {'our tok/s':>9} {'diff':>7} {'bs goodput':>10} "
          f"{'our goodput':>11} {'diff':>7} {'bs TTFT p50':>11} {'our TTFT p50':>12} {'load':>5}")
    slos = parse_goodput(args.goodput)
    for rate in parse_rates(args.request_rate):
        theirs = bench_serving(url, work, None, args.requests, args.input_len, args.output_len, rate,
                               args.range_ratio, tuple(args.goodput))
        schedule = (bench_serving_schedule(args.requests, rate, args.input_len, args.output_len, args.range_ratio)
                    if args.same_arrivals else None)
        spec = LadderSpec(request_rates=(rate,), input_len=args.input_len, output_len=args.output_len,
                          duration_s=None, requests=args.requests, range_ratio=args.range_ratio, goodput=slos,
                          schedule=schedule, sleep_after_send=args.same_arrivals)
        ours = run_ladder(url, spec).levels[0]
        bs_good = theirs.get("request_goodput") or 0.0
        print(f"{rate:>6g} {args.requests:>8} {theirs['output_throughput']:>9,.1f} {ours.output_throughput:>9,.1f} "
              f"{ours.output_throughput / theirs['output_throughput'] - 1:>+7.2%} {bs_good:>10.2f} "
              f"{ours.request_goodput or 0.0:>11.2f} {(ours.request_goodput or 0.0) / bs_good - 1 if bs_good else 0:>+7.2%} "
              f"{theirs['median_ttft_ms']:>11.0f} {ours.median_ttft_ms or 0:>12.0f} {os.getloadavg()[0]:>5.1f}", flush=True)
        if slos:  # each SLO's share alone, to see which metric the clients read differently
            by = theirs.get("slo_attainment_by_metric") or {}
            print("       attainment by SLO, bs / ours: " + ", ".join(
                f"{k} {by.get(k, 0):.3f} / {(ours.slo_attainment_by_metric or {}).get(k, 0):.3f}" for k in slos)
                + f"; durations bs {theirs['duration']:.1f} s / ours {ours.duration:.1f} s", flush=True)


if __name__ == "__main__":
    main()
