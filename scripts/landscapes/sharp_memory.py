"""Landscape: sharp interior optima in the memory fraction and the graph batch, written after the
strategy was tuned, to check it away from the six it was tuned on.

Assumptions: throughput falls 2% per 0.01 of `--mem-fraction-static` either side of 0.87 (sharper
than real servers show: a hard case for a model that pools neighbours); CUDA graphs add up to 8%,
most when the captured batch is near 200; flashinfer_cutlass runs out of memory at autotune above
a memory fraction of 0.90; the automatic backend is the fastest; NCCL channels do nothing; the
automatic cap (1024) is best.
"""

from __future__ import annotations

import math

from search.emulator import cuda_graphs

# NCCL channels scale every config's throughput by their own factor and never change how it
# starts: scripts/bench_search.py enumerates them apart (and checks the claim).
SEPARABLE = ("NCCL_MIN_NCHANNELS",)

BACKEND = {"auto": 1.0, "triton": 0.75, "cutlass": 0.93, "flashinfer_cutlass": 0.96, "flashinfer_trtllm": 0.9}


def startup(flags: dict, env: dict) -> dict | None:
    mem = flags.get("mem_fraction_static") or 0.85
    if flags.get("moe_runner_backend") == "flashinfer_cutlass" and mem > 0.9:
        return {"phase": "autotune", "error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."}
    return None


def max_running_requests(flags: dict, env: dict) -> int:
    return 1024


def throughput(flags: dict, env: dict, running: int) -> float:
    mem = flags.get("mem_fraction_static") or 0.85
    rate = 4500.0 * running / (running + 300) * (1.0 - 2.0 * abs(mem - 0.87))
    if cuda_graphs.on(flags):
        batch = cuda_graphs.decode_max_bs(flags) or 256
        rate *= 1.0 + max(0.0, 0.08 * (1 - abs(math.log2(batch / 200)) / 2.5))
    return rate * BACKEND.get(flags.get("moe_runner_backend") or "auto", 0.7)


def phase_seconds(flags: dict, env: dict) -> dict[str, float]:
    seconds = {"starting": 20.0, "loading": 280.0, "kv_cache": 15.0, "warmup": 10.0}
    if flags.get("moe_runner_backend") in ("flashinfer_cutlass", "flashinfer_trtllm"):
        seconds["autotune"] = 80.0
    if cuda_graphs.on(flags):
        seconds["cuda_graph"] = 40.0
    return seconds
