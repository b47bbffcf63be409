"""The stored record of a study: the attribute keys, loading a study and its space, a typed view of a trial.

A study lives in a standard Optuna storage. What Optuna does not model, the driver stores as user
attributes (docs/architecture.md, "What a study stores"): on each trial its outcome, failure,
ladder levels, timings and the plan's notes; on the study its space and the re-measurements.
This module is the one place those keys are spelled and read, so the driver that writes them and
the views that read them (`search.results`, `search.export`, `search.report`, `search.progress`)
cannot drift apart; `search.ranking` orders the :class:`TrialView` s built here.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError, SQLAlchemyError

from search.errors import BadInput
from search.space import Space, parse_space

DEFAULT_STORAGE = "sqlite:///studies.db"


class Attr(StrEnum):
    """User attribute keys of a trial."""

    OUTCOME = "outcome"  # an Outcome
    FAILURE = "failure"  # Failure.to_dict(): kind, phase, line, message, infrastructure, advice
    PHASE = "phase"  # the startup phase reached so far (kept while the trial runs)
    PHASES = "phases"  # {phase: {"start", "duration"}}
    LEVELS = "levels"  # LevelResult.to_dict() per ladder level, in order
    PEAK = "peak_output_throughput"  # best level meeting the SLOs
    PEAK_CONCURRENCY = "peak_concurrency"
    SLO_OK = "slo_ok"
    ANSWERS_DIFFER = "answers_differ"
    GPU_SECONDS = "gpu_seconds"  # wall time the trial held the GPUs
    GPU = "gpu"  # per level: concurrency (the level's `level_at`: its rate when open loop), power_w, power_limit_w, utilization_pct
    TEARDOWN = "teardown"  # the host was left dirty
    HOST = "host"
    ARTIFACTS = "artifacts"  # trials/<study>/<n>/
    MARKER = "marker"  # the trial marker: a later run kills leftovers by it
    DRIVER = "driver"  # who ran it: tells a dead run's RUNNING trial from a live one
    PRUNED_BECAUSE = "pruned_because"
    RETRY_OF = "retry_of"  # the trial an infrastructure fault re-enqueued
    SKIPPED = "skipped"  # why the strategy told this proposal without running it
    # The strategy's plan (search.strategy): which source proposed the trial, and its notes.
    PLAN = "strategy"  # a Plan
    LADDER = "level_concurrency"  # the concurrency of each level reported so far
    SWEEP_PARAM = "sweep_param"
    SWEEP_PASS = "sweep_pass"
    SWEEP_FROM_WORKING = "sweep_from_working"
    CENTRE_SCORE = "centre_score"  # a sweep move's centre score when it was planned
    SWEEP_FROM = "sweep_from"  # ... and the centre's value of the swept parameter
    PARTNER_OF = "partner_of"  # "param=value" of the crash a repair retries


class Plan(StrEnum):
    """Which source of the strategy's plan proposed a trial (its ``Attr.PLAN``)."""

    BASELINE = "baseline"  # the space's baseline, first
    KNOWN = "known"  # --start-from / --from-study
    SWEEP = "sweep"  # screen, one-flag sweep, revisits, caps read off the ladder
    PARTNER = "partner"  # a crashed move repaired with what its failure advises
    MODEL = "model"  # the Gaussian-process model's proposal
    SAMPLER = "sampler"  # the Optuna sampler (--sampler)


class StudyAttr(StrEnum):
    """User attribute keys of a study."""

    SPACE = "space"  # the space as data, so views and export need no file
    REMEASURED = "remeasured"  # {trial number: [objective per repeat]}: a finished trial cannot change
    REMEASURE_GPU_SECONDS = "remeasure_gpu_seconds"
    REMEASURING = "remeasuring"  # the re-measurement in flight: marker, host, driver


class Outcome(StrEnum):
    """What happened to a trial, as the driver told it (search.strategy says what each tells Optuna)."""

    COMPLETED = "completed"
    CRASHED = "crashed"  # the config's fault: PRUNED with constraint crashed = 1
    PRUNED = "pruned"  # the ladder stopped it early
    INFRASTRUCTURE = "infrastructure"  # the host's fault: FAIL, the same config enqueued again


class Constraint(StrEnum):
    """Optuna constraints set on every told trial; > 0 is infeasible."""

    CRASHED = "crashed"
    SLO = "slo"
    CORRECTNESS = "correctness"


# --------------------------------------------------------------------------- opening

