"""The radix prefix cache: shared prefixes skip prefill, as SGLang's log lines and usage report it.

The radix tree alone first (matches, splits, eviction), then the real emulator: a second request
with the same 600-token system prompt reports 600 cached tokens in its `Prefill batch` line, in
`/generate`'s meta_info and (with --enable-cache-report) in its usage details; --disable-radix-cache
reports none; lpm schedules one request per shared prefix ahead of its duplicates.
"""

from __future__ import annotations

import asyncio
import re

import httpx

from search.emulator.radix import RadixCache
from search.emulator.scheduler import Prefill, Request, Scheduler
from tests.emulator.conftest import client


def test_radix_matches_splits_and_evicts_least_recent() -> None:
    cache = RadixCache(capacity=12)
    cache.insert((1, 2, 3, 4, 5, 6))
    assert cache.match((1, 2, 3, 4, 5, 6, 7)) == 6
    assert cache.match((1, 2, 3, 9)) == 3
    cache.insert((1, 2, 3, 9, 9))  # splits the edge after 3
    assert cache.tokens == 8 and cache.match((1, 2, 3, 9, 9, 1)) == 5 and cache.match((1, 2, 3, 4)) == 4
    cache.match((1, 2, 3, 4, 5, 6))  # the 4,5,6 branch is now the most recent
    cache.insert((7, 7, 7, 7, 7))  # 13 tokens > 12: the least recent leaf (9, 9) goes
    assert cache.match((1, 2, 3, 9, 9)) == 3 and cache.match((1, 2, 3, 4, 5, 6)) == 6
    assert cache.match((7, 7, 7, 7, 7)) == 5 and cache.tokens <= 12


PREFIX = list(range(1000, 1600))  # a 600-token system prompt


def _prefill_lines(text: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in text.splitlines() if re.match(r"\[[^]]+\] Prefill batch", line)]


def _generate(c: httpx.Client, ids: list[int]) -> dict:
    r = c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    r.raise_for_status()
    return r.json()["meta_info"]


def test_shared_prefix_is_cached_in_log_meta_info_and_usage(start, small_landscape) -> None:
    server = start(["--model-path", "m", "--enable-cache-report"], **small_landscape)
    server.wait_ready()
    with client(server) as c:
        assert _generate(c, PREFIX + [1, 2, 3])["cached_tokens"] == 0
        assert _generate(c, PREFIX + [4, 5, 6])["cached_tokens"] == 600
        body = {"prompt": PREFIX + [7, 8], "max_tokens": 2, "ignore_eos": True}
        usage = c.post("/v1/completions", json=body).json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 600}
        streamed = c.post("/v1/completions", json={**body, "stream": True,
                                                     "stream_options": {"include_usage": True,
                                                                        "continuous_usage_stats": True}}).text
        chunks = [line for line in streamed.splitlines() if line.startswith("data: {")]
        assert '"prompt_tokens_details":null' in chunks[0]  # a completion's running usage has no details
        assert '"prompt_tokens_details":{"cached_tokens":601}' in chunks[-1]  # ...its final usage chunk does
        # Text prompts share their words: the second chat with the same system message hits it.
        system = {"role": "system", "content": " ".join(["rules"] * 300)}
        chat = {"max_tokens": 2, "ignore_eos": True}
        c.post("/v1/chat/completions", json={**chat, "messages": [system, {"role": "user", "content": "a b"}]})
        second = c.post("/v1/chat/completions", json={**chat, "messages": [system, {"role": "user", "content": "c"}]})
        assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 300
    lines = _prefill_lines(server.text())
    assert any("#new-token: 603, #cached-token: 0," in line for line in lines), lines
    assert any("#new-token: 3, #cached-token: 600," in line for line in lines), lines


def test_disable_radix_cache_prefills_every_prompt_whole(start, small_landscape) -> None:
    server = start(["--model-path", "m", "--disable-radix-cache", "--enable-cache-report"], **small_landscape)
    server.wait_ready()
    with client(server) as c:
        _generate(c, PREFIX + [1])
        assert _generate(c, PREFIX + [2])["cached_tokens"] == 0
        usage = c.post("/v1/completions", json={"prompt": PREFIX, "max_tokens": 1}).json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert all("#cached-token: 0," in line for line in _prefill_lines(server.text()))


def _first_batch(policy: str) -> list[int]:
    """Cached tokens per request of 4 groups x 3 prompts queued at once behind a 1-slot prefill
    budget of 1,000 tokens: which go first decides how many prefills the groups' prefixes cost."""
    async def run() -> list[int]:
        s = Scheduler(rate=lambda n: 1e6, cap=64, stream_interval=1, kv_tokens=10**6, noise=0.0, seed=0,
                      log_interval=10**9, on_prefill=lambda *a: None, on_decode=lambda *a: None, record=False,
                      prefill=Prefill(tokens_per_s=1e6, budget=1000, chunked=False, policy=policy))
        s.start()
        reqs = [Request(300, 1, "length", key=tuple([g] * 290 + [g, i] * 5)) for g in range(4) for i in range(3)]
        for r in reqs:
            s.submit(r)
        while any(r.state != "done" for r in reqs):
            await asyncio.sleep(0.01)
        assert s.task is not None
        s.task.cancel()
        return [r.cached for r in reqs]
    return asyncio.run(run())


def test_lpm_prefills_each_shared_prefix_once_where_fcfs_repeats_it() -> None:
    """fcfs fills each batch with one group's prompts, all uncached; lpm defers a request sharing
    its prefix with one ahead of it, so the first batch holds three groups and their later
    prompts hit (the last group's come in one batch, as SGLang's deferral only reorders)."""
    lpm, fcfs = _first_batch("lpm"), _first_batch("fcfs")
    assert fcfs == [0] * 12
    assert lpm == [0, 291, 291] * 3 + [0, 0, 0]
