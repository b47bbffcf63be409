"""The ladder rules: an Optuna pruner that stops a trial after a load-test level it cannot win from.

A ladder level is reported as ``trial.report(value, step)``, the value the space's objective reads
(output tok/s, goodput req/s, or for ``max_rate_under_slo`` the level's rate when it met the SLOs),
with its concurrency (an open-loop level: its request rate) in the trial's ``level_concurrency``
attribute (`search.storage.Attr.LADDER`). `LadderPruner` prunes when
the level is below the space's target at that concurrency, below ``prune_ratio`` of the best
completed feasible trial at that step, or unable to catch the best objective even growing over the
rest of the ladder as fast as any completed trial did. It is a plain `optuna.pruners.BasePruner`
(``trial.should_prune()`` works on a study created with it); the strategy asks `why` instead, to
record the reason on the trial. Dropping it (``Strategy(pruner=None)``) ablates pruning alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import optuna
from optuna.trial import FrozenTrial, TrialState

from search.settings import DEFAULT, Settings
from search.storage import Attr, meets_constraints


class LadderPruner(optuna.pruners.BasePruner):
    """Prunes on ``targets`` (tok/s by concurrency, the space's) and the completed trials' ladders."""

    def __init__(self, targets: Mapping[int, float], settings: Settings = DEFAULT, unit: str = "tok/s") -> None:
        self.targets = dict(targets)
        self.settings = settings
        self.unit = unit

    def _n(self, value: float) -> str:
        return f"{value:.2f}" if self.unit == "req/s" else f"{value:.0f}"

    def _v(self, value: float) -> str:
        return f"{self._n(value)} {self.unit}"

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        ladder = trial.user_attrs.get(Attr.LADDER) or []
        if step is None or step >= len(ladder):
            return False  # no level reported with its concurrency: nothing to judge
        return self.why(study, step, ladder[step], trial.intermediate_values[step]) is not None

    def why(self, study: optuna.Study, step: int, concurrency: float, value: float) -> str | None:
        """Why a trial measuring ``value`` at ladder level ``step`` (``concurrency`` streams, or an
        open-loop level's rate) stops; None: go on."""
        target = self.targets.get(int(concurrency)) if float(concurrency).is_integer() else None
        if target is not None and value < target:
            return f"{value:.0f} tok/s below the target {target:.0f} at {concurrency:g}"
        seen = [t.intermediate_values[step]
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if step in t.intermediate_values and meets_constraints(t)]
        ratio = self.settings.prune_ratio
        if len(seen) >= self.settings.prune_min_completed and value < ratio * max(seen):
            return f"{self._v(value)}, under {ratio:.0%} of the best {self._n(max(seen))} at {concurrency:g}"
        reach = self._reach(study, step, value)
        if reach is not None and reach[0] < reach[1]:
            return (f"{self._v(value)} at {concurrency:g}: growing as fast as any completed trial did, it would "
                    f"reach {self._n(reach[0])}, under the best {self._n(reach[1])}")
        return None

    def _reach(self, study: optuna.Study, step: int, value: float) -> tuple[float, float] | None:
        """(the most a trial at ``value`` after ``step`` can end with, the best objective so far).

        The most: ``value`` times the largest growth from that step to the objective that any
        completed trial showed, plus twice the noise margin (both measurements vary). None while
        fewer than ``prune_min_completed`` trials completed, and at the last step (nothing to save).
        """
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if meets_constraints(t) and t.value and t.intermediate_values.get(step)]
        if len(done) < self.settings.prune_min_completed or step >= max(len(t.intermediate_values) for t in done) - 1:
            return None
        growth = max(float(t.value) / t.intermediate_values[step] for t in done)  # type: ignore[arg-type]
        return value * growth * (1.0 + 2 * self.settings.noise_margin), max(float(t.value) for t in done)  # type: ignore[arg-type]
