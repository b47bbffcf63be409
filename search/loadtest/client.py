"""One streamed request and what the client saw of it, timed as ``sglang.bench_serving`` times it.

Prompts are random token ids of the exact input length (no tokenizer needed, and a fresh
prompt per request keeps the prefix cache from flattering the result); ``ignore_eos`` with
``max_tokens`` fixes the output length. Chat takes text, not ids: its prompt is ``input_len``
common words, each a single token in common tokenizers, and the chat template adds its own, so
the input length counted is the server's ``prompt_tokens`` whenever it reports one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from search.loadtest.spec import LadderSpec

# Token ids drawn from a range every common vocabulary (32k and up) covers, past the
# special tokens at the low end.
_TOKEN_LO, _TOKEN_HI = 1000, 30000
# Chat takes text, not ids: short common words, each one token in common tokenizers.
_WORDS = ("the", "of", "and", "to", "in", "is", "it", "for", "on", "as", "at", "by", "we", "or", "an", "be")

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "generate": "/generate"}
_HEADERS = {"content-type": "application/json"}


@dataclass(slots=True)
class Record:
    """A request's timeline: send time, the arrival time of each content chunk, the end."""

    send: float
    input_tokens: int  # the server's prompt_tokens once a chunk gives it; until then the length sent
    chunks: list[float] = field(default_factory=list)
    end: float | None = None
    output_tokens: int | None = None  # from the usage chunk; None while unknown
    error: str | None = None  # error kind; None when it succeeded or is still running

    @property
    def ok(self) -> bool:
        """Finished with output and no error."""
        return self.end is not None and self.error is None and bool(self.chunks)

    def tokens(self) -> int:
        """Output tokens: the server's count when it gave one, else the content chunks seen."""
        return self.output_tokens if self.output_tokens is not None else len(self.chunks)


class Prompts:
    """Request bodies with fresh prompts at next to no CPU cost per request.

    A prompt is a random head of ``HEAD`` tokens, new for every request, then a tail drawn from
    a small pool of pre-serialised random tails. The prefix cache matches prefixes, so a unique
    head defeats it as fully as an all-random prompt; building 1,024 random ids and their JSON
    per request instead (~1 ms) put the client on the critical path at wave boundaries
    (scripts/bench_vs_bench_serving.py measured TTFT 30x bench_serving's, which pre-builds).
    """

    HEAD = 16
    POOL = 64

    def __init__(self, spec: LadderSpec, model: str, rng: random.Random) -> None:
        self.api, self.rng = spec.api, rng
        self.head = min(self.HEAD, spec.input_len)
        tail = spec.input_len - self.head
        if spec.api == "chat":  # chat takes text, not ids: words of one token each
            self.tails = [" ".join(rng.choice(_WORDS) for _ in range(tail)) for _ in range(self.POOL)]
        else:
            self.tails = [",".join(str(rng.randrange(_TOKEN_LO, _TOKEN_HI)) for _ in range(tail))
                          for _ in range(self.POOL)]
        if spec.api == "generate":
            sampling = {"temperature": 0.0, "max_new_tokens": spec.output_len, "ignore_eos": True}
            self.rest = json.dumps({"sampling_params": sampling, "stream": True})[1:]
        else:
            self.rest = json.dumps({"model": model, "max_tokens": spec.output_len, "temperature": 0.0,
                                    "ignore_eos": True, "stream": True,
                                    "stream_options": {"include_usage": True}})[1:]

    def body(self) -> bytes:
        """The JSON of the next request."""
        rng, tail = self.rng, self.rng.choice(self.tails)
        if self.api == "chat":
            words = " ".join(rng.choice(_WORDS) for _ in range(self.head))
            content = json.dumps(f"{words} {tail}" if tail else words)
            return ('{"messages": [{"role": "user", "content": ' + content + "}], " + self.rest).encode()
        ids = ",".join(str(rng.randrange(_TOKEN_LO, _TOKEN_HI)) for _ in range(self.head))
        ids = f"{ids},{tail}" if tail else ids
        key = "input_ids" if self.api == "generate" else "prompt"
        return ('{"' + key + '": [' + ids + "], " + self.rest).encode()


def _content(api: str, data: dict[str, Any], seen: int) -> tuple[bool, dict[str, Any] | None, int]:
    """(chunk carries new output, the server's token counts if this chunk has them, tokens seen so far).

    The counts are a dict with ``prompt_tokens`` and ``completion_tokens``: the usage chunk's, or
    /generate's ``meta_info``, which carries a cumulative count with every chunk.
    """
    if api == "generate":
        meta = data.get("meta_info") or {}
        count = meta.get("completion_tokens") or 0
        return count > seen, meta, max(seen, count)
    usage = data.get("usage")
    choices = data.get("choices")
    if not choices:
        return False, usage, seen
    choice = choices[0]
    text = (choice.get("delta") or {}).get("content") if api == "chat" else choice.get("text")
    return bool(text), usage, seen


class _Events:
    """Server-sent events decoded from raw bytes as they arrive: the data of each complete event.

    Lines end in LF or CRLF; ``data:`` lines of one event are joined with LF as the SSE spec says;
    other fields and comments are skipped (an OpenAI-style stream has only data).
    """

    __slots__ = ("rest", "data")

    def __init__(self) -> None:
        self.rest = b""
        self.data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        *lines, self.rest = (self.rest + chunk).split(b"\n")
        events = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self.data:
                    events.append(b"\n".join(self.data))
                    self.data = []
            elif line.startswith(b"data:"):
                self.data.append(line[6:] if line.startswith(b"data: ") else line[5:])
        return events


async def stream_one(session: aiohttp.ClientSession, url: str, api: str, body: bytes, record: Record) -> None:
    """Send one request and fill ``record`` as chunks arrive; errors become ``record.error``.

    Each network read is decoded at once, so a chunk's time is when its bytes were read, as in
    bench_serving (which reads the same way, through aiohttp).
    """
    seen = 0
    events = _Events()
    try:
        async with session.post(url + PATHS[api], data=body, headers=_HEADERS) as response:
            if response.status != 200:
                await response.read()
                record.error = f"http_{response.status}"
                return
            async for chunk in response.content.iter_any():
                now = time.perf_counter()
                for event in events.feed(chunk):
                    if event == b"[DONE]":
                        continue  # read on to the body's end: leaving early would close the connection
                    data = json.loads(event)
                    if "error" in data and not data.get("choices"):
                        record.error = "server_error"
                        return
                    new, counts, seen = _content(api, data, seen)
                    if new:
                        record.chunks.append(now)
                    if counts:
                        record.output_tokens = counts.get("completion_tokens", record.output_tokens)
                        record.input_tokens = counts.get("prompt_tokens") or record.input_tokens
        record.end = time.perf_counter()
        if not record.chunks:
            record.error = "empty_output"
    except aiohttp.ClientConnectorError:
        record.error = "connect"
    except asyncio.TimeoutError:
        record.error = "timeout"
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError):
        record.error = "disconnected"
    except (aiohttp.ClientResponseError, ValueError, AttributeError, TypeError):
        record.error = "bad_response"  # a malformed HTTP response, JSON or event
    except asyncio.CancelledError:
        record.error = "cancelled"  # still running when its level ended: not a failure
        raise
    finally:
        if record.end is None:
            record.end = time.perf_counter()
