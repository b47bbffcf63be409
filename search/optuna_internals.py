"""The two things the driver needs that Optuna's public API does not give; nothing else reaches inside Optuna.

Both are pinned by ``tests/study/test_optuna_internals.py`` on the installed Optuna, so an
upgrade that moves them fails there, not in the middle of a night's study.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

_FIXED_PARAMS = "fixed_params"  # where `Study.enqueue_trial` keeps a waiting trial's parameters


def enqueued_params(trial: FrozenTrial) -> dict[str, Any]:
    """The parameters a trial runs with: its own once asked, else those it was enqueued with.

    A WAITING trial has no ``params`` yet; the strategy compares proposals with waiting ones so
    that it does not queue the same config twice.
    """
    return dict(trial.params or trial.system_attrs.get(_FIXED_PARAMS, {}))


def running_trial(study: optuna.Study, trial: FrozenTrial) -> optuna.Trial:
    """A handle on a RUNNING trial that a dead driver left, so it can be told (and its attributes set).

    Optuna hands out `optuna.Trial` only from `Study.ask`; a resumed driver must finish the trials
    its predecessor asked, and only the storage's trial id reaches them.
    """
    if trial.state != TrialState.RUNNING:
        raise ValueError(f"trial {trial.number} is {trial.state.name}, not RUNNING: only a running trial can be told")
    return optuna.Trial(study, trial._trial_id)
