"""`--sampler` and `--seed` reach the study: the sampler's proposals are the strategy's seeded sampler's.

A study run twice with the same seed proposes the same configs in the same order; another seed
proposes others. Before the fix `StudyRun` opened the study with Optuna's default (unseeded TPE),
so neither option changed anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest

from search.space import load_space
from search.study import StudyRun
from tests.helpers import write_space
from tests.study.simulated import simulated_runner

PARAMS = {
    "--max-running-requests": {"type": "int", "low": 8, "high": 1024, "log": True},
    "--mem-fraction-static": {"type": "float", "low": 0.80, "high": 0.97},
}
BASELINE = {"--max-running-requests": 64, "--mem-fraction-static": 0.85}


def throughput(config: Mapping[str, Any], concurrency: int) -> float:
    """Peaks at a cap of 256 and a fraction of 0.9, so the sweep moves and the sampler has work."""
    cap = config["--max-running-requests"]
    return 1000.0 * math.exp(-(math.log(cap / 256)) ** 2 / 4) * (1.0 - abs(config["--mem-fraction-static"] - 0.9))


def proposals(root: Path, sampler: str, seed: int) -> list[dict[str, Any]]:
    """The configs the sampler proposed (the plan's own trials are the same whatever the seed)."""
    root.mkdir()
    space = load_space(write_space(root, params=PARAMS, baseline=BASELINE, targets={}))
    run = StudyRun(space=space, name="seeded", runner=simulated_runner(throughput), storage=f"sqlite:///{root}/db.sqlite",
                   sampler=sampler, seed=seed, n_trials=14, remeasure=0, trials_dir=root / "trials")
    study = run.run()
    return [t.params for t in study.get_trials(deepcopy=False) if t.user_attrs.get("strategy") == "sampler"]


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_the_same_seed_proposes_the_same_configs_and_another_seed_others(tmp_path: Path, sampler: str) -> None:
    first = proposals(tmp_path / "a", sampler, seed=1)
    assert len(first) >= 3  # the plan left the sampler several trials
    assert proposals(tmp_path / "b", sampler, seed=1) == first
    assert proposals(tmp_path / "c", sampler, seed=2) != first


def test_the_named_sampler_opens_the_study(tmp_path: Path) -> None:
    space = load_space(write_space(tmp_path, params=PARAMS, baseline=BASELINE, targets={}))
    run = StudyRun(space=space, name="random", runner=simulated_runner(throughput), storage=f"sqlite:///{tmp_path}/db",
                   sampler="random", seed=0, n_trials=1, remeasure=0, trials_dir=tmp_path / "trials")
    assert isinstance(run.run().sampler, optuna.samplers.RandomSampler)
