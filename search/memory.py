"""The crash and repeat memory: a filter around the sampler that tells, without running, what the study already knows.

Each `Memory.ask` takes Optuna's next trial (planned or sampled) and, while its config is a known
crash (a categorical choice that crashed alone, or a config past an out-of-memory crash, see
`Memory.past_oom`) or a repeat of a finished, running or waiting trial, tells it at once (user attribute
``skipped``; a known crash PRUNED with ``crashed = 1`` so TPE learns to avoid it, a repeat FAIL,
which samplers ignore) and asks again. After ``max_skips`` in a row (a small space used up, a
converged sampler) the next proposal runs: a repeat measures the noise, and the study goes on.
Planned repairs, the baseline and known configs always run. ``Strategy(memory=False)`` ablates it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from search import yaml_data
from search.layout import LAYOUT_FLAGS
from search.moves import advice
from search.optuna_internals import enqueued_params
from search.ranking import same_config
from search.settings import DEFAULT, Settings
from search.storage import Attr, Constraint, Outcome, Plan, set_constraints

# SGLang's usual advice by failure kind, for crashes whose log names no flag (data, not code).
_ADVICE: dict[str, str] = yaml_data.read("signatures", "advice.yaml")

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


def failure_hints(trial: FrozenTrial, dists: Mapping[str, BaseDistribution]) -> dict[str, tuple[str, Any]]:
    """What a crash's own lines advise changing, else SGLang's usual advice for its kind, else for
    the startup phase it failed in (a hang in graph capture prints nothing, yet graphs are suspect)."""
    failure = trial.user_attrs.get(Attr.FAILURE) or {}  # the deciding line, then SGLang's advice lines
    found = advice("\n".join([str(failure.get("line") or ""), *map(str, failure.get("advice") or [])]), dists)
    usual = next((_ADVICE[k] for k in (failure.get("kind"), failure.get("phase")) if k in _ADVICE), None)
    if not found and usual:
        found = advice(usual, dists)
    return found


def against_advice(config: Mapping[str, Any], crashed: Mapping[str, Any], hints: Mapping[str, tuple[str, Any]],
                   free: Collection[str] = ()) -> bool:
    """Whether ``config`` differs from the ``crashed`` one only by moves against what its failure
    advised: each other parameter at least as far the wrong way (a memory fraction no smaller than
    one that ran out of memory, a graph batch no smaller, graphs still on), or inactive in one of the
    two (a graph batch cap is compared through the flag that turns graphs on or off), or ``free``."""
    for name in config.keys() | crashed.keys():
        ours, theirs = config.get(name), crashed.get(name)
        if ours == theirs or name in free or name in hints and (name not in config or name not in crashed):
            continue
        how, target = hints.get(name, ("any", None))
        side = _side(ours, theirs)
        if side is not None and (how == "down" and side >= 0 or how == "up" and side <= 0):
            continue
        if how == "set" and theirs == target and ours != target:
            continue
        return False
    return True


def _side(a: Any, b: Any) -> int | None:
    """-1, 0 or 1 as number ``a`` is below, at or above number ``b``; None unless both are numbers."""
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in (a, b)):
        return None
    return (a > b) - (a < b)  # type: ignore[no-any-return]


class Memory:
    """Known crashes and repeats of one space (``dists``: its parameters), told instead of run."""

    def __init__(self, dists: Mapping[str, BaseDistribution], settings: Settings = DEFAULT) -> None:
        self.dists = dists
        self.settings = settings
        self._hints: dict[int, dict[str, tuple[str, Any]]] = {}  # a finished trial's failure hints, by number
        # the numbers `past_oom` may leave free: not a choice, not a parallel size
        self._numbers = [n for n, d in dists.items() if n not in LAYOUT_FLAGS and not isinstance(d, CategoricalDistribution)]

    def _hints_of(self, trial: FrozenTrial) -> dict[str, tuple[str, Any]]:
        if trial.number not in self._hints:
            self._hints[trial.number] = failure_hints(trial, self.dists)
        return self._hints[trial.number]

    def ask(self, study: optuna.Study,
            suggest: Callable[[optuna.Trial], dict[str, Any]]) -> tuple[optuna.Trial, dict[str, Any]]:
        """The next trial worth running and its config (``suggest`` samples it from the trial)."""
        for skips in range(self.settings.max_skips + 1):
            trial = study.ask()
            config = suggest(trial)
            if skips == self.settings.max_skips or trial.user_attrs.get(Attr.PLAN) in _ALWAYS:
                break
            reason = self.reason(study.get_trials(deepcopy=False), config, asking=trial.number,
                                 numbers_free=self.settings.sampler_past_oom and Attr.PLAN not in trial.user_attrs)
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

    def past_oom(self, trials: Sequence[FrozenTrial], config: Mapping[str, Any],
                 numbers_free: bool = False) -> FrozenTrial | None:
        """A trial that ran out of memory with less asked of memory than ``config`` asks, if any.

        Out-of-memory is a threshold: a config that moves only against the crash's own advice
        (`against_advice`: a larger memory fraction or graph batch than one that ran out, graphs on
        where graphs off already did) runs out too. Its other flags must be the same, since a
        backend's or cap's own buffers move the threshold. Without this the sweep's second pass
        tried 0.89 right after 0.88 ran out, and repaired it too: four trials on tuning landscapes.
        With ``numbers_free`` the numeric flags the advice does not name (a cap, a channel count)
        may differ too: a guess, used for the model's small moves and the sampler's proposals, not
        for a planned sweep, whose one-flag cap move is what may move the edge; and never for a
        parallel size, which splits the weights over more GPUs.
        """
        for t in finished(trials):
            if t.constraints.get(Constraint.CRASHED, 0) > 0 and failure_kind(t) == "oom":
                hints = self._hints_of(t)
                free = [n for n in self._numbers if n not in hints] if numbers_free else []
                if hints and not same_config(t.params, config) and against_advice(config, t.params, hints, free):
                    return t
        return None

    def reason(self, trials: Sequence[FrozenTrial], config: Mapping[str, Any], asking: int | None = None,
               numbers_free: bool = False) -> str | None:
        """Why ``config`` should not run, by the study's ``trials``: a known crash, or the config of a
        finished, running or waiting trial (parallel asks see each other's configs only through this: GPSampler has no
        constant liar; a retry waits with the config of a lost trial, which a planned move may
        repeat). ``asking`` is the trial being asked, itself running; ``numbers_free`` as in `past_oom`."""
        name = crashed_choice(config, self.known_crashes(trials))
        if name is not None:
            return f"{name}={config[name]!r} crashed when the sweep tried it alone"
        oom = self.past_oom(trials, config, numbers_free)
        if oom is not None:
            return f"crashed: asks more memory than trial {oom.number}, which ran out"
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
