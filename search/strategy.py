"""How a study searches: the sampler, warm start, the one-flag sweep, pruning and what each outcome tells Optuna.

`search study run` and `scripts/bench_search.py` both drive trials through one `Strategy`, so the
sample efficiency measured by the benchmark is the product's. Plain TPE knows nothing about our
problem; the strategy adds what we know:

- the baseline is the user's config: it runs first; if it crashes, every value of each parameter its
  failure advises changing is tried (SGLang's errors say which flag to change);
- screening: each parameter first gets one trial, its most different value from the best working
  config (the null/default choice, the far end of a range); only the parameters whose screen moved
  throughput beyond noise (or crashed) get their other values swept, biggest effect first, so
  parameters that do nothing (an NCCL level) cost one trial instead of a whole sweep;
- that coordinate sweep changes one parameter at a time from the best working config (greedy, but
  a change that wins only by noise does not move the centre), which finds the big single-flag wins
  (a cap removed, graphs off, another backend) and maps crashing values; it skips values the
  centre itself measured (a grid point next to its value) and values that lost by far as the only
  change from an earlier centre;
- a move that crashes is repaired at once with what its failure advises: the log watcher keeps
  SGLang's advice lines ("set --mem-fraction-static to a smaller value"), and a failure that
  names no flag gets SGLang's usual advice for its kind (``signatures/advice.yaml``); the advised
  parameter moves one grid step that way (two if the first repair crashes too);
- when the centre moves, each one-flag change that won on an earlier centre is tried on the new one
  (once: a change whose revisit lost is not tried again);
- the running-batch cap is read off the ladder: a level runs min(concurrency, cap) requests, so the
  levels of the centre (and of configs differing from it only in the cap) trace throughput against
  the running batch; where that curve peaks inside the ladder, the cap at the peak is tried next,
  and once the final centre is being refined, a second, finer read where the lines rising to and
  falling from the highest point meet (the curve often has a kink where the KV cache runs short).
  The centre is preferably a config whose cap lets every level run in full, so its ladder shows
  what the other flags do to the whole curve; the sweep does not try caps that ladder measured;
- a conditional parameter the best config leaves inactive (the graph batch cap while graphs are
  off) is swept from the best config where it is active; the other choices of an unordered
  categorical (a backend) whose one screen showed nothing are swept last;
- then TPE (multivariate, grouped, constant liar) models the joint space seeded by those trials,
  and every other trial is the Gaussian-process model's proposal (below): the config of highest
  expected improvement among small changes (one or two numeric parameters) of the best configs.
  TPE's wide proposals find the next big region; the model's narrow ones find the few percent an
  interior optimum (an NCCL channel count, a memory fraction) holds, which TPE samples only by luck;
- the ladder gives early evidence: a trial below the space's per-level target, well below what
  completed trials reached at the same level, or unable to catch the best even if it grew over
  the rest of the ladder as fast as any completed trial did, is pruned after that level;
- a crash is PRUNED with constraint ``crashed = 1`` (TPE ignores FAIL, so it would keep proposing
  it); a choice that crashed alone in the sweep from a working config is not started again
  unless it was out of memory (a threshold that moves with other flags); an exact repeat of a
  measured, running or waiting config is not started again (noise is handled by the end-of-study
  re-measurement instead), unless the sampler proposed nothing else ``max_skips`` times in a row;
- the best configs are ranked by `search.ranking` (the ranking every view uses): a
  Gaussian-process estimate that pools the measurements of similar configs, not the single
  luckiest measurement;
- an infrastructure fault is FAIL and the same parameters are enqueued again.

The history lives entirely in the study (user attributes, `search.storage.Attr`), so a resumed
study continues the plan. The ladder rules are `search.pruner.LadderPruner`, the crash and repeat
memory `search.memory.Memory`, and every number here a field of `search.settings.Settings`.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any

import numpy as np
import optuna
import yaml
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from search.distributions import SpaceLike, discover
from search.errors import BadInput
from search.memory import Memory, crashed_choice, failure_kind, finished, working
from search.pruner import LadderPruner
from search.ranking import Ranking, band, same_config
from search.settings import DEFAULT, Settings
from search.storage import Attr, Constraint, Outcome, Plan, TrialView, meets_constraints, set_constraints, views
from search.surrogate import fit

SAMPLERS: tuple[str, ...] = ("tpe", "gp", "random", "grid")

# Pass -1 screens: each parameter's single most different value from the centre. Only parameters
# whose screen moved throughput beyond the noise margin (or crashed) get their other values swept.
SCREEN_PASS = -1
# SGLang's cap on the running batch: a ladder level runs min(concurrency, cap) requests at once.
CAP = "--max-running-requests"


# The plan's notes a retried trial keeps, so the plan reads the retry as the move it repeats.
_PLAN_NOTES = (Attr.PLAN, Attr.SWEEP_PARAM, Attr.SWEEP_PASS, Attr.SWEEP_FROM_WORKING, Attr.PARTNER_OF,
               Attr.CENTRE_SCORE, Attr.SWEEP_FROM)

# SGLang's usual advice by failure kind, for crashes whose log names no flag (data, not code).
_ADVICE: dict[str, str] = yaml.safe_load(
    resources.files("search").joinpath("signatures", "advice.yaml").read_text(encoding="utf-8"))


def _snap(dist: IntDistribution | FloatDistribution, x: float) -> Any:
    """``x`` as a value of the numeric ``dist``: inside its range, on its step, int or float."""
    x = min(max(x, dist.low), dist.high)
    if dist.step:
        x = min(dist.low + round((x - dist.low) / dist.step) * dist.step, dist.high)
    return int(round(x)) if isinstance(dist, IntDistribution) else float(round(x, 6))


def grid_values(dist: BaseDistribution, points: int) -> list[Any]:
    """Representative values of one parameter: all choices, or `points` spread over the range."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    low, high = dist.low, dist.high
    if points <= 1 or low == high:
        return [low]
    if dist.log:
        raw = [math.exp(math.log(low) + (math.log(high) - math.log(low)) * i / (points - 1)) for i in range(points)]
    else:
        raw = [low + (high - low) * i / (points - 1) for i in range(points)]
    values: list[Any] = []
    for x in raw:
        v = _snap(dist, x)
        if v not in values:
            values.append(v)
    return values


