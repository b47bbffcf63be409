"""Whole studies through the real sshd on loopback against the emulator: telemetry, artifacts, faults.

The space is the study tests' one (tests.helpers.write_space) with its emulator settings moved into
the host's ``env``, where a remote machine keeps them: the server, the GPU checks and the
``nvidia-smi`` stand-in all read the per-test state directory from there. The host runs the
server on GPU 1 of 2 (``gpus: [1]``) so that telemetry has an idle GPU 0 to leave out.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState

from search import trial as trial_module
from search.emulator import gpu_state
from search.hosts.config import HostConfig
from search.hosts.ssh import SSHHost
from search.loadtest import LevelResult
from search.logwatch import Event
from search.space import load_space
from search.study import Listener, StudyRun
from tests.helpers import AtOnce, free_port, marker_pids, write_space

if TYPE_CHECKING:
    from conftest import Sshd

STORAGE = "sqlite:///studies.db"
READY = "The server is fired up and ready to roll!"
IDLE_W = 75.0  # the emulator's idle GPU power (search.emulator.gpu_state.IDLE_POWER_W)
# The baseline caps running requests at 1; this launch command lifts the cap (a clear win).
UNCAPPED = "python -m sglang.launch_server --model-path test/model --moe-runner-backend flashinfer_cutlass"


def _space(root: Path) -> tuple[Path, dict[str, str]]:
    """The study space without launch env, and that env for the host (plus a second GPU)."""
    path = write_space(root)
    data = yaml.safe_load(path.read_text())
    env = {name: str(value) for name, value in data["launch"].pop("env").items()}
    env["SEARCH_EMULATOR_GPUS"] = "2"
    data["load_test"]["duration_s"] = 2.5  # a few one-second GPU samples per level
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, env


def _emulated(sshd: Sshd, env: dict[str, str], name: str = "loop", **fields: object) -> HostConfig:
    return sshd.host(name=name, emulate=True, env=env, gpus=[1],
                     nvidia_smi=f"{sys.executable} -m search.emulator.nvidia_smi", **fields)


def _hosts_file(path: Path, *hosts: HostConfig) -> Path:
    path.write_text(yaml.safe_dump({"hosts": [h.model_dump(mode="json") for h in hosts]}, sort_keys=False))
    return path


def _search(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-c", "from search.cli import main; main()", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _study(root: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root / 'studies.db'}")


def test_a_whole_study_runs_over_ssh_with_gpu_telemetry_and_artifacts(sshd: Sshd, tmp_path: Path) -> None:
    space, env = _space(tmp_path)
    server_port = free_port()  # the hosts file's port wins over the space's, which something else holds
    hosts = _hosts_file(tmp_path / "hosts.yaml", _emulated(sshd, env, server_port=server_port))
    with socket.create_server(("127.0.0.1", yaml.safe_load(space.read_text())["launch"]["port"])):
        _search(tmp_path, "study", "run", str(space), "--study", "ssh", "--hosts", str(hosts), "--n-trials", "2",
                "--remeasure", "0", "--seed", "0", "--start-from", UNCAPPED)

    study = _study(tmp_path, "ssh")
    base, win = study.trials
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert win.params["--max-running-requests"] is None and win.user_attrs["strategy"] == "known"
    assert win.value > 1.5 * base.value
    for t in study.trials:
        assert t.user_attrs["host"] == "loop"
        gpu = t.user_attrs["gpu"]  # one record per ladder level, from the server's GPU only
        assert [g["concurrency"] for g in gpu] == [4, 16]
        assert all(g["power_limit_w"] == 600.0 and g["power_w"] > IDLE_W for g in gpu), gpu
        artifacts = tmp_path / t.user_attrs["artifacts"]  # relative to the run's cwd, or absolute
        remote = Path(sshd.dir / "work" / t.user_attrs["marker"])
        assert READY in (artifacts / "server.log").read_text()
        assert (artifacts / "server.log").read_bytes() == (remote / "server.log").read_bytes()  # mirrored whole
        assert (artifacts / "exit-status").read_text() == (remote / "exit-status").read_text()  # copied back
        assert json.loads((artifacts / "result.json").read_text())["gpu"] == gpu
        assert [lv["max_concurrency"] for lv in json.loads((artifacts / "loadtest.json").read_text())["levels"]] == [4, 16]
        profile = json.loads((artifacts / "profile.json").read_text())  # as the host ran it
        assert profile["port"] == server_port and profile["args"][profile["args"].index("--port") + 1] == str(server_port)
    # The emulated GPU reads 100 * running / (running + 8) %: at most 67% with 16 requests, so averaged with
    # the idle GPU 0 the record could never pass 33.5%; above that, only GPU 1 was counted. (Power is
    # no such proof: it follows the token rate the loaded box reached, 136 W in one CI run.)
    top = win.user_attrs["gpu"][1]
    assert top["utilization_pct"] > 100 * 16 / (16 + 8) / 2 and top["power_w"] > IDLE_W, top

    table = _search(tmp_path, "study", "show", "ssh").stdout
    assert f"{top['power_w']:.0f}/600 W" in table
    rows = json.loads(_search(tmp_path, "study", "show", "ssh", "--format", "json").stdout)["trials"]
    assert {r["host"] for r in rows} == {"loop"} and all(r["gpu_power"] for r in rows)


def _state_lost(sshd: Sshd, marker: str) -> None:
    """What a host reboot does under a running trial: connections cut, the server's processes gone."""
    assert sshd.cut_sessions() >= 1
    for group in {os.getpgid(pid) for pid in marker_pids(marker)}:  # the wrapper too: no exit status is written
        os.killpg(group, signal.SIGKILL)
    for pid in marker_pids(marker):
        os.kill(pid, signal.SIGKILL)


