"""The seed machine: 8x RTX PRO 6000 Blackwell (SM120, 97,887 MiB, 600 W), GLM-5-NVFP4, 83 shards.

Calibrated on the seed run (../../../../shared/reference/sglang.md section 7); every assumption
beyond it is listed in seed.md next to this file. Works with the flags of 0.5.8.post1, 0.5.9
and 0.5.23 (graph flags are resolved by search.emulator.cuda_graphs as SGLang resolves them;
allreduce-fusion flags are read under both versions' names).
"""

from __future__ import annotations

import math
from typing import Any

from search.emulator import cuda_graphs
from search.emulator.logs import failure_text

# Output tok/s of the tuned configuration (cap removed, graphs off, flashinfer_cutlass autotune)
# by running requests; the seed measured 256 / 512 / 1,024 and a peak near 4,000.
_TUNED = ((1, 45.0), (16, 430.0), (64, 1000.0), (128, 1420.0), (256, 1950.0), (512, 2800.0),
          (1024, 3740.0), (2048, 4050.0))
_NO_AUTOTUNE = 0.82        # cutlass MoE with default tactics
_GRAPH_SMALL_BATCH = 1.073  # graphs help while the batch fits a captured size (baseline 880 @ 64)
_GRAPH_LARGE_BATCH = 0.92   # beyond the largest captured batch: padding and eager fallback
_MOE_FACTOR = {"flashinfer_cutlass": 1.0, "auto": 0.95, "cutlass": 0.93, "triton": 0.72,
               "marlin": 0.6}
_FP4_GEMM_AUTOTUNE_S = 20.0  # 0.5.23's FP4 GEMM autotune alone (no MoE autotune): assumed, seed.md
_WEIGHTS_GIB_TOTAL = 215.0  # GLM-5 NVFP4 across all ranks
_GPU_GIB = 95.59
_ACTIVATION_GIB = 5.0       # what a rank needs outside the static pool besides graphs (activations, NCCL)
# PyTorch's CUDA OOM message (c10/cuda/CUDACachingAllocator.cpp), as the seed's GPUs would word it.
_TORCH_OOM_GRAPH = ("CUDA out of memory. Tried to allocate 448.00 MiB. GPU 7 has a total capacity of 95.59 GiB of "
                    "which 301.50 MiB is free. Including non-PyTorch memory, this process has 95.29 GiB memory in use.")


def graphs_off(flags: dict[str, Any]) -> bool:
    return not cuda_graphs.on(flags)  # decode graphs, resolved as SGLang does


def allreduce_fusion(flags: dict[str, Any]) -> bool:
    return bool(flags.get("enable_flashinfer_allreduce_fusion")) \
        or flags.get("flashinfer_allreduce_fusion_backend") not in (None, "")


def autotunes(flags: dict[str, Any]) -> bool:
    """The seed's SGLang was patched to autotune flashinfer_cutlass too (0.5.23 does natively)."""
    return not flags.get("disable_flashinfer_autotune") and flags.get("moe_runner_backend") in (
        "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_trtllm_routed", "flashinfer_mxfp4")


def fp4_gemm_autotunes(flags: dict[str, Any]) -> bool:
    """0.5.23 (the only version with `cuda_graph_backend_decode`) also autotunes the FP4 GEMM of
    the modelopt_fp4 model when its GEMM backend is flashinfer_cutlass/cutedsl (`auto` on SM120)
    (model_executor/runner/flashinfer_autotune.py:135), whatever the MoE backend."""
    from search.emulator.launch import fp4_gemm_autotunes as gemm_autotunes

    return "cuda_graph_backend_decode" in flags and not flags.get("disable_flashinfer_autotune") \
        and gemm_autotunes(flags)


def _mem_fraction(flags: dict[str, Any]) -> float:
    return float(flags.get("mem_fraction_static") or 0.85)


def _tp(flags: dict[str, Any]) -> int:
    return int(flags.get("tp_size") or flags.get("tensor_parallel_size") or 1)  # dest differs by version


def _pp(flags: dict[str, Any]) -> int:
    return int(flags.get("pp_size") or flags.get("pipeline_parallel_size") or 1)


