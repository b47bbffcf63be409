"""The Ray runner's own failure paths, driven from this process on a real local cluster: a progress
poll whose call fails does not strand the trial, a level that never gets the driver's verdict
ends its trial as an infrastructure fault instead of holding the host forever, and a trial whose
host Ray counts but cannot give it does not wait behind an idle agent of the same study."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from search.loadtest import LevelResult
from search.parallel import RESOURCE, RayRunner, _new_agent, connect
from search.runner import Hooks
from search.space import Space
from tests.parallel.conftest import LocalCluster, drain, job, marker_processes

STUDY = "ray-runner"


@ray.remote(num_cpus=0)
def _unreachable() -> list:
    raise ConnectionError("the poll's RPC did not get through")


@pytest.fixture
def runner(ray_cluster: LocalCluster) -> Iterator[RayRunner]:
    runner = RayRunner(ray_cluster.address, emulate=True)
    try:
        yield runner
    finally:
        runner.close()


@pytest.mark.timeout(120)
def test_a_failed_poll_is_polled_again_and_the_trial_finishes(runner: RayRunner, space: Space, tmp_path: Path) -> None:
    seen: list[LevelResult] = []

    def keep(level: LevelResult) -> bool:
        seen.append(level)
        return True

    runner.start(job(space, tmp_path, STUDY, "0"), Hooks(level=keep))
    (remote,) = runner._running.values()
    remote.poll = _unreachable.remote()  # the first poll fails while the agent is alive and working
    ((_, result),) = drain(runner, 1)
    assert result.outcome == "completed", result.failure
    assert len(seen) == len(result.levels) == len(space.load_test.concurrency)  # every level got its verdict
    assert not marker_processes(STUDY)


@pytest.mark.timeout(120)
def test_a_level_without_a_verdict_ends_the_trial_as_an_infrastructure_fault(
        ray_cluster: LocalCluster, space: Space, tmp_path: Path) -> None:
    connect(ray_cluster.address)
    agent = _new_agent({RESOURCE: 1})
    try:  # nobody polls or decides: the first level waits its bound (1 s) for a verdict
        result, files, unpolled = ray.get(agent.run.remote(job(space, tmp_path, STUDY, "1"), True, 1.0))
    finally:
        ray.kill(agent)
        ray.shutdown()
    assert result.outcome == "infrastructure" and result.failure.kind == "no_verdict", result.failure
    assert result.failure.infrastructure and "no verdict from the driver" in result.failure.message
    assert len(result.levels) == 1  # it stopped at the first level
    assert [kind for kind, _ in unpolled if kind == "level"] == ["level"]  # what no poll took comes back
    assert unpolled[0][0] == "placed"
    assert b'"no_verdict"' in files["result.json"]
    assert not marker_processes(STUDY), "the server outlived its trial"


@ray.remote(num_cpus=0, resources={RESOURCE: 1})
class _OtherStudy:
    """An agent of someone else's study: it holds a host that Ray still counts."""

    def ready(self) -> bool:
        return True


@pytest.mark.timeout(180)
def test_a_trial_waiting_for_a_host_gets_the_one_an_idle_agent_held(runner: RayRunner, space: Space,
                                                                     tmp_path: Path) -> None:
    hosts: dict[str, str] = {}
    runner.start(job(space, tmp_path, STUDY, "2"), Hooks(placed=functools.partial(hosts.__setitem__, "2")))
    while "2" not in hosts:
        assert not runner.wait(0.5)
    other = _OtherStudy.remote()  # takes the other host, as a dead one does until Ray notices
    try:
        ray.get(other.ready.remote())
        assert runner.free() == 1  # the cluster still counts two hosts
        runner.start(job(space, tmp_path, STUDY, "3"), Hooks(placed=functools.partial(hosts.__setitem__, "3")))
        results = [result for _, result in drain(runner, 2)]
    finally:
        ray.kill(other)
    assert [r.outcome for r in results] == ["completed", "completed"], [r.failure for r in results]
    assert hosts["3"] == hosts["2"]  # the first trial's agent let its host go once idle