def test_a_connection_cut_that_loses_the_trial_is_retried_as_an_infrastructure_fault(
        sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    space_path, env = _space(tmp_path)
    host = SSHHost(_emulated(sshd, env))
    cut: list[str] = []

    def event(number: int, seen: Event) -> None:
        if seen.kind == "phase" and seen.name == "loading" and not cut:
            cut.append(study_run.study.trials[number].user_attrs["marker"])
            _state_lost(sshd, cut[0])

    study_run = StudyRun(space=load_space(space_path), name="cut", host=host, storage=STORAGE, seed=0, n_trials=1,
                         remeasure=0, listener=Listener(event=event))
    try:
        study = study_run.run()
    finally:
        host.close()

    lost, again = study.trials
    assert lost.state == TrialState.FAIL and lost.user_attrs["outcome"] == "infrastructure"
    assert "trial state lost" in lost.user_attrs["failure"]["message"]
    assert lost.user_attrs["marker"] == cut[0] and not lost.constraints  # never blamed on the config
    assert again.state == TrialState.COMPLETE and again.user_attrs["retry_of"] == lost.number
    assert again.params == lost.params and again.user_attrs["host"] == "loop"
    assert marker_pids(cut[0]) == [] and marker_pids(again.user_attrs["marker"]) == []


def test_a_host_that_stays_down_is_skipped_and_the_study_goes_on(sshd: Sshd, tmp_path: Path) -> None:
    from tests.ssh.conftest import start_sshd

    stopped = start_sshd(tmp_path / "down-sshd")
    stopped.stop()  # its port now refuses connections
    space, env = _space(tmp_path)
    hosts = _hosts_file(tmp_path / "hosts.yaml", _emulated(stopped, env, name="down"), _emulated(sshd, env, name="up"))
    _search(tmp_path, "study", "run", str(space), "--study", "two", "--hosts", str(hosts), "--n-trials", "1",
            "--remeasure", "0", "--seed", "0")

    down, up = _study(tmp_path, "two").trials
    assert down.user_attrs["host"] == "down" and down.state == TrialState.FAIL
    assert down.user_attrs["outcome"] == "infrastructure"
    assert "unreachable after 3 attempts" in down.user_attrs["failure"]["message"]
    assert up.user_attrs["host"] == "up" and up.state == TrialState.COMPLETE
    assert up.user_attrs["retry_of"] == down.number and up.params == down.params


def test_sessions_refused_during_the_load_test_fault_the_trial_which_is_retried(
        live_sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection drops mid-ladder and every command fails even after reconnecting (logins work,
    sessions are refused): the health check, the teardown and the copy-back all meet it."""
    monkeypatch.chdir(tmp_path)
    space_path, env = _space(tmp_path)
    host = SSHHost(_emulated(live_sshd, env, reconnect_attempts=5))
    failing: list[int] = []

    def level(number: int, result: LevelResult) -> None:
        if not failing:  # after the first level
            failing.append(number)
            live_sshd.restart("MaxSessions 0")

    def trial_done(frozen: FrozenTrial) -> None:
        if failing and frozen.number == failing[0]:
            live_sshd.restart()  # the host is back for the retry

    study_run = StudyRun(space=load_space(space_path), name="refused", host=host, storage=STORAGE, seed=0,
                         n_trials=1, remeasure=0, listener=Listener(level=level, trial_done=trial_done))
    try:
        study = study_run.run()
    finally:
        host.close()

    lost, again = study.trials
    assert lost.number == failing[0] and lost.state == TrialState.FAIL and not lost.constraints
    assert "ChannelException over SSH (also after reconnecting)" in lost.user_attrs["failure"]["message"]
    result = json.loads((Path(lost.user_attrs["artifacts"]) / "result.json").read_text())  # still written
    assert "ChannelException over SSH" in result["teardown"]  # the stop could not finish either
    assert again.state == TrialState.COMPLETE and again.user_attrs["retry_of"] == lost.number
    assert again.params == lost.params
    # What the broken stop left running was swept by the retry's ensure_clean on the same host.
    assert marker_pids(lost.user_attrs["marker"]) == [] and marker_pids(again.user_attrs["marker"]) == []


def test_a_row_of_dead_hosts_does_not_stop_a_study_a_live_host_can_carry(sshd: Sshd, tmp_path: Path) -> None:
    space, env = _space(tmp_path)
    dead = [_emulated(sshd, env, name=f"dead{i}", port=free_port()) for i in range(3)]  # nothing listens there
    hosts = _hosts_file(tmp_path / "hosts.yaml", *dead, _emulated(sshd, env, name="up"))
    _search(tmp_path, "study", "run", str(space), "--study", "dead", "--hosts", str(hosts), "--n-trials", "1",
            "--remeasure", "0", "--seed", "0")

    trials = _study(tmp_path, "dead").trials
    assert [t.user_attrs["host"] for t in trials] == ["dead0", "dead1", "dead2", "up"]
    for t in trials[:3]:
        assert t.state == TrialState.FAIL and "unreachable after 3 attempts" in t.user_attrs["failure"]["message"]
    assert trials[3].state == TrialState.COMPLETE and trials[3].params == trials[0].params
    assert [t.user_attrs.get("retry_of") for t in trials] == [None, 0, 1, 2]


def test_a_gpu_held_on_the_host_is_waited_for_then_the_trial_is_retried(
        sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trial_module, "CLEAN_TIMEOUT_S", 2.0)
    space_path, env = _space(tmp_path)
    state = Path(env["SEARCH_EMULATOR_STATE_DIR"])
    # Someone else's process on the host's GPU 1, as an emulated rank holds it: the lock and 40 GB.
    holder = [gpu_state.try_lock(state, 1)]
    assert holder[0] is not None
    gpu_state.write(state, gpu_state.GpuState(index=1, pid=os.getpid(), memory_used_mib=40000))
    host = SSHHost(_emulated(sshd, env))

    def trial_done(frozen: FrozenTrial) -> None:  # the owner lets go after the first fault
        if holder:
            os.close(holder.pop())

    study_run = StudyRun(space=load_space(space_path), name="held", host=host, storage=STORAGE, seed=0,
                         n_trials=1, remeasure=0, listener=Listener(trial_done=trial_done))
    try:
        study = study_run.run()
    finally:
        host.close()
        if holder:
            os.close(holder.pop())

    held, again = study.trials
    assert held.state == TrialState.FAIL and held.user_attrs["outcome"] == "infrastructure" and not held.constraints
    assert "host loop is not clean after 2 s: GPU 1: 40000 MiB used" in held.user_attrs["failure"]["message"]
    assert held.user_attrs["phases"] == {}  # no server was started on a held GPU
    assert again.state == TrialState.COMPLETE and again.user_attrs["retry_of"] == held.number


def test_a_host_with_a_gpus_list_runs_trials_side_by_side_over_ssh(sshd: Sshd, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    space, env = _space(tmp_path)
    data = yaml.safe_load(space.read_text())
    data["load_test"]["duration_s"] = 1.0
    space.write_text(yaml.safe_dump(data, sort_keys=False))
    server_port = free_port()
    host = SSHHost(sshd.host(name="loop", emulate=True, env=env, gpus=[0, 1], server_port=server_port,
                             nvidia_smi=f"{sys.executable} -m search.emulator.nvidia_smi"))
    at_once = AtOnce()

    try:
        study = StudyRun(space=load_space(space), name="side", storage=STORAGE, host=host, seed=0, n_trials=2,
                         remeasure=0, trials_dir=tmp_path / "trials",
                         listener=Listener(placed=at_once.placed, trial_done=at_once.done)).run()
    finally:
        host.close()
    started = [t for t in study.trials if (Path(t.user_attrs.get("artifacts", "-")) / "profile.json").exists()]
    profiles = [json.loads((Path(t.user_attrs["artifacts"]) / "profile.json").read_text()) for t in started]
    assert at_once.most == 2, "both GPUs busy at once, one trial each"
    assert {p["env"]["CUDA_VISIBLE_DEVICES"] for p in profiles} == {"0", "1"}
    assert {p["port"] for p in profiles} == {server_port, server_port + 1}
    assert all(t.user_attrs["gpu"] for t in started), "each trial's telemetry from its own GPU"
    state = Path(env["SEARCH_EMULATOR_STATE_DIR"])
    assert not [i for i in range(2) if gpu_state.is_held(state, i)]
