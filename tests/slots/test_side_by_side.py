"""Trials side by side on one emulated host's GPUs: placement, a crash's GPUs reused, a trial that must
wait or cannot fit, and kill -9 of the driver with several trials running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from search import report, results
from search.emulator import gpu_state
from search.hosts import local_host
from search.runner import Hooks, Job
from search.slot_runner import SlotRunner
from search.slots import GpuPool
from search.space import Objective, Space, load_space
from search.storage import Outcome
from search.study import Listener, StudyRun
from tests.helpers import AtOnce, ctrl_c_reaches, marker_pids, study_so_far, write_space

STORAGE = "sqlite:///studies.db"


def _space(root: Path, *, tp: int, host_gpus: int, time_scale: str = "0.004") -> Path:
    """The toy space (tests.helpers) served at ``tp`` on an emulated host of ``host_gpus`` GPUs."""
    path = write_space(root, time_scale=time_scale)
    data = yaml.safe_load(path.read_text())
    data["launch"]["tp"] = tp
    data["launch"]["env"]["SEARCH_EMULATOR_GPUS"] = str(host_gpus)
    data["load_test"].update(concurrency=[4], duration_s=0.5)  # one short level: placement is what is tested
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _visible(trial: optuna.trial.FrozenTrial) -> str:
    """The CUDA_VISIBLE_DEVICES the trial's server ran with (its recorded profile)."""
    env: dict[str, str] = yaml.safe_load((Path(trial.user_attrs["artifacts"]) / "profile.json").read_text())["env"]
    return env["CUDA_VISIBLE_DEVICES"]


def _port(trial: optuna.trial.FrozenTrial) -> int:
    profile: dict[str, Any] = yaml.safe_load((Path(trial.user_attrs["artifacts"]) / "profile.json").read_text())
    return int(profile["port"])


def _run(space: Space, gpus: list[int], n_trials: int, listener: Listener | None = None) -> optuna.Study:
    runner = SlotRunner([local_host(emulate=True, gpus=gpus)])
    try:
        return StudyRun(space=space, name="s", storage=STORAGE, seed=0, n_trials=n_trials, remeasure=0,
                        runner=runner, listener=listener or Listener()).run()
    finally:
        runner.close()


def test_trials_run_side_by_side_on_disjoint_gpus_and_ports(workdir: Path) -> None:
    space = load_space(_space(workdir, tp=2, host_gpus=4, time_scale="0.002"))
    space = space.model_copy(update={"objective": Objective(metric="output_throughput_per_gpu"),
                                     "targets": {4: 150 / 2}})  # the target is per GPU too
    at_once = AtOnce()

    study = _run(space, [0, 1, 2, 3], 2, Listener(placed=at_once.placed, trial_done=at_once.done))
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(measured) == 2 and at_once.most == 2
    started = [t for t in study.trials if "artifacts" in t.user_attrs]  # a known crash is told without running
    assert {_visible(t) for t in started} == {"0,1", "2,3"}
    assert {_port(t) for t in started} == {space.launch.port, space.launch.port + 2}
    state = workdir / "state"
    assert not [i for i in range(4) if gpu_state.is_held(state, i)], "every GPU is released after the study"
    for t in measured:  # per GPU: a level's output tok/s over the layout's 2 GPUs
        best = max(level["output_throughput"] for level in t.user_attrs["levels"])
        assert t.value is not None and abs(t.value - best / 2) < 1e-6 * best
    assert "tok/s/GPU" in report.render(study, STORAGE) and "tok/s/GPU" in results.show_text(study)


def _job(space: Space, root: Path, name: str) -> Job:
    return Job(space, dict(space.baseline or {}), f"search-t-{name}", root / "trials" / name)


def _finish(runner: SlotRunner, count: int) -> list[tuple[Job, Any]]:
    done: list[tuple[Job, Any]] = []
    deadline = time.monotonic() + 120
    while len(done) < count and time.monotonic() < deadline:
        done += runner.wait(0.5)
    return done


def test_a_crash_gives_its_gpus_to_the_next_trial(workdir: Path) -> None:
    space = load_space(_space(workdir, tp=2, host_gpus=2, time_scale="0.002"))  # one slot
    runner = SlotRunner([local_host(emulate=True, gpus=[0, 1])])
    placed: list[str] = []
    try:
        crash = Job(space, {**(space.baseline or {}), "--moe-runner-backend": "triton"}, "search-t-crash",
                    workdir / "trials" / "crash")
        runner.start(crash, Hooks(placed=lambda host: placed.append("crash")))
        runner.start(_job(space, workdir, "next"), Hooks(placed=lambda host: placed.append("next")))
        assert placed == ["crash"]
        (first, crashed), (second, measured) = _finish(runner, 2)
        assert first is crash and crashed.outcome == Outcome.CRASHED and crashed.failure.phase == "autotune"
        assert measured.outcome == Outcome.COMPLETED and placed == ["crash", "next"]
        profile = yaml.safe_load((workdir / "trials" / "next" / "profile.json").read_text())
        assert profile["env"]["CUDA_VISIBLE_DEVICES"] == "0,1", "the crashed trial's GPUs, given back"
    finally:
        runner.close()


