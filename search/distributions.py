"""What the search needs of a space: sampling a config, and each parameter's Optuna distribution.

The strategy, the ranking's model and the benchmark's landscapes all see a space only through
:class:`SpaceLike`, so a landscape's own space (or a test's) works wherever `search.space.Space` does.
"""

from __future__ import annotations

from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution


class SpaceLike(Protocol):
    """What the strategy needs of `search.space.Space`."""

    @property
    def baseline(self) -> dict[str, Any] | None: ...

    @property
    def targets(self) -> dict[int, float]: ...

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Any]: ...


def discover(space: SpaceLike, samples: int = 256, seed: int = 0) -> dict[str, BaseDistribution]:
    """Every parameter's distribution, in the order `suggest` asks them.

    Learnt by running `suggest` under a random sampler (conditional parameters appear once their
    condition holds), so the strategy depends only on the `suggest` contract.
    """
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    study.enqueue_trial(dict(space.baseline or {}))
    found: dict[str, BaseDistribution] = {}
    for _ in range(samples):
        trial = study.ask()
        space.suggest(trial)
        for name, dist in trial.distributions.items():
            found.setdefault(name, dist)
        study.tell(trial, 0.0)
    return found
