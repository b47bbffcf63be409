"""A whole study on a two-host Ray cluster: trials overlap, pruning reaches remote trials, a worker
killed mid-trial makes that trial an infrastructure fault that is re-enqueued, and the study ends."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from search.cli import app
from tests.helpers import ctrl_c_reaches
from tests.parallel.conftest import SLOW_BELOW, LocalCluster, driver, marker_processes, parent, study_command

N_TRIALS = 8


def _watch(proc: subprocess.Popen, name: str, timeout: float = 200.0) -> tuple[str, int]:
    """Until the driver exits: SIGKILL the Ray worker running the first non-baseline trial whose server
    is up, and count the most trial servers alive at one moment (the killed one aside).

    Returns (the killed trial's marker, that count). Two markers alive at once are two servers
    running side by side, which only happens when Ray runs trials concurrently.
    """
    deadline = time.monotonic() + timeout
    killed, most = "", 0
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the study did not finish"
        servers = marker_processes(name)
        most = max(most, len(set(servers.values()) - {killed}))
        for pid, marker in servers.items():
            number = int(marker.removeprefix(f"search-{name}-").split("-")[0])
            try:
                worker = parent(pid)
            except OSError:  # it just ended
                continue
            if not killed and number >= 1 and worker not in servers:  # the server itself, not one of its ranks
                assert b"ray::" in Path(f"/proc/{worker}/cmdline").read_bytes()  # a Ray worker, not the driver
                os.kill(worker, signal.SIGKILL)
                killed = marker
        time.sleep(0.05)
    assert killed, "no trial server appeared to kill its worker"
    return killed, most


@pytest.mark.timeout(240)
def test_study_on_two_hosts_survives_a_killed_worker(ray_cluster: LocalCluster, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    with driver(tmp_path, "ray-kill", ["--ray", ray_cluster.address], N_TRIALS) as (proc, log):
        killed_marker, side_by_side = _watch(proc, "ray-kill")
        assert proc.wait() == 0, log.read_text()
    text = log.read_text()
    study = optuna.load_study(study_name="ray-kill", storage=storage)
    trials = study.trials

    # The killed trial: an infrastructure fault naming the lost worker, re-enqueued with its params.
    lost = next(t for t in trials if t.user_attrs.get("marker") == killed_marker)
    assert lost.state == TrialState.FAIL and lost.user_attrs["outcome"] == "infrastructure"
    assert lost.user_attrs["failure"]["kind"] == "worker_lost"
    retry = next(t for t in trials if t.user_attrs.get("retry_of") == lost.number)
    assert retry.params == lost.params and retry.state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert not marker_processes("ray-kill"), "a lost trial's server was left running"

    # The study finished its budget on both hosts, with trials running at the same time.
    measured = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                and "skipped" not in t.user_attrs]
    assert len(measured) >= N_TRIALS
    ran = [t for t in measured if t.user_attrs.get("host") in ray_cluster.hosts]
    assert {t.user_attrs["host"] for t in ran} == set(ray_cluster.hosts)
    overlapping = [(a.number, b.number) for a in ran for b in ran if a.number < b.number
                   and a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete]
    assert overlapping, "no two trials ran at the same time"
    assert side_by_side >= 2, "no two trial servers were ever alive at the same moment"

    # Pruning reached a running remote trial: a slow config stopped after its first level.
    # (A full-speed config may also be pruned later, relative to the best, when the box is loaded.)
    slow = [t for t in measured if t.user_attrs.get("outcome") == "pruned"
            and (t.params.get("--chunked-prefill-size") or 8192) < SLOW_BELOW]
    assert slow and all(len(t.user_attrs["levels"]) == 1 for t in slow), text
    assert all("below the target" in t.user_attrs["pruned_because"] for t in slow)

    # Artifacts came back to the driver; the top configs were re-measured on the cluster.
    best = study.best_trial
    assert (tmp_path / "trials" / "ray-kill" / str(best.number) / "result.json").is_file()
    assert study.user_attrs.get("remeasured"), text
    assert f"on {best.user_attrs['host']}" in text  # the progress names the host of each trial
    shown = CliRunner().invoke(app, ["study", "show", "ray-kill", "--storage", storage]).output
    assert all(host in shown for host in ray_cluster.hosts), shown  # `study show` says which host ran each


@pytest.mark.timeout(180)
def test_ctrl_c_tears_down_every_host_and_the_same_command_resumes(ray_cluster: LocalCluster, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    command = study_command(tmp_path, "ray-ctrl-c", ["--ray", ray_cluster.address], 3, remeasure=0, seed=1)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
                              preexec_fn=ctrl_c_reaches)
    try:
        deadline = time.monotonic() + 120
        while len(set(marker_processes("ray-ctrl-c").values())) < 2:
            assert time.monotonic() < deadline and driver.poll() is None, "two trials never ran at once"
            time.sleep(0.05)
        driver.send_signal(signal.SIGINT)
        out = driver.communicate(timeout=60)[0].decode()
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130, out
    assert not marker_processes("ray-ctrl-c"), "a server outlived Ctrl-C"
    study = optuna.load_study(study_name="ray-ctrl-c", storage=storage)
    interrupted = [t for t in study.trials if (t.user_attrs.get("failure") or {}).get("kind") == "interrupted"]
    assert interrupted and all(t.state == TrialState.FAIL for t in interrupted)
    assert not study.get_trials(states=(TrialState.RUNNING,))

    again = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=150)
    assert again.returncode == 0, again.stdout + again.stderr
    study = optuna.load_study(study_name="ray-ctrl-c", storage=storage)
    retried = {t.user_attrs.get("retry_of") for t in study.trials} & {t.number for t in interrupted}
    assert retried == {t.number for t in interrupted}
    assert sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials) >= 3
