"""One streamed request and what the client saw of it, timed as ``sglang.bench_serving`` times it.

Prompts are random token ids of the exact input length (no tokenizer needed, and a fresh
prompt per request keeps the prefix cache from flattering the result); ``ignore_eos`` with
``max_tokens`` fixes the output length. Chat takes text, not ids: its prompt is ``input_len``
common words, each a single token in common tokenizers, and the chat template adds its own, so
the input length counted is the server's ``prompt_tokens`` whenever it reports one.

Output tokens are counted per chunk from what arrived, never from what was asked for: requests
ask for ``continuous_usage_stats`` (SGLang 0.5.23 ``serving_completions.py:395`` and
``serving_chat.py:3691`` then put the cumulative ``usage`` in every chunk; vLLM does the same),
and /generate's ``meta_info.completion_tokens`` is cumulative in every chunk
(``tokenizer_manager.py``). A server that gives no running count is counted by the characters
it sent (``Record.exact`` False); the metrics turn characters into tokens with the ratio of
requests that finished, a property of the text and not of how it was chunked.
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
from search.loadtest.workload import TOKEN_HI, TOKEN_LO, Request, dataset_requests, random_len, shared_prefix_requests

# Chat takes text, not ids: short common words, each one token in common tokenizers.
_WORDS = ("the", "of", "and", "to", "in", "is", "it", "for", "on", "as", "at", "by", "we", "or", "an", "be")

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "generate": "/generate"}
_HEADERS = {"content-type": "application/json"}


@dataclass(slots=True)
class Record:
    """A request's timeline: send time, each content chunk's arrival and what it brought, the end.

    ``counts[i]`` is the output received up to and including chunk ``i``: the server's
    cumulative token count while ``exact``, else cumulative characters of text.
    """

    send: float
    input_tokens: int  # the server's prompt_tokens once a chunk gives it; until then the length sent
    chunks: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    exact: bool = True  # every chunk so far came with the server's running token count
    end: float | None = None
    output_tokens: int | None = None  # the server's final count (usage chunk, last meta_info)
    error: str | None = None  # error kind; None when it succeeded or is still running

    @property
    def ok(self) -> bool:
        """Finished with output and no error."""
        return self.end is not None and self.error is None and bool(self.chunks)

    def tokens(self) -> int:
        """Output tokens of the whole request: the server's count, else what the chunks carried."""
        if self.output_tokens is not None:
            return self.output_tokens
        return self.counts[-1] if self.exact and self.counts else len(self.chunks)

    def add_chunk(self, at: float, tokens: int | None, chars: int) -> None:
        """One content chunk: ``tokens`` the server's running count, or None when it gave none."""
        if tokens is None or not self.exact:
            if self.exact:  # the first chunk without a count: switch the record to characters
                self.exact = False
                self.counts = [0] * len(self.counts)  # earlier chunks' text is unknown now: none
            tokens = (self.counts[-1] if self.counts else 0) + chars
        self.chunks.append(at)
        self.counts.append(tokens)


