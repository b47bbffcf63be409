"""The crash and repeat memory: a filter around the sampler that tells, without running, what the study already knows.

Each `Memory.ask` takes Optuna's next trial (planned or sampled) and, while its config is a known
crash or a repeat of a finished, running or waiting trial, tells it at once (user attribute
``skipped``; a known crash PRUNED with ``crashed = 1`` so TPE learns to avoid it, a repeat FAIL,
which samplers ignore) and asks again. After ``max_skips`` in a row (a small space used up, a
converged sampler) the next proposal runs: a repeat measures the noise, and the study goes on.
Planned repairs, the baseline and known configs always run. ``Strategy(memory=False)`` ablates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from search.optuna_internals import enqueued_params
from search.ranking import same_config
from search.settings import DEFAULT, Settings
from search.storage import Attr, Constraint, Outcome, Plan, set_constraints

# Proposals that always run: what the user gave, and a crash's repair (which may repeat a known crash's value).
_ALWAYS = (Plan.BASELINE, Plan.KNOWN, Plan.PARTNER)


def finished(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Trials that ran to a verdict (COMPLETE or PRUNED), proposals told without running left out."""
    return [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and Attr.SKIPPED not in t.user_attrs]


def working(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Finished trials whose server started (completed, or pruned on the ladder)."""
    return [t for t in finished(trials) if t.constraints.get(Constraint.CRASHED, 0) <= 0]


def crashed_choice(config: Mapping[str, Any], crashes: Mapping[str, list[Any]]) -> str | None:
    """The parameter whose value in ``config`` is among its known ``crashes``, if any."""
    return next((n for n, values in crashes.items() if n in config and config[n] in values), None)


def failure_kind(trial: FrozenTrial) -> str | None:
    return (trial.user_attrs.get(Attr.FAILURE) or {}).get("kind")


class Memory:
    """Known crashes and repeats of one space (``dists``: its parameters), told instead of run."""

    def __init__(self, dists: Mapping[str, BaseDistribution], settings: Settings = DEFAULT) -> None:
        self.dists = dists
        self.settings = settings

    def ask(self, study: optuna.Study,
            suggest: Callable[[optuna.Trial], dict[str, Any]]) -> tuple[optuna.Trial, dict[str, Any]]:
        """The next trial worth running and its config (``suggest`` samples it from the trial)."""
        for skips in range(self.settings.max_skips + 1):
            trial = study.ask()
            config = suggest(trial)
            if skips == self.settings.max_skips or trial.user_attrs.get(Attr.PLAN) in _ALWAYS:
                break
            reason = self.reason(study.get_trials(deepcopy=False), config, asking=trial.number)
            if reason is None:
                break
            self._tell_skipped(study, trial, reason)
        return trial, config

    def known_crashes(self, trials: Sequence[FrozenTrial]) -> dict[str, list[Any]]:
        """Choices that crashed when the sweep changed only that parameter of a working config.

        A move from a crashing centre says nothing of its value (the centre's own fault crashed
        it: a baseline whose backend fails would otherwise make graphs-off a known crash). Numeric
        values and out-of-memory crashes are left out: those are thresholds that move with other
        flags (a larger graph batch fits with a smaller memory fraction), as is a value that has run
        in any config.
        """
        found: dict[str, list[Any]] = {}
        ran = [t.params for t in working(trials)]
        for t in finished(trials):
            name = t.user_attrs.get(Attr.SWEEP_PARAM)
            categorical = name is not None and isinstance(self.dists.get(name), CategoricalDistribution)
            if (categorical and t.user_attrs.get(Attr.SWEEP_FROM_WORKING) and t.constraints.get(Constraint.CRASHED, 0) > 0
                    and name in t.params and failure_kind(t) != "oom" and not any(p.get(name, t) == t.params[name] for p in ran)):
                found.setdefault(name, []).append(t.params[name])
        return found

    def reason(self, trials: Sequence[FrozenTrial], config: Mapping[str, Any], asking: int | None = None) -> str | None:
        """Why ``config`` should not run, by the study's ``trials``: a known crash, or the config of a
        finished, running or waiting trial (parallel asks see each other's configs only through this: GPSampler has no
        constant liar; a retry waits with the config of a lost trial, which a planned move may
        repeat). ``asking`` is the trial being asked, itself running."""
        name = crashed_choice(config, self.known_crashes(trials))
        if name is not None:
            return f"{name}={config[name]!r} crashed when the sweep tried it alone"
        for t in finished(trials):
            if same_config(t.params, config):
                return f"same config as trial {t.number}"
        for t in trials:
            if (t.state in (TrialState.RUNNING, TrialState.WAITING) and t.number != asking
                    and Attr.SKIPPED not in t.user_attrs and same_config(enqueued_params(t), config)):
                return f"same config as {t.state.name.lower()} trial {t.number}"
        return None

    @staticmethod
    def _tell_skipped(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
        """A known crash is told PRUNED + crashed so TPE keeps learning; a repeat FAIL (ignored)."""
        trial.set_user_attr(Attr.SKIPPED, reason)
        crash = "crashed" in reason
        set_constraints(trial, crashed=crash)
        trial.set_user_attr(Attr.OUTCOME, Outcome.CRASHED if crash else Outcome.PRUNED)
        study.tell(trial, state=TrialState.PRUNED if crash else TrialState.FAIL)
