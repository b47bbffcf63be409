"""A runner that plays each trial from a throughput function in this process, as `InProcessRunner`
runs one on a server: the driver, strategy and storage are the product's, only the server is not.

Used where what is tested is the driver's own choice of configs (which the server's timing cannot
change), so a whole study takes a second instead of a server start per trial.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from search.loadtest import LevelResult
from search.runner import Hooks, Job
from search.storage import Outcome
from search.trial import TrialResult

Throughput = Callable[[Mapping[str, Any], int], float]  # (config, concurrency) -> output tok/s


def level(concurrency: int, tok_s: float) -> LevelResult:
    """A ladder level that met every SLO at ``tok_s``."""
    return LevelResult(concurrency, concurrency, 1.0, 10, 100, 100, 10.0, 100.0, tok_s, tok_s + 100.0, *([None] * 16))


class SimulatedRunner:
    """One job at a time; each ladder level of the space gets ``throughput(config, concurrency)``."""

    def __init__(self, throughput: Throughput) -> None:
        self.throughput = throughput
        self._job: tuple[Job, Hooks] | None = None

    def free(self) -> int:
        return 0 if self._job else 1

    def start(self, job: Job, hooks: Hooks) -> None:
        self._job = (job, hooks)
        hooks.placed("simulated")

    def wait(self, timeout: float) -> list[tuple[Job, TrialResult]]:
        if self._job is None:
            return []
        (job, hooks), self._job = self._job, None
        levels: list[LevelResult] = []
        for concurrency in job.space.load_test.concurrency:
            levels.append(level(concurrency, self.throughput(job.config, concurrency)))
            if not hooks.level(levels[-1]):
                return [(job, TrialResult(Outcome.PRUNED, job.trial_dir, job.marker, levels=levels, slo_ok=True))]
        peak = max(levels, key=lambda lv: lv.output_throughput)
        return [(job, TrialResult(Outcome.COMPLETED, job.trial_dir, job.marker, levels=levels, slo_ok=True,
                                  objective=peak.output_throughput, peak_concurrency=peak.max_concurrency))]

    def cancel(self) -> None:
        self._job = None

    def kill_marker(self, marker: str, host: str) -> int:
        return 0

    def close(self) -> None:
        self._job = None
