"""Per-level metrics with ``sglang.bench_serving``'s definitions and key names.

TTFT = first content chunk - send; ITL = gaps between consecutive content chunks;
(a latency with no sample in the level is None);
TPOT = (E2E - TTFT) / (output tokens - 1); throughputs = tokens (or requests) / duration;
concurrency = time-averaged requests in flight (bench_serving: sum of E2E / duration).

Two ways to cut the samples:
- ``from_requests``: every request from the first send to the last end, exactly as
  bench_serving counts ``--num-prompts N``;
- ``from_window``: a steady-state window [t0, t1) of a closed loop. Output tokens are the
  tokens that *arrived* in the window, counted from what each chunk brought (never from what
  a request asked for), so a 60 s window measures the rate even when every request takes
  minutes and none ends inside it; each metric takes its samples from events inside the window.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

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
    # A window's TTFT came from requests whose first token arrived inside it; False: none did,
    # and TTFT is that of the level's requests before it (see from_window).
    ttft_in_window: bool = True
    # How output tokens were counted: "server" (running counts in every chunk), "text"
    # (characters over the finished requests' characters per token), "chunks" (one a chunk).
    output_tokens_counted: str | None = "server"
    request_rate: float | None = None  # an open-loop level's arrival rate (req/s); None: closed loop
    # bench_serving's goodput: requests/s that met every SLO of --goodput, and their share of
    # the requests that ended (None without SLOs).
    request_goodput: float | None = None
    slo_attainment: float | None = None
    slo_attainment_by_metric: dict[str, float] | None = None  # each SLO's share alone (bench_serving's too)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def at(self) -> float:
        """The level's place on the ladder: its request rate (open loop), else its concurrency."""
        return level_at({"request_rate": self.request_rate, "max_concurrency": self.max_concurrency})


def level_at(level: Mapping[str, Any]) -> float:
    """A level's place on the ladder, from its record (`LevelResult.to_dict`, as a trial stores it)."""
    rate = level.get("request_rate")
    return float(rate) if rate is not None else float(level["max_concurrency"])


def meets_slos(level: LevelResult, slos: Mapping[str, float | None]) -> bool:
    """Every SLO given (``{LevelResult key: limit or None}``) holds at this level, without errors;
    an unmeasured value does not hold."""
    values = {key: getattr(level, key) for key in slos}
    within = all(limit is None or (values[key] is not None and values[key] <= limit) for key, limit in slos.items())
    return within and not level.errors


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


def _ended(r: Record) -> float:
    """The end of a request that has one (every request a metric takes as done)."""
    assert r.end is not None, "a running request has no end"
    return r.end


def _tpot(r: Record) -> float | None:
    n = r.tokens()
    return (_ended(r) - r.chunks[0]) / (n - 1) if n > 1 else None  # (e2e - ttft) / (n - 1)


def _build(level: int, duration: float, done: list[Record], ttft: list[float], itl: list[float],
           out_tokens: float, busy: float, errors: dict[str, int], tpot: list[float] | None = None,
           in_tokens: int | None = None, **extra: Any) -> LevelResult:
    dur = max(duration, 1e-9)
    in_tokens = sum(r.input_tokens for r in done) if in_tokens is None else in_tokens
    samples = {
        "ttft": ttft,
        "itl": itl,
        "tpot": tpot if tpot is not None else [t for r in done if (t := _tpot(r)) is not None],
        "e2e_latency": [_ended(r) - r.send for r in done],
    }
    summaries: dict[str, Any] = {}
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


def goodput(ended: list[Record], slos: Mapping[str, float] | None, duration: float) -> dict[str, Any]:
    """bench_serving's ``calculate_goodput`` over the requests that ended (failed ones included).

    A request is good when it succeeded and its TTFT, TPOT ((E2E - TTFT) / (n - 1), 0 for one
    token) and E2E, in ms, are each at most the SLO given for it.
    """
    if not slos:
        return {"request_goodput": None, "slo_attainment": None, "slo_attainment_by_metric": None}
    good = 0
    met = dict.fromkeys(slos, 0)
    for r in ended:
        if not r.ok:
            continue
        observed = {"ttft": (r.chunks[0] - r.send) * 1000, "tpot": (_tpot(r) or 0.0) * 1000,
                    "e2el": (_ended(r) - r.send) * 1000}
        passed = [name for name, limit in slos.items() if observed[name] <= limit]
        for name in passed:
            met[name] += 1
        good += len(passed) == len(slos)
    return {"request_goodput": good / max(duration, 1e-9),
            "slo_attainment": good / len(ended) if ended else None,
            "slo_attainment_by_metric": {name: n / len(ended) for name, n in met.items()} if ended else None}


