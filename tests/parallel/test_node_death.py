"""A GPU host that dies (its whole Ray node, not one worker). Mid-trial: that trial is an
infrastructure fault re-run on the host that remains, no other trial is sent to the dead one, and
the study finishes (the driver started with a bare ``--ray``, which means ``auto``). While idle:
its agent gets no trial."""

from __future__ import annotations

import functools
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import ray
from optuna.trial import TrialState

from search.parallel import RayRunner
from search.runner import Hooks
from search.space import Space
from tests.parallel.conftest import LocalCluster, drain, driver, host_of, job, marker_processes

N_TRIALS = 4
STUDY = "ray-node"


def _power_off_mid_trial(cluster: LocalCluster, proc: subprocess.Popen, timeout: float = 120.0) -> tuple[str, str]:
    """Power off the host running a non-baseline trial once its server is up: (its marker, the host)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for pid, marker in marker_processes(STUDY).items():
            host = host_of(pid)
            if int(marker.removeprefix(f"search-{STUDY}-").split("-")[0]) >= 1 and host is not None:
                cluster.power_off(host, STUDY)
                return marker, host
        time.sleep(0.05)
    raise AssertionError("no trial server appeared to take its host away")


@pytest.mark.timeout(300)
def test_a_host_that_dies_costs_only_its_trial(fresh_cluster: LocalCluster, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    with driver(tmp_path, STUDY, ["--ray"], N_TRIALS, env={"RAY_ADDRESS": fresh_cluster.address}) as (proc, log):
        lost_marker, dead = _power_off_mid_trial(fresh_cluster, proc)
        assert proc.wait(timeout=240) == 0, log.read_text()
    text = log.read_text()
    # Trials that ran: a sampler's repeat of a running config is told FAIL without running ("skipped").
    trials = [t for t in optuna.load_study(study_name=STUDY, storage=storage).trials if "skipped" not in t.user_attrs]
    alive = next(h for h in fresh_cluster.hosts if h != dead)

    # The trial on the dead host: an infrastructure fault, and the only trial that failed (none was
    # handed to the dead host's agent, or to a new agent waiting for that host).
    lost = next(t for t in trials if t.user_attrs.get("marker") == lost_marker)
    assert lost.state == TrialState.FAIL and lost.user_attrs["outcome"] == "infrastructure", text
    assert lost.user_attrs["failure"]["kind"] == "worker_lost" and lost.user_attrs["host"] == dead
    assert [t.number for t in trials if t.state == TrialState.FAIL] == [lost.number], text

    # Its config ran again, on the host that remains, and the study finished its budget there.
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == lost.number)
    assert retry.params == lost.params and retry.state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert retry.user_attrs["host"] == alive
    measured = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(measured) >= N_TRIALS
    assert all(t.user_attrs["host"] == alive for t in trials if t.number > lost.number)
    assert not marker_processes(STUDY), "a server was left running"


def _dead(node: str) -> bool:
    return not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == node)


@pytest.mark.timeout(240)
def test_a_host_that_died_idle_is_given_no_trial(fresh_cluster: LocalCluster, space: Space, tmp_path: Path) -> None:
    runner = RayRunner(fresh_cluster.address, emulate=True)
    hosts: dict[str, str] = {}
    try:
        for name in ("0", "1"):
            runner.start(job(space, tmp_path, STUDY, name), Hooks(placed=functools.partial(hosts.__setitem__, name)))
        finished = drain(runner, 2)
        # Both agents wait for the next trial; the host of the one that finished last (the agent
        # reused first) dies while idle.
        gone = hosts[finished[-1][0].marker.rsplit("-", 1)[1]]
        node = fresh_cluster.power_off(gone, STUDY)
        while not _dead(node):  # once Ray knows, the dead host's agent must not get the trial
            time.sleep(0.2)
        runner.start(job(space, tmp_path, STUDY, "2"), Hooks(placed=functools.partial(hosts.__setitem__, "2")))
        ((_, result),) = drain(runner, 1)
    finally:
        runner.close()
    assert result.outcome == "completed", result.failure
    assert hosts["2"] != gone
