"""GPU slots through Ray: a node offering search_gpu runs trials side by side, each agent on GPUs of its own."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import yaml
from optuna.trial import TrialState

from search.parallel import RayRunner, emulated_cluster
from search.runner import Hooks, Job
from search.space import Space, load_space
from search.storage import Outcome
from search.study import Listener, StudyRun
from tests import helpers


@pytest.fixture(scope="module")
def slot_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One emulated host of 4 GPUs that shares them out (search_gpu: 4)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster, _ = emulated_cluster(tmp_path_factory.mktemp("slot-nodes"), 1, gpus=4)
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


def _space(root: Path, tp: int) -> Space:
    path = helpers.write_space(root, time_scale="0.002", private_state=False)
    data = yaml.safe_load(path.read_text())
    data["launch"]["tp"] = tp
    data["launch"]["env"]["SEARCH_EMULATOR_GPUS"] = "4"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_space(path)


@pytest.mark.timeout(300)
def test_a_slot_node_runs_trials_side_by_side_on_disjoint_gpus(slot_cluster: str, tmp_path: Path) -> None:
    space = _space(tmp_path, tp=2)
    runner = RayRunner(slot_cluster, emulate=True)
    at_once = helpers.AtOnce()

    try:
        assert runner.slots and runner.free() == 4  # counted in 1-GPU trials until a job says its size
        study = StudyRun(space=space, name="rs", storage=f"sqlite:///{tmp_path / 'studies.db'}", seed=0,
                         n_trials=3, remeasure=0, trials_dir=tmp_path / "trials", runner=runner,
                         listener=Listener(placed=at_once.placed, trial_done=at_once.done)).run()
        assert runner.free() == 2
        big = space.model_copy(update={"launch": space.launch.model_copy(update={"tp": 8})})
        runner.start(Job(big, dict(space.baseline or {}), "search-rs-big", tmp_path / "big"), Hooks())
        [(_, too_big)] = runner.wait(0)
    finally:
        runner.close()
        ray.shutdown()
    assert too_big.outcome == Outcome.CRASHED and "the largest host offers 4" in too_big.failure.message
    started = [t for t in study.trials if "artifacts" in t.user_attrs]
    assert len([t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == 3
    assert at_once.most == 2, "two tp-2 trials at once on the 4-GPU node"
    visible = {json.loads((Path(t.user_attrs["artifacts"]) / "profile.json").read_text())["env"]["CUDA_VISIBLE_DEVICES"]
               for t in started}
    assert visible == {"0,1", "2,3"}
