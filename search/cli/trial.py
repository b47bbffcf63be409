"""`search trial run`: one config end to end, the first thing to run on a new machine."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from search.errors import InfrastructureFault, RunFailed
from search.loadtest.metrics import meets_slos
from search.logwatch import Event
from search.overrides import overridden, parse_sets
from search.space import MAX_RATE
from search.stop_signals import stop_signals_as_interrupt
from search.storage import Outcome
from search.trial import TrialResult, run_trial, slos_of

app = typer.Typer(help="Run one configuration end to end, outside a study.", no_args_is_help=True)
console = Console(highlight=False)


@app.command("run")
def run(
    space_path: Path = typer.Argument(..., metavar="SPACE", help="Space file (spaces/X.yaml)."),
    sets: list[str] = typer.Option([], "--set", metavar="FLAG=VALUE", help="Override one parameter of the baseline."),
    emulate: bool = typer.Option(False, "--emulate", help="Start the SGLang emulator instead of the space's launcher."),
    study: str = typer.Option("trial-run", "--study", help="Artifacts go to TRIALS_DIR/STUDY/<n>/."),
    trials_dir: Path = typer.Option(Path("trials"), "--trials-dir", help="Where trial artifacts are written."),
) -> None:
    """Render the space's baseline (with --set overrides), start it, follow its phases, check its
    answers, run the load-test ladder, tear it down and print the timeline and the levels."""
    from search.artifacts import TrialArtifacts
    from search.cli.space import checked_space
    from search.hosts import local_host

    space = checked_space(space_path)
    config = overridden(space, space.baseline or {}, parse_sets(sets, space))
    artifacts = TrialArtifacts.next_in(trials_dir, study)
    marker = f"{study}-{artifacts.root.name}-{uuid.uuid4().hex[:12]}"
    began = time.time()

    def on_event(event: Event) -> None:
        if event.kind == "phase":
            console.print(f"[dim]{event.time - began:7.1f} s[/dim]  {event.name}")

    console.print(f"trial {artifacts.root}  ({'emulated' if emulate else 'local'})")
    with stop_signals_as_interrupt():  # a hang-up tears the server down as Ctrl-C does
        result = run_trial(space, config, local_host(emulate=emulate), trial_dir=artifacts.root, marker=marker,
                           on_event=on_event)
    _print(result, space, began)
    message = result.failure.message if result.failure else str(result.outcome)
    if result.outcome == Outcome.INFRASTRUCTURE:
        raise InfrastructureFault(message)
    if result.outcome == Outcome.CRASHED:
        raise RunFailed(message)


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print(result: TrialResult, space: Any, began: float) -> None:
    if result.startup is not None and result.startup.phases:
        timeline = Table(title="startup", title_justify="left")
        for column in ("phase", "start (s)", "duration (s)"):
            timeline.add_column(column, justify="left" if column == "phase" else "right")
        for name, span in result.startup.phases.items():
            timeline.add_row(name, f"{span.start - began:.1f}", f"{span.duration:.1f}")
        console.print(timeline)
    if result.levels:
        slos = slos_of(space)
        levels = Table(title="load test", title_justify="left")
        open_loop = any(lv.request_rate is not None for lv in result.levels)
        for column in ("rate req/s" if open_loop else "concurrency", "output tok/s", "total tok/s", "req/s",
                       "p99 TTFT ms", "p99 ITL ms", "errors", "SLOs"):
            levels.add_column(column, justify="right")
        for lv in result.levels:
            levels.add_row(f"{lv.request_rate:g}" if lv.request_rate is not None else str(lv.max_concurrency),
                           _num(lv.output_throughput, ",.0f"),
                           _num(lv.total_throughput, ",.0f"), _num(lv.request_throughput, ".2f"),
                           _num(lv.p99_ttft_ms, ",.0f"), _num(lv.p99_itl_ms, ",.1f"),
                           str(sum(lv.errors.values())), "ok" if meets_slos(lv, slos) else "missed")
        console.print(levels)
    if result.objective is not None:
        objective = space.objective
        open_loop = bool(space.load_test.request_rates)
        where = ("" if objective.metric == MAX_RATE else f" at {result.peak_concurrency:g} req/s sent" if open_loop
                 else f" at concurrency {result.peak_concurrency:g}")
        console.print(f"{result.outcome}: peak {objective.format(result.objective)} {objective.name}{where}")
    elif result.outcome in (Outcome.COMPLETED, Outcome.PRUNED):
        console.print(f"{result.outcome}: no level met the SLOs")
    if result.answers_differ:
        console.print("[yellow]answers differ from the baseline's[/yellow]")
    if result.teardown:
        console.print(f"[yellow]teardown: {result.teardown}[/yellow]")
    console.print(f"artifacts: {result.artifacts}")


@app.command("show")
def show(
    study: str = typer.Argument(..., metavar="NAME", help="Study name."),
    number: int = typer.Argument(..., metavar="N", help="Trial number."),
    storage: str = typer.Option("sqlite:///studies.db", "--storage", help="Optuna storage URL."),
) -> None:
    """One trial of a study: phase timeline, failure line with its log context, levels, artifacts."""
    import sys

    from search.results import trial_text
    from search.storage import load

    sys.stdout.write(trial_text(load(study, storage), number))
