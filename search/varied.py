"""Which parameters varied among a study's trials: only those can have an importance.

An evaluator given a parameter held at one value in every trial still scores it (PED-ANOVA gave
0.70 to a memory fraction fixed in all five trials of a small study, ranking it first), so
importances are asked for the varied parameters only, and the fixed ones are named instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial


def varied_params(trials: Sequence[FrozenTrial]) -> tuple[list[str], list[str]]:
    """(parameters that took two or more values among ``trials``, those that took one), each sorted."""
    values: dict[str, set[str]] = {}
    for trial in trials:
        for name, value in trial.params.items():
            values.setdefault(name, set()).add(repr(value))
    return (sorted(name for name, seen in values.items() if len(seen) > 1),
            sorted(name for name, seen in values.items() if len(seen) == 1))
