"""Landscape for the emulator's ceiling benchmark (`scripts/bench_emulator.py --ceiling`).

Every configuration starts at once; the served rate is `BENCH_EMULATOR_RATE` output tok/s
(default 4,000) whatever the batch, so the benchmark can ask for any rate through the server's
environment. Not a model of any machine.
"""

from __future__ import annotations


def startup(flags: dict, env: dict) -> dict | None:
    return None


def throughput(flags: dict, env: dict, running: int) -> float:
    return float(env.get("BENCH_EMULATOR_RATE", "4000"))


def max_running_requests(flags: dict, env: dict) -> int:
    return 4096


def phase_seconds(flags: dict, env: dict) -> dict:
    return {"starting": 1, "loading": 1, "kv_cache": 1, "autotune": 0, "cuda_graph": 1, "warmup": 1}
