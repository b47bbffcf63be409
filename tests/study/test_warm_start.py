"""Warm starts: `--start-from` (a user's own launch command) and `--from-study` (another study's best).

The space is tests.helpers.write_space's: the baseline caps running requests at 1, and lifting the
cap is the clear win, so a study told about it runs it right after the baseline.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from typer.testing import CliRunner

from search.cli import app
from search.errors import BadInput
from tests.helpers import write_space

STORAGE = "sqlite:///studies.db"
CAPPED = ("nohup python3 -u -m sglang.launch_server --model-path test/model \\\n"
          "  --max-running-requests 1 --moe-runner-backend flashinfer_cutlass --host 0.0.0.0 --port 8000 > log 2>&1 &")
UNCAPPED = "python -m sglang.launch_server --model-path test/model --moe-runner-backend=flashinfer_cutlass"
WIN = {"--max-running-requests": None, "--moe-runner-backend": "flashinfer_cutlass"}


def _run(*args: str) -> str:
    done = CliRunner().invoke(app, ["study", "run", *args, "--emulate", "--remeasure", "0", "--seed", "0"])
    assert done.exit_code == 0, f"{done.output}\n{done.exception!r}"
    return done.output


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory holding the studies (cwd for the module), with a space that has no baseline."""
    path = tmp_path_factory.mktemp("warm")
    old = os.getcwd()
    os.chdir(path)
    os.environ["SEARCH_EMULATOR_STATE_DIR"] = str(path / "state")
    space = write_space(path)
    data = yaml.safe_load(space.read_text())
    data.pop("baseline")
    (path / "no-baseline.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        yield path
    finally:
        os.environ.pop("SEARCH_EMULATOR_STATE_DIR", None)
        os.chdir(old)


@pytest.fixture(scope="module")
def started(root: Path) -> optuna.Study:
    """A study whose baseline is the user's command and whose next trial is their other command."""
    _run(str(root / "no-baseline.yaml"), "--study", "warm", "--n-trials", "2", "--start-from", CAPPED,
         "--start-from", UNCAPPED)
    return optuna.load_study(study_name="warm", storage=STORAGE)


def test_start_from_commands_become_the_baseline_and_the_next_trial(started: optuna.Study) -> None:
    base, known = started.trials
    assert base.user_attrs["strategy"] == "baseline" and base.state == TrialState.COMPLETE
    assert base.params == {"--max-running-requests": 1, "--moe-runner-backend": "flashinfer_cutlass"}
    assert known.user_attrs["strategy"] == "known" and known.params == WIN  # an absent flag: SGLang's default
    assert known.state == TrialState.COMPLETE and known.value > 1.5 * base.value


def test_a_command_that_does_not_fit_the_space_is_refused(root: Path) -> None:
    done = CliRunner().invoke(app, ["study", "run", str(root / "space.yaml"), "--study", "bad", "--emulate",
                                    "--start-from", UNCAPPED + " --tp-size 2"])
    assert isinstance(done.exception, BadInput)  # exit 2 from `search`
    assert "--tp-size: 2 in the command but 1 in the space" in str(done.exception)
    assert "bad" not in optuna.study.get_all_study_names(STORAGE)  # refused before anything ran


def test_from_study_enqueues_the_other_studys_best_configs(root: Path, started: optuna.Study) -> None:
    _run(str(root / "space.yaml"), "--study", "next", "--n-trials", "2", "--from-study", "warm")
    study = optuna.load_study(study_name="next", storage=STORAGE)
    measured = [t for t in study.trials if "skipped" not in t.user_attrs]
    assert [t.user_attrs["strategy"] for t in measured] == ["baseline", "known"]
    assert measured[1].params == WIN == started.best_trial.params
    assert measured[1].value > 1.5 * measured[0].value

    missing = CliRunner().invoke(app, ["study", "run", str(root / "space.yaml"), "--study", "x", "--emulate",
                                       "--from-study", "nope"])
    assert isinstance(missing.exception, BadInput) and "no study named 'nope'" in str(missing.exception)