# How to install a database driver SQLAlchemy imports: psycopg (3), PostgreSQL's, through this project's extra.
_INSTALL = {"psycopg": "pip install 'search[postgres]'"}


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL; None for another backend, an in-memory database or a URL that does not parse."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def open_storage(url: str, *, create: bool) -> BaseStorage:
    """The storage at ``url``: the one place a storage URL is opened, every failure a one-line BadInput.

    ``create`` (only the driver of `study run`) makes a missing SQLite file and the tables; a reading
    command never does, so `study show nosuch` leaves no empty database behind. Nothing is written
    to a storage that cannot be opened, so what it holds is kept for the run after the fix.
    """
    path = sqlite_path(url)
    if path is not None:
        _check_sqlite(url, path, create)
    try:
        return _get_storage(url)
    except ImportError as exc:
        missing = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc  # Optuna re-raises SQLAlchemy's
        package = missing.name or "the database's driver"
        how = _INSTALL.get(package, f"pip install {package}")
        raise BadInput(f"--storage {url}: this database needs the Python package {package} ({how})") from None
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig).__name__
        what = f"{path} is not an SQLite database Optuna can use" if path is not None else "cannot connect"
        raise BadInput(f"--storage {url}: {what} ({reason}); fix the URL or the server, "
                       "or give another --storage") from None
    except (SQLAlchemyError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0]
        raise BadInput(f"--storage {url}: not a storage URL ({reason}); "
                       "use sqlite:///FILE.db or postgresql://USER@HOST/DB") from None


# Opening a storage creates its tables and Optuna's schema version when they are missing, so two
# processes opening a new one at once (a driver and `study show`, two drivers of different studies)
# race: the loser sees "table studies already exists" or a duplicate version row. Once the winner
# is done the tables are there, so the loser opens again rather than calling the file unusable.
_OPEN_TRIES = 10
_OPEN_RETRY_S = 0.2


def _get_storage(url: str) -> BaseStorage:
    for _ in range(_OPEN_TRIES - 1):
        try:
            return optuna.storages.get_storage(url)
        except (IntegrityError, OperationalError) as exc:
            if not _lost_the_race(exc):
                raise
            time.sleep(_OPEN_RETRY_S)
    return optuna.storages.get_storage(url)


def _lost_the_race(exc: IntegrityError | OperationalError) -> bool:
    """The creation race (the duplicate version row; SQLite's "already exists" or "database is
    locked"), not a server that refused the connection: that error comes at once, not 2 s later."""
    return isinstance(exc, IntegrityError) or any(text in str(exc.orig) for text in ("already exists", "locked"))


def _check_sqlite(url: str, path: Path, create: bool) -> None:
    """A missing, unwritable or misplaced SQLite file, said before SQLAlchemy says it in its words."""
    if not path.exists():
        if not create:
            raise BadInput(f"--storage {url}: {path} does not exist (no study has run there); "
                           "give the --storage your `search study run` used")
        if not path.parent.is_dir():
            raise BadInput(f"--storage {url}: directory {path.parent} does not exist; create it, "
                           "or give another --storage")
    elif not path.is_file():
        raise BadInput(f"--storage {url}: {path} is not a file; give an SQLite file path")
    elif create and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        raise BadInput(f"--storage {url}: {path} (or its directory) is read-only; make it writable "
                       "(a study writes every trial), or copy it and give the copy as --storage")


# --------------------------------------------------------------------------- loading


def load(name: str, storage: str = DEFAULT_STORAGE) -> optuna.Study:
    """An existing study; BadInput naming the studies that exist otherwise."""
    opened = open_storage(storage, create=False)
    names = [s.study_name for s in optuna.get_all_study_summaries(opened, include_best_trial=False)]
    if name not in names:
        known = f"studies in {storage}: {', '.join(names)}" if names else f"{storage} holds no studies yet"
        raise BadInput(f"no study named {name!r} ({known}); run `search study run SPACE --study {name}` first")
    return optuna.load_study(study_name=name, storage=opened)


def space_of(study: optuna.Study) -> Space:
    """The space the study was created with (stored on the study as data)."""
    data = study.user_attrs.get(StudyAttr.SPACE)
    if data is None:
        raise BadInput(f"study {study.study_name!r} was not created by `search study run` (no space stored)")
    return parse_space(data, f"study {study.study_name}")


def remeasured(study: optuna.Study) -> dict[int, list[float]]:
    """Re-measured objective values by trial number."""
    return {int(k): [float(x) for x in v] for k, v in study.user_attrs.get(StudyAttr.REMEASURED, {}).items()}


def set_remeasured(study: optuna.Study, values: Mapping[int, list[float]]) -> None:
    """Store the re-measurements on the study: Optuna lets a finished trial take no more values."""
    study.set_user_attr(StudyAttr.REMEASURED, {str(k): list(v) for k, v in values.items()})


# --------------------------------------------------------------------------- one trial


def meets_constraints(trial: FrozenTrial) -> bool:
    """No constraint above 0 (a trial told before constraints existed meets them)."""
    return not any(v > 0 for v in (trial.constraints or {}).values())