def _scale(dist: IntDistribution | FloatDistribution) -> Callable[[float], float]:
    """The scale a numeric parameter's distances are measured on: log if its range is log."""
    return math.log if dist.log else float


def _unscale(dist: IntDistribution | FloatDistribution) -> Callable[[float], float]:
    """The inverse of `_scale`."""
    return math.exp if dist.log else float


def neighbours(dist: BaseDistribution, value: Any, sweep_pass: int) -> list[Any]:
    """Numeric values either side of `value`, 1/2^(pass+1) of the range away (log scale if log)."""
    if isinstance(dist, CategoricalDistribution):
        return []
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    to, back = _scale(dist), _unscale(dist)
    width = (to(dist.high) - to(dist.low)) / 2 ** (sweep_pass + 1)
    out: list[Any] = []
    for y in (to(value) - width, to(value) + width):
        v = _snap(dist, back(y))
        if v != value and v not in out:
            out.append(v)
    return out


def screen_values(dist: BaseDistribution, value: Any) -> list[Any]:
    """The one value of a parameter most different from `value` (empty if it has no other).

    A categorical's null choice (SGLang decides) or else its first listed one (space files list the
    default first), the last one if `value` is already first; a numeric range's farther bound (in
    log space when the range is log).
    """
    if isinstance(dist, CategoricalDistribution):
        choices = list(dist.choices)
        if None in choices and value is not None:
            return [None]
        other = choices[-1] if value == choices[0] else choices[0]
        return [other] if other != value else []
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    to = _scale(dist)
    far = dist.high if abs(to(dist.high) - to(value)) >= abs(to(value) - to(dist.low)) else dist.low
    return [far] if far != value else []


def grid_space(space: SpaceLike, points: int) -> dict[str, list[Any]]:
    """The search space as a grid (for `GridSampler` and for enumerating a landscape's optimum)."""
    return {name: grid_values(dist, points) for name, dist in discover(space).items()}


def make_sampler(name: str, space: SpaceLike, seed: int | None = None,
                 settings: Settings = DEFAULT) -> optuna.samplers.BaseSampler:
    """The Optuna sampler for `--sampler NAME`.

    "tpe" is set up for mixed, conditional spaces: multivariate, grouped (conditional parameters
    modelled jointly with their parent), constant liar (parallel hosts do not pile onto one
    region); startup trials are few because the baseline and the sweep seed it.
    """
    if name == "tpe":
        return optuna.samplers.TPESampler(
            multivariate=True, group=True, constant_liar=True, n_startup_trials=settings.startup_trials,
            seed=seed,
        )
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=settings.startup_trials, warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(grid_space(space, settings.numeric_points), seed=seed)
    raise BadInput(f"unknown sampler {name!r}: choose one of {', '.join(SAMPLERS)}")


def _unordered(dist: BaseDistribution) -> bool:
    """A categorical whose choices have no order (backends, levels): one screen says little of the rest."""
    return isinstance(dist, CategoricalDistribution) and not all(
        c is None or isinstance(c, (int, float)) for c in dist.choices)


def _failure_text(trial: FrozenTrial) -> str:
    """The deciding line and SGLang's advice lines after it (one clause per line)."""
    failure = trial.user_attrs.get(Attr.FAILURE) or {}
    return "\n".join([str(failure.get("line") or ""), *map(str, failure.get("advice") or [])])


def named_in(text: str, dists: Mapping[str, BaseDistribution]) -> list[str]:
    """Parameters a failure line names: a flag given in full or by a prefix of it
    (``--cuda-graph-max-bs`` names ``--cuda-graph-max-bs-decode``), or an environment variable."""
    flags = re.findall(r"--[a-z0-9][a-z0-9-]*", text)
    return [n for n in dists
            if (n.startswith("--") and any(n == f or n.startswith(f + "-") for f in flags))
            or (not n.startswith("--") and re.search(rf"\b{re.escape(n)}\b", text))]


_DOWN = re.compile(r"\b(?:smaller|lower|decrease|reduce|less)\b", re.IGNORECASE)
_UP = re.compile(r"\b(?:larger|higher|increase|raise|bigger|more)\b", re.IGNORECASE)
_OFF = re.compile(r"\b(?:not using|without|remove|drop)\b", re.IGNORECASE)
# Clauses of advice: lines, sentences, and the items of a numbered list on one line.
_CLAUSE = re.compile(r"[;\n]|(?<=[.!?])\s+(?=[A-Z0-9])|\s(?=\d+\.\s)")


def _is_bool(dist: BaseDistribution) -> bool:
    return isinstance(dist, CategoricalDistribution) and set(dist.choices) == {False, True}


def advice(text: str, dists: Mapping[str, BaseDistribution]) -> dict[str, tuple[str, Any]]:
    """What a failure's text advises for each parameter it names, clause by clause.

    ``("down" | "up", None)`` for "set --mem-fraction-static to a smaller value" / "increase
    --mem-fraction-static"; ``("set", value)`` for a flag given with one of its choices
    (``--cuda-graph-backend-decode disabled``) or a store_true flag ("disable CUDA graph by
    --disable-cuda-graph" sets it, "by not using --enable-torch-compile" clears it);
    ``("any", None)`` where the clause says nothing of how to change it.
    """
    out: dict[str, tuple[str, Any]] = {}
    for clause in _CLAUSE.split(text):
        for name in named_in(clause, dists):
            dist = dists[name]
            given = re.search(rf"{re.escape(name)}(?:=|\s+)([\w.-]+)", clause)
            choices = {str(c): c for c in getattr(dist, "choices", ())}
            value = given.group(1).rstrip(".") if given else None  # "...=disabled. (Not recommended)"
            if value in choices and not _is_bool(dist):
                out[name] = ("set", choices[value])
            elif _is_bool(dist):
                out[name] = ("set", not _OFF.search(clause))
            elif _DOWN.search(clause):
                out[name] = ("down", None)
            elif _UP.search(clause):
                out[name] = ("up", None)
            else:
                out.setdefault(name, ("any", None))
    return out


