"""A streaming server whose rates are known exactly: the load test's reference.

Each request gets its first token ``--ttft`` seconds after it arrives (plus ``--ttft-step`` for
each request that arrived before it: a prefill queue), then a chunk of
``--chunk-tokens`` tokens every ``chunk_tokens / per_stream_rate`` seconds, on an absolute
schedule (no drift), until ``max_tokens``. So with C streams all decoding, the true output rate
is ``C * per_stream_rate`` tok/s, TPOT is ``1 / per_stream_rate`` and ITL the chunk period,
whatever the client reports. ``--lockstep`` puts every stream's chunks on one global clock, as a
decode batch streams in step (a cohort); ``--no-running-usage`` ignores ``continuous_usage_stats``
(a server that gives usage only at the end). Each token is the 4 characters " tok". A prompt
counts its token ids, or the words of its text. ``--record FILE`` appends every request's JSON
body to FILE, one a line, so a test reads what the server really received.

It serves /v1/completions, /v1/chat/completions and /generate as SGLang shapes them, /v1/models
(with ``max_model_len``) and /health. Run: ``python -m tests.loadtest.clock_server --port P ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
from typing import Any

from aiohttp import web

TOKEN = " tok"


def _chunk(api: str, tokens: int, total: int, prompt: int, running_usage: bool, finish: str | None) -> bytes:
    text = TOKEN * tokens
    if api == "generate":  # meta_info carries the running count in every chunk (text is cumulative)
        data: dict[str, Any] = {"text": TOKEN * total, "meta_info": {
            "prompt_tokens": prompt, "completion_tokens": total,
            "finish_reason": {"type": finish} if finish else None}}
    else:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if api == "chat":
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        data = {"object": "text_completion", "choices": [choice], "usage": None}
        if running_usage:
            data["usage"] = {"prompt_tokens": prompt, "completion_tokens": total, "total_tokens": prompt + total}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _prompt_tokens(body: dict[str, Any]) -> int:
    """Token ids count one each, text one a word (chat: every message's)."""
    prompt = body.get("input_ids") or body.get("prompt") or body.get("text")
    if prompt is None:
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


def make_app(per_stream_rate: float, chunk_tokens: int, ttft: float, ttft_step: float, lockstep: bool,
             running_usage: bool, record: str | None = None) -> web.Application:
    period = chunk_tokens / per_stream_rate
    arrivals = itertools.count()
    epoch: list[float] = []  # lockstep: the first arrival, where the global chunk clock starts

    def now() -> float:
        return asyncio.get_running_loop().time()

    async def stream(request: web.Request, api: str) -> web.StreamResponse:
        arrived = now()
        body = await request.json()
        if record:
            with open(record, "a") as log:
                log.write(json.dumps(body) + "\n")
        n = int(body["sampling_params"]["max_new_tokens"] if api == "generate" else body["max_tokens"])
        prompt = _prompt_tokens(body)
        options = body.get("stream_options") or {}
        running = running_usage and bool(options.get("continuous_usage_stats"))
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        first = arrived + ttft + next(arrivals) * ttft_step  # a prefill queue: each waits for those before
        if lockstep:
            if not epoch:
                epoch.append(arrived)
            first = epoch[0] + math.ceil((first - epoch[0]) / period) * period
        sent, i = 0, 0
        while sent < n:
            due = first + i * period
            delay = due - now()
            if delay > 0:
                await asyncio.sleep(delay)
            tokens = 1 if i == 0 else min(chunk_tokens, n - sent)
            sent, i = sent + tokens, i + 1
            finish = "length" if sent >= n else None  # the last text chunk carries it, as SGLang's does
            await response.write(_chunk(api, tokens, sent, prompt, running or api == "generate", finish))
        if api != "generate" and options.get("include_usage"):
            usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
            await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "clock", "max_model_len": 1 << 20}]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", lambda r: stream(r, "completions"))
    app.router.add_post("/v1/chat/completions", lambda r: stream(r, "chat"))
    app.router.add_post("/generate", lambda r: stream(r, "generate"))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--per-stream-rate", type=float, required=True, help="tokens/s of each stream")
    parser.add_argument("--chunk-tokens", type=int, default=1)
    parser.add_argument("--ttft", type=float, default=0.5)
    parser.add_argument("--ttft-step", type=float, default=0.0, help="each arrival's TTFT exceeds the last one's by this")
    parser.add_argument("--lockstep", action="store_true")
    parser.add_argument("--no-running-usage", dest="running_usage", action="store_false")
    parser.add_argument("--record", help="append each request's JSON body to this file")
    args = parser.parse_args()
    app = make_app(args.per_stream_rate, args.chunk_tokens, args.ttft, args.ttft_step, args.lockstep,
                   args.running_usage, args.record)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None, backlog=4096)


if __name__ == "__main__":
    main()
