"""Token pacing: the landscape's aggregate rate shared by the running requests, one central ticker.

All decoding requests advance together (a decode step gives each one token), so one number,
the virtual step count V, says how far every request is: request r has produced
`V - r.start_v + 1` tokens. The ticker advances V at `throughput(running) / running` steps per
second and wakes only the requests whose next `--stream-interval` chunk is due (a heap keyed by
the V at which it is). Cost is per delivered chunk, not per request per tick, which is what
keeps 1,024 streams at the modelled rate on two cores.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import time
from collections import deque
from typing import Callable

# Prefill throughput (input tokens/s) of the emulated machine: TTFT = queueing + prompt / this.
PREFILL_TOKENS_PER_S = 40_000.0
_MAX_SLEEP_S = 0.05
_MIN_SLEEP_S = 0.002
_NOISE_PERIOD_S = 1.0


class Request:
    __slots__ = ("prompt_tokens", "target", "start_v", "emitted", "state", "waiter", "arrived",
                 "first_token_at", "last_token_at", "finish_reason")

    def __init__(self, prompt_tokens: int, target: int, finish_reason: str) -> None:
        self.prompt_tokens = prompt_tokens
        self.target = target  # 0: prefill only (max_new_tokens 0), finished without a token
        self.finish_reason = finish_reason
        self.start_v = 0.0
        self.emitted = 0
        self.state = "queued"  # queued | prefill | running | done | aborted
        self.waiter: asyncio.Future[None] | None = None
        self.arrived = time.monotonic()
        self.first_token_at = 0.0
        self.last_token_at = 0.0


class Stats:
    """Cumulative counts the log lines, /metrics and /server_info report."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        self.last_gen_throughput = 0.0
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.e2e: list[float] = []