def toward(dist: BaseDistribution, value: Any, hint: tuple[str, Any], points: int = DEFAULT.repair_points) -> Any | None:
    """The value a hint moves ``value`` to: the next grid value below / above it, the value it
    sets, or the screen's most different value; None when there is none.

    A categorical of numbers counts as ordered; its null choice (SGLang decides) moves to the
    smallest / largest number, the value most likely to fix what the advice is about.
    """
    how, target = hint
    if how == "set":
        return target if target != value and target in getattr(dist, "choices", (target,)) else None
    if how == "any":
        return (screen_values(dist, value) or [None])[0]
    if isinstance(dist, CategoricalDistribution):
        ordered = sorted(c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool))
    else:
        ordered = grid_values(dist, points)
    if not ordered:
        return None
    if not isinstance(value, (int, float)):
        return ordered[0] if how == "down" else ordered[-1]
    side = [v for v in ordered if (v < value if how == "down" else v > value)]
    return (side[-1] if how == "down" else side[0]) if side else None


def _close(dist: BaseDistribution, a: Any, b: Any, within: float) -> bool:
    """Whether two values of a numeric parameter lie within ``within`` of its range (log scale if log)."""
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    to = _scale(dist)
    return abs(to(a) - to(b)) <= within * (to(dist.high) - to(dist.low))


def _cap(params: Mapping[str, Any]) -> float | None:
    """The config's running-batch cap; None where SGLang picks it (not searched, or null)."""
    cap = params.get(CAP)
    return float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) else None


def running_points(trials: Iterable[FrozenTrial]) -> list[tuple[float, float]]:
    """(running batch, mean tok/s) over the ladder levels of ``trials``: a level runs
    min(concurrency, the trial's cap) requests at once."""
    seen: dict[float, list[float]] = {}
    for t in trials:
        ladder, cap = t.user_attrs.get(Attr.LADDER) or [], _cap(t.params)
        for step, value in t.intermediate_values.items():
            if step < len(ladder):
                running = float(ladder[step] if cap is None else min(ladder[step], cap))
                seen.setdefault(running, []).append(float(value))
    return sorted((r, sum(v) / len(v)) for r, v in seen.items())


def running_peak(points: Sequence[tuple[float, float]], noise: float = DEFAULT.noise_margin) -> float | None:
    """The running batch where throughput peaks, when the peak lies inside ``points`` and the curve
    falls beyond it by more than ``noise``: the vertex of a parabola through it and its neighbours (in
    log batch size), kept between them. None otherwise."""
    if len(points) < 3:
        return None
    i = max(range(len(points)), key=lambda j: points[j][1])
    if i in (0, len(points) - 1) or points[i][1] < points[i + 1][1] * (1.0 + noise):
        return None
    (x0, y0), (x1, y1), (x2, y2) = ((math.log(r), v) for r, v in points[i - 1:i + 2])
    den = (x0 - x1) * (x0 - x2) * (x1 - x2)  # the parabola through three unequally spaced points
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / den
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / den
    x = -b / (2 * a) if a < 0 else x1
    return math.exp(min(max(x, x0), x2))


def running_kink(points: Sequence[tuple[float, float]]) -> float | None:
    """Where the line through the two points rising to the highest one meets the line through the
    two points falling after it (log batch, log tok/s), when they meet between them; else None.

    A second, finer read of the peak once a capped run has put a point near it: throughput often
    rises with the batch until the KV cache runs short, then falls steeply, a kink that a parabola
    through three points places on the wrong side. Tried on both sides of the highest point.
    """
    if len(points) < 4:
        return None
    logs = [(math.log(r), math.log(v)) for r, v in points if v > 0]
    i = max(range(len(logs)), key=lambda j: logs[j][1])
    found = []
    for up, down in ((i - 1, i + 1), (i - 2, i)):  # the kink after the highest point, or before it
        if up < 0 or down + 1 >= len(logs):
            continue
        (a0, b0), (a1, b1) = logs[up], logs[up + 1]
        (c0, d0), (c1, d1) = logs[down], logs[down + 1]
        rise, fall = (b1 - b0) / (a1 - a0), (d1 - d0) / (c1 - c0)
        if rise <= fall:
            continue
        x = (d0 - b1 + rise * a1 - fall * c0) / (rise - fall)
        if a1 <= x <= c0:
            found.append(x)
    return math.exp(found[0]) if found else None


def nearest(dist: BaseDistribution, value: float) -> Any | None:
    """The value of ``dist`` closest to ``value`` (its step honoured; a categorical's numeric
    choices, closest in log scale), or None for a categorical without positive numbers."""
    if isinstance(dist, CategoricalDistribution):
        numbers = [c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0]
        return min(numbers, key=lambda c: abs(math.log(c) - math.log(value))) if numbers else None
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    return _snap(dist, value)


