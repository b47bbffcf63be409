"""The plan: the configs a guided study tries besides the sampler's, from separate sources.

Plain TPE knows nothing about our problem; the plan adds what we know:

- the baseline is the user's config: it runs first (`search.strategy.Strategy.start`); if it
  crashes, every value of each parameter its failure advises changing is tried (``crash_fix``:
  SGLang's errors say which flag to change);
- screening (``screen``): each parameter first gets one trial, its most different value from the
  best working config (the null/default choice, the far end of a range); only the parameters whose
  screen moved throughput beyond noise (or crashed) get their other values swept, biggest effect
  first, so parameters that do nothing (an NCCL level) cost one trial instead of a whole sweep;
- that coordinate sweep (``sweep``) changes one parameter at a time from the best working config
  (greedy, but a change that wins only by noise does not move the centre), which finds the big
  single-flag wins (a cap removed, graphs off, another backend) and maps crashing values; it skips
  values the centre itself measured (a grid point next to its value) and values that lost by far
  as the only change from an earlier centre;
- a move that crashes is repaired at once with what its failure advises (``repairs``): the log
  watcher keeps SGLang's advice lines ("set --mem-fraction-static to a smaller value"), and a
  failure that names no flag gets SGLang's usual advice for its kind, else for the phase it failed
  in (``signatures/advice.yaml``: a hang in graph capture, a smaller graph batch or graphs off);
  the advised parameter moves one grid step that way (two if the first repair crashes too); not a
  move whose failure's first fix is undoing it (the memory fraction's top end out of memory), which
  the edge bisection closes in on instead;
- where a numeric parameter gains toward a value that crashed past an out-of-memory edge (a memory
  fraction), the midpoint between the best value and that crash runs next, until one step is left
  (``edge``); the sweeps skip values at or past such a crash, and later passes a value past one
  of the centre's line that lost beyond noise;
- when the centre moves, each one-flag change that won on an earlier centre is tried on the new one
  (``revisit``; once: a change whose revisit lost is not tried again);
- the running-batch cap is read off the ladder (``cap_read``): a level runs min(concurrency, cap)
  requests, so the levels of the centre (and of configs differing from it only in the cap) trace
  throughput against the running batch; where that curve peaks inside the ladder, the cap at the
  peak is tried next, and once the final centre is being refined, a second, finer read where the
  lines rising to and falling from the highest point meet (``fine_cap_read``: the curve often has
  a kink where the KV cache runs short). The centre is preferably a config whose cap lets every
  level run in full, so its ladder shows what the other flags do to the whole curve; the sweep
  does not try caps that ladder measured;
- a conditional parameter the best config leaves inactive (the graph batch cap while graphs are
  off) is swept from the best config where it is active (``inactive``); the one-flag wins that did
  not move the centre are tried together (``combine``); the other choices of an unordered
  categorical (a backend) whose one screen showed nothing are swept last (``unordered``);
- then TPE models the joint space seeded by those trials, and every other trial is the
  Gaussian-process model's proposal (``model``): the config of highest expected improvement among
  small changes (one or two numeric parameters, or one choice flipped) of the best configs. TPE's
  wide proposals find the next big region; the model's narrow ones find the few percent an interior
  optimum (an NCCL channel count, a memory fraction) holds, which TPE samples only by luck, and try
  again on the best config a choice whose one screen read as nothing.

Each source is a small function of one `History`, an immutable snapshot of the study's trials with
the space and the `search.settings.Settings` it is read by, that yields candidate batches in its
order of preference. `next_batch` consults the sources in the plan's order (`sources`) and takes
the first batch left with a config worth running (not run, not running or waiting, not a known
crash). So a source can be changed alone, tested on a hand-made history, and left out
(``Settings.plan_off``, the names above) to measure what it is worth; ``Settings.screen = False``
sweeps every parameter in the space file's order instead of screening. The history lives entirely
in the study (user attributes, `search.storage.Attr`), so a resumed study continues the plan.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from search.memory import Memory, crashed_choice, failure_hints, finished, working
from search.moves import (
    CAP,
    cap_of,
    close_in,
    grid_values,
    nearest,
    neighbours,
    running_kink,
    running_peak,
    running_points,
    scale,
    screen_values,
    snap,
    toward,
    unordered,
    unscale,
)
from search.ranking import band, same_config
from search.settings import DEFAULT, Settings
from search.storage import Attr, Constraint, Plan, TrialView, meets_constraints
from search.surrogate import fit

# Pass -1 screens: each parameter's single most different value from the centre. Only parameters
# whose screen moved throughput beyond the noise margin (or crashed) get their other values swept.
SCREEN_PASS = -1


@dataclass(frozen=True)
class Batch:
    """Configs one source proposes together, and the plan's notes each of their trials carries."""

    configs: Sequence[Mapping[str, Any]]
    attrs: Mapping[Attr, Any]


