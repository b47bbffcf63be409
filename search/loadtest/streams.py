"""A level's closed-loop streams, in this process or spread over worker processes.

One process spends about 33 us of CPU per streamed chunk when each read brings one event, as
from a real server (~30,000 chunks/s per core), and about 3.4 us when reads bring many, as
from a server that writes whole streams at once (230,000-255,000 chunks/s measured; BENCHMARKS.md,
client ceiling): plenty for the seed's 4,000 tok/s, about a core for an 8-GPU server streaming
30,000 tokens/s one token per chunk. Past that the client, not the server, would set the
measured rate, so a level's streams can run in worker processes, each with its own event loop
and connections. Their
records are mirrored into the parent as they grow (every ``FLUSH_S``), so the ladder's windows,
convergence test and abort checks read one list of records either way. No library spreads one
asyncio load over processes while keeping per-chunk timestamps, hence the pipes below;
``time.perf_counter`` is the system's monotonic clock on Linux, the same in every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

import aiohttp

from search.loadtest.client import Prompts, Record, stream_one
from search.loadtest.spec import LadderSpec

FLUSH_S = 0.05  # how often a worker sends what its records gained
_START_TIMEOUT_S = 60.0  # a worker that does not answer by then is broken


def make_session(spec: LadderSpec) -> aiohttp.ClientSession:
    """The one HTTP client of a process: keep-alive connections up to the ladder's top level.

    aiohttp, as ``sglang.bench_serving`` uses: on one core it spends about a fifth of httpx's CPU
    per request and a third per chunk (BENCHMARKS.md, load test), and a wave of requests (a
    level's start, or a closed loop whose requests end together) is sent one after another
    through this one event loop, so that cost lands in every request's TTFT.
    """
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=spec.request_timeout_s)
    limit = 0 if spec.open_loop else max(spec.concurrency)  # an open loop has as many in flight as the server keeps
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), timeout=timeout)


class Source(Protocol):
    """What a level reads while its streams run, wherever they run."""

    records: list[Record]
    finished: int  # requests that ended, cancelled ones excluded
    failures: Counter[str]
    lag: float  # how far behind now the records may be

    async def sync(self) -> None: ...  # bring the records up to date

    def done(self) -> bool: ...  # every stream has stopped (a --requests level is through)

    async def close(self) -> float: ...  # stop every stream; the busiest process's CPU share of a core


class Streams:
    """``concurrency`` streams in this process, each sending its next request when the last ends.

    ``requests`` (None: until closed) is the number of requests to issue in all.
    """

    lag = 0.0

    def __init__(self, session: aiohttp.ClientSession, url: str, spec: LadderSpec, prompts: Prompts,
                 concurrency: int, requests: int | None) -> None:
        self.url, self.spec, self.prompts, self.requests = url, spec, prompts, requests
        self.records: list[Record] = []
        self.issued = 0
        self.finished = 0
        self.failures: Counter[str] = Counter()
        self.stop = False
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self.session = session
        self.tasks = self._start(concurrency)

    def _start(self, concurrency: int) -> list[asyncio.Task[Any]]:
        return [asyncio.create_task(self._stream()) for _ in range(concurrency)]

    async def _stream(self) -> None:
        while not self.stop and (self.requests is None or self.issued < self.requests):
            self.issued += 1
            if await self._one() == "connect":
                return  # the level's check sees it and aborts

    async def _one(self) -> str | None:
        """Send the workload's next request and wait for its end; its error kind, if any."""
        body, input_len, output_len = self.prompts.next()
        record = Record(send=time.perf_counter(), input_tokens=input_len)
        self.records.append(record)
        await stream_one(self.session, self.url, self.spec.api, body, record, output_len)
        self.finished += 1
        if record.error:
            self.failures[record.error] += 1
        return record.error

    async def sync(self) -> None:
        return None

    def done(self) -> bool:
        return all(t.done() for t in self.tasks)

    async def close(self) -> float:
        self.stop = True
        tasks = list(self.tasks)  # an open loop's sender may have added some
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return (time.process_time() - self._cpu0) / max(time.perf_counter() - self._wall0, 1e-9)


class Arrivals(Streams):
    """An open-loop level: requests sent at ``rate`` per second whatever the server's speed.

    Gaps between sends are gamma-distributed with shape ``burstiness`` and mean ``1 / rate``
    (``burstiness`` 1 is Poisson, exponential gaps: bench_serving's ``--request-rate``; below 1
    burstier, above 1 more regular, as bench_serving's and vLLM's ``--burstiness``), on an absolute
    clock so a slow event loop does not lower the rate; or at the spec's ``schedule`` of send times.
    Every request runs as its own task.
    """

    def __init__(self, session: aiohttp.ClientSession, url: str, spec: LadderSpec, prompts: Prompts,
                 rate: float, requests: int | None, rng: random.Random) -> None:
        self.rate, self.rng = rate, rng
        super().__init__(session, url, spec, prompts, 1, requests)

    def _start(self, concurrency: int) -> list[asyncio.Task[Any]]:
        return [asyncio.create_task(self._send())]

    async def _send(self) -> None:
        shape, schedule = self.spec.burstiness, self.spec.schedule
        due = time.perf_counter()
        while not self.stop and (self.requests is None or self.issued < self.requests):
            if schedule is not None and self.issued >= len(schedule):
                return
            self.issued += 1
            self.tasks.append(asyncio.create_task(self._one()))
            if schedule is None:
                gap = self.rng.gammavariate(shape, 1.0 / (self.rate * shape))
            elif self.issued < len(schedule):
                gap = schedule[self.issued] - schedule[self.issued - 1]
            else:
                return
            if self.spec.sleep_after_send:
                await asyncio.sleep(gap)
            else:
                due += gap
                await asyncio.sleep(max(0.0, due - time.perf_counter()))


# --------------------------------------------------------------------------- worker processes


@dataclass(slots=True)
class _Delta:
    """What one record gained since the last flush."""

    key: int
    send: float
    input_tokens: int
    chunks: list[float]
    counts: list[int]
    exact: bool  # False: the record switched to characters; ``counts`` is then whole at the switch
    end: float | None
    output_tokens: int | None
    error: str | None


def _worker_main(conn: Connection, url: str, spec: LadderSpec, model: str, seed: int) -> None:
    """A worker: runs the streams it is told to, sending record deltas, until told to quit."""
    asyncio.run(_worker(conn, url, spec, model, seed))


async def _worker(conn: Connection, url: str, spec: LadderSpec, model: str, seed: int) -> None:
    rng = random.Random(seed)
    async with make_session(spec) as session:
        conn.send(("ready",))
        while True:
            command = conn.recv()  # idle between levels: nothing else runs here
            if command[0] == "quit":
                return
            if command[0] != "run":
                continue  # a "stop" for a level whose streams had already ended
            _, concurrency, requests = command
            streams = Streams(session, url, spec, Prompts(spec, model, rng), concurrency, requests)
            outbox = _Outbox(streams.records)
            told = None
            while not streams.done():
                await asyncio.sleep(FLUSH_S)
                outbox.flush(conn)
                if conn.poll(0):
                    told = conn.recv()[0]
                    break
            cpu = await streams.close()
            outbox.flush(conn)
            conn.send(("stopped", cpu))
            if told == "quit":
                return


class _Outbox:
    """Sends what each record gained since the last flush; a record that ended is sent no more."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.sent: list[int] = []  # chunks already sent per record, -1 before its first delta
        self.ended: list[bool] = []
        self.exact: list[bool] = []  # what the receiver has: exact counts (see Record.add_chunk)

    def flush(self, conn: Connection) -> None:
        deltas = []
        for key, r in enumerate(self.records):
            if key == len(self.sent):
                self.sent.append(-1)
                self.ended.append(False)
                self.exact.append(True)
            if self.ended[key] or (self.sent[key] == len(r.chunks) and r.end is None):
                continue
            start = max(self.sent[key], 0)
            # The switch to characters rewrites the earlier counts: send them whole once.
            counts = r.counts if self.exact[key] and not r.exact else r.counts[start:]
            self.exact[key] = r.exact
            deltas.append(_Delta(key, r.send, r.input_tokens, r.chunks[start:], counts, r.exact, r.end,
                                 r.output_tokens, r.error))
            self.sent[key], self.ended[key] = len(r.chunks), r.end is not None
        if deltas:
            conn.send(("delta", deltas))


class Workers:
    """Worker processes for a whole ladder; each level gets a :class:`RemoteStreams` on them."""

    def __init__(self, n: int, url: str, spec: LadderSpec, model: str, seed: int) -> None:
        context = multiprocessing.get_context("spawn")  # the driver may hold threads: never fork it
        self.conns: list[Connection] = []
        self.procs = []
        for i in range(n):
            parent, child = context.Pipe()
            proc = context.Process(target=_worker_main, args=(child, url, spec, model, seed * 1000 + i),
                                   daemon=True, name=f"search-loadtest-{i}")
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            if not conn.poll(_START_TIMEOUT_S):
                self.close()
                raise RuntimeError("a load-test worker process did not start")
            conn.recv()

    def level(self, concurrency: int, requests: int | None) -> RemoteStreams:
        return RemoteStreams(self.conns, concurrency, requests)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("quit",))
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()


def _shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal whole shares."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class RemoteStreams:
    """A level's streams spread over the workers, mirrored into ``records``."""

    lag = 2 * FLUSH_S

    def __init__(self, conns: list[Connection], concurrency: int, requests: int | None) -> None:
        self.conns = [c for c, share in zip(conns, _shares(concurrency, len(conns)), strict=True) if share]
        self.records: list[Record] = []
        self.finished = 0
        self.failures: Counter[str] = Counter()
        self._mirror: dict[tuple[int, int], Record] = {}
        self._stopped: dict[int, float] = {}  # worker -> its CPU share
        request_shares = _shares(requests, len(self.conns)) if requests is not None else [None] * len(self.conns)
        for conn, share, budget in zip(self.conns, _shares(concurrency, len(self.conns)), request_shares, strict=True):
            conn.send(("run", share, budget))

    def _apply(self, worker: int, message: tuple[Any, ...]) -> None:
        if message[0] == "stopped":
            self._stopped[worker] = float(message[1])
            return
        for d in message[1]:
            record = self._mirror.get((worker, d.key))
            if record is None:
                record = self._mirror[(worker, d.key)] = Record(send=d.send, input_tokens=d.input_tokens)
                self.records.append(record)
            record.chunks.extend(d.chunks)
            if record.exact and not d.exact:
                record.counts, record.exact = d.counts, False
            else:
                record.counts.extend(d.counts)
            record.input_tokens, record.output_tokens, record.error = d.input_tokens, d.output_tokens, d.error
            if d.end is not None and record.end is None:
                record.end = d.end
                if d.error != "cancelled":  # still running when the level ended: not a request's end
                    self.finished += 1
                    if d.error:
                        self.failures[d.error] += 1

    async def sync(self) -> None:
        for worker, conn in enumerate(self.conns):
            while worker not in self._stopped and conn.poll(0):
                self._apply(worker, conn.recv())

    def done(self) -> bool:
        return len(self._stopped) == len(self.conns)

    async def close(self) -> float:
        for worker, conn in enumerate(self.conns):
            if worker not in self._stopped:
                conn.send(("stop",))
        loop = asyncio.get_running_loop()
        for worker, conn in enumerate(self.conns):
            while worker not in self._stopped:
                if not await loop.run_in_executor(None, conn.poll, _START_TIMEOUT_S):
                    raise RuntimeError("a load-test worker process stopped answering")
                self._apply(worker, conn.recv())
        return max(self._stopped.values(), default=0.0)
