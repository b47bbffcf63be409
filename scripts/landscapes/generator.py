"""Landscapes drawn from a seed: held-out machines for the search benchmark.

The hand-written landscapes next to this file are what the strategy was tuned on, so its figures
there say little about the next machine. `make(seed)` draws a new one from families of the
effects real servers show, each with its own size, sign and position:

- a saturating decode curve (peak tok/s, the batch at half of it);
- a KV-cache knee past which requests are retracted and throughput falls; the knee moves with
  `--mem-fraction-static`, so it sets the best `--max-running-requests`;
- CUDA graphs that help or hurt while the batch fits the captured sizes, and eager fallback
  past the largest captured batch;
- a ranking of MoE backends, some of which crash at autotune (FlashInfer's JIT build failing) or
  have no kernel for the GPU;
- a memory-fraction OOM edge that moves down as the captured graph batch grows, and a low
  edge where the KV pool does not fit at all;
- an interior optimum of NCCL_MIN_NCHANNELS;
- allreduce fusion that helps, hurts or is unsupported on the GPU;
- two-flag interactions (a backend that gains more with graphs; fusion that pays only with
  graphs) and configs that hang in graph capture;
- the landscape's own measurement noise (2-5%), which the benchmark applies.

Each landscape is a module-like object with the emulator's landscape interface
(search/emulator/landscape.py): `startup`, `throughput`, `phase_seconds`,
`max_running_requests`, for the flags of `generated_space.yaml` (SGLang 0.5.9).
Failure texts are real SGLang, PyTorch and CUDA texts (source next to each).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

BACKENDS = ("auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "flashinfer_cutlass", "cutlass")
AUTOTUNED = ("flashinfer_trtllm", "flashinfer_cutlass")  # FlashInfer's MoE autotuner runs for these

# sglang 0.5.9, srt/model_executor/model_runner_kv_cache_mixin.py:417 (f"...{self.server_args.mem_fraction_static=}").
_KV_TOO_SMALL = ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                 "Current value: self.server_args.mem_fraction_static={mem}")
# The seed run's FlashInfer JIT failure (shared/seeds, the TODO in model_runner.py warned of it).
_NINJA = ("subprocess.CalledProcessError: Command '['ninja', '-v', '-C', "
          "'/root/.cache/flashinfer/0.5.3/120/cached_ops', '-f', "
          "'/root/.cache/flashinfer/0.5.3/120/cached_ops/build.ninja']' returned non-zero exit status 1.")
# CUDA's cudaErrorNoKernelImageForDevice as PyTorch raises it (c10/cuda/CUDAException.cpp).
_NO_KERNEL = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
# PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp), inside sglang 0.5.9's
# capture wrapper (srt/model_executor/cuda_graph_runner.py: "Capture cuda graph failed").
_GRAPH_OOM = ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 512.00 MiB. "
              "GPU 0 has a total capacity of 79.19 GiB of which 211.50 MiB is free.")
_WARMUP_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. "
               "GPU 0 has a total capacity of 79.19 GiB of which 611.50 MiB is free.")


@dataclass(frozen=True)
class Generated:
    """One drawn machine; `make(seed)` fills it. Every rate is output tok/s of the whole server."""

    SEPARABLE: ClassVar[tuple[str, ...]] = ("NCCL_MIN_NCHANNELS",)  # its own factor (bench_search checks)

    seed: int
    noise: float
    peak: float
    half: float
    knee0: float  # running batch where the KV knee sits at --mem-fraction-static 0.80
    knee_growth: float  # the knee's growth per 0.01 of memory fraction (multiplicative)
    knee_drop: float  # exponent of the fall past the knee
    graph_gain: float  # while the batch fits the captured sizes; may be negative
    graph_tail: float  # past the largest captured batch
    mem_edge: float  # OOM above this fraction with graphs off
    graph_mem: float  # how far the edge moves down per doubling of the captured batch past 32
    low_edge: float  # "Not enough memory" below this fraction (0.0: never)
    backend: dict[str, float] = field(default_factory=dict)
    crashes: dict[str, str] = field(default_factory=dict)  # backend -> phase:text
    nccl_opt: float = 8.0
    nccl_amp: float = 0.0
    fusion_gain: float = 0.0
    fusion_unsupported: bool = False
    fusion_needs_graphs: bool = False
    graph_backend: str | None = None  # gains `graph_pair` more with graphs on
    graph_pair: float = 0.0
    hang_backend: str | None = None  # hangs in graph capture with graphs on

    @property
    def __file__(self) -> str:  # what the benchmark prints as the landscape's name
        return f"generated:{self.seed}"

    def _graphs(self, flags: dict[str, Any]) -> bool:
        return not flags.get("disable_cuda_graph")

    def _graph_bs(self, flags: dict[str, Any]) -> int:
        """The largest batch captured: the graph batch cap, but never past the request pool, which
        --max-running-requests sets (SGLang 0.5.23 srt/model_executor/runner/base_cuda_graph_runner.py,
        the decode capture sizes: ``capture_bs = [bs for bs in capture_bs if bs <= num_max_requests]``
        with ``num_max_requests = model_runner.req_to_token_pool.size``). So a graph batch above the
        cap costs neither memory nor capture time."""
        return min(int(flags.get("cuda_graph_max_bs") or 256), int(flags.get("max_running_requests") or 4096))

    def _edge(self, flags: dict[str, Any]) -> float:
        if not self._graphs(flags):
            return self.mem_edge
        return self.mem_edge - self.graph_mem * max(0.0, math.log2(self._graph_bs(flags) / 32))

    def startup(self, flags: dict[str, Any], env: dict[str, str]) -> dict[str, Any] | None:
        mem = float(flags.get("mem_fraction_static") or 0.85)
        backend = flags.get("moe_runner_backend") or "auto"
        if mem < self.low_edge:
            return {"phase": "kv_cache", "error": _KV_TOO_SMALL.format(mem=mem)}
        if backend in self.crashes:
            phase, text = self.crashes[backend].split(":", 1)
            return {"phase": phase, "error": text}
        if flags.get("enable_flashinfer_allreduce_fusion") and self.fusion_unsupported:
            return {"phase": "warmup", "error": _NO_KERNEL}
        if self._graphs(flags) and backend == self.hang_backend:
            return {"phase": "cuda_graph", "hang": True}
        if mem > self._edge(flags):
            return ({"phase": "cuda_graph", "error": _GRAPH_OOM} if self._graphs(flags)
                    else {"phase": "warmup", "error": _WARMUP_OOM})
        return None

    def max_running_requests(self, flags: dict[str, Any], env: dict[str, str]) -> int:
        return 4096

    def throughput(self, flags: dict[str, Any], env: dict[str, str], running: int) -> float:
        mem = float(flags.get("mem_fraction_static") or 0.85)
        backend = flags.get("moe_runner_backend") or "auto"
        rate = self.peak * running / (running + self.half)
        knee = self.knee0 * self.knee_growth ** ((mem - 0.80) * 100)
        if running > knee:
            rate *= (knee / running) ** self.knee_drop
        graphs = self._graphs(flags)
        if graphs:
            rate *= 1 + (self.graph_gain if running <= self._graph_bs(flags) else self.graph_tail)
            if backend == self.graph_backend:
                rate *= 1 + self.graph_pair
        rate *= self.backend.get(backend, 0.5)
        if flags.get("enable_flashinfer_allreduce_fusion") and (graphs or not self.fusion_needs_graphs):
            rate *= 1 + self.fusion_gain
        channels = float(env.get("NCCL_MIN_NCHANNELS") or 2)
        rate *= 1 - self.nccl_amp * min(1.0, (math.log2(channels / self.nccl_opt) / 3) ** 2)
        return rate

    def phase_seconds(self, flags: dict[str, Any], env: dict[str, str]) -> dict[str, float]:
        out = {"starting": 20.0, "loading": 240.0, "kv_cache": 15.0, "warmup": 10.0}
        if (flags.get("moe_runner_backend") or "auto") in AUTOTUNED:
            out["autotune"] = 90.0
        if self._graphs(flags):
            out["cuda_graph"] = 30.0 + 40.0 * self._graph_bs(flags) / 1024
        return out


# The baseline of generated_space.yaml as flags: every landscape must start it (the config a
# user runs today works), so a draw that would crash or hang it is drawn again.
BASELINE_FLAGS: dict[str, Any] = {"max_running_requests": 128, "disable_cuda_graph": False, "cuda_graph_max_bs": 128,
                                  "moe_runner_backend": "auto", "enable_flashinfer_allreduce_fusion": False,
                                  "mem_fraction_static": 0.85}


def make(seed: int) -> Generated:
    """The landscape of `seed`: every effect's size, sign and position drawn from it."""
    rng = random.Random(f"landscape-{seed}")
    while (land := _draw(seed, rng)).startup(BASELINE_FLAGS, {}) is not None:
        pass
    return land