def from_requests(level: int, records: list[Record], slos: Mapping[str, float] | None = None) -> LevelResult:
    """All requests, bench_serving's way: duration from the first send to the last end."""
    done = [r for r in records if r.ok]
    counted = "server" if all(r.output_tokens is not None or r.exact for r in done) else "chunks"
    start = min((r.send for r in records), default=0.0)
    end = max((r.end for r in records if r.end is not None), default=start)
    return _build(
        level,
        end - start,
        done,
        ttft=[r.chunks[0] - r.send for r in done],
        itl=[b - a for r in done for a, b in zip(r.chunks, r.chunks[1:], strict=False)],
        out_tokens=sum(r.tokens() for r in done),
        busy=sum(_ended(r) - r.send for r in done),
        errors=error_counts(records),
        output_tokens_counted=counted if done else None,
        **goodput([r for r in records if r.error != "cancelled"], slos, end - start),
    )


class TokenCount:
    """Output tokens a record had received by a time, from what its chunks brought.

    Exact records carry the server's running count. The others carry characters, turned into
    tokens by the record's own ratio once it finished with a usage count, else by the ratio of
    the finished ones (``chars_per_token``); with neither, a chunk counts as one token.
    ``how`` says which of these a level's figure rests on.

    Between two chunks the count is interpolated: a chunk's tokens were made over the gap
    before it. Counting them as a step at the chunk's arrival would make a window's total
    depend on where its edges fall between chunks: with a whole decode batch streaming in step
    (a cohort), a short window then gains or loses a whole batch of chunks at each edge.
    """

    def __init__(self, records: list[Record]) -> None:
        chars = tokens = 0
        for r in records:
            if not r.exact and r.ok and r.output_tokens:
                chars, tokens = chars + r.counts[-1], tokens + r.output_tokens
        self.chars_per_token = chars / tokens if tokens else None
        self.how: set[str] = set()

    def _unit(self, r: Record) -> float | None:
        """Units of ``r.counts`` per token; None: count chunks instead."""
        if r.exact:
            self.how.add("server")
            return 1.0
        ratio = (r.counts[-1] / r.output_tokens if r.ok and r.output_tokens and r.counts[-1]
                 else self.chars_per_token)
        self.how.add("text" if ratio else "chunks")
        return ratio

    def _units(self, r: Record, i: int, unit: float | None) -> float:
        """Units received with chunks ``0..i-1``."""
        if i <= 0:
            return 0.0
        return float(r.counts[i - 1]) if unit else float(i)

    def received(self, r: Record, t: float) -> float:
        """Tokens ``r`` had received by ``t`` (interpolated between its chunks)."""
        if not r.chunks or t < r.chunks[0]:
            return 0.0
        unit = self._unit(r)
        i = bisect_right(r.chunks, t)  # chunks 0..i-1 arrived by t
        units = self._units(r, i, unit)
        if i < len(r.chunks):
            gap = r.chunks[i] - r.chunks[i - 1]
            if gap > 0:
                units += (self._units(r, i + 1, unit) - units) * (t - r.chunks[i - 1]) / gap
        return units / (unit or 1.0)

    def source(self) -> str | None:
        """How the level's tokens were counted: the least exact way any record needed."""
        return next((h for h in ("chunks", "text", "server") if h in self.how), None)


