"""Landscape: a small cap is best, graphs off, triton the fastest backend.

Assumptions: throughput saturates with the running batch but past a knee at 160 requests it falls
(preemption: (160 / running) ** 0.8), so the best cap is small; CUDA graphs cost 10%; triton is
the fastest MoE backend; flashinfer_trtllm with graphs on fails at capture (unsupported
architecture); the memory fraction barely matters.
"""

from __future__ import annotations

# NCCL channels scale every config's throughput by their own factor and never change how it
# starts: scripts/bench_search.py enumerates them apart (and checks the claim).
SEPARABLE = ("NCCL_MIN_NCHANNELS",)

BACKEND = {"auto": 0.88, "triton": 1.0, "cutlass": 0.9, "flashinfer_cutlass": 0.85, "flashinfer_trtllm": 0.8}
KNEE = 160.0


def _graphs(flags: dict) -> bool:
    return not (flags.get("disable_cuda_graph") or flags.get("cuda_graph_backend_decode") == "disabled")


def startup(flags: dict, env: dict) -> dict | None:
    if flags.get("moe_runner_backend") == "flashinfer_trtllm" and _graphs(flags):
        return {"phase": "cuda_graph", "error": "Exception: Capture cuda graph failed: No supported CUDA "
                                                "architectures found for major versions [9, 10]."}
    return None


def max_running_requests(flags: dict, env: dict) -> int:
    return 2048


def throughput(flags: dict, env: dict, running: int) -> float:
    rate = 2600.0 * running / (running + 60)
    if running > KNEE:
        rate *= (KNEE / running) ** 0.8
    if _graphs(flags):
        rate *= 0.9
    rate *= 1.0 + 0.02 * ((flags.get("mem_fraction_static") or 0.85) - 0.85)
    return rate * BACKEND.get(flags.get("moe_runner_backend") or "auto", 0.7)


def phase_seconds(flags: dict, env: dict) -> dict[str, float]:
    seconds = {"starting": 20.0, "loading": 200.0, "kv_cache": 15.0, "warmup": 10.0}
    if flags.get("moe_runner_backend") in ("flashinfer_cutlass", "flashinfer_trtllm"):
        seconds["autotune"] = 60.0
    if _graphs(flags):
        seconds["cuda_graph"] = 45.0
    return seconds
