"""The search benchmark's peers (scripts/bench_peers.py): crashes told as Optuna learns from them, HEBO as a sampler."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from .test_generator import SPACE, bench


def test_a_peer_tells_a_crash_as_an_infeasible_zero_that_gpsampler_learns_from() -> None:
    problem = bench.load_problem(SPACE)
    peer = bench.make_strategy("gp", problem.space, seed=0)
    study = optuna.create_study(direction="maximize", sampler=peer.sampler)
    trial, _ = peer.ask(study)
    peer.tell(study, trial, "crashed", failure={"kind": "oom"})
    [told] = study.get_trials()
    assert told.state == TrialState.COMPLETE and told.value == 0.0 and told.constraints["crashed"] == 1.0


def test_hebo_proposes_configs_of_the_space_and_learns_from_what_it_is_told() -> None:
    problem = bench.load_problem(SPACE)
    peer = bench.make_strategy("hebo", problem.space, seed=0)
    study = optuna.create_study(direction="maximize", sampler=peer.sampler)
    grid = bench.fine_grid(problem.space)
    for value in (100.0, 200.0, 300.0, 400.0, 500.0, 600.0):
        trial, config = peer.ask(study)
        for name, chosen in config.items():
            values = grid[name]
            assert chosen in values or min(values) <= chosen <= max(values)  # on a step, or inside a log range
        peer.tell(study, trial, "completed", objective=value)
    peer.ask(study)
    assert len(peer.sampler._hebo.y) == 6  # every finished trial reached HEBO, as minus its throughput
    assert sorted(-peer.sampler._hebo.y.ravel()) == [100.0, 200.0, 300.0, 400.0, 500.0, 600.0]