def from_window(level: int, records: list[Record], t0: float, t1: float,
                slos: Mapping[str, float] | None = None, **extra: Any) -> LevelResult:
    """The steady-state window [t0, t1) of a closed loop (see the module docstring).

    Every figure comes from events inside the window, so it holds whether or not any request
    ends in it: output tokens are those received in it (``TokenCount.received``); ITL the gaps between chunks
    both inside; TPOT per request, the time it spent decoding inside (from its first chunk or
    t0, to its last chunk or t1) over the tokens it received in that time (for a request wholly
    inside, bench_serving's (E2E - TTFT) / (n - 1)); TTFT of the requests whose first token came inside, or, when none did
    (a cohort started together and still decoding), of those whose first token came before it
    in this level (``ttft_in_window`` False); input tokens those of the prompts whose first
    token came inside; E2E of the requests that ended inside (None when none did: a request
    longer than the window has no E2E yet); goodput of the requests that ended inside.
    """
    count = TokenCount(records)
    out_tokens = 0.0
    ttft: list[float] = []
    ttft_before: list[float] = []
    itl: list[float] = []
    tpot: list[float] = []
    busy = 0.0
    in_tokens = 0  # prompts whose prefill ended in the window (their first token came inside)
    for r in records:
        end = r.end if r.end is not None else t1
        busy += max(0.0, min(end, t1) - max(r.send, t0))
        if not r.chunks:
            continue
        lo, hi = bisect_left(r.chunks, t0), bisect_left(r.chunks, t1)
        out_tokens += count.received(r, t1) - count.received(r, t0)
        if lo == 0 < hi:
            ttft.append(r.chunks[0] - r.send)
            in_tokens += r.input_tokens
        elif lo > 0:
            ttft_before.append(r.chunks[0] - r.send)
        itl.extend(r.chunks[i] - r.chunks[i - 1] for i in range(max(lo, 1), hi))
        a, b = max(t0, r.chunks[0]), min(t1, r.chunks[-1])
        if b > a and (decoded := count.received(r, b) - count.received(r, a)) > 0:
            tpot.append((b - a) / decoded)
    done = [r for r in records if r.ok and t0 <= _ended(r) < t1]
    return _build(level, t1 - t0, done, ttft or ttft_before, itl, out_tokens, busy, error_counts(records),
                  tpot=tpot, in_tokens=in_tokens, ttft_in_window=bool(ttft) or not ttft_before,
                  output_tokens_counted=count.source(),
                  **goodput([r for r in records if r.end is not None and t0 <= r.end < t1
                             and r.error != "cancelled"], slos, t1 - t0), **extra)


def tokens_between(records: list[Record], a: float, b: float) -> float:
    """Output tokens that arrived in [a, b): the convergence test's per-bin count."""
    count = TokenCount(records)
    return sum(count.received(r, b) - count.received(r, a) for r in records if r.chunks and r.send < b)


def chunk_gap_s(records: list[Record]) -> float:
    """The longest latest gap between two chunks of a running stream (0 before any has two).

    A moment's tokens are known only once each stream's chunk after it has come
    (`TokenCount.received` spreads a chunk over the gap before it): this is how long that takes.
    """
    return max((r.chunks[-1] - r.chunks[-2] for r in records if r.end is None and len(r.chunks) > 1), default=0.0)


def request_cycle_s(records: list[Record], output_len: int) -> float | None:
    """The median time a request of the level takes from send to end (None before any decodes).

    Once requests have finished, the median of their end-to-end times: measured, not guessed.
    Before, each running one is projected from its own stream: its TTFT plus the ``output_len - 1``
    tokens after the first at the rate it has been receiving them (a projection from a few chunks
    is a guess, and once any request has ended it is no longer needed).
    The ladder's early end reads it: a closed loop's steady state includes its requests turning
    over, so a window may not stop before it has spanned one cycle unless the requests outlive the
    level anyway.
    """
    ended = [_ended(r) - r.send for r in records if r.ok]
    if ended:
        return float(np.median(ended))
    count = TokenCount(records)
    cycles: list[float] = []
    for r in records:
        if r.end is None and len(r.chunks) > 1:
            got = count.received(r, r.chunks[-1]) - count.received(r, r.chunks[0])
            if got > 0:
                rate = got / (r.chunks[-1] - r.chunks[0])
                cycles.append(r.chunks[0] - r.send + max(0, output_len - 1) / rate)
    return float(np.median(cycles)) if cycles else None


def relative_half_width(bins: list[float]) -> float:
    """95% confidence half-width of the mean bin count, relative to the mean (batch means)."""
    n = len(bins)
    mean = sum(bins) / n if n else 0.0
    if n < 2 or mean <= 0:
        return math.inf
    sd = float(np.std(bins, ddof=1))
    return _t975(n - 1) * sd / math.sqrt(n) / mean


@functools.cache
def _t975(dof: int) -> float:
    """Student's t 97.5% quantile. scipy.stats is imported here, not with the module: it is half a
    second of every `search` command's start, and only a load test needs it (`load_statistics`)."""
    from scipy import stats

    return float(stats.t.ppf(0.975, dof))


def load_statistics() -> None:
    """Import scipy.stats now, before a level's clock runs: imported inside the first window, its
    0.5-1 s stalled the client there (a level of 40 ms requests read half its rate)."""
    _t975(1)
