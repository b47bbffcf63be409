"""What `study show` lists: trials that ran, and only the changes that matter."""

from __future__ import annotations

import optuna

from search.results import changed, ranked


def test_a_planned_trial_still_waiting_is_not_a_result() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    ran = study.ask()
    ran.suggest_int("--cuda-graph-max-bs", 64, 512)
    study.tell(ran, 900.0)
    study.enqueue_trial({"--cuda-graph-max-bs": 128})  # planned, never run before the run ended
    assert [t.number for t in ranked(study)] == [ran.number]


def test_changed_lists_values_and_defaults_but_not_params_gone_inactive() -> None:
    baseline = {"--disable-cuda-graph": False, "--cuda-graph-max-bs": 256, "--max-running-requests": 64}
    config = {"--disable-cuda-graph": True, "--max-running-requests": None}
    assert changed(config, baseline) == "--disable-cuda-graph=True --max-running-requests=default"
