"""Every view names the same winner: `study show`, `study list`, `study export`, `study report`, the
live progress and `--from-study` all take it from `search.ranking`.

The study holds what makes rules disagree: a lucky single measurement above the re-measured
configs, two re-measured configs whose means tie, a crash, a pruned trial whose first level was
the highest of all, a completed trial that broke its SLO, a skipped proposal and a trial still
waiting. The winner is the earlier of the tied re-measured configs.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from rich.console import Console
from typer.testing import CliRunner

from search import export, report, results
from search.cli import app
from search.progress import StudyProgress
from search.space import Space, load_space
from search.storage import Attr, Constraint, Outcome, StudyAttr, set_remeasured
from search.study import StudyRun, best_configs
from tests.helpers import write_space
from tests.study.simulated import simulated_runner

PARAMS = {
    "--max-running-requests": {"type": "int", "low": 8, "high": 1024, "log": True},
    "--mem-fraction-static": {"type": "float", "low": 0.80, "high": 0.97},
}
DISTS = {"--max-running-requests": IntDistribution(8, 1024, log=True), "--mem-fraction-static": FloatDistribution(0.80, 0.97)}
FEASIBLE = {Constraint.CRASHED: 0.0, Constraint.SLO: 0.0, Constraint.CORRECTNESS: 0.0}
WINNER = 2


def _study(root: Path) -> tuple[Space, optuna.Study, str]:
    space = load_space(write_space(root, params=PARAMS, baseline={"--max-running-requests": 64,
                                                                   "--mem-fraction-static": 0.85}, targets={}))
    storage = f"sqlite:///{root / 'studies.db'}"
    study = optuna.create_study(study_name="views", storage=storage, direction="maximize")
    study.set_user_attr(StudyAttr.SPACE, space.model_dump(mode="json"))

    def add(cap: int, state: TrialState, value: float | None, outcome: Outcome | None, *, first_level: float | None = None,
            constraints: dict[str, float] | None = None, **attrs: Any) -> None:
        level = first_level if first_level is not None else value
        study.add_trial(create_trial(
            state=state, value=value, params={"--max-running-requests": cap, "--mem-fraction-static": 0.85},
            distributions=DISTS, constraints=constraints if constraints is not None else FEASIBLE,
            intermediate_values={0: level} if level is not None else {},
            user_attrs={Attr.PLAN: "sweep", Attr.OUTCOME: outcome, Attr.PEAK: value, Attr.PEAK_CONCURRENCY: 4,
                        Attr.LEVELS: [{"max_concurrency": 4, "output_throughput": level, "request_throughput": 1.0,
                                       "p99_ttft_ms": 50.0, "p99_itl_ms": 5.0, "errors": {}}] if level else [],
                        **attrs}))

    add(64, TrialState.COMPLETE, 1000.0, Outcome.COMPLETED, **{Attr.PLAN: "baseline"})  # 0
    add(128, TrialState.COMPLETE, 1300.0, Outcome.COMPLETED)  # 1: lucky once; re-measured lower
    add(256, TrialState.COMPLETE, 1250.0, Outcome.COMPLETED)  # 2: re-measured, ties with 3, earlier
    add(512, TrialState.COMPLETE, 1240.0, Outcome.COMPLETED)  # 3
    add(1024, TrialState.COMPLETE, 1400.0, Outcome.COMPLETED)  # 4: the best single measurement, never repeated
    add(16, TrialState.PRUNED, None, Outcome.CRASHED, constraints={**FEASIBLE, Constraint.CRASHED: 1.0},
        **{Attr.FAILURE: {"kind": "oom", "phase": "cuda_graph", "line": "CUDA out of memory"}})  # 5
    add(32, TrialState.PRUNED, None, Outcome.PRUNED, first_level=5000.0)  # 6: its one level beat everything
    add(48, TrialState.COMPLETE, 6000.0, Outcome.COMPLETED, constraints={**FEASIBLE, Constraint.SLO: 1.0})  # 7
    add(256, TrialState.FAIL, None, None, **{Attr.SKIPPED: "same config as trial 2"})  # 8
    study.enqueue_trial({"--max-running-requests": 200, "--mem-fraction-static": 0.9})  # 9: waiting
    set_remeasured(study, {1: [1100.0, 1150.0], 2: [1250.0, 1250.0], 3: [1260.0, 1250.0]})  # 2 and 3: mean 1250
    return space, study, storage


def _progress_names(space: Space, study: optuna.Study, storage: str, root: Path) -> int:
    """The trial the live status line calls best, with the study resumed by the real driver."""
    out = io.StringIO()
    run = StudyRun(space=space, name="views", runner=simulated_runner(lambda config, c: 0.0), storage=storage,
                   n_trials=1, remeasure=0, trials_dir=root / "trials")
    progress = StudyProgress(run, Console(file=out, width=300))
    with progress:
        run.run()  # the study already holds its measured trials: nothing runs
        progress.trial_done(study.trials[0])
    found = re.search(r"best trial (\d+) ", out.getvalue())
    assert found, out.getvalue()
    return int(found.group(1))


def test_show_export_report_progress_and_from_study_name_the_same_winner(tmp_path: Path) -> None:
    space, study, storage = _study(tmp_path)
    shown = json.loads(results.render(study, "json"))
    assert shown["trials"][0]["trial"] == WINNER
    assert shown["gain"]["best_trial"] == WINNER
    assert export.profile(study)[0] == WINNER
    headline = re.search(r"Trial #(\d+) beats the baseline", report.render(study, storage))
    assert headline and int(headline.group(1)) == WINNER
    assert best_configs(study)[0] == space.clean(study.trials[WINNER].params)
    listed = CliRunner().invoke(app, ["study", "list", "--storage", storage])
    assert listed.exit_code == 0 and f"(trial {WINNER})" in listed.output, listed.output
    assert _progress_names(space, study, storage, tmp_path) == WINNER


def test_the_ranking_puts_what_cannot_win_after_every_feasible_trial(tmp_path: Path) -> None:
    _, study, _ = _study(tmp_path)
    order = [t.number for t in results.ranked(study)]
    assert order[:3] == [2, 3, 1]  # re-measured, by mean; the tie to the earlier trial
    assert set(order[3:5]) == {0, 4}  # measured once
    assert order[5:] == [7, 6, 5, 8]  # SLO breached, pruned, crashed, skipped; the waiting trial is no result
