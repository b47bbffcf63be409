"""Landscape: the best concurrency cap is moderate (KV pressure past a knee).

Assumptions: decode throughput saturates with the running batch, but past a knee that grows with
the KV pool (`--mem-fraction-static`) requests are retracted and throughput falls, so the automatic
cap (2048) loses to a cap of a few hundred. flashinfer_cutlass is the fastest MoE backend,
flashinfer_trtllm crashes at autotune, CUDA graphs help a little while the batch fits the captured
sizes, memory fraction above 0.93 runs out of memory at KV allocation.
"""

from __future__ import annotations

# NCCL channels scale every config's throughput by their own factor and never change how it
# starts: scripts/bench_search.py enumerates them apart (and checks the claim).
SEPARABLE = ("NCCL_MIN_NCHANNELS",)

BACKEND = {"auto": 0.85, "triton": 0.8, "cutlass": 0.9, "flashinfer_cutlass": 1.0}


def _graphs(flags: dict) -> bool:
    return not (flags.get("disable_cuda_graph") or flags.get("cuda_graph_backend_decode") == "disabled")


def startup(flags: dict, env: dict) -> dict | None:
    if (flags.get("mem_fraction_static") or 0.85) > 0.93:
        return {"phase": "kv_cache", "error": "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."}
    if flags.get("moe_runner_backend") == "flashinfer_trtllm":
        return {"phase": "autotune", "error": "RuntimeError: flashinfer autotune failed"}
    return None


def max_running_requests(flags: dict, env: dict) -> int:
    return 2048


def throughput(flags: dict, env: dict, running: int) -> float:
    mem = flags.get("mem_fraction_static") or 0.85
    knee = 150 + 2500 * (mem - 0.80)
    rate = 3000.0 * running / (running + 120)
    if running > knee:
        rate *= (knee / running) ** 0.6
    if _graphs(flags) and running <= (flags.get("cuda_graph_max_bs_decode") or 256):
        rate *= 1.08
    channels = int(env.get("NCCL_MIN_NCHANNELS", "4"))
    rate *= 1.0 - 0.01 * abs(channels - 8) / 8
    return rate * BACKEND.get(flags.get("moe_runner_backend") or "auto", 0.7)


def phase_seconds(flags: dict, env: dict) -> dict:
    out = {"starting": 20.0, "loading": 240.0, "kv_cache": 15.0, "warmup": 10.0}
    if flags.get("moe_runner_backend") in ("flashinfer_cutlass", "flashinfer_trtllm"):
        out["autotune"] = 90.0
    if _graphs(flags):
        out["cuda_graph"] = 60.0
    return out
