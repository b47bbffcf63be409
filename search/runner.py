"""Where a study's trials run: the runner protocol the driver is written against, and the in-process runner.

The driver (`search.study.StudyRun`) hands a runner :class:`Job` s and collects
`search.trial.TrialResult` s; it never knows whether they ran here one at a time
(:class:`InProcessRunner`, on the hosts of a pool in turn) or on a cluster
(`search.parallel.RayRunner`, one per Ray node). Runners call the driver back through
:class:`Hooks`, so level results reach the pruner wherever the trial runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from search.errors import BadInput, InfrastructureFault
from search.hosts.base import Host
from search.lifecycle import Failure
from search.loadtest import LevelResult
from search.logwatch import Event
from search.space import Space
from search.storage import Outcome
from search.trial import TrialResult, run_trial


@dataclass(frozen=True)
class Job:
    """One server run the driver wants (a trial or a re-measurement): plain data, so it can travel to a Ray node."""

    space: Space
    config: dict[str, Any]
    marker: str
    trial_dir: Path  # where the driver keeps its artifacts
    baseline_answers: list[str] | None = None


@dataclass
class Hooks:
    """The driver's side of a running job; runners call these on the driver's thread, never concurrently."""

    placed: Callable[[str], None] = lambda host: None  # the job started on this host
    event: Callable[[Event], None] = lambda event: None
    level: Callable[[LevelResult], bool] = lambda level: True  # False prunes


class Runner(Protocol):
    """Where jobs run. The driver starts jobs while ``free()`` allows and collects them with ``wait``."""

    def free(self) -> int:
        """How many more jobs could start now."""
        ...

    def settling(self) -> bool:
        """Whether a host is held by a cleanup, not a job (a lost trial's sweep on Ray): it comes free
        in a later ``wait`` without any job ending, so the driver waits instead of stopping."""
        ...

    def start(self, job: Job, hooks: Hooks) -> None:
        """Begin ``job``; its events and levels reach ``hooks`` during later ``wait`` calls."""
        ...

    def wait(self, timeout: float) -> list[tuple[Job, TrialResult]]:
        """Relay progress to the hooks for up to ``timeout`` s; return the jobs that finished."""
        ...

    def cancel(self) -> None:
        """Tear every running job down (Ctrl-C, or the study stopping); they are not returned."""
        ...

    def kill_marker(self, marker: str, host: str) -> int:
        """Kill what a dead run left carrying ``marker`` (``host``: where it ran, "" when unknown)."""
        ...

    def close(self) -> None:
        """Let go of what the runner holds (a cluster connection); running jobs are cancelled."""
        ...


def run_job(job: Job, host: Host, *, on_event: Callable[[Event], None] | None = None,
            on_level: Callable[[LevelResult], bool] | None = None, trial_dir: Path | None = None) -> TrialResult:
    """Run ``job`` on ``host`` (artifacts to ``trial_dir``, default the job's); a host fault becomes an outcome."""
    trial_dir = trial_dir or job.trial_dir
    try:
        return run_trial(job.space, job.config, host, trial_dir=trial_dir, marker=job.marker, on_event=on_event,
                         on_level=on_level, baseline_answers=job.baseline_answers)
    except InfrastructureFault as exc:
        return TrialResult(outcome=Outcome.INFRASTRUCTURE, artifacts=trial_dir, marker=job.marker,
                           failure=Failure("infrastructure", "starting", str(exc), True, str(exc)))


class InProcessRunner:
    """One job at a time in this process, on the hosts of ``pool`` in turn.

    Each job goes to the next host that is still available: a host that stays down
    (``SSHHost.available`` is False once its reconnects failed) is skipped, its trial having
    been an infrastructure fault that the driver re-enqueues, so the study goes on with the
    others. When no host is left, ``free()`` is 0 and the driver stops the study.
    """

    def __init__(self, pool: Sequence[Host], hosts: Mapping[str, Host] | None = None) -> None:
        if not pool:
            raise BadInput("no host to run trials on; list at least one in the hosts file")
        self.pool = list(pool)
        self.hosts = dict(hosts or {host.name: host for host in self.pool})  # to clean up a dead run's trials
        self._turn = 0  # index in pool of the host that gets the next job
        self._job: tuple[Job, Hooks, Host] | None = None

    def _next_host(self) -> Host | None:
        for step in range(len(self.pool)):
            host = self.pool[(self._turn + step) % len(self.pool)]
            if host.available:
                return host
        return None

    def free(self) -> int:
        return 0 if self._job or self._next_host() is None else 1

    def settling(self) -> bool:
        return False

    def start(self, job: Job, hooks: Hooks) -> None:
        host = self._next_host()
        assert host is not None, "start() while free() is 0"
        self._turn = (self.pool.index(host) + 1) % len(self.pool)
        self._job = (job, hooks, host)
        hooks.placed(host.name)

    def wait(self, timeout: float) -> list[tuple[Job, TrialResult]]:
        if self._job is None:
            return []
        job, hooks, host = self._job
        try:  # the trial records its own GPU telemetry (TrialResult.gpu)
            result = run_job(job, host, on_event=hooks.event, on_level=hooks.level)
        finally:  # KeyboardInterrupt: run_trial already tore the server down
            self._job = None
        return [(job, result)]

    def cancel(self) -> None:
        self._job = None

    def kill_marker(self, marker: str, host: str) -> int:
        return self.hosts.get(host, self.pool[0]).kill_marker(marker)

    def close(self) -> None:
        self._job = None


Play = Callable[[Job, Hooks], TrialResult]


class PlayedRunner:
    """One job at a time in this process, each played by ``play(job, hooks)`` instead of a server.

    For what measures the driver itself, where a server's timing changes nothing: the search
    benchmark plays trials from a landscape (scripts/bench_runner.py), tests from a throughput
    function; the strategy, pruner, sampler and storage they drive are the product's.
    """

    def __init__(self, play: Play) -> None:
        self.play = play
        self._job: tuple[Job, Hooks] | None = None

    def free(self) -> int:
        return 0 if self._job else 1

    def settling(self) -> bool:
        return False

    def start(self, job: Job, hooks: Hooks) -> None:
        self._job = (job, hooks)
        hooks.placed("played")

    def wait(self, timeout: float) -> list[tuple[Job, TrialResult]]:
        if self._job is None:
            return []
        (job, hooks), self._job = self._job, None
        return [(job, self.play(job, hooks))]

    def cancel(self) -> None:
        self._job = None

    def kill_marker(self, marker: str, host: str) -> int:
        return 0  # nothing played leaves a process behind

    def close(self) -> None:
        self._job = None