def set_constraints(trial: optuna.Trial, *, crashed: bool = False, slo_ok: bool = True, answers_differ: bool = False) -> None:
    """Set every constraint on a trial being told (> 0: it cannot win)."""
    trial.set_constraint(Constraint.CRASHED, 1.0 if crashed else 0.0)
    trial.set_constraint(Constraint.SLO, 0.0 if slo_ok else 1.0)
    trial.set_constraint(Constraint.CORRECTNESS, 1.0 if answers_differ else 0.0)


@dataclass(frozen=True)
class TrialView:
    """One trial as the views read it: the FrozenTrial with its user attributes typed.

    ``measurements`` are every objective the config got: the trial's own value, then its
    re-measurements (a finished trial cannot take them, so they come from the study).
    """

    frozen: FrozenTrial
    remeasured: tuple[float, ...] = ()

    @property
    def number(self) -> int:
        return self.frozen.number

    @property
    def state(self) -> TrialState:
        return self.frozen.state

    @property
    def params(self) -> dict[str, Any]:
        return self.frozen.params

    @property
    def value(self) -> float | None:
        return self.frozen.value

    @property
    def datetime_complete(self) -> datetime | None:
        return self.frozen.datetime_complete

    @property
    def attrs(self) -> Mapping[str, Any]:
        return self.frozen.user_attrs

    @property
    def outcome(self) -> Outcome | None:
        """The told outcome; None while it runs or waits."""
        told = self.attrs.get(Attr.OUTCOME)
        return Outcome(told) if told is not None else None

    @property
    def skipped(self) -> str | None:
        """Why the strategy told it without running it (a repeat, a known crash); None if it ran."""
        return self.attrs.get(Attr.SKIPPED)

    @property
    def plan(self) -> Plan | None:
        """Which source of the plan proposed it; None for a trial no strategy asked."""
        tag = self.attrs.get(Attr.PLAN)
        return Plan(tag) if tag is not None else None

    @property
    def pruned_because(self) -> str:
        return str(self.attrs.get(Attr.PRUNED_BECAUSE, ""))

    @property
    def retry_of(self) -> int | None:
        """The trial whose infrastructure fault this one runs again."""
        return self.attrs.get(Attr.RETRY_OF)

    @property
    def failure(self) -> dict[str, Any] | None:
        return self.attrs.get(Attr.FAILURE) or None

    @property
    def constraints(self) -> dict[str, float]:
        return self.frozen.constraints or {}

    @property
    def crashed(self) -> bool:
        return self.constraints.get(Constraint.CRASHED, 0.0) > 0

    @property
    def violated(self) -> list[str]:
        """The constraints it breaks."""
        return [name for name, v in self.constraints.items() if v > 0]

    @property
    def feasible(self) -> bool:
        """Completed with a throughput, meeting every constraint: it may win."""
        return (self.state == TrialState.COMPLETE and meets_constraints(self.frozen)
                and self.value is not None and self.value > 0)

    @property
    def measurements(self) -> list[float]:
        return ([self.value] if self.value is not None else []) + list(self.remeasured)

    @property
    def mean(self) -> float | None:
        """The mean of its measurements; None when it has none."""
        values = self.measurements
        return statistics.fmean(values) if values else None

    @property
    def levels(self) -> list[dict[str, Any]]:
        return list(self.attrs.get(Attr.LEVELS, []))

    @property
    def gpu(self) -> list[dict[str, Any]]:
        return list(self.attrs.get(Attr.GPU, []))

    @property
    def phases(self) -> dict[str, dict[str, float]]:
        return dict(self.attrs.get(Attr.PHASES, {}))

    @property
    def gpu_seconds(self) -> float:
        return float(self.attrs.get(Attr.GPU_SECONDS, 0.0))

    @property
    def host(self) -> str:
        return str(self.attrs.get(Attr.HOST, ""))

    @property
    def artifacts(self) -> str:
        return str(self.attrs.get(Attr.ARTIFACTS, ""))

    @property
    def peak(self) -> float | None:
        return self.attrs.get(Attr.PEAK)

    @property
    def peak_concurrency(self) -> float | None:
        """The best level's concurrency, or an open-loop level's request rate."""
        return self.attrs.get(Attr.PEAK_CONCURRENCY)


def views(study: optuna.Study, states: tuple[TrialState, ...] | None = None) -> list[TrialView]:
    """The study's trials (those in ``states``, default all) as views, in number order."""
    again = remeasured(study)
    return [TrialView(t, tuple(again.get(t.number, ()))) for t in study.get_trials(deepcopy=False, states=states)]


def view(study: optuna.Study, number: int) -> TrialView:
    """Trial ``number`` of the study; BadInput naming the range otherwise."""
    trials = views(study)
    if not 0 <= number < len(trials):
        raise BadInput(f"study {study.study_name!r} has no trial {number}; its trials are 0..{len(trials) - 1}")
    return trials[number]


def baseline(study: optuna.Study) -> TrialView | None:
    """The completed baseline trial, if there is one."""
    return next((t for t in views(study, (TrialState.COMPLETE,)) if t.plan == Plan.BASELINE), None)
