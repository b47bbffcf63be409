"""The study driver: Optuna ask/tell over a space, one trial at a time, safe to stop and resume.

This module is the only writer to the study storage. Every trial goes through the
`search.strategy.Strategy` (the same object `scripts/bench_search.py` measures), runs with
`search.trial.run_trial` through a :class:`Runner`, and is recorded with the user attributes
every view reads (docs/architecture.md, "What a study stores per trial"). The runner decides
where and how many trials run at once: :class:`InProcessRunner` runs one at a time on one host,
`search.parallel.RayRunner` one per Ray node; the driver loop is the same for both, so asks
overlap (the sampler's constant liar spreads them) and level results still reach the pruner.

Overnight safety comes from three rules:

- before a server starts, its trial already carries the trial marker and the driver's identity,
  so a later run can find a dead run's RUNNING trials, kill what they left by marker, and fail
  and re-enqueue them (nothing measured is lost: finished trials are untouched);
- Ctrl-C and every stop signal (SIGTERM, SIGHUP: `search.stop_signals`) tear the running trials
  down and record them as infrastructure faults, re-enqueued, so running the same command again continues;
- an infrastructure fault is never blamed on the config, but the same config failing that way
  `MAX_INFRA_RETRIES` times in a row on one host in one run stops the study with the host's message.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

from search import correctness
from search.errors import BadInput, InfrastructureFault, RunFailed
from search.hosts.base import Host
from search.lifecycle import Failure
from search.logwatch import Event
from search.loadtest import LevelResult
from search.lock import StudyLock
from search.names import checked_study_name
from search.space import Space, parse_space
from search.stop_signals import stop_signals_as_interrupt
from search.strategy import Strategy
from search.trial import TrialResult, run_trial

DEFAULT_STORAGE = "sqlite:///studies.db"
MAX_INFRA_RETRIES = 3  # consecutive infrastructure faults of one config on one host in one run before the study stops
TOP_K = 3  # configs re-measured at the end
SPACE_ATTR = "space"  # study user attr: the space as data, so views and export need no file
REMEASURED_ATTR = "remeasured"  # study user attr: {trial number: [objective per repeat]}
REMEASURE_GPU_ATTR = "remeasure_gpu_seconds"  # study user attr: GPU seconds the re-measurement runs held
_DRIVER_ATTR = "driver"  # trial user attr: who ran it, to tell a dead run's RUNNING trial from a live one
_MARKER_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
WAIT_S = 0.5  # longest the driver waits on its runner before checking the budget again


class Interrupted(Exception):
    """Ctrl-C or another stop signal stopped the study after recording the running trial."""


# --------------------------------------------------------------------------- storage


def study_names(storage: str) -> list[str]:
    """Names of the studies in ``storage`` (empty when the database is new)."""
    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]


def load(name: str, storage: str = DEFAULT_STORAGE) -> optuna.Study:
    """An existing study; BadInput naming the studies that exist otherwise."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = study_names(storage)
    if name not in names:
        known = f"studies in {storage}: {', '.join(names)}" if names else f"{storage} holds no studies yet"
        raise BadInput(f"no study named {name!r} ({known}); run `search study run SPACE --study {name}` first")
    return optuna.load_study(study_name=name, storage=storage)


def space_of(study: optuna.Study) -> Space:
    """The space the study was created with (stored on the study as data)."""
    data = study.user_attrs.get(SPACE_ATTR)
    if data is None:
        raise BadInput(f"study {study.study_name!r} was not created by `search study run` (no space stored)")
    return parse_space(data, f"study {study.study_name}")


def remeasured(study: optuna.Study) -> dict[int, list[float]]:
    """Re-measured objective values by trial number."""
    return {int(k): list(v) for k, v in study.user_attrs.get(REMEASURED_ATTR, {}).items()}


# --------------------------------------------------------------------------- driver identity


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()[19]


def _me() -> dict[str, Any]:
    pid = os.getpid()
    return {"hostname": socket.gethostname(), "boot": _boot_id(), "pid": pid, "start": _start_ticks(pid)}