def _attention_dp(flags: dict[str, Any]) -> int:
    """The attention-DP width: --attn-dp-size (0.5.23), else --dp-size with --enable-dp-attention."""
    if int(flags.get("attn_dp_size") or 1) > 1:
        return int(flags["attn_dp_size"])
    return int(flags.get("dp_size") or flags.get("data_parallel_size") or 1) if flags.get("enable_dp_attention") else 1


def _replicas(flags: dict[str, Any]) -> int:
    """Data-parallel replicas (without attention DP each is a whole tp x pp server)."""
    return 1 if _attention_dp(flags) > 1 else int(flags.get("dp_size") or flags.get("data_parallel_size") or 1)


def _layout_factor(flags: dict[str, Any], running: int) -> float:
    """What the parallel layout does to one replica's rate (seed.md, "Parallel layout": assumed, not measured).

    Attention DP shards the MLA KV cache and attention by request instead of by head: it pays at
    large batches (+6% per doubling of its width at >= 256 running) and costs at small ones (-4%
    per doubling below: the MoE all-to-all without enough tokens to hide it). Expert parallelism
    equal to tp helps the MoE a little at large batches (+3%). Each doubling of pipeline stages
    costs 10% (bubbles at decode).
    """
    factor = 1.0
    width = _attention_dp(flags)
    if width > 1:
        factor *= (1 + 0.06 * math.log2(width)) if running >= 256 else (1 - 0.04 * math.log2(width))
    ep = int(flags.get("ep_size") or flags.get("expert_parallel_size") or 1)
    if ep > 1 and ep == _tp(flags) and running >= 256:
        factor *= 1.03
    return factor * 0.9 ** math.log2(_pp(flags))


def _graph_max_bs(flags: dict[str, Any]) -> int:
    return cuda_graphs.decode_max_bs(flags) or 256


def _graph_gib(flags: dict[str, Any], env: dict[str, str]) -> float:
    """Memory graph capture needs outside the static pool: it grows with the largest captured batch.

    SGLang captures batch sizes up to --cuda-graph-max-bs, but never beyond the request pool
    (--max-running-requests or the automatic cap), so a capped server captures less.
    """
    cap = flags.get("max_running_requests") or max_running_requests(flags, env)
    largest = min(_graph_max_bs(flags), int(cap))
    return 0.5 + 2.5 * largest / 256 + (2.5 if flags.get("enable_torch_compile") else 0.0)


def startup(flags: dict[str, Any], env: dict[str, str]) -> dict | None:
    tp, mem, moe = _tp(flags), _mem_fraction(flags), flags.get("moe_runner_backend")
    weights = _WEIGHTS_GIB_TOTAL / (tp * _pp(flags))  # each replica holds the whole model over tp x pp
    if weights > _GPU_GIB * 0.95:
        return {"phase": "loading", "error": (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 0 has a total "
            "capacity of 95.59 GiB of which 812.00 MiB is free. Including non-PyTorch memory, this "
            "process has 94.78 GiB memory in use.")}
    if tp > 1 and env.get("NCCL_NVLS_ENABLE") == "1":
        return {"phase": "loading", "hang": True}  # NVLink SHARP on a PCIe box: stuck in NCCL init
    if mem * _GPU_GIB - weights < 4.0:
        return {"phase": "kv_cache", "error": failure_text(flags, "kv_oom", mem=mem)}
    # FlashInfer JIT-builds the trtllm-gen MoE kernels for SM100 only (jit/fused_moe.py): on SM120
    # the first call refuses: at autotune when it runs, else where the kernel first runs.
    sm100_only = failure_text(flags, "no_arch", majors=[10])
    if moe == "flashinfer_mxfp4":
        return {"phase": "autotune" if autotunes(flags) else "cuda_graph", "error": sm100_only}
    if moe in ("flashinfer_trtllm", "flashinfer_trtllm_routed"):
        return {"phase": "autotune" if autotunes(flags) else "warmup", "error": sm100_only}
    # --fp8-gemm-backend's dest is fp8_gemm_runner_backend
    if autotunes(flags) and flags.get("fp8_gemm_runner_backend") in ("flashinfer_trtllm", "flashinfer_deepgemm"):
        return {"phase": "autotune", "error": failure_text(flags, "ninja", output=failure_text(flags, "ninja_output"))}
    if not graphs_off(flags):
        if allreduce_fusion(flags):  # the trtllm allreduce-fusion module is built for SM90/SM100 (jit/comm.py)
            return {"phase": "cuda_graph", "error": failure_text(
                flags, "graph_failed", error=failure_text(flags, "no_arch", raised=False, majors=[9, 10]))}
        if _graph_gib(flags, env) > (1.0 - mem) * _GPU_GIB - _ACTIVATION_GIB:
            return {"phase": "cuda_graph", "error": failure_text(flags, "graph_failed", error=_TORCH_OOM_GRAPH)}
    elif mem > 0.96:
        return {"phase": "warmup", "error": (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
            "capacity of 95.59 GiB of which 1.12 GiB is free.")}
    return None


