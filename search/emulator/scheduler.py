"""Token pacing: the landscape's aggregate rate shared by the running requests, one central ticker.

All decoding requests advance together (a decode step gives each one token), so one number,
the virtual step count V, says how far every request is: request r has produced
`V - r.start_v + 1` tokens. The ticker advances V at `throughput(running) / running` steps per
second and wakes only the requests whose next `--stream-interval` chunk is due (a heap keyed by
the V at which it is). Cost is per delivered chunk, not per request per tick, which is what
keeps 1,024 streams at the modelled rate on two cores.

Prefill runs one batch at a time, as SGLang's scheduler forms them (``schedule_policy.py``,
``PrefillAdder``): when the last batch is done, the waiting queue is ordered by the schedule
policy, each request's cached prefix is looked up in the radix cache (``radix.py``; none with
``--disable-radix-cache``), and requests join the batch until its token budget
(``--chunked-prefill-size``, else ``--max-prefill-tokens``) is spent; the one that does not fit
is chunked and goes on in the next batch. A batch takes its uncached tokens over the prefill rate
(plus a per-batch overhead, both the landscape's); at its end its prompts enter the cache and its
requests join the decode batch with their first token. So a request's TTFT is its wait in the
queue (behind the running cap and earlier batches) plus its batch, and shared prefixes cost only
their first prefill.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Callable

from search.emulator.radix import RadixCache

# Prefill throughput (input tokens/s) of the emulated machine: TTFT = queueing + uncached prompt / this.
PREFILL_TOKENS_PER_S = 40_000.0
# schedule_policy.py (0.5.23): LPM sorts the queue only up to this many waiting requests
# (WAITING_QUEUE_PREFIX_MATCH_MAX, line 137), and among requests with at most
# IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD cached tokens defers those sharing at least
# IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD tokens with one already ahead (lines 110-118, 346-396).
LPM_QUEUE_MAX = 128
IN_BATCH_CHECK = 32
IN_BATCH_DEPRIORITIZE = 32
_MAX_SLEEP_S = 0.05
_MIN_SLEEP_S = 0.002
_NOISE_PERIOD_S = 1.0


@dataclass(frozen=True)
class Prefill:
    """How prefill batches form and what they cost (the launch flags and the landscape's figures)."""

    tokens_per_s: float = PREFILL_TOKENS_PER_S
    batch_overhead_s: float = 0.0
    budget: int = 16384  # new tokens per batch: --chunked-prefill-size, else --max-prefill-tokens
    chunked: bool = True  # a request over the budget is split (else it runs alone in a batch)
    policy: str = "fcfs"  # --schedule-policy
    radix_cache: bool = True  # not --disable-radix-cache


class Request:
    __slots__ = ("prompt_tokens", "target", "start_v", "emitted", "state", "waiter", "arrived",
                 "first_token_at", "last_token_at", "finish_reason", "key", "cached", "remaining")

    def __init__(self, prompt_tokens: int, target: int, finish_reason: str,
                 key: Sequence[Hashable] = ()) -> None:
        self.prompt_tokens = prompt_tokens
        self.key = key  # the prompt's tokens, as the radix cache matches them
        self.cached = 0  # prompt tokens found in the cache when its prefill began
        self.remaining = 0  # prompt tokens still to prefill (a chunked request)
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
                 on_prefill: Callable[[int, int, int, int, int, float, float], None],
                 on_decode: Callable[[int, int, int, float, float], None], record: bool,
                 prefill: Prefill | None = None) -> None:
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
        self.prefill = prefill or Prefill()
        policy = self.prefill.policy
        # schedule_policy.py _validate_and_adjust_policy: cache-aware policies fall back to FCFS without the cache.
        self.policy = "fcfs" if not self.prefill.radix_cache and policy in ("lpm", "dfs-weight") else policy
        self.cache = RadixCache(kv_tokens) if self.prefill.radix_cache else None
        self.batch_busy = False  # a prefill batch is running
        self.chunked_req: Request | None = None  # the request whose prompt goes on in the next batch
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
            if self.chunked_req is req:
                self.chunked_req = None
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
        """Form the next prefill batch, unless one is running (its end calls this again)."""
        if self.batch_busy or self.cap <= 0:
            return
        budget = self.prefill.budget
        batch: list[Request] = []
        new = cached = 0
        if self.chunked_req is not None:  # a chunked prompt goes first, as SGLang's chunked_req
            req = self.chunked_req
            take = min(req.remaining, budget) if self.prefill.chunked else req.remaining
            req.remaining -= take
            budget -= take
            new += take
            batch.append(req)
            if req.remaining == 0:
                self.chunked_req = None
        if self.chunked_req is None:
            self._order_queue()
        while self.chunked_req is None and self.queue and self.num_running < self.cap and budget > 0:
            req = self.queue[0]
            match = self._match(req)
            need = req.prompt_tokens - match
            if need > budget and not self.prefill.chunked and batch:
                break  # does not fit: the next batch
            self.queue.popleft()
            req.state, req.cached = "prefill", match
            self.prefilling += 1
            take = min(need, budget) if self.prefill.chunked else need
            req.remaining = need - take
            budget -= take
            new += take
            cached += match
            batch.append(req)
            if req.remaining:
                self.chunked_req = req
        if not batch:
            return
        self.batch_busy = True
        seconds = self.prefill.batch_overhead_s + new / self.prefill.tokens_per_s
        asyncio.get_running_loop().call_later(seconds, self._batch_done, batch)
        elapsed = now - self.prefill_logged_at
        self.prefill_logged_at = now
        self.on_prefill(len(batch), new, cached, self.num_running, len(self.queue), self.token_usage(),
                        new / elapsed if elapsed > 0 else 0.0)

    def _match(self, req: Request) -> int:
        """Cached prompt tokens; at least one token is always computed (SGLang matches input_len - 1)."""
        if self.cache is None or not req.key:
            return 0
        return min(self.cache.match(req.key), req.prompt_tokens - 1, len(req.key) - 1)

    def _order_queue(self) -> None:
        """The waiting queue in the schedule policy's order (schedule_policy.py calc_priority)."""
        policy, queue = self.policy, self.queue
        if len(queue) < 2:
            return
        if policy in ("lpm", "dfs-weight") and len(queue) <= LPM_QUEUE_MAX and self.cache is not None:
            ahead = RadixCache(sum(len(r.key) for r in queue) + 1)  # the in-batch check's own tree
            ranked = []
            for i, req in enumerate(queue):
                match = self._match(req)
                deferred = False
                if match <= IN_BATCH_CHECK and req.key:
                    if ahead.match(req.key) >= IN_BATCH_DEPRIORITIZE:
                        deferred = True
                    else:
                        ahead.insert(req.key)
                ranked.append((deferred, -match, i, req))
            ranked.sort(key=lambda item: item[:3])
            self.queue = deque(item[3] for item in ranked)
        elif policy == "lof":
            self.queue = deque(sorted(queue, key=lambda r: -r.target))
        elif policy == "random":
            items = list(queue)
            self.random.shuffle(items)
            self.queue = deque(items)

    def _batch_done(self, batch: list[Request]) -> None:
        """A prefill batch ended: its complete prompts enter the cache and start decoding."""
        self.batch_busy = False
        now = time.monotonic()
        self._advance(now)
        for req in batch:
            if req.state != "prefill" or req.remaining:
                continue  # aborted meanwhile, or a chunk of a prompt that goes on
            if self.cache is not None and req.key:
                self.cache.insert(req.key)
            self._join(req, now)
        self.wake.set()

    def _join(self, req: Request, now: float) -> None:
        """Prefill done: the request joins the decode batch with its first token."""
        self.prefilling -= 1
        if req.target == 0:
            self._finish(req, now)
            return
        req.state = "running"
        req.start_v = self.v
        req.first_token_at = now
        self.running.add(req)
        self._emit(req, 1, now)

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
