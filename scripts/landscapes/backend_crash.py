"""Landscape: a whole MoE backend crashes, another hangs, and the baseline's backend is one of them.

Assumptions: on this machine flashinfer_cutlass fails to JIT-compile at autotune (every config
with it crashes), flashinfer_trtllm hangs in CUDA graph capture, cutlass is the fastest working
backend; removing the concurrency cap pays (automatic cap 2048), graphs off costs 10%, NCCL
channels peak at 16.
"""

from __future__ import annotations

# NCCL channels scale every config's throughput by their own factor and never change how it
# starts: scripts/bench_search.py enumerates them apart (and checks the claim).
SEPARABLE = ("NCCL_MIN_NCHANNELS",)

BACKEND = {"auto": 0.85, "triton": 0.7, "cutlass": 1.0, "flashinfer_trtllm": 0.9}


def _graphs(flags: dict) -> bool:
    return not (flags.get("disable_cuda_graph") or flags.get("cuda_graph_backend_decode") == "disabled")


def startup(flags: dict, env: dict) -> dict | None:
    backend = flags.get("moe_runner_backend")
    if backend == "flashinfer_cutlass":
        return {"phase": "autotune", "error": "subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1."}
    if backend == "flashinfer_trtllm" and _graphs(flags):
        return {"phase": "cuda_graph", "hang": True}
    return None


def max_running_requests(flags: dict, env: dict) -> int:
    return 2048


def throughput(flags: dict, env: dict, running: int) -> float:
    rate = 5000.0 * running / (running + 500)
    if not _graphs(flags):
        rate *= 0.9
    channels = int(env.get("NCCL_MIN_NCHANNELS", "4"))
    rate *= 1.0 - 0.08 * abs(channels - 16) / 16
    mem = flags.get("mem_fraction_static") or 0.85
    rate *= 0.97 + 0.2 * (mem - 0.80)
    return rate * BACKEND.get(flags.get("moe_runner_backend") or "auto", 0.7)


def phase_seconds(flags: dict, env: dict) -> dict:
    out = {"starting": 20.0, "loading": 300.0, "kv_cache": 20.0, "warmup": 10.0}
    if flags.get("moe_runner_backend") in ("flashinfer_cutlass", "flashinfer_trtllm"):
        out["autotune"] = 90.0
    if _graphs(flags):
        out["cuda_graph"] = 60.0
    return out
