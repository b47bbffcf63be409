"""A runner that plays each trial from a throughput function in this process, as `InProcessRunner`
runs one on a server: the driver, strategy and storage are the product's, only the server is not.

Used where what is tested is the driver's own choice of configs (which the server's timing cannot
change), so a whole study takes a second instead of a server start per trial.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from search.loadtest import LevelResult
from search.runner import Hooks, Job, PlayedRunner
from search.storage import Outcome
from search.trial import TrialResult

Throughput = Callable[[Mapping[str, Any], int], float]  # (config, concurrency) -> output tok/s


def level(concurrency: int, tok_s: float) -> LevelResult:
    """A ladder level that met every SLO at ``tok_s``."""
    return LevelResult(concurrency, concurrency, 1.0, 10, 100, 100, 10.0, 100.0, tok_s, tok_s + 100.0, *([None] * 16))


def simulated_runner(throughput: Throughput) -> PlayedRunner:
    """Each ladder level of the space gets ``throughput(config, concurrency)``."""

    def play(job: Job, hooks: Hooks) -> TrialResult:
        levels: list[LevelResult] = []
        for concurrency in job.space.load_test.concurrency:
            levels.append(level(concurrency, throughput(job.config, concurrency)))
            if not hooks.level(levels[-1]):
                return TrialResult(Outcome.PRUNED, job.trial_dir, job.marker, levels=levels, slo_ok=True)
        peak = max(levels, key=lambda lv: lv.output_throughput)
        return TrialResult(Outcome.COMPLETED, job.trial_dir, job.marker, levels=levels, slo_ok=True,
                           objective=peak.output_throughput, peak_concurrency=peak.max_concurrency)

    return PlayedRunner(play)
