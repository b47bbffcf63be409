"""The benchmark's peers: plain Optuna samplers and HEBO, each told crashes as it learns best.

`Peer` runs a sampler unguided (no warm start, sweep or pruning of our own) and tells a crash as
a COMPLETE trial at 0 tok/s with the ``crashed`` constraint violated: Optuna's constrained
samplers (GPSampler, TPE with constraints) fit their feasibility models on COMPLETE trials only,
and a PRUNED trial, as the product tells a crash, would be invisible to them.

`HeboSampler` puts HEBO (Huawei's heteroscedastic evolutionary BO, what the SCOOT paper tunes
LLM serving with; `pip install --no-deps HEBO` and its dependencies, see scripts/setup.sh
--bench) behind Optuna's sampler interface. Written here because HEBO ships no Optuna sampler
and optunahub's is fetched from the network at run time, which this project may not do.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from search.distributions import SpaceLike, discover
from search.storage import set_constraints
from search.strategy import Strategy


class Peer(Strategy):
    """A plain sampler (``guided=False``) whose crashes count as infeasible zeros."""

    def __init__(self, space: SpaceLike, sampler: optuna.samplers.BaseSampler) -> None:
        super().__init__(space, sampler, guided=False)

    def tell(self, study: optuna.Study, trial: optuna.Trial, outcome: str, **kw: Any) -> None:
        if outcome != "crashed":
            super().tell(study, trial, outcome, **kw)
            return
        trial.set_user_attr("outcome", outcome)
        set_constraints(trial, crashed=True)
        study.tell(trial, 0.0)


def _hebo_param(name: str, dist: BaseDistribution) -> dict[str, Any]:
    if isinstance(dist, CategoricalDistribution):
        return {"name": name, "type": "cat", "categories": [repr(c) for c in dist.choices]}
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    if dist.log:
        return {"name": name, "type": "pow_int" if isinstance(dist, IntDistribution) else "pow",
                "lb": dist.low, "ub": dist.high}
    return {"name": name, "type": "int" if isinstance(dist, IntDistribution) else "num", "lb": dist.low, "ub": dist.high}


class HeboSampler(optuna.samplers.BaseSampler):
    """HEBO proposes every parameter at once; Optuna keeps the ones the config uses.

    HEBO minimizes, so it is told minus the throughput: the objective of a completed feasible
    trial, the last level reached by a pruned one, 0 for a crash or a broken constraint.
    Parameters a trial left out (a conditional one whose parent turned it off) are told at
    the space baseline's value, where HEBO needs a number.
    """

    def __init__(self, space: SpaceLike, seed: int, n_startup_trials: int = 5) -> None:
        from hebo.design_space.design_space import DesignSpace
        from hebo.optimizers.hebo import HEBO

        self._dists = discover(space)
        self._fill = {n: space.baseline.get(n, self._first(d)) for n, d in self._dists.items()}
        np.random.seed(seed)
        import torch

        torch.manual_seed(seed)
        design = DesignSpace().parse([_hebo_param(n, d) for n, d in self._dists.items()])
        self._hebo = HEBO(design, rand_sample=n_startup_trials)
        self._told: set[int] = set()
        self._fallback = optuna.samplers.RandomSampler(seed=seed)

    @staticmethod
    def _first(dist: BaseDistribution) -> Any:
        return dist.choices[0] if isinstance(dist, CategoricalDistribution) else dist.low  # type: ignore[attr-defined]

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def _to_hebo(self, name: str, value: Any) -> Any:
        return repr(value) if isinstance(self._dists[name], CategoricalDistribution) else value

    def _from_hebo(self, name: str, value: Any) -> Any:
        dist = self._dists[name]
        if isinstance(dist, CategoricalDistribution):
            return next(c for c in dist.choices if repr(c) == value)
        assert isinstance(dist, (IntDistribution, FloatDistribution))
        x = min(max(float(value), dist.low), dist.high)
        if dist.step and not dist.log:
            x = dist.low + round((x - dist.low) / dist.step) * dist.step
        return int(round(x)) if isinstance(dist, IntDistribution) else float(round(x, 6))

    def _observe(self, study: optuna.Study) -> None:
        import pandas as pd

        rows, ys = [], []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            if t.number in self._told:
                continue
            self._told.add(t.number)
            broken = any(v > 0 for v in (t.constraints or {}).values())
            if t.state == TrialState.COMPLETE:
                value = 0.0 if broken else float(t.value or 0.0)
            else:
                value = 0.0 if broken or not t.intermediate_values else float(list(t.intermediate_values.values())[-1])
            rows.append({n: self._to_hebo(n, t.params.get(n, self._fill[n])) for n in self._dists})
            ys.append([-value])
        if rows:
            self._hebo.observe(pd.DataFrame(rows), np.asarray(ys, dtype=float))

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
        # HEBO prints its GP's fitting retries ("jitter = 0.001") to stdout, the benchmark's JSON.
        with contextlib.redirect_stdout(sys.stderr):
            self._observe(study)
            proposal = self._hebo.suggest(n_suggestions=1).iloc[0]
        return {n: self._from_hebo(n, proposal[n]) for n in search_space if n in proposal}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


PEERS = ("tpe", "gp", "hebo", "random")


def make_peer(kind: str, space: SpaceLike, seed: int) -> Peer:
    """A peer by name: plain TPE, GPSampler (constraints from the trials), HEBO, random."""
    if kind == "tpe":
        return Peer(space, optuna.samplers.TPESampler(seed=seed))
    if kind == "gp":
        return Peer(space, optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False))
    if kind == "hebo":
        return Peer(space, HeboSampler(space, seed))
    if kind == "random":
        return Peer(space, optuna.samplers.RandomSampler(seed=seed))
    raise SystemExit(f"error: unknown peer {kind!r}: one of {', '.join(PEERS)}")