def test_a_trial_waits_for_enough_free_gpus_and_one_too_big_never_starts(workdir: Path) -> None:
    pool = GpuPool([0, 1, 2])
    assert pool.take(2) == [0, 1] and pool.take(2) is None and pool.fits(1) == 1
    pool.give([0, 1])
    assert pool.take(3) == [0, 1, 2] and not pool.could_hold(4)

    space = load_space(_space(workdir, tp=2, host_gpus=3, time_scale="0.002"))
    runner = SlotRunner([local_host(emulate=True, gpus=[0, 1, 2])])
    placed: list[str] = []
    try:
        for name in ("a", "b"):
            runner.start(_job(space, workdir, name), Hooks(placed=lambda host, n=name: placed.append(n)))
        assert placed == ["a"] and runner.free() == 0, "b waits: one GPU is free, it needs two"
        done = [job.marker for job, result in _finish(runner, 2) if result.outcome == Outcome.COMPLETED]
        assert done == ["search-t-a", "search-t-b"] and placed == ["a", "b"]

        big = space.model_copy(update={"launch": space.launch.model_copy(update={"tp": 4})})
        runner.start(_job(big, workdir, "c"), Hooks())
        [(job, result)] = runner.wait(0)
        assert result.outcome == Outcome.CRASHED and result.failure is not None
        assert "takes 4 GPUs; the largest host offers 3" in result.failure.message
        assert not (workdir / "trials" / "c").exists(), "nothing started for it"
    finally:
        runner.close()


def _driver(workdir: Path, space: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from search.cli import main; main()", "study", "run", str(space), "--study", "k",
         "--n-trials", "3", "--emulate", "--gpus", "0,1,2,3", "--remeasure", "0", "--seed", "0"],
        cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
        preexec_fn=ctrl_c_reaches)


def test_ctrl_c_tears_down_every_trial_running_side_by_side(workdir: Path) -> None:
    driver = _driver(workdir, _space(workdir, tp=2, host_gpus=4, time_scale="0.02"))
    markers = _two_servers_up()
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=90)
    assert driver.returncode == 130 and "interrupted" in out and "Traceback" not in out, out
    assert not any(marker_pids(m) for m in markers)
    study = optuna.load_study(study_name="k", storage=STORAGE)
    stopped = [t for t in study.trials if t.user_attrs.get("marker") in markers]
    assert len(stopped) == 2 and all(t.user_attrs["failure"]["kind"] == "interrupted" for t in stopped)
    assert not [i for i in range(4) if gpu_state.is_held(workdir / "state", i)]


def _two_servers_up(timeout: float = 60.0) -> list[str]:
    """The markers of two RUNNING trials whose servers are alive at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        opened = study_so_far("k", STORAGE)
        trials = opened.get_trials(states=(TrialState.RUNNING,)) if opened else []
        markers = [t.user_attrs["marker"] for t in trials if t.user_attrs.get("marker")]
        alive = [m for m in markers if marker_pids(m)]
        if len(alive) >= 2:
            return alive
        time.sleep(0.1)
    raise AssertionError("two trial servers never ran at once")


def test_kill_9_with_several_trials_running_then_resume(workdir: Path) -> None:
    space = _space(workdir, tp=2, host_gpus=4, time_scale="0.02")  # a 3.4 s startup: time to kill mid-trial
    first = _driver(workdir, space)
    markers = _two_servers_up()
    first.kill()
    first.wait(30)
    assert all(marker_pids(m) for m in markers), "the dead driver's servers run on (their own sessions)"

    second = _driver(workdir, space)
    out, _ = second.communicate(timeout=240)
    assert second.returncode == 0, out
    assert out.count("left RUNNING by a dead run") >= 2, out
    assert not any(marker_pids(m) for m in markers)
    study = optuna.load_study(study_name="k", storage=STORAGE)
    dead = [t for t in study.trials if t.user_attrs.get("marker") in markers]
    assert len(dead) == 2 and all(t.user_attrs["failure"]["kind"] == "driver_killed" for t in dead)
    measured = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(measured) == 3 and not [t for t in study.trials if t.state == TrialState.RUNNING]
    assert not [i for i in range(4) if gpu_state.is_held(workdir / "state", i)]
