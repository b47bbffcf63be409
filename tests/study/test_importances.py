"""Importances go to the parameters that varied: one held at a single value in every completed trial
gets none (PED-ANOVA scored such a memory fraction first), and the shown line says the rule."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution

from search.results import importances

CAP = CategoricalDistribution([64, 128, 256])
MEM = FloatDistribution(0.8, 0.94, step=0.02)


def _study(rows: list[tuple[int, float, float]]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for cap, mem, value in rows:
        study.add_trial(optuna.trial.create_trial(params={"--max-running-requests": cap, "--mem-fraction-static": mem},
                                                  distributions={"--max-running-requests": CAP,
                                                                 "--mem-fraction-static": MEM}, value=value))
    return study


def test_a_parameter_that_never_varied_gets_no_importance() -> None:
    study = _study([(64, 0.88, 900), (128, 0.88, 1000), (256, 0.88, 1100), (64, 0.88, 880), (128, 0.88, 1010)])
    found, rule = importances(study)
    assert found == {"--max-running-requests": 1.0}
    assert rule == "PED-ANOVA over 5 completed trials; never varied, so none: --mem-fraction-static"


def test_no_importances_when_nothing_varied() -> None:
    found, why = importances(_study([(64, 0.88, 900), (64, 0.88, 910), (64, 0.88, 905)]))
    assert found == {} and why == "importances unavailable: no parameter varied among completed trials"