class Scheduler:
    def __init__(self, rate: Callable[[int], float], cap: int, stream_interval: int, kv_tokens: int,
                 noise: float, seed: int | None, log_interval: int,
                 on_prefill: Callable[[int, int, int, int, float, float], None],
                 on_decode: Callable[[int, int, int, float, float], None], record: bool) -> None:
        self.rate = rate
        self.cap = cap
        self.stream_interval = max(1, stream_interval)
        self.kv_tokens = kv_tokens
        self.noise = noise
        self.random = random.Random(seed)
        self.server_noise = self.random.gauss(0.0, noise) if noise else 0.0
        self.log_interval = max(1, log_interval)
        self.on_prefill, self.on_decode, self.record = on_prefill, on_decode, record
        self.queue: deque[Request] = deque()
        self.running: set[Request] = set()
        self.prefilling = 0
        self.heap: list[tuple[float, int, Request]] = []
        self.order = itertools.count()
        self.v = 0.0
        self.last_t = 0.0
        self.factor = 1.0
        self.factor_until = 0.0
        self.prefill_free_at = 0.0
        self.prefill_logged_at = time.monotonic()
        self.stats = Stats()
        self.logged_tokens = 0
        self.logged_at = time.monotonic()
        self.next_log_v = float(self.log_interval)
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    # --- public API -----------------------------------------------------------------------
    def start(self) -> None:
        self.last_t = time.monotonic()
        self.task = asyncio.get_running_loop().create_task(self._tick_forever())

    def submit(self, req: Request) -> None:
        self.stats.requests += 1
        self.stats.prompt_tokens += req.prompt_tokens
        self.queue.append(req)
        self.wake.set()

    async def wait(self, req: Request) -> None:
        """Until more of req's tokens are out (or it ended)."""
        if req.state in ("done", "aborted"):
            return
        req.waiter = asyncio.get_running_loop().create_future()
        await req.waiter

    def abort(self, req: Request) -> None:
        """Client went away: free the slot now (heap entries of an aborted request are skipped)."""
        if req.state == "queued":
            try:
                self.queue.remove(req)
            except ValueError:
                pass
        elif req.state == "prefill":
            self.prefilling -= 1
        elif req.state == "running":
            self._advance(time.monotonic())
            self.running.discard(req)
        if req.state != "done":
            req.state = "aborted"
            self.wake.set()

    def freeze(self) -> None:
        """A rank died: no decode step or prefill completes any more (the others wait on it)."""
        self.rate = lambda _running: 0.0
        self.cap = 0

    @property
    def num_running(self) -> int:
        return len(self.running) + self.prefilling

    def token_usage(self) -> float:
        return min(1.0, self.used_tokens() / self.kv_tokens) if self.kv_tokens else 0.0

    def used_tokens(self) -> int:
        return sum(r.prompt_tokens + int(self.v - r.start_v) + 1 for r in self.running)

    def current_rate(self) -> float:
        n = len(self.running)
        return self.rate(n) * self.factor if n else 0.0

    # --- ticker ---------------------------------------------------------------------------
    async def _tick_forever(self) -> None:
        while True:
            now = time.monotonic()
            self._advance(now)
            self._deliver(now)
            self._admit(now)
            self._maybe_log(now)
            delay = self._next_delay()
            if delay is None:
                self.wake.clear()
                await self.wake.wait()
            else:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), delay)
                except asyncio.TimeoutError:
                    pass

    def _advance(self, now: float) -> None:
        dt = now - self.last_t
        self.last_t = now
        n = len(self.running)
        if n and dt > 0:
            if self.noise and now >= self.factor_until:
                self.factor = max(0.05, 1.0 + self.server_noise + self.random.gauss(0.0, self.noise / 2))
                self.factor_until = now + _NOISE_PERIOD_S
            self.v += self.rate(n) * self.factor / n * dt

    def _deliver(self, now: float) -> None:
        heap, v = self.heap, self.v
        while heap and heap[0][0] <= v + 1e-9:
            _, _, req = heapq.heappop(heap)
            if req.state != "running":
                continue
            produced = min(req.target, int(v - req.start_v + 1e-9) + 1)
            self._emit(req, produced, now)

    def _emit(self, req: Request, produced: int, now: float) -> None:
        new = produced - req.emitted
        if new <= 0:
            return
        self.stats.generation_tokens += new
        if self.record:
            if req.emitted == 0:
                self.stats.ttft.append(now - req.arrived)
            else:
                self.stats.itl.append((now - req.last_token_at) / new)
        req.emitted = produced
        req.last_token_at = now
        if produced >= req.target:
            self._finish(req, now)
            return
        nxt = req.start_v + min(produced + self.stream_interval, req.target) - 1
        heapq.heappush(self.heap, (nxt, next(self.order), req))
        self._notify(req)

    def _finish(self, req: Request, now: float) -> None:
        req.state = "done"
        self.running.discard(req)
        if self.record:
            self.stats.e2e.append(now - req.arrived)
        self.wake.set()
        self._notify(req)

    @staticmethod
    def _notify(req: Request) -> None:
        if req.waiter is not None and not req.waiter.done():
            req.waiter.set_result(None)

    def _admit(self, now: float) -> None:
        seqs = tokens = 0
        loop = asyncio.get_running_loop()
        while self.queue and self.num_running < self.cap:
            req = self.queue.popleft()
            req.state = "prefill"
            self.prefilling += 1
            self.prefill_free_at = max(now, self.prefill_free_at) + req.prompt_tokens / PREFILL_TOKENS_PER_S
            loop.call_later(self.prefill_free_at - now, self._join, req)
            seqs += 1
            tokens += req.prompt_tokens
        if seqs:
            elapsed = now - self.prefill_logged_at
            self.prefill_logged_at = now
            self.on_prefill(seqs, tokens, self.num_running, len(self.queue), self.token_usage(),
                            tokens / elapsed if elapsed > 0 else 0.0)

    def _join(self, req: Request) -> None:
        """Prefill done: the request joins the decode batch with its first token."""
        if req.state != "prefill":
            return
        now = time.monotonic()
        self._advance(now)
        self.prefilling -= 1
        if req.target == 0:
            self._finish(req, now)
            return
        req.state = "running"
        req.start_v = self.v
        req.first_token_at = now
        self.running.add(req)
        self._emit(req, 1, now)
        self.wake.set()

    def _next_delay(self) -> float | None:
        while self.heap and self.heap[0][2].state != "running":
            heapq.heappop(self.heap)
        if not self.heap:
            return None if not self.running else _MAX_SLEEP_S
        step_rate = self.current_rate() / len(self.running) if self.running else 0.0
        if step_rate <= 0:
            return _MAX_SLEEP_S
        return min(_MAX_SLEEP_S, max(_MIN_SLEEP_S, (self.heap[0][0] - self.v) / step_rate))

    def _maybe_log(self, now: float) -> None:
        if self.v < self.next_log_v or not self.running:
            return
        self.next_log_v = (math.floor(self.v / self.log_interval) + 1) * self.log_interval
        elapsed = now - self.logged_at
        rate = (self.stats.generation_tokens - self.logged_tokens) / elapsed if elapsed > 0 else 0.0
        self.logged_tokens, self.logged_at = self.stats.generation_tokens, now
        self.stats.last_gen_throughput = rate
        self.on_decode(len(self.running), self.used_tokens(), len(self.queue), self.token_usage(), rate)
