"""The load-test client's own ceiling: streamed chunks/s it consumes from a server that answers at once.

Starts a minimal SSE server in a child process (a raw asyncio protocol that answers every
/v1/completions with a precomputed stream of ``max_tokens`` one-token chunks plus the usage
chunk, so the server costs next to nothing; ``--interval-ms`` paces each stream so that every
client read carries one event, as against a real server), then runs ``search.loadtest`` against it at
several concurrencies, in one client process and spread over worker processes, and prints
chunks/s, the client's CPU use and the machine's 1-minute load average after each run.

    python scripts/bench_client.py [--output-len 512] [--requests 2000] [--concurrency 64,256,1024] [--interval-ms 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import resource
import socket
import time
from collections.abc import Iterator

from search.loadtest import LadderSpec, run_ladder


def _sse_body(n: int, usage: bool) -> bytes:
    """n one-token chunks, the usage chunk when asked for (as SGLang does), then [DONE]."""
    chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": " a", "finish_reason": None}]}
    last = {"id": "x", "object": "text_completion", "choices": [],
            "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}}
    tail = f"data: {json.dumps(last)}\n\n" if usage else ""
    return (f"data: {json.dumps(chunk)}\n\n" * n + tail + "data: [DONE]\n\n").encode()


class _Instant(asyncio.Protocol):
    """HTTP/1.1 keep-alive; answers each request with its SSE stream, in one write when
    ``interval`` is 0, else one chunk per ``interval`` seconds per stream (as a real server
    paces tokens, so that each client read carries one event)."""

    cache: dict[tuple[int, bool], bytes] = {}
    interval = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, rest = self.buf.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            body, self.buf = rest[:length], rest[length:]
            if head.startswith(b"GET"):
                payload, ctype = b'{"object":"list","data":[{"id":"instant"}]}', b"application/json"
            else:
                req = json.loads(body)
                key = (int(req.get("max_tokens", 16)), bool((req.get("stream_options") or {}).get("include_usage")))
                if key not in self.cache:
                    self.cache[key] = _sse_body(*key)
                payload, ctype = self.cache[key], b"text/event-stream"
            head = (b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ncontent-length: "
                    + str(len(payload)).encode() + b"\r\n\r\n")
            if self.interval and ctype == b"text/event-stream":
                self.transport.write(head)
                asyncio.get_running_loop().create_task(self._paced(payload))
            else:
                self.transport.write(head + payload)

    async def _paced(self, payload: bytes) -> None:
        events = payload.split(b"\n\n")[:-1]
        for event in events:
            self.transport.write(event + b"\n\n")
            await asyncio.sleep(self.interval)


def serve(sock: socket.socket, interval: float = 0.0) -> None:
    """Child process: serve the SSE server on an already bound socket."""
    _Instant.interval = interval

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Instant, sock=sock, backlog=4096)
        await server.serve_forever()
    asyncio.run(main())


@contextlib.contextmanager
def instant_server(interval_s: float = 0.0) -> Iterator[str]:
    """The instant SSE server in a child process; yields its URL, kills it on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    server = mp.Process(target=serve, args=(sock, interval_s), daemon=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.kill()
        sock.close()


def _cpu() -> float:
    """CPU seconds of this process and of the children it has reaped (the load-test workers)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def run_client(url: str, concurrency: int, requests: int, output_len: int, processes: int) -> dict[str, float]:
    """chunks/s with the streams in ``processes`` processes: the product's own worker path
    (``LadderSpec.workers``); the rate is over the level (first send to last end), not the
    workers' start-up."""
    spec = LadderSpec(concurrency=(concurrency,), input_len=16, output_len=output_len, duration_s=None,
                      requests=requests, workers=processes)
    cpu = _cpu()
    start = time.perf_counter()
    level = run_ladder(url, spec).levels[0]
    wall = time.perf_counter() - start
    cpu = _cpu() - cpu
    tokens = level.total_output_tokens
    return {"chunks_per_s": tokens / level.duration, "client_cpu_s": cpu, "wall_s": wall,
            "cpu_us_per_chunk": 1e6 * cpu / tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", default="64,256,1024")
    ap.add_argument("--interval-ms", type=float, default=0.0,
                    help="pace each stream at one chunk per interval (0: whole stream in one write)")
    args = ap.parse_args()
    with instant_server(args.interval_ms / 1000) as url:
        # CPU per chunk is the robust figure on a shared machine: 1e6 / it is the chunks/s one
        # client process sustains on one core.
        print(f"{'concurrency':>11} {'processes':>9} {'chunks/s':>10} {'client CPU s':>12} {'wall s':>7} "
              f"{'CPU us/chunk':>12} {'ceiling/core':>12} {'load':>5}")
        for c in (int(x) for x in args.concurrency.split(",")):
            for processes in (1, 2):
                r = run_client(url, c, args.requests, args.output_len, processes)
                print(f"{c:>11} {processes:>9} {r['chunks_per_s']:>10,.0f} {r['client_cpu_s']:>12.1f} "
                      f"{r['wall_s']:>7.1f} {r['cpu_us_per_chunk']:>12.1f} {1e6 / r['cpu_us_per_chunk']:>12,.0f} "
                      f"{os.getloadavg()[0]:>5.1f}", flush=True)


if __name__ == "__main__":
    main()
