"""The concurrency ladder: closed-loop levels in ascending order, each ending as soon as it can.

GPU time is the budget, so a level stops once its output throughput has converged, and the
ladder stops at once when the server dies (``should_abort``, or connections refused), when
errors pass the threshold, or when ``on_level`` says the trial is not worth finishing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from search.errors import BadInput
from search.loadtest.client import Prompts, Record, stream_one
from search.loadtest.metrics import (
    LevelResult,
    chunks_between,
    from_requests,
    from_window,
    relative_half_width,
)
from search.loadtest.spec import LadderSpec

OnLevel = Callable[[LevelResult], bool]
ShouldAbort = Callable[[], "str | None"]

_TICK_S = 0.05  # how often a level polls should_abort, errors and its clock
_MIN_BINS = 10  # convergence needs at least this many throughput bins
_MIN_FINISHED_FOR_ERROR_RATE = 20


@dataclass
class LadderResult:
    spec: LadderSpec
    levels: list[LevelResult] = field(default_factory=list)
    aborted: str | None = None  # why the ladder stopped early (server died, too many errors)
    aborted_at: int | None = None  # the level that was running then
    pruned: bool = False  # on_level returned False

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
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


async def _model_name(client: httpx.AsyncClient, url: str, spec: LadderSpec) -> str:
    """The served model name from /v1/models (SGLang's OpenAI routes expect it)."""
    if spec.model:
        return spec.model
    try:
        resp = await client.get(url + "/v1/models")
        return str(resp.json()["data"][0]["id"])
    except httpx.ConnectError:
        raise
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return "default"  # not an OpenAI-style server list: SGLang accepts any name


class _Level:
    """One closed-loop level: ``concurrency`` streams, each sending its next request when the last ends."""

    def __init__(self, clients: list[httpx.AsyncClient], url: str, spec: LadderSpec, model: str,
                 concurrency: int, rng: random.Random, should_abort: ShouldAbort | None) -> None:
        self.clients, self.url, self.spec = clients, url, spec
        self.prompts = Prompts(spec, model, rng)
        self.concurrency, self.rng, self.should_abort = concurrency, rng, should_abort
        self.records: list[Record] = []
        self.stop = False
        self.issued = 0
        self.finished = 0  # requests that ended, cancelled ones excluded
        self.failures: Counter[str] = Counter()

    async def _stream(self, client: httpx.AsyncClient) -> None:
        spec = self.spec
        while not self.stop and (spec.requests is None or self.issued < spec.requests):
            self.issued += 1
            body = self.prompts.body()
            record = Record(send=time.perf_counter(), input_tokens=spec.input_len)
            self.records.append(record)
            await stream_one(client, self.url, spec.api, body, record)
            self.finished += 1
            if record.error:
                self.failures[record.error] += 1
            if record.error == "connect":
                return  # the monitor sees it and aborts the level

    def _check(self) -> None:
        """Raise _Abort when the server died or errors passed the threshold."""
        reason = self.should_abort() if self.should_abort else None
        if reason:
            raise _Abort(reason)
        if self.failures["connect"]:
            raise _Abort(f"server died: {_refused(self.url)}")
        failed = sum(self.failures.values())
        if self.finished >= _MIN_FINISHED_FOR_ERROR_RATE and failed > self.spec.max_error_rate * self.finished:
            kinds = ", ".join(f"{k}: {n}" for k, n in sorted(self.failures.items()))
            raise _Abort(f"{failed} of {self.finished} requests failed ({kinds}), over the "
                         f"{self.spec.max_error_rate:.0%} threshold")

    async def run(self) -> LevelResult:
        tasks = [asyncio.create_task(self._stream(c)) for c in self.clients[: self.concurrency]]
        try:
            if self.spec.requests is not None:
                while not all(t.done() for t in tasks):
                    self._check()
                    await asyncio.sleep(_TICK_S)
                self._check()
                return from_requests(self.concurrency, self.records)
            return await self._steady_state()
        finally:
            self.stop = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _steady_state(self) -> LevelResult:
        """Warm up, then measure until the duration is up or the throughput has converged.

        The warm-up lasts ``warmup_s`` and until every stream is decoding (its first request
        has a token), bounded by 3x ``warmup_s`` for a server that queues part of the level.
        """
        spec = self.spec
        assert spec.duration_s is not None
        start = time.perf_counter()
        while True:
            self._check()
            now = time.perf_counter()
            if now - start >= spec.warmup_s and (
                now - start >= 3 * spec.warmup_s
                or len(self.records) >= self.concurrency
                and all(r.chunks or r.end for r in self.records[: self.concurrency])
            ):
                break
            await asyncio.sleep(_TICK_S)
        t0 = time.perf_counter()
        bin_s = min(5.0, max(0.2, spec.duration_s / 30))
        bins: list[int] = []
        ci = float("inf")
        while True:
            await asyncio.sleep(_TICK_S)
            self._check()
            now = time.perf_counter()
            while now >= t0 + (len(bins) + 1) * bin_s:
                a = t0 + len(bins) * bin_s
                bins.append(chunks_between(self.records, a, a + bin_s))
                ci = relative_half_width(bins)
            if now - t0 >= spec.duration_s:
                return from_window(self.concurrency, self.records, t0, now,
                                   converged=ci < spec.converge_ci, output_throughput_ci=_finite(ci))
            if len(bins) >= _MIN_BINS and ci < spec.converge_ci:
                t1 = t0 + len(bins) * bin_s  # end on a bin boundary: the window the CI describes
                return from_window(self.concurrency, self.records, t0, t1, converged=True,
                                   ended_early=True, output_throughput_ci=ci)


def _finite(x: float) -> float | None:
    return x if x != float("inf") else None


async def arun_ladder(url: str, spec: LadderSpec, *, on_level: OnLevel | None = None,
                      should_abort: ShouldAbort | None = None) -> LadderResult:
    """Run the ladder; the async core of :func:`run_ladder`."""
    url = url.rstrip("/")
    result = LadderResult(spec=spec)
    rng = random.Random(spec.seed)
    # One keep-alive connection per stream, each in its own client: httpcore's pool scans every
    # connection on each request and response (O(pool) per event; at 512 streams in one pool
    # 30M is_idle() calls for 1,024 requests), so a shared pool of 1,024 would be the bottleneck.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    timeout = httpx.Timeout(spec.request_timeout_s, connect=10.0, pool=None)
    ssl = httpx.create_ssl_context()  # built once: a context per client costs milliseconds each
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=timeout, verify=ssl))
                   for _ in range(max(spec.concurrency))]
        try:
            model = await _model_name(clients[0], url, spec)
        except httpx.ConnectError:
            result.aborted, result.aborted_at = f"server died: {_refused(url)}", spec.concurrency[0]
            return result
        for concurrency in spec.concurrency:
            try:
                level = await _Level(clients, url, spec, model, concurrency, rng, should_abort).run()
            except _Abort as exc:
                result.aborted, result.aborted_at = str(exc), concurrency
                return result
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