def _draw(seed: int, rng: random.Random) -> Generated:
    factors = {b: rng.uniform(0.55, 0.97) for b in BACKENDS}
    factors[rng.choice(BACKENDS)] = 1.0
    crashes: dict[str, str] = {}
    for b in rng.sample([b for b in BACKENDS if factors[b] < 1.0], k=rng.choice((0, 1, 1, 2))):
        crashes[b] = "autotune:" + _NINJA if b in AUTOTUNED and rng.random() < 0.7 else "warmup:" + _NO_KERNEL
    hang = rng.choice([b for b in BACKENDS if b not in crashes]) if rng.random() < 0.3 else None
    return Generated(
        seed=seed,
        noise=rng.uniform(0.02, 0.05),
        peak=rng.uniform(1500.0, 9000.0),
        half=math.exp(rng.uniform(math.log(40), math.log(500))),
        knee0=math.exp(rng.uniform(math.log(60), math.log(1500))),
        knee_growth=rng.uniform(1.0, 1.12),
        knee_drop=rng.uniform(0.2, 0.9),
        graph_gain=rng.uniform(-0.06, 0.18),
        graph_tail=rng.uniform(-0.12, 0.02),
        mem_edge=rng.uniform(0.88, 0.975),
        graph_mem=rng.uniform(0.0, 0.02),
        low_edge=rng.uniform(0.80, 0.84) if rng.random() < 0.3 else 0.0,
        backend=factors,
        crashes=crashes,
        nccl_opt=math.exp(rng.uniform(math.log(2), math.log(24))),
        nccl_amp=rng.uniform(0.0, 0.08),
        fusion_gain=rng.uniform(-0.04, 0.10),
        fusion_unsupported=rng.random() < 0.25,
        fusion_needs_graphs=rng.random() < 0.3,
        graph_backend=rng.choice(BACKENDS) if rng.random() < 0.5 else None,
        graph_pair=rng.uniform(0.02, 0.10),
        hang_backend=hang,
    )
