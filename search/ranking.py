"""The one ranking of a study's trials: what the study re-measures, shows first, exports and names best.

`search study show`, `study export`, `study report`, the live progress, `--from-study` and the
strategy's own incumbent all order trials here, so they cannot name different winners.

Feasible trials (completed, a throughput, every constraint met) come first:

- re-measured ones first, by the mean of all their measurements: a lucky single run cannot beat
  a config measured three times;
- then the others by a Gaussian-process estimate (`search.surrogate`) that pools the
  measurements of similar configs, not by the single luckiest measurement. Once enough trials
  are there it is fitted on those within ``rank_band`` (`search.settings.Settings`) of the best measured only, since a
  stationary kernel fitted to all of them spends itself on the big far-off differences (a small
  cap at 70%) and reads the few-percent effects that decide the top as noise. The trials measured
  within ``rank_guard`` of the best come first whatever the estimate says of the others: a fit whose
  length scales collapsed on a sharp optimum can rank a config measured far below first. Trials
  outside the band follow by measured value. ``pooled=False`` ranks by measured value alone, as
  Optuna's ``best_trial`` does (the plain sampler the benchmark compares with).

Then the rest by their mean (or their best level when they have no value): completed but
infeasible, pruned, crashed, failed by the infrastructure, running; skipped proposals last. Ties
go to the earlier trial.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from search.distributions import discover
from search.settings import DEFAULT, Settings
from search.space import Space, parse_space
from search.storage import Outcome, TrialView
from search.surrogate import posterior_means


@functools.lru_cache(maxsize=16)
def _distributions(space_json: str) -> Mapping[str, BaseDistribution]:
    """`discover` of a space once per process: it samples the space, and a report ranks several times."""
    return MappingProxyType(discover(parse_space(json.loads(space_json))))


def band(trials: Sequence[TrialView], within: float) -> list[TrialView]:
    """The trials measured within ``within`` (a fraction) of the best of ``trials`` (feasible ones)."""
    best = max((_value(t) for t in trials), default=0.0)
    return [t for t in trials if _value(t) >= best * (1.0 - within)]


def _value(t: TrialView) -> float:
    assert t.value is not None, "only feasible trials, which have a value, are ranked by it"
    return t.value


def _tier(t: TrialView) -> int:
    """Where a trial that cannot win goes: after the feasible ones, in this order."""
    if t.skipped is not None:
        return 6
    if t.state == TrialState.COMPLETE:
        return 1
    if t.state == TrialState.PRUNED:
        return 3 if t.outcome == Outcome.CRASHED else 2
    return 4 if t.state == TrialState.FAIL else 5


def _standing(t: TrialView) -> float:
    """What orders trials within a tier: their mean, else the best level they reached."""
    mean = t.mean
    return mean if mean is not None else max(t.frozen.intermediate_values.values(), default=0.0)


def same_config(a: Mapping[str, object], b: Mapping[str, object]) -> bool:
    """Whether two configs are one point of the space (parameter order aside)."""
    return dict(a) == dict(b)


@dataclass(frozen=True)
class Ranking:
    """Orders trials of one space; ``dists`` are its parameters as `search.distributions.discover` finds them."""

    dists: Mapping[str, BaseDistribution]
    pooled: bool = True
    # The band the model is fitted on (a few samples fewer: every feasible trial) and the guard.
    settings: Settings = DEFAULT
    # The pooled estimate of each config from (dists, configs, values); another model (or a test's
    # fit gone wrong) plugs in here, and the guard and band rules hold whatever it says.
    estimator: Callable[[Mapping[str, BaseDistribution], Sequence[Mapping[str, object]], Sequence[float]],
                        Sequence[float]] = posterior_means

    @classmethod
    def of(cls, space: Space) -> Ranking:
        """The ranking of a stored space's trials, as the strategy that ran them ranks them."""
        return cls(_distributions(space.model_dump_json()))

    def estimates(self, feasible: Sequence[TrialView]) -> dict[int, tuple[bool, float]]:
        """Per feasible trial: (measured within ``rank_guard`` of the best, the model's estimate or its value)."""
        estimate = {t.number: (False, _value(t)) for t in feasible}
        if self.pooled and feasible:
            near = max(_value(t) for t in feasible) * (1.0 - self.settings.rank_guard)
            inside = band(feasible, self.settings.rank_band)
            fitted = inside if len(inside) >= self.settings.band_min_points else list(feasible)
            pooled = self.estimator(self.dists, [t.params for t in fitted], [_value(t) for t in fitted])
            estimate.update({t.number: (_value(t) >= near, float(p)) for t, p in zip(fitted, pooled, strict=True)})
        return estimate

    def ranked(self, trials: Sequence[TrialView]) -> list[TrialView]:
        """Every trial that ran or runs, best first (see the module docstring).

        Planned trials still WAITING when a run ended have not run: they are not results.
        """
        feasible = [t for t in trials if t.feasible]
        again = sorted((t for t in feasible if t.remeasured), key=lambda t: (-_standing(t), t.number))
        estimate = self.estimates(feasible)  # fitted on every feasible trial: re-measuring does not move the rest
        once = sorted((t for t in feasible if not t.remeasured),
                      key=lambda t: (not estimate[t.number][0], -estimate[t.number][1], t.number))
        rest = sorted((t for t in trials if t.state != TrialState.WAITING and not t.feasible),
                      key=lambda t: (_tier(t), -_standing(t), t.number))
        return [*again, *once, *rest]

    def top(self, trials: Sequence[TrialView], k: int) -> list[TrialView]:
        """The k best feasible trials of distinct configs: what the end re-measures and `--from-study` tries."""
        picked: list[TrialView] = []
        for t in self.ranked(trials):
            if not t.feasible or len(picked) == k:
                break
            if not any(same_config(t.params, p.params) for p in picked):
                picked.append(t)
        return picked

    def best(self, trials: Sequence[TrialView]) -> TrialView | None:
        """The winner: the first of the ranking when it is feasible."""
        first = self.top(trials, 1)
        return first[0] if first else None