@dataclass(frozen=True)
class History:
    """One snapshot of a study as the plan reads it: its trials, in number order, and what they are
    read by (the space's parameters, baseline and conditions, the settings, the crash memory).

    Every source reads the same snapshot, so the order sources are consulted in cannot change
    what each one sees; derived facts (the centre, the known crashes) are computed once per snapshot.
    """

    trials: tuple[FrozenTrial, ...]
    dists: Mapping[str, BaseDistribution]
    baseline: Mapping[str, Any]
    suggest: Callable[[optuna.trial.BaseTrial], dict[str, Any]]
    settings: Settings = DEFAULT
    memory: Memory | None = None  # None: no known crashes, nothing told without running

    @functools.cached_property
    def finished(self) -> list[FrozenTrial]:
        return finished(self.trials)

    @functools.cached_property
    def working(self) -> list[FrozenTrial]:
        return working(self.trials)

    @functools.cached_property
    def known_crashes(self) -> dict[str, list[Any]]:
        return {} if self.memory is None else self.memory.known_crashes(self.trials)

    def past_oom(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` asks more memory than a config that ran out, whatever its cap or other
        numbers (`Memory.past_oom` with ``numbers_free``: for small moves, the model's)."""
        return (self.memory is not None and self.settings.model_past_oom
                and self.memory.past_oom(self.trials, config, numbers_free=True) is not None)

    @functools.cached_property
    def centre(self) -> tuple[dict[str, Any], bool]:
        """The config the next moves vary, and whether it is known to work.

        The best working trial: a feasible completed one if any, else the one that reached the
        highest level value (pruned below the space's targets still beats not starting). Among
        those within the noise margin of the best, the one with the fewest changes from the baseline
        wins, so a change that only won by noise does not ride along (and block later moves). With
        nothing working yet, the baseline: the sweep then looks for the change that fixes its crash.
        Capped trials (a cap below the ladder's top) are centres only while no uncapped one comes
        within ``uncapped_margin`` of them: the cap hides what other flags do to the running-batch
        curve (more KV memory moves its peak), and each centre gets its own cap read off its ladder
        (`cap_read`). But where the cap read finds a peak far above every uncapped run (a KV-cache
        knee that no other flag moves), sweeping the other flags uncapped measures a config a
        quarter slower than the best, and every move after it is judged there.
        """
        scored = self._scored(self.working)
        if not scored:
            return dict(self.baseline), False
        uncapped = self._scored([t for t in self.working if not capped(t)])
        if uncapped and max(v for _, v in uncapped) >= max(v for _, v in scored) * (1.0 - self.settings.uncapped_margin):
            scored = uncapped
        top = max(v for _, v in scored)
        near = [t for t, v in scored if v >= top * (1.0 - self.settings.noise_margin)]
        base = self.baseline
        best = min(near, key=lambda t: (sum(t.params.get(k) != v for k, v in base.items())
                                         + sum(k not in base for k in t.params), t.number))
        return dict(best.params), True

    @staticmethod
    def _scored(started: list[FrozenTrial]) -> list[tuple[FrozenTrial, float]]:
        """(trial, value) of the feasible completed ones, else (trial, best level) of every one."""
        feasible = [t for t in started
                    if t.state == TrialState.COMPLETE and meets_constraints(t) and t.value is not None]
        return [(t, float(t.value)) for t in feasible] or [  # type: ignore[arg-type]
            (t, max(t.intermediate_values.values())) for t in started if t.intermediate_values]

    def centre_score(self, centre: Mapping[str, Any]) -> float:
        """What the centre reached (0 if it has not run): the reference a move's effect is judged by."""
        return max((score(t) or 0.0 for t in self.working if same_config(t.params, centre)), default=0.0)

    def active(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` without the parameters its own values make inactive (graphs off: no graph
        batch cap), so it compares equal to the trial that runs it. A config missing a parameter
        it activates is left as it is: the sampler fills that one in."""
        suggested = self.complete(config)
        return dict(config) if suggested is None else suggested

    def complete(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """`active` of a ``config`` that sets every parameter its own values make active, else None
        (a flip turning graphs on activates the graph batch cap, which the config it came from did not set)."""
        try:
            return self.suggest(optuna.trial.FixedTrial(dict(config)))
        except ValueError:
            return None

    def line(self, centre: Mapping[str, Any], name: str) -> dict[Any, float]:
        """What each value of ``name`` reached on the centre's line: the working trials that differ
        from ``centre`` in that parameter alone (the centre's own value included), best run each."""
        points: dict[Any, float] = {}
        for t in self.working:
            if name in t.params and same_config({**t.params, name: centre[name]}, centre):
                points[t.params[name]] = max(points.get(t.params[name], 0.0), score(t) or 0.0)
        return points


def score(trial: FrozenTrial) -> float | None:
    """What a finished trial reached: its value, or its best level if pruned; None if it crashed."""
    if trial.constraints.get(Constraint.CRASHED, 0) > 0:
        return None
    if trial.state == TrialState.COMPLETE and trial.value is not None:
        return float(trial.value)
    return max(trial.intermediate_values.values()) if trial.intermediate_values else 0.0


def capped(trial: FrozenTrial) -> bool:
    """Whether the trial's cap kept a ladder level from running all its requests at once."""
    cap, ladder = cap_of(trial.params), trial.user_attrs.get(Attr.LADDER) or []
    return cap is not None and bool(ladder) and cap < max(ladder)


# -- the sources ------------------------------------------------------------------------------

def crash_fix(h: History) -> Iterator[Batch]:
    """With nothing working yet, every fix the baseline's failure suggests at once: the centre then
    moves to the best of them.

    SGLang often says which flag to change ("set --mem-fraction-static to a smaller value",
    "disable CUDA graph by --disable-cuda-graph"), and where it does not, its usual advice for that
    kind of failure names them.
    """
    centre, working_ = h.centre
    if working_:
        return
    crash = next((t for t in h.finished if t.constraints.get(Constraint.CRASHED, 0) > 0
                  and same_config(t.params, h.baseline)), None)
    named = list(failure_hints(crash, h.dists)) if crash is not None else []
    variants = [{**centre, n: v} for n in named for v in grid_values(h.dists[n], h.settings.numeric_points)
                if v != centre.get(n)]
    yield Batch(variants, {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: "named by the crash", Attr.SWEEP_PASS: 0,
                           Attr.SWEEP_FROM_WORKING: False})


def repairs(h: History) -> Iterator[Batch]:
    """Retry a move that crashed with what its failure advises changing, right away.

    A cap removed may run out of memory in graph capture only because the memory fraction
    leaves no room: the failure says "set --mem-fraction-static to a smaller value", so the
    move is retried with that change (one trial per other parameter advised; a parameter the
    advice names alone means the fix is its own value, which the sweep tries). A repair that
    crashed too moves its parameter one more grid step the same way, up to ``repair_steps``.
    Done as soon as the crash is seen: the move may be the biggest win of the space.

    Not for a screen or sweep move whose failure's first fix is undoing the move itself (the
    memory fraction's top end ran out of memory: "set --mem-fraction-static to a smaller value"
    comes first): another flag seldom makes a value that far past the edge fit (in traces, 91 of 92
    such repairs of the screen ran out too), and `edge` bisects toward it instead
    (``Settings.undo_repairs`` repairs them too).
    """
    centre, working_ = h.centre
    if not working_:
        return
    for t in h.finished:
        name = t.user_attrs.get(Attr.SWEEP_PARAM)
        if (t.constraints.get(Constraint.CRASHED, 0) <= 0 or not t.user_attrs.get(Attr.SWEEP_FROM_WORKING)
                or name not in t.params or centre.get(name) == t.params[name]):
            continue
        hints = failure_hints(t, h.dists)
        if not h.settings.undo_repairs and t.user_attrs.get(Attr.SWEEP_PASS) is not None and next(iter(hints), None) == name:
            continue  # the failure's first fix is undoing the move itself: the edge bisection closes in
        key = f"{name}={t.params[name]!r}"
        tries = [r for r in h.finished if r.user_attrs.get(Attr.PARTNER_OF) == key]
        if any(r.constraints.get(Constraint.CRASHED, 0) <= 0 and r.params.get(name) == t.params[name] for r in tries):
            continue  # a repair that kept the crashed value ran (graphs off would not count): done
        moves = []
        for q, hint in hints.items():
            if q == name or q not in centre:
                continue
            tried = [r.params[q] for r in tries if q in r.params and r.params[q] != centre[q]]
            if len(tried) >= h.settings.repair_steps or (tried and hint[0] not in ("down", "up")):
                continue
            value = toward(h.dists[q], tried[-1] if tried else centre[q], hint, h.settings.repair_points)
            if value is not None:
                moves.append({**centre, name: t.params[name], q: value})
        yield Batch(moves[:h.settings.max_partners], {Attr.PLAN: Plan.PARTNER, Attr.PARTNER_OF: key})


def edge(h: History) -> Iterator[Batch]:
    """Bisect toward the out-of-memory edge of a numeric parameter while the line toward it gains.

    A memory fraction pays up to where it runs out of memory (more KV cache, a later knee), and
    that edge moves with the graph batch and the backend: the coarse grid lands well short of it,
    and the halving neighbours take several trials, half of them on the side that loses. A one-flag
    move of that parameter that crashed with its failure's first fix undoing it ("set
    --mem-fraction-static to a smaller value": `edge_crashes`) bounds the centre's line
    (`History.line`). The midpoint between the line's best value
    and the nearest such crash runs next, as long as that best value beat its neighbour away from
    the crash beyond the noise margin (an edge that holds no gain costs nothing) and nothing on the
    line lies between them; it stops at the parameter's step, or within ``read_close`` of the range.
    """
    centre, working_ = h.centre
    if not working_:
        return
    for name, dist in h.dists.items():
        if name not in centre or not isinstance(dist, (IntDistribution, FloatDistribution)):
            continue
        points = h.line(centre, name)
        if not points:
            continue
        best = max(points, key=lambda v: points[v])
        crashes = [x for x, how in edge_crashes(h, name) if _back_toward((x, how), best)]
        for side in (-1, 1):
            past = [x for x in crashes if (x - best) * side > 0]
            behind = [v for v in points if (v - best) * side < 0]
            if not past or not behind:
                continue
            crash = min(past, key=lambda x: abs(x - best))
            if (any((v - best) * side > 0 and (crash - v) * side > 0 for v in points)
                    or points[min(behind, key=lambda v: abs(v - best))] >= points[best] * (1.0 - h.settings.noise_margin)):
                continue  # probed between already, or nothing gained on the way toward the crash
            to = scale(dist)
            mid = snap(dist, unscale(dist)((to(best) + to(crash)) / 2.0))
            if mid not in (best, crash) and not close_in(dist, best, crash, h.settings.read_close):
                yield Batch([{**centre, name: mid}], {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: "edge",
                                                      Attr.SWEEP_FROM_WORKING: True, Attr.CENTRE_SCORE: h.centre_score(centre),
                                                      Attr.SWEEP_FROM: centre[name]})


def edge_crashes(h: History, name: str) -> list[tuple[Any, str]]:
    """(value, "down" or "up") of each one-flag move of ``name`` from a working centre that crashed
    with its failure's first fix undoing it, and the way that fix points ("set
    --mem-fraction-static to a smaller value": down). The edge is taken to hold whatever the
    other flags: a guess (a graph batch moves it), which the edge's own crashes correct."""
    found = []
    for t in h.finished:
        if (t.constraints.get(Constraint.CRASHED, 0) > 0 and t.user_attrs.get(Attr.SWEEP_PARAM) == name
                and t.user_attrs.get(Attr.SWEEP_FROM_WORKING) and name in t.params):
            hints = failure_hints(t, h.dists)
            if next(iter(hints), None) == name and hints[name][0] in ("down", "up"):
                found.append((t.params[name], hints[name][0]))
    return found


def _back_toward(crash: tuple[Any, str], value: Any) -> bool:
    """Whether a crash's advice points from its value back toward ``value`` (it lies past an edge from it)."""
    x, how = crash
    return bool(how == "down" and x > value or how == "up" and x < value)


def revisit(h: History) -> Iterator[Batch]:
    """Try again, on the centre it has moved to, a one-flag change that won on an earlier centre.

    A faster backend found before the cap was removed is still likely faster after; without
    this it is left to the sampler. Best win first, one trial per batch; a change is revisited
    only where the centre still holds the value it was measured against, and no more once a
    revisit of it lost (its first win was likely noise, or is gone on the moved centre).
    """
    centre, working_ = h.centre
    if not working_:
        return
    wins: list[tuple[float, str, Any]] = []
    lost_again: set[tuple[str, Any]] = set()
    for t in h.finished:
        name, ref, got = t.user_attrs.get(Attr.SWEEP_PARAM), t.user_attrs.get(Attr.CENTRE_SCORE), score(t)
        if name not in centre or Attr.SWEEP_FROM not in t.user_attrs:
            continue
        won = bool(ref and got and got > ref * (1.0 + h.settings.revisit_margin))
        if t.user_attrs.get(Attr.SWEEP_PASS) == "revisit" and not won:
            lost_again.add((name, t.params.get(name)))
        elif won and centre[name] == t.user_attrs[Attr.SWEEP_FROM] and t.params.get(name, centre[name]) != centre[name]:
            wins.append((got / ref, name, t.params[name]))  # type: ignore[operator]
    ref = h.centre_score(centre)
    for _, name, value in sorted(wins, key=lambda w: -w[0]):
        if (name, value) not in lost_again:
            yield Batch([{**centre, name: value}], {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: "revisit",
                                                    Attr.SWEEP_FROM_WORKING: True, Attr.CENTRE_SCORE: ref,
                                                    Attr.SWEEP_FROM: centre[name]})


def cap_read(h: History, fine: bool = False) -> Iterator[Batch]:
    """Try the cap at which the centre's ladder says throughput peaks, when the peak is inside it.

    The levels of the centre and of trials differing from it only in the cap all sample one
    curve, throughput against the running batch. A peak with lower points on both sides (past
    it, KV-cache pressure retracts requests) is located by a parabola through the three points;
    capping there lets the higher levels run at the peak. ``fine``: the second and last read of
    the slice, once the first has put a point near the peak, where the lines rising to and
    falling from the highest point meet (`search.moves.running_kink`); done at refinement time,
    on the final centre only. More reads would chase the noise of the capped runs.
    """
    centre, working_ = h.centre
    dist = h.dists.get(CAP)
    if not working_ or dist is None or CAP not in centre:
        return
    rest = {k: v for k, v in centre.items() if k != CAP}
    slice_ = [t for t in h.finished if {k: v for k, v in t.params.items() if k != CAP} == rest]
    reads = [t.user_attrs.get(Attr.SWEEP_PASS) for t in slice_]
    if "kink" in reads or ("ladder" in reads) != fine:
        return
    points = running_points(t for t in slice_ if t.constraints.get(Constraint.CRASHED, 0) <= 0)
    peak = running_kink(points) if fine else running_peak(points, h.settings.noise_margin)
    value = None if peak is None else nearest(dist, peak)
    if value is None or any(t.params.get(CAP) == value or not isinstance(dist, CategoricalDistribution)
                            and close_in(dist, value, t.params[CAP], h.settings.read_close) for t in slice_ if CAP in t.params):
        return  # it would only measure a cap of the slice again
    # No centre score or from-value: a read off the ladder is no one-flag win to revisit or combine.
    yield Batch([{**centre, CAP: value}], {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: CAP,
                                           Attr.SWEEP_PASS: "kink" if fine else "ladder", Attr.SWEEP_FROM_WORKING: True})


def screen(h: History) -> Iterator[Batch]:
    """The next parameter's screen (its most different value from the centre), if any.

    Each parameter is screened once from a crashing centre (looking for a change that runs) and
    once from a working one. ``Settings.screen = False`` screens nothing: the sweep takes every
    parameter instead.
    """
    if not h.settings.screen:
        return
    centre, working_ = h.centre
    screened = {t.user_attrs.get(Attr.SWEEP_PARAM) for t in h.trials
                if t.user_attrs.get(Attr.SWEEP_PASS) == SCREEN_PASS and bool(t.user_attrs.get(Attr.SWEEP_FROM_WORKING)) == working_}
    ref = h.centre_score(centre)
    for name, dist in h.dists.items():
        if name not in screened and name in centre:
            yield Batch([{**centre, name: v} for v in screen_values(dist, centre[name])],
                        {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: SCREEN_PASS,
                         Attr.SWEEP_FROM_WORKING: working_, Attr.CENTRE_SCORE: ref, Attr.SWEEP_FROM: centre[name]})


def effects(h: History) -> dict[str, float]:
    """Parameters whose screen mattered, by relative change from its centre (a crash, or a run
    from a crashing centre: infinite).

    A change within the noise margin is measurement noise: that parameter's other values are left
    to the sampler, which has the screen in its history.
    """
    found: dict[str, float] = {}
    for t in h.finished:
        if t.user_attrs.get(Attr.SWEEP_PASS) != SCREEN_PASS:
            continue
        got, ref = score(t), float(t.user_attrs.get(Attr.CENTRE_SCORE) or 0.0)
        if ref <= 0:
            effect = 0.0 if got is None else math.inf
        else:
            effect = math.inf if got is None else abs(got - ref) / ref
        name = t.user_attrs[Attr.SWEEP_PARAM]
        if effect > h.settings.noise_margin:
            found[name] = max(effect, found.get(name, 0.0))
    return found


def swept(h: History, sweep_pass: int) -> set[Any]:
    """The parameters already swept from a working centre in this pass."""
    return {t.user_attrs.get(Attr.SWEEP_PARAM) for t in h.trials
            if t.user_attrs.get(Attr.SWEEP_PASS) == sweep_pass and t.user_attrs.get(Attr.SWEEP_FROM_WORKING)}


def sweep(h: History, sweep_pass: int, names: Iterable[str] | None = None) -> Iterator[Batch]:
    """Each of ``names`` not yet swept in this pass: its values with the rest of the centre.

    ``names`` default: screened, the parameters that mattered, biggest effect first; else the
    space file's order, the user's sense of what matters most.
    """
    centre, working_ = h.centre
    if names is None:
        mattered = effects(h) if h.settings.screen else {}
        names = sorted(mattered, key=lambda n: -mattered[n]) if h.settings.screen else list(h.dists)
    done = swept(h, sweep_pass)
    for name in names:
        if name in done or name not in centre:
            continue
        yield Batch([{**centre, name: v} for v in sweep_values(h, centre, name, sweep_pass)],
                    {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: sweep_pass, Attr.SWEEP_FROM_WORKING: working_,
                     Attr.CENTRE_SCORE: h.centre_score(centre), Attr.SWEEP_FROM: centre[name]})


def unordered_rest(h: History) -> Iterator[Batch]:
    """The other choices of each unordered categorical (a backend), whose screen tried one of several, swept last."""
    if h.centre[1] and h.settings.screen:
        yield from sweep(h, 0, [n for n, d in h.dists.items() if unordered(d)])


def sweep_values(h: History, centre: Mapping[str, Any], name: str, sweep_pass: int) -> list[Any]:
    """The values a sweep of ``name`` tries: every choice or a coarse grid (pass 0), numeric
    neighbours (later passes), less what earlier trials already tell.

    Each trial costs a server start, so every pass drops caps the centre's own ladder already
    measured (`cap_unread`) and values at or past an out-of-memory edge of their own
    (`edge_crashes`: `edge` closes in on it); pass 0 drops a grid value within ``close`` of the
    centre's (the centre measured it) and one that lost by more than ``lost_margin`` as the only
    change from an earlier centre (a far bound that halved throughput will not win on the next);
    later passes drop a value past one of the centre's line that lost beyond noise (`lost_on_line`).
    """
    dist = h.dists[name]
    values = grid_values(dist, h.settings.numeric_points) if sweep_pass == 0 else neighbours(dist, centre[name], sweep_pass)
    if name == CAP:
        values = cap_unread(h, centre, values)
    if sweep_pass == 0 and not isinstance(dist, CategoricalDistribution):
        gone = lost(h, name)
        values = [v for v in values if v not in gone and not close_in(dist, v, centre[name], h.settings.close)]
    if h.settings.skip_past and not isinstance(dist, CategoricalDistribution):
        crashes = [x for x, how in edge_crashes(h, name) if _back_toward((x, how), centre[name])]
        losses = lost_on_line(h, centre, name) if sweep_pass > 0 else []
        values = [v for v in values if not any((v - x) * (x - centre[name]) >= 0 for x in crashes)
                  and not any((w - centre[name]) * (v - w) > 0 for w in losses)]
    return [v for v in values if v != centre[name]]


def lost_on_line(h: History, centre: Mapping[str, Any], name: str) -> list[Any]:
    """Values of the centre's line that lost to the centre by more than the noise margin: with one
    peak along the line, a value past one of them loses too (a neighbour below a memory fraction
    the study already moved up from)."""
    ref = h.centre_score(centre)
    return [w for w, got in h.line(centre, name).items() if got < ref * (1.0 - h.settings.noise_margin)]


def cap_unread(h: History, centre: Mapping[str, Any], values: list[Any]) -> list[Any]:
    """The cap values the centre's ladder has not already measured.

    A run whose cap let every level run in full measured throughput at each level's running
    batch: a cap inside the ladder only repeats that curve (`cap_read` reads its peak), and a
    cap above it changes nothing. Left: caps below the lowest level, and only when the curve
    fell from its first level on (the peak may lie below it).
    """
    runs = [t for t in h.working if t.state == TrialState.COMPLETE and same_config(t.params, centre)
            and not capped(t) and len(t.user_attrs.get(Attr.LADDER) or []) >= 2]
    if not runs:
        return values
    ladder, levels = runs[0].user_attrs[Attr.LADDER], runs[0].intermediate_values
    if max(levels, key=lambda step: levels[step]) != 0:
        return []
    return [v for v in values if isinstance(v, (int, float)) and v < min(ladder)]


def lost(h: History, name: str) -> list[Any]:
    """Values of ``name`` that, as the only change from a working centre, lost to it by more
    than ``lost_margin``: far beyond noise, so not worth a sweep trial on a later centre."""
    out = []
    for t in h.working:
        ref, got = float(t.user_attrs.get(Attr.CENTRE_SCORE) or 0.0), score(t)
        if (t.user_attrs.get(Attr.SWEEP_PARAM) == name and t.user_attrs.get(Attr.SWEEP_FROM_WORKING)
                and ref > 0 and got is not None and got < ref * (1.0 - h.settings.lost_margin) and name in t.params):
            out.append(t.params[name])
    return out


def inactive(h: History) -> Iterator[Batch]:
    """Sweep each parameter the centre leaves inactive from the best working config where it is active.

    A conditional parameter (the graph batch cap while graphs are off) is never varied around a
    centre without it, yet the best config may need it set: its parent's other branch deserves
    its own one-flag sweep.
    """
    centre, working_ = h.centre
    if not working_:
        return
    done = swept(h, 0)
    for name, dist in h.dists.items():
        if name in centre or name in done:
            continue
        holders = [t for t in h.working if name in t.params]
        if not holders:
            continue
        best = max(holders, key=lambda t: score(t) or 0.0)
        yield Batch([{**best.params, name: v} for v in grid_values(dist, h.settings.numeric_points) if v != best.params[name]],
                    {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: 0, Attr.SWEEP_FROM_WORKING: True})


def combine(h: History) -> Iterator[Batch]:
    """Try the centre with every one-flag change that beat its own centre, all at once.

    A change that won only within noise does not move the centre, and a change found before the
    centre moved elsewhere was measured on the old one: together they may add up (a faster
    backend on top of a larger graph batch). Only changes of a value the centre still has count.
    """
    centre, working_ = h.centre
    if not working_:
        return
    best: dict[str, tuple[float, Any]] = {}
    for t in h.working:
        name, ref, got = t.user_attrs.get(Attr.SWEEP_PARAM), t.user_attrs.get(Attr.CENTRE_SCORE), score(t)
        if (name in centre and Attr.SWEEP_FROM in t.user_attrs and centre[name] == t.user_attrs[Attr.SWEEP_FROM]
                and ref and got and got > ref and got / ref > best.get(name, (1.0, None))[0]):
            best[name] = (got / ref, t.params[name])
    if len(best) > 1:
        yield Batch([{**centre, **{n: v for n, (_, v) in best.items()}}], {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: "combined"})


def model(h: History) -> Iterator[Batch]:
    """The Gaussian-process model's proposal, on every other trial once the rest of the plan is done.

    The model is fitted on the band of top trials (as the ranking fits it); the proposal is the
    candidate of highest expected improvement over the best estimate among ``model_candidates``
    small changes of the ``model_tops`` best configs: one or two numeric parameters moved, or (one
    candidate in ``model_flip_every``) one categorical set to another choice (`flip`), not a config
    already measured or known to crash. The candidates are drawn with the number of finished trials
    as the seed, so a resumed study proposes what the interrupted one would have.
    """
    if not h.centre[1]:
        return
    done = [t for t in h.trials if t.state.is_finished() and Attr.SKIPPED not in t.user_attrs]
    if done and done[-1].user_attrs.get(Attr.PLAN) == Plan.MODEL:
        return  # the sampler's turn: it keeps looking at the whole space
    feasible = [v for v in (TrialView(t) for t in h.trials if t.state == TrialState.COMPLETE) if v.feasible]
    fitted = band(feasible, h.settings.rank_band)
    if len(fitted) < h.settings.band_min_points:
        return
    gp = fit(h.dists, [t.params for t in fitted], [t.value or 0.0 for t in fitted])
    if gp is None:
        return
    means = gp.predict([t.params for t in fitted])[0]
    tops = [fitted[i].params for i in np.argsort(-means)[:h.settings.model_tops]]
    rng = np.random.default_rng(len(done))
    tried = [t.params for t in h.finished]
    candidates: list[dict[str, Any]] = []
    every = h.settings.model_flip_every
    for i in range(h.settings.model_candidates):
        top, flipping = tops[i % len(tops)], bool(every) and i % every == every - 1
        c = h.complete(flip(h, top, rng)) if flipping else h.active(perturb(h, top, rng))  # a numeric move keeps every parameter set
        if (c is not None and not any(same_config(c, x) for x in [*tried, *candidates])
                and crashed_choice(c, h.known_crashes) is None and not h.past_oom(c)):
            candidates.append(c)
    if candidates:
        gain = gp.expected_improvement(candidates, float(means.max()))
        yield Batch([candidates[int(np.argmax(gain))]], {Attr.PLAN: Plan.MODEL})


def flip(h: History, config: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """``config`` with one of its categorical parameters (a backend, a switch) set to another choice:
    a small effect that one noisy screen read as nothing, on a centre since moved far, is otherwise
    tried again only by the sampler's luck."""
    out = dict(config)
    names = [n for n in out if isinstance(h.dists.get(n), CategoricalDistribution)]
    if names:
        name = names[int(rng.integers(len(names)))]
        dist = h.dists[name]
        assert isinstance(dist, CategoricalDistribution)
        others = [c for c in dist.choices if c != out[name]]
        if others:
            out[name] = others[int(rng.integers(len(others)))]
    return out


def perturb(h: History, config: Mapping[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """``config`` with one or two of its numeric parameters moved by a normal step of ``model_step``."""
    out = dict(config)
    numeric = [n for n in out if isinstance(h.dists.get(n), (IntDistribution, FloatDistribution))]
    for name in rng.choice(numeric, size=min(len(numeric), int(rng.integers(1, 3))), replace=False):
        dist = h.dists[name]
        assert isinstance(dist, (IntDistribution, FloatDistribution))
        to = scale(dist)
        step = rng.normal(0.0, h.settings.model_step) * (to(dist.high) - to(dist.low))
        out[name] = snap(dist, unscale(dist)(to(out[name]) + step))
    return out


# -- the planner ------------------------------------------------------------------------------

def sources(h: History) -> Iterator[tuple[str, Iterable[Batch]]]:
    """The plan's sources by name, in the order they are consulted (the sources are lazy: one
    left out or never reached costs nothing).

    Repairs, revisits of earlier wins on a moved centre and the cap read off the centre's ladder
    come whenever there are any; then a screen of every parameter; the one-flag sweep (pass 0:
    every choice and a coarse grid) of the parameters whose screen mattered, biggest effect first;
    sweeps of parameters inactive at the centre; the combined trial; the rest of the unordered
    categoricals; then refinement: the fine cap read, numeric neighbours at a quarter of the range
    (pass 1); after that, every other trial is the model's and the rest the sampler's.
    """
    yield "crash_fix", crash_fix(h)
    yield "repairs", repairs(h)
    yield "edge", edge(h)
    yield "revisit", revisit(h)
    yield "cap_read", cap_read(h)
    yield "screen", screen(h)
    for sweep_pass in range(h.settings.sweep_passes):
        if sweep_pass == 1:
            yield "fine_cap_read", cap_read(h, fine=True)
        yield "sweep", sweep(h, sweep_pass)
        if sweep_pass == 0:
            yield "inactive", inactive(h)
            yield "combine", combine(h)
            yield "unordered", unordered_rest(h)
    yield "model", model(h)


def worth_running(h: History, batch: Batch) -> list[dict[str, Any]]:
    """The configs of ``batch`` not already run nor a repeat within it, and not told without
    running by the memory (a repeat of a running or waiting trial, a known crash), except for a
    repair, which may need a known crash's value."""
    tried = [t.params for t in h.finished]
    fresh: list[dict[str, Any]] = []
    for c in map(h.active, batch.configs):
        if any(same_config(c, p) for p in [*tried, *fresh]):
            continue
        if batch.attrs.get(Attr.PLAN) == Plan.PARTNER or h.memory is None or h.memory.reason(h.trials, c) is None:
            fresh.append(dict(c))
    return fresh


def next_batch(h: History) -> Batch | None:
    """The plan's next batch of moves around the centre, only its configs worth running; None while
    planned moves are in flight or when the plan has nothing (the sampler's turn).

    A batch is one parameter's alternative values (or one crash's repairs); the next starts only
    when the previous batch has finished, so each varies the best config so far (greedy); hosts
    that are free meanwhile take sampler trials, which do not hold the plan up.
    """
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) and t.user_attrs.get(Attr.PLAN) != Plan.SAMPLER
           for t in h.trials):
        return None
    for name, batches in sources(h):
        if name in h.settings.plan_off:
            continue
        for batch in batches:
            fresh = worth_running(h, batch)
            if fresh:
                return Batch(fresh, batch.attrs)
    return None
