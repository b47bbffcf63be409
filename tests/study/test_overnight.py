"""Overnight safety: kill -9 of the driver and resume, Ctrl-C, infrastructure faults retried and bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search import trial as trial_module
from search.errors import RunFailed
from search.hosts.emulated import EmulatedHost
from search.space import load_space
from search.study import Listener, StudyRun
from tests.helpers import ctrl_c_reaches, marker_pids, marker_processes, parent, running_server, write_space

STORAGE = "sqlite:///studies.db"


def _driver(workdir: Path, space: Path, study: str, n_trials: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from search.cli import main; main()", "study", "run", str(space), "--study", study,
         "--n-trials", str(n_trials),
         "--emulate", "--remeasure", "0", "--seed", "0"],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
        preexec_fn=ctrl_c_reaches)


def test_sigkill_of_the_driver_then_resume_loses_nothing(workdir: Path) -> None:
    space = write_space(workdir, time_scale="0.02")  # a 3.4 s startup: time to kill it mid-trial
    first = _driver(workdir, space, "k", n_trials=2)
    number, marker = running_server("k")
    first.kill()
    first.wait(30)
    assert marker_pids(marker), "the dead driver's server should still be running (its own session)"

    second = _driver(workdir, space, "k", n_trials=2)
    out, _ = second.communicate(timeout=240)
    assert second.returncode == 0, out
    assert "left RUNNING by a dead run" in out
    assert not marker_pids(marker)
    study = optuna.load_study(study_name="k", storage=STORAGE)
    dead = study.trials[number]
    assert dead.state == TrialState.FAIL and dead.user_attrs["failure"]["kind"] == "driver_killed"
    retry = next(t for t in study.trials if t.user_attrs.get("retry_of") == number)
    assert retry.params == dead.params and retry.state == TrialState.COMPLETE
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(measured) == 2 and not [t for t in study.trials if t.state == TrialState.RUNNING]


def test_ctrl_c_tears_down_and_records_the_trial(workdir: Path) -> None:
    space = write_space(workdir, time_scale="0.02")
    driver = _driver(workdir, space, "c", n_trials=3)
    number, marker = running_server("c")
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 130, out
    assert "interrupted" in out and "Traceback" not in out
    assert not marker_pids(marker)
    t = optuna.load_study(study_name="c", storage=STORAGE).trials[number]
    assert t.state == TrialState.FAIL and t.user_attrs["failure"]["kind"] == "interrupted"
    waiting = optuna.load_study(study_name="c", storage=STORAGE).get_trials(states=(TrialState.WAITING,))
    assert [w.system_attrs["fixed_params"] for w in waiting] == [t.params]  # the next run measures it


def _hold_port(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_infrastructure_fault_is_retried_not_blamed(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_module, "CLEAN_TIMEOUT_S", 0.5)
    space = load_space(write_space(workdir))
    holder = _hold_port(space.launch.port)
    notes: list[str] = []

    def note(text: str) -> None:  # the first fault frees the port, as an operator would
        notes.append(text)
        holder.close()

    run = StudyRun(space=space, name="i", host=EmulatedHost(), storage=STORAGE, n_trials=1, remeasure=0,
                   listener=Listener(note=note))
    study = run.run()
    first, second = study.trials[0], study.trials[1]
    assert first.state == TrialState.FAIL and first.user_attrs["outcome"] == "infrastructure"
    assert f"port {space.launch.port}" in first.user_attrs["failure"]["message"]
    assert "infrastructure fault, will retry" in notes[0]
    assert second.user_attrs["retry_of"] == 0 and second.params == first.params
    assert second.state == TrialState.COMPLETE and second.constraints["crashed"] == 0


def test_endless_infrastructure_faults_stop_the_study(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_module, "CLEAN_TIMEOUT_S", 0.2)
    space = load_space(write_space(workdir))
    holder = _hold_port(space.launch.port)
    try:
        run = StudyRun(space=space, name="j", host=EmulatedHost(), storage=STORAGE, n_trials=1, remeasure=0)
        with pytest.raises(RunFailed, match="3 infrastructure faults in a row.*port"):
            run.run()
    finally:
        holder.close()
    study = optuna.load_study(study_name="j", storage=STORAGE)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 3 + [TrialState.WAITING]


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1])
def test_hang_up_tears_down_like_ctrl_c(workdir: Path, sig: signal.Signals) -> None:
    """The terminal closing (or any stop signal) must not orphan the trial's server and its ranks."""
    space = write_space(workdir, time_scale="0.02")
    driver = subprocess.Popen(  # setsid, as an overnight run started over SSH
        [sys.executable, "-c", "from search.cli import main; main()", "study", "run", str(space), "--study", "hup",
         "--n-trials", "3", "--emulate", "--remeasure", "0", "--seed", "0"],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    number, marker = running_server("hup")
    driver.send_signal(sig)
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 130, out
    assert not marker_pids(marker), out
    t = optuna.load_study(study_name="hup", storage=STORAGE).trials[number]
    assert t.state == TrialState.FAIL and t.user_attrs["failure"]["kind"] == "interrupted"


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = parent(pid)
        except (OSError, ValueError, IndexError):
            return False
    return False


def test_hang_up_of_trial_run_tears_the_server_down(workdir: Path) -> None:
    """Only a server this `trial run` started counts as up: CI once sent the hang-up while the
    command was still importing (exit -1, no output), having seen another process's marker."""
    space = write_space(workdir, time_scale="0.02")
    run = subprocess.Popen(
        [sys.executable, "-c", "from search.cli import main; main()", "trial", "run", str(space), "--study", "hup-trial"],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (found := [p for p in marker_processes("hup-trial-0-") if _descends_from(p, run.pid)]) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert found, "no trial server came up"
    run.send_signal(signal.SIGHUP)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 130, out
    assert not marker_processes("hup-trial-0-"), out