def _tuned(running: int) -> float:
    """Interpolate the tuned curve linearly in log2(running)."""
    r = max(1, running)
    for (r0, t0), (r1, t1) in zip(_TUNED, _TUNED[1:]):
        if r <= r1:
            f = (math.log2(r) - math.log2(r0)) / (math.log2(r1) - math.log2(r0))
            return t0 + f * (t1 - t0)
    return _TUNED[-1][1]


def _nccl_channels(env: dict[str, str]) -> float:
    """A little gain from more NCCL channels on PCIe, then a little loss (SMs taken from compute)."""
    try:
        n = int(env.get("NCCL_MIN_NCHANNELS", "0"))
    except ValueError:
        return 1.0
    return {0: 1.0, 1: 0.98, 2: 0.99, 4: 1.0, 8: 1.02, 16: 1.025, 32: 1.01}.get(n, 1.0 if n < 8 else 1.005)


def throughput(flags: dict[str, Any], env: dict[str, str], running: int) -> float:
    replicas = _replicas(flags)  # the requests spread evenly over the replicas
    return replicas * _replica_rate(flags, env, max(1, running // replicas))


def _replica_rate(flags: dict[str, Any], env: dict[str, str], running: int) -> float:
    rate = _tuned(running) * _layout_factor(flags, running) * _MOE_FACTOR.get(flags.get("moe_runner_backend"), 0.85)
    if not autotunes(flags):
        rate *= _NO_AUTOTUNE
    if not graphs_off(flags):
        rate *= _GRAPH_SMALL_BATCH if running <= _graph_max_bs(flags) else _GRAPH_LARGE_BATCH
    if flags.get("enable_torch_compile") and not graphs_off(flags):
        rate *= 1.03
    rate *= _nccl_channels(env)
    gpus = _tp(flags) * _pp(flags)
    return rate * (gpus / 8) ** 0.5 if gpus < 8 else rate  # fewer GPUs, less bandwidth


def phase_seconds(flags: dict[str, Any], env: dict[str, str]) -> dict[str, float]:
    seconds = {"starting": 25.0, "loading": 83 * 3.0, "kv_cache": 6.0, "cuda_graph": 70.0, "warmup": 5.0}
    seconds["autotune"] = 95.0 if autotunes(flags) else _FP4_GEMM_AUTOTUNE_S if fp4_gemm_autotunes(flags) else 0.0
    if flags.get("enable_torch_compile"):
        seconds["cuda_graph"] += 240.0
    return seconds


def max_running_requests(flags: dict[str, Any], env: dict[str, str]) -> int:
    """SGLang's auto cap follows the KV pool: ~64 KiB per token per GPU, 256 tokens per request."""
    kv_gib = _mem_fraction(flags) * _GPU_GIB - _WEIGHTS_GIB_TOTAL / (_tp(flags) * _pp(flags)) - (0 if graphs_off(flags) else 3.0)
    tokens = int(max(kv_gib, 0.5) * 1024 * 16)
    return max(1, min(2048, tokens // 256))


def corrupt(flags: dict[str, Any], env: dict[str, str]) -> bool:
    """The seed hit NaN logits with an incompatible attention backend for the NSA model."""
    return flags.get("attention_backend") == "triton"