def _driver_alive(driver: Mapping[str, Any] | None) -> bool:
    """Whether the driver that started a RUNNING trial is still running (same machine, same boot)."""
    if not driver or driver.get("hostname") != socket.gethostname() or driver.get("boot") != _boot_id():
        return False
    return driver.get("pid") != os.getpid() and _start_ticks(int(driver["pid"])) == driver.get("start")


# --------------------------------------------------------------------------- runners


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
        return TrialResult(outcome="infrastructure", artifacts=trial_dir, marker=job.marker,
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
            if getattr(host, "available", True):
                return host
        return None

    def free(self) -> int:
        return 0 if self._job or self._next_host() is None else 1

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


@dataclass
class _Running:
    """The driver's record of a trial in flight."""

    trial: optuna.Trial
    config: dict[str, Any]
    levels: list[LevelResult] = field(default_factory=list)


# --------------------------------------------------------------------------- the run


@dataclass
class Listener:
    """What the driver tells the progress display; every hook is optional."""

    trial_started: Callable[[int, str, Mapping[str, Any]], None] = lambda number, tag, config: None
    placed: Callable[[int, str], None] = lambda number, host: None
    event: Callable[[int, Event], None] = lambda number, event: None
    level: Callable[[int, LevelResult], None] = lambda number, level: None
    trial_done: Callable[[FrozenTrial], None] = lambda trial: None
    note: Callable[[str], None] = lambda text: None


@dataclass
class StudyRun:
    """One invocation of `search study run`."""

    space: Space
    name: str
    host: Host | None = None  # where trials run, one at a time; or give a runner
    storage: str = DEFAULT_STORAGE
    sampler: str = "tpe"
    seed: int | None = None
    n_trials: int = 40  # measured trials in the study (skipped and infrastructure-failed ones do not count)
    timeout_s: float | None = None  # wall clock for this invocation
    known: list[dict[str, Any]] = field(default_factory=list)  # --start-from / --from-study configs
    remeasure: int = 2  # repeats per top config at the end; 0 skips it
    trials_dir: Path = Path("trials")
    hosts: Mapping[str, Host] = field(default_factory=dict)  # by name, to clean up a dead run's trials
    listener: Listener = field(default_factory=Listener)
    runner: Runner | None = None  # default: InProcessRunner(host, hosts)
    study: optuna.Study | None = field(default=None, init=False)  # set by run()

    def __post_init__(self) -> None:
        checked_study_name(self.name)  # it names trials/<study>/
        if self.runner is None:
            if self.host is None:
                raise BadInput("a study needs a host or a runner to run its trials on")
            self.runner = InProcessRunner([self.host], self.hosts or None)
        self._began = time.monotonic()
        self._infra_streak: dict[str, Counter[str]] = {}  # config -> host -> faults in a row
        self._running: dict[str, _Running] = {}  # by marker

    # -- public ---------------------------------------------------------------------------
    def run(self) -> optuna.Study:
        """Create or resume the study, run trials until the budget is spent, then re-measure."""
        with StudyLock(self.storage, self.name):  # one driver per study, re-measurement included
            return self._run()

    def _run(self) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = self._open()
        self.strategy = Strategy(self.space, self.sampler, seed=self.seed)
        self._recover()
        self.strategy.start(self.study, self.known)
        with stop_signals_as_interrupt():
            try:
                self._trials()
                if not self._out_of_time():
                    self._remeasure()
            except KeyboardInterrupt:
                raise Interrupted(f"study {self.name!r} interrupted; running trials were torn down and will run "
                                  "again when you run the same command") from None
        return self.study

    def deadline_left(self) -> float | None:
        return None if self.timeout_s is None else max(0.0, self.timeout_s - (time.monotonic() - self._began))

    # -- setup ----------------------------------------------------------------------------
    def _open(self) -> optuna.Study:
        study = optuna.create_study(study_name=self.name, storage=self.storage, direction="maximize",
                                    sampler=None, load_if_exists=True)
        stored = study.user_attrs.get(SPACE_ATTR)
        mine = self.space.model_dump(mode="json")
        if stored is None:
            study.set_user_attr(SPACE_ATTR, mine)
        elif space_of(study).model_dump(mode="json") != mine:  # read as today's schema reads it (new defaults)
            raise BadInput(f"study {self.name!r} was created with a different space; resume it with the same space "
                           "file, or give a new --study name")
        return study

    def _marker(self, run: str) -> str:
        """A unique trial marker, ``search-<study>-<run>-<random>``, safe in an environment value."""
        return _MARKER_UNSAFE.sub("-", f"search-{self.name}-{run}-{uuid.uuid4().hex[:8]}")

    def _recover(self) -> None:
        """Fail and re-enqueue a dead run's RUNNING trials after killing what they left behind."""
        left = self.study.user_attrs.get("remeasuring")
        if left and not _driver_alive(left.get(_DRIVER_ATTR)):
            self.runner.kill_marker(left["marker"], left.get("host", ""))
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            driver = frozen.user_attrs.get(_DRIVER_ATTR)
            if _driver_alive(driver):
                raise BadInput(f"study {self.name!r} is being run by pid {driver['pid']} (trial {frozen.number}); "
                               "stop that run first: a study has one driver")
            marker = frozen.user_attrs.get("marker")
            killed = self.runner.kill_marker(marker, frozen.user_attrs.get("host", "")) if marker else 0
            self.listener.note(f"trial {frozen.number} was left RUNNING by a dead run"
                               f"{f'; killed {killed} leftover process(es)' if killed else ''}; running it again")
            failure = {"kind": "driver_killed", "phase": frozen.user_attrs.get("phase", "starting"), "line": "",
                       "message": "the driver died while this trial ran (kill -9, reboot); not the config's fault"}
            self.strategy.tell(self.study, optuna.Trial(self.study, frozen._trial_id), "infrastructure", failure=failure)

    # -- budget -----------------------------------------------------------------------------
    def measured(self) -> int:
        """Trials that ran to a verdict (skipped and infrastructure-failed ones do not count)."""
        if self.study is None:
            return 0
        finished = (TrialState.COMPLETE, TrialState.PRUNED)
        return sum(1 for t in self.study.get_trials(deepcopy=False, states=finished) if "skipped" not in t.user_attrs)

    def _out_of_time(self) -> bool:
        left = self.deadline_left()
        return left is not None and left <= 0

    # -- the trials ---------------------------------------------------------------------------
    def _wants_more(self) -> bool:
        return self.measured() + len(self._running) < self.n_trials and not self._out_of_time()

    def _trials(self) -> None:
        """Keep the runner busy until the budget is met; record each trial as it finishes.

        Anything that stops the loop (Ctrl-C, a study-stopping fault) first tears down and records
        every trial still running, so none is left RUNNING by a live driver.
        """
        try:
            while True:
                while self.runner.free() > 0 and self._wants_more():
                    self._launch()
                if not self._running:
                    if self._wants_more():
                        raise InfrastructureFault(f"study {self.name!r}: no host is free to run a trial; "
                                                  "check the cluster, then run the same command to continue")
                    return
                for job, result in self.runner.wait(WAIT_S):
                    self._finish(self._running.pop(job.marker), result)
        except BaseException:
            self.runner.cancel()
            for running in self._running.values():
                self._record_levels(running.trial, running.levels, [])
                self.strategy.tell(self.study, running.trial, "infrastructure", failure={
                    "kind": "interrupted", "phase": running.trial.user_attrs.get("phase", "starting"), "line": "",
                    "message": "stopped by Ctrl-C, SIGTERM or the study stopping; run the study again to measure it"})
                self.listener.trial_done(self.study.trials[running.trial.number])
            self._running.clear()
            raise

    def _launch(self) -> None:
        """Ask for the next trial and start it on the runner."""
        trial, config = self.strategy.ask(self.study)
        number = trial.number
        marker = self._marker(str(number))
        trial_dir = self.trials_dir / self.name / str(number)
        # Before the server exists: a later run must be able to find and kill it by this marker.
        for key, value in (("marker", marker), ("artifacts", str(trial_dir)), (_DRIVER_ATTR, _me())):
            trial.set_user_attr(key, value)
        running = self._running[marker] = _Running(trial, config)
        self.listener.trial_started(number, str(trial.user_attrs.get("strategy", "")), config)

        def placed(host: str) -> None:
            trial.set_user_attr("host", host)
            self.listener.placed(number, host)

        def level(result: LevelResult) -> bool:
            running.levels.append(result)
            self.listener.level(number, result)
            return self.strategy.on_level(self.study, trial, len(running.levels) - 1, result.max_concurrency,
                                          result.output_throughput)

        def event(seen: Event) -> None:
            if seen.kind == "phase":
                trial.set_user_attr("phase", seen.name)
            self.listener.event(number, seen)

        job = Job(self.space, config, marker, trial_dir, self._baseline_answers(number))
        self.runner.start(job, Hooks(placed=placed, event=event, level=level))

    def _finish(self, running: _Running, result: TrialResult) -> None:
        """Record a finished trial and bound infrastructure retries of its config."""
        trial, config = running.trial, running.config
        if result.outcome == "infrastructure" and not result.levels:
            result.levels = running.levels  # a lost worker returns none; keep what reached the driver
        if result.answers_differ is None and result.answers is not None:  # started before the baseline finished
            baseline = self._baseline_answers(trial.number)
            if baseline is not None:
                result.answers_differ = bool(correctness.compare(baseline, result.answers))
        self._record(trial, result, result.gpu)
        self.listener.trial_done(self.study.trials[trial.number])
        if result.outcome == "infrastructure":
            self._count_infra(config, trial.number, result)
        else:
            self._infra_streak.pop(_key(config), None)

    def _baseline_answers(self, number: int) -> list[str] | None:
        """The baseline's greedy answers, which every later trial's answers must match."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get("strategy") == "baseline" and t.number != number:
                path = Path(t.user_attrs.get("artifacts", "")) / "answers.json"
                if path.is_file():
                    return json.loads(path.read_text())
        return None

    @staticmethod
    def _record_levels(trial: optuna.Trial, levels: list[LevelResult], gpu: list[dict[str, Any]]) -> None:
        trial.set_user_attr("levels", [level.to_dict() for level in levels])
        if gpu:
            trial.set_user_attr("gpu", gpu)

    def _record(self, trial: optuna.Trial, result: TrialResult, gpu: list[dict[str, Any]]) -> None:
        """Store the record the views read, then tell the strategy the outcome."""
        self._record_levels(trial, result.levels, gpu)
        data = result.to_dict()
        for key in ("phases", "peak_output_throughput", "peak_concurrency", "slo_ok", "answers_differ",
                    "gpu_seconds", "teardown"):
            if data.get(key) is not None:
                trial.set_user_attr(key, data[key])
        failure = result.failure.to_dict() if result.failure else None
        outcome = result.outcome
        objective = result.objective
        if outcome == "completed" and objective is None:
            # No level met the SLOs: keep its best throughput, the slo constraint keeps it from winning.
            objective = max((level.output_throughput for level in result.levels), default=0.0)
        if outcome == "pruned" and result.levels and trial.user_attrs.get("pruned_because") is None:
            trial.set_user_attr("pruned_because", "the ladder stopped early")
        self.strategy.tell(self.study, trial, outcome, objective=objective, slo_ok=result.slo_ok,
                           answers_differ=bool(result.answers_differ), failure=failure)

    def _count_infra(self, config: Mapping[str, Any], number: int, result: TrialResult) -> None:
        """Stop the study when one config keeps failing on one host.

        Counted per host: a retried config goes to the next host still available, so a row of
        dead hosts (each then marked unavailable and skipped) must not stop a study that healthy
        hosts can carry on; when no host is left, the driver stops it anyway.
        """
        host = self.study.get_trials(deepcopy=False)[number].user_attrs.get("host", "")
        faults = self._infra_streak.setdefault(_key(config), Counter())
        faults[host] += 1
        message = result.failure.message if result.failure else "infrastructure fault"
        if faults[host] >= MAX_INFRA_RETRIES:
            raise RunFailed(f"study {self.name!r} stopped: trial {number}'s config hit {MAX_INFRA_RETRIES} infrastructure "
                            f"faults in a row on host {host or '?'} (last: {message}); fix the host, then run the same "
                            "command to continue")
        self.listener.note(f"trial {number}: infrastructure fault, will retry the same config: {message}")

    # -- the end ------------------------------------------------------------------------------
    def _remeasure(self) -> None:
        """Run the top configs `remeasure` more times each; the ranking and export use the mean."""
        if self.remeasure <= 0:
            return
        done = remeasured(self.study)
        for frozen in self.strategy.top(self.study, TOP_K):
            values = done.get(frozen.number, [])
            for repeat in range(len(values), self.remeasure):
                if self._out_of_time():
                    return
                self.listener.note(f"re-measuring trial {frozen.number} ({repeat + 1}/{self.remeasure})")
                value = self._measure_again(frozen, repeat)
                if value is None:
                    continue
                values.append(value)
                done[frozen.number] = values
                self.study.set_user_attr(REMEASURED_ATTR, {str(k): v for k, v in done.items()})

    def _measure_again(self, frozen: FrozenTrial, repeat: int) -> float | None:
        """One more full run of a finished trial's config: its objective, 0 if it crashed, None on a host fault."""
        marker = self._marker(f"{frozen.number}-r{repeat}")
        trial_dir = self.trials_dir / self.name / str(frozen.number) / f"remeasure-{repeat}"
        host = frozen.user_attrs.get("host", "")
        self.study.set_user_attr("remeasuring", {"marker": marker, "host": host, _DRIVER_ATTR: _me()})
        self.runner.start(Job(self.space, self.space.clean(frozen.params), marker, trial_dir), Hooks())
        try:
            while not (done := self.runner.wait(WAIT_S)):
                pass
        except KeyboardInterrupt:
            self.runner.cancel()
            raise Interrupted(f"study {self.name!r} interrupted during re-measurement; run the same command to "
                              "finish it") from None
        result = done[0][1]
        # GPU time spent counts these runs too; a finished trial cannot take them, so the study keeps the sum.
        spent = float(self.study.user_attrs.get(REMEASURE_GPU_ATTR, 0.0)) + result.gpu_seconds
        self.study.set_user_attr(REMEASURE_GPU_ATTR, spent)
        if result.outcome == "infrastructure":
            self.listener.note(f"re-measurement of trial {frozen.number} hit the host: "
                               f"{result.failure.message if result.failure else ''}")
            return None
        return result.objective if result.objective is not None else 0.0


def _key(config: Mapping[str, Any]) -> str:
    return repr(sorted(config.items(), key=lambda kv: kv[0]))


def best_configs(study: optuna.Study, k: int = TOP_K) -> list[dict[str, Any]]:
    """Another study's best distinct configs (for `--from-study`), re-measured ranking first."""
    from search.results import ranked

    space = space_of(study)
    return [space.clean(t.params) for t in ranked(study)[:k]]


def known_configs(space: Space, start_from: Iterable[str], from_studies: Iterable[optuna.Study]) -> list[dict[str, Any]]:
    """Configs to enqueue after the baseline: parsed launch commands, then other studies' best."""
    from search.command import config_from_command

    out = [config_from_command(space, text) for text in start_from]
    for other in from_studies:
        for config in best_configs(other):
            fitted = space.active(config)
            if not space.config_problems(fitted, "config"):
                out.append(fitted)
    return out
