"""Landscape: CUDA graphs help instead of hurt, if the captured batch sizes cover the batch.

Assumptions: eager decode is launch-bound, so graphs add 40% while the running batch fits
`--cuda-graph-max-bs-decode` (larger batches fall back to eager); capturing large batch sizes
costs memory: with a high `--mem-fraction-static` capture runs out of memory. Throughput saturates
with the running batch (automatic cap 1024); the MoE backend matters moderately.
"""

from __future__ import annotations

# NCCL channels scale every config's throughput by their own factor and never change how it
# starts: scripts/bench_search.py enumerates them apart (and checks the claim).
SEPARABLE = ("NCCL_MIN_NCHANNELS",)

BACKEND = {"auto": 0.9, "triton": 0.75, "cutlass": 1.0, "flashinfer_cutlass": 0.95, "flashinfer_trtllm": 0.85}


def _graphs(flags: dict) -> bool:
    return not (flags.get("disable_cuda_graph") or flags.get("cuda_graph_backend_decode") == "disabled")


def _max_bs(flags: dict) -> int:
    return flags.get("cuda_graph_max_bs_decode") or 256


def startup(flags: dict, env: dict) -> dict | None:
    mem = flags.get("mem_fraction_static") or 0.85
    if _graphs(flags) and mem + _max_bs(flags) / 8000 > 0.97:
        return {"phase": "cuda_graph",
                "error": "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB."}
    return None


def max_running_requests(flags: dict, env: dict) -> int:
    return 1024


def throughput(flags: dict, env: dict, running: int) -> float:
    mem = flags.get("mem_fraction_static") or 0.85
    rate = 2600.0 * running / (running + 200) * (0.9 + mem / 8)
    if _graphs(flags) and running <= _max_bs(flags):
        rate *= 1.4
    return rate * BACKEND.get(flags.get("moe_runner_backend") or "auto", 0.7)


def phase_seconds(flags: dict, env: dict) -> dict:
    out = {"starting": 20.0, "loading": 200.0, "kv_cache": 15.0, "warmup": 10.0}
    if flags.get("moe_runner_backend") in ("flashinfer_cutlass", "flashinfer_trtllm"):
        out["autotune"] = 60.0
    if _graphs(flags):
        out["cuda_graph"] = 30.0 + _max_bs(flags) / 4
    return out
