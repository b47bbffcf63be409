"""SEARCH_EMULATOR_NOISE / SEARCH_EMULATOR_SEED: repeated measurements differ as real ones do, reproducibly.

Drives the real token scheduler (the part that applies the noise) on one event loop: each
"server" is a Scheduler with its own seed, serving a fixed landscape rate to running requests.
"""

from __future__ import annotations

import asyncio
import statistics

from search.emulator.scheduler import Request, Scheduler

RATE = 2000.0  # landscape tok/s
RUNNING = 8
WINDOW_S = 0.6


async def _measure(seeds: list[int | None], noise: float) -> list[float]:
    """Served tok/s of one fresh scheduler per seed, all measured over the same window."""
    schedulers = [Scheduler(rate=lambda n: RATE, cap=RUNNING, stream_interval=1, kv_tokens=10**6, noise=noise,
                            seed=seed, log_interval=10**9, on_prefill=lambda *a: None,
                            on_decode=lambda *a: None, record=False) for seed in seeds]
    for s in schedulers:
        s.start()
        for _ in range(RUNNING):
            s.submit(Request(prompt_tokens=1, target=10**9, finish_reason="length"))
    await asyncio.sleep(0.1)  # all admitted, prefill done
    before = [s.stats.generation_tokens for s in schedulers]
    await asyncio.sleep(WINDOW_S)
    rates = [(s.stats.generation_tokens - b) / WINDOW_S for s, b in zip(schedulers, before, strict=True)]
    for s in schedulers:
        assert s.task is not None
        s.task.cancel()
    return rates


def test_noise_spreads_repeats_by_about_the_given_std_and_a_seed_reproduces() -> None:
    noise = 0.10
    seeds = list(range(40))
    rates = asyncio.run(_measure([*seeds, 7, 7], noise))
    spread = statistics.stdev(rates[:40]) / statistics.mean(rates[:40])
    assert 0.5 * noise < spread < 2.0 * noise, spread
    same = [rates[7], rates[40], rates[41]]
    assert max(same) / min(same) < 1.03, same  # the same seed gives the same measurement


def test_no_noise_serves_the_modelled_rate() -> None:
    rates = asyncio.run(_measure([1, 2, 3], 0.0))
    assert all(abs(r - RATE) / RATE < 0.05 for r in rates), rates
