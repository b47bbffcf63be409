"""The study driver: Optuna ask/tell over a space, one trial at a time, safe to stop and resume.

This module is the only writer to the study storage. Every trial goes through the
`search.strategy.Strategy` (the same object `scripts/bench_search.py` measures), runs with
`search.trial.run_trial`, and is recorded with the user attributes every view reads
(docs/architecture.md, "What a study stores per trial").

Overnight safety comes from three rules:

- before a server starts, its trial already carries the trial marker and the driver's identity,
  so a later run can find a dead run's RUNNING trials, kill what they left by marker, and fail
  and re-enqueue them (nothing measured is lost: finished trials are untouched);
- Ctrl-C / SIGTERM tear the running trial down (run_trial does) and record it as an
  infrastructure fault, re-enqueued, so running the same command again continues;
- an infrastructure fault is never blamed on the config, but the same config failing that way
  `MAX_INFRA_RETRIES` times in one run stops the study with the host's message.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from search.errors import BadInput, InfrastructureFault, RunFailed
from search.hosts.base import Host
from search.lifecycle import Failure
from search.logwatch import Event
from search.loadtest import LevelResult
from search.space import Space, parse_space
from search.strategy import Strategy
from search.trial import TrialResult, run_trial

DEFAULT_STORAGE = "sqlite:///studies.db"
MAX_INFRA_RETRIES = 3  # consecutive infrastructure faults of one config in one run before the study stops
TOP_K = 3  # configs re-measured at the end
SPACE_ATTR = "space"  # study user attr: the space as data, so views and export need no file
REMEASURED_ATTR = "remeasured"  # study user attr: {trial number: [objective per repeat]}
_DRIVER_ATTR = "driver"  # trial user attr: who ran it, to tell a dead run's RUNNING trial from a live one
_MARKER_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped the study after recording the running trial."""


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


# --------------------------------------------------------------------------- the run


@dataclass
class Listener:
    """What the driver tells the progress display; every hook is optional."""

    trial_started: Callable[[int, str, Mapping[str, Any]], None] = lambda number, tag, config: None
    event: Callable[[Event], None] = lambda event: None
    level: Callable[[LevelResult], None] = lambda level: None
    trial_done: Callable[[FrozenTrial], None] = lambda trial: None
    note: Callable[[str], None] = lambda text: None


