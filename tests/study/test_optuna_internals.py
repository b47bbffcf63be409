"""The two Optuna internals the driver relies on, pinned on the installed Optuna: an upgrade that
moves them fails here rather than in the middle of a resumed study."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.optuna_internals import enqueued_params, running_trial


def test_a_waiting_trial_shows_the_params_it_was_enqueued_with() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"--max-running-requests": 256})
    (waiting,) = study.get_trials(states=(TrialState.WAITING,))
    assert waiting.params == {}  # what Optuna's public view gives before the trial is asked
    assert enqueued_params(waiting) == {"--max-running-requests": 256}


def test_a_running_trial_left_by_another_driver_can_be_told(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    left = optuna.create_study(study_name="s", storage=storage)
    left.ask({"x": optuna.distributions.FloatDistribution(0, 1)})  # the dead driver's trial, still RUNNING
    resumed = optuna.load_study(study_name="s", storage=storage)
    (frozen,) = resumed.get_trials(states=(TrialState.RUNNING,))
    handle = running_trial(resumed, frozen)
    handle.set_user_attr("outcome", "infrastructure")
    resumed.tell(handle, state=TrialState.FAIL)
    (told,) = resumed.get_trials()
    assert (told.state, told.user_attrs) == (TrialState.FAIL, {"outcome": "infrastructure"})


def test_only_a_running_trial_gets_a_handle() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"x": 0.5})
    (waiting,) = study.get_trials()
    with pytest.raises(ValueError, match="trial 0 is WAITING, not RUNNING"):
        running_trial(study, waiting)
