"""The study driver: Optuna ask/tell over a space, one trial at a time, safe to stop and resume.

This module is the only writer to the study storage. Every trial goes through the
`search.strategy.Strategy` (the same object `scripts/bench_search.py` measures), runs with
`search.trial.run_trial` through a `search.runner.Runner`, and is recorded with the user attributes
of `search.storage` that every view reads. The runner decides where and how many trials run at
once: `search.runner.InProcessRunner` runs one at a time on one host,
`search.slot_runner.SlotRunner` as many as the free GPUs of hosts that offer a ``gpus`` list hold,
`search.parallel.RayRunner` one per Ray node (or per GPU slot of it); the driver loop is the same for
all, so asks overlap (the sampler's constant liar spreads them) and level results still reach the pruner.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from search import correctness
from search.command import config_from_command
from search.errors import BadInput, InfrastructureFault, RunFailed
from search.hosts.base import Host
from search.loadtest import LevelResult
from search.lock import StudyLock
from search.logwatch import Event
from search.names import checked_study_name, checked_trials_dir
from search.optuna_internals import running_trial
from search.ranking import Ranking
from search.runner import Hooks, Job, Runner
from search.slot_runner import pool_runner
from search.slots import job_gpus
from search.space import Space
from search.stop_signals import stop_signals_as_interrupt
from search.storage import (
    DEFAULT_STORAGE,
    Attr,
    Outcome,
    Plan,
    StudyAttr,
    TrialView,
    remeasured,
    set_remeasured,
    space_of,
    views,
)
from search.strategy import Strategy
from search.trial import TrialResult, level_score

MAX_INFRA_RETRIES = 3  # consecutive infrastructure faults of one config on one host in one run before the study stops
TOP_K = 3  # configs re-measured at the end
_MARKER_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
WAIT_S = 0.5  # longest the driver waits on its runner before checking the budget again


class Interrupted(Exception):
    """Ctrl-C or another stop signal stopped the study after recording the running trial."""


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
    runner: Runner | None = None  # default: search.slot_runner.pool_runner([host], hosts)
    # What proposes and judges the trials; default Strategy(space, sampler, seed=seed). The search
    # benchmark passes its peers here, so they run through this same driver.
    searcher: Strategy | None = None
    study: optuna.Study | None = field(default=None, init=False)  # set by run()

    def __post_init__(self) -> None:
        checked_study_name(self.name)  # it names trials/<study>/
        checked_trials_dir(self.trials_dir)
        if self.runner is not None:
            self._runner: Runner = self.runner
        elif self.host is not None:  # side by side on its GPUs if it offers a list, else one at a time
            self._runner = pool_runner([self.host], self.hosts or None)
        else:
            raise BadInput("a study needs a host or a runner to run its trials on")
        self.strategy = self.searcher or Strategy(self.space, self.sampler, seed=self.seed)
        self._began = time.monotonic()
        self._infra_streak: dict[str, Counter[str]] = {}  # config -> host -> faults in a row
        self._running: dict[str, _Running] = {}  # by marker

    # -- public ---------------------------------------------------------------------------
    def run(self) -> optuna.Study:
        """Create or resume the study, run trials until the budget is spent, then re-measure."""
        with StudyLock(self.storage, self.name) as lock:  # one driver per study, re-measurement included
            return self._run(lock.opened)

    def _run(self, storage: BaseStorage) -> optuna.Study:
        study = self.study = self._open(storage)
        self._recover()
        self.strategy.start(study, self.known)
        with stop_signals_as_interrupt():
            try:
                self._trials()
                if not self._out_of_time():
                    self._remeasure()
            except KeyboardInterrupt:
                raise Interrupted(f"study {self.name!r} interrupted; running trials were torn down and will run "
                                  "again when you run the same command") from None
        return study

    def best(self) -> TrialView | None:
        """The winner so far, by the ranking every view uses (`search.ranking`)."""
        return None if self.study is None else self.strategy.incumbent(self.study)

    @property
    def _live(self) -> optuna.Study:
        """The study, open while `run` runs."""
        assert self.study is not None, "the study is open only inside run()"
        return self.study

    def deadline_left(self) -> float | None:
        return None if self.timeout_s is None else max(0.0, self.timeout_s - (time.monotonic() - self._began))

    # -- setup ----------------------------------------------------------------------------
    def _open(self, storage: BaseStorage) -> optuna.Study:
        """Create or load the study with the strategy's sampler and pruner: `--sampler` and `--seed` act through it."""
        study = optuna.create_study(study_name=self.name, storage=storage, direction="maximize",
                                    sampler=self.strategy.sampler, load_if_exists=True,
                                    pruner=self.strategy.pruner or optuna.pruners.NopPruner())
        stored = study.user_attrs.get(StudyAttr.SPACE)
        mine = self.space.model_dump(mode="json")
        if stored is None:
            study.set_user_attr(StudyAttr.SPACE, mine)
        elif space_of(study).model_dump(mode="json") != mine:  # read as today's schema reads it (new defaults)
            raise BadInput(f"study {self.name!r} was created with a different space; resume it with the same space "
                           "file, or give a new --study name")
        return study

    def _marker(self, run: str) -> str:
        """A unique trial marker, ``search-<study>-<run>-<random>``, safe in an environment value."""
        return _MARKER_UNSAFE.sub("-", f"search-{self.name}-{run}-{uuid.uuid4().hex[:8]}")

    def _recover(self) -> None:
        """Fail and re-enqueue a dead run's RUNNING trials after killing what they left behind."""
        left = self._live.user_attrs.get(StudyAttr.REMEASURING)
        if left and not _driver_alive(left.get(Attr.DRIVER)):
            self._runner.kill_marker(left[Attr.MARKER], left.get(Attr.HOST, ""))
        for frozen in self._live.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            driver = frozen.user_attrs.get(Attr.DRIVER)
            if driver is not None and _driver_alive(driver):
                raise BadInput(f"study {self.name!r} is being run by pid {driver['pid']} (trial {frozen.number}); "
                               "stop that run first: a study has one driver")
            marker = frozen.user_attrs.get(Attr.MARKER)
            killed = self._runner.kill_marker(marker, frozen.user_attrs.get(Attr.HOST, "")) if marker else 0
            self.listener.note(f"trial {frozen.number} was left RUNNING by a dead run"
                               f"{f'; killed {killed} leftover process(es)' if killed else ''}; running it again")
            failure = {"kind": "driver_killed", "phase": frozen.user_attrs.get(Attr.PHASE, "starting"), "line": "",
                       "message": "the driver died while this trial ran (kill -9, reboot); not the config's fault"}
            self.strategy.tell(self._live, running_trial(self._live, frozen), Outcome.INFRASTRUCTURE, failure=failure)

    # -- budget -----------------------------------------------------------------------------
    def measured(self) -> int:
        """Trials that ran to a verdict (skipped and infrastructure-failed ones do not count)."""
        if self.study is None:
            return 0
        finished = (TrialState.COMPLETE, TrialState.PRUNED)
        return sum(1 for t in views(self.study, finished) if t.skipped is None)

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
                while self._runner.free() > 0 and self._wants_more():
                    self._launch()
                if not self._running and not self._runner.settling():
                    if self._wants_more():
                        raise InfrastructureFault(f"study {self.name!r}: no host is free to run a trial; "
                                                  "check the cluster, then run the same command to continue")
                    return
                for job, result in self._runner.wait(WAIT_S):
                    self._finish(self._running.pop(job.marker), result)
        except BaseException:
            self._runner.cancel()
            for running in self._running.values():
                self._record_levels(running.trial, running.levels, [])
                self.strategy.tell(self._live, running.trial, Outcome.INFRASTRUCTURE, failure={
                    "kind": "interrupted", "phase": running.trial.user_attrs.get(Attr.PHASE, "starting"), "line": "",
                    "message": "stopped by Ctrl-C, SIGTERM or the study stopping; run the study again to measure it"})
                self.listener.trial_done(self._live.trials[running.trial.number])
            self._running.clear()
            raise

    def _launch(self) -> None:
        """Ask for the next trial and start it on the runner."""
        trial, config = self.strategy.ask(self._live)
        number = trial.number
        marker = self._marker(str(number))
        trial_dir = self.trials_dir / self.name / str(number)
        # Before the server exists: a later run must be able to find and kill it by this marker.
        for key, value in ((Attr.MARKER, marker), (Attr.ARTIFACTS, str(trial_dir)), (Attr.DRIVER, _me())):
            trial.set_user_attr(key, value)
        running = self._running[marker] = _Running(trial, config)
        self.listener.trial_started(number, str(trial.user_attrs.get(Attr.PLAN, "")), config)

        def placed(host: str) -> None:
            trial.set_user_attr(Attr.HOST, host)
            self.listener.placed(number, host)

        divisor = self._divisor(config)

        def level(result: LevelResult) -> bool:
            running.levels.append(result)
            self.listener.level(number, result)
            # Reported (and pruned) on what the objective reads: tok/s (per GPU), goodput, or the
            # rate met; an open-loop level is named by its rate.
            return self.strategy.on_level(self._live, trial, len(running.levels) - 1, result.at,
                                          level_score(self.space, result, divisor))

        def event(seen: Event) -> None:
            if seen.kind == "phase":
                trial.set_user_attr(Attr.PHASE, seen.name)
            self.listener.event(number, seen)

        job = Job(self.space, config, marker, trial_dir, self._baseline_answers(number))
        self._runner.start(job, Hooks(placed=placed, event=event, level=level))

    def _finish(self, running: _Running, result: TrialResult) -> None:
        """Record a finished trial and bound infrastructure retries of its config."""
        trial, config = running.trial, running.config
        if result.outcome == Outcome.INFRASTRUCTURE and not result.levels:
            result.levels = running.levels  # a lost worker returns none; keep what reached the driver
        if result.answers_differ is None and result.answers is not None:  # started before the baseline finished
            baseline = self._baseline_answers(trial.number)
            if baseline is not None:
                result.answers_differ = bool(correctness.compare(baseline, result.answers))
        self._record(trial, result, config)
        self.listener.trial_done(self._live.trials[trial.number])
        if result.outcome == Outcome.INFRASTRUCTURE:
            self._count_infra(config, trial.number, result)
        else:
            self._infra_streak.pop(_key(config), None)

    def _baseline_answers(self, number: int) -> list[str] | None:
        """The baseline's greedy answers, which every later trial's answers must match."""
        for t in views(self._live, (TrialState.COMPLETE,)):
            if t.plan == Plan.BASELINE and t.number != number:
                path = Path(t.artifacts) / "answers.json"
                if path.is_file():
                    answers: list[str] = json.loads(path.read_text())
                    return answers
        return None

    def _divisor(self, config: Mapping[str, Any]) -> int:
        """What a level's figure is divided by for the objective: the layout's GPUs when it is per GPU."""
        return job_gpus(self.space, config) if self.space.objective.per_gpu else 1

    @staticmethod
    def _record_levels(trial: optuna.Trial, levels: list[LevelResult], gpu: list[dict[str, Any]]) -> None:
        trial.set_user_attr(Attr.LEVELS, [level.to_dict() for level in levels])
        if gpu:
            trial.set_user_attr(Attr.GPU, gpu)

    def _record(self, trial: optuna.Trial, result: TrialResult, config: Mapping[str, Any]) -> None:
        """Store the record the views read, then tell the strategy the outcome."""
        self._record_levels(trial, result.levels, result.gpu)
        data = result.to_dict()
        for key in (Attr.PHASES, Attr.PEAK, Attr.PEAK_CONCURRENCY, Attr.SLO_OK, Attr.ANSWERS_DIFFER,
                    Attr.GPU_SECONDS, Attr.TEARDOWN):
            if data.get(key) is not None:
                trial.set_user_attr(key, data[key])
        failure = result.failure.to_dict() if result.failure else None
        outcome = result.outcome
        objective = result.objective
        if outcome == Outcome.COMPLETED and objective is None:
            # No level met the SLOs: keep its best throughput, the slo constraint keeps it from winning.
            divisor = self._divisor(config)
            objective = max((level_score(self.space, level, divisor) for level in result.levels), default=0.0)
        if outcome == Outcome.PRUNED and result.levels and trial.user_attrs.get(Attr.PRUNED_BECAUSE) is None:
            trial.set_user_attr(Attr.PRUNED_BECAUSE, "the ladder stopped early")
        self.strategy.tell(self._live, trial, outcome, objective=objective, slo_ok=result.slo_ok,
                           answers_differ=bool(result.answers_differ), failure=failure)

    def _count_infra(self, config: Mapping[str, Any], number: int, result: TrialResult) -> None:
        """Stop the study when one config keeps failing on one host.

        Counted per host: a retried config goes to the next host still available, so a row of
        dead hosts (each then marked unavailable and skipped) must not stop a study that healthy
        hosts can carry on; when no host is left, the driver stops it anyway.
        """
        host = self._live.get_trials(deepcopy=False)[number].user_attrs.get(Attr.HOST, "")
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
        done = remeasured(self._live)
        for top in self.strategy.top(self._live, TOP_K):
            values = done.get(top.number, [])
            for repeat in range(len(values), self.remeasure):
                if self._out_of_time():
                    return
                self.listener.note(f"re-measuring trial {top.number} ({repeat + 1}/{self.remeasure})")
                value = self._measure_again(top, repeat)
                if value is None:
                    continue
                values.append(value)
                done[top.number] = values
                set_remeasured(self._live, done)

    def _measure_again(self, top: TrialView, repeat: int) -> float | None:
        """One more full run of a finished trial's config: its objective, 0 if it crashed, None on a host fault."""
        marker = self._marker(f"{top.number}-r{repeat}")
        trial_dir = self.trials_dir / self.name / str(top.number) / f"remeasure-{repeat}"
        self._live.set_user_attr(StudyAttr.REMEASURING, {Attr.MARKER: marker, Attr.HOST: top.host, Attr.DRIVER: _me()})
        self._runner.start(Job(self.space, self.space.clean(top.params), marker, trial_dir), Hooks())
        try:
            while not (done := self._runner.wait(WAIT_S)):
                pass
        except KeyboardInterrupt:
            self._runner.cancel()
            raise Interrupted(f"study {self.name!r} interrupted during re-measurement; run the same command to "
                              "finish it") from None
        result = done[0][1]
        # GPU time spent counts these runs too; a finished trial cannot take them, so the study keeps the sum.
        spent = float(self._live.user_attrs.get(StudyAttr.REMEASURE_GPU_SECONDS, 0.0)) + result.gpu_seconds
        self._live.set_user_attr(StudyAttr.REMEASURE_GPU_SECONDS, spent)
        if result.outcome == Outcome.INFRASTRUCTURE:
            self.listener.note(f"re-measurement of trial {top.number} hit the host: "
                               f"{result.failure.message if result.failure else ''}")
            return None
        return result.objective if result.objective is not None else 0.0


def _key(config: Mapping[str, Any]) -> str:
    return repr(sorted(config.items(), key=lambda kv: kv[0]))


def best_configs(study: optuna.Study, k: int = TOP_K) -> list[dict[str, Any]]:
    """Another study's best distinct configs (for `--from-study`), as `search.ranking` orders them."""
    space = space_of(study)
    return [space.clean(t.params) for t in Ranking.of(space).top(views(study), k)]


def known_configs(space: Space, start_from: Iterable[str], from_studies: Iterable[optuna.Study]) -> list[dict[str, Any]]:
    """Configs to enqueue after the baseline: parsed launch commands, then other studies' best."""
    out = [config_from_command(space, text) for text in start_from]
    for other in from_studies:
        for config in best_configs(other):
            fitted = space.active(config)
            if not space.config_problems(fitted, "config"):
                out.append(fitted)
    return out