@dataclass
class StudyRun:
    """One invocation of `search study run`."""

    space: Space
    name: str
    host: Host
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
    study: optuna.Study | None = field(default=None, init=False)  # set by run()

    def __post_init__(self) -> None:
        self._began = time.monotonic()
        self._infra_streak: dict[str, int] = {}

    # -- public ---------------------------------------------------------------------------
    def run(self) -> optuna.Study:
        """Create or resume the study, run trials until the budget is spent, then re-measure."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = self._open()
        self.strategy = Strategy(self.space, self.sampler, seed=self.seed)
        self._recover()
        self.strategy.start(self.study, self.known)
        with _sigterm_as_interrupt():
            try:
                while self.measured() < self.n_trials and not self._out_of_time():
                    self._one()
                if not self._out_of_time():
                    self._remeasure()
            except KeyboardInterrupt:  # between trials: nothing is running, nothing to record
                raise Interrupted(f"study {self.name!r} interrupted between trials; run the same command to "
                                  "continue") from None
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
        elif stored != mine:
            raise BadInput(f"study {self.name!r} was created with a different space; resume it with the same space "
                           "file, or give a new --study name")
        return study

    def _recover(self) -> None:
        """Fail and re-enqueue a dead run's RUNNING trials after killing what they left behind."""
        left = self.study.user_attrs.get("remeasuring")
        if left and not _driver_alive(left.get(_DRIVER_ATTR)):
            self.hosts.get(left.get("host", ""), self.host).kill_marker(left["marker"])
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            driver = frozen.user_attrs.get(_DRIVER_ATTR)
            if _driver_alive(driver):
                raise BadInput(f"study {self.name!r} is being run by pid {driver['pid']} (trial {frozen.number}); "
                               "stop that run first: a study has one driver")
            marker = frozen.user_attrs.get("marker")
            host = self.hosts.get(frozen.user_attrs.get("host", ""), self.host)
            killed = host.kill_marker(marker) if marker else 0
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

    # -- one trial ----------------------------------------------------------------------------
    def _one(self) -> None:
        trial, config = self.strategy.ask(self.study)
        number = trial.number
        marker = _MARKER_UNSAFE.sub("-", f"search-{self.name}-{number}-{uuid.uuid4().hex[:8]}")
        trial_dir = self.trials_dir / self.name / str(number)
        # Before the server exists: a later run must be able to find and kill it by this marker.
        for key, value in (("marker", marker), ("host", self.host.name), ("artifacts", str(trial_dir)),
                           (_DRIVER_ATTR, _me())):
            trial.set_user_attr(key, value)
        self.listener.trial_started(number, str(trial.user_attrs.get("strategy", "")), config)
        levels: list[LevelResult] = []
        gpu: list[dict[str, Any]] = []

        def on_level(level: LevelResult) -> bool:
            levels.append(level)
            gpu.extend(self._gpu(level.max_concurrency))
            self.listener.level(level)
            return self.strategy.on_level(self.study, trial, len(levels) - 1, level.max_concurrency,
                                          level.output_throughput)

        def on_event(event: Event) -> None:
            if event.kind == "phase":
                trial.set_user_attr("phase", event.name)
            self.listener.event(event)

        try:
            result = run_trial(self.space, config, self.host, trial_dir=trial_dir, marker=marker, on_event=on_event,
                               on_level=on_level, baseline_answers=self._baseline_answers(number))
        except KeyboardInterrupt:
            self._record_levels(trial, levels, gpu)
            self.strategy.tell(self.study, trial, "infrastructure", failure={
                "kind": "interrupted", "phase": trial.user_attrs.get("phase", "starting"), "line": "",
                "message": "stopped by Ctrl-C or SIGTERM; run the study again to measure it"})
            self.listener.trial_done(self.study.trials[number])
            raise Interrupted(f"study {self.name!r} interrupted; trial {number} was torn down and will run again "
                              "when you run the same command") from None
        except InfrastructureFault as exc:
            result = TrialResult(outcome="infrastructure", artifacts=trial_dir, marker=marker, levels=levels,
                                 failure=Failure("infrastructure", trial.user_attrs.get("phase", "starting"),
                                                 str(exc), True, str(exc)))
        self._record(trial, result, gpu)
        self.listener.trial_done(self.study.trials[number])
        if result.outcome == "infrastructure":
            self._count_infra(config, number, result)
        else:
            self._infra_streak.pop(_key(config), None)

    def _gpu(self, concurrency: int) -> list[dict[str, Any]]:
        """Power and utilisation of the host's GPUs at the end of a level, where the host reports them."""
        try:
            samples = self.host.gpu_samples()
        except InfrastructureFault:
            return []
        if not samples:
            return []
        known = [s for s in samples if s.power_w is not None]
        if not known:
            return []
        return [{"concurrency": concurrency,
                 "power_w": round(sum(s.power_w or 0.0 for s in known), 1),
                 "power_limit_w": round(sum(s.power_limit_w or 0.0 for s in known), 1),
                 "utilization_pct": round(statistics.fmean(s.utilization_pct or 0.0 for s in known), 1)}]

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
        key = _key(config)
        self._infra_streak[key] = self._infra_streak.get(key, 0) + 1
        message = result.failure.message if result.failure else "infrastructure fault"
        if self._infra_streak[key] >= MAX_INFRA_RETRIES:
            raise RunFailed(f"study {self.name!r} stopped: trial {number}'s config hit {MAX_INFRA_RETRIES} infrastructure "
                            f"faults in a row (last: {message}); fix the host, then run the same command to continue")
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
        marker = _MARKER_UNSAFE.sub("-", f"search-{self.name}-{frozen.number}-r{repeat}-{uuid.uuid4().hex[:8]}")
        trial_dir = self.trials_dir / self.name / str(frozen.number) / f"remeasure-{repeat}"
        self.study.set_user_attr("remeasuring", {"marker": marker, "host": self.host.name, _DRIVER_ATTR: _me()})
        try:
            result = run_trial(self.space, frozen.params, self.host, trial_dir=trial_dir, marker=marker)
        except KeyboardInterrupt:
            raise Interrupted(f"study {self.name!r} interrupted during re-measurement; run the same command to "
                              "finish it") from None
        except InfrastructureFault as exc:
            self.listener.note(f"re-measurement of trial {frozen.number} hit the host: {exc}")
            return None
        if result.outcome == "infrastructure":
            self.listener.note(f"re-measurement of trial {frozen.number} hit the host: "
                               f"{result.failure.message if result.failure else ''}")
            return None
        return result.objective if result.objective is not None else 0.0


def _key(config: Mapping[str, Any]) -> str:
    return repr(sorted(config.items(), key=lambda kv: kv[0]))


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (systemd, a scheduler) stops the study like Ctrl-C: tear down, record, exit."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def best_configs(study: optuna.Study, k: int = TOP_K) -> list[dict[str, Any]]:
    """Another study's best distinct configs (for `--from-study`), re-measured ranking first."""
    from search.results import ranked

    return [dict(t.params) for t in ranked(study)[:k]]


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
