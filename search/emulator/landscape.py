"""A landscape: the Python file that decides how a configuration starts, fails and performs.

Interface (other landscapes, unseen by our tests, get plugged in; keep it exact):
    startup(flags, env) -> None | {"phase", "error"} | {"phase", "hang": True}   (required)
    throughput(flags, env, running) -> total output tokens/s                     (required)
    phase_seconds(flags, env) -> {phase: unscaled seconds}                       (optional)
    max_running_requests(flags, env) -> the automatic cap                        (optional)
    corrupt(flags, env) -> True when outputs are wrong (NaN logits)              (optional)
    prefill(flags, env) -> {"tokens_per_s": float, "batch_overhead_s": float}    (optional)
`prefill` shapes what prompts cost: uncached prompt tokens per second of a prefill batch and a
fixed cost per batch (default 40,000 tok/s and 0 s). The flags shape the rest as SGLang does:
`--disable-radix-cache` (no prefix hits), `--schedule-policy` (lpm orders the queue by cached
prefix), `--chunked-prefill-size` / `--max-prefill-tokens` (tokens per batch, so with an overhead
smaller chunks cost more batches); a landscape that wants the radix cache or a policy to cost
decode speed reads those flags in `throughput`.
`flags` maps every argparse dest of the version to its value (defaults filled); `env` is the
server's environment.

The autotune phase runs when SGLang's own rule for the version says so, unless the landscape's
phase_seconds names "autotune" explicitly: > 0 runs it (a patched SGLang, as in the seed run),
0 skips it; a failure or hang there runs it too. Graph capture runs only when the flags leave
decode CUDA graphs on (search.emulator.cuda_graphs), so a failure or hang in "cuda_graph" for
flags that turn them off is refused with a LandscapeError rather than silently skipped.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

PHASES = ("loading", "kv_cache", "autotune", "cuda_graph", "warmup")
# Unscaled seconds per phase when the landscape does not say ("starting" = torch distributed init).
DEFAULT_PHASE_SECONDS = {"starting": 10.0, "loading": 240.0, "kv_cache": 8.0, "autotune": 60.0,
                         "cuda_graph": 45.0, "warmup": 4.0}
DEFAULT_MAX_RUNNING_REQUESTS = 2048
DEFAULT_PREFILL = {"tokens_per_s": 40_000.0, "batch_overhead_s": 0.0}
BUILTIN = Path(__file__).parent / "landscapes" / "seed.py"


class LandscapeError(Exception):
    """The landscape file is missing, broken, or answered outside the interface."""


@dataclass
class Landscape:
    module: ModuleType
    path: Path

    @classmethod
    def load(cls, path: Path | None) -> "Landscape":
        path = path or BUILTIN
        spec = importlib.util.spec_from_file_location(f"search_emulator_landscape_{path.stem}", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise LandscapeError(f"landscape {path} not found; set SEARCH_EMULATOR_LANDSCAPE to a .py file")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # a user's file: report whatever broke it
            raise LandscapeError(f"landscape {path} failed to import: {exc!r}") from exc
        for name in ("startup", "throughput"):
            if not callable(getattr(module, name, None)):
                raise LandscapeError(f"landscape {path} defines no {name}(flags, env); see search/emulator/landscape.py")
        return cls(module, path)

    def startup(self, flags: dict[str, Any], env: dict[str, str]) -> dict[str, Any] | None:
        outcome = self.module.startup(flags, env)
        if outcome is not None and (outcome.get("phase") not in PHASES
                                    or not (outcome.get("hang") or isinstance(outcome.get("error"), str))):
            raise LandscapeError(f"landscape {self.path}: startup() returned {outcome!r}; "
                                 f"need None or {{'phase': one of {PHASES}, 'error': str | 'hang': True}}")
        return outcome

    def throughput(self, flags: dict[str, Any], env: dict[str, str], running: int) -> float:
        return max(0.0, float(self.module.throughput(flags, env, running)))

    def phase_seconds(self, flags: dict[str, Any], env: dict[str, str]) -> tuple[dict[str, float], float | None]:
        """Seconds per phase (defaults filled) and the landscape's explicit autotune entry, if any."""
        given = getattr(self.module, "phase_seconds", None)
        own = dict(given(flags, env)) if given else {}
        return {**DEFAULT_PHASE_SECONDS, **{k: float(v) for k, v in own.items()}}, own.get("autotune")

    def max_running_requests(self, flags: dict[str, Any], env: dict[str, str]) -> int:
        given = getattr(self.module, "max_running_requests", None)
        return max(1, int(given(flags, env))) if given else DEFAULT_MAX_RUNNING_REQUESTS

    def prefill(self, flags: dict[str, Any], env: dict[str, str]) -> dict[str, float]:
        """``{"tokens_per_s", "batch_overhead_s"}``, the landscape's where it gives them."""
        given = getattr(self.module, "prefill", None)
        own = dict(given(flags, env)) if given else {}
        figures = {**DEFAULT_PREFILL, **{k: float(v) for k, v in own.items()}}
        if set(figures) != set(DEFAULT_PREFILL) or figures["tokens_per_s"] <= 0 or figures["batch_overhead_s"] < 0:
            raise LandscapeError(f"landscape {self.path}: prefill() returned {own!r}; need "
                                 "{'tokens_per_s': > 0, 'batch_overhead_s': >= 0}")
        return figures

    def corrupt(self, flags: dict[str, Any], env: dict[str, str]) -> bool:
        given = getattr(self.module, "corrupt", None)
        return bool(given(flags, env)) if given else False
