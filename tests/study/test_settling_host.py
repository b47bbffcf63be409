"""A host held by a cleanup, not a trial, is waited for: the driver does not stop the study.

On Ray, a trial lost with its node leaves a sweep that holds the host's count until it ends. When
the other host's trial ended first, the driver saw nothing running and no host free, and stopped
with "no host is free to run a trial" (seen in CI: `test_a_host_that_dies_costs_only_its_trial`).
The runner here holds its one host for a few waits after a chosen trial, as that sweep does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from search.runner import Hooks, Job, PlayedRunner
from search.space import load_space
from search.study import StudyRun
from search.trial import TrialResult
from tests.helpers import write_space
from tests.study.simulated import simulated_runner

PARAMS = {"--max-running-requests": {"type": "int", "low": 8, "high": 1024, "log": True}}


def throughput(config: Mapping[str, Any], concurrency: int) -> float:
    return float(min(config["--max-running-requests"], concurrency) * 10)


class CleanupAfterSecond(PlayedRunner):
    """Plays trials; after the second, its one host is held for three waits by a cleanup."""

    def __init__(self) -> None:
        super().__init__(simulated_runner(throughput).play)
        self.played = 0
        self.cleanup_waits = 0

    def free(self) -> int:
        return 0 if self.cleanup_waits else super().free()

    def settling(self) -> bool:
        return self.cleanup_waits > 0

    def wait(self, timeout: float) -> list[tuple[Job, TrialResult]]:
        if self.cleanup_waits:
            self.cleanup_waits -= 1
            return []
        done = super().wait(timeout)
        self.played += len(done)
        if self.played == 2 and done:
            self.cleanup_waits = 3
        return done

    def start(self, job: Job, hooks: Hooks) -> None:
        assert not self.cleanup_waits, "a trial was started on a host its cleanup still held"
        super().start(job, hooks)


def test_a_host_held_by_a_cleanup_is_waited_for(tmp_path: Path) -> None:
    space = load_space(write_space(tmp_path, params=PARAMS, baseline={"--max-running-requests": 64}, targets={}))
    runner = CleanupAfterSecond()
    run = StudyRun(space=space, name="settling", runner=runner, storage=f"sqlite:///{tmp_path}/db.sqlite",
                   n_trials=4, remeasure=0, trials_dir=tmp_path / "trials")
    study = run.run()
    assert runner.cleanup_waits == 0
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                and "skipped" not in t.user_attrs]
    assert len(measured) == 4