class Strategy:
    """One study's search policy; create it once per driver run and route every trial through it.

    Driver loop::

        strategy.start(study, known=[...])            # once: baseline + known configs
        trial, config = strategy.ask(study)
        ... start the server; on a crash: strategy.tell(study, trial, "crashed", failure=...)
        for each level: if not strategy.on_level(study, trial, step, concurrency, tok_s): stop
        strategy.tell(study, trial, outcome, objective=..., slo_ok=..., answers_differ=...)

    ``guided=False`` gives the plain sampler (no warm start, sweep, pruning or skipping): the
    benchmark's reference for what the guidance is worth. The parts can also be varied alone:
    ``settings`` (`search.settings.Settings`) holds every number, ``pruner`` is the ladder rules
    (`search.pruner.LadderPruner`; ``pruning=False`` leaves them out), ``memory`` the filter
    around the sampler that tells known crashes and repeats without running them
    (`search.memory.Memory`; ``memory=False`` leaves it out).
    """

    def __init__(
        self,
        space: SpaceLike,
        sampler: str | optuna.samplers.BaseSampler = "tpe",
        *,
        seed: int | None = None,
        guided: bool = True,
        pruning: bool = True,
        memory: bool = True,
        settings: Settings = DEFAULT,
    ) -> None:
        if space.baseline is None:
            raise BadInput("the strategy starts from a baseline: give the space a `baseline:` or pass --start-from")
        self.space = space
        self.baseline = dict(space.baseline)
        self.settings = settings
        self.sampler = make_sampler(sampler, space, seed, settings) if isinstance(sampler, str) else sampler
        self.guided = guided
        self._dists = discover(space)
        self.ranking = Ranking(self._dists, pooled=guided, settings=settings)
        # The ladder rules; None (unguided, or ``pruning=False`` to ablate them alone) runs every level.
        # Targets are output tok/s by concurrency: they bound only an output-throughput objective
        # (a space without an objective, as a benchmark landscape's, has that one).
        objective = getattr(space, "objective", None)
        tok_s = objective is None or objective.metric == "output_throughput"
        unit = "tok/s" if objective is None else objective.unit
        self.pruner = LadderPruner(space.targets if tok_s else {}, settings, unit=unit) if guided and pruning else None
        # Known crashes and repeats told without running; None (unguided, ``memory=False``) runs every proposal.
        self.memory = Memory(self._dists, settings) if guided and memory else None

    # -- warm start --------------------------------------------------------------------------
    def start(self, study: optuna.Study, known: Iterable[Mapping[str, Any]] = ()) -> None:
        """Enqueue the baseline first, then known configs (`--start-from`, `--from-study`).

        Only on a fresh study: a resumed study already holds them.
        """
        if not self.guided or study.get_trials(deepcopy=False):
            return
        study.enqueue_trial(dict(self.baseline), user_attrs={Attr.PLAN: Plan.BASELINE})
        for config in known:
            if not same_config(config, self.baseline):
                study.enqueue_trial(dict(config), user_attrs={Attr.PLAN: Plan.KNOWN})

    # -- asking ------------------------------------------------------------------------------
    def ask(self, study: optuna.Study) -> tuple[optuna.Trial, dict[str, Any]]:
        """The next trial to run and its config; repeats and known crashes are told, not run.

        After ``max_skips`` of them in a row (a small space run through, or a sampler that has
        converged) the next proposal runs as it is: a repeat measures noise, and the study goes on.
        """
        if self.guided:
            self._plan(study)
        if self.memory is not None:
            trial, config = self.memory.ask(study, self.space.suggest)
        else:
            trial = study.ask()
            config = self.space.suggest(trial)
        if Attr.PLAN not in trial.user_attrs:
            trial.set_user_attr(Attr.PLAN, Plan.SAMPLER)
        return trial, config

    def incumbent(self, study: optuna.Study) -> TrialView | None:
        """The best completed trial meeting every constraint: the first one `top` ranks."""
        best = self.top(study, 1)
        return best[0] if best else None

    def _skip_reason(self, study: optuna.Study, config: Mapping[str, Any]) -> str | None:
        """Why the memory would tell ``config`` without running it (None without a memory)."""
        return None if self.memory is None else self.memory.reason(study, config)

    def _known_crashes(self, study: optuna.Study) -> dict[str, list[Any]]:
        return {} if self.memory is None else self.memory.known_crashes(study)

    def _centre(self, study: optuna.Study) -> tuple[dict[str, Any], bool]:
        """The config the next moves vary, and whether it is known to work.

        The best working trial: a feasible completed one if any, else the one that reached the
        highest level value (pruned below the space's targets still beats not starting). Among
        those within the noise margin of the best, the one with the fewest changes from the baseline
        wins, so a change that only won by noise does not ride along (and block later moves). With
        nothing working yet, the baseline: the sweep then looks for the change that fixes its crash.
        Capped trials (a cap below the ladder's top) are centres only while no other works: the
        cap hides what other flags do to the running-batch curve (more KV memory moves its peak),
        and each centre gets its own cap read off its ladder (`_plan_cap`).
        """
        started = working(study)
        started = [t for t in started if not self._capped(t)] or started
        feasible = [t for t in started
                    if t.state == TrialState.COMPLETE and meets_constraints(t) and t.value is not None]
        scored = [(t, float(t.value)) for t in feasible] or [  # type: ignore[arg-type]
            (t, max(t.intermediate_values.values())) for t in started if t.intermediate_values]
        if not scored:
            return dict(self.baseline), False
        top = max(v for _, v in scored)
        near = [t for t, v in scored if v >= top * (1.0 - self.settings.noise_margin)]
        base = self.baseline
        best = min(near, key=lambda t: (sum(t.params.get(k) != v for k, v in base.items())
                                         + sum(k not in base for k in t.params), t.number))
        return dict(best.params), True

    def _named_by_crash(self, study: optuna.Study) -> list[str]:
        """Parameters the baseline's failure advises changing: SGLang often says which flag to change
        ("set --mem-fraction-static to a smaller value", "disable CUDA graph by --disable-cuda-graph"),
        and where it does not, its usual advice for that kind of failure names them."""
        for t in finished(study):
            if t.constraints.get(Constraint.CRASHED, 0) > 0 and same_config(t.params, self.baseline):
                return list(self._hints(t))
        return []

    def _active(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` without the parameters its own values make inactive (graphs off: no graph
        batch cap), so it compares equal to the trial that runs it. A config missing a parameter
        it activates is left as it is: the sampler fills that one in."""
        try:
            return self.space.suggest(optuna.trial.FixedTrial(dict(config)))
        except ValueError:
            return dict(config)

    def _enqueue(self, study: optuna.Study, configs: Sequence[Mapping[str, Any]], attrs: Mapping[Attr, Any]) -> bool:
        """Enqueue the configs not already run (nor known to crash, unless a partner move); True if any was."""
        tried = [t.params for t in finished(study)]
        fresh: list[dict[str, Any]] = []
        for c in map(self._active, configs):
            if any(same_config(c, p) for p in [*tried, *fresh]):
                continue
            if attrs.get(Attr.PLAN) == Plan.PARTNER or self._skip_reason(study, c) is None:
                fresh.append(dict(c))
        for config in fresh:
            study.enqueue_trial(config, user_attrs={str(k): v for k, v in attrs.items()})
        return bool(fresh)

    def _plan(self, study: optuna.Study) -> None:
        """Enqueue the next batch of planned moves around the centre, if it is time.

        A batch is one parameter's alternative values (or one crash's partner moves); the next
        starts only when the previous batch has finished, so each varies the best config so far
        (greedy); hosts that are free meanwhile take sampler trials.
        Order: repairs of a move that crashed, revisits of earlier wins on a moved centre and the
        cap read off the centre's ladder (whenever there are any); a screen of every parameter; the
        one-flag sweep (pass 0: every choice and a coarse grid) of the parameters whose screen
        mattered, biggest effect first; sweeps of parameters inactive at the centre; the combined
        trial; the rest of the unordered categoricals; then refinement: the fine cap read on the
        centre's ladder, numeric neighbours at a quarter of the range (pass 1); after that, every
        other trial is the model's proposal (`_plan_model`) and the rest the sampler's.
        """
        trials = study.get_trials(deepcopy=False)
        # Wait for the planned moves in flight; sampler trials running on other hosts (parallel
        # studies) do not hold the plan up, they fill hosts while a batch is measured.
        if any(t.state in (TrialState.WAITING, TrialState.RUNNING) and t.user_attrs.get(Attr.PLAN) != Plan.SAMPLER
               for t in trials):
            return
        centre, working = self._centre(study)
        if not working:
            # Every fix the failure line suggests at once: the centre then moves to the best of them.
            named = self._named_by_crash(study)
            variants = [{**centre, n: v} for n in named for v in grid_values(self._dists[n], self.settings.numeric_points)
                        if v != centre.get(n)]
            if self._enqueue(study, variants, {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: "named by the crash", Attr.SWEEP_PASS: 0,
                                               Attr.SWEEP_FROM_WORKING: False}):
                return
        if working and (self._plan_repairs(study, centre) or self._plan_revisit(study, centre)
                        or self._plan_cap(study, centre)):
            return
        screen = self.settings.screen
        if screen and self._plan_screen(study, centre, working):
            return
        effects = self._effects(study) if screen else {}
        for sweep_pass in range(self.settings.sweep_passes):
            swept = {t.user_attrs.get(Attr.SWEEP_PARAM) for t in trials
                     if t.user_attrs.get(Attr.SWEEP_PASS) == sweep_pass and t.user_attrs.get(Attr.SWEEP_FROM_WORKING)}
            # Screened: the parameters that mattered, biggest effect first. Else the space file's
            # order: the user's sense of what matters most.
            names = sorted(effects, key=lambda n: -effects[n]) if screen else list(self._dists)
            if sweep_pass == 1 and working and self._plan_cap(study, centre, fine=True):
                return
            if self._sweep(study, centre, working, names, sweep_pass, swept):
                return
            if sweep_pass == 0 and working and (self._plan_inactive(study, centre, swept)
                                                or self._plan_combine(study, centre)):
                return
            # An unordered categorical's screen tried one choice of several: sweep the rest last.
            unordered = [n for n, d in self._dists.items() if screen and _unordered(d)]
            if sweep_pass == 0 and working and self._sweep(study, centre, working, unordered, sweep_pass, swept):
                return
        if working:
            self._plan_model(study)

    def _sweep(self, study: optuna.Study, centre: dict[str, Any], working: bool, names: Iterable[str],
               sweep_pass: int, swept: set[Any]) -> bool:
        """Enqueue the first of `names` not yet swept in this pass: its values with the rest of the centre."""
        for name in names:
            if name in swept or name not in centre:
                continue
            variants = [{**centre, name: v} for v in self._sweep_values(study, centre, name, sweep_pass)]
            attrs = {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: sweep_pass, Attr.SWEEP_FROM_WORKING: working,
                     Attr.CENTRE_SCORE: self._centre_score(study, centre), Attr.SWEEP_FROM: centre[name]}
            if self._enqueue(study, variants, attrs):
                return True
        return False

    def _sweep_values(self, study: optuna.Study, centre: Mapping[str, Any], name: str, sweep_pass: int) -> list[Any]:
        """The values a sweep of ``name`` tries: every choice or a coarse grid (pass 0), numeric
        neighbours (later passes), less what earlier trials already tell.

        Each trial costs a server start, so every pass drops caps the centre's own ladder already
        measured (`_cap_unread`), and pass 0 drops a grid value within ``close`` of the centre's (the
        centre measured it) and one that lost by more than ``lost_margin`` as the only change from an
        earlier centre (a far bound that halved throughput will not win on the next).
        """
        dist = self._dists[name]
        values = grid_values(dist, self.settings.numeric_points) if sweep_pass == 0 else neighbours(dist, centre[name], sweep_pass)
        if name == CAP:
            values = self._cap_unread(study, centre, values)
        if sweep_pass == 0 and not isinstance(dist, CategoricalDistribution):
            lost = self._lost(study, name)
            values = [v for v in values if v not in lost and not _close(dist, v, centre[name], self.settings.close)]
        return [v for v in values if v != centre[name]]

    def _plan_combine(self, study: optuna.Study, centre: dict[str, Any]) -> bool:
        """Try the centre with every one-flag change that beat its own centre, all at once.

        A change that won only within noise does not move the centre, and a change found before the
        centre moved elsewhere was measured on the old one: together they may add up (a faster
        backend on top of a larger graph batch). Only changes of a value the centre still has count.
        """
        best: dict[str, tuple[float, Any]] = {}
        for t in working(study):
            name, ref, score = t.user_attrs.get(Attr.SWEEP_PARAM), t.user_attrs.get(Attr.CENTRE_SCORE), self._score(t)
            if (name in centre and Attr.SWEEP_FROM in t.user_attrs and centre[name] == t.user_attrs[Attr.SWEEP_FROM]
                    and ref and score and score > ref and score / ref > best.get(name, (1.0, None))[0]):
                best[name] = (score / ref, t.params[name])
        combined = {**centre, **{n: v for n, (_, v) in best.items()}}
        return len(best) > 1 and self._enqueue(study, [combined], {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: "combined"})

    def _centre_score(self, study: optuna.Study, centre: Mapping[str, Any]) -> float:
        """What the centre reached (0 if it has not run): the reference a move's effect is judged by."""
        return max((self._score(t) or 0.0 for t in working(study) if same_config(t.params, centre)), default=0.0)

    def _plan_inactive(self, study: optuna.Study, centre: dict[str, Any], swept: set[Any]) -> bool:
        """Sweep each parameter the centre leaves inactive from the best working config where it is active.

        A conditional parameter (the graph batch cap while graphs are off) is never varied around a
        centre without it, yet the best config may need it set: its parent's other branch deserves
        its own one-flag sweep.
        """
        for name, dist in self._dists.items():
            if name in centre or name in swept:
                continue
            holders = [t for t in working(study) if name in t.params]
            if not holders:
                continue
            best = max(holders, key=lambda t: self._score(t) or 0.0)
            variants = [{**best.params, name: v} for v in grid_values(dist, self.settings.numeric_points) if v != best.params[name]]
            attrs = {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: 0, Attr.SWEEP_FROM_WORKING: True}
            if self._enqueue(study, variants, attrs):
                return True
        return False

    # -- screening ---------------------------------------------------------------------------
    def _score(self, trial: FrozenTrial) -> float | None:
        """What a finished trial reached: its value, or its best level if pruned; None if it crashed."""
        if trial.constraints.get(Constraint.CRASHED, 0) > 0:
            return None
        if trial.state == TrialState.COMPLETE and trial.value is not None:
            return float(trial.value)
        return max(trial.intermediate_values.values()) if trial.intermediate_values else 0.0

    def _plan_screen(self, study: optuna.Study, centre: dict[str, Any], working: bool) -> bool:
        """Enqueue the next parameter's screen (its most different value from the centre), if any.

        Each parameter is screened once from a crashing centre (looking for a change that runs) and
        once from a working one.
        """
        screened = {t.user_attrs.get(Attr.SWEEP_PARAM) for t in study.get_trials(deepcopy=False)
                    if t.user_attrs.get(Attr.SWEEP_PASS) == SCREEN_PASS
                    and bool(t.user_attrs.get(Attr.SWEEP_FROM_WORKING)) == working}
        ref = self._centre_score(study, centre)
        for name, dist in self._dists.items():
            if name in screened or name not in centre:
                continue
            variants = [{**centre, name: v} for v in screen_values(dist, centre[name])]
            attrs = {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: SCREEN_PASS, Attr.SWEEP_FROM_WORKING: working,
                     Attr.CENTRE_SCORE: ref, Attr.SWEEP_FROM: centre[name]}
            if self._enqueue(study, variants, attrs):
                return True
        return False

    def _effects(self, study: optuna.Study) -> dict[str, float]:
        """Parameters whose screen mattered, by relative change from its centre (a crash, or a run
        from a crashing centre: infinite).

        A change within the noise margin is measurement noise: that parameter's other values are left
        to the sampler, which has the screen in its history.
        """
        effects: dict[str, float] = {}
        for t in finished(study):
            if t.user_attrs.get(Attr.SWEEP_PASS) != SCREEN_PASS:
                continue
            score, ref = self._score(t), float(t.user_attrs.get(Attr.CENTRE_SCORE) or 0.0)
            if ref <= 0:
                effect = 0.0 if score is None else math.inf
            else:
                effect = math.inf if score is None else abs(score - ref) / ref
            name = t.user_attrs[Attr.SWEEP_PARAM]
            if effect > self.settings.noise_margin:
                effects[name] = max(effect, effects.get(name, 0.0))
        return effects

    # -- repairs ---------------------------------------------------------------------------
    def _hints(self, trial: FrozenTrial) -> dict[str, tuple[str, Any]]:
        """What a crash's own lines advise changing, else SGLang's usual advice for its kind."""
        found = advice(_failure_text(trial), self._dists)
        kind = failure_kind(trial)
        if not found and kind in _ADVICE:
            found = advice(_ADVICE[kind], self._dists)
        return found

    def _plan_repairs(self, study: optuna.Study, centre: dict[str, Any]) -> bool:
        """Retry a move that crashed with what its failure advises changing, right away.

        A cap removed may run out of memory in graph capture only because the memory fraction
        leaves no room: the failure says "set --mem-fraction-static to a smaller value", so the
        move is retried with that change (one trial per other parameter advised; a parameter the
        advice names alone means the fix is its own value, which the sweep tries). A repair that
        crashed too moves its parameter one more grid step the same way, up to ``repair_steps``.
        Done as soon as the crash is seen: the move may be the biggest win of the space.
        """
        ran = finished(study)
        for t in ran:
            name = t.user_attrs.get(Attr.SWEEP_PARAM)
            if (t.constraints.get(Constraint.CRASHED, 0) <= 0 or not t.user_attrs.get(Attr.SWEEP_FROM_WORKING)
                    or name not in t.params or centre.get(name) == t.params[name]):
                continue
            key = f"{name}={t.params[name]!r}"
            repairs = [r for r in ran if r.user_attrs.get(Attr.PARTNER_OF) == key]
            if any(r.constraints.get(Constraint.CRASHED, 0) <= 0 and r.params.get(name) == t.params[name] for r in repairs):
                continue  # a repair that kept the crashed value ran (graphs off would not count): done
            moves = []
            for q, hint in self._hints(t).items():
                if q == name or q not in centre:
                    continue
                tried = [r.params[q] for r in repairs if q in r.params and r.params[q] != centre[q]]
                if len(tried) >= self.settings.repair_steps or (tried and hint[0] not in ("down", "up")):
                    continue
                value = toward(self._dists[q], tried[-1] if tried else centre[q], hint, self.settings.repair_points)
                if value is not None:
                    moves.append({**centre, name: t.params[name], q: value})
            if self._enqueue(study, moves[:self.settings.max_partners], {Attr.PLAN: Plan.PARTNER, Attr.PARTNER_OF: key}):
                return True
        return False

    def _plan_revisit(self, study: optuna.Study, centre: dict[str, Any]) -> bool:
        """Try again, on the centre it has moved to, a one-flag change that won on an earlier centre.

        A faster backend found before the cap was removed is still likely faster after; without
        this it is left to the sampler. Best win first, one trial per batch; a change is revisited
        only where the centre still holds the value it was measured against, and no more once a
        revisit of it lost (its first win was likely noise, or is gone on the moved centre).
        """
        wins: list[tuple[float, str, Any]] = []
        lost: set[tuple[str, Any]] = set()
        for t in finished(study):
            name, ref, score = t.user_attrs.get(Attr.SWEEP_PARAM), t.user_attrs.get(Attr.CENTRE_SCORE), self._score(t)
            if name not in centre or Attr.SWEEP_FROM not in t.user_attrs:
                continue
            won = bool(ref and score and score > ref * (1.0 + self.settings.revisit_margin))
            if t.user_attrs.get(Attr.SWEEP_PASS) == "revisit" and not won:
                lost.add((name, t.params.get(name)))
            elif won and centre[name] == t.user_attrs[Attr.SWEEP_FROM] and t.params.get(name, centre[name]) != centre[name]:
                wins.append((score / ref, name, t.params[name]))  # type: ignore[operator]
        ref = self._centre_score(study, centre)
        for _, name, value in sorted(wins, key=lambda w: -w[0]):
            if (name, value) in lost:
                continue
            attrs = {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: "revisit", Attr.SWEEP_FROM_WORKING: True,
                     Attr.CENTRE_SCORE: ref, Attr.SWEEP_FROM: centre[name]}
            if self._enqueue(study, [{**centre, name: value}], attrs):
                return True
        return False

    def _plan_model(self, study: optuna.Study) -> bool:
        """Enqueue the Gaussian-process model's proposal, on every other trial once the plan is done.

        The model is fitted on the band of top trials (as `top` fits it); the proposal is the
        candidate of highest expected improvement over the best estimate among ``model_candidates``
        small changes of the ``model_tops`` best configs: numeric parameters only (the sweep mapped the
        choices), one or two at a time, not a config already measured or known to crash. The
        candidates are drawn with the number of finished trials as the seed, so a resumed study
        proposes what the interrupted one would have.
        """
        done = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished() and Attr.SKIPPED not in t.user_attrs]
        if done and done[-1].user_attrs.get(Attr.PLAN) == Plan.MODEL:
            return False  # the sampler's turn: it keeps looking at the whole space
        fitted = band(self._feasible(study), self.settings.rank_band)
        if len(fitted) < self.settings.band_min_points:
            return False
        model = fit(self._dists, [t.params for t in fitted], [t.value or 0.0 for t in fitted])
        if model is None:
            return False
        means = model.predict([t.params for t in fitted])[0]
        tops = [fitted[i].params for i in np.argsort(-means)[:self.settings.model_tops]]
        rng = np.random.default_rng(len(done))
        tried = [t.params for t in finished(study)]
        crashes = self._known_crashes(study)
        candidates: list[dict[str, Any]] = []
        for i in range(self.settings.model_candidates):
            c = self._active(self._perturb(tops[i % len(tops)], rng))
            if not any(same_config(c, x) for x in [*tried, *candidates]) and crashed_choice(c, crashes) is None:
                candidates.append(c)
        if not candidates:
            return False
        gain = model.expected_improvement(candidates, float(means.max()))
        return self._enqueue(study, [candidates[int(np.argmax(gain))]], {Attr.PLAN: Plan.MODEL})

    def _perturb(self, config: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        """``config`` with one or two of its numeric parameters moved by a normal step of ``model_step``."""
        out = dict(config)
        numeric = [n for n in out if isinstance(self._dists.get(n), (IntDistribution, FloatDistribution))]
        for name in rng.choice(numeric, size=min(len(numeric), int(rng.integers(1, 3))), replace=False):
            dist = self._dists[name]
            assert isinstance(dist, (IntDistribution, FloatDistribution))
            to = _scale(dist)
            step = rng.normal(0.0, self.settings.model_step) * (to(dist.high) - to(dist.low))
            out[name] = _snap(dist, _unscale(dist)(to(out[name]) + step))
        return out

    def _cap_unread(self, study: optuna.Study, centre: Mapping[str, Any], values: list[Any]) -> list[Any]:
        """The cap values the centre's ladder has not already measured.

        A run whose cap let every level run in full measured throughput at each level's running
        batch: a cap inside the ladder only repeats that curve (`_plan_cap` reads its peak), and a
        cap above it changes nothing. Left: caps below the lowest level, and only when the curve
        fell from its first level on (the peak may lie below it).
        """
        runs = [t for t in working(study) if t.state == TrialState.COMPLETE and same_config(t.params, centre)
                and not self._capped(t) and len(t.user_attrs.get(Attr.LADDER) or []) >= 2]
        if not runs:
            return values
        ladder, levels = runs[0].user_attrs[Attr.LADDER], runs[0].intermediate_values
        if max(levels, key=lambda step: levels[step]) != 0:
            return []
        return [v for v in values if isinstance(v, (int, float)) and v < min(ladder)]

    def _lost(self, study: optuna.Study, name: str) -> list[Any]:
        """Values of ``name`` that, as the only change from a working centre, lost to it by more
        than ``lost_margin``: far beyond noise, so not worth a sweep trial on a later centre."""
        lost = []
        for t in working(study):
            ref, score = float(t.user_attrs.get(Attr.CENTRE_SCORE) or 0.0), self._score(t)
            if (t.user_attrs.get(Attr.SWEEP_PARAM) == name and t.user_attrs.get(Attr.SWEEP_FROM_WORKING)
                    and ref > 0 and score is not None and score < ref * (1.0 - self.settings.lost_margin) and name in t.params):
                lost.append(t.params[name])
        return lost

    def _capped(self, trial: FrozenTrial) -> bool:
        """Whether the trial's cap kept a ladder level from running all its requests at once."""
        cap, ladder = _cap(trial.params), trial.user_attrs.get(Attr.LADDER) or []
        return cap is not None and bool(ladder) and cap < max(ladder)

    def _plan_cap(self, study: optuna.Study, centre: dict[str, Any], fine: bool = False) -> bool:
        """Try the cap at which the centre's ladder says throughput peaks, when the peak is inside it.

        The levels of the centre and of trials differing from it only in the cap all sample one
        curve, throughput against the running batch. A peak with lower points on both sides (past
        it, KV-cache pressure retracts requests) is located by a parabola through the three points;
        capping there lets the higher levels run at the peak. ``fine``: the second and last read of
        the slice, once the first has put a point near the peak, where the lines rising to and
        falling from the highest point meet (`running_kink`); done at refinement time, on the final
        centre only. More reads would chase the noise of the capped runs.
        """
        dist = self._dists.get(CAP)
        if dist is None or CAP not in centre:
            return False
        rest = {k: v for k, v in centre.items() if k != CAP}
        slice_ = [t for t in finished(study) if {k: v for k, v in t.params.items() if k != CAP} == rest]
        reads = [t.user_attrs.get(Attr.SWEEP_PASS) for t in slice_]
        if "kink" in reads or ("ladder" in reads) != fine:
            return False
        points = running_points(t for t in slice_ if t.constraints.get(Constraint.CRASHED, 0) <= 0)
        peak = running_kink(points) if fine else running_peak(points, self.settings.noise_margin)
        value = None if peak is None else nearest(dist, peak)
        if value is None or any(t.params.get(CAP) == value or not isinstance(dist, CategoricalDistribution)
                                and _close(dist, value, t.params[CAP], self.settings.read_close) for t in slice_ if CAP in t.params):
            return False  # it would only measure a cap of the slice again
        # No centre score or from-value: a read off the ladder is no one-flag win to revisit or combine.
        attrs = {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: CAP, Attr.SWEEP_PASS: "kink" if fine else "ladder", Attr.SWEEP_FROM_WORKING: True}
        return self._enqueue(study, [{**centre, CAP: value}], attrs)

    # -- pruning -----------------------------------------------------------------------------
    def on_level(self, study: optuna.Study, trial: optuna.Trial, step: int, concurrency: float, value: float) -> bool:
        """Report a ladder level (step = its index); False means prune the trial now (`LadderPruner`
        says why, kept as ``pruned_because``)."""
        trial.report(value, step)
        trial.set_user_attr(Attr.LADDER, [*trial.user_attrs.get(Attr.LADDER, [])[:step], concurrency])
        reason = None if self.pruner is None else self.pruner.why(study, step, concurrency, value)
        if reason is not None:
            trial.set_user_attr(Attr.PRUNED_BECAUSE, reason)
        return reason is None

    # -- telling -----------------------------------------------------------------------------
    def tell(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        outcome: Outcome,
        *,
        objective: float | None = None,
        slo_ok: bool = True,
        answers_differ: bool = False,
        failure: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a trial's outcome the way the sampler learns most from it.

        completed -> COMPLETE with the objective; crashed -> PRUNED, crashed = 1; pruned ->
        PRUNED (its last reported level stands in); infrastructure -> FAIL and the same params
        enqueued again. Constraints are set on every trial told here.
        """
        outcome = Outcome(outcome)  # a ValueError naming the outcome for anything else
        trial.set_user_attr(Attr.OUTCOME, outcome)
        if failure is not None:
            trial.set_user_attr(Attr.FAILURE, dict(failure))
        if outcome == Outcome.INFRASTRUCTURE:
            attrs = {k: v for k, v in trial.user_attrs.items() if k in _PLAN_NOTES}
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial(dict(trial.params), user_attrs={**attrs, Attr.RETRY_OF: trial.number})
            return
        set_constraints(trial, crashed=outcome == Outcome.CRASHED, slo_ok=slo_ok, answers_differ=answers_differ)
        if outcome == Outcome.COMPLETED:
            if objective is None:
                raise ValueError("a completed trial needs its objective")
            study.tell(trial, objective)
        else:
            study.tell(trial, state=TrialState.PRUNED)

    def _feasible(self, study: optuna.Study) -> list[TrialView]:
        """Completed trials meeting every constraint, with a throughput."""
        return [t for t in views(study, (TrialState.COMPLETE,)) if t.feasible]

    def top(self, study: optuna.Study, k: int = 3) -> list[TrialView]:
        """The k best feasible trials of distinct configs, as `search.ranking` orders them: what the end re-measures.

        The plain sampler (``guided=False``) ranks by measured value, as Optuna's ``best_trial`` does.
        """
        return self.ranking.top(views(study), k)


def configs_of(grid: Mapping[str, Sequence[Any]], space: SpaceLike) -> list[dict[str, Any]]:
    """Every distinct config on a grid, conditions honoured (inactive parameters dropped)."""
    names = list(grid)
    seen: set[tuple[tuple[str, Any], ...]] = set()
    out: list[dict[str, Any]] = []
    for combo in itertools.product(*(grid[n] for n in names)):
        config = space.suggest(optuna.trial.FixedTrial(dict(zip(names, combo, strict=True))))
        key = tuple(sorted(config.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out
