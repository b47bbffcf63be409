"""Per-level metrics with ``sglang.bench_serving``'s definitions and key names.

TTFT = first content chunk - send; ITL = gaps between consecutive content chunks;
(a latency with no sample in the level is None);
TPOT = (E2E - TTFT) / (output tokens - 1); throughputs = tokens (or requests) / duration;
concurrency = time-averaged requests in flight (bench_serving: sum of E2E / duration).

Two ways to cut the samples:
- ``from_requests``: every request from the first send to the last end, exactly as
  bench_serving counts ``--num-prompts N``;
- ``from_window``: a steady-state window [t0, t1) of a closed loop. Output tokens are the
  tokens that *arrived* in the window, so a 60 s window measures the rate even when one
  request takes minutes; each metric takes its samples from events inside the window.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np
from scipy import stats

from search.loadtest.client import Record

_STATS = ("ttft", "itl", "tpot", "e2e_latency")


@dataclass
class LevelResult:
    """One concurrency level; keys follow bench_serving where it has one."""

    max_concurrency: int
    concurrency: float
    duration: float
    completed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p90_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    p90_itl_ms: float | None
    p99_itl_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p90_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_e2e_latency_ms: float | None
    median_e2e_latency_ms: float | None
    p90_e2e_latency_ms: float | None
    p99_e2e_latency_ms: float | None
    errors: dict[str, int] = field(default_factory=dict)
    converged: bool = False  # the throughput's confidence half-width fell under the threshold
    ended_early: bool = False  # the level stopped before its full duration because it converged
    output_throughput_ci: float | None = None  # relative 95% half-width of output_throughput
    client_cpu: float | None = None  # the busiest client process's CPU, as a share of one core
    client_processes: int = 1  # processes the level's streams ran in

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _summary(name: str, seconds: list[float]) -> dict[str, float | None]:
    # None for an empty sample (bench_serving says 0, which reads as a perfect latency): e.g.
    # no request finished inside a window shorter than one request.
    if not seconds:
        return {f"{stat}_{name}_ms": None for stat in ("mean", "median", "p90", "p99")}
    arr = np.asarray(seconds) * 1000.0
    return {
        f"mean_{name}_ms": float(arr.mean()),
        f"median_{name}_ms": float(np.median(arr)),
        f"p90_{name}_ms": float(np.percentile(arr, 90)),
        f"p99_{name}_ms": float(np.percentile(arr, 99)),
    }


def error_counts(records: Iterable[Record]) -> dict[str, int]:
    """Failed requests by kind; requests cancelled at the end of a level are not errors."""
    return dict(Counter(r.error for r in records if r.error and r.error != "cancelled"))


def _tpot(r: Record) -> float | None:
    n = r.tokens()
    return (r.end - r.chunks[0]) / (n - 1) if n > 1 else None  # (e2e - ttft) / (n - 1)


def _build(level: int, duration: float, done: list[Record], ttft: list[float], itl: list[float],
           out_tokens: float, busy: float, errors: dict[str, int], **extra: Any) -> LevelResult:
    dur = max(duration, 1e-9)
    in_tokens = sum(r.input_tokens for r in done)
    samples = {
        "ttft": ttft,
        "itl": itl,
        "tpot": [t for r in done if (t := _tpot(r)) is not None],
        "e2e_latency": [r.end - r.send for r in done],
    }
    summaries: dict[str, float | None] = {}
    for name in _STATS:
        summaries.update(_summary(name, samples[name]))
    return LevelResult(
        max_concurrency=level,
        concurrency=busy / dur,
        duration=duration,
        completed=len(done),
        total_input_tokens=in_tokens,
        total_output_tokens=round(out_tokens),
        request_throughput=len(done) / dur,
        input_throughput=in_tokens / dur,
        output_throughput=out_tokens / dur,
        total_throughput=(in_tokens + out_tokens) / dur,
        errors=errors,
        **summaries,
        **extra,
    )


def from_requests(level: int, records: list[Record]) -> LevelResult:
    """All requests, bench_serving's way: duration from the first send to the last end."""
    done = [r for r in records if r.ok]
    start = min((r.send for r in records), default=0.0)
    end = max((r.end for r in records if r.end is not None), default=start)
    return _build(
        level,
        end - start,
        done,
        ttft=[r.chunks[0] - r.send for r in done],
        itl=[b - a for r in done for a, b in zip(r.chunks, r.chunks[1:])],
        out_tokens=sum(r.tokens() for r in done),
        busy=sum(r.end - r.send for r in done),
        errors=error_counts(records),
    )


def from_window(level: int, records: list[Record], t0: float, t1: float, **extra: Any) -> LevelResult:
    """The steady-state window [t0, t1) of a closed loop (see the module docstring)."""
    finished = [r for r in records if r.ok and r.output_tokens is not None]
    # Tokens per content chunk (above 1 with --stream-interval > 1), learnt from finished
    # requests' usage counts, weighs the chunks of requests still running at t1.
    per_chunk = sum(r.tokens() for r in finished) / max(sum(len(r.chunks) for r in finished), 1) if finished else 1.0
    out_tokens = 0.0
    ttft: list[float] = []
    itl: list[float] = []
    busy = 0.0
    for r in records:
        end = r.end if r.end is not None else t1
        busy += max(0.0, min(end, t1) - max(r.send, t0))
        if not r.chunks:
            continue
        lo, hi = bisect_left(r.chunks, t0), bisect_left(r.chunks, t1)
        weight = r.output_tokens / len(r.chunks) if r.ok and r.output_tokens else per_chunk
        out_tokens += (hi - lo) * weight
        if lo == 0 < hi:
            ttft.append(r.chunks[0] - r.send)
        itl.extend(r.chunks[i] - r.chunks[i - 1] for i in range(max(lo, 1), hi))
    done = [r for r in records if r.ok and t0 <= r.end < t1]  # type: ignore[operator]
    return _build(level, t1 - t0, done, ttft, itl, out_tokens, busy, error_counts(records), **extra)


def chunks_between(records: list[Record], a: float, b: float) -> int:
    """Content chunks that arrived in [a, b): the convergence test's per-bin count."""
    return sum(bisect_left(r.chunks, b) - bisect_left(r.chunks, a) for r in records if r.chunks and r.send < b)


def relative_half_width(bins: list[int]) -> float:
    """95% confidence half-width of the mean bin count, relative to the mean (batch means)."""
    n = len(bins)
    mean = sum(bins) / n if n else 0.0
    if n < 2 or mean <= 0:
        return math.inf
    sd = float(np.std(bins, ddof=1))
    return float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n) / mean
