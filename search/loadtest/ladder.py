"""The concurrency ladder: closed-loop levels in ascending order, each ending as soon as it can.

GPU time is the budget, so a level stops once its output throughput has converged, and the
ladder stops at once when the server dies (``should_abort``, or connections refused), when
errors pass the threshold, or when ``on_level`` says the trial is not worth finishing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

from search.errors import BadInput
from search.loadtest.client import Prompts
from search.loadtest.metrics import (
    LevelResult,
    chunk_gap_s,
    from_requests,
    from_window,
    load_statistics,
    meets_slos,
    relative_half_width,
    request_cycle_s,
    tokens_between,
)
from search.loadtest.spec import LadderSpec
from search.loadtest.streams import Arrivals, Source, Streams, Workers, make_session

OnLevel = Callable[[LevelResult], bool]
ShouldAbort = Callable[[], "str | None"]

_TICK_S = 0.05  # how often a level polls should_abort, errors and its clock
_MIN_BINS = 10  # convergence needs at least this many throughput bins
_MIN_FINISHED_FOR_ERROR_RATE = 20
# A server that takes requests and never answers: a failure, not a measurement of zero.
NO_PROGRESS = "no request finished or streamed within the level"
CLIENT_BUSY = 0.85  # a client process using this share of a core or more may be the bottleneck
MAX_WORKERS = max(1, os.cpu_count() or 1)


@dataclass
class LadderResult:
    spec: LadderSpec
    levels: list[LevelResult] = field(default_factory=list)
    aborted: str | None = None  # why the ladder stopped early (server died, too many errors)
    aborted_at: float | None = None  # the level that was running then: its concurrency, or its rate (open loop)
    pruned: bool = False  # on_level returned False
    rate_search: RateSearch | None = None

    @property
    def max_rate_under_slo(self) -> float | None:
        """The highest request rate measured meeting ``spec.rate_slos``; None: none did (or no search)."""
        return self.rate_search.best if self.rate_search is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "max_rate_under_slo": self.max_rate_under_slo,
            "levels": [lv.to_dict() for lv in self.levels],
            "aborted": self.aborted,
            "aborted_at": self.aborted_at,
            "pruned": self.pruned,
        }


class _Abort(Exception):
    """A level stopped because the run cannot go on; the message says why."""


def _refused(url: str) -> str:
    return f"cannot reach {url}: connection refused — is the server running?"


def check_reachable(url: str, timeout: float = 5.0) -> None:
    """Raise BadInput with one clear line when nothing answers at ``url``."""
    if not url.startswith(("http://", "https://")):
        raise BadInput(f"{url!r} is not an http:// or https:// URL")
    try:
        httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout)
    except httpx.ConnectError:
        raise BadInput(_refused(url)) from None
    except httpx.HTTPError as exc:
        raise BadInput(f"cannot reach {url}: {exc.__class__.__name__} — is the server running?") from None


async def _model_card(session: aiohttp.ClientSession, url: str, spec: LadderSpec) -> tuple[str, int | None]:
    """The served model name and its context length, from /v1/models (SGLang's ``ModelCard``).

    SGLang's OpenAI routes expect the name; ``max_model_len`` bounds the request shape.
    """
    try:
        async with session.get(url + "/v1/models") as resp:
            card = (await resp.json(content_type=None))["data"][0]
    except aiohttp.ClientConnectorError:
        raise
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError):
        card = {}  # not an OpenAI-style server list: SGLang accepts any name
    context = card.get("max_model_len") if isinstance(card, dict) else None
    name = spec.model or (str(card["id"]) if isinstance(card, dict) and "id" in card else "default")
    return name, context if isinstance(context, int) and context > 0 else None


def check_context(spec: LadderSpec, context: int | None, url: str) -> None:
    """Refuse a random request shape longer than the server's context: it would only be rejected."""
    if context is not None and spec.dataset is None and spec.input_len + spec.output_len > context:
        raise BadInput(f"--input-len {spec.input_len} + --output-len {spec.output_len} exceeds the context "
                       f"length {context} of the model at {url}; use a shorter shape")


class _Level:
    """One closed-loop level: ``concurrency`` streams, each sending its next request when the last ends."""

    def __init__(self, source: Source, url: str, spec: LadderSpec, concurrency: int,
                 should_abort: ShouldAbort | None) -> None:
        self.source, self.url, self.spec = source, url, spec
        self.concurrency, self.should_abort = concurrency, should_abort

    def _check(self, final: bool = False) -> None:
        """Raise _Abort when the server died or errors passed the threshold.

        While the level runs the error rate counts only after a few finished requests (one early
        failure is not a trend); at the level's end it counts whatever the number, and a level
        whose every finished request failed aborts whatever the threshold.
        """
        reason = self.should_abort() if self.should_abort else None
        if reason:
            raise _Abort(reason)
        failures, finished = self.source.failures, self.source.finished
        if failures["connect"]:
            raise _Abort(f"server died: {_refused(self.url)}")
        failed = sum(failures.values())
        enough = finished >= (1 if final else _MIN_FINISHED_FOR_ERROR_RATE)
        if enough and (failed > self.spec.max_error_rate * finished or (final and failed == finished)):
            kinds = ", ".join(f"{k}: {n}" for k, n in sorted(failures.items()))
            raise _Abort(f"{failed} of {finished} requests failed ({kinds}), over the "
                         f"{self.spec.max_error_rate:.0%} threshold")

    async def _tick(self) -> float:
        """Sleep a tick, bring the records up to date, check; the time the records are complete to."""
        await asyncio.sleep(_TICK_S)
        await self.source.sync()
        self._check()
        return time.perf_counter() - self.source.lag

    async def run(self) -> LevelResult:
        try:
            if self.spec.requests is not None:
                while not self.source.done():
                    await self._tick()
                await self.source.sync()
                result = from_requests(self.concurrency, self.source.records, self.spec.goodput)
            else:
                result = await self._steady_state()
        finally:
            cpu = await self.source.close()
        self._check(final=True)  # after close: every request's outcome is in
        result.client_cpu = cpu
        return result

    async def _steady_state(self) -> LevelResult:
        """Warm up, then measure until the duration is up or the throughput has converged.

        The warm-up lasts ``warmup_s`` and until every stream is decoding (its first request
        has a token), or, for a server that queues part of the level behind its running cap,
        until the number decoding has stopped growing for ``warmup_s``. When every stream starts
        at once its prompts queue for prefill and first tokens come over many seconds (26 s
        for 1,024 x 1,024 tokens at 40,000 tok/s): a window opened during that climb reads
        low. Bounded by ``warmup_s + duration_s`` for a climb that never levels.
        """
        spec, records = self.spec, self.source.records
        assert spec.duration_s is not None
        start = time.perf_counter()
        decoding, grew = 0, start
        while True:
            now = await self._tick()
            started = sum(1 for r in records if r.chunks or r.end is not None)
            if started != decoding:
                decoding, grew = started, now
            if now - start < spec.warmup_s:
                continue
            everyone = len(records) >= self.concurrency and all(r.chunks or r.end for r in records[: self.concurrency])
            if everyone or (decoding and now - grew >= spec.warmup_s) or now - start >= spec.warmup_s + spec.duration_s:
                break
        bin_s = min(5.0, max(0.2, spec.duration_s / 30))
        # The warm-up ended on reading the last stream's first chunk, and a client the climb left
        # behind reads that chunk late, with a backlog of every stream's chunks. A window opened
        # there spreads each late chunk over too short a gap before its start and counts the rest
        # inside: 1,024 lockstep streams read 4.6% high in CI. So it opens once every stream has a
        # chunk read after the warm-up's end.
        await self._settle(now, max(bin_s, chunk_gap_s(records)))
        t0 = await self._tick()
        bins: list[float] = []
        ci = float("inf")
        while True:
            now = await self._tick()
            # A bin is counted once the chunks that end it are in (a chunk's tokens are spread over
            # the gap before it: TokenCount.received): a bin, or a chunk gap if longer, after it closed.
            lag = max(bin_s, chunk_gap_s(records))
            while now >= t0 + (len(bins) + 1) * bin_s + lag:
                a = t0 + len(bins) * bin_s
                bins.append(tokens_between(records, a, a + bin_s))
                ci = relative_half_width(bins)
            if now - t0 >= spec.duration_s:
                t1 = self._whole_cycles(t0, now)
                await self._settle(t1, lag)
                level = from_window(self.concurrency, records, t0, t1, spec.goodput, converged=_converged(bins, ci, spec),
                                    output_throughput_ci=_finite(ci))
                if not level.total_output_tokens and not level.completed:
                    raise _Abort(NO_PROGRESS)
                return level
            if len(bins) >= _MIN_BINS and _converged(bins, ci, spec) and self._cycled(len(bins) * bin_s):
                # A bin boundary (the window the CI describes), cut to whole request cycles if they fit.
                t1 = self._whole_cycles(t0, t0 + len(bins) * bin_s)
                await self._settle(t1, lag)
                return from_window(self.concurrency, records, t0, t1, spec.goodput, converged=True,
                                   ended_early=True, output_throughput_ci=ci)

    def _cycled(self, window_s: float) -> bool:
        """The window has seen the level's requests turn over, or they will not within the level.

        Streams that start together move as a cohort: bins taken while its first requests decode
        agree closely, yet leave out the prefill pauses and the ramp that come when they end and
        the next ones start. So a window ends early only once it spans one request cycle; when a
        cycle is longer than the level itself (1,024-token answers at 1,024 streams: minutes),
        steady decoding is all the level can see and the converged bins are its steady state.
        A cycle read off ended requests is the median's only once half the level's streams have
        ended: before, the ended ones are a cohort's fastest. (Two CI runs saw a window cut to
        0.93 of the cycle; this is the cause that fits them, not one reproduced here.)
        """
        records = self.source.records
        cycle = request_cycle_s(records, self.spec.output_len)
        assert self.spec.duration_s is not None
        if cycle is None:
            return False
        turned = 2 * sum(r.ok for r in records) >= self.concurrency
        return (window_s >= cycle and turned) or cycle > self.spec.duration_s

    def _whole_cycles(self, t0: float, t1: float) -> float:
        """The end of the longest whole number of request cycles from ``t0`` within ``t1``.

        A cohort's rate swings within each cycle: tokens while its requests decode, none in the
        TTFT between one request and the next. A window of 1.9 cycles (12 s of a 6.3 s cycle:
        4 s decoding, 2 s TTFT) that ends in the gap read 3-6% above the closed loop's rate;
        whole cycles weigh both parts as the loop does. Streams out of step lose only window.
        ``t1`` as is when no request has a cycle yet or one is longer than the window.
        """
        cycle = request_cycle_s(self.source.records, self.spec.output_len)
        if cycle is None or cycle <= 0 or cycle > t1 - t0:
            return t1
        return t0 + (t1 - t0) // cycle * cycle

    async def _settle(self, t1: float, gap_s: float) -> None:
        """Wait until every running request has a chunk at or after ``t1``, for at most twice
        ``gap_s`` (the longest chunk gap) past it and never longer than the level.

        At a window's end: the tokens received up to ``t1`` are known only once the chunk after
        it has come; until then the window's last stretch of each stream would count as nothing.
        (At its start, see `_steady_state`.) With a 0.2 s limit instead of twice the gap, 4-token
        chunks every 0.5 s of a lockstep batch lost half a chunk per stream (4.2% of the level).
        """
        assert self.spec.duration_s is not None
        deadline = t1 + min(self.spec.duration_s, 2 * gap_s)
        while any(r.end is None and r.chunks and r.chunks[-1] < t1 for r in self.source.records):
            if await self._tick() >= deadline:
                return


def _converged(bins: list[float], ci: float, spec: LadderSpec) -> bool:
    """The bins' mean is known to ``converge_ci`` and they are level, not still rising or falling.

    A tight confidence interval alone is not enough: when every stream starts at once, the
    requests move as a cohort, and the bins after its first tokens can agree closely while the
    rate still climbs toward its steady state. A steady state's halves agree to within noise
    (their difference's 95% bound is about twice the half-width), so halves further apart than
    three half-widths mean the window has not reached it.
    """
    if ci >= spec.converge_ci:
        return False
    half = len(bins) // 2
    first, second = sum(bins[:half]) / half, sum(bins[-half:]) / half
    return abs(second - first) <= 3 * spec.converge_ci * (first + second) / 2


def _finite(x: float) -> float | None:
    return x if x != float("inf") else None


class RateSearch:
    """The open-loop levels in the order they run, and the highest rate under the SLOs.

    Without ``rate_slos`` the levels are the spec's rates, ascending. With them the climb stops at
    the first rate whose level misses the SLOs (a higher rate only queues more: its p99 TTFT is
    worse), then ``rate_search_steps`` levels bisect between the last rate that met them (0 when
    none did) and that one, as vLLM's ``bench sweep serve_sla`` searches. Bounded by the spec's
    highest rate, so a server meeting the SLOs everywhere scores that rate. Each level still goes
    through ``on_level``, so the search is pruned as a ladder is.
    """

    def __init__(self, spec: LadderSpec) -> None:
        self.rates = list(spec.request_rates)
        self.slos = spec.rate_slos
        self.steps = spec.rate_search_steps
        self.best: float | None = None  # the highest rate measured meeting the SLOs
        self._low, self._high = 0.0, None  # type: tuple[float, float | None]

    def __iter__(self) -> Iterator[float]:
        for rate in self.rates:
            yield rate
            if self._high is not None:
                break
        if self._high is None:
            return
        for _ in range(self.steps):
            yield (self._low + self._high) / 2

    def record(self, level: LevelResult, rate: float) -> None:
        """Take a finished level's verdict into the search."""
        if self.slos is None:
            return
        if meets_slos(level, self.slos):
            self._low = max(self._low, rate)
            self.best = max(self.best or 0.0, rate)
        else:
            self._high = rate if self._high is None else min(self._high, rate)


async def arun_ladder(url: str, spec: LadderSpec, *, on_level: OnLevel | None = None,
                      should_abort: ShouldAbort | None = None) -> LadderResult:
    """Run the ladder; the async core of :func:`run_ladder`."""
    url = url.rstrip("/")
    load_statistics()
    result = LadderResult(spec=spec)
    rng = random.Random(spec.seed)
    workers = spec.workers or 1  # None: start in this process, add processes once it is the bottleneck
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(make_session(spec))
        try:
            model, context = await _model_card(session, url, spec)
        except aiohttp.ClientConnectorError:
            result.aborted = f"server died: {_refused(url)}"
            result.aborted_at = spec.request_rates[0] if spec.open_loop else spec.concurrency[0]
            return result
        check_context(spec, context, url)
        pool: Workers | None = None
        stack.callback(lambda: pool.close() if pool else None)
        # An open-loop level has no stream count: 0 stands for it (its warm-up is warmup_s alone).
        search = result.rate_search = RateSearch(spec)
        for concurrency, rate in (((0, r) for r in search) if spec.open_loop else
                                  ((c, None) for c in spec.concurrency)):
            while True:
                if workers > 1 and pool is None:
                    pool = await asyncio.get_running_loop().run_in_executor(
                        None, Workers, workers, url, spec, model, spec.seed)
                prompts = Prompts(spec, model, rng)
                source: Source = (
                    Arrivals(session, url, spec, prompts, rate, spec.requests, rng) if rate is not None else
                    pool.level(concurrency, spec.requests) if pool else
                    Streams(session, url, spec, prompts, concurrency, spec.requests))
                try:
                    level = await _Level(source, url, spec, concurrency, should_abort).run()
                except _Abort as exc:
                    result.aborted, result.aborted_at = str(exc), concurrency if rate is None else rate
                    return result
                level.request_rate = rate
                if spec.workers is not None or spec.open_loop or (level.client_cpu or 0.0) < CLIENT_BUSY or workers >= MAX_WORKERS:
                    break
                # The client used a whole core: it, not the server, may have set this level's rate.
                # Measure the level again with the streams spread over more processes.
                workers = min(MAX_WORKERS, workers * 2)
                if pool is not None:
                    pool.close()
                    pool = None
            level.client_processes = workers
            if rate is not None:
                search.record(level, rate)
            result.levels.append(level)
            if on_level is not None and not on_level(level):
                result.pruned = True
                return result
    return result


def run_ladder(url: str, spec: LadderSpec, *, on_level: OnLevel | None = None,
               should_abort: ShouldAbort | None = None) -> LadderResult:
    """Load-test ``url`` up ``spec``'s ladder (blocking; runs its own event loop).

    ``on_level(level)`` is called after each level; False stops the ladder (the study prunes).
    ``should_abort()`` is polled every 50 ms; a returned reason stops the ladder at once.
    """
    return asyncio.run(arun_ladder(url, spec, on_level=on_level, should_abort=should_abort))
