"""Landscape: the memory fraction pays up to an out-of-memory edge that moves with the graph batch.

Assumptions: throughput grows with `--mem-fraction-static` (a larger KV pool) until CUDA-graph
capture runs out of memory, which happens sooner the larger the captured batch
(mem + graph batch / 4000 > 0.99); graphs help while the running batch fits the captured sizes;
NCCL channels have an interior optimum at 8; the automatic cap (1536) is best; cutlass is the
fastest MoE backend.
"""

from __future__ import annotations

import math

# NCCL channels scale every config's throughput by their own factor and never change how it
# starts: scripts/bench_search.py enumerates them apart (and checks the claim).
SEPARABLE = ("NCCL_MIN_NCHANNELS",)

BACKEND = {"auto": 0.9, "triton": 0.8, "cutlass": 1.0, "flashinfer_cutlass": 0.93, "flashinfer_trtllm": 0.88}


def _graphs(flags: dict) -> bool:
    return not (flags.get("disable_cuda_graph") or flags.get("cuda_graph_backend_decode") == "disabled")


def _graph_bs(flags: dict) -> int:
    return flags.get("cuda_graph_max_bs_decode") or 256


def startup(flags: dict, env: dict) -> dict | None:
    mem = flags.get("mem_fraction_static") or 0.85
    if _graphs(flags) and mem + _graph_bs(flags) / 4000 > 0.99:
        return {"phase": "cuda_graph",
                "error": "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.00 GiB."}
    return None


def max_running_requests(flags: dict, env: dict) -> int:
    return 1536


def throughput(flags: dict, env: dict, running: int) -> float:
    mem = flags.get("mem_fraction_static") or 0.85
    rate = 4200.0 * running / (running + 350) * (0.8 + 1.3 * (mem - 0.80))
    if _graphs(flags) and running <= _graph_bs(flags):
        rate *= 1.15
    channels = int(env.get("NCCL_MIN_NCHANNELS", "4"))
    rate *= 1.0 - 0.06 * (math.log2(channels) - 3) ** 2 / 4
    return rate * BACKEND.get(flags.get("moe_runner_backend") or "auto", 0.7)


def phase_seconds(flags: dict, env: dict) -> dict[str, float]:
    seconds = {"starting": 20.0, "loading": 260.0, "kv_cache": 15.0, "warmup": 10.0}
    if flags.get("moe_runner_backend") in ("flashinfer_cutlass", "flashinfer_trtllm"):
        seconds["autotune"] = 80.0
    if _graphs(flags):
        seconds["cuda_graph"] = 30.0 + _graph_bs(flags) / 8
    return seconds
