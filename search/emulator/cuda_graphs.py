"""Which forward phases capture CUDA graphs, resolved from the flags the way SGLang resolves them.

0.5.23 (`srt/arg_groups/cuda_graph_hook.py`, `parse_cuda_graph_config`) merges, lowest first:
defaults (decode `full`, prefill `breakable` on CUDA), `--disable-cuda-graph`, the per-phase
`--disable-{decode,prefill}-cuda-graph`, the per-phase `--cuda-graph-backend-*` and
`--cuda-graph-max-bs-*` flags, then the `--cuda-graph-config` JSON. 0.5.8/0.5.9 know only
`--disable-cuda-graph` for decode; their prefill graphs are the opt-in piecewise ones.
The version is told by the flags themselves (only 0.5.23 has `cuda_graph_backend_decode`), so
the built-in landscape can use this too.
"""

from __future__ import annotations

from typing import Any

DISABLED = "disabled"
_DEFAULT_BACKEND = {"decode": "full", "prefill": "breakable"}


def _json(flags: dict[str, Any], phase: str) -> dict[str, Any]:
    config = flags.get("cuda_graph_config")
    settings = config.get(phase) if isinstance(config, dict) else None
    return settings if isinstance(settings, dict) else {}


def backend(flags: dict[str, Any], phase: str) -> str:
    """`full`, `breakable` or `disabled` for phase `decode` or `prefill`."""
    if "cuda_graph_backend_decode" not in flags:  # 0.5.8 / 0.5.9
        if flags.get("disable_cuda_graph"):
            return DISABLED
        if phase == "decode":
            return "full"
        return "breakable" if flags.get("enable_piecewise_cuda_graph") else DISABLED
    chosen = _DEFAULT_BACKEND[phase]
    if flags.get("disable_cuda_graph") or flags.get(f"disable_{phase}_cuda_graph"):
        chosen = DISABLED
    chosen = flags.get(f"cuda_graph_backend_{phase}") or chosen
    return str(_json(flags, phase).get("backend") or chosen)


def on(flags: dict[str, Any], phase: str = "decode") -> bool:
    return backend(flags, phase) != DISABLED


def decode_max_bs(flags: dict[str, Any]) -> int | None:
    """The largest decode batch to capture when the flags set it (None: SGLang's automatic size)."""
    given = _json(flags, "decode").get("max_bs") or flags.get("cuda_graph_max_bs_decode") \
        or flags.get("cuda_graph_max_bs")
    return int(given) if given else None


def decode_bs(flags: dict[str, Any]) -> list[int] | None:
    """The explicit list of decode batch sizes to capture, if the flags give one."""
    given = _json(flags, "decode").get("bs") or flags.get("cuda_graph_bs_decode") or flags.get("cuda_graph_bs")
    return sorted(int(b) for b in given) if given else None
