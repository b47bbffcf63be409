"""A whole study in one run: a win over the baseline, a crash at its phase, a prune after level 1,
re-measurement, and every view on the result (show, trial show, export, the optuna CLI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

import search.cli
from search.cli import app
from search.hosts.emulated import EmulatedHost
from search.space import load_space
from search.storage import remeasured
from search.study import StudyRun
from tests.helpers import write_space

STORAGE = "sqlite:///studies.db"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, optuna.Study]:
    root = tmp_path_factory.mktemp("study")
    old = os.getcwd()
    os.chdir(root)
    os.environ["SEARCH_EMULATOR_STATE_DIR"] = str(root / "state")
    try:
        space = load_space(write_space(root))
        run = StudyRun(space=space, name="s1", host=EmulatedHost(), storage=STORAGE, seed=0,
                       n_trials=4, remeasure=1)
        study = run.run()
        yield root, study
    finally:
        os.environ.pop("SEARCH_EMULATOR_STATE_DIR", None)
        os.chdir(old)


def _by(study: optuna.Study, **params: object) -> optuna.trial.FrozenTrial:
    return next(t for t in study.trials if all(t.params.get(k) == v for k, v in params.items())
                and "skipped" not in t.user_attrs)


def test_finds_a_config_better_than_the_baseline(finished: tuple[Path, optuna.Study]) -> None:
    _, study = finished
    base = study.trials[0]
    assert base.user_attrs["strategy"] == "baseline" and base.state == TrialState.COMPLETE
    win = _by(study, **{"--max-running-requests": None, "--moe-runner-backend": "flashinfer_cutlass"})
    assert win.state == TrialState.COMPLETE
    assert win.value > 1.5 * base.value  # 16 running vs a cap of 1: about 4x at the top level
    assert win.user_attrs["peak_concurrency"] == 16
    assert [lv["max_concurrency"] for lv in win.user_attrs["levels"]] == [4, 16]
    assert win.constraints == {"crashed": 0.0, "slo": 0.0, "correctness": 0.0}
    assert win.user_attrs["gpu_seconds"] > 0 and win.user_attrs["phases"]["loading"]["duration"] > 0


def test_crash_is_pruned_at_its_phase_without_a_load_test(finished: tuple[Path, optuna.Study]) -> None:
    _, study = finished
    crash = _by(study, **{"--moe-runner-backend": "triton"})
    assert crash.state == TrialState.PRUNED and crash.constraints["crashed"] == 1.0
    assert crash.user_attrs["outcome"] == "crashed"
    assert crash.user_attrs["failure"]["phase"] == "autotune"
    assert "ninja" in crash.user_attrs["failure"]["line"]
    assert crash.intermediate_values == {} and not crash.user_attrs.get("levels")
    assert not (Path(crash.user_attrs["artifacts"]) / "loadtest.json").exists()


def test_below_target_is_pruned_after_its_first_level(finished: tuple[Path, optuna.Study]) -> None:
    _, study = finished
    slow = _by(study, **{"--moe-runner-backend": "cutlass"})
    assert slow.state == TrialState.PRUNED and slow.user_attrs["outcome"] == "pruned"
    assert list(slow.intermediate_values) == [0] and len(slow.user_attrs["levels"]) == 1
    assert "below the target" in slow.user_attrs["pruned_because"]


def test_top_configs_are_remeasured_and_rank_first(finished: tuple[Path, optuna.Study]) -> None:
    _, study = finished
    again = remeasured(study)
    win = _by(study, **{"--max-running-requests": None, "--moe-runner-backend": "flashinfer_cutlass"})
    assert len(again[win.number]) == 1 and again[win.number][0] > study.trials[0].value
    from search.results import best

    assert best(study).number == win.number


def test_show_formats(finished: tuple[Path, optuna.Study]) -> None:
    root, study = finished
    runner = CliRunner()
    os.chdir(root)
    table = runner.invoke(app, ["study", "show", "s1"])
    assert table.exit_code == 0, table.output
    assert "crashed at autotune" in table.output and "pruned at 4" in table.output
    assert "(baseline)" in table.output and "--max-running-requests=default" in table.output
    assert "gain: trial" in table.output and "saved by pruning" in table.output
    csv = runner.invoke(app, ["study", "show", "s1", "--format", "csv", "--top", "2"])
    lines = csv.output.strip().splitlines()
    assert lines[0].startswith("rank,trial,state,outcome,peak_tok_s,at_concurrency,tok_s@4,tok_s@16")
    assert len(lines) == 3 and lines[1].split(",")[1] == str(best_number(study))
    data = json.loads(runner.invoke(app, ["study", "show", "s1", "--format", "json"]).output)
    assert data["counts"]["completed"] == 2 and data["counts"]["crashed"] == 1 and data["counts"]["pruned"] == 1
    assert data["gain"]["gain"] > 0.3
    outcomes = {r["trial"]: r["outcome"] for r in data["trials"]}
    crash = _by(study, **{"--moe-runner-backend": "triton"}).number
    assert outcomes[crash] == "crashed at autotune (autotune_error)"
    assert data["trials"][0]["repeats"] == 2 and data["trials"][0]["at_concurrency"] == 16
    assert data["gpu_time"]["saved_s"] > 0
    missing = runner.invoke(app, ["study", "show", "nope"])
    assert missing.exit_code != 0 and "s1" in str(missing.exception)


def best_number(study: optuna.Study) -> int:
    from search.results import best

    return best(study).number


def test_trial_show_gives_the_failure_line_with_context(finished: tuple[Path, optuna.Study]) -> None:
    root, study = finished
    os.chdir(root)
    crash = _by(study, **{"--moe-runner-backend": "triton"})
    out = CliRunner().invoke(app, ["trial", "show", "s1", str(crash.number)])
    assert out.exit_code == 0, out.output
    assert "failure:" in out.output and "> " in out.output and "ninja" in out.output
    assert "autotune" in out.output and "server.log" in out.output
    levels = CliRunner().invoke(app, ["trial", "show", "s1", "0"]).output
    assert "levels" in levels and "loadtest.json" in levels


def test_optuna_cli_reads_the_storage(finished: tuple[Path, optuna.Study]) -> None:
    root, study = finished
    done = subprocess.run(["optuna", "trials", "--storage", STORAGE, "--study-name", "s1", "-f", "json"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) == len(study.trials)


def test_exported_shell_profile_starts_the_emulator(finished: tuple[Path, optuna.Study]) -> None:
    root, study = finished
    os.chdir(root)
    out = CliRunner().invoke(app, ["study", "export", "s1", "--format", "shell"])
    assert out.exit_code == 0, out.output
    script = root / out.stdout.strip()  # stderr names the score; stdout is the path
    assert script.parent.name == "profiles" and os.access(script, os.X_OK)
    text = script.read_text()
    assert "--moe-runner-backend flashinfer_cutlass" in text and "--max-running-requests" not in text
    log = root / "exported.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(["bash", str(script)], stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "The server is fired up and ready to roll!" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    config = CliRunner().invoke(app, ["study", "export", "s1", "--trial", "0", "--format", "sglang-config",
                                      "-o", str(root / "base.yaml")])
    assert config.exit_code == 0 and "max-running-requests: 1" in (root / "base.yaml").read_text()


def test_export_and_report_to_an_unwritable_path_are_bad_input(finished: tuple[Path, optuna.Study],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = finished
    os.chdir(root)
    (root / "plain").write_text("")
    for args in (["study", "export", "s1", "--format", "shell", "-o", str(root / "plain" / "x.sh")],
                 ["study", "report", "s1", "-o", str(root / "plain" / "r.html")]):
        with pytest.raises(SystemExit) as info:
            search.cli.main(args)
        assert info.value.code == 2
        assert capsys.readouterr().err == (f"error: cannot write {args[-1]}: File exists; give -o a file in a "
                                           "directory you can write to\n")


def test_study_list(finished: tuple[Path, optuna.Study]) -> None:
    root, _ = finished
    os.chdir(root)
    out = CliRunner().invoke(app, ["study", "list"])
    assert out.exit_code == 0 and out.output.startswith("s1\t")