class Prompts:
    """The workload's request bodies, each built at next to no CPU cost when it is sent.

    Random prompts are a random head of ``HEAD`` tokens, new for every request, then a tail drawn
    from a small pool of pre-serialised random tails, cut to the request's length. The prefix cache
    matches prefixes, so a unique head defeats it as fully as an all-random prompt; building 1,024
    random ids and their JSON per request instead (~1 ms) put the client on the critical path at
    wave boundaries (scripts/bench_vs_bench_serving.py measured TTFT 30x bench_serving's, which
    pre-builds). A dataset's or shared prefix's requests are built once and replayed in order.
    """

    HEAD = 16
    POOL = 64
    POOL_TOKENS = 1 << 22  # the pool's tails hold at most about this many tokens in all

    def __init__(self, spec: LadderSpec, model: str, rng: random.Random) -> None:
        self.spec, self.model, self.rng = spec, model, rng
        self.api = spec.api
        self.fixed: list[Request] = []
        self.next_fixed = 0
        if spec.dataset is not None:
            self.fixed = dataset_requests(spec.dataset, spec.output_len, spec.seed, spec.api)
        elif spec.shared_prefix is not None:
            self.fixed = shared_prefix_requests(spec.shared_prefix, spec.output_len, spec.seed)
        if self.fixed:
            return
        self.head = min(self.HEAD, spec.input_len)
        tail = spec.input_len - self.head
        pool = max(2, min(self.POOL, self.POOL_TOKENS // max(tail, 1)))
        sep = " " if spec.api == "chat" else ","  # chat takes text, not ids: words of one token each
        self.tails = [sep.join(rng.choice(_WORDS) if spec.api == "chat" else str(rng.randrange(TOKEN_LO, TOKEN_HI))
                               for _ in range(tail)) for _ in range(pool)]
        # ends[k]: where a tail's first k tokens end (every tail's separators sit at its own places)
        self.ends = [[0, *(i for i, c in enumerate(t) if c == sep), len(t)] for t in self.tails]

    def _rest(self, output_len: int) -> str:
        """The body after the prompt: sampling that fixes the output length, streaming with usage."""
        if self.api == "generate":
            sampling = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
            return json.dumps({"sampling_params": sampling, "stream": True})[1:]
        return json.dumps({"model": self.model, "max_tokens": output_len, "temperature": 0.0,
                           "ignore_eos": True, "stream": True,
                           "stream_options": {"include_usage": True, "continuous_usage_stats": True}})[1:]

    def next(self) -> tuple[bytes, int, int]:
        """The next request: (its JSON body, its input length, the output tokens it asks)."""
        if self.fixed:
            request = self.fixed[self.next_fixed % len(self.fixed)]
            self.next_fixed += 1
            return self._body(request.prompt, request.output_len), request.input_len, request.output_len
        spec, rng = self.spec, self.rng
        input_len = random_len(rng, spec.input_len, spec.range_ratio)
        output_len = random_len(rng, spec.output_len, spec.range_ratio)
        i = rng.randrange(len(self.tails))
        tail = self.tails[i][: self.ends[i][max(0, input_len - self.head)]]
        head = min(self.head, input_len)
        if self.api == "chat":
            words = " ".join(rng.choice(_WORDS) for _ in range(head))
            return self._body(f"{words} {tail}" if tail else words, output_len), input_len, output_len
        ids = ",".join(str(rng.randrange(TOKEN_LO, TOKEN_HI)) for _ in range(head))
        ids = f"{ids},{tail}" if tail else ids
        key = "input_ids" if self.api == "generate" else "prompt"
        return ('{"' + key + '": [' + ids + "], " + self._rest(output_len)).encode(), input_len, output_len

    def _body(self, prompt: list[int] | str | list[dict[str, Any]], output_len: int) -> bytes:
        """A prepared prompt in the API's shape: chat takes messages, /generate ids or text."""
        head: dict[str, Any]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            head = {"messages": prompt}  # only under chat: dataset_requests refuses them otherwise
        elif self.api == "chat":
            text = prompt if isinstance(prompt, str) else " ".join(_WORDS[t % len(_WORDS)] for t in prompt if isinstance(t, int))
            head = {"messages": [{"role": "user", "content": text}]}
        elif self.api == "generate":
            head = {"text": prompt} if isinstance(prompt, str) else {"input_ids": prompt}
        else:
            head = {"prompt": prompt}
        return (json.dumps(head)[:-1] + ", " + self._rest(output_len)).encode()


def _content(api: str, data: dict[str, Any], seen: int) -> tuple[int, int | None, dict[str, Any] | None]:
    """(characters of new output, the running output token count if the chunk gives one, the counts).

    The counts are a dict with ``prompt_tokens`` and ``completion_tokens``: the usage of a usage
    chunk or of a chunk under ``continuous_usage_stats``, or /generate's ``meta_info``. A chunk
    brings new output when it has text, or (/generate, whose ``text`` is cumulative) when its
    count grew past ``seen``.
    """
    if api == "generate":
        meta = data.get("meta_info") or {}
        count = meta.get("completion_tokens") or 0
        text = data.get("text") or ""
        return (max(1, len(text)) if count > seen else 0), count, meta
    usage = data.get("usage")
    choices = data.get("choices")
    if not choices:
        return 0, None, usage
    choice = choices[0]
    text = (choice.get("delta") or {}).get("content") if api == "chat" else choice.get("text")
    running = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return len(text or ""), running, usage


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


class ImplausibleUsage(ValueError):
    """The server counted more output tokens than the request allowed."""


def _check_counts(counts: dict[str, Any], max_tokens: int) -> None:
    """A server's token counts are trusted only within what the request allows.

    ``max_tokens`` bounds ``completion_tokens`` by the API's own rule; a server claiming more
    (999,999,999 tokens once read as 22 billion tok/s) sent a bad response, not a fast one.
    """
    completion = counts.get("completion_tokens")
    if completion is not None and not (isinstance(completion, int) and 0 <= completion <= max_tokens):
        raise ImplausibleUsage(f"completion_tokens {completion!r} for max_tokens {max_tokens}")


async def stream_one(session: aiohttp.ClientSession, url: str, api: str, body: bytes, record: Record,
                     max_tokens: int) -> None:
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
                    chars, running, counts = _content(api, data, seen)
                    if counts:
                        _check_counts(counts, max_tokens)
                    if chars:
                        record.add_chunk(now, running, chars)
                        seen = running if running is not None else seen
                    if counts:
                        record.output_tokens = counts.get("completion_tokens", record.output_tokens)
                        record.input_tokens = counts.get("prompt_tokens") or record.input_tokens
        record.end = time.perf_counter()
        if not record.chunks:
            record.error = "empty_output"
    except aiohttp.ClientConnectorError:
        record.error = "connect"
    except TimeoutError:
        record.error = "timeout"
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError):
        record.error = "disconnected"
    except ImplausibleUsage:
        record.error = "implausible_usage"
    except (aiohttp.ClientResponseError, ValueError, AttributeError, TypeError):
        record.error = "bad_response"  # a malformed HTTP response, JSON or event
    except asyncio.CancelledError:
        record.error = "cancelled"  # still running when its level ended: not a failure
        raise
    finally:
        if record.end is None:
            record.end = time.perf_counter()
